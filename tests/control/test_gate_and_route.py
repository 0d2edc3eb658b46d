"""Gate-and-route controllers: decision logic on a hand-driven snapshot, then the real simulator.

The snapshot (:class:`fluidopt.control.snapshot.ClusterSnapshot`) implements the controller protocol
without any engine code: it is what a real router keeps, and it shows the controllers need nothing else.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

import fluidopt
from fluidopt.control.gate_and_route import (
    MIXED_POOL,
    SOLO_POOL,
    GateAndRoute,
    PrioritizeAndRoute,
    SLIGateAndRoute,
    WeightedSLIGateAndRoute,
    solo_probabilities,
)
from fluidopt.control.protocol import (
    DECODE,
    DECODE_QUEUE,
    PREFILL,
    PREFILL_QUEUE,
    WAIT_DECODE,
    WAIT_PREFILL,
    ClusterView,
    Context,
)
from fluidopt.control.registry import make_controller
from fluidopt.control.snapshot import ClusterSnapshot
from fluidopt.core.errors import ScenarioError
from fluidopt.fluid import DecodeFairness, solve_fluid
from fluidopt.sim.api import simulate


# =================================================================================================
# The library's plain-Python snapshot (what a real router keeps), events driven by the test
# =================================================================================================
def inject(fc: ClusterSnapshot, cls: int, q: int, phase: int = WAIT_PREFILL) -> int:
    """A waiting request placed in queue q behind the controller's back (a handed-over state)."""
    r = fc.add_request(cls, 100, 100, prefilled=phase == WAIT_DECODE)
    fc.enqueue(r, q)
    return r


def arrive(fc: ClusterSnapshot, ctrl, cls: int) -> int:
    r = fc.add_request(cls, 100, 100)
    ctrl.on_arrival(fc, r)
    if fc.req_phase(r) == WAIT_PREFILL and fc.req_queue(r) < 0:
        fc.enqueue(r, PREFILL_QUEUE)
    return r


def finish_prefill(fc: ClusterSnapshot, ctrl, r: int) -> None:
    g = fc.prefill_finished(r)
    ctrl.on_prefill_done(fc, r, g)
    if fc.req_phase(r) == WAIT_DECODE and fc.req_queue(r) < 0:
        fc.enqueue(r, DECODE_QUEUE)
    ctrl.on_slot_freed(fc, g)


def finish_decode(fc: ClusterSnapshot, ctrl, r: int) -> None:
    g = fc.decode_finished(r)
    ctrl.on_decode_done(fc, r, g)
    ctrl.on_slot_freed(fc, g)


def test_snapshot_implements_the_protocol():
    assert isinstance(ClusterSnapshot(2, 4, 2), ClusterView)
    assert isinstance(ClusterSnapshot(2, 4, 2), Context)


# =================================================================================================
# Decision logic on the snapshot
# =================================================================================================
def make_gg(n=10, B=4, x=(0.05, 0.15), qp=(0.0, 0.0), cls=GateAndRoute, **kw):
    fc = ClusterSnapshot(n, B, len(x))
    ctrl = cls(x, q_prefill=qp, **kw) if cls is GateAndRoute else cls(x, **kw)
    fc.setup(ctrl)
    return fc, ctrl


def test_static_partition_and_caps():
    fc, ctrl = make_gg(n=10, B=4, x=(0.05, 0.15))  # n sum x = 2.0 -> M = 2
    assert ctrl.mixed_gpus == 2
    assert [fc.gpu_pool(g) for g in range(10)] == [MIXED_POOL] * 2 + [SOLO_POOL] * 8
    assert [fc.gpu_prefill_allowed(g) for g in range(10)] == [True] * 2 + [False] * 8
    assert [fc.gpu_max_decodes(g) for g in range(10)] == [3] * 2 + [4] * 8  # one slot per mixed GPU reserved for its prefill
    # ceil: 10 * 0.201 = 2.01 -> 3; the same controller on 1000 GPUs -> 201
    fc2, c2 = make_gg(n=10, x=(0.051, 0.15))
    assert c2.mixed_gpus == 3
    assert c2.plan_mixed_gpus(1000) == 201
    assert c2.plan(1000).attrs["mixed_gpus"] == 201


def test_gate_admits_most_underoccupied_class():
    fc, ctrl = make_gg(n=20, B=4, x=(0.05, 0.15))  # targets X* = (1, 3), M = 4
    # Occupy three of the four prefill slots: one class-0 and two class-1 prefills.
    a = arrive(fc, ctrl, 0)
    b = arrive(fc, ctrl, 1)
    c = arrive(fc, ctrl, 1)
    assert {fc.req_phase(r) for r in (a, b, c)} == {PREFILL}
    d = arrive(fc, ctrl, 0)  # the last idle slot: the gate only sees class 0 waiting -> admitted
    assert fc.req_phase(d) == PREFILL
    # All slots busy now; queue one of each class.
    e, f = arrive(fc, ctrl, 0), arrive(fc, ctrl, 1)
    assert fc.req_phase(e) == fc.req_phase(f) == WAIT_PREFILL
    # Deviations: class 0 (2 - 1)/0.05 = 20, class 1 (2 - 3)/0.15 = -6.7 -> class 1 first.
    assert ctrl.gate_class(fc) == 1
    finish_prefill(fc, ctrl, d)  # frees a mixed GPU's prefill slot
    assert fc.req_phase(f) == PREFILL and fc.req_phase(e) == WAIT_PREFILL


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_gate_deviation_is_relative_to_the_target(order):
    """The deviation index divides by x_i*: (X_i - n x_i*) / x_i*, not X_i - n x_i*.

    n = 20, x* = (0.05, 0.15): targets n x* = (1, 3). A handed-over state with one class-1 prefill
    running (X = (0, 1)) and both classes waiting. Relative deviations (0 - 1)/0.05 = -20 and
    (1 - 3)/0.15 = -13.3: class 0 is further below its target and is admitted. (The absolute
    deviations -1 and -2 would pick class 1.) Queue order and queue lengths favour class 1, so
    neither FCFS nor the tie-break can explain the choice.
    """
    fc = ClusterSnapshot(20, 4, 2)
    ctrl = GateAndRoute((0.05, 0.15))
    fc.setup(ctrl)
    assert ctrl.mixed_gpus == 4
    busy = fc.add_request(1, 100, 100)
    fc.start_prefill(busy, 0)  # the state a router hands over: X = (0, 1), GPU 0 busy
    waiting = {}
    for cls in order:
        waiting[cls] = inject(fc, cls, PREFILL_QUEUE)
    inject(fc, 1, PREFILL_QUEUE)  # Q_p = (1, 2): the tie-break would prefer class 1
    assert [fc.n_prefill(i) for i in (0, 1)] == [0, 1]
    assert ctrl.gate_class(fc) == 0
    fc.outbox.clear()
    ctrl.on_slot_freed(fc, 1)  # GPU 1's prefill slot is idle: the gate chooses
    assert fc.outbox == [("prefill", waiting[0], 1)]
    assert fc.req_phase(waiting[0]) == PREFILL and fc.req_phase(waiting[1]) == WAIT_PREFILL
    # Now X = (1, 1): relative deviations 0 and -13.3 (absolute 0 and -2): class 1 next.
    assert ctrl.gate_class(fc) == 1


def test_gate_deviation_weights_by_the_inverse_target_after_a_prefill():
    """The same rule when a prefill finishes: x* = (0.02, 0.2), n = 50 (targets 1 and 10, M = 11).

    Ten class-1 prefills run; one class-0 and two class-1 requests wait. One class-1 prefill ends:
    X = (0, 9), and its GPU's prefill slot goes to the gate. Relative deviations (0 - 1)/0.02 = -50
    and (9 - 10)/0.2 = -5 admit class 0; absolute ones (-1 and -1) would tie, and the tie-break (the
    longer queue) would admit class 1.
    """
    fc = ClusterSnapshot(50, 4, 2)
    ctrl = GateAndRoute((0.02, 0.2))
    fc.setup(ctrl)
    assert ctrl.mixed_gpus == 11
    running = [arrive(fc, ctrl, 1) for _ in range(10)]
    assert all(fc.req_phase(r) == PREFILL for r in running)
    first = inject(fc, 1, PREFILL_QUEUE)  # waiting (a handed-over state): the gate has not seen them
    inject(fc, 1, PREFILL_QUEUE)
    r0 = inject(fc, 0, PREFILL_QUEUE)
    finish_prefill(fc, ctrl, running[0])
    assert fc.req_phase(r0) == PREFILL
    assert fc.req_phase(first) == WAIT_PREFILL


def test_gate_ties_go_to_largest_queue_excess_and_zero_targets_never_admitted():
    fc, ctrl = make_gg(n=10, B=4, x=(0.1, 0.1, 0.0), qp=(0.0, 0.1, 0.0))  # M = 2
    # Class 2 has x* = 0: never admitted even with every slot idle.
    z = arrive(fc, ctrl, 2)
    assert fc.req_phase(z) == WAIT_PREFILL and ctrl.gate_class(fc) == -1
    # A state handed over by a router: one class-0 and one class-1 request already queued, both slots
    # idle. Deviations tie at (0 - 1)/0.1; Q_p - n q_p* is 1 - 0 for class 0 and 1 - 1 for class 1.
    w0, w1 = inject(fc, 0, PREFILL_QUEUE), inject(fc, 1, PREFILL_QUEUE)
    assert ctrl.gate_class(fc) == 0
    ctrl.on_slot_freed(fc, 1)
    assert fc.req_phase(w0) == PREFILL and fc.req_gpu(w0) == 1 and fc.req_phase(w1) == WAIT_PREFILL
    ctrl.on_slot_freed(fc, 0)
    assert fc.req_phase(w1) == PREFILL and fc.req_phase(z) == WAIT_PREFILL


def test_greedy_router_solo_first_then_mixed_then_fcfs_buffer():
    fc, ctrl = make_gg(n=3, B=2, x=(0.2, 0.1))  # M = ceil(0.9) = 1: GPU 0 mixed (1 decode), 1-2 solo (2 each)
    assert ctrl.mixed_gpus == 1
    placed = []
    for k in range(6):
        r = arrive(fc, ctrl, k % 2)
        assert fc.req_gpu(r) == 0  # the only prefill slot
        finish_prefill(fc, ctrl, r)
        placed.append(r)
    gpus = [fc.req_gpu(r) for r in placed]
    # four solo slots fill first (in any order), then the mixed GPU's one decode slot, then the buffer
    assert sorted(gpus[:4]) == [1, 1, 2, 2] and gpus[4] == 0 and fc.req_queue(placed[5]) == DECODE_QUEUE
    late = arrive(fc, ctrl, 1)
    finish_prefill(fc, ctrl, late)
    assert fc.queue_requests(DECODE_QUEUE) == [placed[5], late]  # FCFS across classes
    finish_decode(fc, ctrl, placed[0])  # a solo slot frees: it pulls the buffer head
    assert fc.req_phase(placed[5]) == DECODE and fc.req_gpu(placed[5]) == gpus[0]
    finish_decode(fc, ctrl, placed[4])  # the mixed GPU's decode slot frees: buffer head again
    assert fc.req_gpu(late) == 0 and fc.req_phase(late) == DECODE


def test_mixed_prefill_slot_goes_to_gate_not_to_buffer():
    fc, ctrl = make_gg(n=2, B=2, x=(0.3, 0.2))  # M = 1, one solo GPU
    rs = [arrive(fc, ctrl, 0) for _ in range(3)]
    finish_prefill(fc, ctrl, rs[0])  # -> solo GPU 1; rs[1] starts its prefill on GPU 0
    finish_prefill(fc, ctrl, rs[1])  # -> solo GPU 1 (2nd slot); rs[2] prefills
    finish_prefill(fc, ctrl, rs[2])  # -> mixed GPU 0's decode slot
    r4 = arrive(fc, ctrl, 1)  # GPU 0's prefill slot is idle: admitted
    assert fc.req_phase(r4) == PREFILL and fc.req_gpu(r4) == 0
    assert fc.gpu_free(0) == 0


def test_prioritize_and_route_gate_order():
    fc = ClusterSnapshot(10, 4, 3)
    ctrl = PrioritizeAndRoute((0.1, 0.05, 0.0), priority=(0.5, 3.0, 9.0))
    fc.setup(ctrl)
    assert ctrl.mixed_gpus == 2
    busy = [arrive(fc, ctrl, 0), arrive(fc, ctrl, 0)]
    w = [arrive(fc, ctrl, c) for c in (0, 2, 1, 0)]
    # class 2 has the top priority but x* = 0: never; class 1 (D/P = 3) before class 0
    assert ctrl.gate_class(fc) == 1
    finish_prefill(fc, ctrl, busy[0])
    assert fc.req_phase(w[2]) == PREFILL
    finish_prefill(fc, ctrl, busy[1])
    assert fc.req_phase(w[0]) == PREFILL and fc.req_phase(w[1]) == WAIT_PREFILL


def test_sli_router_respects_pools_and_buffers():
    fc = ClusterSnapshot(4, 2, 2)
    ctrl = SLIGateAndRoute((0.25, 0.25), p_solo=(0.0, 1.0))  # M = 2: class 0 -> mixed pool only, class 1 -> solo
    fc.setup(ctrl)
    qm, qs = fc.queue_id("decode_mixed"), fc.queue_id("decode_solo")
    done = {0: [], 1: []}
    for k in range(8):
        c = k % 2
        r = arrive(fc, ctrl, c)
        finish_prefill(fc, ctrl, r)
        done[c].append(r)
    pools = {c: [fc.gpu_pool(fc.req_gpu(r)) if fc.req_gpu(r) >= 0 else None for r in done[c]] for c in done}
    # class 0: 2 mixed decode slots (1 per mixed GPU), then the mixed buffer even though solo slots are free
    assert pools[0][:2] == [MIXED_POOL, MIXED_POOL] and pools[0][2:] == [None, None]
    assert [fc.req_queue(r) for r in done[0][2:]] == [qm, qm]
    assert pools[1] == [SOLO_POOL] * 4 and fc.qlen(qs) == 0
    finish_decode(fc, ctrl, done[1][0])  # a solo slot frees: the solo buffer is empty, mixed waiters stay
    assert fc.qlen(qm) == 2
    finish_decode(fc, ctrl, done[0][0])  # a mixed decode slot frees: mixed buffer head
    assert fc.req_phase(done[0][2]) == DECODE


def test_weighted_pool_picks_classes_proportionally_to_mu_y():
    fc = ClusterSnapshot(4, 2, 3, seed=7)
    ctrl = WeightedSLIGateAndRoute((0.1, 0.1, 0.1), p_solo=(1, 1, 1), weights_mixed=(1, 0, 0),
                                   weights_solo=(1.0, 3.0, 0.0))
    fc.setup(ctrl)
    # One waiting decode per class in the per-class buffer; draw (without serving) for each pool.
    for c in range(3):
        inject(fc, c, DECODE_QUEUE, WAIT_DECODE)
    draws = Counter(ctrl.pick_class(fc, SOLO_POOL) for _ in range(4000))
    assert draws[2] == 0  # weight 0: never served by this pool
    assert abs(draws[1] / 4000 - 0.75) < 0.03  # 3 sigma = 0.021
    assert Counter(ctrl.pick_class(fc, MIXED_POOL) for _ in range(100)) == {0: 100}


def test_constructors_validate_inputs():
    with pytest.raises(ScenarioError, match="sum to <= 1"):
        GateAndRoute((0.7, 0.6))
    with pytest.raises(ScenarioError, match="sum to <= 1"):
        GateAndRoute((0.5, 0.500002))
    # an LP solution over 1 by the solver's feasibility tolerance is put back on the simplex
    x = GateAndRoute((0.5, 0.5 + 2.5e-8)).x
    assert x.sum() <= 1.0 and abs(x[0] - 0.5 / (1 + 2.5e-8)) < 1e-15
    with pytest.raises(ScenarioError, match="finite numbers >= 0"):
        GateAndRoute((0.1, -0.1))
    with pytest.raises(ScenarioError, match="p_solo"):
        SLIGateAndRoute((0.1, 0.1), p_solo=(0.5, 1.5))
    with pytest.raises(ScenarioError, match="2 values"):
        GateAndRoute((0.1, 0.1), q_prefill=(0.1,))
    ctrl = GateAndRoute((0.1, 0.1), class_names=("a", "b"))
    fc = ClusterSnapshot(4, 4, 2)
    with pytest.raises(ScenarioError, match="classes are a, b"):
        fc.setup(ctrl)
    with pytest.raises(ScenarioError, match="3 classes"):
        ClusterSnapshot(4, 4, 2).setup(GateAndRoute((0.1, 0.1, 0.1)))


# =================================================================================================
# From LP solutions
# =================================================================================================
def test_from_solution_on_the_paper_instance(paper, bundled):
    ctrl = GateAndRoute.from_solution(bundled)
    np.testing.assert_allclose(ctrl.x, [0.01826, 0.19495], atol=1e-5)
    assert ctrl.plan_mixed_gpus(500) == 107 and ctrl.plan_mixed_gpus(2000) == math.ceil(2000 * 0.21321144)
    assert ctrl.plan_mixed_gpus(5) == 2
    par = PrioritizeAndRoute.from_solution(solve_fluid(paper, "separate"), paper)
    np.testing.assert_allclose(par.priority, [1000 / 300, 400 / 3000])
    assert par.plan_mixed_gpus(500) == math.ceil(500 * 0.21444844)


def test_solo_probabilities_formula(paper):
    sol = solve_fluid(paper, slis=[DecodeFairness(0.5)])
    p = solo_probabilities(sol, paper.rates())
    # decode rates by hand from the published inputs: mu_m = 1 / (D tau_mix), mu_s = gamma / D
    D, tau_mix, gamma = np.array([1000.0, 400.0]), 0.0174 + 6.2e-5 * 256, 45.45
    ms, mm = gamma / D * sol.y_solo, 1.0 / (D * tau_mix) * sol.y_mixed
    np.testing.assert_allclose(p, ms / (ms + mm), rtol=1e-12)
    assert 0.6 < p[0] < 0.8 and p[1] == pytest.approx(1.0)
    ctrl = make_controller("sli-gate-and-route", paper, slis=["decode_fairness=0.5"])
    np.testing.assert_allclose(ctrl.p_solo, p)


def test_registry_names_build_from_the_scenario_alone(paper):
    for name in ("gate-and-route", "gg-sp", "prioritize-and-route", "sli-gate-and-route",
                 "sli-weighted-gate-and-route", "gi-wsp", "gf-wsp", "fg-sp", "fi-wsp"):
        assert make_controller(name, paper).name in (name, "gate-and-route")


# =================================================================================================
# On the simulator
# =================================================================================================
def _ratio_and_x(n: int, horizon: float, seed: int, sol):
    s = fluidopt.default_scenario().with_gpus(n)
    res = simulate(s, GateAndRoute.from_solution(sol), horizon=horizon, warmup=horizon / 5, seed=seed)
    return res.cluster["revenue_per_gpu"] / sol.objective_per_gpu, res.per_class["x_mean"].to_numpy(), res


def _within(value: float, ref: tuple[float, float, int], what: str) -> None:
    """``value`` (one run) is within 4 standard deviations of the reference mean.

    ``ref`` = (mean, sd, k): the mean and the standard deviation of one run over k independent
    replications of exactly this run (same scenario, horizon, warm-up and plan; other seeds). The
    window, 4 sd sqrt(1 + 1/k), covers both the run's own spread and the reference mean's.
    """
    mean, sd, k = ref
    half = 4 * sd * math.sqrt(1 + 1 / k)
    assert abs(value - mean) <= half, f"{what}: {value:.5f}, expected {mean:.5f} +/- {half:.5f} (4 sd)"


# Replications of the runs below with seeds 100..129 (n = 5) and 100..119 (n = 200): (mean, sd, k).
# One run's sd is the honest scale: at n = 5 the batch-means standard error of a single run (0.0056)
# understates it (slow decodes make the 20 batches correlated), so the windows use the replications.
REF_RATIO_N5 = (0.93470, 0.00892, 30)
REF_RATIO_N200 = (0.97795, 0.00385, 20)
REF_X_N200 = ((0.019240, 0.000124, 20), (0.191322, 0.000569, 20))


@pytest.mark.integration
def test_asymptotic_optimality_small(bundled):
    """Revenue / R* rises from n = 5 to n = 200 and X_i/n tracks x_i* (paper instance, markov).

    Windows (4 sd of one run): revenue / R* within 3.6% of 0.9347 at n = 5 (4000 s) and within 1.6%
    of 0.9780 at n = 200 (600 s); X_i/n at n = 200 within 0.0005 and 0.0023 of its reference (class 2,
    the long prompts, runs 0.0018 below x_2* = 0.1950). examples/asymptotic_optimality.py
    (docs/results.md) has the longer runs: 0.936 at n = 5 and 0.976 at n = 200. The fluid LP bounds
    the revenue of any policy: ratio < 1.
    """
    r5, _, res5 = _ratio_and_x(5, 4000.0, 11, bundled)
    r200, x200, res200 = _ratio_and_x(200, 600.0, 11, bundled)
    _within(r5, REF_RATIO_N5, "revenue / R* at n = 5")
    _within(r200, REF_RATIO_N200, "revenue / R* at n = 200")
    assert r5 < r200 - 0.02 and r200 < 1.0
    for i, ref in enumerate(REF_X_N200):
        _within(x200[i], ref, f"X_{i + 1}/n at n = 200")
    np.testing.assert_allclose(x200, bundled.x, atol=0.005)  # and near the LP's targets
    # conservation: every arrival is resolved or still in the system
    for res in (res5, res200):
        t = res.totals
        assert t["requests"] == t["completed"] + t["abandoned"] + t["dropped"] + t["in_system"]


# Replications (seeds 100..119) of the run below: separate revenue / R*_sep and the total decode buffer.
REF_SEPARATE_N200 = (0.99078, 0.00291, 20)
REF_SEPARATE_QD = (0.3587, 0.0494, 20)


@pytest.mark.integration
def test_separate_pricing_builds_the_decode_backlog(paper):
    """Prioritize-and-Route under separate pricing: near the separate optimum, with the LP's decode backlog.

    Every optimum of the separate LP keeps a total decode buffer of at least sum q_d* = 0.32 per GPU
    (the LP's lexicographic stage returns the least one); which class waits is degenerate (decode
    revenue per slot-second is c_d gamma for every class), so we check the total. Windows (4 sd of one
    run, from 20 replications): revenue / R*_sep within 1.2% of 0.9908, the buffer within 0.2 of 0.359.
    """
    sep = solve_fluid(paper, "separate")
    assert sep.q_decode.sum() > 0.3
    s = paper.with_gpus(200)
    res = simulate(s, "prioritize-and-route", horizon=600.0, warmup=120.0, seed=5)
    ratio = res.cluster["revenue_per_gpu_separate"] / sep.objective_per_gpu
    _within(ratio, REF_SEPARATE_N200, "separate revenue / R*_sep at n = 200")
    qd = res.per_class["q_decode_mean"].to_numpy()
    _within(qd.sum(), REF_SEPARATE_QD, "decode buffer per GPU")
    assert qd.sum() > 0.8 * sep.q_decode.sum()
    # the gate serves class 1 (largest D/P) first: it is prefilled in full, as in the LP
    assert res.per_class["abandoned_prefill_fraction"].iloc[0] < 0.01


@pytest.mark.integration
def test_sli_routing_tracks_the_sli_lp_where_greedy_does_not(paper):
    """Decode fairness: SLI-aware routing puts the class-wise mixed occupancy on y_m* (greedy does not).

    Under the SLI LP class 1 holds every mixed decode slot (y_m* = (3.11, 0)): SLI-aware routing reaches
    it (class 2 never goes to the mixed pool, class 1's mixed share saturates it); solo-first greedy
    routing leaves mixed slots idle and mixes both classes there. y_s,1 overshoots its target under
    both policies at this n because the work-conserving gate admits class 1 above n x_1* (docs).
    """
    sol = solve_fluid(paper, slis=[DecodeFairness(0.5)])
    s = paper.with_gpus(200)
    kw = dict(horizon=600.0, warmup=150.0, seed=3)
    sli = simulate(s, SLIGateAndRoute.from_solution(sol, paper), **kw)
    greedy = simulate(s, GateAndRoute.from_solution(sol), **kw)
    ym_sli = sli.per_class["y_mixed_mean"].to_numpy()
    ym_gr = greedy.per_class["y_mixed_mean"].to_numpy()
    np.testing.assert_allclose(ym_sli, sol.y_mixed, atol=0.2)
    assert ym_sli[1] == 0.0
    assert np.abs(ym_gr - sol.y_mixed).max() > 1.0
    err = {k: np.abs(r.per_class["y_solo_mean"].to_numpy() - sol.y_solo).max() for k, r in
           (("sli", sli), ("greedy", greedy))}
    assert err["sli"] < err["greedy"] - 1.0


@pytest.mark.integration
def test_weighted_policy_follows_a_plan_with_a_decode_buffer():
    """gamma * tau < (B-1)/B: a mixed iteration is faster than a solo one, and the bundled LP prefills class a
    (x_a* > 0) only to keep GPUs mixed, planning no decode for it (y_a* = 0, q_d,a* > 0). The general
    SLI-aware policy follows that plan and reaches R*; Gate-and-Route's greedy router decodes class a
    FCFS and loses ~14% (instance 9 of examples/baseline_grid.py, at n = 50).

    Decodes of ~1800 tokens at 13.7 tokens/s last two minutes, so the revenue mixes slowly: one 900 s
    run has a standard deviation of 1.5%; this 3600 s run (1200 s warm-up) has 0.8% (20 replications,
    seeds 100..119: weighted 0.9976 +/- 0.0076, greedy 0.8576 +/- 0.0081, mean +/- sd of one run), so
    the windows (4 sd) are 3.1% and 3.3%.
    """
    from fluidopt import GPUProfile, RequestClass, Scenario

    gpu = GPUProfile.from_gamma(alpha=0.0184, beta=9.43e-5, gamma=13.7, chunk=256, batch=16)
    n = 50
    s = Scenario(gpu=gpu, gpus=n, classes=(RequestClass("a", 236, 1892, rate=0.373 * n, patience=0.1),
                                           RequestClass("b", 1884, 1779, rate=0.473 * n, patience=0.1)),
                 prefill_price=0.1, decode_price=0.2, name="fast-mixed")
    sol = solve_fluid(s)
    assert not gpu.decode_buffer_free and sol.x[0] > 0 and sol.y_mixed[0] == sol.y_solo[0] == 0.0
    kw = dict(horizon=3600.0, warmup=1200.0, seed=4)
    w = simulate(s, WeightedSLIGateAndRoute.from_solution(sol, s), **kw)
    gg = simulate(s, GateAndRoute.from_solution(sol), **kw)
    rw = w.cluster["revenue_per_gpu"] / sol.objective_per_gpu
    rg = gg.cluster["revenue_per_gpu"] / sol.objective_per_gpu
    _within(rw, (0.99756, 0.00757, 20), "weighted SLI-aware revenue / R*")
    _within(rg, (0.85760, 0.00814, 20), "Gate-and-Route revenue / R*")
    assert w.per_class["completed"].iloc[0] == 0  # class a is never decoded, as planned


@pytest.mark.parametrize("name", ["gate-and-route", "prioritize-and-route", "sli-gate-and-route",
                                  "sli-weighted-gate-and-route", "gi-wsp", "gf-wsp", "fg-sp"])
def test_a_plan_handed_down_builds_the_same_controller(name, paper):
    """make_controller(..., plan=...) builds from the caller's solved LP exactly what the policy builds itself."""
    from fluidopt.control.registry import make_controller, uses_plan

    assert uses_plan(name)
    plans = {p: solve_fluid(paper, p) for p in ("bundled", "separate")}
    own = make_controller(name, paper)
    handed = make_controller(name, paper, plan=plans)
    assert type(own) is type(handed)
    for attr in ("x", "p_solo", "priority", "weights_mixed", "weights_solo"):
        if hasattr(own, attr):
            a, b = getattr(own, attr), getattr(handed, attr)
            assert np.array_equal(np.asarray(a, dtype=float), np.asarray(b, dtype=float)), attr
