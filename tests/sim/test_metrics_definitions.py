"""The metric definitions of fluidopt.sim.metrics, checked on hand-made inputs (no engine run).

Every expected number below is computed by hand from the definitions in the module docstring and
docs/simulator.md section 5 (the window [warmup, t_end), rates per GPU per second, exact time
averages from integrals, the arrived-in-window resolved cohort for request statistics, batch means
with a t(0.975, K-1) interval, 200-per-decade log-bin percentiles reported at the bin's geometric
midpoint). The inputs are small enough that each value can be checked with pencil and paper; the
comments give the arithmetic.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from fluidopt.sim import metrics as M

HALF_BIN = 10 ** (1 / 400)  # geometric midpoint of a 1/200-decade bin, relative to its lower edge
T975_1 = 12.706204736174698  # t(0.975, 1)   (two batches)
T975_2 = 4.302652729749464  # t(0.975, 2)   (three batches)


def pct(exact):
    """A reported percentile: within half a 1/200-decade bin (a factor 10**(1/400)) of ``exact``."""
    return pytest.approx(exact, rel=10 ** (1 / 400) - 1 + 1e-12)


# -- LogHistogram -----------------------------------------------------------------------------------
def test_histogram_bin_layout():
    h = M.LogHistogram(1)
    # 13 decades x 200 bins + one underflow and one overflow bin
    assert h.n_bins == 13 * 200 + 2
    assert h.counts.shape == (1, 2602)
    h.add(np.array([0, 0, 0, 0]), np.array([1.0, 1e-6, 0.0, 1e7]))
    c = h.counts[0]
    assert c[0] == 1  # 0 s: underflow
    assert c[1] == 1  # 1e-6 s: first regular bin [1e-6, 1e-6 * 10**(1/200))
    assert c[1 + 6 * 200] == 1  # 1 s: six decades above 1e-6
    assert c[-1] == 1  # 1e7 s: overflow
    assert c.sum() == 4


def test_histogram_quantile_is_the_bins_geometric_midpoint():
    h = M.LogHistogram(2)
    h.add(np.array([0]), np.array([1.0]))
    # bin [1, 10**(1/200)); midpoint 10**(1/400)
    assert h.quantile(0.5, 0) == pytest.approx(HALF_BIN, rel=1e-12)
    assert math.isnan(h.quantile(0.5, 1))  # no data for class 1
    h2 = M.LogHistogram(1)
    h2.add(np.array([0]), np.array([0.0]))
    assert h2.quantile(0.5, 0) == 0.0  # below 1e-6 s counts as 0
    h3 = M.LogHistogram(1)
    h3.add(np.array([0]), np.array([2e7]))
    assert h3.quantile(0.5, 0) == math.inf


def test_histogram_quantiles_of_1_to_100():
    h = M.LogHistogram(1)
    v = np.arange(1.0, 101.0)
    h.add(np.zeros(100, dtype=np.int64), v)
    # q N = 50, 90, 99: the 50th, 90th, 99th smallest values, reported within half a bin
    for q, exact in ((0.5, 50.0), (0.9, 90.0), (0.99, 99.0), (0.01, 1.0)):
        got = h.quantile(q, 0)
        assert abs(math.log10(got / exact)) <= 1 / 400 + 1e-12, (q, got)


def test_histogram_classes_and_nan():
    h = M.LogHistogram(2)
    h.add(np.array([0, 1, 1, 0]), np.array([1.0, 100.0, np.nan, np.nan]))
    assert h.counts.sum() == 2
    assert h.counts[0].sum() == 1 and h.counts[1].sum() == 1
    assert h.quantile(0.5, 1) == pytest.approx(100 * HALF_BIN)
    # all classes together: the two values 1 and 100; the median (q N = 1) is the smaller
    assert h.quantile(0.5) == pytest.approx(HALF_BIN)
    assert h.quantile(0.99) == pytest.approx(100 * HALF_BIN)
    h.add(np.array([], dtype=np.int64), np.array([]))  # an empty chunk is a no-op
    h.add(np.array([0]), np.array([np.nan]))
    assert h.counts.sum() == 2


# -- helpers ----------------------------------------------------------------------------------------
def test_batch_means_interval():
    est, hw = M._ci(np.array([1.0, 2.0, 3.0]))
    # mean 2, sd 1, half-width t(0.975, 2) * 1 / sqrt(3)
    assert est == pytest.approx(2.0)
    assert hw == pytest.approx(T975_2 / math.sqrt(3), rel=1e-9)
    est, hw = M._ci(np.array([4.0, np.nan, np.inf]))
    assert est == 4.0 and math.isnan(hw)  # one finite batch: no interval
    est, hw = M._ci(np.array([np.nan]))
    assert math.isnan(est) and math.isnan(hw)
    est, hw = M._ci(np.array([0.2, 0.3]))
    assert est == pytest.approx(0.25)
    assert hw == pytest.approx(T975_1 * math.sqrt(0.005) / math.sqrt(2), rel=1e-9)


def test_safe_division():
    out = M._div(np.array([1.0, 2.0, 3.0]), np.array([2.0, 0.0, -1.0]))
    assert out[0] == 0.5
    assert math.isnan(out[1]) and math.isnan(out[2])  # no denominator: NaN, not inf or a negative


# -- MetricCollector + build_result on a hand-made run ---------------------------------------------
# Two classes, 2 GPUs of batch 4, warm-up 10 s, horizon 30 s, two 10-s batches [10, 20) and [20, 30).
NAN = float("nan")
REQUESTS = [
    # id cls arrival prompt output outcome             end  ttft waitp waitd pre
    (0, 0, 5.0, 10, 4, M.COMPLETED, 15.0, 1.0, 0.5, 0.25, 0),  # arrived in warm-up: not in the cohort
    (1, 0, 12.0, 10, 4, M.COMPLETED, 15.0, 1.0, 0.5, 0.25, 1),  # e2e 3, tpot (3-1)/4 = 0.5, batch 0
    (2, 0, 14.0, 10, 2, M.COMPLETED, 25.0, 3.0, 2.0, 1.0, 0),  # e2e 11, tpot (11-3)/2 = 4, batch 1
    (3, 1, 11.0, 10, 5, M.ABANDONED_PREFILL, 13.0, NAN, 2.0, NAN, 0),  # sojourn 2, batch 0
    (4, 1, 21.0, 10, 5, M.ABANDONED_DECODE, 29.0, 4.0, 1.0, 3.0, 0),  # sojourn 8, batch 1
    (5, 1, 22.0, 10, 5, M.DROPPED, 22.0, NAN, 0.0, NAN, 0),  # sojourn 0, batch 1
    (6, 0, 25.0, 10, 5, M.IN_SYSTEM, NAN, NAN, 1.0, NAN, 0),  # unresolved: not in the cohort
]


def _chunk(rows):
    cols = list(zip(*rows))
    a = {}
    for k, name in enumerate(("id", "cls", "arrival", "prompt", "output", "outcome", "end", "ttft",
                              "wait_prefill", "wait_decode", "preemptions")):
        dtype = np.int64 if name in M.RECORD_INT_FIELDS else float
        a[name] = np.array(cols[k], dtype=dtype)
    a["prefill_gpu"] = np.zeros(len(rows), dtype=np.int64)
    a["decode_gpu"] = np.zeros(len(rows), dtype=np.int64)
    return a


def _areas(per_class, busy):
    """Counter layout: 5 per class (q_prefill, x, q_decode, y_mixed, y_solo), then busy GPUs."""
    out = []
    for q in per_class:
        out += list(q)
    return np.array(out + [busy], dtype=float)


def _ctrs(per_class):
    out = []
    for c in per_class:
        row = [0.0] * M.N_CTR
        for k, v in c.items():
            row[k] = v
        out += row
    return np.array(out)


# time integrals per batch (increments), per class (q_prefill, x, q_decode, y_mixed, y_solo)
D_AREA = [
    ([2, 4, 1, 8, 20], [0, 2, 0, 0, 10], 10),  # [10, 20)
    ([2, 6, 3, 8, 0], [0, 2, 0, 0, 10], 14),  # [20, 30)
]
# event counts per batch
D_CTR = [
    ({M.C_ARRIVED: 3, M.C_PREFILLED: 2, M.C_COMPLETED: 1, M.C_PREEMPTED: 1},
     {M.C_ARRIVED: 2, M.C_AB_PREFILL: 1}),
    ({M.C_ARRIVED: 1, M.C_PREFILLED: 1, M.C_COMPLETED: 1},
     {M.C_ARRIVED: 2, M.C_PREFILLED: 1, M.C_AB_DECODE: 1, M.C_DROPPED: 1}),
]
PRICE = np.array([10.0, 20.0])  # bundled reward per completion, by class


def _cum(base, steps):
    out = [np.array(base, dtype=float)]
    for s in steps:
        out.append(out[-1] + s)
    return out


def _collector(snap_times=(10.0, 20.0, 30.0), extra_snaps=()):
    col = M.MetricCollector(2, warmup=10.0, horizon=30.0, batches=2)
    col.add_requests(_chunk(REQUESTS))
    # cumulative values start anywhere: only differences over the window count
    areas = _cum(_areas([[7, 7, 7, 7, 7], [3, 3, 3, 3, 3]], 5), [_areas(p[:2], p[2]) for p in D_AREA])
    ctrs = _cum(_ctrs([{M.C_ARRIVED: 9, M.C_COMPLETED: 4}, {M.C_ARRIVED: 1}]), [_ctrs(c) for c in D_CTR])
    for t, a, c in extra_snaps:
        col.snapshot(t, a, c)
    for t, a, c in zip(snap_times, areas, ctrs):
        col.snapshot(t, a, c)
    return col


def _build(col, t_end=30.0, interrupted=False, records_path=None):
    scenario = SimpleNamespace(name="hand", gpus=2, classes=[SimpleNamespace(name="a"), SimpleNamespace(name="b")],
                               gpu=SimpleNamespace(batch=4))
    rewards = {
        "bundled": lambda f: f(M.C_COMPLETED) * PRICE,
        "separate": lambda f: f(M.C_PREFILLED) * np.array([1.0, 3.0]),
    }
    return M.build_result(col, scenario=scenario, policy="p", service="tokens", seed=7, t_end=t_end, wall=2.0,
                          interrupted=interrupted, events=123, totals={"requests": 7}, rewards=rewards,
                          timeseries=None, records_path=records_path, meta={"engine": "python"})


@pytest.fixture
def hand():
    # function scope on purpose: each test builds the result itself (mutation testing attributes the
    # build to the test that runs it)
    return _build(_collector())


def test_request_sums_per_batch_and_class():
    col = _collector()
    r = col.req
    assert r.shape == (2, 2, M.N_F)
    # class a: request 1 in batch 0 (resolved at 15), request 2 in batch 1 (resolved at 25)
    assert r[0, 0, M.F_DONE] == 1 and r[1, 0, M.F_DONE] == 1
    assert r[0, 0, M.F_TTFT] == 1.0 and r[1, 0, M.F_TTFT] == 3.0
    assert r[0, 0, M.F_E2E] == 3.0 and r[1, 0, M.F_E2E] == 11.0
    assert r[0, 0, M.F_TPOT] == 0.5 and r[1, 0, M.F_TPOT] == 4.0
    assert r[0, 0, M.F_WAITP_DONE] == 0.5 and r[1, 0, M.F_WAITD_DONE] == 1.0
    assert r[0, 0, M.F_PREEMPT] == 1 and r[1, 0, M.F_PREEMPT] == 0
    # class b: abandoned in prefill (batch 0), in decode and dropped (batch 1)
    assert r[0, 1, M.F_AB_P] == 1 and r[1, 1, M.F_AB_P] == 0
    assert r[1, 1, M.F_AB_D] == 1 and r[1, 1, M.F_DROP] == 1
    assert r[0, 1, M.F_RESOLVED] == 1 and r[1, 1, M.F_RESOLVED] == 2
    assert r[1, 1, M.F_SOJ_ALL] == 8.0 and r[0, 1, M.F_SOJ_ALL] == 2.0
    assert r[1, 1, M.F_WAITP_ALL] == 1.0
    assert r[:, 1, M.F_DONE].sum() == 0 and r[:, 1, M.F_TTFT].sum() == 0  # only completed requests
    assert r[:, 1, M.F_WAITD_DONE].sum() == 0
    # the warm-up arrival and the unresolved request are nowhere
    assert r[:, :, M.F_RESOLVED].sum() == 5
    # histograms: completed requests only for ttft/e2e/tpot; every resolved request for the prefill wait
    assert col.h_ttft.counts.sum() == 2 and col.h_e2e.counts.sum() == 2 and col.h_tpot.counts.sum() == 2
    assert col.h_waitp.counts.sum() == 5


def test_batch_of_clips_to_the_window():
    col = M.MetricCollector(1, warmup=10.0, horizon=30.0, batches=2)
    assert col.L == 10.0
    np.testing.assert_array_equal(col.batch_of(np.array([5.0, 10.0, 19.999, 20.0, 29.9, 30.0, 45.0])),
                                  [0, 0, 0, 1, 1, 1, 1])


def test_rates_and_time_averages(hand):
    pc = hand.per_class
    W, n = 20.0, 2
    assert hand.cluster["window_seconds"] == W
    # rates: events in the window / (n W)
    assert pc.loc["a", "arrival_rate"] == pytest.approx(4 / (n * W))
    assert pc.loc["b", "arrival_rate"] == pytest.approx(4 / (n * W))
    assert pc.loc["a", "throughput"] == pytest.approx(2 / (n * W))
    assert pc.loc["b", "throughput"] == 0.0
    assert pc.loc["b", "abandonment_rate"] == pytest.approx(2 / (n * W))
    assert pc.loc["a", "preemption_rate"] == pytest.approx(1 / (n * W))
    assert pc.loc["a", "revenue_bundled"] == pytest.approx(2 * 10 / (n * W))
    assert pc.loc["b", "revenue_separate"] == pytest.approx(1 * 3 / (n * W))
    assert pc.loc["a", "revenue_separate"] == pytest.approx(3 * 1 / (n * W))
    assert list(pc["completed"]) == [2, 0] and list(pc["arrived"]) == [4, 4] and list(pc["abandoned"]) == [0, 2]
    assert pc["completed"].dtype == np.int64
    # time averages: integral / (n W)
    assert pc.loc["a", "q_prefill_mean"] == pytest.approx(4 / 40)
    assert pc.loc["a", "x_mean"] == pytest.approx(10 / 40)
    assert pc.loc["a", "q_decode_mean"] == pytest.approx(4 / 40)
    assert pc.loc["a", "y_mixed_mean"] == pytest.approx(16 / 40)
    assert pc.loc["a", "y_solo_mean"] == pytest.approx(20 / 40)
    assert pc.loc["b", "x_mean"] == pytest.approx(4 / 40)
    assert pc.loc["b", "y_solo_mean"] == pytest.approx(20 / 40)
    c = hand.cluster
    assert c["revenue_per_gpu"] == pytest.approx(20 / 40)
    assert c["revenue_per_gpu_separate"] == pytest.approx(6 / 40)
    assert c["throughput"] == pytest.approx(2 / 40)
    assert c["arrival_rate"] == pytest.approx(8 / 40)
    assert c["gpu_busy_fraction"] == pytest.approx(24 / 40)
    assert c["mixed_gpu_fraction"] == pytest.approx((10 + 4) / 40)
    # occupied slots (x + y_mixed + y_solo) over n B W slot-seconds
    assert c["slot_utilisation"] == pytest.approx((14 + 16 + 40) / (2 * 4 * 20))
    assert c["preemptions"] == 1 and isinstance(c["preemptions"], int)


def test_request_statistics_use_the_cohort(hand):
    pc = hand.per_class
    assert pc.loc["a", "ttft_mean"] == pytest.approx((1 + 3) / 2)
    assert pc.loc["a", "e2e_mean"] == pytest.approx((3 + 11) / 2)
    assert pc.loc["a", "tpot_mean"] == pytest.approx((0.5 + 4) / 2)
    assert pc.loc["a", "wait_prefill_mean"] == pytest.approx((0.5 + 2) / 2)
    assert pc.loc["a", "wait_decode_mean"] == pytest.approx((0.25 + 1) / 2)
    assert pc.loc["a", "sojourn_mean"] == pytest.approx(7.0)
    assert pc.loc["a", "abandoned_fraction"] == 0.0 and pc.loc["a", "dropped_fraction"] == 0.0
    assert math.isnan(pc.loc["b", "ttft_mean"]) and math.isnan(pc.loc["b", "wait_decode_mean"])
    assert pc.loc["b", "abandoned_fraction"] == pytest.approx(2 / 3)
    assert pc.loc["b", "abandoned_prefill_fraction"] == pytest.approx(1 / 3)
    assert pc.loc["b", "abandoned_decode_fraction"] == pytest.approx(1 / 3)
    assert pc.loc["b", "dropped_fraction"] == pytest.approx(1 / 3)
    assert pc.loc["b", "wait_prefill_mean"] == pytest.approx((2 + 1 + 0) / 3)
    assert pc.loc["b", "sojourn_mean"] == pytest.approx((2 + 8 + 0) / 3)
    c = hand.cluster
    assert c["abandoned_fraction"] == pytest.approx(2 / 5)
    assert c["ttft_mean"] == pytest.approx(2.0)
    assert c["e2e_mean"] == pytest.approx(7.0)
    assert c["tpot_mean"] == pytest.approx(2.25)


def test_percentiles(hand):
    pc = hand.per_class
    # class a: ttft {1, 3}, e2e {3, 11}, tpot {0.5, 4}; the median is the smaller, p90/p99 the larger
    assert pc.loc["a", "ttft_p50"] == pytest.approx(1 * HALF_BIN)
    assert pc.loc["a", "ttft_p90"] == pct(3)
    assert pc.loc["a", "e2e_p99"] == pct(11)
    assert pc.loc["a", "tpot_p50"] == pct(0.5)
    assert pc.loc["a", "tpot_p99"] == pct(4)
    # prefill waits of class b: {2, 1, 0}: p50 = 1, p99 = 2
    assert pc.loc["b", "wait_prefill_p50"] == pytest.approx(1 * HALF_BIN)
    assert pc.loc["b", "wait_prefill_p99"] == pct(2)
    assert math.isnan(pc.loc["b", "e2e_p50"])
    c = hand.cluster
    assert c["e2e_p50"] == pct(3)
    assert c["e2e_p90"] == pct(11)
    assert c["e2e_p99"] == pct(11)
    assert c["ttft_p99"] == pct(3)


def test_batch_means_and_intervals(hand):
    b = hand.batches
    assert list(b["t_start"]) == [10.0, 20.0] and list(b["t_end"]) == [20.0, 30.0]
    # per-batch values: integral or count in the batch / (n L)
    np.testing.assert_allclose(b["x_mean[a]"], [4 / 20, 6 / 20])
    np.testing.assert_allclose(b["x_mean[all]"], [6 / 20, 8 / 20])
    np.testing.assert_allclose(b["throughput[all]"], [1 / 20, 1 / 20])
    np.testing.assert_allclose(b["gpu_busy_fraction[all]"], [10 / 20, 14 / 20])
    np.testing.assert_allclose(b["mixed_gpu_fraction[all]"], [6 / 20, 8 / 20])
    np.testing.assert_allclose(b["slot_utilisation[all]"], [(6 + 8 + 30) / 80, (8 + 8 + 10) / 80])
    np.testing.assert_allclose(b["q_decode_mean[a]"], [1 / 20, 3 / 20])
    np.testing.assert_allclose(b["arrival_rate[b]"], [2 / 20, 2 / 20])
    np.testing.assert_allclose(b["abandonment_rate[b]"], [1 / 20, 1 / 20])
    np.testing.assert_allclose(b["preemption_rate[a]"], [1 / 20, 0.0])
    np.testing.assert_allclose(b["revenue_bundled[all]"], [10 / 20, 10 / 20])
    np.testing.assert_allclose(b["revenue_separate[all]"], [2 / 20, 4 / 20])
    # request statistics attributed to the batch where the request was resolved
    np.testing.assert_allclose(b["ttft_mean[a]"], [1.0, 3.0])
    np.testing.assert_allclose(b["tpot_mean[a]"], [0.5, 4.0])
    np.testing.assert_allclose(b["e2e_mean[all]"], [3.0, 11.0])
    np.testing.assert_allclose(b["wait_decode_mean[a]"], [0.25, 1.0])
    np.testing.assert_allclose(b["abandoned_fraction[b]"], [1.0, 0.5])
    np.testing.assert_allclose(b["abandoned_fraction[all]"], [1 / 2, 1 / 3])
    np.testing.assert_allclose(b["abandoned_prefill_fraction[b]"], [1.0, 0.0])
    np.testing.assert_allclose(b["abandoned_decode_fraction[b]"], [0.0, 0.5])
    np.testing.assert_allclose(b["abandoned_decode_fraction[all]"], [0 / 2, 1 / 3])
    np.testing.assert_allclose(b["abandoned_prefill_fraction[all]"], [1 / 2, 0 / 3])
    np.testing.assert_allclose(b["wait_prefill_mean[all]"], [(0.5 + 2) / 2, (2 + 1 + 0) / 3])
    np.testing.assert_allclose(b["sojourn_mean[all]"], [(3 + 2) / 2, (11 + 8 + 0) / 3])
    np.testing.assert_allclose(b["tpot_mean[all]"], [0.5, 4.0])
    np.testing.assert_allclose(b["wait_prefill_mean[b]"], [2.0, 0.5])
    np.testing.assert_allclose(b["sojourn_mean[b]"], [2.0, 4.0])
    assert np.isnan(b["ttft_mean[b]"]).all()
    # intervals: mean +/- t(0.975, 1) sd / sqrt(2)
    pc = hand.per_class
    assert pc.loc["a", "x_mean_ci"] == pytest.approx(T975_1 * np.std([0.2, 0.3], ddof=1) / math.sqrt(2))
    assert pc.loc["a", "ttft_mean_ci"] == pytest.approx(T975_1 * np.std([1.0, 3.0], ddof=1) / math.sqrt(2))
    assert pc.loc["a", "throughput_ci"] == 0.0
    assert hand.cluster["revenue_per_gpu_ci"] == 0.0
    assert hand.cluster["throughput_ci"] == 0.0
    assert hand.cluster["revenue_per_gpu_separate_ci"] == pytest.approx(
        T975_1 * np.std([0.1, 0.2], ddof=1) / math.sqrt(2))
    ci = hand.ci.set_index(["metric", "class"])
    row = ci.loc[("e2e_mean", "all")]
    assert row["batch_mean"] == pytest.approx(7.0) and row["batches"] == 2
    assert ci.loc[("ttft_mean", "b"), "batches"] == 0
    assert math.isnan(ci.loc[("ttft_mean", "b"), "batch_mean"])


def test_interrupted_run_weights_the_short_batch():
    # snapshots at 10, 20 and an interrupt at 25: the second batch is 5 s long
    col = _collector(snap_times=(10.0, 20.0, 25.0))
    res = _build(col, t_end=25.0, interrupted=True)
    assert res.cluster["window_seconds"] == 15.0
    assert list(res.batches["t_end"]) == [20.0, 25.0]
    # x of class a: (4 + 6) / (2 * 15)
    assert res.per_class.loc["a", "x_mean"] == pytest.approx(10 / 30)
    np.testing.assert_allclose(res.batches["x_mean[a]"], [4 / 20, 6 / 10])
    assert "INTERRUPTED" in repr(res)


def test_snapshots_before_warmup_and_repeated_are_ignored():
    z = np.zeros(11)
    zc = np.zeros(20)
    # an early snapshot (before warm-up) and a repeat of the first snapshot time
    col = _collector(extra_snaps=((3.0, z, zc),))
    col.snapshots.insert(2, col.snapshots[2])  # 20 s twice: an interrupt exactly at a boundary
    res = _build(col)
    assert list(res.batches["t_start"]) == [10.0, 20.0]
    assert res.per_class.loc["a", "x_mean"] == pytest.approx(10 / 40)


def test_too_few_snapshots_give_a_nan_result():
    col = M.MetricCollector(2, warmup=10.0, horizon=30.0, batches=2)
    col.snapshot(10.0, np.zeros(11), np.zeros(20))
    col.snapshot(5.0, np.zeros(11), np.zeros(20))
    res = _build(col, records_path="runs/r.csv")
    assert math.isnan(res.cluster["revenue_per_gpu"])
    assert res.records_path == "runs/r.csv" and res.meta == {"engine": "python"} and res.seed == 7
    assert list(res.per_class.index) == ["a", "b"] and res.per_class.shape[1] == 0
    assert res.ci.empty and res.batches.empty


def test_summary_and_frame(hand):
    s = hand.summary()
    assert s["requests_per_wall_second"] == pytest.approx(7 / 2.0)
    assert s["engine"] == "python"
    assert s["scenario"] == "hand" and s["seed"] == 7 and s["events"] == 123
    assert s["revenue_per_gpu"] == pytest.approx(0.5)
    a, b = s["classes"]
    assert a["name"] == "a" and b["name"] == "b"
    assert b["ttft_mean"] is None  # NaN becomes None for JSON
    assert isinstance(a["completed"], int) and a["completed"] == 2
    assert "records" not in s
    df = hand.to_frame()
    assert list(df.columns[:5]) == ["class", "policy", "service", "n_gpus", "seed"]
    assert list(df["class"]) == ["a", "b"]
    r = repr(hand)
    assert "revenue/GPU/s=0.5" in r and "requests=7" in r and "INTERRUPTED" not in r


def test_clean():
    assert M._clean(np.int64(3)) == 3 and type(M._clean(np.int64(3))) is int
    assert M._clean(np.float64(0.5)) == 0.5 and type(M._clean(np.float64(0.5))) is float
    assert M._clean(float("inf")) is None and M._clean(np.nan) is None
    assert M._clean("x") == "x"


def test_records_writer(tmp_path):
    path = tmp_path / "r.csv"
    w = M.RecordsWriter(path, ("a", "b"))
    w.write(_chunk(REQUESTS))
    assert not path.exists()  # written under a temporary name, next to the target, until closed
    assert [p.name.endswith(".part") and p.name.startswith(".r.csv.") for p in tmp_path.iterdir()] == [True]
    assert w.close() == str(path)
    df = pd.read_csv(path)
    assert list(df.columns) == list(M.RecordsWriter.COLUMNS)
    assert w.rows == len(REQUESTS) == len(df)
    assert list(df["class"]) == ["a", "a", "a", "b", "b", "b", "a"]
    assert list(df["outcome"]) == ["completed", "completed", "completed", "abandoned_prefill",
                                   "abandoned_decode", "dropped", "in_system"]
    # e2e only for completed requests; no end time for a request still in the system
    np.testing.assert_allclose(df["e2e"][:3], [10.0, 3.0, 11.0])
    assert df["e2e"][3:].isna().all()
    assert math.isnan(df["end"][6]) and df["end"][5] == 22.0
    with pytest.raises(Exception, match="does not exist"):
        M.RecordsWriter(tmp_path / "nope" / "r.csv", ("a",))
