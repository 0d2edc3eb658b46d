"""A tick that does not re-plan, and a freed slot without backpressure, change nothing, not even the later decisions of the
same seed (fluidopt.control.robust, ``_MechanismEvents.on_tick`` and ``on_slot_freed``; mutation survivors #1
and #33 of issue 35).

Driven through :class:`fluidopt.control.snapshot.ClusterSnapshot` (the controller protocol in plain
Python, its ``rng`` the controller's random stream). The paper's two classes at ten times their rates on
4 GPUs: the bundled LP serves only the long-prompt class (x = (0, 0.558)), so a short-prompt request
waits with mixed prefill slots idle, a state every event leaves as it is."""

from __future__ import annotations

from dataclasses import replace

import pytest

import fluidopt
from fluidopt.control.registry import make_controller
from fluidopt.control.snapshot import ClusterSnapshot
from fluidopt.fluid import solve_fluid


def _setup(seed: int):
    base = fluidopt.default_scenario().with_gpus(4)
    s = replace(base, classes=tuple(replace(c, rate=10 * c.rate) for c in base.classes))
    sol = solve_fluid(s, "bundled")
    assert sol.x[0] == 0.0 and sol.x[1] > 0  # the short-prompt class is not admitted
    c = make_controller("backpressure-gate-and-route", s, plan=sol, overflow=False)
    assert c.resolve and c.tick_interval > 0
    snap = ClusterSnapshot(4, s.gpu.batch, s.class_names, seed=seed)
    snap.setup(c)
    return c, snap


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_tick_without_a_re_plan_leaves_the_next_decisions_unchanged(seed):
    placed = []
    for tick in (False, True):
        c, snap = _setup(seed)
        assert c.mixed_gpus == 3 and sorted(snap.idle_prefill(0)) == [0, 1, 2]
        short = snap.add_request(0, 300, 100)
        c.on_arrival(snap, short)  # waits: its class is not admitted
        assert snap.qlen(0) == 1 and snap.outbox == [("enqueue", short, 0)]
        snap.now = 1e-3
        if tick:
            plan = c._plan_now
            c.on_tick(snap)  # one arrival in 1 ms is consistent with the plan: no re-solve
            assert c._plan_now is plan and c.resolves == 0
            assert snap.outbox == [("enqueue", short, 0)]  # nothing started
        # the next arrivals of the admitted class go to idle mixed GPUs drawn from the controller's rng
        gpus = []
        for _ in range(3):
            r = snap.add_request(1, 1000, 100)
            c.on_arrival(snap, r)
            gpus += [g for (kind, rr, g) in snap.outbox if kind == "prefill" and rr == r]
        assert len(gpus) == 3 and sorted(gpus) == [0, 1, 2]
        placed.append(gpus)
    assert placed[0] == placed[1]



@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_without_backpressure_a_freed_decode_slot_draws_nothing_and_starts_nothing(seed):
    # a short-prompt request waits (not admitted) while a long-prompt request runs through; with no
    # backpressure nothing a freed decode slot changes can open the gate, so handling the freed slot
    # starts nothing and leaves the controller's random stream (the seed's later GPU choices) as it was
    base = fluidopt.default_scenario().with_gpus(4)
    s = replace(base, classes=tuple(replace(c, rate=10 * c.rate) for c in base.classes))
    c = make_controller("backpressure-gate-and-route", s, plan=solve_fluid(s, "bundled"), overflow=False,
                        backpressure=False, resolve=False)
    snap = ClusterSnapshot(4, s.gpu.batch, s.class_names, seed=seed)
    snap.setup(c)
    short = snap.add_request(0, 300, 100)
    c.on_arrival(snap, short)
    r = snap.add_request(1, 1000, 100)
    c.on_arrival(snap, r)
    g = snap.prefill_finished(r)
    c.on_prefill_done(snap, r, g)
    (h,) = [gg for (kind, rr, gg) in snap.outbox if kind == "decode" and rr == r]
    assert snap.decode_finished(r) == h
    assert snap.qlen(0) == 1 and len(snap.idle_prefill(0)) == 3  # the short request waits, mixed slots idle
    state, sent = snap.rng.getstate(), list(snap.outbox)
    c.on_slot_freed(snap, h)
    assert snap.outbox == sent and snap.qlen(0) == 1
    assert snap.rng.getstate() == state
