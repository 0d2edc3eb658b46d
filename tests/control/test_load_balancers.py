"""Classic load balancers (fluidopt.control.load_balancers): decisions, ledger, balance, invariants.

* Decisions on hand-built states: short traces replayed on the real engine, with the balancer's
  ``route`` recorded, checked against the rule worked out by hand (and against each other where two
  rules must disagree, e.g. JSQ's class-mean predictions vs the Decode Balancer's oracle).
* The token ledger against a brute-force recount from the engine's view, under preemptions.
* Power of two choices: its exact choice distribution on a fake view.
* Statistics: on a heterogeneous workload (the RL-router paper's five tasks, lognormal lengths),
  JSQ / least-requests / power-of-two spread requests over instances far more evenly than random,
  and the Decode Balancer spreads outstanding decode tokens far more evenly than round robin.
* Property test (hypothesis): every balancer keeps the engine's invariants (``check=True``) on random
  small scenarios, both service modes, with and without a KV capacity in tokens mode.
"""

from __future__ import annotations

import functools
import math
import random
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fluidopt import GPUProfile, RequestClass, Scenario
from fluidopt.control.instance import InstanceScheduler
from fluidopt.control.load_balancers import (
    ClassMeanOutput,
    JoinShortestQueue,
    MinMin,
    PowerOfTwo,
    RandomRouter,
    SmallLarge,
    oracle_output,
    resolve_predictor,
)
from fluidopt.control.protocol import PREFILL, WAIT_PREFILL
from fluidopt.control.registry import available, make_controller
from fluidopt.core.errors import ScenarioError, UsageError
from fluidopt.sim.api import simulate
from fluidopt.workloads import TraceWorkload

BALANCERS = ("random", "least-requests", "power-of-two", "jsq", "decode-balancer", "max-capacity",
             "max-capacity-reserve", "max-capacity-interval", "min-min", "small-large")


# =================================================================================================
# helpers
# =================================================================================================
def scenario(classes, *, n=3, B=16, alpha=0.01, beta=1e-4, tau_solo=0.02, chunk=64, **gpu_kw) -> Scenario:
    gpu = GPUProfile(alpha=alpha, beta=beta, tau_solo=tau_solo, chunk=chunk, batch=B, **gpu_kw)
    return Scenario(gpu=gpu, gpus=n, classes=tuple(RequestClass(*c) for c in classes))


def record(ctrl: InstanceScheduler) -> list[int]:
    """Log every routing decision of ``ctrl`` (the instance it returns for each arrival, in order)."""
    log: list[int] = []
    route = ctrl.route

    def logged(ctx, r):
        g = route(ctx, r)
        log.append(g)
        return g

    ctrl.route = logged
    return log


def replay(sc: Scenario, policy, rows, *, service="markov", horizon=10.0, seed=0, **opts) -> list[int]:
    """Replay ``rows`` = [(time, class, prompt, output), ...] under ``policy``; the routing decisions."""
    ctrl = make_controller(policy, sc, **opts) if isinstance(policy, str) else policy
    log = record(ctrl)
    frame = pd.DataFrame(rows, columns=["time", "cls", "prompt", "output"])
    work = TraceWorkload(frame, sc.class_names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the trace ends before the horizon: intended
        simulate(sc, ctrl, horizon=horizon, seed=seed, service=service, workload=work, check=True, batches=2)
    return log


# =================================================================================================
# registry and options
# =================================================================================================
def test_every_balancer_is_registered_with_a_chunked_variant():
    names = available()
    sc = scenario([("a", 100, 100, 1.0)])
    for nm in BALANCERS:
        assert nm in names and f"{nm}-chunked" in names
        plain, chunked = make_controller(nm, sc), make_controller(f"{nm}-chunked", sc)
        assert isinstance(plain, InstanceScheduler) and isinstance(chunked, InstanceScheduler)
        assert not plain.chunked_prefill and chunked.chunked_prefill
        assert plain.name == nm and chunked.name == f"{nm}-chunked"
        assert make_controller(nm, sc, chunked=True).name == f"{nm}-chunked"
    for alias, cls in (("lor", "least-requests"), ("po2", "power-of-two"), ("mcu", "max-capacity"),
                       ("join-shortest-queue", "jsq"), ("dedicated-small-large", "small-large")):
        assert make_controller(alias, sc).name == cls


def test_options_and_their_errors():
    sc = scenario([("a", 100, 40, 1.0), ("b", 100, 400, 1.0)])
    jsq = make_controller("jsq", sc)
    assert isinstance(jsq.predictor, ClassMeanOutput) and jsq.predictor.means == (40.0, 400.0) and not jsq.live
    assert make_controller("jsq", sc, predictor="oracle").live
    assert make_controller("decode-balancer", sc).predictor is oracle_output
    assert make_controller("max-capacity-interval", sc, interval=0.25).tick_interval == 0.25
    sl = make_controller("small-large", sc, threshold=50, small_gpus=2, within="jsq")
    assert (sl.threshold, sl.small_gpus_option, sl.within) == (50.0, 2, "jsq")
    with pytest.raises(UsageError, match="unknown option 'bogus'"):
        make_controller("least-requests", sc, bogus=1)
    with pytest.raises(UsageError, match="unknown option 'chunked'"):
        make_controller("jsq-chunked", sc, chunked=False)
    with pytest.raises(ScenarioError, match="predictor"):
        make_controller("jsq", sc, predictor="psychic")
    with pytest.raises(ScenarioError, match="interval"):
        make_controller("max-capacity-interval", sc, interval=0)
    with pytest.raises(ScenarioError, match="within"):
        make_controller("small-large", sc, within="random")
    with pytest.raises(ScenarioError, match="load"):
        make_controller("small-large", sc, load="bytes")
    with pytest.raises(ScenarioError, match="needs the scenario"):
        resolve_predictor("mean", None)
    # a user predictor that misbehaves is named at the first routing
    bad = JoinShortestQueue(lambda ctx, r: -1.0)
    with pytest.raises(ScenarioError, match="predictor returned -1.0"):
        simulate(sc, bad, horizon=5.0, seed=0)


# =================================================================================================
# decisions on hand-built states
# =================================================================================================
# markov service, arrivals a microsecond apart: nothing completes between them (prefills take ~10 ms)
SHORT_LONG = [("short", 10, 10, 1.0), ("long", 10, 1000, 1.0)]
ROWS = [(0.0, 1, 10, 1), (1e-6, 0, 10, 5000), (2e-6, 0, 10, 5000), (3e-6, 0, 10, 5000), (4e-6, 1, 10, 5000)]


def test_jsq_uses_class_means_decode_balancer_uses_true_lengths():
    sc = scenario(SHORT_LONG, n=3)
    # JSQ (class means 10 / 1000, prompts 10): loads after each decision
    #   r0 long -> 0 (all empty)        : (1010, 0, 0)
    #   r1 short -> 1 (cyclic start 1)  : (1010, 20, 0)
    #   r2 short -> 2                   : (1010, 20, 20)
    #   r3 short -> 1 (tie 1/2, start 0): (1010, 40, 20)
    #   r4 long -> 2
    assert replay(sc, "jsq", ROWS) == [0, 1, 2, 1, 2]
    # Decode Balancer (true outputs 1, 5000, ...): (1,0,0) -> (1,5000,0) -> (1,5000,5000) -> r3 to 0 -> r4 to 1
    assert replay(sc, "decode-balancer", ROWS) == [0, 1, 2, 0, 1]
    # the same JSQ with the oracle follows the true lengths too (prompts add 10 everywhere)
    assert replay(sc, "jsq", ROWS, predictor="oracle") == [0, 1, 2, 0, 1]


def test_least_requests_counts_and_breaks_ties_cyclically():
    sc = scenario(SHORT_LONG, n=3, B=16)
    # r1 (output 1 token, tokens mode) finishes on instance 1 well before t = 5; the others run long
    rows = [(0.0, 1, 10, 5000), (0.001, 0, 10, 1), (0.002, 1, 10, 5000), (5.0, 0, 10, 5000), (5.001, 1, 10, 5000),
            (5.002, 1, 10, 5000)]
    assert replay(sc, "least-requests", rows, service="tokens") == [0, 1, 2, 1, 2, 0]
    assert replay(sc, "round-robin", rows, service="tokens") == [0, 1, 2, 0, 1, 2]


def test_min_min_avoids_a_long_prefill_backlog():
    # instance 0 gets a 4000-token prompt first (0.41 s of prefill, no chunking); short prompts
    # then all finish earlier on instance 1, while least-requests alternates
    sc = scenario([("big", 4000, 10, 1.0), ("small", 10, 10, 1.0)], n=2, B=4)
    rows = [(0.0, 0, 4000, 10)] + [(0.001 * k, 1, 10, 10) for k in range(1, 5)]
    assert replay(sc, "min-min", rows, service="tokens") == [0, 1, 1, 1, 1]
    assert replay(sc, "least-requests", rows, service="tokens") == [0, 1, 0, 1, 0]


class _View:
    """The reads min-min's estimate makes of instance 0: ``requests`` there, ``kv`` tokens, ``decodes``."""

    service = "tokens"

    def __init__(self, requests: int, kv: int, decodes: int = 0):
        self.requests, self.kv, self.decodes = requests, kv, decodes

    def instance_requests(self, g):
        return self.requests

    def gpu_kv_used(self, g):
        return self.kv

    def gpu_decodes(self, g):
        return self.decodes


def _min_min(gpu, batch: int, chunked: bool) -> MinMin:
    """min-min on one instance with 3 routed prompts of 900 tokens in all and 1,200 outstanding output tokens."""
    mm = MinMin(oracle_output, gpu, chunked=chunked)
    mm.batch, mm._tok, mm.live = batch, True, False
    mm._pk, mm._pp, mm._out = [3], [900], [1200.0]
    return mm


def test_min_min_completion_estimate_formula():
    gpu = GPUProfile(alpha=0.02, beta=1e-4, tau_solo=0.025, chunk=128, batch=4, kv_time_per_token=1e-6)
    View = functools.partial(_View, 6, 2000)

    for chunked in (False, True):
        mm = _min_min(gpu, 4, chunked)
        tau = 0.025 + 1e-6 * 2000
        backlog = (900 / 128 + 1.5) * gpu.tau_mix if chunked else 3 * 0.02 + 1e-4 * 900
        slot = (6 + 1 - 4) * (1200 / 6) * tau / 4  # 3 slots to free, 200 tokens per request, 4 streams
        own = (math.ceil(300 / 128) * gpu.tau_mix if chunked else 0.02 + 1e-4 * 300) + 50 * tau
        assert mm.completion_estimate(View(), 0, 300, 50.0) == pytest.approx(max(backlog, slot) + own, rel=1e-12)


def test_min_min_completion_estimate_under_a_law():
    # with gpu.timemodel the three terms come from the law: prefill 0.02 + 1e-4 per token + 1e-8 per token^2,
    # decode 0.025 + 1e-6 per context token + 2e-4 per request (0.02, 2e-6, 3e-4 from 4 requests on)
    from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw

    law = IterationLaw(PrefillLaw(0.02, 1e-4, 1e-8), DecodeLaw((0.025, 1e-6, 2e-4), (0.02, 2e-6, 3e-4), 4))
    gpu = GPUProfile(alpha=0.02, beta=1e-4, tau_solo=0.025, chunk=128, batch=8, timemodel=law)

    View = functools.partial(_View, 10, 2000, 5)

    for chunked in (False, True):
        mm = _min_min(gpu, 8, chunked)
        tau = 0.02 + 2e-6 * 2000 + 3e-4 * 5  # the large triple: 5 decodes >= 4
        backlog = (900 / 128 + 1.5 if chunked else 3) * 0.02 + 1e-4 * 900 + 1e-8 * 900 ** 2 / 3
        slot = (10 + 1 - 8) * (1200 / 10) * tau / 8
        own = (3 if chunked else 1) * 0.02 + 1e-4 * 300 + 1e-8 * 300 ** 2 + 50 * tau
        assert mm.completion_estimate(View(), 0, 300, 50.0) == pytest.approx(max(backlog, slot) + own, rel=1e-12)


def test_the_straight_line_as_a_law_gives_the_same_whole_prompt_estimates():
    from fluidopt.calibration.timemodels import IterationLaw
    from fluidopt.control.token_ledger import backlog_seconds, prefill_seconds

    gpu = GPUProfile(alpha=0.02, beta=1e-4, tau_solo=0.025, chunk=128, batch=8)
    as_law = GPUProfile(alpha=0.02, beta=1e-4, tau_solo=0.025, chunk=128, batch=8,
                        timemodel=IterationLaw.straight_line(0.02, 1e-4, 0.025))
    for tokens in (1, 128, 300, 4000):
        assert prefill_seconds(as_law, tokens, False) == pytest.approx(prefill_seconds(gpu, tokens, False), rel=1e-15)
        assert prefill_seconds(as_law, tokens, True, cached=77) == pytest.approx(
            math.ceil(tokens / 128) * 0.02 + 1e-4 * tokens, rel=1e-15)  # chunks pay their tokens, not a whole C
        assert backlog_seconds(as_law, 3, tokens, False) == pytest.approx(backlog_seconds(gpu, 3, tokens, False))
    assert backlog_seconds(as_law, 0, 0, True) == 0.0


def test_max_capacity_decides_once_a_second():
    # decodes never finish (mean 1e6 tokens): instance_requests only grows
    sc = scenario([("a", 10, 1e6, 1.0)], n=3, B=8)
    rows = [(0.1, 0, 10, 9), (0.2, 0, 10, 9), (0.3, 0, 10, 9), (1.1, 0, 10, 9), (1.2, 0, 10, 9), (2.1, 0, 10, 9),
            (3.1, 0, 10, 9)]
    # before t = 1: instance 0; tick 1: free (5/8, 1, 1) -> 1; tick 2: (5/8, 6/8, 1) -> 2; tick 3: (5/8, 6/8, 7/8) -> 2
    assert replay(sc, "max-capacity-interval", rows, horizon=4.0) == [0, 0, 0, 1, 1, 2, 2]


def test_max_capacity_counts_kv_net_of_queued_prompts():
    # 1000-token KV caches; request 0 (prompt 600) runs on instance 0, request 1 (prompt 500, routed
    # there too before the first pick) cannot fit and waits in instance 0's queue
    sc = scenario([("a", 600, 1e6, 1.0)], n=2, B=8, kv_capacity=1000.0)
    ctrl = make_controller("max-capacity-interval", sc)
    log = record(ctrl)
    seen = []
    tick = ctrl.on_tick

    def on_tick(ctx):
        seen.append([ctrl.free_capacity(ctx, g) for g in range(2)])
        tick(ctx)

    ctrl.on_tick = on_tick
    frame = pd.DataFrame([(0.0, 0, 600, 5000), (0.1, 0, 500, 5000), (1.2, 0, 10, 5000)],
                         columns=["time", "cls", "prompt", "output"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        simulate(sc, ctrl, horizon=1.5, service="tokens", workload=TraceWorkload(frame, sc.class_names), check=True,
                 batches=2)
    f0, f1 = seen[0]
    # at t = 1: instance 0 holds 600 prompt tokens + < 50 generated, and 500 queued; slots 6/8 free
    assert f1 == 1.0 and -0.15 < f0 < -0.1
    assert log == [0, 0, 1]


def test_small_large_groups():
    sc = scenario(SHORT_LONG, n=4)
    thr, share = SmallLarge.plan_from_scenario(sc)
    assert thr == pytest.approx(100.0)  # sqrt(10 * 1000)
    g = sc.gpu
    busy = [g.alpha + g.beta * 10 + d * g.tau_solo for d in (10, 1000)]  # slot-seconds per request
    assert share == pytest.approx(20 / 1030)  # token load: rates 1 and 1, P + D = 20 and 1010
    assert SmallLarge.plan_from_scenario(sc, load="slots")[1] == pytest.approx(busy[0] / sum(busy))
    rows = [(k * 1e-6, c, 10, 5000) for k, c in enumerate([0, 1, 1, 0, 1, 1])]
    # share ~ 0.01: one small instance (0), three large (1-3, round robin)
    assert replay(sc, "small-large", rows) == [0, 1, 2, 0, 3, 1]
    assert replay(sc, "small-large", rows, small_gpus=2) == [0, 2, 3, 1, 2, 3]
    # oracle: every request's true output (5000) is large; the small group serves no one
    assert replay(sc, "small-large", rows, predictor="oracle") == [1, 2, 3, 1, 2, 3]
    # no small instance at all: small requests fall back to the large group
    assert replay(sc, "small-large", rows, small_gpus=0) == [0, 1, 2, 3, 0, 1]


def test_small_large_plan_keeps_both_groups():
    sl = SmallLarge(oracle_output, threshold=10, small_share=0.001)
    assert [sl.plan_small_gpus(n) for n in (1, 2, 5, 1000)] == [1, 1, 1, 1]
    sl = SmallLarge(oracle_output, threshold=10, small_share=0.999)
    assert [sl.plan_small_gpus(n) for n in (1, 2, 5, 1000)] == [1, 1, 4, 999]
    # share 1/3 on 4 instances: k = 1 gives loads (4/3, 8/9), k = 2 gives (2/3, 4/3): 4/3 both, and
    # k = 1 is nearer 4/3; on 6 instances k = 2 equalises exactly
    sl = SmallLarge(oracle_output, threshold=10, small_share=1 / 3)
    assert [sl.plan_small_gpus(n) for n in (2, 4, 6, 9)] == [1, 1, 2, 3]
    assert SmallLarge(oracle_output, threshold=10, small_share=0.0).plan_small_gpus(5) == 0
    assert SmallLarge(oracle_output, threshold=10, small_share=1.0).plan_small_gpus(5) == 5


class FakeView:
    """Just enough of the view for the stateless balancers."""

    def __init__(self, loads, seed):
        self.loads, self.rng = loads, random.Random(seed)

    def instance_requests(self, g):
        return self.loads[g]


def test_power_of_two_choice_distribution():
    # loads 0 < 1 < 2 < 3: instance g wins when drawn with a more loaded partner:
    # P(g) = (n - 1 - g) / C(n, 2) = 3/6, 2/6, 1/6, 0
    view, po2 = FakeView([0, 1, 2, 3], seed=5), PowerOfTwo()
    po2.n = 4
    N = 60000
    counts = np.bincount([po2.route(view, 0) for _ in range(N)], minlength=4) / N
    assert counts[3] == 0.0
    # 4 binomial standard deviations (at most sqrt(0.25 / N) = 0.002)
    assert np.allclose(counts, [3 / 6, 2 / 6, 1 / 6, 0.0], atol=0.009)
    # ties: the first drawn wins, so equal loads give uniform choices
    view = FakeView([2, 2, 2, 2], seed=6)
    counts = np.bincount([po2.route(view, 0) for _ in range(N)], minlength=4) / N
    assert np.allclose(counts, 0.25, atol=0.008)
    rnd = RandomRouter()
    rnd.n = 5
    counts = np.bincount([rnd.route(view, 0) for _ in range(N)], minlength=5) / N
    assert np.allclose(counts, 0.2, atol=0.007)


@pytest.mark.integration
@pytest.mark.parametrize("policy", BALANCERS)
def test_same_seed_same_numbers(policy):
    sc = scenario([("a", 200, 100, 6.0, 0.2), ("b", 1500, 40, 2.0, 0.2)], n=3, B=6, kv_capacity=4000.0)
    a = simulate(sc, policy, horizon=40.0, seed=11, service="tokens", batches=2)
    b = simulate(sc, policy, horizon=40.0, seed=11, service="tokens", batches=2)
    pd.testing.assert_frame_equal(a.per_class, b.per_class)
    assert a.totals == b.totals and a.events == b.events


# =================================================================================================
# the token ledger against a recount from the engine's view
# =================================================================================================
@pytest.mark.integration
@pytest.mark.parametrize("chunked", [False, True])
def test_ledger_matches_a_recount_under_preemption(chunked):
    # overloaded, small KV caches: preemptions and abandonment; fixed lengths with prompt + output
    # below the KV capacity, so no request is ever dropped
    sc = scenario([("a", 300, 400, 3.0, 0.05, None, None, "fixed"), ("b", 900, 150, 2.0, 0.05, None, None, "fixed")],
                  n=3, B=6, kv_capacity=3000.0, kv_time_per_token=1e-6)
    ctrl = JoinShortestQueue(oracle_output, live=True, chunked=chunked)
    ctrl.tick_interval = 0.05
    checked = []

    def on_tick(ctx):
        for g in range(ctx.n_gpus):
            rs = ctx.queue_requests(ctrl.iq[g]) + ctx.gpu_requests(g)
            pend = [ctx.req_prompt(r) + ctx.req_generated(r) for r in rs if ctx.req_phase(r) in (WAIT_PREFILL, PREFILL)]
            assert ctrl.pending_prefill_tokens(g) == sum(pend)
            assert ctrl.pending_prefills(g) == len(pend)
            assert ctrl._out[g] == sum(ctx.req_output(r) for r in rs)
            # the KV cache also holds the token each decode is producing in the current iteration
            gen = sum(ctx.req_generated(r) for r in rs)
            assert ctrl.generated(ctx, g) - gen in (0, ctx.gpu_decodes(g))
            assert ctrl.outstanding_output(ctx, g) == max(0.0, ctrl._out[g] - ctrl.generated(ctx, g))
            checked.append(len(rs))

    ctrl.on_tick = on_tick
    res = simulate(sc, ctrl, horizon=100.0, seed=3, service="tokens", batches=2)
    assert res.totals["preemptions"] > 20 and res.totals["abandoned"] > 20 and res.totals["dropped"] == 0
    assert len(checked) > 5000 and max(checked) > 6


# =================================================================================================
# statistics: balance on a heterogeneous workload
# =================================================================================================
TASKS = [("translation", 29, 62), ("eli5", 30, 334), ("imdb", 212, 143), ("squad", 125, 220), ("wnut", 26, 64)]


def rl_scenario(n: int = 8, rate: float = 40.0) -> Scenario:
    """The RL-router paper's setting (docs/routing.md): V100-like law, KV cache 30k tokens, five tasks."""
    gpu = GPUProfile(alpha=0.017, beta=3.2e-4, tau_solo=0.017, chunk=128, batch=128, kv_capacity=30000.0,
                     kv_time_per_token=7e-7)
    cls = tuple(RequestClass(nm, p, d, rate / 5, lengths="lognormal", prompt_sigma=1.0, decode_sigma=1.0)
                for nm, p, d in TASKS)
    return Scenario(gpu=gpu, gpus=n, classes=cls, name="rl-five-tasks")


def spread(policy: str, seed: int, measure) -> float:
    """Time average (every 0.5 s after a 20 s warm-up) of the std across instances of ``measure``."""
    sc = rl_scenario()
    ctrl = make_controller(policy, sc)
    samples = []
    ctrl.tick_interval = 0.5

    def on_tick(ctx):
        if ctx.now >= 20.0:
            samples.append(float(np.std([measure(ctx, ctrl, g) for g in range(ctx.n_gpus)])))

    ctrl.on_tick = on_tick
    simulate(sc, ctrl, horizon=100.0, warmup=20.0, seed=seed, service="tokens", batches=2)
    return float(np.mean(samples))


def requests_on(ctx, ctrl, g):
    return ctx.instance_requests(g)


def decode_tokens_on(ctx, ctrl, g):
    """Output tokens still to generate (true lengths) by the requests routed to g: a live recount."""
    rs = ctx.queue_requests(ctrl.iq[g]) + ctx.gpu_requests(g)
    return sum(ctx.req_output(r) - ctx.req_generated(r) for r in rs)


@pytest.mark.integration
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_queue_aware_balancers_spread_requests_better_than_random(seed):
    # Under random routing each instance sees an independent thinned Poisson stream: its number of
    # requests varies like an M/G/inf occupancy (~24 on average here, std ~5 across instances;
    # measured 5.4-6.9). Least-requests keeps instances within ~1 of each other (measured 0.6),
    # power of two within a few (1.4), JSQ in tokens (2.2-2.4). Requiring < 0.6 x random leaves room
    # for seed noise on both sides at every seed.
    rnd = spread("random", seed, requests_on)
    assert rnd > 3.0
    for policy, bound in (("least-requests", 0.25), ("power-of-two", 0.5), ("jsq", 0.6)):
        assert spread(policy, seed, requests_on) < bound * rnd, policy


@pytest.mark.integration
@pytest.mark.parametrize("seed", [0, 1])
def test_decode_balancer_spreads_decode_tokens_better_than_round_robin(seed):
    # Round robin balances counts, not lengths: lognormal(sigma 1) outputs leave instances thousands of
    # tokens apart (measured std 2400-3100); the oracle Decode Balancer keeps them within a few
    # hundred (270-510). Half of round robin's spread is a wide margin.
    rr = spread("round-robin", seed, decode_tokens_on)
    db = spread("decode-balancer", seed, decode_tokens_on)
    assert db < 0.5 * rr


# =================================================================================================
# property test: engine invariants under every balancer
# =================================================================================================
@st.composite
def cases(draw):
    n = draw(st.integers(1, 4))
    B = draw(st.integers(1, 8))
    service = draw(st.sampled_from(("markov", "tokens")))
    kv, kap = None, 0.0
    if service == "tokens":
        if draw(st.booleans()):
            kv = float(draw(st.integers(300, 6000)))
        kap = draw(st.sampled_from((0.0, 1e-6)))
    gpu = GPUProfile.from_gamma(alpha=draw(st.floats(0.001, 0.03)), beta=draw(st.floats(0.0, 3e-4)),
                                gamma=draw(st.floats(10.0, 80.0)), chunk=draw(st.sampled_from((16, 64, 256))), batch=B,
                                kv_capacity=kv, kv_time_per_token=kap)
    classes = []
    for i in range(draw(st.integers(1, 3))):
        lengths = draw(st.sampled_from(("exponential", "fixed", "lognormal")))
        sig = 1.0 if lengths == "lognormal" else None
        classes.append(RequestClass(
            f"c{i}", prompt=draw(st.floats(5.0, 2000.0)), decode=draw(st.floats(2.0, 800.0)),
            rate=n * draw(st.floats(0.05, 2.0)), patience=draw(st.sampled_from((0.0, 0.1, 1.0))),
            lengths=lengths, prompt_sigma=sig, decode_sigma=sig))
    sc = Scenario(gpu=gpu, gpus=n, classes=tuple(classes))
    opts = {"chunked": draw(st.booleans())}
    if draw(st.booleans()):
        opts["predictor"] = draw(st.sampled_from(("mean", "oracle")))
    horizon = float(min(200.0, 120.0 / sum(c.rate for c in classes)))  # about 120 arrivals
    return sc, opts, service, horizon, draw(st.integers(0, 2**16))


def kv_pressure_case(chunked: bool):
    """A case that reaches the KV boundary under every balancer: 2 GPUs of B = 4 with a 1,500-token KV cache
    (and its time term), overloaded; fixed 300-token prompts and lognormal ones around 900. Measured for
    every balancer, both chunkings: 136 requests, 2-15 preemptions, 6 dropped, 70-92 abandoned."""
    gpu = GPUProfile.from_gamma(alpha=0.01, beta=1e-4, gamma=40.0, chunk=64, batch=4, kv_capacity=1500.0,
                                kv_time_per_token=1e-6)
    classes = (RequestClass("c0", prompt=300.0, decode=400.0, rate=3.0, patience=0.1, lengths="fixed"),
               RequestClass("c1", prompt=900.0, decode=150.0, rate=2.0, patience=1.0, lengths="lognormal",
                            prompt_sigma=1.0, decode_sigma=1.0))
    return Scenario(gpu=gpu, gpus=2, classes=classes), {"chunked": chunked}, "tokens", 24.0, 7


# 20 drawn cases per balancer (was 40; the recount after every event is most of the cost) and the KV
# boundary as two explicit examples: the 40 draws reached preemptions and drops for 9 of the 10 balancers
# (never small-large), 20 draws for 7; with the examples all ten reach both (docs/testing.md, sixth round)
@pytest.mark.parametrize("policy", BALANCERS)
@settings(max_examples=20, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@pytest.mark.integration
@given(case=cases())
@example(case=kv_pressure_case(False))
@example(case=kv_pressure_case(True))
def test_balancers_keep_engine_invariants(policy, case):
    sc, opts, service, horizon, seed = case
    opts = dict(opts)  # an explicit example's options are shared by every balancer's run
    if policy in ("random", "least-requests", "power-of-two", "max-capacity", "max-capacity-interval"):
        opts.pop("predictor", None)
    ctrl = make_controller(policy, sc, **opts)
    res = simulate(sc, ctrl, horizon=horizon, seed=seed, service=service, check=True, batches=2)
    t = res.totals
    assert t["requests"] == t["completed"] + t["abandoned"] + t["dropped"] + t["in_system"]
    assert res.policy == ctrl.name
    # the instance architecture decodes in place: nothing ever waits in the central decode buffer
    assert float(res.per_class["q_decode_mean"].sum()) == 0.0
