"""WAIT and Nested WAIT: batch decisions worked out by hand, the memory guarantee, and the fluid
benchmark against a single-class closed form derived here (docs/theory.md, theorem 3).

Law in the hand cases: every iteration takes 1 s (prefill and decode intercepts 1, no variable
terms), so an iteration that starts at t ends at t + 1."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw
from fluidopt.core.errors import ScenarioError
from fluidopt.engines.wait import fluid_benchmark, nested_wait_policy, replay_wait, stage_memory, wait_policy

UNIT = IterationLaw(PrefillLaw(1.0, 0.0, 0.0), DecodeLaw((1.0, 0.0, 0.0)))


def test_wait_limits_by_hand():
    # booking_limit_replica_scheduler.py: L_i = L lam_i (d_i + 1) / sum_j lam_j (d_j + 1),
    # n_i = max(floor(L_i / (d_i + 1)), 1). Types d = 1, 3 at rates 2, 1: weights 2*2 = 4 and 1*4 = 4,
    # so L = 12 splits 6 / 6 and n = floor(6/2) = 3, floor(6/4) = 1
    pol = wait_policy(12, [1, 3], [2, 1])
    assert pol.limits == (6.0, 6.0) and pol.thresholds == (3, 1) and pol.edges == (1, 3)
    # a type whose share is below one request per stage still gets 1: 4 * 4 / 8 / 4 = 0.5 -> 1
    assert wait_policy(4, [1, 3], [2, 1]).thresholds == (1, 1)


def test_strict_wait_decisions_by_hand():
    # booking_limit_replica_scheduler.py with the policy above: type 0 (1 output token) needs 3 new arrivals, type 1 (2..3 tokens) needs 1;
    # a batch forms only when both are there, and then every ongoing request decodes in it
    pol = wait_policy(12, [1, 3], [2, 1], strict=True)
    arr = [0, 0, 0, 0.5, 1.5, 1.5, 1.5, 1.5, 2.0, 4, 4, 4]
    out = [1, 3, 1, 1, 2, 1, 1, 1, 3, 1, 1, 1]
    r = replay_wait(UNIT, pol, arr, [2] * 12, out, trace=True)
    assert [(t, new, B) for t, new, _, B in r.decisions] == [
        (0.5, (0, 2, 3, 1), 0),  # at t = 0 type 0 has 2 of 3: nothing runs until r3 comes
        (1.5, (5, 6, 7, 4), 1),  # r0, r2, r3 done by their prefill; r1 decodes beside the new four
        # t = 2.5: type 0 has none waiting, so r1 and r4 stall (r8 alone does not make a batch) until
        (4.0, (9, 10, 11, 8), 2),  # three type-0 arrivals at t = 4 complete the set
        (5.0, (), 1),  # no arrivals left: the rest drains without thresholds
        (6.0, (), 1),
    ]
    assert list(r.replay.first_token) == [1.5] * 4 + [2.5] * 4 + [5] * 4
    assert list(r.replay.finish) == [1.5, 5, 1.5, 1.5, 5, 2.5, 2.5, 2.5, 7, 5, 5, 5]
    # KV tokens held peak after the batch at t = 4: r1 (2 + 3), r4 (2 + 2), r8 (2 + 1) and the three
    # one-token requests (2 + 1 each) before they leave
    assert r.peak_memory == 5 + 4 + 3 + 3 * 3


def test_wait_decisions_by_hand():
    # modified_booking_limit_replica_scheduler.py (the default): L = 4 splits 2 / 2, n = (1, 1); type
    # i admits need_i = min(n_i, int(L_i - ongoing_i)) and a batch forms when any type has need_i waiting
    pol = wait_policy(4, [1, 3], [2, 1])
    assert pol.limits == (2.0, 2.0) and pol.thresholds == (1, 1) and not pol.strict
    r = replay_wait(UNIT, pol, [0, 0, 0, 1.5], [2] * 4, [3, 3, 3, 1], trace=True)
    assert [(t, new, B) for t, new, _, B in r.decisions] == [
        (0.0, (0,), 0),  # type 1: need min(1, 2 - 0) = 1 of 3 waiting; type 0 has none, no matter
        (1.0, (1,), 1),
        (2.0, (3,), 2),  # type 1 is at its limit (r0, r1 ongoing: need 0, ready); r3 (type 0) comes in
        (3.0, (2,), 1),  # r0 done: room for r2
        (4.0, (), 1),
        (5.0, (), 1),
    ]
    assert list(r.replay.finish) == [3, 4, 6, 3]
    assert list(r.replay.first_token) == [1, 2, 4, 3]


def test_nested_wait_limits_by_hand():
    # general_nested_booking_limit_replica_scheduler.py: types d = 2, 4 at rates 1, 1 make segments
    # [0, 2) and [2, 4) of c = 2 stages, weighted 2 * (1 + 1) = 4 and 2 * 1 = 2; L = 6 gives shares
    # 4 and 2, segment limits floor(4) = 4, floor(2) = 2, per-stage limits ceil(4/2) = 2, ceil(2/2) = 1
    pol = nested_wait_policy(6, [2, 4], [1, 1])
    assert pol.limits == (4.0, 2.0) and pol.thresholds == (2, 1) and pol.edges == (2, 4)
    # their floor gives 0 to a light last segment (share 6 * 2 / 26 = 0.46); ours keeps 1
    assert nested_wait_policy(6, [2, 4], [5, 1]).limits[1] == 1


def test_nested_wait_decisions_by_hand():
    pol = nested_wait_policy(6, [2, 4], [1, 1])
    r = replay_wait(UNIT, pol, [0, 0, 0, 1.5, 5], [2] * 5, [2, 4, 4, 2, 4], trace=True)
    assert r.decisions == (
        (0.0, (0, 1), (), 0),  # segment 0 needs min(2, 4 - 0) = 2 new: r0, r1; r2 waits
        # t = 1: min(2, 4 - 2) = 2 needed, only r2 waits: nothing runs, r0 and r1 stall
        (1.5, (2, 3), (), 2),  # r3 completes the pair; segment 1 has nobody at its first stage
        # t = 2.5: r0 done; r1 (2 tokens) waits at segment 1, but segment 0 needs 2 new and has 0,
        # so the walk stops there and nothing runs until the last arrival (t = 5)
        (5.0, (4,), (1,), 3),  # no arrivals left: r4 alone; r1 joins segment 1; r2, r3 decode
        (6.0, (), (2,), 3),  # r3 done; r2 joins segment 1 (its limit 2 - r1 = 1 free)
        (7.0, (), (4,), 2),  # r1 done at 4 tokens; r4 joins
        (8.0, (), (), 1),
    )
    assert list(r.replay.finish) == [2.5, 7, 8, 6, 9]
    assert list(r.replay.first_token) == [1, 1, 2.5, 2.5, 6]


def test_a_limit_too_large_for_the_memory_is_an_error():
    rng = np.random.default_rng(3)
    n = 3000
    arr = np.cumsum(rng.exponential(0.01, n))
    d = np.array([32, 128, 300])
    p, o = rng.integers(20, 200, n), d[rng.integers(0, 3, n)]
    law = IterationLaw(PrefillLaw(0.01, 2e-5, 0.0), DecodeLaw((0.01, 1e-7, 1e-4)))
    # L = 30 bounds the requests inside segments (at most 500 tokens each: 15,000); those waiting at a
    # segment's first stage hold memory too, so L is sized with room to spare
    r = replay_wait(law, nested_wait_policy(30, d, [1, 1, 1], memory=20000, buffer=1000), arr, p, o)
    assert 15000 < r.peak_memory <= 19000
    assert np.all(np.isfinite(r.replay.finish)) and np.all(r.replay.finish >= r.replay.arrival)
    with pytest.raises(ScenarioError, match="lower total_limit"):
        replay_wait(law, nested_wait_policy(300, d, [1, 1, 1], memory=20000), arr, p, o)


def test_stage_memory_by_summation():
    l, o = 7, 5
    assert stage_memory(l, o) == l + sum(l + k for k in range(1, o))


def test_fluid_benchmark_single_class_closed_form():
    # one class, prompt 4, output 3: the batch touches S = 4 + 5 + 6 = 15 tokens per request.
    # Little's law per stage: n = lam tau requests in each stage, tau = d0 + d1 n S, so
    #   tau* = d0 / (1 - d1 lam S),  M* = n S = lam S d0 / (1 - d1 lam S)
    lam, d0, d1, S = 0.01, 1.0, 0.5, 15
    eq = fluid_benchmark([lam], [4], [3], d0, d1, memory=10.0)
    assert eq.iteration_time == pytest.approx(d0 / (1 - d1 * lam * S), abs=1e-9)
    assert eq.memory == pytest.approx(lam * S * d0 / (1 - d1 * lam * S), abs=1e-9)
    assert eq.throughput == pytest.approx(lam, abs=1e-12) and not eq.memory_bound
    assert eq.token_throughput == pytest.approx(3 * lam, abs=1e-12)
    # memory binds when M* would exceed M: M = lam S d0 / (1 - d1 lam S) solved for lam gives
    #   lam_max = M / (S (d0 + d1 M)) = 10 / (15 * 6) = 1/9 requests/s
    eq = fluid_benchmark([1.0], [4], [3], d0, d1, memory=10.0)
    assert eq.memory_bound and eq.throughput == pytest.approx(1 / 9, abs=1e-9)
    assert eq.memory == 10.0 and eq.iteration_time == pytest.approx(6.0, abs=1e-12)
    # at exactly lam_max the unbound equilibrium fills the memory
    eq = fluid_benchmark([1 / 9], [4], [3], d0, d1, memory=10.0)
    assert eq.memory == pytest.approx(10.0, abs=1e-6) and eq.throughput == pytest.approx(1 / 9, abs=1e-12)


def test_fluid_benchmark_two_classes_share_proportionally():
    # rho = 1 * 15 + 2 * stage_memory(2, 2) = 15 + 2 * 5 = 25 tokens/s; d1 = 0 so tau = d0 and
    # M* = d0 rho = 25 > M = 10: served share 10 / 25 of each class
    eq = fluid_benchmark([1.0, 2.0], [4, 2], [3, 2], 1.0, 0.0, memory=10.0)
    assert eq.throughput == pytest.approx(3 * 0.4) and eq.per_stage == pytest.approx((0.4, 0.8))
    assert eq.token_throughput == pytest.approx(0.4 * (3 + 4))


def test_the_paper_law_reproduces_the_fluid_iteration_time():
    # deterministic single class through WAIT with threshold n, arrivals n per tau*: the simulated
    # iterations average tau* and hold n requests per stage, the fluid equilibrium
    d0, d1, l, o, n = 0.02, 1e-5, 50, 20, 4
    S = stage_memory(l, o)
    tau = d0 + d1 * n * S  # n requests in each of the o stages touch n S tokens; lam = n / tau
    lam = n / tau
    eq = fluid_benchmark([lam], [l], [o], d0, d1)
    assert eq.iteration_time == pytest.approx(tau, rel=1e-9)
    law = IterationLaw(PrefillLaw(d0, d1, 0.0), DecodeLaw((d0, d1, 0.0)))
    k = 200
    arr = np.repeat(np.arange(k) * tau, n)  # groups of n exactly at iteration starts
    r = replay_wait(law, wait_policy(n * (o + 1), [o], [lam]), arr, [l] * (k * n), [o] * (k * n), trace=True)
    mid = r.decisions[100:-100]  # past the ramp-up, before the drain
    # arrivals do not fall on iteration starts, so single iterations vary; their mean settles at tau*
    # and the mean number decoding at (lam tau*) (o - 1)
    assert np.mean(np.diff([d[0] for d in mid])) == pytest.approx(eq.iteration_time, rel=0.02)
    assert np.mean([B for *_, B in mid]) == pytest.approx(eq.per_stage[0] * (o - 1), rel=0.02)
    assert eq.per_stage[0] == pytest.approx(n, rel=1e-9)


def test_bad_policies():
    with pytest.raises(ScenarioError, match="total_limit"):
        nested_wait_policy(0, [2], [2])
    with pytest.raises(ScenarioError, match="outputs"):
        wait_policy(100, [0], [4])
    with pytest.raises(ScenarioError, match="rates"):
        wait_policy(100, [3, 4], [0, 0])
    with pytest.raises(ScenarioError, match="longest type"):
        replay_wait(UNIT, wait_policy(5, [3], [1]), [0.0], [3], [4])
    assert math.isinf(fluid_benchmark([1.0], [1], [1], 1.0, 1.0).memory)
