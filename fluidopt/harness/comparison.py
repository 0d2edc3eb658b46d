"""The comparison harness: policies x scenarios x seeds, in parallel, into tidy DataFrames.

Each run is one :func:`fluidopt.simulate` call; each scenario's fluid LPs (the bound R* that no
policy can beat in the limit, and the plan LP-guided policies follow) are solved once in the parent
and handed to the runs. Runs go through :mod:`fluidopt.harness.executor` (a local process pool by default,
or Dask). Ctrl-C or SIGTERM stops them and raises :class:`fluidopt.core.interrupt.Interrupted`, whose
``partial`` is the :class:`Comparison` of the runs that finished (flagged ``interrupted``); no table of
an incomplete sweep is written. ``out=`` holds the folder as its only writer (a lock file), keeps a
results store there so that a rerun skips the runs already done, and writes the tables as one
generation (all replaced or none), so a result file is never half written or mixed with an older sweep's.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import fluidopt.core.interrupt as interrupt
from fluidopt.core.errors import ScenarioError, did_you_mean
from fluidopt.core.files import atomic_path
from fluidopt.core.model import Scenario
from fluidopt.core.tquantile import t_quantile
from fluidopt.harness.executor import Executor
from fluidopt.sim.cohort import COHORT_KEYS

__all__ = ["COHORT_RUN_COLUMNS", "Comparison", "compare", "RUN_COLUMNS"]

# Cluster metrics copied from SimResult.summary() into one row per run.
RUN_COLUMNS = (
    "revenue_per_gpu",
    "revenue_per_gpu_ci",
    "revenue_per_gpu_separate",
    "revenue_per_gpu_separate_ci",
    "throughput",
    "abandoned_fraction",
    "ttft_mean",
    "ttft_p99",
    "e2e_mean",
    "e2e_p50",
    "e2e_p99",
    "tpot_mean",
    "mixed_gpu_fraction",
    "slot_utilisation",
    "requests",
    "completed",
    "abandoned",
    "abandoned_prefill",
    "abandoned_decode",
    "wall_seconds",
    "engine",  # which event engine ran: "compiled" or "python" (fluidopt.sim.backend)
    "interrupted",
)

# With compare(..., drain=...): the arrival-cohort metrics (fluidopt.sim.cohort) added to each run's row.
COHORT_RUN_COLUMNS = tuple(k for k in COHORT_KEYS if k != "drain_cap")

# Per-class metrics kept in the long per-class table.
_MIN_SEEDS_FOR_T = 5

CLASS_COLUMNS = (
    "throughput",
    "abandoned_fraction",
    "abandoned_prefill_fraction",
    "abandoned_decode_fraction",
    "ttft_mean",
    "ttft_p99",
    "e2e_mean",
    "e2e_p99",
    "x_mean",
    "y_mixed_mean",
    "y_solo_mean",
    "q_prefill_mean",
    "q_decode_mean",
    "arrived",  # arrivals in the measured window: the realised rates of R*(window) for a workload run
)


def _per_bound(hw: float, bound: float) -> float:
    """A revenue half-width as a ratio half-width; NaN where the bound is not positive (the ratio is NaN
    there too, e.g. a price point whose LP earns nothing)."""
    return hw / bound if bound > 0 else math.nan


@dataclass(frozen=True)
class Comparison:
    """Outcome of :func:`compare`.

    ``runs``: one row per (scenario, policy, seed) with its window (``horizon``, ``warmup``, s) and
    cluster metrics (rates per GPU per second, times in seconds), ``revenue`` (per GPU per second under ``pricing``, with its batch-means 95%
    half-width ``revenue_ci``), the LP bound ``lp_bound`` (R* for ``pricing``) and ``ratio`` =
    revenue / R*; for a run that replayed a workload also ``lp_bound_realised`` = R*(window), the LP
    at the arrivals actually in the measured window [warmup, horizon) (:mod:`fluidopt.fluid.realised`),
    and ``ratio_realised`` = revenue / R*(window) (NaN for Poisson runs, where R* itself is the bound).
    With ``compare(..., drain=...)`` also the arrival-cohort columns (:mod:`fluidopt.sim.cohort`):
    ``cohort_revenue`` (the value of the requests that arrived in the window, credited when they
    complete, per GPU per second of the window, under ``pricing``) with ``cohort_revenue_ci``, and
    ``ratio_cohort`` = cohort revenue / R*(window) for a run that replayed a workload (both sides
    count the same arrivals), / R* for a Poisson run; ``cohort_*`` counts, ``drain_seconds``,
    ``cohort_drained``.
    ``classes``: the per-class metrics of every run (long format).
    ``bounds``: one row per scenario with the bundled and separate LP optima and M.
    ``timeseries``: with ``compare(sample_interval=...)``, every run's sampled state (long format,
    labelled by scenario, policy and seed), else None. ``plans``: each scenario's solved LPs,
    ``{scenario name: {pricing: FluidSolution}}``, the plans the LP-guided policies ran.
    """

    runs: pd.DataFrame
    classes: pd.DataFrame
    bounds: pd.DataFrame
    pricing: str
    wall_seconds: float
    interrupted: bool = False
    meta: dict = field(default_factory=dict)
    timeseries: pd.DataFrame | None = None
    plans: dict = field(default_factory=dict, repr=False)

    def to_frame(self) -> pd.DataFrame:
        return self.runs.copy()

    def summary(self, ci: str = "auto") -> pd.DataFrame:
        """Mean, standard deviation and 95% CI half-width over seeds, per scenario and policy.

        ``ci="auto"``: half-widths are t intervals over seeds; for revenue and ratio with fewer than
        ``_MIN_SEEDS_FOR_T`` seeds they pool the runs' batch-means intervals instead.
        ``ci="t"``: t intervals over seeds for every metric whenever there are two seeds or more.
        """
        if ci not in ("auto", "t"):
            raise ScenarioError(f"Comparison.summary: ci: expected 'auto' or 't', got {ci!r}")
        if self.runs.empty:
            return pd.DataFrame()
        metrics = ["ratio", "ratio_realised", "ratio_cohort", "revenue", "throughput", "abandoned_fraction", "ttft_mean",
                   "e2e_mean", "e2e_p99"]
        if "ratio_realised" not in self.runs.columns:  # a table saved before R*(window) was reported
            metrics.remove("ratio_realised")
        if "ratio_cohort" not in self.runs.columns:  # runs without a drain (the default)
            metrics.remove("ratio_cohort")
        rows = []
        for (scen, pol), g in self.runs.groupby(["scenario", "policy"], sort=False):
            row: dict[str, Any] = {"scenario": scen, "policy": pol, "seeds": len(g)}
            for m in metrics:
                v = g[m].to_numpy(dtype=float)
                k = len(v)
                row[m] = float(np.mean(v))
                row[f"{m}_std"] = float(np.std(v, ddof=1)) if k > 1 else math.nan
                if m in ("ratio", "ratio_realised", "ratio_cohort", "revenue") and k < _MIN_SEEDS_FOR_T and ci == "auto":
                    # Few seeds: a t interval over seeds is uninformative (t_{0.975,1} = 12.7), so
                    # pool the runs' own batch-means half-widths: hw = sqrt(sum hw_j^2) / k.
                    src = "cohort_revenue_ci" if m == "ratio_cohort" else "revenue_ci"
                    hw = float(np.sqrt(np.sum(g[src].to_numpy(dtype=float) ** 2)) / k)
                    if m == "ratio":
                        hw = _per_bound(hw, float(g["lp_bound"].iloc[0]))
                    elif m == "ratio_realised":  # R*(window) may differ between the runs of a seeded workload
                        hw = _per_bound(hw, float(g["lp_bound_realised"].mean()))
                    elif m == "ratio_cohort":
                        hw = _per_bound(hw, float(g["cohort_bound"].mean()))
                    row[f"{m}_ci"] = hw
                elif k > 1:
                    row[f"{m}_ci"] = float(t_quantile(k - 1, 0.975) * row[f"{m}_std"] / math.sqrt(k))
                else:
                    row[f"{m}_ci"] = math.nan
            rows.append(row)
        return pd.DataFrame(rows)

    def class_means(self, metrics: Sequence[str] = CLASS_COLUMNS) -> pd.DataFrame:
        """Per-class metrics averaged over seeds: one row per (scenario, policy, class ``name``).

        Rates and occupancies are per GPU (``x_mean`` is X_i/n), times in seconds.
        """
        if self.classes.empty:
            return pd.DataFrame()
        return self.classes.groupby(["scenario", "policy", "name"], sort=False)[list(metrics)].mean().reset_index()

    TABLES = ("runs.csv", "classes.csv", "bounds.csv", "summary.csv", "timeseries.csv", "meta.json")

    def save(self, directory: str | os.PathLike, extra: dict[str, Any] | None = None,
             owned: Sequence[str] = ()) -> list[Path]:
        """Write runs.csv, classes.csv, bounds.csv, summary.csv (and timeseries.csv when sampled) and
        meta.json into ``directory`` as one generation (:func:`fluidopt.core.files.write_generation`: all
        replace the previous ones or none does, and a previous sweep's timeseries.csv does not outlive
        it); :meth:`load` reads them back. ``extra``: more files of the same generation (a figure),
        name -> ``write(path)``; ``owned``: other names this generation replaces or removes.

        An interrupted comparison's files are named ``partial-runs.csv`` and so on, never the names of
        a finished sweep's tables."""
        import json

        from fluidopt.core.files import write_generation

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        tag = "partial-" if self.interrupted else ""
        writers: dict[str, Any] = {}
        tables = [("runs", self.runs), ("classes", self.classes), ("bounds", self.bounds), ("summary", self.summary())]
        if self.timeseries is not None:
            tables.append(("timeseries", self.timeseries))
        for name, df in tables:
            writers[f"{tag}{name}.csv"] = lambda p, df=df: df.to_csv(p, index=False)
        meta = {"pricing": self.pricing, "wall_seconds": self.wall_seconds, "interrupted": self.interrupted,
                "meta": self.meta}
        writers[f"{tag}meta.json"] = lambda p: p.write_text(json.dumps(meta, indent=1, default=str))
        writers.update({f"{tag}{k}": v for k, v in (extra or {}).items()})
        return write_generation(d, writers, owned=[f"{tag}{n}" for n in (*self.TABLES, *owned)])

    @classmethod
    def load(cls, directory: str | os.PathLike) -> Comparison:
        """The comparison :meth:`save` wrote into ``directory`` (tables only: not the solved plans)."""
        import json

        d = Path(directory)
        if not (d / "runs.csv").is_file():
            raise ScenarioError(f"Comparison.load: {d}: no runs.csv there (expected a folder written by save)")

        def table(name: str) -> pd.DataFrame:
            p = d / f"{name}.csv"
            return pd.read_csv(p) if p.is_file() and p.stat().st_size > 1 else pd.DataFrame()

        meta = json.loads((d / "meta.json").read_text()) if (d / "meta.json").is_file() else {}
        ts = d / "timeseries.csv"
        return cls(runs=table("runs"), classes=table("classes"), bounds=table("bounds"),
                   pricing=meta.get("pricing", "bundled"), wall_seconds=float(meta.get("wall_seconds", math.nan)),
                   interrupted=bool(meta.get("interrupted", False)), meta=meta.get("meta", {}),
                   timeseries=pd.read_csv(ts) if ts.is_file() else None)


def write_csv_atomic(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write ``df`` to ``path`` through a temporary file and a rename (never half written)."""
    path = Path(path)
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False)
    return path


def _lp_bounds(scenario: Scenario) -> tuple[dict[str, Any], dict[str, Any]]:
    """The scenario's bundled and separate LPs (with the scenario's own SLIs), solved once.

    Returns the bounds row and the plan ``{pricing: FluidSolution}`` handed to LP-guided policies.
    """
    from fluidopt.fluid.lp import solve_fluid

    b = solve_fluid(scenario, pricing="bundled")
    s = solve_fluid(scenario, pricing="separate")
    row = {
        "scenario": scenario.name,
        "gpus": scenario.gpus,
        "lp_bundled": b.objective_per_gpu,
        "lp_separate": s.objective_per_gpu,
        "mixed_gpus_bundled": b.mixed_gpus,
        "mixed_gpus_separate": s.mixed_gpus,
        "prefill_occupancy_bundled": b.prefill_occupancy,
    }
    return row, {"bundled": b, "separate": s}


def _workload_fingerprint(wl: Any) -> str:
    """A short hash of a replay workload's requests (times, lengths, classes), for run keys."""
    import hashlib

    frame = getattr(wl, "frame", None)
    if frame is None:
        return repr(wl)
    digest = pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes()
    return hashlib.sha256(digest + repr(getattr(wl, "speedup", 1.0)).encode()).hexdigest()[:16]


def _is_trace(workload: Any) -> bool:
    """A replay of fixed arrivals (the same in every run), as opposed to a seeded generator."""
    return all(hasattr(workload, a) for a in ("time", "cls", "prompt", "output"))


def _realised_bound(scenario: Scenario, workload: Any, warmup: float, horizon: float, pricing: str,
                    arrived: Sequence[float]) -> float:
    """R*(window) per GPU per second of a run that replayed ``workload`` and measured [warmup, horizon).

    A trace (fixed arrivals with ``time``, ``cls``, ``prompt``, ``output``): the LP at the rates and mean
    lengths of its arrivals in the window (:func:`fluidopt.fluid.realised.realised_bound`). Any other
    workload (seeded, e.g. synthetic bursts): the LP at the run's own per-class window counts
    ``arrived`` with the scenario's lengths. NaN when the counts are unknown (a run stored before they were
    recorded) or the LP is not optimal.
    """
    from fluidopt.fluid import realised

    if warmup >= horizon:
        return math.nan
    if _is_trace(workload):
        sol = realised.realised_bound(scenario, workload, warmup, horizon, pricing=pricing)
    elif len(arrived) == len(scenario.classes) and np.all(np.isfinite(np.asarray(arrived, float))):
        sol = realised.realised_bound_from_counts(scenario, arrived, warmup, horizon, pricing=pricing)
    else:
        return math.nan
    return float(sol.objective_per_gpu) if sol.status == "optimal" else math.nan


def _run_one(job: dict[str, Any]) -> dict[str, Any]:
    """One simulation: the controller from the plan the parent solved (never re-solved here)."""
    from fluidopt.control.registry import make_controller
    from fluidopt.sim.api import simulate

    ctrl = make_controller(job["policy"], job["scenario"], plan=job.get("plan"), **(job["options"] or {}))
    win = job["window"]  # checked once by compare (fluidopt.sim.window.RunWindow)
    res = simulate(job["scenario"], ctrl, window=win, seed=job["seed"], progress=False, workload=job.get("workload"))
    interrupt.raise_if_cut(res)  # (run in this process: never store a cut run as a whole one)
    summ = res.summary()
    row = {k: summ.get(k, math.nan) for k in RUN_COLUMNS}
    if win.drain is not None:
        row.update({k: summ.get(k, math.nan) for k in COHORT_RUN_COLUMNS})
    classes = [{"name": c["name"], **{k: c.get(k, math.nan) for k in CLASS_COLUMNS}} for c in summ["classes"]]
    out: dict[str, Any] = {"row": row, "classes": classes}
    if win.sample_interval is not None and res.timeseries is not None:
        out["timeseries"] = res.timeseries.reset_index(drop=True)
    return out


def _policy_label(p: Any) -> tuple[str, str]:
    """(label, registered name) of a ``policies`` entry: a name, or a (label, name) pair."""
    if isinstance(p, tuple) and len(p) == 2 and all(isinstance(v, str) for v in p):
        return p[0], p[1]
    if isinstance(p, str):
        return p, p
    raise ScenarioError(f"compare: policies: expected a policy name or a (label, name) pair, got {p!r}")


def _per_scenario(name: str, value: Any, scenarios: Sequence[Scenario]) -> dict[str, Any]:
    """``value`` for every scenario: one value for all, or a mapping from scenario name to its own."""
    if not isinstance(value, dict):
        return {s.name: value for s in scenarios}
    names = [s.name for s in scenarios]
    missing = [n for n in names if n not in value]
    extra = sorted(set(value) - set(names))
    if missing or extra:
        raise ScenarioError(f"compare: {name}: a mapping must give one value per scenario name; "
                            f"missing {missing}, unknown {extra}")
    return {n: value[n] for n in names}


def _one_or_all(values: dict[str, Any]) -> Any:
    """The common value when every scenario has the same, else the dict (for ``Comparison.meta``)."""
    distinct = set(map(repr, values.values()))
    return next(iter(values.values())) if len(distinct) == 1 else dict(values)


def _check_jobs(scenarios: Sequence[Scenario], policies: Sequence[tuple[str, str]], seeds: Sequence[int]) -> None:
    if not scenarios:
        raise ScenarioError("compare: scenarios: expected at least one Scenario, got none")
    for s in scenarios:
        if not isinstance(s, Scenario):
            raise ScenarioError(f"compare: scenarios: expected Scenario objects, got {type(s).__name__}")
    names = [s.name for s in scenarios]
    if len(set(names)) != len(names):
        raise ScenarioError(f"compare: scenarios: names must be unique to label the results, got {names}")
    if not policies:
        raise ScenarioError("compare: policies: expected at least one policy name, got none")
    labels = [label for label, _ in policies]
    if len(set(labels)) != len(labels):
        raise ScenarioError(f"compare: policies: labels must be unique, got {labels}")
    from fluidopt.control.registry import available

    known = available()
    for _, p in policies:
        if not isinstance(p, str) or p.strip().lower().replace("_", "-") not in known:
            raise ScenarioError(f"compare: policies: unknown policy {p!r}{did_you_mean(p, known)}; known: "
                                f"{', '.join(sorted(known))}")
    if not seeds:
        raise ScenarioError("compare: seeds: expected at least one seed, got none")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ScenarioError(f"compare: seeds: expected integers >= 0, got {s!r}")


def compare(
    scenarios: Scenario | Sequence[Scenario],
    policies: Sequence[str | tuple[str, str]],
    *,
    seeds: Sequence[int] = (0,),
    horizon: float | dict[str, float],
    warmup: float | dict[str, float] = 0.0,
    service: str | dict[str, str] = "markov",
    pricing: str = "bundled",
    workers: int | None = None,
    progress: bool | None = None,
    options: dict[str, dict] | None = None,
    imports: Sequence[str] = (),
    out: str | os.PathLike | None = None,
    sample_interval: float | dict[str, float | None] | None = None,
    executor: Executor | None = None,
    resume: bool = True,
    workloads: dict[str, Any] | None = None,
    drain: float | dict[str, float | None] | None = None,
    save: bool = True,
) -> Comparison:
    """Simulate every policy on every scenario for every seed and compare with the LP bound.

    ``policies``: registered names (:func:`fluidopt.control.registry.available`), or (label, name)
    pairs to run one policy several times with different options (an ablation); ``options`` maps a
    policy's label (its name when no label is given) to its controller options; the results'
    ``policy`` column holds the label. ``imports`` names modules (or .py files) that register
    user policies, imported in every worker. ``pricing`` picks the bound and the revenue column used
    for ``ratio`` ("bundled" or "separate"). Each scenario's LPs (bundled and separate, with the
    scenario's own SLIs) are solved once here and handed to the LP-guided policies as ``plan=``.

    ``executor``: where runs execute (:mod:`fluidopt.harness.executor`: a local process pool, a Dask
    LocalCluster or an existing Dask cluster); default a local pool of ``workers`` processes
    (default: CPU count, at most the number of runs; 1 runs in this process). Every backend gives the
    same numbers bit for bit. ``sample_interval``: sample every run's state every so many seconds;
    the samples come back in ``Comparison.timeseries`` (long format), so figures need no re-run.
    ``horizon``, ``warmup`` (seconds), ``service`` and ``sample_interval`` take one value for every
    scenario or a dict from scenario name to that scenario's own (fleets of different sizes need
    different windows for the same precision).
    ``out``: a folder for the CSV tables; finished runs are also appended there, one by one, to a
    results store (``store.jsonl``), and with ``resume=True`` (default) runs already in it are not run
    again, so a rerun after a crash or Ctrl-C does only what is missing. A second process on the same
    folder gets :class:`~fluidopt.core.errors.FolderInUseError` naming the holder. ``workloads``: maps a
    scenario name to a replay workload (a trace, :func:`fluidopt.workloads.traces.replay`) that replaces its
    Poisson arrivals in every run of that scenario (``service="tokens"``).

    ``save=False``: keep the store in ``out`` but leave the tables to the caller (who writes them with
    :meth:`Comparison.save`, e.g. with figures of the same generation).

    ``drain``: seconds (a cap; one value or a dict per scenario name) every run may go on past its
    horizon so that the requests that arrived in its window resolve (``simulate(..., drain=...)``,
    :mod:`fluidopt.sim.cohort`); the runs then also report the arrival-cohort revenue and
    ``ratio_cohort`` (see :class:`Comparison`). A run whose cohort does not resolve within the cap
    warns (:class:`~fluidopt.sim.cohort.CohortWarning`) and has ``cohort_drained`` False. Default
    None: no drain, the tables as before.
    """
    if isinstance(scenarios, Scenario):
        scenarios = [scenarios]
    scenarios = list(scenarios)
    labelled = [_policy_label(p) for p in policies]
    seeds = list(seeds)
    if imports:
        from fluidopt.control.registry import import_user_modules

        import_user_modules(list(imports))
    _check_jobs(scenarios, labelled, seeds)
    if pricing not in ("bundled", "separate"):
        raise ScenarioError(f"compare: pricing: expected 'bundled' or 'separate', got {pricing!r}")
    # Each scenario's run window, checked once, up front: the workers and the engine take it as it is.
    from fluidopt.sim.window import RunWindow

    per = {k: _per_scenario(k, v, scenarios) for k, v in (("horizon", horizon), ("warmup", warmup),
                                                          ("service", service), ("sample_interval", sample_interval),
                                                          ("drain", drain))}
    windows = {name: RunWindow(*(per[k][name] for k in per), caller="compare") for name in per["horizon"]}
    import fluidopt.core.interrupt as interrupt
    from fluidopt.core.files import maybe_lock

    with maybe_lock(out, "out", "compare"):
        try:
            return _compare_locked(scenarios, labelled, seeds, windows, pricing, options, workloads, out, resume,
                                   progress, executor, workers, imports, save)
        except KeyboardInterrupt as e:
            if getattr(e, "kept", ""):
                raise
            # stopped before the runs started (the LP solves, the pool's start): say what the store holds
            raise interrupt.interrupted_from(e, stored_line(out)) from None


def stored_line(out: str | os.PathLike | None) -> str:
    """What a results folder's store holds, in one line (for an interruption message)."""
    if out is None:
        return "nothing was stored (no results folder)"
    from fluidopt.harness.executor import ResultStore

    store = ResultStore(out)
    n = len(store.load()) if store.path.exists() else 0
    return f"{n} finished run{'s' if n != 1 else ''} kept in {store.path}; rerun the same command to resume"


def _compare_locked(scenarios, labelled, seeds, windows, pricing, options, workloads, out, resume, progress, executor,
                    workers, imports, save=True) -> Comparison:
    import fluidopt.core.interrupt as interrupt
    from fluidopt.control.registry import uses_plan
    from fluidopt.harness.executor import LocalExecutor, ResultStore, run_jobs

    store = ResultStore(out) if out is not None else None
    if store is not None and not resume and store.path.exists():
        store.path.unlink()
    if progress is None:
        progress = bool(getattr(sys.stderr, "isatty", lambda: False)())
    t0 = time.perf_counter()
    solved = [_lp_bounds(s) for s in scenarios]
    bounds = pd.DataFrame([b for b, _ in solved])
    plans = {s.name: p for s, (_, p) in zip(scenarios, solved)}
    bound_of = dict(zip(bounds["scenario"], bounds[f"lp_{pricing}"]))

    jobs = []
    for s in scenarios:
        for label, p in labelled:
            opts = (options or {}).get(label)
            # A policy given its own SLIs plans for them itself; every other LP-guided one gets the plan.
            plan = plans[s.name] if uses_plan(p) and not (opts or {}).get("slis") else None
            for seed in seeds:
                win = windows[s.name]
                job = {"scenario": s, "policy": p, "seed": seed, "window": win, "options": opts, "plan": plan,
                       "label": label}
                wl = (workloads or {}).get(s.name)
                if wl is not None:
                    # a replayed trace shapes the run: its content is part of the run's key
                    job["workload"] = wl
                    job["extra"] = {"workload": _workload_fingerprint(wl)}
                if win.drain is not None:  # (part of the key: a drained run reports more)
                    job["extra"] = {**(job.get("extra") or {}), "drain": win.drain}
                jobs.append(job)

    own = executor is None
    if own:
        n_workers = workers if workers is not None else (os.cpu_count() or 1)
        if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
            from fluidopt.core.errors import UsageError

            raise UsageError(f"compare: workers: expected an integer >= 1, got {n_workers!r}")
        executor = LocalExecutor(max(1, min(n_workers, len(jobs))), imports)

    def note(job: dict, res: dict) -> str:
        return f"{job['scenario'].name} {job['label']} seed={job['seed']}"

    try:
        done = run_jobs(_run_one, jobs, executor=executor, store=store, progress=progress, desc="simulations",
                        note=note)
    except interrupt.Interrupted as e:
        # Nothing of an incomplete sweep is saved as tables: the finished runs are in the store (a rerun
        # resumes), and the caller gets them as e.partial.
        if own:
            executor.close()
        e.partial = _assemble(jobs, e.partial or {}, True, scenarios, bounds, plans, bound_of, pricing, t0,
                              windows, seeds, executor, options)
        raise
    except BaseException:
        if own:
            executor.close()
        raise
    result = None
    try:
        if own:
            executor.close()
        result = _assemble(jobs, done, False, scenarios, bounds, plans, bound_of, pricing, t0, windows, seeds,
                           executor, options)
        if out is not None and save:
            result.save(out)
    except KeyboardInterrupt as e:  # the sweep is whole in the store; its tables are not written
        where = f"are kept in {store.path}" if store is not None else "were not stored (no results folder)"
        raise interrupt.interrupted_from(
            e, f"all {len(jobs)} simulations finished and {where}, but the tables were not written; rerun the "
               "same command to write them", result) from None
    return result


def _assemble(jobs, done, interrupted, scenarios, bounds, plans, bound_of, pricing, t0, windows, seeds, executor,
              options) -> Comparison:
    """The :class:`Comparison` of the finished runs ``done`` ({job index: result})."""
    rows, class_rows, series = [], [], []
    realised_of: dict[tuple, float] = {}
    col = "revenue_per_gpu" if pricing == "bundled" else "revenue_per_gpu_separate"
    for k in sorted(done):
        j = jobs[k]
        win = j["window"]
        key = {"scenario": j["scenario"].name, "policy": j["label"], "seed": j["seed"], "gpus": j["scenario"].gpus,
               "service": win.service, "horizon": win.horizon, "warmup": win.warmup}
        r = done[k]["row"]
        rev, rev_ci = r[col], r[f"{col}_ci"]
        bound = bound_of[j["scenario"].name]
        # R*(window) for a workload run (the plain R* is only a benchmark there); NaN for Poisson runs
        real = math.nan
        if j.get("workload") is not None:
            arrived = [c.get("arrived", math.nan) for c in done[k]["classes"]]
            wkey = (key["scenario"], win.warmup, win.horizon, None if _is_trace(j["workload"]) else k)
            if wkey not in realised_of:
                realised_of[wkey] = _realised_bound(j["scenario"], j["workload"], win.warmup, win.horizon, pricing,
                                                    arrived)
            real = realised_of[wkey]
        row = {**key, "lp_bound": bound, "revenue": rev, "revenue_ci": rev_ci,
               "ratio": rev / bound if bound > 0 else math.nan, "lp_bound_realised": real,
               "ratio_realised": rev / real if real > 0 else math.nan}
        if win.drain is not None:
            # the arrival cohort's revenue over the LP of the same arrivals: R*(window) for a workload run
            ccol = "cohort_revenue_per_gpu" if pricing == "bundled" else "cohort_revenue_per_gpu_separate"
            cb = real if j.get("workload") is not None else bound
            crev = r.get(ccol, math.nan)
            row.update({"cohort_revenue": crev, "cohort_revenue_ci": r.get(f"{ccol}_ci", math.nan), "cohort_bound": cb,
                        "ratio_cohort": crev / cb if cb > 0 else math.nan})
        rows.append({**row, **r})
        class_rows.extend({**key, **c} for c in done[k]["classes"])
        ts = done[k].get("timeseries")
        if ts is not None:
            series.append(ts.assign(scenario=key["scenario"], policy=key["policy"], seed=key["seed"]))
    result = Comparison(
        runs=pd.DataFrame(rows),
        classes=pd.DataFrame(class_rows),
        bounds=bounds,
        pricing=pricing,
        wall_seconds=time.perf_counter() - t0,
        interrupted=interrupted,
        meta={**{f: _one_or_all({name: getattr(w, f) for name, w in windows.items()})
                 for f in ("horizon", "warmup", "service")},
              "seeds": seeds,
              "workers": executor.workers, "executor": executor.describe(), "options": dict(options or {}),
              "sample_interval": _one_or_all({name: w.sample_interval for name, w in windows.items()}),
              **({"drain": _one_or_all({name: w.drain for name, w in windows.items()})}
                 if any(w.drain is not None for w in windows.values()) else {})},
        timeseries=pd.concat(series, ignore_index=True) if series else None,
        plans=plans,
    )
    return result
