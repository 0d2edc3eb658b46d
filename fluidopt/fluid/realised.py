"""The fluid LP at the arrivals actually seen in a measured window: an honest R* for trace runs.

A trace replay measures revenue over ``[warmup, horizon)``. Scoring it against the LP solved at the
*whole trace's* mean rates compares two different workloads: when the window happens to hold more
(or longer) requests than the trace average the "bound" is too low and policies score above 1
(the shared Azure conversation trace gives up to 1.03). This module re-solves the same LP with each
class's rate and mean lengths taken from the arrivals inside the window:

* :func:`realised_classes`: the scenario's classes with ``rate`` = arrivals in the window / window
  length (whole cluster, per second) and, by default, ``prompt`` / ``decode`` = the window's mean
  token counts (``lengths="plan"`` keeps the scenario's). Patience and length distributions are
  the scenario's.
* :func:`realised_bound`: the fluid LP solved for those classes (:func:`fluidopt.fluid.lp.solve_fluid`).

What the number is. The fluid LP's optimum is an upper bound on a policy's long-run revenue per
GPU for *stationary* arrivals at those rates (Poisson, the paper's limit). For a finite window of a
real trace it is a **benchmark**, not a theorem: bursts inside the window cost any policy (so the
ratio sits below 1 even for a perfect controller). A run's ordinary revenue counts completions
*inside* the window: work carried in at ``warmup`` (requests that arrived earlier) is credited to
it and the window's own arrivals still in service at its end are not, so a ratio a little above 1
remains possible and policies differ at the window's edges. The arrival-cohort revenue
(``simulate(..., drain=...)``, :mod:`fluidopt.sim.cohort`) counts the window's own arrivals
whenever they complete, the population this LP prices: where the LP serves every arrival it is
their total value and an upper bound, met exactly by a policy that completes them all. Label the
ratios "revenue / R*(window)" and "cohort revenue / R*(window)".
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from fluidopt.core.errors import ScenarioError, UsageError
from fluidopt.core.model import RequestClass, Scenario

__all__ = ["realised_bound", "realised_bound_from_counts", "realised_classes", "window_counts"]


def _arrays(arrivals: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(time, cls, prompt, output) of a TraceWorkload or a DataFrame with those columns."""
    if hasattr(arrivals, "time") and hasattr(arrivals, "cls") and not hasattr(arrivals, "columns"):
        return (np.asarray(arrivals.time, float), np.asarray(arrivals.cls, int),
                np.asarray(arrivals.prompt, float), np.asarray(arrivals.output, float))
    cols = getattr(arrivals, "columns", None)
    if cols is None:
        raise UsageError(f"arrivals: expected a TraceWorkload or a DataFrame, got {type(arrivals).__name__}")
    tcol = "time" if "time" in cols else "arrival"
    need = [tcol, "cls", "prompt", "output"]
    missing = [c for c in need if c not in cols]
    if missing:
        raise UsageError(f"arrivals: missing column(s) {', '.join(missing)}; expected time (or arrival), cls, "
                         f"prompt, output")
    return (arrivals[tcol].to_numpy(float), arrivals["cls"].to_numpy(int),
            arrivals["prompt"].to_numpy(float), arrivals["output"].to_numpy(float))


def _window(start: float, end: float) -> tuple[float, float]:
    start, end = float(start), float(end)
    if not (np.isfinite(start) and np.isfinite(end)) or start < 0 or end <= start:
        raise UsageError(f"window: expected 0 <= start < end (seconds), got start={start!r}, end={end!r}")
    return start, end


def window_counts(arrivals: Any, n_classes: int, start: float, end: float) -> np.ndarray:
    """Arrivals per class with ``start <= time < end`` (seconds)."""
    start, end = _window(start, end)
    t, c, _, _ = _arrays(arrivals)
    m = (t >= start) & (t < end)
    return np.bincount(c[m], minlength=n_classes)[:n_classes]


def realised_classes(scenario: Scenario, arrivals: Any, start: float, end: float, *,
                     lengths: str = "window") -> tuple[RequestClass, ...]:
    """The scenario's classes at the rates (and, ``lengths="window"``, mean lengths) seen in [start, end).

    ``arrivals``: the replayed :class:`~fluidopt.workloads.TraceWorkload` (its times are after
    speedup) or a DataFrame with ``time`` (or ``arrival``), ``cls``, ``prompt``, ``output``.
    Rates are whole-cluster requests per second. A class with no arrival in the window gets a tiny
    positive rate (1e-12 per second: the model requires rate > 0), which leaves the LP unchanged.
    """
    if lengths not in ("window", "plan"):
        raise UsageError(f"lengths: expected 'window' or 'plan', got {lengths!r}")
    start, end = _window(start, end)
    t, c, p, o = _arrays(arrivals)
    n_cls = len(scenario.classes)
    if c.size and (c.min() < 0 or c.max() >= n_cls):
        raise ScenarioError(f"arrivals: class index {int(c.max())} outside the scenario's {n_cls} classes")
    m = (t >= start) & (t < end)
    out = []
    for i, rc in enumerate(scenario.classes):
        sel = m & (c == i)
        k = int(sel.sum())
        kw: dict[str, Any] = {"rate": max(k / (end - start), 1e-12)}
        if lengths == "window" and k > 0:
            kw.update(prompt=float(p[sel].mean()), decode=float(o[sel].mean()))
        out.append(replace(rc, **kw))
    return tuple(out)


def realised_bound(scenario: Scenario, arrivals: Any, start: float, end: float, *, pricing: str = "bundled",
                   lengths: str = "window", slis: Any = None):
    """The fluid LP (:class:`~fluidopt.fluid.solution.FluidSolution`) at the arrivals of [start, end).

    Its ``objective_per_gpu`` is R*(window), the benchmark to divide a trace run's revenue per GPU by
    when the run measured ``[start, end)`` = ``[warmup, horizon)``. See the module docstring for when
    it is a bound and when only a benchmark.
    """
    from fluidopt.fluid.lp import solve_fluid

    sc = replace(scenario, classes=realised_classes(scenario, arrivals, start, end, lengths=lengths),
                 name=f"{scenario.name}@[{start:g},{end:g})")
    return solve_fluid(sc, pricing, slis)


def realised_bound_from_counts(scenario: Scenario, counts: Any, start: float, end: float, *,
                               pricing: str = "bundled", slis: Any = None):
    """The fluid LP at per-class rates ``counts`` / (end - start) (whole cluster, per second).

    For a run whose arrivals are not a fixed trace (a seeded synthetic workload, e.g. bursts), where
    only the run's own per-class arrival counts in ``[start, end)`` are known: lengths, patience and
    prices stay the scenario's (``lengths="plan"`` of :func:`realised_classes`).
    """
    from fluidopt.fluid.lp import solve_fluid

    start, end = _window(start, end)
    k = np.asarray(counts, float).reshape(-1)
    if k.size != len(scenario.classes) or not np.all(np.isfinite(k)) or np.any(k < 0):
        raise UsageError(f"counts: expected {len(scenario.classes)} finite arrival counts >= 0 (one per class), "
                         f"got {k.tolist()}")
    classes = tuple(replace(rc, rate=max(float(v) / (end - start), 1e-12)) for rc, v in zip(scenario.classes, k))
    sc = replace(scenario, classes=classes, name=f"{scenario.name}@[{start:g},{end:g})")
    return solve_fluid(sc, pricing, slis)
