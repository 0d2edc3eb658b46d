"""Price and parameter sweeps of the fluid LP that reuse one built model and one HiGHS instance.

Each point only rewrites the mutable parameters of the :class:`~fluidopt.fluid.lp.FluidModel` and
re-solves from the previous basis (warm start), instead of building a Pyomo model per point. The
returned DataFrame has one row per point; ``df.attrs`` holds the timing: ``build_seconds`` (the one
model build), ``solve_seconds`` (sum over points, including the parameter updates), ``seconds`` (wall
time of the whole sweep) and ``points``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import Scenario
from fluidopt.fluid.lp import CAPACITY_ROWS, FluidModel
from fluidopt.fluid.sli import SLI
from fluidopt.fluid.solution import FluidSolution

__all__ = ["sweep", "sweep_scenarios"]


def _prices(name: str, values: Iterable[float] | float | None, default: float) -> list[float]:
    if values is None:
        return [default]
    arr = np.atleast_1d(np.asarray(values, dtype=float))
    if arr.ndim != 1 or arr.size == 0:
        raise ScenarioError(f"{name}: expected a non-empty 1-d sequence of prices, got shape {arr.shape}")
    bad = arr[~np.isfinite(arr) | (arr < 0)]
    if bad.size:
        raise ScenarioError(f"{name}: expected finite prices >= 0 (per token), got {bad[0]!r}")
    return [float(v) for v in arr]


def _record(sol: FluidSolution, sc: Scenario) -> dict[str, Any]:
    ok = sol.status == "optimal"
    rec: dict[str, Any] = {
        "prefill_price": sc.prefill_price,
        "decode_price": sc.decode_price,
        "status": sol.status,
        "objective_per_gpu": sol.objective_per_gpu,
        "objective": sol.objective,
        "revenue_per_gpu": sol.revenue_per_gpu,
        "prefill_occupancy": sol.prefill_occupancy,
        "mixed_gpus": sol.mixed_gpus if ok else pd.NA,
        "tpot": sol.tpot,
        "gpu_shadow_price": sol.gpu_shadow_price,
    }
    for row in CAPACITY_ROWS:
        rec[f"dual:{row}"] = sol.duals.get(row, np.nan)
    for k, v in sol.sli_shadow_prices.items():
        rec[f"sli_price:{k}"] = v
    for i, c in enumerate(sol.class_names):
        rec[f"x[{c}]"] = sol.x[i]
        rec[f"throughput[{c}]"] = sol.throughput[i]
        rec[f"served_fraction[{c}]"] = sol.served_fraction[i]
        rec[f"q_decode[{c}]"] = sol.q_decode[i]
    return rec


def sweep_scenarios(scenarios: Iterable[Scenario], *, pricing: str = "bundled", slis: Sequence[SLI] = (),
                    lexicographic: bool = True, labels: Sequence[Any] | None = None) -> pd.DataFrame:
    """Solve the fluid LP for each scenario in turn, reusing one model (a parameter sweep).

    All scenarios must have the same class names (rates, prices, GPU profile and fleet size may
    differ). Infeasible points get ``status='infeasible'`` and NaNs instead of raising.
    """
    t0 = time.perf_counter()
    it = iter(scenarios)
    try:
        first = next(it)
    except StopIteration:
        raise ScenarioError("sweep: expected at least one scenario, got none") from None
    fm = FluidModel(first, pricing, slis)
    fm.watch_structure = False  # only parameters change from point to point
    rows = []
    solve_seconds = 0.0
    for k, sc in enumerate(itertools.chain([first], it)):
        t1 = time.perf_counter()
        if k:
            fm.update(sc)
        sol = fm.solve(lexicographic=lexicographic, raise_infeasible=False)
        solve_seconds += time.perf_counter() - t1
        rows.append(_record(sol, sc))
    df = pd.DataFrame(rows)
    if labels is not None:
        labels = list(labels)
        if len(labels) != len(df):
            raise ScenarioError(f"sweep: got {len(labels)} labels for {len(df)} scenarios")
        df.index = pd.Index(labels, name="label")
    df.attrs.update(
        build_seconds=fm.build_seconds,
        solve_seconds=solve_seconds,
        seconds=time.perf_counter() - t0,
        points=len(df),
        pricing=pricing,
    )
    return df


def sweep(scenario: Scenario, prefill_prices: Iterable[float] | float | None = None,
          decode_prices: Iterable[float] | float | None = None, *, pricing: str = "bundled",
          slis: Sequence[SLI] = (), grid: bool = True, lexicographic: bool = True) -> pd.DataFrame:
    """Solve the fluid LP over token prices c_p (per prompt token) and c_d (per output token).

    ``grid=True``: every combination (len(prefill) * len(decode) points, c_p varying slowest);
    ``grid=False``: pairs, element by element (equal lengths). A price left as ``None`` stays at the
    scenario's. Per-class price overrides in the scenario are kept. Timing is in ``df.attrs``.
    """
    if not isinstance(scenario, Scenario):
        raise ScenarioError(f"scenario: expected a fluidopt Scenario, got {type(scenario).__name__}")
    cps = _prices("prefill_prices", prefill_prices, scenario.prefill_price)
    cds = _prices("decode_prices", decode_prices, scenario.decode_price)
    if grid:
        pairs = list(itertools.product(cps, cds))
    else:
        if prefill_prices is not None and decode_prices is not None and len(cps) != len(cds):
            raise ScenarioError(
                f"sweep(grid=False): prefill_prices and decode_prices must have equal lengths, got {len(cps)} and {len(cds)}"
            )
        n = max(len(cps), len(cds))
        pairs = list(zip(cps * n if len(cps) == 1 else cps, cds * n if len(cds) == 1 else cds))
    return sweep_scenarios((scenario.with_prices(cp, cd) for cp, cd in pairs), pricing=pricing, slis=slis,
                           lexicographic=lexicographic)
