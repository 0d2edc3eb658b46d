"""Simulation metrics: streaming accumulators, batch-means confidence intervals, the result object.

Memory is bounded whatever the run length: the engine hands finished requests over in chunks
(numpy arrays); this module folds them into per-batch, per-class sums and fixed log-spaced
histograms, and forgets them.

Definitions (all exclude the warm-up ``[0, warmup)``; the measurement window is ``[warmup, t_end)``):

* rates (throughput, revenue, abandonment per GPU per second) count events whose *time* lies in the
  window, divided by ``n_gpus * (t_end - warmup)``;
* occupancies and queue lengths are exact time averages over the window (integrals of the counts),
  per GPU;
* per-request statistics (TTFT, TPOT, end-to-end latency, waits, abandoned fraction) use the cohort of
  requests that *arrived* in the window and were resolved (completed, abandoned or dropped) before
  ``t_end``;
* batch means: the window is cut into ``batches`` equal slices; each rate or time average is computed
  per slice, a request statistic is attributed to the slice where the request was resolved, and the
  95% confidence interval is mean +/- t(0.975, K-1) * sd / sqrt(K) over the K slice values.

Percentiles come from per-class histograms with 200 log-spaced bins per decade over [1e-6 s, 1e7 s):
a reported percentile is the geometric midpoint of its bin, hence within a relative error of
10**(1/400) - 1 < 0.58% of the exact sample percentile (values below 1e-6 s count as 0).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from fluidopt.control import protocol as P
from fluidopt.core.tquantile import t_quantile

__all__ = ["LogHistogram", "MetricCollector", "SimResult", "OUTCOMES"]

# Outcome codes of a resolved request.
COMPLETED, ABANDONED_PREFILL, ABANDONED_DECODE, DROPPED, IN_SYSTEM = 0, 1, 2, 3, 4
OUTCOMES = ("completed", "abandoned_prefill", "abandoned_decode", "dropped", "in_system")

# Per-class time-integrated quantities, in the engine's counter layout: the live counts a controller reads
# (ClusterView.class_counts, whose layout the protocol defines) are the quantities integrated here.
Q_PREFILL, X_PREFILL, Q_DECODE = P.COUNT_WAIT_PREFILL, P.COUNT_PREFILL, P.COUNT_WAIT_DECODE
Y_MIXED, Y_SOLO = P.COUNT_DECODE_MIXED, P.COUNT_DECODE_SOLO
N_CLASS_QTY = P.COUNTS_PER_CLASS
# Cluster-wide quantities after the per-class ones (GPUs running a prefill = sum_i X_i and occupied
# slots = sum_i X_i + Y_i are derived, not tracked).
G_BUSY = 0
N_GPU_QTY = 1

# Per-class event counters (cumulative), in the engine's layout (N_CTR per class).
C_ARRIVED, C_PREFILLED, C_COMPLETED, C_AB_PREFILL, C_AB_DECODE, C_DROPPED, C_PREEMPTED = range(7)
C_PREFILL_TOKENS, C_DONE_PROMPT, C_DONE_OUTPUT = 7, 8, 9
N_CTR = 10

# A finished request's row as the engine buffers it (floats; integers below 2**53 are exact), field by
# field in this order, each written and read at its named offset (REC_<NAME>: RECORD_FIELDS[REC_ID] ==
# "id"; tests/sim/test_state_layout.py); the integer fields are converted back when folded.
RECORD_FIELDS = ("id", "cls", "arrival", "prompt", "output", "outcome", "end", "ttft", "wait_prefill", "wait_decode",
                 "preemptions", "prefill_gpu", "decode_gpu")
(REC_ID, REC_CLS, REC_ARRIVAL, REC_PROMPT, REC_OUTPUT, REC_OUTCOME, REC_END, REC_TTFT, REC_WAIT_PREFILL, REC_WAIT_DECODE,
 REC_PREEMPTIONS, REC_PREFILL_GPU, REC_DECODE_GPU) = range(13)
RECORD_INT_FIELDS = frozenset({"id", "cls", "prompt", "output", "outcome", "preemptions", "prefill_gpu", "decode_gpu"})
N_RECORD_FIELDS = len(RECORD_FIELDS)

# Request-statistic fields accumulated per (batch, class).
(F_DONE, F_TTFT, F_E2E, F_TPOT, F_WAITP_DONE, F_WAITD_DONE, F_AB_P, F_AB_D, F_DROP, F_WAITP_ALL, F_SOJ_ALL,
 F_RESOLVED, F_PREEMPT) = range(13)
N_F = 13


class LogHistogram:
    """Per-class counts in fixed log-spaced bins (200 per decade over [1e-6, 1e7) seconds)."""

    LO_EXP, HI_EXP, PER_DECADE = -6, 7, 200

    def __init__(self, n_classes: int):
        self.n_bins = (self.HI_EXP - self.LO_EXP) * self.PER_DECADE + 2  # + underflow, overflow
        self.counts = np.zeros((n_classes, self.n_bins), dtype=np.int64)

    def add(self, cls: np.ndarray, values: np.ndarray) -> None:
        """Count ``values`` (seconds, NaN skipped) for the classes ``cls``."""
        ok = ~np.isnan(values)
        if not ok.all():
            cls, values = cls[ok], values[ok]
        if values.size == 0:
            return
        with np.errstate(divide="ignore"):
            b = np.floor((np.log10(np.maximum(values, 0.0)) - self.LO_EXP) * self.PER_DECADE)
        b = np.clip(np.nan_to_num(b, neginf=-1.0), -1, self.n_bins - 2).astype(np.int64) + 1
        k = self.counts.shape[0]
        self.counts += np.bincount(cls * self.n_bins + b, minlength=k * self.n_bins).reshape(k, self.n_bins)

    def quantile(self, q: float, cls: int | None = None) -> float:
        """The q-quantile (0 < q < 1) of class ``cls`` (None: all classes), NaN without data."""
        c = self.counts.sum(axis=0) if cls is None else self.counts[cls]
        total = int(c.sum())
        if total == 0:
            return math.nan
        k = int(np.searchsorted(np.cumsum(c), q * total, side="left"))
        if k == 0:
            return 0.0
        if k == self.n_bins - 1:
            return math.inf
        lo = self.LO_EXP + (k - 1) / self.PER_DECADE
        return 10.0 ** (lo + 0.5 / self.PER_DECADE)


class MetricCollector:
    """Accumulates finished-request chunks and state snapshots into per-batch arrays."""

    def __init__(self, n_classes: int, warmup: float, horizon: float, batches: int):
        self.I = n_classes
        self.warmup = float(warmup)
        self.horizon = float(horizon)
        self.K = int(batches)
        self.L = (self.horizon - self.warmup) / self.K
        self.req = np.zeros((self.K, n_classes, N_F))
        self.h_ttft = LogHistogram(n_classes)
        self.h_e2e = LogHistogram(n_classes)
        self.h_tpot = LogHistogram(n_classes)
        self.h_waitp = LogHistogram(n_classes)
        self.snapshots: list[tuple[float, np.ndarray, np.ndarray]] = []  # (time, areas, counters)
        self.slo_on = False  # per-class SLOs (set_slo): counted only when some class has one
        self.cohort = None  # the window's arrival cohort when the run drains (fluidopt.sim.cohort)

    def set_slo(self, ttft: np.ndarray, itl: np.ndarray, deadline: np.ndarray, deadline_at: np.ndarray,
                min_service) -> None:
        """Count SLO attainment per class: per-class limits (seconds; inf where a class has none) and
        ``min_service(prompt, output)``, a request's own service time alone on a GPU (seconds), for
        the count of deadlines shorter than it."""
        self.slo_on = True
        self.slo_ttft, self.slo_itl = np.asarray(ttft, float), np.asarray(itl, float)
        self.slo_dl, self.slo_dl_at = np.asarray(deadline, float), np.asarray(deadline_at, float)
        self.min_service = min_service
        self.slo_met = np.zeros(self.I, dtype=np.int64)  # window cohort: completed within every SLO
        self.slo_n = np.zeros(self.I, dtype=np.int64)  # window cohort: resolved (+ in system at the end)
        self.slo_infeasible = np.zeros(self.I, dtype=np.int64)  # deadline shorter than own service time

    def slo_fold(self, cls: np.ndarray, out: np.ndarray, arr: np.ndarray, end: np.ndarray, ttft: np.ndarray,
                 prompt: np.ndarray, output: np.ndarray) -> None:
        """Fold requests of the window cohort into the SLO counts (in-system ones count as missed)."""
        done = out == COMPLETED
        nout = np.maximum(output, 1).astype(float)
        with np.errstate(invalid="ignore"):
            tpot = (end - arr - ttft) / nout
            dl = np.minimum(arr + self.slo_dl[cls], self.slo_dl_at[cls])
            met = done & (ttft <= self.slo_ttft[cls]) & (tpot <= self.slo_itl[cls]) & (end <= dl)
        infeasible = np.isfinite(dl) & (dl - arr < self.min_service(prompt, output))
        met &= ~infeasible
        self.slo_met += np.bincount(cls, weights=met, minlength=self.I).astype(np.int64)
        self.slo_n += np.bincount(cls, minlength=self.I).astype(np.int64)
        self.slo_infeasible += np.bincount(cls, weights=infeasible, minlength=self.I).astype(np.int64)

    def batch_of(self, t: np.ndarray) -> np.ndarray:
        return np.clip(np.floor((t - self.warmup) / self.L), 0, self.K - 1).astype(np.int64)

    def add_requests(self, a: dict[str, np.ndarray]) -> None:
        """Fold a chunk of resolved requests (arrays from the engine) into the accumulators."""
        keep = (a["arrival"] >= self.warmup) & (a["outcome"] != IN_SYSTEM)
        if not keep.any():
            return
        cls = a["cls"][keep]
        out = a["outcome"][keep]
        arr = a["arrival"][keep]
        end = a["end"][keep]
        ttft = a["ttft"][keep]
        waitp = a["wait_prefill"][keep]
        waitd = a["wait_decode"][keep]
        nout = a["output"][keep].astype(float)
        b = self.batch_of(end)
        done = out == COMPLETED
        e2e = end - arr
        tpot = np.where(done, (e2e - ttft) / nout, np.nan)
        fields = np.zeros((cls.size, N_F))
        fields[:, F_DONE] = done
        fields[:, F_TTFT] = np.where(done, ttft, 0.0)
        fields[:, F_E2E] = np.where(done, e2e, 0.0)
        fields[:, F_TPOT] = np.where(done, tpot, 0.0)
        fields[:, F_WAITP_DONE] = np.where(done, waitp, 0.0)
        fields[:, F_WAITD_DONE] = np.where(done, waitd, 0.0)
        fields[:, F_AB_P] = out == ABANDONED_PREFILL
        fields[:, F_AB_D] = out == ABANDONED_DECODE
        fields[:, F_DROP] = out == DROPPED
        fields[:, F_WAITP_ALL] = waitp
        fields[:, F_SOJ_ALL] = e2e
        fields[:, F_RESOLVED] = 1.0
        fields[:, F_PREEMPT] = a["preemptions"][keep]
        idx = b * self.I + cls
        for f in range(N_F):
            self.req[:, :, f] += np.bincount(idx, weights=fields[:, f], minlength=self.K * self.I).reshape(
                self.K, self.I
            )
        if self.slo_on:
            self.slo_fold(cls, out, arr, end, ttft, a["prompt"][keep], a["output"][keep])
        dc = cls[done]
        self.h_ttft.add(dc, ttft[done])
        self.h_e2e.add(dc, e2e[done])
        self.h_tpot.add(dc, tpot[done])
        self.h_waitp.add(cls, waitp)

    def snapshot(self, t: float, areas: np.ndarray, counters: np.ndarray) -> None:
        self.snapshots.append((float(t), np.asarray(areas, dtype=float), np.asarray(counters, dtype=float)))


# --------------------------------------------------------------------------------------------
# Result
# --------------------------------------------------------------------------------------------


def _ci(values: np.ndarray) -> tuple[float, float]:
    """Batch-means point estimate and 95% half-width over the finite entries of ``values``."""
    v = values[np.isfinite(values)]
    if v.size == 0:
        return math.nan, math.nan
    if v.size < 2:
        return float(v.mean()), math.nan
    return float(v.mean()), float(t_quantile(v.size - 1, 0.975) * v.std(ddof=1) / math.sqrt(v.size))


def _div(a: Any, b: Any) -> Any:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.asarray(b) > 0, np.asarray(a, dtype=float) / np.where(np.asarray(b) > 0, b, 1), np.nan)


@dataclass(frozen=True)
class SimResult:
    """The outcome of one simulation run.

    ``per_class``: one row per class (index: class name) with rates per GPU per second, time-averaged
    occupancies and queues per GPU, latency means and percentiles (seconds), abandoned fractions.
    ``ci``: batch-means 95% intervals (columns metric, class, estimate, half_width; class "all" for
    cluster metrics). ``batches``: the per-batch values behind ``ci``. ``timeseries``: state sampled
    every ``sample_interval`` seconds (None unless asked for). ``totals``: whole-run request counts
    (warm-up included): arrived = completed + abandoned + dropped + in_system.
    """

    scenario: str
    policy: str
    service: str
    n_gpus: int
    horizon: float
    warmup: float
    seed: int
    t_end: float
    wall_seconds: float
    interrupted: bool
    events: int
    classes: tuple[str, ...]
    totals: dict
    cluster: dict
    per_class: pd.DataFrame
    ci: pd.DataFrame
    batches: pd.DataFrame
    timeseries: pd.DataFrame | None = None
    records_path: str | None = None
    meta: dict = field(default_factory=dict)

    def to_frame(self) -> pd.DataFrame:
        """Per-class metrics as a DataFrame (one row per class, plus identifying columns)."""
        df = self.per_class.copy()
        df.insert(0, "policy", self.policy)
        df.insert(1, "service", self.service)
        df.insert(2, "n_gpus", self.n_gpus)
        df.insert(3, "seed", self.seed)
        return df.reset_index()

    def summary(self) -> dict:
        """A JSON-ready dict: run facts, cluster metrics with 95% half-widths, and one entry per class."""
        out: dict[str, Any] = {
            "scenario": self.scenario,
            "policy": self.policy,
            "service": self.service,
            "n_gpus": self.n_gpus,
            "horizon": self.horizon,
            "warmup": self.warmup,
            "seed": self.seed,
            "t_end": self.t_end,
            "interrupted": self.interrupted,
            "wall_seconds": self.wall_seconds,
            "events": self.events,
            "requests_per_wall_second": self.totals["requests"] / self.wall_seconds if self.wall_seconds > 0 else None,
        }
        if "engine" in self.meta:
            out["engine"] = self.meta["engine"]
        out.update({k: _clean(v) for k, v in self.totals.items()})
        out.update({k: _clean(v) for k, v in self.cluster.items()})
        cols = [c for c in self.per_class.columns]
        out["classes"] = [
            {"name": name, **{c: _clean(self.per_class.loc[name, c]) for c in cols}} for name in self.per_class.index
        ]
        if self.records_path:
            out["records"] = self.records_path
        if self.meta.get("fleet"):
            out["gpu_hours"] = self.meta["gpu_hours"]
        if "prefix_cache" in self.meta:  # per instance, a run with the prefix cache
            inst = self.meta["prefix_cache"]
            out["instances"] = [{"instance": int(g), **{c: _clean(v) for c, v in row.items()}}
                                for g, row in zip(inst.index, inst.to_dict("records"))]
        return out

    @property
    def gpu_hours(self) -> float:
        """GPU-hours from time 0 to the end of the run (each GPU from being added to going offline;
        a fixed fleet: n_gpus * t_end / 3600)."""
        return float(self.meta.get("gpu_hours", self.n_gpus * self.t_end / 3600.0))

    @property
    def slo_attainment(self) -> pd.Series | None:
        """Per-class share of the window's requests that met every SLO of their class (None without SLOs)."""
        if "slo_attainment" not in self.per_class.columns:
            return None
        return self.per_class["slo_attainment"]

    def __repr__(self) -> str:
        rev = self.cluster.get("revenue_per_gpu", math.nan)
        return (
            f"SimResult({self.policy!r} on {self.scenario!r}, n={self.n_gpus}, {self.service}, "
            f"t={self.warmup:g}..{self.t_end:g} s, revenue/GPU/s={rev:.4g}, requests={self.totals['requests']}"
            f"{', INTERRUPTED' if self.interrupted else ''})"
        )


def _clean(v: Any) -> Any:
    """numpy scalars to Python; NaN/inf to None (JSON has neither)."""
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        v = float(v)
        return v if math.isfinite(v) else None
    return v


def build_result(
    col: MetricCollector,
    *,
    scenario: Any,
    policy: str,
    service: str,
    seed: int,
    t_end: float,
    wall: float,
    interrupted: bool,
    events: int,
    totals: dict,
    rewards: dict,
    timeseries: pd.DataFrame | None,
    records_path: str | None,
    meta: dict | None = None,
) -> SimResult:
    """Turn the collector's snapshots and sums into a :class:`SimResult`."""
    n = scenario.gpus
    I = col.I
    names = tuple(c.name for c in scenario.classes)
    # Snapshots: at warm-up, at each batch boundary and at t_end (the engine guarantees the first and
    # last); batch j spans snapshots j..j+1.
    snaps = []
    for s in col.snapshots:
        if s[0] >= col.warmup - 1e-12 and (not snaps or s[0] > snaps[-1][0]):
            snaps.append(s)  # (an interrupt exactly at a boundary repeats a snapshot time)
    if len(snaps) < 2:
        nan_df = pd.DataFrame(index=pd.Index(names, name="class"))
        return SimResult(
            scenario=scenario.name, policy=policy, service=service, n_gpus=n, horizon=col.horizon,
            warmup=col.warmup, seed=seed, t_end=t_end, wall_seconds=wall, interrupted=interrupted,
            events=events, classes=names, totals=totals, cluster={"revenue_per_gpu": math.nan},
            per_class=nan_df, ci=pd.DataFrame(), batches=pd.DataFrame(), timeseries=timeseries,
            records_path=records_path, meta=meta or {},
        )
    times = np.array([s[0] for s in snaps])
    areas = np.stack([s[1] for s in snaps])
    ctrs = np.stack([s[2] for s in snaps])
    dur = np.diff(times)  # (K',)
    Kp = dur.size
    d_area = np.diff(areas, axis=0)  # (K', Q)
    d_ctr = np.diff(ctrs, axis=0)
    req = col.req[:Kp]

    def cls_area(qty: int) -> np.ndarray:  # (K', I)
        return d_area[:, [N_CLASS_QTY * i + qty for i in range(I)]]

    def cls_ctr(c: int) -> np.ndarray:
        return d_ctr[:, [N_CTR * i + c for i in range(I)]]

    per_gpu_time = n * dur[:, None]  # (K', 1)
    wb = rewards["bundled"]  # callables of counter diffs -> (K', I) revenue
    rev_b = wb(cls_ctr)
    rev_s = rewards["separate"](cls_ctr)

    batch_vals: dict[tuple[str, str], np.ndarray] = {}

    def put(metric: str, per_class: np.ndarray, total: np.ndarray | None) -> None:
        for i, nm in enumerate(names):
            batch_vals[(metric, nm)] = per_class[:, i]
        if total is not None:
            batch_vals[(metric, "all")] = total

    done = cls_ctr(C_COMPLETED)
    arrived = cls_ctr(C_ARRIVED)
    put("throughput", done / per_gpu_time, done.sum(1) / per_gpu_time[:, 0])
    put("arrival_rate", arrived / per_gpu_time, arrived.sum(1) / per_gpu_time[:, 0])
    put("revenue_bundled", rev_b / per_gpu_time, rev_b.sum(1) / per_gpu_time[:, 0])
    put("revenue_separate", rev_s / per_gpu_time, rev_s.sum(1) / per_gpu_time[:, 0])
    ab = cls_ctr(C_AB_PREFILL) + cls_ctr(C_AB_DECODE)
    put("abandonment_rate", ab / per_gpu_time, ab.sum(1) / per_gpu_time[:, 0])
    for metric, qty in (("x_mean", X_PREFILL), ("y_mixed_mean", Y_MIXED), ("y_solo_mean", Y_SOLO),
                        ("q_prefill_mean", Q_PREFILL), ("q_decode_mean", Q_DECODE)):
        a = cls_area(qty) / per_gpu_time
        put(metric, a, a.sum(1))
    base = N_CLASS_QTY * I
    util = d_area[:, base + G_BUSY] / (n * dur)
    batch_vals[("gpu_busy_fraction", "all")] = util
    x_area = cls_area(X_PREFILL).sum(1)
    slot_area = x_area + cls_area(Y_MIXED).sum(1) + cls_area(Y_SOLO).sum(1)
    batch_vals[("mixed_gpu_fraction", "all")] = x_area / (n * dur)
    batch_vals[("slot_utilisation", "all")] = slot_area / (n * scenario.gpu.batch * dur)
    pre = cls_ctr(C_PREEMPTED)
    put("preemption_rate", pre / per_gpu_time, pre.sum(1) / per_gpu_time[:, 0])
    # request statistics (cohort), per batch
    r = req
    nd = r[:, :, F_DONE]
    res = r[:, :, F_RESOLVED]
    put("ttft_mean", _div(r[:, :, F_TTFT], nd), _div(r[:, :, F_TTFT].sum(1), nd.sum(1)))
    put("tpot_mean", _div(r[:, :, F_TPOT], nd), _div(r[:, :, F_TPOT].sum(1), nd.sum(1)))
    put("e2e_mean", _div(r[:, :, F_E2E], nd), _div(r[:, :, F_E2E].sum(1), nd.sum(1)))
    abp, abd = r[:, :, F_AB_P], r[:, :, F_AB_D]
    put("abandoned_fraction", _div(abp + abd, res), _div((abp + abd).sum(1), res.sum(1)))
    put("abandoned_prefill_fraction", _div(abp, res), _div(abp.sum(1), res.sum(1)))
    put("abandoned_decode_fraction", _div(abd, res), _div(abd.sum(1), res.sum(1)))
    put("wait_prefill_mean", _div(r[:, :, F_WAITP_ALL], res), _div(r[:, :, F_WAITP_ALL].sum(1), res.sum(1)))
    put("wait_decode_mean", _div(r[:, :, F_WAITD_DONE], nd), _div(r[:, :, F_WAITD_DONE].sum(1), nd.sum(1)))
    put("sojourn_mean", _div(r[:, :, F_SOJ_ALL], res), _div(r[:, :, F_SOJ_ALL].sum(1), res.sum(1)))

    # Point estimates: rates and time averages over the whole window (= duration-weighted batch
    # means); request statistics as ratio of sums over all batches.
    W = dur.sum()
    tot_area = d_area.sum(0)
    tot_ctr = d_ctr.sum(0)
    rs = r.sum(0)  # (I, N_F)

    def cls_tot_ctr(c: int) -> np.ndarray:
        return tot_ctr[[N_CTR * i + c for i in range(I)]]

    def cls_tot_area(q: int) -> np.ndarray:
        return tot_area[[N_CLASS_QTY * i + q for i in range(I)]]

    pc: dict[str, np.ndarray] = {}
    pc["arrival_rate"] = cls_tot_ctr(C_ARRIVED) / (n * W)
    pc["throughput"] = cls_tot_ctr(C_COMPLETED) / (n * W)
    rb_tot = rev_b.sum(0)
    rs_tot = rev_s.sum(0)
    pc["revenue_bundled"] = rb_tot / (n * W)
    pc["revenue_separate"] = rs_tot / (n * W)
    pc["abandonment_rate"] = (cls_tot_ctr(C_AB_PREFILL) + cls_tot_ctr(C_AB_DECODE)) / (n * W)
    pc["abandoned_fraction"] = _div(rs[:, F_AB_P] + rs[:, F_AB_D], rs[:, F_RESOLVED])
    pc["abandoned_prefill_fraction"] = _div(rs[:, F_AB_P], rs[:, F_RESOLVED])
    pc["abandoned_decode_fraction"] = _div(rs[:, F_AB_D], rs[:, F_RESOLVED])
    pc["dropped_fraction"] = _div(rs[:, F_DROP], rs[:, F_RESOLVED])
    pc["ttft_mean"] = _div(rs[:, F_TTFT], rs[:, F_DONE])
    pc["tpot_mean"] = _div(rs[:, F_TPOT], rs[:, F_DONE])
    pc["e2e_mean"] = _div(rs[:, F_E2E], rs[:, F_DONE])
    pc["wait_prefill_mean"] = _div(rs[:, F_WAITP_ALL], rs[:, F_RESOLVED])
    pc["wait_decode_mean"] = _div(rs[:, F_WAITD_DONE], rs[:, F_DONE])
    pc["sojourn_mean"] = _div(rs[:, F_SOJ_ALL], rs[:, F_RESOLVED])
    for q, nm in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        pc[f"ttft_{nm}"] = np.array([col.h_ttft.quantile(q, i) for i in range(I)])
        pc[f"e2e_{nm}"] = np.array([col.h_e2e.quantile(q, i) for i in range(I)])
        pc[f"tpot_{nm}"] = np.array([col.h_tpot.quantile(q, i) for i in range(I)])
        pc[f"wait_prefill_{nm}"] = np.array([col.h_waitp.quantile(q, i) for i in range(I)])
    pc["x_mean"] = cls_tot_area(X_PREFILL) / (n * W)
    pc["y_mixed_mean"] = cls_tot_area(Y_MIXED) / (n * W)
    pc["y_solo_mean"] = cls_tot_area(Y_SOLO) / (n * W)
    pc["q_prefill_mean"] = cls_tot_area(Q_PREFILL) / (n * W)
    pc["q_decode_mean"] = cls_tot_area(Q_DECODE) / (n * W)
    pc["preemption_rate"] = cls_tot_ctr(C_PREEMPTED) / (n * W)
    pc["completed"] = cls_tot_ctr(C_COMPLETED)
    pc["arrived"] = cls_tot_ctr(C_ARRIVED)
    pc["abandoned"] = cls_tot_ctr(C_AB_PREFILL) + cls_tot_ctr(C_AB_DECODE)
    per_class = pd.DataFrame(pc, index=pd.Index(names, name="class"))
    for c in ("completed", "arrived", "abandoned"):
        per_class[c] = per_class[c].round().astype(np.int64)
    # add CI half-widths of the main per-class metrics
    for m in ("throughput", "x_mean", "y_mixed_mean", "y_solo_mean", "q_prefill_mean", "q_decode_mean",
              "ttft_mean", "e2e_mean", "abandoned_fraction"):
        per_class[f"{m}_ci"] = [_ci(batch_vals[(m, nm)])[1] for nm in names]

    cluster = {
        "revenue_per_gpu": float(rb_tot.sum() / (n * W)),
        "revenue_per_gpu_separate": float(rs_tot.sum() / (n * W)),
        "throughput": float(cls_tot_ctr(C_COMPLETED).sum() / (n * W)),
        "arrival_rate": float(cls_tot_ctr(C_ARRIVED).sum() / (n * W)),
        "abandoned_fraction": float(_div(rs[:, F_AB_P].sum() + rs[:, F_AB_D].sum(), rs[:, F_RESOLVED].sum())),
        "ttft_mean": float(_div(rs[:, F_TTFT].sum(), rs[:, F_DONE].sum())),
        "e2e_mean": float(_div(rs[:, F_E2E].sum(), rs[:, F_DONE].sum())),
        "ttft_p99": col.h_ttft.quantile(0.99),
        "e2e_p50": col.h_e2e.quantile(0.5),
        "e2e_p90": col.h_e2e.quantile(0.9),
        "e2e_p99": col.h_e2e.quantile(0.99),
        "tpot_mean": float(_div(rs[:, F_TPOT].sum(), rs[:, F_DONE].sum())),
        "gpu_busy_fraction": float(tot_area[base + G_BUSY] / (n * W)),
        "mixed_gpu_fraction": float(x_area.sum() / (n * W)),
        "slot_utilisation": float(slot_area.sum() / (n * scenario.gpu.batch * W)),
        "preemptions": int(round(float(cls_tot_ctr(C_PREEMPTED).sum()))),
        "window_seconds": float(W),
    }
    for m in ("revenue_bundled", "revenue_separate", "throughput"):
        cluster[f"{m}_ci" if m != "revenue_bundled" else "revenue_per_gpu_ci"] = _ci(batch_vals[(m, "all")])[1]
    cluster["revenue_per_gpu_separate_ci"] = cluster.pop("revenue_separate_ci")

    ci_rows = []
    for (metric, cname), vals in batch_vals.items():
        est, hw = _ci(np.asarray(vals, dtype=float))
        ci_rows.append({"metric": metric, "class": cname, "batch_mean": est, "half_width": hw,
                        "batches": int(np.isfinite(vals).sum())})
    ci = pd.DataFrame(ci_rows)
    bdf = pd.DataFrame({f"{m}[{c}]": np.asarray(v, dtype=float) for (m, c), v in batch_vals.items()})
    bdf.insert(0, "t_start", times[:-1])
    bdf.insert(1, "t_end", times[1:])
    return SimResult(
        scenario=scenario.name, policy=policy, service=service, n_gpus=n, horizon=col.horizon, warmup=col.warmup,
        seed=seed, t_end=t_end, wall_seconds=wall, interrupted=interrupted, events=events, classes=names,
        totals=totals, cluster=cluster, per_class=per_class, ci=ci, batches=bdf, timeseries=timeseries,
        records_path=records_path, meta=meta or {},
    )


def _remove_dead_parts(folder: str, name: str) -> None:
    """Remove ``.NAME.PID.part`` files that a killed run (kill -9: no handler ran) left for the same target."""
    from fluidopt.core.files import _pid_alive

    prefix = f".{name}."
    for f in os.listdir(folder):
        if f.startswith(prefix) and f.endswith(".part"):
            pid = f[len(prefix):-len(".part")]
            if pid.isdigit() and not _pid_alive(int(pid)):
                try:
                    os.remove(os.path.join(folder, f))
                except OSError:
                    pass


class RecordsWriter:
    """Streams per-request rows to CSV under a temporary name; :meth:`close` renames it into place."""

    COLUMNS = ("id", "class", "arrival", "prompt", "output", "outcome", "end", "ttft", "e2e", "wait_prefill",
               "wait_decode", "preemptions", "prefill_gpu", "decode_gpu")

    def __init__(self, path: str | os.PathLike, class_names: tuple[str, ...]):
        self.path = os.fspath(path)
        d = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(d):
            from fluidopt.core.errors import ScenarioError

            raise ScenarioError(f"records: directory {d!r} does not exist")
        self.tmp = os.path.join(d, f".{os.path.basename(self.path)}.{os.getpid()}.part")
        _remove_dead_parts(d, os.path.basename(self.path))
        self._f = open(self.tmp, "w", encoding="utf-8", newline="")
        self._f.write(",".join(self.COLUMNS) + "\n")
        self._names = np.asarray(class_names, dtype=object)
        self._outcomes = np.asarray(OUTCOMES, dtype=object)
        self.rows = 0

    def write(self, a: dict[str, np.ndarray]) -> None:
        done = a["outcome"] == COMPLETED
        df = pd.DataFrame(
            {
                "id": a["id"],
                "class": self._names[a["cls"]],
                "arrival": a["arrival"],
                "prompt": a["prompt"],
                "output": a["output"],
                "outcome": self._outcomes[a["outcome"]],
                "end": np.where(a["outcome"] == IN_SYSTEM, np.nan, a["end"]),
                "ttft": a["ttft"],
                "e2e": np.where(done, a["end"] - a["arrival"], np.nan),
                "wait_prefill": a["wait_prefill"],
                "wait_decode": a["wait_decode"],
                "preemptions": a["preemptions"],
                "prefill_gpu": a["prefill_gpu"],
                "decode_gpu": a["decode_gpu"],
            }
        )
        if "cached_prompt" in a:  # a run with the prefix cache (fluidopt.sim.prefix_cache)
            if not self.rows:
                self._cached_header()
            df["cached_prompt"] = a["cached_prompt"]
        df.to_csv(self._f, header=False, index=False, float_format="%.15g")
        self.rows += len(df)

    def _cached_header(self) -> None:
        # the header is written when the file opens; a run with the cache rewrites it before its first row
        self._f.seek(0)
        self._f.truncate()
        self._f.write(",".join(self.COLUMNS + ("cached_prompt",)) + "\n")

    def close(self) -> str:
        self._f.close()
        os.replace(self.tmp, self.path)
        return self.path

    def discard(self) -> None:
        try:
            self._f.close()
        finally:
            if os.path.exists(self.tmp):
                os.remove(self.tmp)
