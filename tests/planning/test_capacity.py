"""The fluid fleet bound: one LP with n as a variable, checked against a bisection over the per-GPU LP."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluidopt.core.errors import ScenarioError, SolverError
from fluidopt.core.model import GPUProfile, RequestClass, Scenario, paper_scenario
from fluidopt.fluid.capacity import fluid_fleet_bound
from fluidopt.fluid.lp import FluidModel
from fluidopt.fluid.sli import TPOT, MaxPrefillWait, MinServedFraction, PrefillFairness


def _per_gpu(scenario: Scenario, n: float) -> Scenario:
    """The per-GPU LP's scenario at a (continuous) fleet of n GPUs: one 'GPU' with rates Lambda / n."""
    from dataclasses import replace

    return replace(scenario, gpus=1, classes=tuple(replace(c, rate=c.rate / n) for c in scenario.classes))


def bisect_fleet(scenario: Scenario, slis, rtol: float = 1e-9) -> float:
    """Smallest n with a feasible per-GPU fluid LP (with MinServedFraction etc.), by bisection."""
    fm = FluidModel(_per_gpu(scenario, 1.0), "bundled", slis)
    fm.watch_structure = False
    # HiGHS's default 1e-7 absolute row tolerance is a 1e-5 relative error on a TPOT row whose
    # right-hand side eta - 1/gamma is a few milliseconds: tighten it for a 1e-6 comparison.
    fm.solver.config.solver_options["primal_feasibility_tolerance"] = 1e-10
    fm.solver.config.solver_options["dual_feasibility_tolerance"] = 1e-10

    opts = fm.solver.config.solver_options

    def feasible(n: float) -> bool:
        fm.update(_per_gpu(scenario, n))
        try:
            return fm.solve(raise_infeasible=False).status == "optimal"
        except SolverError:  # HiGHS stopped short of the tight tolerances: ask again at its defaults
            opts["primal_feasibility_tolerance"] = opts["dual_feasibility_tolerance"] = 1e-7
            try:
                return fm.solve(raise_infeasible=False).status == "optimal"
            except SolverError:
                # HiGHS could prove neither (presolve said "infeasible or unbounded", the simplex then
                # "unknown"): seen only on nearly infeasible LPs just below n* (served = 1 with
                # abandonment leaves no slack at all). Counted infeasible; were it feasible, the
                # comparison below would fail.
                return False
            finally:
                opts["primal_feasibility_tolerance"] = opts["dual_feasibility_tolerance"] = 1e-10

    hi = 1.0
    while not feasible(hi):
        hi *= 2.0
        assert hi < 1e9
    lo = hi / 2.0
    while feasible(lo) and lo > 1e-9:
        hi, lo = lo, lo / 2.0
    while hi - lo > rtol * hi:
        mid = 0.5 * (lo + hi)
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    return hi


@st.composite
def instances(draw):
    k = draw(st.integers(1, 3))
    gpu = GPUProfile.from_gamma(
        alpha=draw(st.floats(0.01, 0.03)), beta=10 ** draw(st.floats(-5, -3.3)), gamma=draw(st.floats(15, 60)),
        chunk=draw(st.sampled_from([128, 256, 512])), batch=draw(st.sampled_from([8, 16, 32])))
    classes = []
    slis = []
    for i in range(k):
        theta = draw(st.sampled_from([0.0, 0.05, 0.1, 0.5]))
        classes.append(RequestClass(f"c{i}", prompt=draw(st.floats(100, 3000)), decode=draw(st.floats(50, 2000)),
                                    rate=draw(st.floats(1.0, 400.0)), patience=theta))
        slis.append(MinServedFraction(f"c{i}", draw(st.floats(0.3, 1.0))))
        if theta > 0 and draw(st.booleans()):
            slis.append(MaxPrefillWait(f"c{i}", draw(st.floats(0.05, 5.0))))
    if draw(st.booleans()):
        slis.append(TPOT(gpu.tau_solo * draw(st.floats(1.05, 2.0))))
    if k > 1 and draw(st.booleans()):
        slis.append(PrefillFairness(draw(st.floats(0.005, 0.3))))
    return Scenario(gpu=gpu, gpus=1, classes=tuple(classes), prefill_price=0.1, decode_price=0.2), slis


@pytest.mark.integration
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_one_lp_equals_bisection(inst):
    scenario, slis = inst
    fb = fluid_fleet_bound(scenario, slis)
    n_bis = bisect_fleet(scenario, slis)
    assert fb.gpus == pytest.approx(n_bis, rel=1e-6)
    assert fb.gpus_int == math.ceil(fb.gpus - 1e-9 * fb.gpus)
    # the operating point at n* meets the served fractions it was asked for
    for s in slis:
        if isinstance(s, MinServedFraction):
            i = scenario.class_names.index(s.cls)
            mu_p = scenario.gpu.chunk / (scenario.classes[i].prompt * scenario.gpu.tau_mix)
            served = mu_p * fb.x[i] * fb.gpus / scenario.classes[i].rate
            assert served >= s.fraction - 1e-7
    assert fb.binding, "some row must bind at the least fleet"


def test_paper_instance_hand_check():
    """Served 1.0 with no abandonment allowed: every arrival prefilled and decoded. By hand:
    prefill GPUs X_i = Lambda_i / mu_p,i; decode slots Lambda_i / mu; n* from the capacity rows."""
    sc = paper_scenario(gpus=500)
    fb = fluid_fleet_bound(sc, [MinServedFraction(c, 1.0) for c in sc.class_names])
    g = sc.gpu
    B = g.batch
    lam = [c.rate for c in sc.classes]
    X = sum(l / (g.chunk / (c.prompt * g.tau_mix)) for l, c in zip(lam, sc.classes))
    # decode work in slot-seconds per second if all on solo GPUs (faster: gamma > 1/tau): sum Lambda D / gamma;
    # mixed GPUs hold B-1 slots at 1/tau tokens per s. The cheapest split fills the mixed GPUs' slots first.
    work_tokens = sum(l * c.decode for l, c in zip(lam, sc.classes))  # tokens per second to decode
    mixed_tokens = X * (B - 1) / g.tau_mix
    solo_slots = max(0.0, work_tokens - mixed_tokens) / g.gamma
    n_hand = X + solo_slots / B
    assert fb.gpus == pytest.approx(n_hand, rel=1e-9)
    assert fb.binding_sli is not None and fb.binding_sli.startswith("served_fraction")


def test_tpot_no_fleet_can_meet_names_the_solo_time():
    sc = paper_scenario(gpus=10)
    with pytest.raises(ScenarioError, match=r"no fleet size meets TPOT <= 0.01 s because the GPU law's solo decode time is 0.022"):
        fluid_fleet_bound(sc, [MinServedFraction("short-prompt", 0.9), TPOT(0.01)])


def test_no_demand_to_serve_is_an_error():
    sc = paper_scenario(gpus=10)
    with pytest.raises(ScenarioError, match="no demand to serve"):
        fluid_fleet_bound(sc, [TPOT(0.05)])
