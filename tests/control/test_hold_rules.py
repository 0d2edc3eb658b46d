"""The hold-at-router baselines: ``max-capacity`` (Jain et al.'s definition) and ``max-capacity-reserve``.

Hand-computable cases on a trace: a request that does not fit waits at the router, the router queue is
FCFS (nothing overtakes the held head), and the head is dispatched at the instant capacity frees.
"""

from __future__ import annotations

import warnings

import pandas as pd
import pytest

from fluidopt.control.load_balancers import MaxCapacity
from fluidopt.control.registry import make_controller
from fluidopt.core.model import GPUProfile, RequestClass, Scenario
from fluidopt.sim.api import simulate
from fluidopt.workloads import TraceWorkload


def scenario(*, n: int, kv: float = 1000.0, decode_mean: float = 10.0, B: int = 8) -> Scenario:
    # alpha 0.01 s + 1e-4 s per prompt token; decode 0.02 s per iteration (no KV-time term)
    gpu = GPUProfile(alpha=0.01, beta=1e-4, tau_solo=0.02, chunk=64, batch=B, kv_capacity=kv)
    return Scenario(gpu=gpu, gpus=n, classes=(RequestClass("a", 100, decode_mean, 1.0),))


def run(sc: Scenario, policy: str, rows, horizon: float = 5.0, **opts):
    """Replay rows (time, class, prompt, output); return (controller, [(time, request index, instance)]
    of every dispatch, {request index: completion time})."""
    ctrl = make_controller(policy, sc, **opts)
    sent, done, ids = [], {}, {}
    arrive, dispatch, finished = ctrl.on_arrival, ctrl.dispatch, ctrl.on_decode_done

    def on_arrival(ctx, r):
        ids[r] = len(ids)  # arrival order (ids are not recycled in these short runs)
        arrive(ctx, r)

    def logged_dispatch(ctx, r, g):
        sent.append((ctx.now, ids[r], g))
        dispatch(ctx, r, g)

    def on_decode_done(ctx, r, g):
        done[ids[r]] = ctx.now
        finished(ctx, r, g)

    ctrl.on_arrival, ctrl.dispatch, ctrl.on_decode_done = on_arrival, logged_dispatch, on_decode_done
    frame = pd.DataFrame(rows, columns=["time", "cls", "prompt", "output"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        simulate(sc, ctrl, horizon=horizon, service="tokens", workload=TraceWorkload(frame, sc.class_names),
                 check=True, batches=2)
    return ctrl, sent, done


def test_a_request_that_does_not_fit_waits_fifo_and_goes_when_capacity_frees():
    # one instance, 1000 KV tokens (10 kept free): request 0 (prompt 600, 10 output tokens) runs; request 1
    # (prompt 500) does not fit next to it (1000 - 610 - 10 < 500) and waits at the router; request 2
    # (prompt 10) would fit but may not overtake the head (FCFS). When request 0 completes, both go at once,
    # in order.
    sc = scenario(n=1)
    ctrl, sent, done = run(sc, "max-capacity", [(0.0, 0, 600, 10), (0.1, 0, 500, 10), (0.2, 0, 10, 10)])
    assert [(i, g) for _, i, g in sent] == [(0, 0), (1, 0), (2, 0)]
    assert sent[0][0] == 0.0
    assert sent[1][0] == done[0] and sent[2][0] == done[0]  # the instant capacity frees
    assert ctrl.holds == 2
    # request 0: prefill 0.01 + 1e-4 x 600 = 0.07 s, then its decode iterations of 0.02 s
    assert done[0] == pytest.approx(0.07 + 0.02 * 10, abs=0.021)


def test_the_instance_with_most_free_capacity_that_can_process_it():
    # two instances, batch 4: request 0 (prompt 700) goes to instance 0 (a tie: the first); requests 1-3
    # (prompt 10) go to instance 1, whose free capacity min(free slots / 4, free KV / 1000) stays above
    # instance 0's ~0.29 until it holds 3 (0.25). Request 4 (prompt 400): instance 0 has the most free
    # capacity but cannot process it (1000 - 700 - generated - 10 < 400); instance 1 can, so it goes there.
    sc = scenario(n=2, B=4)
    rows = [(0.0, 0, 700, 2000), (0.05, 0, 10, 2000), (0.1, 0, 10, 2000), (0.15, 0, 10, 2000), (0.2, 0, 400, 2000)]
    ctrl, sent, _ = run(sc, "max-capacity", rows, horizon=0.5)
    assert [(i, g) for _, i, g in sent] == [(0, 0), (1, 1), (2, 1), (3, 1), (4, 1)]
    assert ctrl.holds == 0


def test_choose_prefers_free_capacity_among_the_feasible():
    class View:  # instance 0: 2 requests, 900 KV free; instance 1: 1 request, 400 free; instance 2: full batch
        batch = 4
        def instance_requests(self, g):
            return (2, 1, 4)[g]
        def gpu_kv_free(self, g):
            return (900.0, 400.0, 1000.0)[g]
        def gpu_prefill(self, g):
            return -1
        def req_prompt(self, r):
            return 300
        def req_generated(self, r):
            return 0

    mc = MaxCapacity()
    mc.n, mc.batch, mc._kvcap, mc._res, mc._start = 3, 4, 1000.0, 10.0, 0
    mc._pp = [0, 0, 0]
    # free capacity: min(slots, KV): 0 -> min(2/4, 0.9) = 0.5; 1 -> min(3/4, 0.4) = 0.4; 2 -> no slot
    assert [mc.free_capacity(View(), g) for g in range(3)] == [0.5, 0.4, 0.0]
    assert mc.choose(View(), 0) == 0
    mc._start = 0
    mc._pp = [700, 0, 0]  # 700 prompt tokens queued on 0: 200 free net, the prompt (300) no longer fits
    assert mc.choose(View(), 0) == 1
    mc._pp = [700, 200, 0]  # and not on 1 either (400 - 200 - 10 < 300): nothing can process it
    assert mc.choose(View(), 0) == -1


def test_reserve_variant_holds_until_prompt_plus_predicted_output_fits():
    # one instance; request 0 (prompt 500, 50 output tokens) runs; request 1 (prompt 100, its class's mean
    # output 400 reserved). Plain max-capacity sends it at once (1000 - 500 - generated - 10 >= 100); the
    # reserving variant needs 100 + 400 = 500 > 490 - generated, so it waits for request 0 to complete.
    sc = scenario(n=1, decode_mean=400.0)
    rows = [(0.0, 0, 500, 50), (0.1, 0, 100, 50)]
    _, plain, _ = run(sc, "max-capacity", rows)
    assert [i for _, i, _ in plain] == [0, 1] and plain[1][0] == 0.1
    ctrl, res, done = run(sc, "max-capacity-reserve", rows)
    assert [i for _, i, _ in res] == [0, 1] and res[1][0] == done[0] and ctrl.holds == 1
    assert ctrl.name == "max-capacity-reserve"
    assert make_controller("max-capacity-reserve-chunked", sc).name == "max-capacity-reserve-chunked"


def test_an_empty_instance_takes_anything_and_a_cap_stops_endless_waits():
    # class mean output 5000 tokens: prompt + predicted output (5100) exceeds any 1000-token cache. The
    # reserving variant caps it at the usable cache (990), and an empty instance takes anything: request 1
    # waits for the instance to empty (request 0's completion), not for ever.
    sc = scenario(n=1, decode_mean=5000.0)
    ctrl, sent, done = run(sc, "max-capacity-reserve", [(0.0, 0, 100, 20), (0.05, 0, 100, 20)])
    assert [i for _, i, _ in sent] == [0, 1] and sent[1][0] == done[0]
