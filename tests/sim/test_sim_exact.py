"""Exactness of the simulator: textbook queues (Erlang C, Erlang A, M/G/1) and exact token timelines.

Statistical checks. Where :mod:`fluidopt.queueing.runlength` gives the exact asymptotic standard
deviation of an estimate (M/M/c and M/M/c+M: mean wait, P(abandon), mean queue, utilisation; M/M/inf
through Burke's theorem) the window is 4 of those standard deviations (two-sided p < 1e-4 for a
correct simulator), the run length is chosen with that module so that the window is a few percent,
and the run's own batch-means standard error must agree with the exact one (between 0.5 and 1.6
times: a run more, or less, variable than the theory says fails too). Elsewhere (M/G/1) the window is
4 batch-means standard errors, and the standard error itself is bounded, which bounds the window.
Every test states its window; runs are seeded, hence deterministic.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from builders import hand_scenario, replay_trace
from scipy import stats

from fluidopt.control.instance import RoundRobin
from fluidopt.control.paper_baselines import FIWSP
from fluidopt.core.model import GPUProfile, RequestClass, Scenario
from fluidopt.queueing import erlang_a, mg1_geometric_wait, mmc_metrics
from fluidopt.queueing.runlength import (
    erlang_a_abandon_relative_sd,
    mmc_mean_wait_relative_sd,
    mmc_time_average_variance,
)
from fluidopt.sim.api import simulate
from fluidopt.sim.textbook import erlang_setup, mg1_setup

K = 20
T975 = stats.t.ppf(0.975, K - 1)
WARMUP = 50.0


def _se(res, metric: str, cls: str = "customers") -> float:
    ci = res.ci.set_index(["metric", "class"])
    return float(ci.loc[(metric, cls), "half_width"]) / T975


def _check(sim: float, exact: float, se: float, max_rel_se: float, what: str) -> None:
    """Within 4 batch-means standard errors, the standard error being at most max_rel_se of the value."""
    assert se <= max_rel_se * abs(exact), f"{what}: standard error {se:.3g} too large to be informative"
    assert abs(sim - exact) <= 4 * se, f"{what}: simulated {sim:.6g} vs exact {exact:.6g} (4 se = {4 * se:.3g})"


def _check_exact_sd(sim: float, exact: float, sd: float, se: float, window: float, what: str) -> None:
    """Within 4 exact standard deviations ``sd`` of the estimate, which are at most ``window`` (relative)
    of the value; the run's batch-means standard error ``se`` must be 0.5 to 1.6 times ``sd``."""
    assert 4 * sd <= window * abs(exact), f"{what}: 4 sd = {4 * sd / abs(exact):.2%} of the value > {window:.1%}"
    assert 0.5 * sd <= se <= 1.6 * sd, f"{what}: batch-means se {se:.4g} vs exact sd {sd:.4g}"
    assert abs(sim - exact) <= 4 * sd, (f"{what}: simulated {sim:.6g} vs exact {exact:.6g} "
                                        f"(error {sim / exact - 1:+.2%}, 4 sd = {4 * sd / abs(exact):.2%})")


def _erlang_checks(res, lam: float, mu: float, c: int, theta: float, windows: dict[str, float]) -> None:
    """Mean wait (per customer), mean queue (time average) and utilisation, each against the exact
    value with the exact standard deviation of a run of this length (queueing_runlength)."""
    T = res.t_end - res.warmup
    customers = lam * T
    ex = erlang_a(lam, mu, c, theta) if theta > 0 else mmc_metrics(lam, mu, c)
    pc = res.per_class.loc["customers"]
    sd_w = mmc_mean_wait_relative_sd(lam, mu, c, customers, theta, estimator="customer") * ex.mean_wait
    _check_exact_sd(pc.wait_prefill_mean, ex.mean_wait, sd_w, _se(res, "wait_prefill_mean"), windows["wait"],
                    "mean wait")
    sd_q = mmc_mean_wait_relative_sd(lam, mu, c, customers, theta, estimator="time") * ex.mean_queue
    _check_exact_sd(pc.q_prefill_mean * c, ex.mean_queue, sd_q, _se(res, "q_prefill_mean") * c, windows["queue"],
                    "mean queue")
    # utilisation: X counts busy prefill slots per GPU, i.e. busy servers / c
    sd_u = math.sqrt(mmc_time_average_variance(lam, mu, c, "busy", theta) / T) / c
    _check_exact_sd(pc.x_mean, ex.utilisation, sd_u, _se(res, "x_mean"), windows["utilisation"], "utilisation")
    if theta > 0:
        sd_a = erlang_a_abandon_relative_sd(lam, mu, c, theta, customers, estimator="customer") * ex.p_abandon
        _check_exact_sd(pc.abandoned_prefill_fraction, ex.p_abandon, sd_a, _se(res, "abandoned_prefill_fraction"),
                        windows["abandon"], "P(abandon)")


@pytest.mark.slow
@pytest.mark.timeout(900)  # long on the pure-Python engine (about 4x the compiled core's time)
def test_erlang_c_mmc():
    """M/M/10 at load 0.8, 800k customers: mean wait within 8.5% (4 exact sd; sd 2.1%), mean queue
    within 8.7%, utilisation within 0.63% of Erlang C."""
    c, lam, mu = 10, 8.0, 1.0
    sc, ctrl = erlang_setup(c, lam, mu)
    res = simulate(sc, ctrl, horizon=800_000 / lam + WARMUP, warmup=WARMUP, seed=11, batches=K)
    _erlang_checks(res, lam, mu, c, 0.0, {"wait": 0.086, "queue": 0.088, "utilisation": 0.0064})
    pc = res.per_class.loc["customers"]
    assert pc.abandoned_fraction == 0.0
    assert res.totals["abandoned"] == 0


@pytest.mark.integration
@pytest.mark.slow  # about 8 s on the pure-Python engine; it meets this scenario in test_sim_backends.py instead
def test_erlang_a_overloaded():
    """M/M/20+M at offered load 1.1, theta = 1 (300k customers): P(abandon) within 4.7% (4 exact sd),
    mean wait within 5.0%, mean queue within 5.4%, utilisation within 0.43% of Erlang A."""
    c, lam, mu, theta = 20, 22.0, 1.0, 1.0
    sc, ctrl = erlang_setup(c, lam, mu, theta)
    res = simulate(sc, ctrl, horizon=300_000 / lam + WARMUP, warmup=WARMUP, seed=5, batches=K)
    _erlang_checks(res, lam, mu, c, theta, {"wait": 0.05, "queue": 0.055, "utilisation": 0.0044, "abandon": 0.047})
    pc = res.per_class.loc["customers"]
    # Decodes run on the same GPUs (one token at mu_m or mu_s) and never abandon here: the decode
    # buffer stays empty because every GPU keeps B-1 decode slots.
    assert pc.abandoned_decode_fraction == 0.0


@pytest.mark.slow
@pytest.mark.timeout(900)  # long on the pure-Python engine (about 4x the compiled core's time)
def test_erlang_c_issue_configuration():
    """The issue's M/M/100 at load 0.9, at 1.6M customers (the 1M-customer runs are in benchmarks/).

    Its mean wait is a high-variance statistic (rare long excursions): the exact relative sd of a
    1.6M-customer run's mean wait is 4.87% (docs/run-length.md: 6.16% at 1M), so the window is 4 x 4.87%
    = 19.5% (the mean queue's 19.6%): a simulator 19.6% off fails (300k customers, as before, allowed
    about 50%), as does one whose run is more variable than M/M/100's. The utilisation is tight: within
    0.45% (4 sd; sd 0.11%)."""
    c, lam, mu = 100, 90.0, 1.0
    customers = 1_600_000
    assert 4 * mmc_mean_wait_relative_sd(lam, mu, c, customers, estimator="customer") < 0.196
    sc, ctrl = erlang_setup(c, lam, mu)
    res = simulate(sc, ctrl, horizon=customers / lam + WARMUP, warmup=WARMUP, seed=0, batches=K)
    _erlang_checks(res, lam, mu, c, 0.0, {"wait": 0.195, "queue": 0.197, "utilisation": 0.0045})


@pytest.mark.slow
@pytest.mark.timeout(900)  # long on the pure-Python engine (about 4x the compiled core's time)
def test_mg1_pollaczek_khinchine_tokens():
    """service='tokens': a prefill-only GPU with C = 1 is M/G/1 with service alpha * P, P geometric.

    500k customers at load 0.8: the batch-means standard error of the mean wait is about 1.5% (at most
    2.5% allowed), so the window is about 6% (at most 10%); the prefill GPU's utilisation within about
    0.7% (4 se, se at most 0.3%)."""
    lam, alpha, m = 1.6, 0.01, 50.0  # load 0.8
    sc, ctrl = mg1_setup(lam, alpha, m)
    res = simulate(sc, ctrl, horizon=500_000 / lam + 100.0, warmup=100.0, seed=2, service="tokens", batches=K)
    exact = mg1_geometric_wait(lam, alpha, m)
    pc = res.per_class.loc["customers"]
    _check(pc.wait_prefill_mean, exact, _se(res, "wait_prefill_mean"), 0.025, "M/G/1 mean wait")
    # the busy fraction of the prefill GPU is lam E[S] = 0.8; X counts it per GPU (2 GPUs)
    _check(pc.x_mean * 2, lam * alpha * m, _se(res, "x_mean") * 2, 0.003, "prefill utilisation")


def test_decode_stage_is_mm_infinity():
    """Decode-only GPUs with ample slots, fed by the departures of an M/M/2 prefill stage (Poisson, by
    Burke's theorem): the decodes in service are M/M/inf with offered load a = lam / mu_s = 8, whose
    time average has asymptotic variance 2 a / mu_s (queueing_runlength, M/M/c with c >> a). 60k
    customers: within 2.4% (4 exact sd). Also Little: mean decodes = decode throughput / mu_s."""
    gpu = GPUProfile(alpha=0.02, beta=0.0, tau_solo=0.01, chunk=1, batch=64)
    cls = RequestClass("a", prompt=10, decode=100, rate=8.0, patience=0.0)
    sc = Scenario(gpu=gpu, gpus=4, classes=(cls,))
    from fluidopt.control.fcfs import ReservedPrefillFCFS

    res = simulate(sc, ReservedPrefillFCFS(prefill_gpus=2, decode_on_prefill_gpus=False), horizon=60_000 / 8.0,
                   warmup=WARMUP, seed=4, batches=K)
    pc = res.per_class.loc["a"]
    mu_s = 1.0 / (0.01 * 100)  # gamma / D = (1 / tau_solo) / D: one decode of 100 tokens per second
    a = 8.0 / mu_s
    T = res.t_end - res.warmup
    sigma2 = mmc_time_average_variance(8.0, mu_s, 128, "in_system")  # 2 decode GPUs x 64 slots
    assert sigma2 == pytest.approx(2 * a / mu_s, rel=1e-6)
    sd = math.sqrt(sigma2 / T)
    _check_exact_sd(pc.y_solo_mean * 4, a, sd, _se(res, "y_solo_mean", "a") * 4, 0.024, "decodes in service")
    _check(pc.y_solo_mean * 4, pc.throughput * 4 / mu_s, _se(res, "y_solo_mean", "a") * 4, 0.01,
           "decodes in service (Little)")
    assert pc.y_mixed_mean == 0.0  # decode-only GPUs never run a prefill


# ------------------------------------------------------------------------------------------------
# Token timelines: hand-computed, and against an independent iteration-by-iteration stepper
# ------------------------------------------------------------------------------------------------


def _scenario(n=1, batch=4, kv_capacity=None, kap=0.0, classes=("a",)) -> Scenario:
    return hand_scenario(n, batch, kv=kv_capacity, kap=kap, classes=classes)


def _run_records(tmp_path, sc, ctrl, rows, horizon=5.0) -> pd.DataFrame:
    res, rec = replay_trace(sc, ctrl, rows, horizon=horizon, records=tmp_path / "rec.csv")
    assert res.totals["in_system"] == 0
    return rec


def test_tokens_timeline_chunked(tmp_path):
    # tau_mix = 0.01 + 0.001 * 10 = 0.02 s, tau_solo = 0.005 s, C = 10.
    # A (P=25, D=4) arrives at 0: 3 mixed iterations -> TTFT 0.06; decodes from 0.06.
    # B (P=10, D=2) arrives at 0.066 and joins at the next boundary 0.07 (A has 2 tokens): one mixed
    # iteration to 0.09 (A's 3rd token); both decode solo: A ends 0.095, B at 0.10.
    rec = _run_records(tmp_path, _scenario(), FIWSP(), [(0.0, 25, 4, 0), (0.066, 10, 2, 0)])
    assert rec.ttft.tolist() == pytest.approx([0.06, 0.024], abs=1e-12)
    assert rec.end.tolist() == pytest.approx([0.095, 0.10], abs=1e-12)
    assert rec.wait_prefill.tolist() == [0.0, 0.0]


def test_tokens_timeline_prefill_stalls_decodes(tmp_path):
    # chunked=False: a prefill is one iteration of alpha + beta * P during which decodes stall.
    # A: 0.01 + 0.025 = 0.035 -> TTFT 0.035, tokens at 0.040, 0.045. B (P=10, D=2) arrives 0.041,
    # joins at 0.045: prefill iteration 0.02 s to 0.065 (A stalls); then A's tokens 3, 4 and B's
    # tokens 1, 2 at 0.070 and 0.075: both end at 0.075 (two completions at one boundary).
    rec = _run_records(tmp_path, _scenario(), RoundRobin(chunked=False), [(0.0, 25, 4, 0), (0.041, 10, 2, 0)])
    assert rec.ttft.tolist() == pytest.approx([0.035, 0.024], abs=1e-12)
    assert rec.end.tolist() == pytest.approx([0.075, 0.075], abs=1e-12)


def test_tokens_timeline_kv_preemption(tmp_path):
    # KV capacity 40 tokens. A (P=10, D=20) at 0: prefill to 0.02, decodes (kv 10, +1 per iteration).
    # B (P=10, D=20) at 0.021 joins at 0.025 (kv 11 + 10): mixed iteration to 0.045, then both decode
    # solo (kv 22, +2 per iteration). At 0.045 + 9 * 0.005 = 0.09 the next iteration would need 42 > 40:
    # the youngest (B, 9 tokens generated) is evicted to the front of its instance queue; no admission
    # in that iteration. A ends 0.09 + 9 * 0.005 = 0.135; B is re-prefilled (10 + 9 = 19 tokens: two
    # mixed iterations) to 0.175 and decodes its last 11 tokens to 0.23.
    sc = _scenario(kv_capacity=40)
    rec = _run_records(tmp_path, sc, RoundRobin(chunked=True, kv_watermark=0.0), [(0.0, 10, 20, 0), (0.021, 10, 20, 0)])
    assert rec.end.tolist() == pytest.approx([0.135, 0.23], abs=1e-12)
    assert rec.preemptions.tolist() == [0, 1]
    assert rec.ttft.tolist() == pytest.approx([0.02, 0.024], abs=1e-12)  # TTFT counts the first prefill
    assert rec.wait_prefill.tolist() == pytest.approx([0.0, 0.045], abs=1e-12)  # B waited 0.09 -> 0.135


def test_tokens_timeline_kv_iteration_time(tmp_path):
    # kv_time_per_token = 0.001 s: every iteration also costs 0.001 s per resident KV token.
    # A (P=10, D=3) alone: prefill 0.02 + 0.010 = 0.03; decodes 0.015, 0.016, 0.017 -> ends 0.078.
    rec = _run_records(tmp_path, _scenario(kap=0.001), FIWSP(), [(0.0, 10, 3, 0)])
    assert rec.ttft.tolist() == pytest.approx([0.03], abs=1e-12)
    assert rec.end.tolist() == pytest.approx([0.078], abs=1e-12)


def test_tokens_decode_ending_where_a_whole_prompt_prefill_joins(tmp_path):
    # The engine issue's regression case. One GPU, alpha 0.017, beta 3.2e-4, tau_solo 0.02, B 8,
    # prefill-first (no chunking). A (P=100, D=2) at 0: prefill 0.017 + 0.032 -> 0.049; its decodes
    # end at 0.069 and 0.089. B (P=1000, D=1) arrives at 0.075 and joins at 0.089, the boundary where
    # A's last decode ends: A completes at 0.089 (not after B's 0.337 s prefill), B's prefill runs
    # 0.089 -> 0.426 and its one decode to 0.446.
    gpu = GPUProfile(alpha=0.017, beta=3.2e-4, tau_solo=0.02, chunk=256, batch=8)
    sc = Scenario(gpu=gpu, gpus=1, classes=(RequestClass("a", prompt=100, decode=2, rate=1.0),),
                  prefill_price=1.0, decode_price=1.0)
    rec = _run_records(tmp_path, sc, RoundRobin(chunked=False), [(0.0, 100, 2, 0), (0.075, 1000, 1, 0)])
    assert rec.end.tolist() == pytest.approx([0.089, 0.446], abs=1e-12)
    assert (rec.arrival + rec.ttft).tolist() == pytest.approx([0.049, 0.426], abs=1e-12)


def test_tokens_decode_ending_at_the_join_boundary_frees_kv_before_the_prefill(tmp_path):
    # The same case with a KV time term of 1e-4 s per resident token; B arrives at 0.095 and joins at
    # A's last boundary, 0.1191. B's prefill iteration is timed with A's cache already gone (KV = 1000,
    # B's prompt only): 0.017 + 0.32 + 0.1 = 0.437 s.
    gpu = GPUProfile(alpha=0.017, beta=3.2e-4, tau_solo=0.02, chunk=256, batch=8, kv_time_per_token=1e-4)
    sc = Scenario(gpu=gpu, gpus=1, classes=(RequestClass("a", prompt=100, decode=2, rate=1.0),),
                  prefill_price=1.0, decode_price=1.0)
    rec = _run_records(tmp_path, sc, RoundRobin(chunked=False), [(0.0, 100, 2, 0), (0.095, 1000, 1, 0)])
    # A: prefill 0.017 + 0.032 + 0.01 (its own 100 tokens) = 0.059; decodes 0.02 + 1e-4 * 100, then * 101
    a1 = 0.059 + 0.02 + 0.0100
    a2 = a1 + 0.02 + 0.0101
    assert rec.end[0] == pytest.approx(a2, abs=1e-12)
    b_ttft = a2 + 0.017 + 0.32 + 1e-4 * 1000
    assert rec.arrival[1] + rec.ttft[1] == pytest.approx(b_ttft, abs=1e-12)
    assert rec.end[1] == pytest.approx(b_ttft + 0.02 + 1e-4 * 1000, abs=1e-12)


def _reference_stepper(rows, *, batch, alpha, beta, chunk, tau_solo, kap, chunked):
    """Iteration-by-iteration simulation of one FCFS instance (prefill first, one prefill at a time).

    Independent of the engine: it steps every iteration. Returns {row index: (ttft time, end time)}.
    """
    pending = sorted(range(len(rows)), key=lambda i: rows[i][0])
    queue: list[int] = []
    pre = None  # [row, chunks left]
    decs: dict[int, int] = {}  # row -> tokens left
    kv = 0
    t = 0.0
    first: dict[int, float] = {}
    end: dict[int, float] = {}
    while pending or queue or pre is not None or decs:
        busy = pre is not None or decs
        if not busy and not queue:
            t = max(t, rows[pending[0]][0])
        while pending and rows[pending[0]][0] <= t:
            queue.append(pending.pop(0))
        if pre is None and queue and (1 + len(decs)) <= batch:
            i = queue.pop(0)
            P = rows[i][1]
            pre = [i, (P + chunk - 1) // chunk if chunked else 1]
            kv += P
        if pre is None and not decs:
            continue
        # one iteration
        if pre is not None:
            P = rows[pre[0]][1]
            it = (alpha + beta * chunk) if chunked else (alpha + beta * P)
        else:
            it = tau_solo
        it += kap * kv
        stall = pre is not None and not chunked
        t_next = t + it
        # arrivals during the iteration queue up (they join at its end)
        t = t_next
        if not stall:
            for i in list(decs):
                decs[i] -= 1
                kv += 1
        done = [i for i, left in decs.items() if left == 0]
        for i in sorted(done):
            del decs[i]
            end[i] = t
            kv -= rows[i][1] + rows[i][2]
        if pre is not None:
            pre[1] -= 1
            if pre[1] == 0:
                i = pre[0]
                first[i] = t
                decs[i] = rows[i][2]
                pre = None
    return {i: (first[i], end[i]) for i in range(len(rows))}


@pytest.mark.parametrize("chunked,kap", [(True, 0.0), (False, 0.0), (True, 2e-4), (False, 1e-4)])
def test_tokens_engine_matches_iteration_stepper(tmp_path, chunked, kap):
    rng = np.random.default_rng(7 + int(chunked) + int(kap * 1e5))
    n = 40
    times = np.sort(rng.uniform(0, 3.0, n))
    rows = [(float(times[i]), int(rng.integers(1, 60)), int(rng.integers(1, 40)), 0) for i in range(n)]
    sc = _scenario(batch=3, kap=kap)
    g = sc.gpu
    ref = _reference_stepper(rows, batch=3, alpha=g.alpha, beta=g.beta, chunk=g.chunk, tau_solo=g.tau_solo,
                             kap=kap, chunked=chunked)
    rec = _run_records(tmp_path, sc, RoundRobin(chunked=chunked, kv_watermark=0.0), rows, horizon=200.0)
    assert len(rec) == n
    for j in range(n):
        ft, et = ref[j]
        assert rec.arrival[j] + rec.ttft[j] == pytest.approx(ft, rel=1e-9, abs=1e-9), f"request {j}: first token"
        assert rec.end[j] == pytest.approx(et, rel=1e-9, abs=1e-9), f"request {j}: completion"


@pytest.mark.integration
def test_markov_erlang_needs_no_decode_buffer():
    """Sanity of the mapping itself: no prefill slot is ever blocked by decodes (idle <=> no prefill)."""
    sc, ctrl = erlang_setup(5, 4.0, 1.0)
    res = simulate(sc, ctrl, horizon=300.0, seed=1, check=True, batches=2)
    assert res.totals["requests"] == res.totals["completed"] + res.totals["in_system"]
    assert math.isfinite(res.cluster["revenue_per_gpu"])
