"""The result object of the fluid LP (and of its cvxpy cross-check)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["FluidSolution", "mixed_gpus_of", "tpot_of_occupancy"]

_CLASS_ARRAYS = ("x", "y_mixed", "y_solo", "q_prefill", "q_decode")


def tpot_of_occupancy(X: float, tau: float, gamma: float, batch: int) -> float:
    """Average time per output token (s) when a fraction X of GPUs is mixed (docs/lp.md).

    [tau (B-1) X + (B/gamma) (1-X)] / [(B-1) X + B (1-X)]: mixed GPUs run B-1 decode slots at one
    token per tau seconds, solo GPUs B slots at one token per 1/gamma seconds.
    """
    B = batch
    return (tau * (B - 1) * X + (B / gamma) * (1.0 - X)) / ((B - 1) * X + B * (1.0 - X))


def mixed_gpus_of(gpus: int, occupancy: float) -> int:
    """M = ceil(n * sum_i x_i), ignoring round-off below 1e-9 of a GPU."""
    if not math.isfinite(occupancy):
        raise ValueError(f"mixed GPUs: no prefill occupancy (got {occupancy!r}); the LP was not solved to optimality")
    return math.ceil(gpus * occupancy - 1e-9)


def _ro(a: Any) -> np.ndarray:
    a = np.array(a, dtype=float)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class FluidSolution:
    """Optimal steady state of the per-GPU fluid LP.

    Per-class arrays (indexed like ``class_names``), all per GPU: ``x`` prefill occupancy (prefill
    slots in use, i.e. fraction of GPUs prefilling class i); ``y_mixed`` / ``y_solo`` decode slots on
    mixed / solo GPUs; ``q_prefill`` / ``q_decode`` fluid queue lengths (requests waiting for
    prefill / for a decode slot); ``prefill_throughput`` = mu_p x (prefills per second);
    ``throughput`` = mu_m y_mixed + mu_s y_solo (completed requests per second).

    Scalars: ``objective_per_gpu`` = revenue minus SLI penalties per GPU per second (for
    :func:`~fluidopt.fluid.convex.solve_proportional_fair` it is the revenue, and ``utility`` holds the
    log objective); ``objective`` = the same for the whole cluster (times ``gpus``).

    ``duals`` maps row names to shadow prices d objective / d rhs (per GPU per second per unit of the
    row's right-hand side, rows written as in docs/lp.md); ``sli_shadow_prices`` maps each SLI's key
    to d objective / d bound in the SLI's own units; ``gpu_shadow_price`` = dual(prefill_capacity)
    + B dual(solo_decode_capacity) is the cluster revenue per second gained by one more GPU at fixed
    cluster arrival rates.
    """

    status: str
    pricing: str
    scenario_name: str
    class_names: tuple[str, ...]
    gpus: int
    batch: int
    lam: np.ndarray  # arrivals per GPU per second
    x: np.ndarray
    y_mixed: np.ndarray
    y_solo: np.ndarray
    q_prefill: np.ndarray
    q_decode: np.ndarray
    prefill_throughput: np.ndarray
    throughput: np.ndarray
    revenue_per_gpu: float
    penalty_per_gpu: float
    objective_per_gpu: float
    tpot: float  # s, TPOT formula at this solution's sum x
    duals: Mapping[str, float] = field(default_factory=dict)
    sli_shadow_prices: Mapping[str, float] = field(default_factory=dict)
    gpu_shadow_price: float = float("nan")
    violations: Mapping[str, float] = field(default_factory=dict)
    slis: tuple = ()
    solve_seconds: float = 0.0
    solver: str = "highs"
    utility: float | None = None

    def __post_init__(self) -> None:
        for name in ("lam", *_CLASS_ARRAYS, "prefill_throughput", "throughput"):
            object.__setattr__(self, name, _ro(getattr(self, name)))
        object.__setattr__(self, "class_names", tuple(self.class_names))

    @classmethod
    def from_primal(
        cls,
        scenario: Any,
        *,
        pricing: str,
        x: np.ndarray,
        y_mixed: np.ndarray,
        y_solo: np.ndarray,
        q_prefill: np.ndarray,
        q_decode: np.ndarray,
        revenue_per_gpu: float,
        penalty_per_gpu: float,
        objective_per_gpu: float,
        duals: Mapping[str, float],
        slis: tuple,
        violations: Mapping[str, float],
        solve_seconds: float,
        solver: str,
        status: str = "optimal",
        utility: float | None = None,
    ) -> FluidSolution:
        """Assemble a solution from a solver's primal values, objective and row duals.

        The reporting quantities every solver shares are derived here, once: throughputs from the
        scenario's rates, TPOT at sum x, the GPU shadow price, and SLI shadow prices d objective /
        d bound (TPOT's bound also multiplies the slots in its row: dual * (1 - X/B)).
        """
        from fluidopt.fluid.sli import TPOT  # pure Python; no cycle at import time

        r, g = scenario.rates(), scenario.gpu
        B = g.batch
        X = float(np.sum(x))
        sli_prices = {}
        for sli in slis:
            d = duals.get(sli.key, float("nan"))
            sli_prices[sli.key] = d * (1.0 - X / B) if isinstance(sli, TPOT) else d
        return cls(
            status=status,
            pricing=pricing,
            scenario_name=scenario.name,
            class_names=scenario.class_names,
            gpus=scenario.gpus,
            batch=B,
            lam=r.lam,
            x=x,
            y_mixed=y_mixed,
            y_solo=y_solo,
            q_prefill=q_prefill,
            q_decode=q_decode,
            prefill_throughput=r.mu_p * x,
            throughput=r.mu_m * y_mixed + r.mu_s * y_solo,
            revenue_per_gpu=revenue_per_gpu,
            penalty_per_gpu=penalty_per_gpu,
            objective_per_gpu=objective_per_gpu,
            tpot=float("nan") if math.isnan(X) else tpot_of_occupancy(X, g.tau_mix, g.gamma, B),
            duals=dict(duals),
            sli_shadow_prices=sli_prices,
            gpu_shadow_price=duals.get("prefill_capacity", float("nan"))
            + B * duals.get("solo_decode_capacity", float("nan")),
            violations=dict(violations),
            slis=tuple(slis),
            solve_seconds=solve_seconds,
            solver=solver,
            utility=utility,
        )

    # -- derived --------------------------------------------------------------------------------
    @property
    def objective(self) -> float:
        """Cluster objective per second: objective_per_gpu * gpus."""
        return self.objective_per_gpu * self.gpus

    @property
    def revenue(self) -> float:
        """Cluster revenue per second (without SLI penalties)."""
        return self.revenue_per_gpu * self.gpus

    @property
    def prefill_occupancy(self) -> float:
        """X = sum_i x_i, the fraction of GPUs that are mixed (hold a prefill slot)."""
        return float(np.sum(self.x))

    @property
    def mixed_gpus(self) -> int:
        """M = ceil(n X): GPUs to run mixed under Gate-and-Route."""
        return mixed_gpus_of(self.gpus, self.prefill_occupancy)

    @property
    def solo_gpus(self) -> int:
        return self.gpus - self.mixed_gpus

    @property
    def served_fraction(self) -> np.ndarray:
        """Completed requests / arrivals, per class (throughput / lambda)."""
        return self.throughput / self.lam

    @property
    def prefill_wait(self) -> np.ndarray:
        """Mean prefill wait in seconds, per class, by Little's law: q_prefill / lambda."""
        return self.q_prefill / self.lam

    @property
    def optimal(self) -> bool:
        return self.status == "optimal"

    # -- export ---------------------------------------------------------------------------------
    def to_frame(self) -> pd.DataFrame:
        """One row per class; scalars (objective, M, duals...) in ``.attrs``."""
        df = pd.DataFrame(
            {
                "lam": self.lam,
                "x": self.x,
                "y_mixed": self.y_mixed,
                "y_solo": self.y_solo,
                "q_prefill": self.q_prefill,
                "q_decode": self.q_decode,
                "prefill_throughput": self.prefill_throughput,
                "throughput": self.throughput,
                "served_fraction": self.served_fraction,
                "prefill_wait": self.prefill_wait,
            },
            index=pd.Index(self.class_names, name="class"),
        )
        d = self.to_dict()
        df.attrs.update({k: v for k, v in d.items() if k != "classes"})
        return df

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (plain floats, ints, strings); what ``fluidopt solve --json`` prints."""
        from fluidopt.fluid.sli import sli_spec

        def f(v: float) -> float | None:
            v = float(v)
            return v if math.isfinite(v) else None

        solved = math.isfinite(self.prefill_occupancy)
        classes = []
        sf, pw = self.served_fraction, self.prefill_wait
        for i, name in enumerate(self.class_names):
            classes.append(
                {
                    "name": name,
                    "lam": f(self.lam[i]),
                    "x": f(self.x[i]),
                    "y_mixed": f(self.y_mixed[i]),
                    "y_solo": f(self.y_solo[i]),
                    "q_prefill": f(self.q_prefill[i]),
                    "q_decode": f(self.q_decode[i]),
                    "prefill_throughput": f(self.prefill_throughput[i]),
                    "throughput": f(self.throughput[i]),
                    "served_fraction": f(sf[i]),
                    "prefill_wait": f(pw[i]),
                }
            )
        return {
            "status": self.status,
            "scenario": self.scenario_name,
            "pricing": self.pricing,
            "solver": self.solver,
            "gpus": int(self.gpus),
            "objective_per_gpu": f(self.objective_per_gpu),
            "objective": f(self.objective),
            "revenue_per_gpu": f(self.revenue_per_gpu),
            "penalty_per_gpu": f(self.penalty_per_gpu),
            "utility": None if self.utility is None else f(self.utility),
            "prefill_occupancy": f(self.prefill_occupancy),
            "mixed_gpus": self.mixed_gpus if solved else None,
            "solo_gpus": self.solo_gpus if solved else None,
            "tpot": f(self.tpot),
            "gpu_shadow_price": f(self.gpu_shadow_price),
            "duals": {k: f(v) for k, v in self.duals.items()},
            "sli_shadow_prices": {k: f(v) for k, v in self.sli_shadow_prices.items()},
            "violations": {k: f(v) for k, v in self.violations.items()},
            "slis": [sli_spec(s) for s in self.slis],
            "solve_seconds": f(self.solve_seconds),
            "classes": classes,
        }

    def __repr__(self) -> str:
        return (
            f"FluidSolution(status={self.status!r}, pricing={self.pricing!r}, "
            f"objective_per_gpu={self.objective_per_gpu:.6g}, prefill_occupancy={self.prefill_occupancy:.6g}, "
            f"mixed_gpus={self.mixed_gpus}/{self.gpus}, classes={len(self.class_names)})"
        )
