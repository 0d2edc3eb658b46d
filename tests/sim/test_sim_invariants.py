"""Conservation and consistency of the engine over random scenarios and random controllers.

``simulate(..., check=True)`` recounts the whole state after every event and compares it with every
incremental counter (per-class phase counts, GPU slots and caps, pool sets, queue links, the
abandonment race), and checks arrived = completed + abandoned + dropped + in system per class, and
prefilled = completed + abandoned in the decode buffer + past prefill. Hypothesis drives scenarios,
services and controllers, including one that takes random valid (and invalid) actions.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fluidopt
from fluidopt.control.fcfs import ReservedPrefillFCFS
from fluidopt.control.instance import RoundRobin
from fluidopt.control.paper_baselines import FIWSP
from fluidopt.control.protocol import (
    DECODE_QUEUE,
    PREFILL_QUEUE,
    WAIT_DECODE,
    WAIT_PREFILL,
    Context,
    Controller,
)
from fluidopt.core.errors import ActionError
from fluidopt.core.model import GPUProfile, RequestClass, Scenario
from fluidopt.sim.api import simulate


class ChaosController(Controller):
    """Random valid actions from every callback, plus rejected invalid ones (which must change nothing)."""

    name = "chaos"

    def __init__(self, tick: float | None = 0.7, chunked: bool = True):
        self.tick_interval = tick
        self.chunked_prefill = chunked
        self.rejected = 0

    def setup(self, ctx: Context) -> None:
        rng = ctx.rng
        n, B = ctx.n_gpus, ctx.batch
        self.queues = [PREFILL_QUEUE, DECODE_QUEUE, ctx.add_queue("a"), ctx.add_queue("b")]
        self.queues += [ctx.instance_queue(g) for g in range(n)]
        pools = [rng.randrange(3) for _ in range(n)]
        pools[0] = 0
        for p in set(pools):
            gs = [g for g in range(n) if pools[g] == p]
            ctx.set_pool(gs, p, prefill=(p == 0 or rng.random() < 0.5), max_decodes=rng.randrange(0, B + 1))
        self.pools = sorted(set(pools))

    def _try_invalid(self, ctx: Context, r: int) -> None:
        before = (ctx.req_phase(r), ctx.req_queue(r), ctx.req_gpu(r))
        bad = [
            lambda: ctx.start_decode(r, 0) if ctx.req_phase(r) == WAIT_PREFILL else ctx.start_prefill(r, 0),
            lambda: ctx.start_prefill(r, ctx.n_gpus),
            lambda: ctx.enqueue(r, 10_000),
            lambda: ctx.start_prefill(-5, 0),
        ]
        try:
            ctx.rng.choice(bad)()
        except ActionError:
            self.rejected += 1
            assert (ctx.req_phase(r), ctx.req_queue(r), ctx.req_gpu(r)) == before

    def _place(self, ctx: Context, r: int) -> None:
        rng = ctx.rng
        if rng.random() < 0.1:
            self._try_invalid(ctx, r)
        x = rng.random()
        ph = ctx.req_phase(r)
        if x < 0.6:
            p = rng.choice(self.pools)
            s = ctx.idle_prefill(p) if ph == WAIT_PREFILL else ctx.free_decode(p)
            g = s.choice()
            if g >= 0:
                try:
                    (ctx.start_prefill if ph == WAIT_PREFILL else ctx.start_decode)(r, g)
                    return
                except ActionError as e:  # only KV space may refuse a member of the set
                    assert "KV" in str(e), e
        if x < 0.9:
            ctx.enqueue(r, rng.choice(self.queues), front=rng.random() < 0.3)
        # else: leave it to the default placement

    def _pull(self, ctx: Context) -> None:
        rng = ctx.rng
        for _ in range(rng.randrange(3)):
            q = rng.choice(self.queues)
            cls = rng.randrange(-1, ctx.n_classes)
            r = ctx.head(q, cls)
            if r >= 0:
                assert ctx.req_queue(r) == q and (cls < 0 or ctx.req_class(r) == cls)
                self._place(ctx, r)

    def on_arrival(self, ctx, r):
        self._place(ctx, r)

    def on_prefill_done(self, ctx, r, g):
        assert ctx.req_phase(r) == WAIT_DECODE and ctx.gpu_prefill(g) != r
        self._place(ctx, r)

    def on_decode_done(self, ctx, r, g):
        assert ctx.req_gpu(r) == -1 or ctx.req_gpu(r) == g

    def on_abandon(self, ctx, r, q):
        assert q in self.queues

    def on_preempt(self, ctx, r, g):
        assert ctx.req_phase(r) == WAIT_PREFILL
        if ctx.rng.random() < 0.5:
            ctx.enqueue(r, ctx.rng.choice(self.queues), front=True)

    def on_slot_freed(self, ctx, g):
        self._pull(ctx)

    def on_tick(self, ctx):
        rng = ctx.rng
        q = rng.choice(self.queues)
        reqs = ctx.queue_requests(q)
        if reqs:
            r = rng.choice(reqs)  # not necessarily the head: a mid-queue move or start
            self._place(ctx, r)
        self._pull(ctx)


@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 5))
    B = draw(st.integers(1, 4))
    I = draw(st.integers(1, 3))
    service = draw(st.sampled_from(["markov", "tokens"]))
    kv = None
    kap = 0.0
    if service == "tokens" and draw(st.booleans()):
        kv = float(draw(st.integers(30, 400)))
        kap = draw(st.sampled_from([0.0, 1e-5]))
    gpu = GPUProfile(alpha=draw(st.floats(0.005, 0.03)), beta=draw(st.floats(0.0, 1e-3)),
                     tau_solo=draw(st.floats(0.005, 0.03)), chunk=draw(st.integers(1, 64)), batch=B,
                     kv_capacity=kv, kv_time_per_token=kap)
    classes = []
    for i in range(I):
        lengths = draw(st.sampled_from(["exponential", "fixed", "lognormal"]))
        sig = {"prompt_sigma": 0.8, "decode_sigma": 0.6} if lengths == "lognormal" else {}
        classes.append(RequestClass(
            f"c{i}", prompt=draw(st.floats(1.0, 120.0)), decode=draw(st.floats(1.0, 80.0)),
            rate=draw(st.floats(0.2, 6.0)) * n, patience=draw(st.sampled_from([0.0, 0.3, 2.0])),
            lengths=lengths, **sig,
        ))
    sc = Scenario(gpu=gpu, gpus=n, classes=tuple(classes), prefill_price=0.1, decode_price=0.2)
    return sc, service


CONTROLLERS = {
    "chaos": lambda: ChaosController(chunked=True),
    "chaos-stall": lambda: ChaosController(chunked=False, tick=None),
    "fi-wsp": FIWSP,
    "round-robin": lambda: RoundRobin(chunked=False),
    "round-robin-chunked": lambda: RoundRobin(chunked=True),
    "reserved": ReservedPrefillFCFS,
}


@pytest.mark.integration
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.sampled_from(sorted(CONTROLLERS)), st.integers(0, 2**31 - 1))
def test_conservation_every_event(sc_service, ctrl_name, seed):
    sc, service = sc_service
    if ctrl_name == "reserved" and sc.gpu.batch < 2:
        ctrl_name = "fi-wsp"
    ctrl = CONTROLLERS[ctrl_name]()
    res = simulate(sc, ctrl, horizon=12.0, warmup=2.0, seed=seed, service=service, check=True, batches=2)
    t = res.totals
    assert t["requests"] == t["completed"] + t["abandoned"] + t["dropped"] + t["in_system"]
    assert t["abandoned"] == t["abandoned_prefill"] + t["abandoned_decode"]
    if service == "markov" or sc.gpu.kv_capacity is None:
        assert t["preemptions"] == 0 and t["dropped"] == 0
    assert res.events > 0


def _small():
    return fluidopt.default_scenario(gpus=6)


def test_same_seed_same_numbers_bit_for_bit(tmp_path):
    runs = []
    for k in range(2):
        path = tmp_path / f"r{k}.csv"
        res = simulate(_small(), "fi-wsp", horizon=150.0, warmup=20.0, seed=42, records=path, sample_interval=5.0)
        s = res.summary()
        s.pop("wall_seconds")
        s.pop("requests_per_wall_second")
        s.pop("records")
        runs.append((json.dumps(s, sort_keys=True), path.read_bytes(), res.timeseries, res.batches))
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] == runs[1][1]
    pd.testing.assert_frame_equal(runs[0][2], runs[1][2], check_exact=True)
    pd.testing.assert_frame_equal(runs[0][3], runs[1][3], check_exact=True)
    other = simulate(_small(), "fi-wsp", horizon=150.0, warmup=20.0, seed=43)
    assert other.summary()["revenue_per_gpu"] != json.loads(runs[0][0])["revenue_per_gpu"]


@pytest.mark.slow  # 3-4 s each on the pure-Python engine; it meets these scenarios in test_sim_backends.py instead
@pytest.mark.integration
@pytest.mark.parametrize("service", ["markov", "tokens"])
def test_littles_law_long_run(service):
    """L = lambda W per class, for the whole system and for the prefill queue (within 2%)."""
    sc = fluidopt.default_scenario(gpus=10)
    res = simulate(sc, "fi-wsp", horizon=9000.0, warmup=500.0, seed=3, service=service)
    n = sc.gpus
    for name, row in res.per_class.iterrows():
        L = (row.x_mean + row.y_mixed_mean + row.y_solo_mean + row.q_prefill_mean + row.q_decode_mean) * n
        lam = row.arrival_rate * n
        assert L == pytest.approx(lam * row.sojourn_mean, rel=0.02), name
        assert row.q_prefill_mean * n == pytest.approx(lam * row.wait_prefill_mean, rel=0.02), name
        # throughput balance: arrivals = completions + abandonments (+ growth of the backlog, small)
        assert row.arrival_rate == pytest.approx(row.throughput + row.abandonment_rate, rel=0.02), name


def test_occupancy_bounds_and_pools():
    """Time averages respect the capacity constraints of the fluid model (docs/model.md)."""
    sc = fluidopt.default_scenario(gpus=20)
    res = simulate(sc, "fi-wsp", horizon=600.0, warmup=100.0, seed=8)
    pc = res.per_class
    X = pc.x_mean.sum()
    assert X <= 1 + 1e-12
    assert pc.y_mixed_mean.sum() <= (sc.gpu.batch - 1) * X + 1e-9
    assert pc.y_solo_mean.sum() <= sc.gpu.batch * (1 - X) + 1e-9
    assert res.cluster["mixed_gpu_fraction"] == pytest.approx(X)
    assert 0 <= res.cluster["slot_utilisation"] <= 1


def test_warmup_excluded():
    """Metrics depend only on the window: a run with warm-up W equals the same run's post-W batches."""
    sc = _small()
    a = simulate(sc, "fi-wsp", horizon=200.0, warmup=100.0, seed=9, batches=2)
    b = simulate(sc, "fi-wsp", horizon=200.0, warmup=0.0, seed=9, batches=4)
    # same sample path (same seed); window [100, 200) = b's last two batches
    tp_a = a.batches["throughput[all]"].to_numpy()
    tp_b = b.batches["throughput[all]"].to_numpy()[2:]
    np.testing.assert_allclose(tp_a, tp_b, rtol=1e-12)
    assert a.cluster["throughput"] == pytest.approx(tp_b.mean(), rel=1e-12)


def test_markov_rejects_kv_model():
    sc = _small()
    sc = replace(sc, gpu=replace(sc.gpu, kv_capacity=1000.0))
    with pytest.raises(fluidopt.ScenarioError, match="markov"):
        simulate(sc, "fi-wsp", horizon=10.0)


def test_interrupt_returns_partial_result(tmp_path):
    class Stop(FIWSP):
        tick_interval = 5.0

        def on_tick(self, ctx):
            if ctx.now >= 30.0:
                raise KeyboardInterrupt

    path = tmp_path / "rec.csv"
    res = simulate(_small(), Stop(), horizon=100.0, warmup=10.0, seed=1, records=path)
    assert res.interrupted
    assert res.t_end == pytest.approx(30.0)
    assert math.isfinite(res.cluster["revenue_per_gpu"])
    rec = pd.read_csv(path)  # complete file, renamed into place
    t = res.totals
    assert len(rec) == t["requests"] == t["completed"] + t["abandoned"] + t["in_system"]
    assert not list(tmp_path.glob(".*part"))


def test_sigint_stops_between_events_and_keeps_every_record(tmp_path):
    import os
    import signal

    class Ctrl(FIWSP):
        tick_interval = 1.0

        def on_tick(self, ctx):
            if ctx.now >= 30.0 and not getattr(self, "sent", False):
                self.sent = True
                os.kill(os.getpid(), signal.SIGINT)  # as a user's Ctrl-C

    # A suite run in the background inherits SIGINT ignored (the engine then rightly leaves it alone):
    # give this test the interpreter's default Ctrl-C handler, whatever the suite started with.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        before = signal.getsignal(signal.SIGINT)
        path = tmp_path / "rec.csv"
        res = simulate(_small(), Ctrl(), horizon=1000.0, warmup=10.0, seed=3, records=path)
        assert signal.getsignal(signal.SIGINT) is before  # the caller's handler is restored
    finally:
        signal.signal(signal.SIGINT, inherited)
    assert res.interrupted and 30.0 <= res.t_end < 60.0
    rec = pd.read_csv(path)
    t = res.totals
    assert len(rec) == t["requests"] == t["completed"] + t["abandoned"] + t["in_system"]
    assert (rec.outcome == "in_system").sum() == t["in_system"]
