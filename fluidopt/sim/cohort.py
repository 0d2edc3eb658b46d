"""Arrival-cohort revenue: the value of the requests that *arrived* in the measured window.

A run's ordinary revenue (``revenue_per_gpu``) counts the completions whose *time* lies in the
window ``[warmup, horizon)``: work carried in from the warm-up is credited to the window and work
still in the system at the horizon is not. That is the right rate for a long stationary run, but
on a finite window it counts a different population than the LP of the window's own arrivals
(:func:`fluidopt.fluid.realised.realised_bound`, R*(window)), and a faster policy loses revenue
at the window's edges (it finishes warm-up work before the window opens).

The **cohort** of a run is the set of requests with ``warmup <= arrival < horizon``. Its revenue
credits each of them with its value when (if) it completes, whenever that is; abandoned and
dropped requests earn nothing. To see the whole cohort resolve, the run goes on past the horizon
(``simulate(..., drain=cap)``): arrivals continue as the workload has them (a trace: its own rows;
a Poisson workload: its arrivals up to ``horizon + cap``), so the cohort's last requests meet the
load they would meet in a longer run, and the run stops as soon as every cohort request has
completed, abandoned or been dropped, or at ``horizon + cap`` (then :class:`CohortWarning`; the
requests still in the system earn nothing and are counted as ``cohort_unresolved``). Every other
metric of the result is measured over ``[warmup, horizon)`` exactly as without ``drain`` (the same
numbers, bit for bit: the drain happens after the window's result is taken).

Value of one request (the simulator's own pricing, :mod:`fluidopt.sim.results`):

* ``bundled``: a completed request earns ``prefill_price * prompt + decode_price * output``
  (``tokens`` service: its own token counts; ``markov``: its class's mean lengths);
* ``separate``: the prefill part for every request whose first prefill completed (completed, or
  abandoned while waiting for a decode), the decode part for every completed one.

Revenue per GPU per second: the cohort's value / (GPUs * (horizon - warmup)), the units of
``revenue_per_gpu`` and of R*(window), so ``cohort_revenue_per_gpu / R*(window)`` compares the same
requests on both sides. Its 95% half-width is batch means over the window's ``batches`` slices,
each request attributed to the slice it *arrived* in.

:func:`cohort_from_records` computes the same numbers from a records CSV
(``simulate(..., records=PATH)``) of a run that went on long enough.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

import numpy as np
import pandas as pd

from fluidopt.core.errors import UsageError
from fluidopt.sim import metrics as M

__all__ = ["COHORT_KEYS", "CohortTracker", "CohortWarning", "cohort_from_records", "cohort_summary"]

# The cluster metrics a drained run adds to SimResult.cluster (and to summary()).
COHORT_KEYS = (
    "cohort_revenue_per_gpu",
    "cohort_revenue_per_gpu_ci",
    "cohort_revenue_per_gpu_separate",
    "cohort_revenue_per_gpu_separate_ci",
    "cohort_arrived",
    "cohort_completed",
    "cohort_abandoned",
    "cohort_dropped",
    "cohort_unresolved",
    "cohort_drained",
    "drain_seconds",
    "drain_cap",
)


class CohortWarning(UserWarning):
    """Some requests of the window's cohort were still in the system at ``horizon + drain``."""


def _values(scenario: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(prefill price, decode price, mean prompt, mean output) per class, as the simulator prices them."""
    cp, cd = scenario.class_prices()
    mp = np.array([c.prompt for c in scenario.classes], dtype=float)
    mo = np.array([c.decode for c in scenario.classes], dtype=float)
    return np.asarray(cp, float), np.asarray(cd, float), mp, mo


def make_tracker(eng, drain: float) -> CohortTracker:
    """The tracker of engine ``eng``'s window cohort, draining at most ``drain`` seconds past the horizon
    (checked with the run's window: fluidopt.sim.window.RunWindow)."""
    cap = float(drain)
    return CohortTracker(eng.I, eng.warmup, eng.horizon, eng.collector.K, cap, cp=eng._cp, cd=eng._cd,
                         mean_prompt=eng._mean_prompt, mean_output=eng._mean_output, markov=eng.markov,
                         n_gpus=eng.scenario.gpus)


class CohortTracker:
    """Folds finished-request chunks (the engine's record arrays) of the cohort ``[warmup, horizon)``.

    ``cp``, ``cd``: per-class prefill and decode prices (per token); ``mean_prompt``,
    ``mean_output``: per-class mean lengths (used for ``markov`` service); ``batches``: slices of the
    window for the batch-means interval. The engine drives it (:mod:`fluidopt.sim.bookkeeping`);
    :func:`cohort_from_records` drives it over a records table.
    """

    def __init__(self, n_classes: int, warmup: float, horizon: float, batches: int, cap: float, *,
                 cp, cd, mean_prompt, mean_output, markov: bool, n_gpus: int):
        self.I = int(n_classes)
        self.warmup, self.horizon, self.cap = float(warmup), float(horizon), float(cap)
        self.K = int(batches)
        self.L = (self.horizon - self.warmup) / self.K
        self.cp, self.cd = np.asarray(cp, float), np.asarray(cd, float)
        self.mp, self.mo = np.asarray(mean_prompt, float), np.asarray(mean_output, float)
        self.markov = bool(markov)
        self.n = int(n_gpus)
        # per (batch of arrival, class): completed, abandoned, dropped, bundled value, separate value
        self.acc = np.zeros((self.K, self.I, 5))
        self.last_end = -math.inf  # time the last cohort request resolved (seconds)
        self.arrived: np.ndarray | None = None  # per class, set when the window closes
        self.draining = False
        self.t_check = math.inf
        # seconds between two checks of the drain (the run stops at most this long after the cohort
        # has resolved; the numbers do not depend on it)
        self.step = max(self.L / 10.0, 1e-6)
        self.window_result = None  # the SimResult of [warmup, horizon), taken when the window closed
        self.end_time = math.nan  # simulated time the drain stopped

    # -- folding --------------------------------------------------------------------------------
    def add(self, a: dict[str, np.ndarray]) -> None:
        """Fold a chunk of request rows (metrics.RECORD_FIELDS arrays) into the cohort's sums."""
        arr = a["arrival"]
        out = a["outcome"]
        keep = (arr >= self.warmup) & (arr < self.horizon) & (out != M.IN_SYSTEM)
        if not keep.any():
            return
        c = a["cls"][keep]
        out = out[keep]
        done = out == M.COMPLETED
        if self.markov:
            pre_v = self.cp[c] * self.mp[c]
            dec_v = self.cd[c] * self.mo[c]
        else:
            pre_v = self.cp[c] * a["prompt"][keep]
            dec_v = self.cd[c] * a["output"][keep]
        prefilled = np.isfinite(a["ttft"][keep])
        f = np.zeros((c.size, 5))
        f[:, 0] = done
        f[:, 1] = (out == M.ABANDONED_PREFILL) | (out == M.ABANDONED_DECODE)
        f[:, 2] = out == M.DROPPED
        f[:, 3] = np.where(done, pre_v + dec_v, 0.0)
        f[:, 4] = np.where(prefilled, pre_v, 0.0) + np.where(done, dec_v, 0.0)
        b = np.clip(np.floor((arr[keep] - self.warmup) / self.L), 0, self.K - 1).astype(np.int64)
        idx = b * self.I + c
        for j in range(5):
            self.acc[:, :, j] += np.bincount(idx, weights=f[:, j], minlength=self.K * self.I).reshape(self.K, self.I)
        self.last_end = max(self.last_end, float(np.max(a["end"][keep])))

    def resolved(self) -> np.ndarray:
        """Cohort requests resolved so far, per class."""
        return self.acc[:, :, 0:3].sum(axis=(0, 2))

    def pending(self) -> int:
        """Cohort requests not yet resolved (needs ``arrived``: known once the window has closed)."""
        if self.arrived is None:
            return -1
        return int(round(float(self.arrived.sum() - self.resolved().sum())))

    # -- the result -----------------------------------------------------------------------------
    def metrics(self) -> dict[str, Any]:
        """The cohort's cluster metrics (:data:`COHORT_KEYS`) and per-class table (``"per_class"``)."""
        span = self.n * (self.horizon - self.warmup)
        per_batch_span = self.n * self.L
        tot = self.acc.sum(axis=0)  # (I, 5)
        arrived = self.arrived if self.arrived is not None else np.full(self.I, np.nan)
        unresolved = arrived - tot[:, 0:3].sum(axis=1)
        out: dict[str, Any] = {}
        for key, j in (("cohort_revenue_per_gpu", 3), ("cohort_revenue_per_gpu_separate", 4)):
            out[key] = float(tot[:, j].sum() / span)
            per_batch = self.acc[:, :, j].sum(axis=1) / per_batch_span
            out[f"{key}_ci"] = M._ci(per_batch)[1]
        drained = bool(self.arrived is not None and np.all(unresolved <= 0.5))
        out.update({
            "cohort_arrived": int(round(float(np.nansum(arrived)))),
            "cohort_completed": int(round(float(tot[:, 0].sum()))),
            "cohort_abandoned": int(round(float(tot[:, 1].sum()))),
            "cohort_dropped": int(round(float(tot[:, 2].sum()))),
            "cohort_unresolved": int(round(float(np.nansum(unresolved)))) if self.arrived is not None else -1,
            "cohort_drained": drained,
            # seconds after the horizon when the last cohort request resolved (0: all before it)
            "drain_seconds": max(0.0, self.last_end - self.horizon) if math.isfinite(self.last_end) else 0.0,
            "drain_cap": self.cap,
        })
        out["per_class"] = pd.DataFrame({
            "arrived": arrived, "completed": tot[:, 0], "abandoned": tot[:, 1], "dropped": tot[:, 2],
            "unresolved": unresolved, "revenue_per_gpu": tot[:, 3] / span, "revenue_per_gpu_separate": tot[:, 4] / span,
        })
        return out


def cohort_summary(tracker: CohortTracker, class_names: tuple[str, ...]) -> tuple[dict, pd.DataFrame]:
    """(cluster metrics, per-class table indexed by class name) of a tracker."""
    m = tracker.metrics()
    pc = m.pop("per_class")
    pc.index = pd.Index(class_names, name="class")
    return m, pc


def warn_undrained(m: dict) -> None:
    """:class:`CohortWarning` when the cohort did not resolve within the cap (pointed at the caller
    of fluidopt.sim)."""
    if not m["cohort_drained"]:
        import sys

        level, f, here = 1, sys._getframe(0), os.path.dirname(__file__)
        while f.f_back is not None and os.path.dirname(f.f_code.co_filename) == here:
            f, level = f.f_back, level + 1
        warnings.warn(
            f"{m['cohort_unresolved']} of the {m['cohort_arrived']} requests that arrived in the measured window "
            f"were still in the system {m['drain_cap']:g} s after the horizon (drain cap): they earn nothing in "
            "cohort_revenue_per_gpu, which is then a lower bound; raise drain= (or check for a class that is "
            "never served and never abandons)",
            CohortWarning, stacklevel=level)


def cohort_from_records(records: str | os.PathLike | pd.DataFrame, scenario: Any, warmup: float, horizon: float, *,
                        service: str = "tokens", batches: int = 20) -> dict[str, Any]:
    """The cohort metrics of ``[warmup, horizon)`` from per-request records.

    ``records``: the CSV that ``simulate(..., records=PATH)`` wrote (or its DataFrame: columns
    ``class``, ``arrival``, ``prompt``, ``output``, ``outcome``, ``end``, ``ttft``); ``scenario``: the
    run's scenario (prices, classes, GPUs); ``warmup``, ``horizon``: the window (seconds). The run
    must have gone on long enough for the cohort to resolve (``simulate(..., drain=...)``); rows
    whose outcome is ``in_system`` earn nothing and are counted as ``cohort_unresolved`` (then
    ``cohort_drained`` is False). Returns the :data:`COHORT_KEYS` metrics (revenue per GPU per
    second of the window, counts, ``drain_seconds`` after the horizon) and ``"per_class"``.
    """
    df = pd.read_csv(records) if not isinstance(records, pd.DataFrame) else records
    need = ["class", "arrival", "prompt", "output", "outcome", "end", "ttft"]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise UsageError(f"cohort_from_records: records: missing column(s) {', '.join(missing)}; "
                         f"expected the columns of simulate(..., records=PATH)")
    warmup, horizon = float(warmup), float(horizon)
    if not (math.isfinite(warmup) and math.isfinite(horizon)) or warmup < 0 or horizon <= warmup:
        raise UsageError(f"cohort_from_records: expected 0 <= warmup < horizon (seconds), got {warmup!r}, {horizon!r}")
    if service not in ("markov", "tokens"):
        raise UsageError(f"cohort_from_records: service: expected 'markov' or 'tokens', got {service!r}")
    names = list(scenario.class_names)
    unknown = sorted(set(df["class"].astype(str)) - set(names))
    if unknown:
        raise UsageError(f"cohort_from_records: classes {unknown} are not the scenario's {names}")
    cp, cd, mp, mo = _values(scenario)
    tr = CohortTracker(len(names), warmup, horizon, batches, math.nan, cp=cp, cd=cd, mean_prompt=mp, mean_output=mo,
                       markov=service == "markov", n_gpus=scenario.gpus)
    code = {nm: i for i, nm in enumerate(M.OUTCOMES)}
    cls = df["class"].astype(str).map({nm: i for i, nm in enumerate(names)}).to_numpy(np.int64)
    a = {"cls": cls, "arrival": df["arrival"].to_numpy(float), "prompt": df["prompt"].to_numpy(float),
         "output": df["output"].to_numpy(float), "outcome": df["outcome"].map(code).to_numpy(np.int64),
         "end": df["end"].to_numpy(float), "ttft": df["ttft"].to_numpy(float)}
    tr.add(a)
    inwin = (a["arrival"] >= warmup) & (a["arrival"] < horizon)
    tr.arrived = np.bincount(cls[inwin], minlength=len(names)).astype(float)
    m, pc = cohort_summary(tr, tuple(names))
    m["per_class"] = pc
    m.pop("drain_cap")
    return m
