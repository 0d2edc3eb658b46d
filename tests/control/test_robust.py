"""Backpressure Gate-and-Route (fluidopt.control.robust): one hand-built-state test per mechanism,
the safety-staffing rule against Erlang A, the realised-window bound, and the engine invariants under
hypothesis (as for every controller)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from builders import grid01_scenario, random_fleet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fluidopt
from fluidopt import GPUProfile, RequestClass, Scenario
from fluidopt.control.protocol import DECODE_QUEUE, PREFILL_QUEUE
from fluidopt.control.registry import available, make_controller
from fluidopt.control.robust import (
    RESOLVE_ARRIVALS,
    BackpressureGateAndRoute,
    BackpressureSLIGateAndRoute,
    StaffedPrioritizeAndRoute,
    safety_mixed_gpus,
)
from fluidopt.control.snapshot import ClusterSnapshot
from fluidopt.core.errors import ScenarioError, UsageError
from fluidopt.fluid import solve_fluid
from fluidopt.fluid.realised import realised_bound, realised_classes, window_counts
from fluidopt.queueing.closed_forms import erlang_a
from fluidopt.sim.api import simulate
from fluidopt.sim.check import check_controller

SHORT, LONG = 0, 1  # paper instance: class 0 (300, 1000) is rationed, class 1 (3000, 400) served in full


def _paper(n: int = 20) -> tuple[Scenario, object]:
    s = fluidopt.default_scenario().with_gpus(n)
    return s, solve_fluid(s)


def _ctrl(n: int = 20, **kw) -> tuple[BackpressureGateAndRoute, ClusterSnapshot]:
    s, sol = _paper(n)
    opts = {"staffing": False, "resolve": False, "overflow": False, "backpressure": False, "caps": False,
            "decode_order": "fcfs", **kw}
    c = make_controller("backpressure-gate-and-route", s, plan=sol, **opts)
    snap = ClusterSnapshot(n, s.gpu.batch, s.class_names, seed=1)
    snap.setup(c)
    return c, snap


def _fill_decodes(snap: ClusterSnapshot, gpus, cls: int = SHORT) -> None:
    """Occupy every decode slot of ``gpus`` with running decodes."""
    for g in gpus:
        while g in snap.free_decode(snap.gpu_pool(g)):
            r = snap.add_request(cls, 300, 10, prefilled=True)
            snap.start_decode(r, g)


def _started(snap: ClusterSnapshot, kind: str) -> list[tuple]:
    return [a for a in snap.outbox if a[0] == kind]


def test_registered():
    assert "backpressure-gate-and-route" in available()
    assert "backpressure-sli-gate-and-route" in available()


# -- backpressure ---------------------------------------------------------------------------------
def test_backpressure_room_and_decodes_ahead_by_hand():
    c, snap = _ctrl(backpressure=True, decode_order="value")
    s, sol = _paper(20)
    r = s.rates()
    done = 20 * float(np.sum(sol.throughput))  # decode completions per second in the plan
    assert list(c._room) == pytest.approx([done / r.mu_p[SHORT], done / r.mu_p[LONG]])
    _fill_decodes(snap, range(snap.n_gpus))
    for _ in range(2):
        snap.enqueue(snap.add_request(SHORT, 300, 10, prefilled=True), DECODE_QUEUE)
    snap.enqueue(snap.add_request(LONG, 3000, 10, prefilled=True), DECODE_QUEUE)
    g = snap.idle_prefill(0).first()
    snap.start_prefill(snap.add_request(LONG, 3000, 10), g)  # one long-prompt prefill in flight
    p_ll = 1 - math.exp(-1.0)  # it finishes within one long-prompt prefill time
    p_sl = 1 - math.exp(-r.mu_p[LONG] / r.mu_p[SHORT])  # ... within one short-prompt prefill time
    # value order: long-prompt decodes first, so a long-prompt request waits behind 1 decode, a
    # short-prompt one behind all 3 (and the in-flight long prefill that finishes first)
    assert c._decodes_ahead(snap) == pytest.approx([3 + p_sl, 1 + p_ll])


@pytest.mark.parametrize("backpressure", [True, False])
def test_backpressure_no_prefill_while_decodes_wait(backpressure):
    # A decode buffer longer than the slots the plan frees during a prefill, and no free decode slot:
    # with backpressure no prefill starts although reserved prefill slots are idle and classes with
    # x* > 0 wait; without it, they start.
    c, snap = _ctrl(backpressure=backpressure)
    _fill_decodes(snap, range(snap.n_gpus))
    for _ in range(10):  # room of the long-prompt class: 6.8 decodes at n = 20
        snap.enqueue(snap.add_request(LONG, 3000, 10, prefilled=True), DECODE_QUEUE)
    snap.outbox.clear()
    assert len(snap.idle_prefill(0)) > 0
    for cls, prompt in ((LONG, 3000), (SHORT, 300)):
        c.on_arrival(snap, snap.add_request(cls, prompt, 10))
    assert len(_started(snap, "prefill")) == (0 if backpressure else 2)


def test_backpressure_admits_when_a_decode_slot_is_free():
    c, snap = _ctrl(backpressure=True)
    _fill_decodes(snap, range(snap.n_gpus - 1))  # the last (solo) GPU keeps free slots
    r = snap.add_request(SHORT, 300, 10)
    c.on_arrival(snap, r)
    assert snap.req_gpu(r) >= 0


def test_backpressure_lifts_when_the_buffer_drains():
    c, snap = _ctrl(backpressure=True)
    _fill_decodes(snap, range(snap.n_gpus))
    waiting = [snap.add_request(LONG, 3000, 10, prefilled=True) for _ in range(10)]
    for w in waiting:
        snap.enqueue(w, DECODE_QUEUE)
    r = snap.add_request(LONG, 3000, 10)
    c.on_arrival(snap, r)
    assert snap.req_queue(r) == PREFILL_QUEUE
    for w in waiting:  # the waiting decodes give up: the buffer empties
        snap.abandon(w)
        c.on_abandon(snap, w, DECODE_QUEUE)
    assert snap.req_gpu(r) >= 0  # the held-back prefill started


# -- caps -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("caps", [True, False])
def test_cap_holds_the_rationed_class_at_ceil_n_x(caps):
    c, snap = _ctrl(n=20, caps=caps)
    cap = math.ceil(20 * float(c.x[SHORT]))  # n x_1* = 0.37: cap 1
    assert cap == 1
    for _ in range(cap + 1):
        c.on_arrival(snap, snap.add_request(SHORT, 300, 10))
    running = snap.n_prefill(SHORT)
    assert running == (cap if caps else cap + 1)
    # the class served in full has no cap: it takes the remaining reserved slots
    for _ in range(3):
        c.on_arrival(snap, snap.add_request(LONG, 3000, 10))
    assert snap.n_prefill(LONG) == 3


# -- safety staffing ------------------------------------------------------------------------------
def test_safety_staffing_is_the_erlang_a_marginal_rule():
    s, sol = _paper(500)
    r = s.rates()
    v = float(sol.duals["solo_decode_capacity"])
    extra = safety_mixed_gpus(500, sol.x, r.lam, r.mu_p, r.theta, r.w, v)
    # recompute the rule by hand: the long-prompt class (served in full) queues on the slots left by
    # the short-prompt class's cap, one M/M/c+M queue
    M = math.ceil(500 * float(np.sum(sol.x)) - 1e-9)
    c0 = M - math.ceil(500 * float(sol.x[SHORT]) - 1e-9)
    L, a = 500 * r.lam[LONG], 500 * float(sol.x[LONG])
    gain = [float(r.w[LONG]) * L * (erlang_a(L, L / a, c0 + k, r.theta[LONG]).p_abandon
                                    - erlang_a(L, L / a, c0 + k + 1, r.theta[LONG]).p_abandon) for k in range(40)]
    expected = next(k for k, g in enumerate(gain) if g <= v)
    assert extra == expected
    assert 0 < extra <= 3 * math.sqrt(a) + 3  # square-root order
    # a free decode slot costs nothing: staff to the limit; a priceless one: staff none
    assert safety_mixed_gpus(500, sol.x, r.lam, r.mu_p, r.theta, r.w, 1e12) == 0
    assert safety_mixed_gpus(500, sol.x, r.lam, r.mu_p, r.theta, r.w, 0.0) == math.ceil(3 * math.sqrt(a)) + 3
    c = BackpressureGateAndRoute(s, sol, staffing=True)
    assert c.plan_mixed_gpus(500) == M + extra
    assert BackpressureGateAndRoute(s, sol, staffing=False).plan_mixed_gpus(500) == M


def test_no_staffing_without_a_class_served_in_full():
    x = [0.1, 0.1]
    lam = [10.0, 10.0]  # mu_p x = 0.1 * 1 << lam: both rationed
    assert safety_mixed_gpus(100, x, lam, [1.0, 1.0], [0.1, 0.1], [1.0, 1.0], 0.0) == 0


# -- decode buffer order --------------------------------------------------------------------------
@pytest.mark.parametrize("order,first", [("value", LONG), ("fcfs", SHORT)])
def test_decode_buffer_serves_the_highest_c_mu_over_theta_class_first(order, first):
    c, snap = _ctrl(decode_order=order)
    # w mu_s / theta: short 230 * 45.45/1000, long 380 * 45.45/400: long first
    _fill_decodes(snap, range(snap.n_gpus))
    a = snap.add_request(SHORT, 300, 10, prefilled=True)
    b = snap.add_request(LONG, 3000, 10, prefilled=True)
    snap.enqueue(a, DECODE_QUEUE)
    snap.enqueue(b, DECODE_QUEUE)
    g = snap.n_gpus - 1  # a solo GPU
    done = snap.gpu_requests(g)[0]
    snap.decode_finished(done)
    snap.outbox.clear()
    c.on_slot_freed(snap, g)
    started = [r for (_, r, _) in _started(snap, "decode")]
    assert started == [b if first == LONG else a]


# -- overflow (moving capacity between mixed and solo) --------------------------------------------
@pytest.mark.parametrize("max_overflow,expected", [(None, 1), (0, 0)])
def test_overflow_prefill_on_a_free_solo_slot_when_reserved_slots_are_busy(max_overflow, expected):
    c, snap = _ctrl(overflow=True, max_overflow=max_overflow)
    M = c.mixed_gpus
    for g in range(M):  # every reserved slot runs a long-prompt prefill
        r = snap.add_request(LONG, 3000, 10)
        snap.start_prefill(r, g)
    _fill_decodes(snap, range(M, snap.n_gpus - 1))  # one solo GPU keeps free slots
    snap.outbox.clear()
    r = snap.add_request(LONG, 3000, 10)
    c.on_arrival(snap, r)
    pre = _started(snap, "prefill")
    assert len(pre) == expected
    if expected:
        assert pre[0][2] == snap.n_gpus - 1
        assert c.overflowing == 1
        snap.prefill_finished(r)
        c.on_prefill_done(snap, r, snap.n_gpus - 1)
        assert c.overflowing == 0


def test_a_rationed_class_does_not_overflow_where_mixing_slows_decodes():
    # paper GPU: gamma tau = 1.5 > 1, and the short-prompt class is rationed: it never overflows
    c, snap = _ctrl(overflow=True)
    assert list(c._may_overflow) == [False, True]
    for g in range(c.mixed_gpus):
        snap.start_prefill(snap.add_request(LONG, 3000, 10), g)
    snap.outbox.clear()
    c.on_arrival(snap, snap.add_request(SHORT, 300, 10))
    assert _started(snap, "prefill") == []


# -- rolling re-solve -----------------------------------------------------------------------------
def test_resolve_only_when_rates_leave_the_plan():
    c, snap = _ctrl(resolve=True)
    s, _ = _paper(20)
    T = c.tick_interval
    lam = s.rates().lam * 20  # cluster rates
    assert T == pytest.approx(max(RESOLVE_ARRIVALS / lam.sum(), 1 / 0.1))
    x0 = np.array(c.x)
    # arrivals exactly at the plan's rates: no re-solve
    c._counts = [int(round(v * T)) for v in lam]
    snap.now = T
    c.on_tick(snap)
    assert c.resolves == 0 and np.array_equal(c.x, x0)
    # the long-prompt class at twice its rate: re-solve; its target doubles while prefill capacity lasts
    c._counts = [int(round(lam[0] * T)), int(round(2 * lam[1] * T))]
    snap.now = 2 * T
    c.on_tick(snap)
    assert c.resolves == 1
    again = solve_fluid(replace(s, classes=(s.classes[0], replace(s.classes[1], rate=2 * s.classes[1].rate))))
    assert np.allclose(c.x, np.where(again.x < 1e-12, 0, again.x), atol=1e-9)
    assert c.x[LONG] == pytest.approx(2 * x0[LONG], rel=1e-6)
    # still at the new rates: no further re-solve
    snap.now = 3 * T
    c._counts = [int(round(lam[0] * T)), int(round(2 * lam[1] * T))]
    c.on_tick(snap)
    assert c.resolves == 1
    # back at the plan's rates: the original plan returns (a false alarm is undone)
    c._counts = [int(round(v * T)) for v in lam]
    snap.now = 4 * T
    c.on_tick(snap)
    assert c._plan_now is c.solution and np.array_equal(c.x, x0) and c.resolves == 1


# -- SLI variant ----------------------------------------------------------------------------------
def test_sli_variant_caps_the_rationed_class():
    s, _ = _paper(20)
    c = make_controller("backpressure-sli-gate-and-route", s, slis=["decode_fairness=0.5"], staffing=False,
                        average_caps=False)
    assert isinstance(c, BackpressureSLIGateAndRoute)
    snap = ClusterSnapshot(20, s.gpu.batch, s.class_names, seed=1)
    snap.setup(c)
    cap = math.ceil(20 * float(c.x[SHORT]) - 1e-9)
    for _ in range(cap + 2):
        c.on_arrival(snap, snap.add_request(SHORT, 300, 10))
    assert snap.n_prefill(SHORT) == cap


# -- elastic prefill capacity (a plan that rations every class it admits) ----------------------------
def _all_rationed(n: int = 20) -> tuple[Scenario, object]:
    """Random grid instance 01 (builders.grid01_scenario): gamma tau = 11, class 1 rationed (served
    fraction 0.55), class 2 not admitted at all (x_2* = 0)."""
    s = grid01_scenario(n, name="all-rationed")
    return s, solve_fluid(s)


def _elastic_ctrl(n: int = 20, **kw) -> tuple[BackpressureGateAndRoute, ClusterSnapshot]:
    # the elastic mechanisms act on the partition, i.e. with ``coupled`` off (on, there is none)
    s, sol = _all_rationed(n)
    opts = {"resolve": False, "coupled": False, **kw}
    c = make_controller("backpressure-gate-and-route", s, plan=sol, **opts)
    snap = ClusterSnapshot(n, s.gpu.batch, s.class_names, seed=1)
    snap.setup(c)
    return c, snap


def test_elastic_is_on_only_where_every_admitted_class_is_rationed_and_mixing_is_costly():
    s, sol = _all_rationed()
    r = s.rates()
    assert sol.x[1] == 0 and r.mu_p[0] * sol.x[0] < 0.6 * r.lam[0]  # class 1 rationed, class 2 not admitted
    assert s.gpu.gamma * s.gpu.tau_mix > 10
    c, _ = _elastic_ctrl()
    d = sol.duals
    cost = (s.gpu.batch - 1) * (d["solo_decode_capacity"] - d["mixed_decode_capacity"]) / r.mu_p[0]
    assert r.w[0] > cost  # the request is worth more than the mixed iteration at the LP's prices
    assert c._elastic_on and c._float_classes == [True, False]
    # its own in-flight prefills count in full in the backpressure sum (elastic off: 1 - exp(-1))
    assert dict(c._ahead_terms[0])[0] == 1.0
    off, _ = _elastic_ctrl(elastic=False)
    assert not off._elastic_on and dict(off._ahead_terms[0])[0] == pytest.approx(1 - math.exp(-1.0))
    # the paper instance serves its long-prompt class in full (overflow already gives it elastic
    # capacity): nothing changes there
    p, _ = _ctrl(overflow=True, backpressure=True)
    q, _ = _ctrl(overflow=True, backpressure=True, elastic=False)
    assert not p._elastic_on and p._ahead_terms == q._ahead_terms and list(p._may_overflow) == list(q._may_overflow)


@pytest.mark.parametrize("elastic, expected", [(True, 1), (False, 0)])
def test_elastic_floats_one_solo_gpu_while_every_reserved_slot_is_busy(elastic, expected):
    c, snap = _elastic_ctrl(elastic=elastic, elastic_slots=False)
    M = c.mixed_gpus
    for g in range(M):  # every reserved slot runs a class-1 prefill
        snap.start_prefill(snap.add_request(0, 2000, 10), g)
    _fill_decodes(snap, range(M, snap.n_gpus - 2), cls=0)  # two solo GPUs keep free slots
    snap.outbox.clear()
    for _ in range(3):
        c.on_arrival(snap, snap.add_request(0, 2000, 10))
    pre = _started(snap, "prefill")
    assert len(pre) == expected  # one floating GPU at most, however many solo slots are free
    if expected:
        assert pre[0][2] >= M and c.overflowing == 1
        r, g = pre[0][1], pre[0][2]
        snap.prefill_finished(r)
        c.on_prefill_done(snap, r, g)
        assert c.overflowing == 0
        # the floating GPU is free again: the next waiting class-1 request may use it
        snap.outbox.clear()
        c.on_slot_freed(snap, snap.n_gpus - 1)
        assert len(_started(snap, "prefill")) == 1


def _fill_some(snap: ClusterSnapshot, g: int, k: int, cls: int = 0) -> None:
    """Start ``k`` decodes on GPU ``g``."""
    for _ in range(k):
        snap.start_decode(snap.add_request(cls, 300, 10, prefilled=True), g)


def test_elastic_slots_room_is_the_plans_frees_during_one_prefill_less_one_sd():
    s, sol = _all_rationed()
    c, _ = _elastic_ctrl()
    n, B, M = c.n_gpus, c.batch, c.mixed_gpus
    room = n * float(np.sum(sol.throughput)) / s.rates().mu_p[0]
    assert c._slots_on and c._room[0] == pytest.approx(room)
    assert c._float_room[0] == pytest.approx(room - math.sqrt(room))
    assert c._decode_slots == M * (B - 1) + (n - M) * B
    off, _ = _elastic_ctrl(elastic_slots=False)
    assert not off._slots_on
    # on the paper instance (elastic off: a class is served in full) the option changes nothing
    p, _ = _ctrl(overflow=True, backpressure=True, elastic_slots=True)
    assert not p._slots_on


@pytest.mark.parametrize("slots, expected", [(True, 2), (False, 1)])
def test_elastic_slots_float_on_every_idle_solo_gpu_while_decode_slots_idle(slots, expected):
    # every reserved slot runs a class-1 prefill and two solo GPUs are empty (2 B free decode slots):
    # the free slots plus the room exceed the 8 in-flight prefills, so each empty GPU hosts a prefill
    # (the one-GPU rule: one)
    c, snap = _elastic_ctrl(elastic_slots=slots)
    M = c.mixed_gpus
    for g in range(M):
        snap.start_prefill(snap.add_request(0, 2000, 10), g)
    _fill_decodes(snap, range(M, snap.n_gpus - 2), cls=0)
    snap.outbox.clear()
    for _ in range(3):
        c.on_arrival(snap, snap.add_request(0, 2000, 10))
    pre = _started(snap, "prefill")
    assert len(pre) == expected and all(g >= M for _, _, g in pre) and c.overflowing == expected


@pytest.mark.parametrize("slots, expected", [(True, 0), (False, 1)])
def test_elastic_slots_no_floating_prefill_when_the_free_slots_will_be_claimed(slots, expected):
    # every reserved slot busy, the decode pool full but for one slot on each of two solo GPUs: the 2
    # free slots plus the room less one sd (7.69 - 2.77) are fewer than the 8 prefills in flight, which
    # will want those slots first, so no prefill floats (the one-GPU rule would start one)
    c, snap = _elastic_ctrl(elastic_slots=slots)
    M, B, n = c.mixed_gpus, c.batch, snap.n_gpus
    for g in range(M):
        snap.start_prefill(snap.add_request(0, 2000, 10), g)
    _fill_decodes(snap, range(n - 2), cls=0)  # the mixed GPUs' decode slots too
    for g in (n - 2, n - 1):
        _fill_some(snap, g, B - 1)
    assert c._room[0] - math.sqrt(c._room[0]) + 2 <= M  # the hand-built state is the case the rule refuses
    snap.outbox.clear()
    c.on_arrival(snap, snap.add_request(0, 2000, 10))
    assert len(_started(snap, "prefill")) == expected


@pytest.mark.parametrize("coupled", [True, False])
def test_elastic_keeps_the_engine_invariants_on_an_all_rationed_plan(coupled):
    # protocol, invariants, conservation, liveness and determinism in both services (the snapshot drive
    # expects every request served, and this plan never admits class 2)
    s, _ = _all_rationed(20)
    rep = check_controller("backpressure-gate-and-route", s, horizon=30.0, snapshot=False, coupled=coupled)
    assert "determinism (tokens)" in rep.checks


# -- coupled decode slots (no partition on a plan that rations every class it admits) -----------------
def _coupled_ctrl(n: int = 20, **kw) -> tuple[BackpressureGateAndRoute, ClusterSnapshot]:
    s, sol = _all_rationed(n)
    c = make_controller("backpressure-gate-and-route", s, plan=sol, **{"resolve": False, **kw})
    snap = ClusterSnapshot(n, s.gpu.batch, s.class_names, seed=1)
    snap.setup(c)
    return c, snap


def test_coupled_declares_one_pool_only_where_elastic_would_act():
    c, snap = _coupled_ctrl()
    n, B = snap.n_gpus, c.batch
    assert c._coupled_on and c.mixed_gpus == n and not c._has_solo and c._max_overflow == 0
    # every GPU may prefill into one of its B slots (no reserved slot); elastic has nothing to float
    assert all(snap.gpu_prefill_allowed(g) and snap.gpu_max_decodes(g) == B for g in range(n))
    assert not c._elastic_on and not c._slots_on
    off, osnap = _coupled_ctrl(coupled=False)
    assert not off._coupled_on and off.mixed_gpus < n and off._elastic_on
    assert osnap.gpu_max_decodes(0) == B - 1 and osnap.gpu_max_decodes(n - 1) == B
    # a partition the user fixes is kept
    fixed, _ = _coupled_ctrl(mixed_gpus=5)
    assert not fixed._coupled_on and fixed.mixed_gpus == 5
    # the paper instance serves its long-prompt class in full: the partition stays, bit for bit
    p, _ = _ctrl(overflow=True, backpressure=True, elastic=True, coupled=True)
    q, _ = _ctrl(overflow=True, backpressure=True, elastic=True, coupled=False)
    from fluidopt.control.gate_handlers import STATE

    assert not p._coupled_on and p.mixed_gpus == q.mixed_gpus < 20
    live = ("_class_counts", "_queue_counts", "_queue_totals")
    plan = [a for a in STATE if not a.startswith(("_idle_", "_free_")) and a not in live]  # (each run's own)
    assert [getattr(p, a) for a in plan] == [getattr(q, a) for a in plan]  # the handlers see the same plan


def test_coupled_prefill_holds_the_slot_its_decode_takes():
    # every slot of the fleet busy but one on GPU 3: an arrival starts its prefill there, in that slot;
    # no other GPU may start one (no free slot), and GPU 3 takes no second prefill while it runs
    c, snap = _coupled_ctrl()
    n, B = snap.n_gpus, c.batch
    for g in range(n):
        if g != 7:
            _fill_some(snap, g, B - 1 if g == 3 else B)
    on7 = [snap.add_request(0, 300, 10, prefilled=True) for _ in range(B)]
    for d in on7:
        snap.start_decode(d, 7)
    snap.outbox.clear()
    for _ in range(2):
        c.on_arrival(snap, snap.add_request(0, 2000, 10))
    pre = _started(snap, "prefill")
    assert [g for _, _, g in pre] == [3] and snap.gpu_free(3) == 0 and snap.qlen(PREFILL_QUEUE) == 1
    # a decode elsewhere completes while the prefill runs: that GPU takes the waiting request's prefill
    snap.decode_finished(on7[0])
    snap.outbox.clear()
    c.on_slot_freed(snap, 7)
    assert [g for _, _, g in _started(snap, "prefill")] == [7]
    # the prefill on GPU 3 finishes with the fleet full: the slot it held takes its decode (never the
    # buffer), however full the rest of the fleet is
    r = pre[0][1]
    snap.prefill_finished(r)
    snap.outbox.clear()
    c.on_prefill_done(snap, r, 3)
    assert _started(snap, "decode") == [("decode", r, 3)] and snap.qlen(DECODE_QUEUE) == 0


# -- time-averaged caps (SLI-aware variant) -----------------------------------------------------------
def _sli_ctrl(n: int = 20, **kw) -> tuple[BackpressureSLIGateAndRoute, ClusterSnapshot]:
    s, _ = _paper(n)
    c = make_controller("backpressure-sli-gate-and-route", s, slis=["decode_fairness=0.5"], **kw)
    snap = ClusterSnapshot(n, s.gpu.batch, s.class_names, seed=1)
    snap.setup(c)
    return c, snap


def test_average_cap_admits_the_fractional_slot_only_while_the_occupancy_integral_is_negative():
    c, snap = _sli_ctrl(20)
    nx = 20 * float(c.x[SHORT])
    assert 0 < nx < 1  # n x_1* = 0.25: the integer cap would be 1, the floor 0
    snap.now = 0.0
    c.on_arrival(snap, snap.add_request(SHORT, 300, 10))
    assert snap.n_prefill(SHORT) == 0  # integral 0: no credit yet
    snap.now = 2.0  # two seconds at X_1 = 0: integral -0.5 slot-seconds, bounded below by one mean
    # class-1 prefill of the target (n x_1* / mu_p,1 = 0.0096 slot-seconds)
    floor = -nx / float(c._rates.mu_p[SHORT])
    c.on_arrival(snap, snap.add_request(SHORT, 300, 10))
    assert snap.n_prefill(SHORT) == 1
    assert c._avg_int[SHORT] == pytest.approx(max(-2.0 * nx, floor)) == pytest.approx(floor)
    # one second later, after the prefill ran at X_1 = 1: integral floor + 0.75 > 0, no second slot
    # even though the first is done
    snap.now = 3.0
    r = snap.head(PREFILL_QUEUE, SHORT)
    first = [a for a in snap.outbox if a[0] == "prefill"][0][1]
    snap.prefill_finished(first)
    c.on_prefill_done(snap, first, [a for a in snap.outbox if a[0] == "prefill"][0][2])
    assert c._avg_int[SHORT] == pytest.approx(floor + (1 - nx))
    c.on_arrival(snap, snap.add_request(SHORT, 300, 10))
    assert snap.n_prefill(SHORT) == 0 and r >= 0
    # the credit is bounded below: a long idle spell banks at most one mean prefill of the target
    snap.now = 1e6
    c.on_arrival(snap, snap.add_request(SHORT, 300, 10))
    assert c._avg_int[SHORT] == pytest.approx(floor)


@pytest.mark.integration
def test_average_caps_hold_the_rationed_class_at_its_target_and_close_the_fairness_gap():
    # paper instance with decode fairness 0.5 (y_s* = (4.9, 4.4)), n = 200, 800 s: the time average of
    # X_1/n is x_1* (the integer cap runs 20% above), and the y_s gap is much closer to the SLI's 0.5
    s, _ = _paper(200)
    sol = solve_fluid(s, "bundled", ["decode_fairness=0.5"])
    out = {}
    for avg in (True, False):
        c = make_controller("backpressure-sli-gate-and-route", s, plan=sol, average_caps=avg)
        res = simulate(s, c, horizon=800.0, warmup=200.0, seed=0)
        pc = res.per_class
        out[avg] = (float(pc["x_mean"].iloc[SHORT]), float(np.ptp(pc["y_solo_mean"].to_numpy())))
    assert out[True][0] == pytest.approx(float(sol.x[SHORT]), rel=0.02)
    assert out[False][0] > 1.1 * float(sol.x[SHORT])
    assert out[True][1] < 0.85 < 1.5 < out[False][1]


# -- separate pricing: staffed Prioritize-and-Route -------------------------------------------------
def _staffed(n: int = 20, **kw) -> tuple[StaffedPrioritizeAndRoute, ClusterSnapshot]:
    s = fluidopt.default_scenario().with_gpus(n)
    opts = {"staffing": False, "resolve": False, "overflow": False, **kw}
    c = make_controller("staffed-prioritize-and-route", s, plan=solve_fluid(s, "separate"), **opts)
    snap = ClusterSnapshot(n, s.gpu.batch, s.class_names, seed=1)
    snap.setup(c)
    return c, snap


def test_staffed_prioritize_and_route_staffing_prices_a_mixed_gpu_by_the_separate_lp():
    s = fluidopt.default_scenario().with_gpus(50)
    sol = solve_fluid(s, "separate")
    r = s.rates()
    c = make_controller("staffed-prioritize-and-route", s, plan=sol)
    assert isinstance(c, StaffedPrioritizeAndRoute) and "staffed-prioritize-and-route" in available()
    # by hand: both classes are prefilled in full by the separate LP, so they pool into one M/M/c+M
    # queue on all M reserved slots; a served arrival is worth its prefill-balance dual; a mixed GPU
    # costs the solo decode slot v_s, plus (B - 1)(v_s - v_m) per second while its prefill slot works,
    # which is the saved work L dP / mu
    d = sol.duals
    value = np.array([d[f"prefill_balance[{nm}]"] for nm in s.class_names])
    v_s, v_m, B = d["solo_decode_capacity"], d["mixed_decode_capacity"], s.gpu.batch
    M = math.ceil(50 * float(np.sum(sol.x)) - 1e-9)
    L, a = 50 * float(np.sum(r.lam)), 50 * float(np.sum(sol.x))
    w = float(r.lam @ value / r.lam.sum())
    extra = 0
    while True:
        saved = L * (erlang_a(L, L / a, M + extra, 0.1).p_abandon - erlang_a(L, L / a, M + extra + 1, 0.1).p_abandon)
        if w * saved <= v_s + (B - 1) * (v_s - v_m) * saved / (L / a):
            break
        extra += 1
    assert extra >= 1
    assert c.plan_mixed_gpus(50) == M + extra
    snap = ClusterSnapshot(50, B, s.class_names, seed=1)
    snap.setup(c)
    assert c.mixed_gpus == M + extra and len(snap.idle_prefill(0)) == M + extra
    # the busy cost counts only for the work an extra GPU saves: a prohibitive one staffs none
    assert safety_mixed_gpus(50, sol.x, r.lam, r.mu_p, r.theta, value, v_s, busy_cost=1e9) == 0
    assert make_controller("staffed-prioritize-and-route", s, plan=sol, staffing=False).plan_mixed_gpus(50) == M


def test_staffed_prioritize_and_route_gate_and_overflow_on_a_hand_built_state():
    c, snap = _staffed(overflow=True)
    M = c.mixed_gpus
    assert list(c._may_overflow) == [True, True]  # both classes are prefilled in full by the separate LP
    for g in range(M - 1):  # all reserved slots but one run long-prompt prefills
        snap.start_prefill(snap.add_request(LONG, 3000, 10), g)
    _fill_decodes(snap, range(M, snap.n_gpus - 1))  # one solo GPU keeps free slots
    snap.outbox.clear()
    long_r = snap.add_request(LONG, 3000, 10)
    snap.enqueue(long_r, PREFILL_QUEUE)
    short_r = snap.add_request(SHORT, 300, 10)
    c.on_arrival(snap, short_r)
    # Prioritize-and-Route's gate: the last reserved slot goes to the largest D/P (short prompt), though
    # the long-prompt request waited first
    assert snap.req_gpu(short_r) == M - 1
    # the long-prompt request overflows onto the free solo slot, and only there
    c._try_overflow(snap)
    assert snap.req_gpu(long_r) == snap.n_gpus - 1 and c.overflowing == 1
    assert [a[2] for a in _started(snap, "prefill")] == [M - 1, snap.n_gpus - 1]


def test_staffed_prioritize_and_route_with_every_mechanism_off_is_prioritize_and_route():
    s = fluidopt.default_scenario().with_gpus(20)
    sol = solve_fluid(s, "separate")
    base = simulate(s, "prioritize-and-route", horizon=120.0, warmup=20.0, seed=4)
    off = simulate(s, make_controller("staffed-prioritize-and-route", s, plan=sol, staffing=False, overflow=False,
                                      resolve=False), horizon=120.0, warmup=20.0, seed=4)
    assert off.events == base.events
    assert off.cluster["revenue_per_gpu_separate"] == base.cluster["revenue_per_gpu_separate"]
    with pytest.raises(ScenarioError, match="separate"):
        make_controller("staffed-prioritize-and-route", s, plan=solve_fluid(s))


# -- options ----------------------------------------------------------------------------------------
def test_bad_options_name_the_field():
    s, sol = _paper(5)
    with pytest.raises(ScenarioError, match="decode_order"):
        make_controller("backpressure-gate-and-route", s, plan=sol, decode_order="lifo")
    with pytest.raises(ScenarioError, match="max_overflow"):
        make_controller("backpressure-gate-and-route", s, plan=sol, max_overflow=-1)
    with pytest.raises(ScenarioError, match="caps"):
        make_controller("backpressure-gate-and-route", s, plan=sol, caps="yes")
    with pytest.raises(ScenarioError, match="pricing"):
        make_controller("backpressure-gate-and-route", s, plan=solve_fluid(s, "separate"))


# -- realised-window bound --------------------------------------------------------------------------
def test_realised_classes_and_bound_from_a_window():
    import pandas as pd

    s, sol = _paper(10)
    arr = pd.DataFrame({"time": [0.5, 1.0, 2.0, 2.5, 3.0, 9.0], "cls": [0, 1, 0, 0, 1, 1],
                        "prompt": [100, 2000, 300, 500, 4000, 1], "output": [10, 20, 30, 50, 40, 1]})
    assert window_counts(arr, 2, 1.0, 3.5).tolist() == [2, 2]
    cl = realised_classes(s, arr, 1.0, 3.0)  # [1, 3): rows at 1.0, 2.0, 2.5
    assert cl[0].rate == pytest.approx(2 / 2.0) and cl[1].rate == pytest.approx(1 / 2.0)
    assert cl[0].prompt == pytest.approx(400.0) and cl[0].decode == pytest.approx(40.0)
    assert cl[1].prompt == pytest.approx(2000.0)
    assert cl[0].patience == s.classes[0].patience
    kept = realised_classes(s, arr, 1.0, 3.0, lengths="plan")
    assert kept[0].prompt == s.classes[0].prompt
    b = realised_bound(s, arr, 1.0, 3.0)
    direct = solve_fluid(replace(s, classes=cl))
    assert b.objective_per_gpu == pytest.approx(direct.objective_per_gpu, rel=1e-9)
    # arrivals exactly at the plan's rates and lengths give the plan's R*
    lam = [c.rate for c in s.classes]
    t = np.concatenate([np.arange(int(lam[i] * 100)) / lam[i] for i in range(2)])
    c_ = np.concatenate([np.full(int(lam[i] * 100), i) for i in range(2)])
    same = pd.DataFrame({"time": t, "cls": c_, "prompt": 1, "output": 1})
    assert realised_bound(s, same, 0.0, 100.0, lengths="plan").objective_per_gpu == pytest.approx(
        sol.objective_per_gpu, rel=1e-6)
    with pytest.raises(UsageError, match="window"):
        realised_classes(s, arr, 3.0, 1.0)


# -- engine invariants under hypothesis -------------------------------------------------------------
@st.composite
def cases(draw, policies=("backpressure-gate-and-route", "backpressure-sli-gate-and-route")):
    s, service = random_fleet(draw)
    classes = s.classes
    policy = draw(st.sampled_from(policies))
    opts: dict = {}
    if policy == "staffed-prioritize-and-route":
        opts = {"backpressure": draw(st.booleans()), "caps": draw(st.booleans()), "staffing": draw(st.booleans()),
                "decode_order": draw(st.sampled_from(("value", "fcfs"))), "overflow": draw(st.booleans()),
                "resolve": draw(st.booleans())}
    elif policy == "backpressure-gate-and-route":
        opts = {"backpressure": draw(st.booleans()), "caps": draw(st.booleans()), "staffing": draw(st.booleans()),
                "decode_order": draw(st.sampled_from(("value", "fcfs"))), "overflow": draw(st.booleans()),
                "resolve": draw(st.booleans()), "elastic": draw(st.booleans()),
                "elastic_slots": draw(st.booleans()), "coupled": draw(st.booleans())}
    else:
        opts = {"average_caps": draw(st.booleans()), "staffing": draw(st.booleans())}
        if draw(st.booleans()):
            opts["slis"] = ["decode_fairness=0.5"]
    horizon = float(min(300.0, 150.0 / sum(c.rate for c in classes)))
    return s, policy, opts, service, horizon, draw(st.integers(0, 2**16))


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@pytest.mark.integration
@given(cases())
def test_robust_controllers_keep_engine_invariants(case):
    s, policy, opts, service, horizon, seed = case
    ctrl = make_controller(policy, s, **opts)
    if getattr(ctrl, "tick_interval", None):
        ctrl.tick_interval = horizon / 5  # exercise the re-solve path inside the short run
    res = simulate(s, ctrl, horizon=horizon, warmup=0.0, seed=seed, service=service, check=True, batches=2)
    t = res.totals
    assert t["requests"] == t["completed"] + t["abandoned"] + t["dropped"] + t["in_system"]
    x = np.asarray(ctrl.solution.x)
    if not getattr(ctrl, "resolves", 0):
        assert np.all(res.per_class["x_mean"].to_numpy()[x <= 1e-12] == 0.0)
    if getattr(ctrl, "_max_overflow", 0) or ctrl.overflow:
        assert 0 <= ctrl.overflowing <= ctrl._max_overflow


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@pytest.mark.integration
@given(cases(policies=("staffed-prioritize-and-route",)))
def test_staffed_prioritize_and_route_keeps_engine_invariants(case):
    test_robust_controllers_keep_engine_invariants.hypothesis.inner_test(case)


def test_policy_grid_example_quick(tmp_path):
    # the example's --quick size, the paper family only, in this process: every policy runs and the
    # table's inputs are written
    import pandas as pd
    from builders import load_example

    mod = load_example("policy_grid")
    assert mod.main(["--quick", "--workers", "1", "--families", "paper", "--out", str(tmp_path)]) == 0
    df = pd.read_csv(tmp_path / "runs.csv")
    assert set(df["policy"]) == set(mod.POLICIES)
    assert (df["ratio"] > 0.5).all() and (df["ratio"] < 1.1).all()


def test_separate_robust_example_quick(tmp_path):
    # the separate-pricing example's --quick size (paper n = 20, two Dolly instances), in this process
    import importlib.util
    from pathlib import Path

    import pandas as pd

    path = Path(__file__).resolve().parents[2] / "examples" / "separate_robust.py"
    spec = importlib.util.spec_from_file_location("separate_robust", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--quick", "--families", "dolly", "--out", str(tmp_path)]) == 0
    paper = pd.read_csv(tmp_path / "paper.csv")
    assert list(paper["variant"]) == list(mod.VARIANTS)
    base = paper[paper["variant"] == "Prioritize-and-Route"].iloc[0]
    assert base["diff min"] == base["diff max"] == 0.0
    assert paper["ratio"].between(0.5, 1.1).all()
    breadth = pd.read_csv(tmp_path / "breadth.csv")
    assert len(breadth) == 2 and breadth[["P&R", "staffed"]].stack().between(0.5, 1.1).all()


def test_a_one_gpu_fleet_has_no_solo_pool_and_still_runs():
    """Regression (found by the invariants property test): on one GPU the partition has no solo pool,
    and asking that pool for free decode slots failed."""
    from fluidopt import Scenario
    from fluidopt.sim.api import simulate

    gpu = GPUProfile(alpha=0.015625, beta=0.00013, tau_solo=0.1, chunk=32, batch=2)
    sc = Scenario(gpu=gpu, gpus=1, classes=(RequestClass("c0", prompt=20.0, decode=5.0, rate=1.0, patience=1.0),),
                  prefill_price=0.0, decode_price=0.25, name="one-gpu")
    res = simulate(sc, "backpressure-gate-and-route", horizon=150.0, seed=0, check=True,
                   controller_options={"overflow": False, "resolve": False})
    t = res.totals
    assert t["completed"] > 0 and t["requests"] == t["completed"] + t["abandoned"] + t["dropped"] + t["in_system"]


@pytest.mark.parametrize("backend", ["python", "compiled"])
def test_max_overflow_with_no_solo_pool(backend):
    """Found by the fast-path property test: one GPU, all of it mixed, and max_overflow=1 asked for a
    solo pool that does not exist. Overflow is capped at the solo GPUs (none here)."""
    from fluidopt.sim.api import simulate

    sc = Scenario(gpu=GPUProfile(alpha=0.015625, beta=0.00013370452253268737, tau_solo=0.1, chunk=32, batch=2),
                  gpus=1, classes=(RequestClass(name="c0", prompt=20.0, decode=5.0, rate=1.0, patience=1.0),),
                  prefill_price=0.0, decode_price=0.1, name="random")
    if backend == "compiled":
        pytest.importorskip("fluidopt.sim._cengine")
    ctrl = make_controller("backpressure-gate-and-route", sc, max_overflow=1, decode_order="fcfs", caps=True)
    assert ctrl.plan_mixed_gpus(1) == 1  # no solo pool
    res = simulate(sc, ctrl, horizon=60.0, warmup=6.0, seed=0, service="markov", backend=backend)
    s = res.summary()
    assert s["requests"] > 0 and s["completed"] > 0
