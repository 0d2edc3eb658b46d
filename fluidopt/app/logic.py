"""What the what-if app computes, without the page: edits of a scenario, the operating point, the fleet
against demand growth, price curves, and cancellable background jobs on the project's executor.

Everything here is a plain function of a scenario (or of the scenario's TOML-shaped dict), so the
numbers the page shows are the library's numbers for the same inputs, and the browser tests compare
the page against these functions.
"""

from __future__ import annotations

import copy
import math
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from fluidopt.core.errors import FluidoptError, ScenarioError
from fluidopt.core.model import Scenario

__all__ = ["set_field", "build", "field_error", "to_toml", "from_toml", "operating_point", "capacity",
           "price_curve", "optimal_prices", "Job", "compare_job", "verify_job"]

Path_ = tuple  # a field's path in the scenario dict: ("classes", 0, "rate")


# -- editing ---------------------------------------------------------------------------------------
def set_field(data: dict, path: Path_, value: Any) -> dict:
    """A copy of the scenario dict with ``path`` set to ``value`` (the dict is never changed in place)."""
    out = copy.deepcopy(data)
    node = out
    for k in path[:-1]:
        node = node.setdefault(k, {}) if isinstance(k, str) else node[k]
    node[path[-1]] = value
    return out


def build(data: dict) -> Scenario:
    """The validated scenario of a dict shaped like the TOML file: the loader's own checks and messages."""
    from fluidopt.scenario import scenario_from_dict

    return scenario_from_dict(data, source="<app>")


def field_error(data: dict, path: Path_, value: Any) -> str | None:
    """The loader's message if ``path = value`` makes the scenario invalid, else None."""
    if value is None or (isinstance(value, str) and path[-1] != "name" and not value.strip()):
        return f"{_where(path)}: expected a value"
    try:
        build(set_field(data, path, value))
    except FluidoptError as e:
        return str(e)
    return None


def _where(path: Path_) -> str:
    out = ""
    for k in path:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else k)
    return out


def to_toml(data: dict) -> str:
    """The scenario dict as TOML text (what ``fluidopt ... SCENARIO.toml`` reads back to the same scenario)."""
    import tomli_w

    return tomli_w.dumps(_plain(data))


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items() if x is not None}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return v


def from_toml(text: str, source: str = "<upload>") -> tuple[Scenario, dict]:
    """(scenario, its dict) from TOML text; a bad file is a :class:`ScenarioError` with the loader's message."""
    from fluidopt.scenario import loads_scenario, scenario_to_dict

    sc = loads_scenario(text, source=source)
    return sc, scenario_to_dict(sc)


# -- the operating point ---------------------------------------------------------------------------
@dataclass(frozen=True)
class OperatingPoint:
    """The fluid LP's answer under both pricings. ``headline``: one row per pricing (revenue per GPU per
    s, mixed and solo GPUs, prefill occupancy); ``classes``: per pricing and class the arrival rate per
    GPU, prefill occupancy x*, served fraction, decode occupancies and prefill wait; ``duals``: per
    pricing the rows with a nonzero shadow price (binding), value per GPU per s per unit of the row."""

    headline: pd.DataFrame
    classes: pd.DataFrame
    duals: pd.DataFrame
    seconds: float


def operating_point(scenario: Scenario) -> OperatingPoint:
    from fluidopt.fluid.lp import solve_fluid

    t0 = time.perf_counter()
    heads, rows, duals = [], [], []
    for pricing in ("bundled", "separate"):
        sol = solve_fluid(scenario, pricing=pricing)
        heads.append({"pricing": pricing, "revenue_per_gpu": sol.objective_per_gpu, "mixed_gpus": sol.mixed_gpus,
                      "solo_gpus": sol.solo_gpus, "prefill_occupancy": sol.prefill_occupancy})
        f = sol.to_frame().reset_index()
        for _, r in f.iterrows():
            rows.append({"pricing": pricing, "class": r["class"], "lam": r["lam"], "x": r["x"],
                         "served_fraction": r["served_fraction"], "y_mixed": r.get("y_mixed", math.nan),
                         "y_solo": r.get("y_solo", math.nan), "prefill_wait": r["prefill_wait"]})
        for name, v in sol.duals.items():
            if abs(v) > 1e-9:
                duals.append({"pricing": pricing, "row": name, "shadow_price": float(v)})
    return OperatingPoint(pd.DataFrame(heads), pd.DataFrame(rows), pd.DataFrame(duals, columns=["pricing", "row", "shadow_price"]),
                          time.perf_counter() - t0)


# -- capacity ----------------------------------------------------------------------------------------
def capacity(scenario: Scenario, growth: Sequence[float], served: float = 0.99,
             profiles: Sequence[str] | None = None) -> pd.DataFrame:
    """The fluid fleet bound against demand growth (and GPU type): GPUs, binding row, cost per hour and per
    million output tokens where a price per GPU-hour is known (:func:`fluidopt.planning.fleet.plan`, fluid only)."""
    from fluidopt.planning.fleet import PlanSLIs, plan

    res = plan(scenario, PlanSLIs(served=served), growth=list(growth), profiles=list(profiles) if profiles else None,
               fluid_only=True, require_price=False)
    cols = ["profile", "growth", "n_fluid", "n_fluid_int", "binding", "price_per_gpu_hour", "cost_per_hour",
            "output_tokens_per_s", "cost_per_million_output_tokens"]
    return res.table[cols]


# -- pricing -----------------------------------------------------------------------------------------
def price_curve(scenario: Scenario, which: str, prices: Sequence[float], pricing: str = "bundled") -> pd.DataFrame:
    """LP revenue per GPU per s and per-class served fractions as one token price moves (``which``:
    ``"prefill"`` or ``"decode"``), the other kept at the scenario's."""
    from fluidopt.pricing.grids import price_grid

    if which not in ("prefill", "decode"):
        raise ScenarioError(f"price_curve: which: expected 'prefill' or 'decode', got {which!r}")
    ps = [float(p) for p in prices]
    cp = ps if which == "prefill" else [scenario.prefill_price]
    cd = ps if which == "decode" else [scenario.decode_price]
    grid = price_grid(scenario, cp, cd, pricings=(pricing,))
    return grid.reset_index(drop=True)


def optimal_prices(scenario: Scenario):
    """Revenue-maximising prices under the fleet's fluid capacity (:func:`fluidopt.pricing.optimize_prices`);
    a scenario without demand models is a :class:`ScenarioError` saying why none can be optimal."""
    from fluidopt.pricing.optimize import optimize_prices

    return optimize_prices(scenario)


# -- background jobs -----------------------------------------------------------------------------------
@dataclass
class Job:
    """Work on a background thread with progress and a cancel button. ``status``: ``running``, ``done``,
    ``cancelled`` or ``failed``; ``done``/``total``: runs; ``result``; ``message``: one line for the page."""

    name: str
    status: str = "running"
    done: int = 0
    total: int = 0
    result: Any = None
    message: str = ""
    started: float = field(default_factory=time.monotonic)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def progress(self, done: int, total: int) -> None:
        self.done, self.total = done, total

    def cancel(self) -> None:
        self.stop.set()

    @property
    def finished(self) -> bool:
        return self.status != "running"

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started


def start(name: str, work: Callable[[Job], Any]) -> Job:
    """Run ``work(job)`` on a daemon thread; its return value becomes ``job.result``. Cancel (the job's
    ``stop`` event, honoured by the executor) ends it as ``cancelled``; a fluidopt error as ``failed``
    with its one-line message; anything else as ``failed`` with the exception's type and message."""
    import fluidopt.core.interrupt as interrupt

    job = Job(name)

    def body() -> None:
        try:
            job.result = work(job)
            job.status, job.message = "done", f"{name}: done in {job.elapsed:.1f} s"
        except interrupt.Interrupted as e:
            job.status = "cancelled"
            job.message = f"{name}: cancelled" + (f" ({e.kept})" if e.kept else "")
        except FluidoptError as e:
            job.status, job.message = "failed", f"{name}: {e}"
        except Exception as e:  # noqa: BLE001 - shown in the page, never as a traceback
            job.status, job.message = "failed", f"{name}: internal error ({type(e).__name__}: {e})"
            traceback.print_exc()

    job.thread = threading.Thread(target=body, name=f"fluidopt-app-{name}", daemon=True)
    job.thread.start()
    return job


def _executor(job: Job, workers: int):
    from fluidopt.harness.executor import LocalExecutor

    # forkserver: the page's server has threads of its own, which a plain fork would copy mid-flight
    return LocalExecutor(max(1, workers), pool=True, stop=job.stop, start_method="forkserver")


def compare_job(scenario: Scenario, policies: Sequence[str], *, seeds: int = 2, horizon: float = 300.0,
                warmup: float = 50.0, workers: int = 2) -> Job:
    """A short comparison on the harness (local process pool), cancellable from the page."""
    from fluidopt.harness.comparison import compare

    def work(job: Job):
        with _executor(job, workers) as ex:
            return compare(scenario, list(policies), seeds=list(range(seeds)), horizon=horizon, warmup=warmup,
                           executor=ex, progress=job.progress, sample_interval=max(horizon / 150, 0.5))

    return start("comparison", work)


def verify_job(scenario: Scenario, *, served: float = 0.99, seeds: int = 2, horizon: float | None = None,
               warmup: float | None = None, workers: int = 2) -> Job:
    """The simulation-verified fleet size (:func:`fluidopt.planning.fleet.plan`), cancellable from the page."""
    from fluidopt.planning.fleet import PlanSLIs, plan

    def work(job: Job):
        with _executor(job, workers) as ex:
            return plan(scenario, PlanSLIs(served=served), seeds=seeds, horizon=horizon, warmup=warmup, executor=ex,
                        progress=job.progress, require_price=False)

    return start("simulation-verified fleet", work)
