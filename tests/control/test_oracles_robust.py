"""Oracles for staffed Prioritize-and-Route's staffing level (fluidopt.control.robust), recomputed from the
module and class docstrings with an Erlang-A written out here (birth-death chain, not the library's).

The rule (robust.py, ``safety_mixed_gpus`` and ``StaffedPrioritizeAndRoute``): the classes served in full
pool into one M/M/c+M queue on the c0 = ceil(n X*) reserved slots (arrivals L = n sum lambda_i, mean
service a / L with a = n sum x_i*, patience theta); one mixed GPU at a time is added while the revenue it
saves, w L (P_ab(c) - P_ab(c+1)) with w the arrival-weighted prefill-balance dual, exceeds its cost: the
solo decode slot it reserves, v_s, plus -- while its prefill slot is busy, L dP / mu slot-seconds per
second -- the slower decodes of its **other B - 1** slots, (B - 1)(v_s - v_m) each second.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

import fluidopt
from fluidopt.control.registry import make_controller
from fluidopt.control.snapshot import ClusterSnapshot
from fluidopt.fluid import solve_fluid


def p_abandon(lam: float, mu: float, c: int, theta: float) -> float:
    """Erlang A (M/M/c+M): share of arrivals that abandon = theta E[queue] / lam, from the stationary
    distribution of the birth-death chain (births lam; deaths n mu up to c, c mu + (n - c) theta above)."""
    p = [1.0]
    n = 0
    while True:
        n += 1
        death = n * mu if n <= c else c * mu + (n - c) * theta
        p.append(p[-1] * lam / death)
        if n > c and p[-1] < 1e-16 * sum(p):
            break
    tot = sum(p)
    eq = sum((k - c) * pk for k, pk in enumerate(p) if k > c) / tot
    return theta * eq / lam


def instance(n: int):
    """The paper's two classes at a doubled decode price: there the busy cost decides the staffing."""
    base = fluidopt.default_scenario()
    s = base.with_prices(decode=2 * base.decode_price).with_gpus(n)
    s = replace(s, classes=tuple(replace(c, patience=0.1) for c in s.classes))
    return s, solve_fluid(s, "separate")


def hand_staffing(s, sol, n: int, busy_slots: int) -> tuple[int, int]:
    r = s.rates()
    lam, x, mu_p = (np.asarray(v, float) for v in (r.lam, sol.x, r.mu_p))
    assert np.allclose(mu_p * x, lam, rtol=1e-6)  # both classes prefilled in full: one pool on all M slots
    d = sol.duals
    v_s, v_m = d["solo_decode_capacity"], d["mixed_decode_capacity"]
    value = np.array([d[f"prefill_balance[{nm}]"] for nm in s.class_names])
    M = math.ceil(n * x.sum() - 1e-9)
    L, a = n * lam.sum(), n * x.sum()
    mu, w = L / a, float(lam @ value / lam.sum())
    extra = 0
    while extra < min(n - M, math.ceil(3 * math.sqrt(a)) + 3):
        saved = L * (p_abandon(L, mu, M + extra, 0.1) - p_abandon(L, mu, M + extra + 1, 0.1))
        if w * saved <= v_s + busy_slots * (v_s - v_m) * saved / mu:
            break
        extra += 1
    return M, extra


def test_staffing_charges_the_other_b_minus_1_slots_of_a_busy_prefill_gpu():
    n = 15
    s, sol = instance(n)
    B = s.gpu.batch
    M, extra = hand_staffing(s, sol, n, B - 1)
    # the instance is one where the count of slowed decodes matters: charging all B slots staffs one fewer
    assert extra == 1 and hand_staffing(s, sol, n, B)[1] == 0
    c = make_controller("staffed-prioritize-and-route", s, plan=sol)
    assert c.plan_mixed_gpus(n) == M + extra
    snap = ClusterSnapshot(n, B, s.class_names, seed=1)
    snap.setup(c)
    assert c.mixed_gpus == M + 1 and c.extra_mixed == 1 and len(snap.idle_prefill(0)) == M + 1
    off = make_controller("staffed-prioritize-and-route", s, plan=sol, staffing=False)
    assert off.plan_mixed_gpus(n) == M


@pytest.mark.parametrize("n", [19, 30, 35])
def test_staffing_level_matches_the_hand_rule_at_other_fleet_sizes(n):
    s, sol = instance(n)
    M, extra = hand_staffing(s, sol, n, s.gpu.batch - 1)
    assert make_controller("staffed-prioritize-and-route", s, plan=sol).plan_mixed_gpus(n) == M + extra
    if n == 19:  # here charging B - 2 slowed decodes would staff one more GPU than B - 1
        assert extra == 0 and hand_staffing(s, sol, n, s.gpu.batch - 2)[1] == 1


def test_my_erlang_a_agrees_with_closed_cases():
    # theta = mu: every customer in the system leaves at rate mu, waiting or served, so N is the M/M/inf
    # occupancy, Poisson(lam / mu); the abandonment share is theta E[(N - c)+] / lam
    lam, mu = 3.0, 1.0
    pk = [math.exp(-3) * 3 ** k / math.factorial(k) for k in range(80)]
    want = sum((k - 2) * p for k, p in enumerate(pk) if k > 2) * mu / lam
    assert p_abandon(lam, mu, 2, mu) == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("option", ["backpressure", "caps", "staffing", "overflow", "resolve", "elastic",
                                    "elastic_slots", "coupled"])
def test_a_non_boolean_switch_is_named(option):
    from fluidopt.core.errors import ScenarioError

    s = fluidopt.default_scenario().with_gpus(20)
    with pytest.raises(ScenarioError, match=f"backpressure-gate-and-route: {option}: expected true or false, got 'yes'"):
        make_controller("backpressure-gate-and-route", s, plan=solve_fluid(s), **{option: "yes"})


def test_mixing_cost_is_gamma_times_tau():
    """'a mixed iteration slows decodes' is gamma tau_mix > 1 (solo tokens per second times the mixed
    iteration): 200 * 0.02 = 4 here, 20 * 0.03 = 0.6 on a GPU whose solo decode is slow."""
    from fluidopt import GPUProfile, RequestClass, Scenario

    for tau_solo, tau_mix, want in ((0.005, 0.02, 4.0), (0.05, 0.03, 0.6)):
        gpu = GPUProfile(alpha=tau_mix - 0.001 * 10, beta=0.001, tau_solo=tau_solo, chunk=10, batch=4)
        s = Scenario(gpu=gpu, gpus=4, classes=(RequestClass("a", prompt=20, decode=5, rate=2.0, patience=0.5),),
                     prefill_price=1.0, decode_price=1.0)
        c = make_controller("backpressure-gate-and-route", s, plan=solve_fluid(s))
        assert c._gamma_tau == pytest.approx(want, rel=1e-9)
