"""WAIT and Nested WAIT: batch decisions worked out by hand, the memory guarantee, and the fluid
benchmark against a single-class closed form derived here (docs/theory.md, theorem 3).

Law in the hand cases: every iteration takes 1 s (prefill and decode intercepts 1, no variable
terms), so iteration k runs on [k, k + 1) whenever work is present."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw
from fluidopt.core.errors import ScenarioError
from fluidopt.engines.wait import fluid_benchmark, nested_wait_policy, replay_wait, stage_memory, wait_policy

UNIT = IterationLaw(PrefillLaw(1.0, 0.0, 0.0), DecodeLaw((1.0, 0.0, 0.0)))


def test_wait_decisions_by_hand():
    # class 0: outputs <= 2 tokens, threshold 2; class 1: outputs in (2, 4], threshold 1
    pol = wait_policy(100, [2, 1], [2, 4])
    r = replay_wait(UNIT, pol, [0, 0, 0.5, 2.5], [3, 3, 3, 3], [2, 4, 2, 3], trace=True)
    got = [(t, adm, B) for t, adm, _, B in r.decisions]
    assert got == [
        (0.0, (1,), 0),  # r0 alone in class 0 (below 2) waits; r1 meets class 1's threshold of 1
        (1.0, (0, 2), 1),  # r2 (t = 0.5) completes class 0's pair; r1 decodes beside their prefill
        (2.0, (), 3),  # nothing queued: three decodes; r0 and r2 reach 2 tokens
        (3.0, (3,), 1),  # r3 (t = 2.5) admitted; r1 makes its 4th token
        (4.0, (), 1),
        (5.0, (), 1),
    ]
    assert list(r.replay.first_token) == [2, 1, 2, 4]
    assert list(r.replay.finish) == [3, 4, 3, 6]


def test_wait_holds_a_group_that_does_not_fit():
    # reservations prompt + output = 3 + 4 = 7 tokens each; memory 10: a group of 2 (14) never fits,
    # so nothing runs until the idle rule admits what fits (one request), and so on
    pol = wait_policy(10, [2], [4])
    r = replay_wait(UNIT, pol, [0, 0], [3, 3], [4, 4], trace=True)
    assert [adm for _, adm, _, _ in r.decisions] == [(0,), (), (), (), (1,), (), (), ()]
    assert r.peak_reserved <= 10


def test_nested_wait_decisions_by_hand():
    # one boundary at 2 output tokens; thresholds 2 (arrivals) and 2 (at the boundary)
    pol = nested_wait_policy(100, [2, 2], [2])
    r = replay_wait(UNIT, pol, [0, 0, 0, 0], [3, 3, 3, 3], [1, 4, 3, 2], trace=True)
    assert [(t, adm, adv, B) for t, adm, adv, B in r.decisions] == [
        (0.0, (0, 1, 2, 3), (), 0),  # two groups of 2 admitted; r0 (1 token) is done by its prefill
        (1.0, (), (), 3),  # r1, r2, r3 make token 2: r3 is done, r1 and r2 stop at the boundary
        (2.0, (), (1, 2), 2),  # two wait at the boundary: the group advances (r2 ends at 3 tokens)
        (3.0, (), (), 1),
    ]
    assert list(r.replay.finish) == [1, 4, 3, 2]


def test_nested_wait_never_overflows_its_memory():
    rng = np.random.default_rng(3)
    n = 3000
    arr = np.cumsum(rng.exponential(0.02, n))
    p, o = rng.integers(20, 200, n), rng.integers(1, 300, n)
    law = IterationLaw(PrefillLaw(0.01, 2e-5, 0.0), DecodeLaw((0.01, 1e-7, 1e-4)))
    r = replay_wait(law, nested_wait_policy(20000, [4, 4, 4], [32, 128], buffer=1000), arr, p, o)
    assert r.peak_reserved <= 19000
    assert np.all(np.isfinite(r.replay.finish)) and np.all(r.replay.finish >= r.replay.arrival)


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
    r = replay_wait(law, wait_policy(1e9, [n], [o]), arr, [l] * (k * n), [o] * (k * n), trace=True)
    mid = r.decisions[100:-100]  # past the ramp-up, before the drain
    # arrivals do not fall on iteration starts, so single iterations vary; their mean settles at tau*
    # and the mean number decoding at (lam tau*) (o - 1)
    assert np.mean(np.diff([d[0] for d in mid])) == pytest.approx(eq.iteration_time, rel=0.02)
    assert np.mean([B for *_, B in mid]) == pytest.approx(eq.per_stage[0] * (o - 1), rel=0.02)
    assert eq.per_stage[0] == pytest.approx(n, rel=1e-9)


def test_bad_policies():
    with pytest.raises(ScenarioError):
        nested_wait_policy(100, [2], [2])
    with pytest.raises(ScenarioError):
        wait_policy(100, [0], [4])
    with pytest.raises(ScenarioError, match="memory - buffer"):
        replay_wait(UNIT, wait_policy(5, [1], [4]), [0.0], [3], [4])
    assert math.isinf(fluid_benchmark([1.0], [1], [1], 1.0, 1.0).memory)
