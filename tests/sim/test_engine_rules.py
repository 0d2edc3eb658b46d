"""Engine rules of docs/simulator.md checked on hand timelines (tokens mode, fixed trace, no randomness).

The counts a controller sees (section 4: n_prefill, n_decode_mixed, n_decode_solo per class) follow
from section 1: a GPU is *mixed* while a prefill runs on it and *solo* otherwise, and its decodes are
counted under the GPU's mode at that moment.
"""

from __future__ import annotations

import warnings

import pandas as pd
from builders import hand_scenario

from fluidopt.control.paper_baselines import FIWSP
from fluidopt.core.model import GPUProfile, RequestClass, Scenario
from fluidopt.sim.api import simulate
from fluidopt.workloads import TraceWarning, TraceWorkload


def _scenario(n=1, batch=4):
    # tau_mix = 0.01 + 0.001 * 16 = 0.026 s per chunk, tau_solo = 0.01 s
    return hand_scenario(n, batch, tau_solo=0.01, chunk=16, classes=("a", "b"), prompt=16, decode=4, lengths="fixed")


class _Counts(FIWSP):
    """FI-WSP that writes down the per-class counts after each of its own prefill-done decisions."""

    def setup(self, ctx):
        super().setup(ctx)
        self.log = []

    def _snap(self, ctx, what):
        self.log.append((what, round(ctx.now, 9),
                         tuple(ctx.n_prefill(i) for i in range(2)),
                         tuple(ctx.n_decode_mixed(i) for i in range(2)),
                         tuple(ctx.n_decode_solo(i) for i in range(2))))

    def on_prefill_done(self, ctx, r, g):
        super().on_prefill_done(ctx, r, g)
        self._snap(ctx, f"prefill_done[{ctx.req_class(r)}]")

    def on_arrival(self, ctx, r):
        super().on_arrival(ctx, r)
        self._snap(ctx, f"arrival[{ctx.req_class(r)}]")


def _run(ctrl, rows, horizon=5.0):
    sc = _scenario()
    wl = TraceWorkload(pd.DataFrame(rows, columns=["time", "prompt", "output", "cls"]), sc.class_names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        return simulate(sc, ctrl, horizon=horizon, service="tokens", workload=wl, batches=2, check=True)


def test_decodes_are_counted_under_their_gpus_mode():
    # b (class 1, 40 output tokens) arrives at 0 and prefills in one chunk [0, 0.026); its decode then
    # runs solo. a (class 0) arrives at 0.05, mid-iteration: it joins at the next boundary of the GPU
    # and prefills for one chunk; when a's prefill ends both decodes run on a solo GPU.
    ctrl = _Counts()
    res = _run(ctrl, [(0.0, 16, 40, 1), (0.05, 16, 4, 0)])
    assert res.totals["completed"] == 2
    log = ctrl.log
    assert log[0] == ("arrival[1]", 0.0, (0, 1), (0, 0), (0, 0))  # prefill started at once (idle GPU)
    assert log[1] == ("prefill_done[1]", 0.026, (0, 0), (0, 0), (0, 1))
    what, t, pre, mixed, solo = log[2]
    assert what == "arrival[0]" and t == 0.05
    # a holds its slot from the assignment on; b decodes (mixed or solo: a's prefill joins at the next
    # boundary, 0.056, and the docs do not fix the mode of the few ms in between)
    assert pre == (1, 0) and mixed[0] == solo[0] == 0 and mixed[1] + solo[1] == 1
    what, t, pre, mixed, solo = log[3]
    assert what == "prefill_done[0]"
    assert pre == (0, 0) and mixed == (0, 0) and solo == (1, 1)


def _one_class(kv=None):
    gpu = GPUProfile(alpha=0.01, beta=0.001, tau_solo=0.01, chunk=16, batch=4, kv_capacity=kv)
    cl = (RequestClass("a", prompt=16, decode=4, rate=1.0, patience=0.0, lengths="fixed"),)
    return Scenario(gpu=gpu, gpus=1, classes=cl, prefill_price=1.0, decode_price=1.0)


def _run_one(sc, ctrl, rows, horizon=1.0):
    wl = TraceWorkload(pd.DataFrame(rows, columns=["time", "prompt", "output", "cls"]), sc.class_names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        return simulate(sc, ctrl, horizon=horizon, service="tokens", workload=wl, batches=2, check=True)


def test_a_finished_prefill_the_controller_queued_is_not_also_buffered():
    # section 4: a finished prefill the controller neither places nor queues goes to DECODE_QUEUE; one
    # it queued itself (here: back in PREFILL_QUEUE, queue 0) stays where it was put.
    from fluidopt.control.protocol import DECODE_QUEUE, PREFILL_QUEUE, Controller

    class Park(Controller):
        seen = None

        def on_arrival(self, ctx, r):
            ctx.start_prefill(r, 0)

        def on_prefill_done(self, ctx, r, g):
            ctx.enqueue(r, PREFILL_QUEUE)
            self.r = r

        def on_slot_freed(self, ctx, g):
            self.seen = (ctx.req_queue(self.r), ctx.qlen(PREFILL_QUEUE), ctx.qlen(DECODE_QUEUE))

    c = Park()
    res = _run_one(_one_class(), c, [(0.0, 16, 4, 0)])
    assert c.seen == (PREFILL_QUEUE, 1, 0)
    assert res.totals["in_system"] == 1


def test_kv_refusal_of_a_prefill_names_the_prompt():
    # KV capacity 20: the first request's decode holds 16 + generated tokens, so a second prompt of 16
    # does not fit; the ActionError says which GPU, how many tokens are free and what needed them.
    from fluidopt.control.protocol import Controller
    from fluidopt.core.errors import ActionError

    class Try(Controller):
        msgs: list = []

        def on_arrival(self, ctx, r):
            try:
                ctx.start_prefill(r, 0)
            except ActionError as e:
                self.msgs.append(str(e))

        def on_prefill_done(self, ctx, r, g):
            ctx.start_decode(r, g)

    c = Try()
    c.msgs = []
    _run_one(_one_class(kv=20), c, [(0.0, 16, 40, 0), (0.05, 16, 4, 0)])
    assert len(c.msgs) == 1
    assert "start_prefill(r=" in c.msgs[0] and "free KV tokens, the prompt needs 16" in c.msgs[0]


def test_markov_race_outlasts_one_block_of_random_numbers():
    # docs/simulator.md section 6: the race draws its uniforms from blocks of 65,536; a run with more
    # race events than one block refills the block in the middle of the loop and goes on. Whole-run
    # conservation (section 5: arrived = completed + abandoned + dropped + in_system) still holds.
    # Every request brings one arrival and at least two race events (its prefill and its decode
    # completion), so more than 100,000 events mean more than 65,536 race draws.
    gpu = GPUProfile(alpha=0.01, beta=0.001, tau_solo=0.01, chunk=16, batch=4)
    cl = (RequestClass("a", prompt=16, decode=4, rate=400.0, patience=1.0),)
    sc = Scenario(gpu=gpu, gpus=4, classes=cl, prefill_price=1.0, decode_price=1.0)
    res = simulate(sc, "fi-wsp", horizon=150.0, seed=5, service="markov", batches=2)
    t = res.totals
    assert res.events > 100_000
    assert t["requests"] == t["completed"] + t["abandoned"] + t["dropped"] + t["in_system"]
    assert t["completed"] > 0 and t["abandoned"] > 0


def test_work_started_in_on_tick_is_served_in_markov_mode():
    # section 4/10: a controller may act in on_tick; work it starts there enters the exponential race
    # at once. One request, no patience: before the tick nothing is in service (race rate 0); the
    # tick at 0.5 s starts its prefill, which must then complete (and its decode after it).
    from fluidopt.control.protocol import PREFILL_QUEUE, Controller

    class TickOnly(Controller):
        tick_interval = 0.5

        def on_tick(self, ctx):
            r = ctx.head(PREFILL_QUEUE)
            if r >= 0 and 0 in ctx.idle_prefill():
                ctx.start_prefill(r, 0)

        def on_prefill_done(self, ctx, r, g):
            ctx.start_decode(r, g)

    sc = _one_class()
    wl = TraceWorkload(pd.DataFrame([(0.1, 16, 4, 0)], columns=["time", "prompt", "output", "cls"]), sc.class_names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        res = simulate(sc, TickOnly(), horizon=20.0, service="markov", workload=wl, batches=2, seed=1, check=True)
    assert res.totals["completed"] == 1
