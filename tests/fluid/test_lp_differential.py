"""Differential tests: the Pyomo/HiGHS fluid LP against an independent cvxpy/Clarabel formulation.

Four hypothesis tests (bundled / separate, without / with SLIs), 30 feasible examples each: 120
random feasible instances, derandomised so that every run draws the same ones. (60 each until issue 47's
sixth cut; the 30 drawn still reach every branch: infeasible draws in all four tests, the HiGHS fallback
for an inaccurate Clarabel, Prop. 3.2's buffer-free case, one to four classes, and each SLI hard and soft.) Both solvers must
agree on the optimum to 1e-6 (relative); on the infeasible instances drawn on the way (rejected with
``assume``, so not counted) both must report infeasibility. The Pyomo models are cached per
(classes, pricing, SLI rows) and re-used through FluidModel.update, which the check covers too.

Also here: the proportional-fairness program (conic, cvxpy only) against closed forms.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import fluidopt
from fluidopt import GPUProfile, InfeasibleError, RequestClass, Scenario, SolverError
from fluidopt.core.model import paper_gpu, paper_scenario
from fluidopt.fluid import (
    TPOT,
    DecodeFairness,
    FluidModel,
    MaxPrefillWait,
    MinServedFraction,
    PrefillFairness,
    solve_fluid,
    solve_fluid_cvxpy,
    solve_proportional_fair,
)

EXAMPLES = 30
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
RTOL = 1e-6


@st.composite
def scenarios(draw) -> Scenario:
    """GPUs and workloads over (a superset of) the ranges of the paper's Fig. 7 instances."""
    gpu = GPUProfile.from_gamma(
        alpha=draw(st.floats(0.005, 0.03)),
        beta=draw(st.floats(1e-5, 1e-3)),
        gamma=draw(st.floats(10.0, 60.0)),
        chunk=draw(st.sampled_from([64, 128, 256, 512])),
        batch=draw(st.integers(2, 48)),
    )
    n = draw(st.integers(1, 4))
    gpus = draw(st.integers(1, 1000))
    classes = []
    for i in range(n):
        classes.append(RequestClass(
            name=f"c{i}",
            prompt=draw(st.floats(20.0, 4000.0)),
            decode=draw(st.floats(20.0, 4000.0)),
            rate=draw(st.floats(0.02, 2.0)) * gpus,
            # theta = 0 (no abandonment) now and then: such instances can be infeasible.
            patience=0.0 if draw(st.integers(0, 9)) == 0 else draw(st.floats(0.01, 1.0)),
            decode_price=draw(st.one_of(st.none(), st.floats(0.0, 1.0))),
        ))
    return Scenario(gpu=gpu, gpus=gpus, classes=tuple(classes), prefill_price=draw(st.floats(0.001, 1.0)),
                    decode_price=draw(st.floats(0.001, 1.0)), name="random")


@st.composite
def sli_sets(draw, scenario: Scenario) -> tuple:
    g = scenario.gpu
    names = scenario.class_names
    out = []

    def penalty():
        return draw(st.one_of(st.none(), st.floats(0.1, 1e4)))

    if draw(st.booleans()):
        out.append(PrefillFairness(draw(st.floats(0.0, 0.3)), penalty()))
    if draw(st.booleans()):
        out.append(DecodeFairness(draw(st.floats(0.0, 10.0)), penalty()))
    if draw(st.booleans()):
        lo, hi = sorted((1 / g.gamma, g.tau_mix))
        out.append(TPOT(lo + draw(st.floats(0.0, 1.2)) * (hi - lo) + 1e-6, penalty()))
    for c in names:
        if draw(st.integers(0, 3)) == 0:
            out.append(MinServedFraction(c, draw(st.floats(0.0, 1.0)), penalty()))
        if draw(st.integers(0, 3)) == 0:
            out.append(MaxPrefillWait(c, draw(st.floats(0.0, 20.0)), penalty()))
    return tuple(out)


_models: dict[tuple, FluidModel] = {}


def pyomo_solve(scenario: Scenario, pricing: str, slis: tuple):
    """Solve through a cached FluidModel (built once per structure, then updated)."""
    key = (scenario.class_names, pricing, tuple((s.key, s.penalty is None) for s in slis))
    fm = _models.get(key)
    if fm is None:
        fm = _models[key] = FluidModel(scenario, pricing, slis)
    else:
        fm.update(scenario, slis=slis)
    return fm.solve()


def hand_rates(scenario: Scenario) -> dict[str, np.ndarray]:
    """The LP's coefficients from the scenario's raw fields (not Scenario.rates(), not the LP module).

    tau_mix = alpha + beta C; mu_p = C / (P tau_mix), mu_m = 1 / (D tau_mix), mu_s = gamma / D with
    gamma = 1 / tau_solo; lambda per GPU; a class's own price overrides the scenario's.
    """
    g = scenario.gpu
    tau_mix = g.alpha + g.beta * g.chunk
    P = np.array([c.prompt for c in scenario.classes], dtype=float)
    D = np.array([c.decode for c in scenario.classes], dtype=float)
    cp = np.array([scenario.prefill_price if c.prefill_price is None else c.prefill_price for c in scenario.classes])
    cd = np.array([scenario.decode_price if c.decode_price is None else c.decode_price for c in scenario.classes])
    return {
        "lam": np.array([c.rate for c in scenario.classes]) / scenario.gpus,
        "theta": np.array([c.patience for c in scenario.classes], dtype=float),
        "mu_p": g.chunk / (P * tau_mix), "mu_m": 1.0 / (D * tau_mix), "mu_s": 1.0 / (g.tau_solo * D),
        "prefill_reward": cp * P, "decode_reward": cd * D,
    }


def hand_revenue(sol, scenario: Scenario, pricing: str) -> float:
    """Revenue per GPU per second of the point ``sol``: bundled w_i = c_p P_i + c_d D_i per decode
    completion; separate c_p P_i per prefill completion and c_d D_i per decode completion."""
    r = hand_rates(scenario)
    decodes = r["mu_m"] * sol.y_mixed + r["mu_s"] * sol.y_solo
    if pricing == "bundled":
        return float(((r["prefill_reward"] + r["decode_reward"]) * decodes).sum())
    return float((r["prefill_reward"] * r["mu_p"] * sol.x).sum() + (r["decode_reward"] * decodes).sum())


def check_equations(sol, scenario: Scenario, pricing: str) -> None:
    """The HiGHS point satisfies the LP as written in docs/lp.md (checked in plain numpy, hand-derived rates)."""
    r, B = hand_rates(scenario), scenario.gpu.batch
    tol = 1e-6
    for a in (sol.x, sol.y_mixed, sol.y_solo, sol.q_prefill, sol.q_decode):
        assert np.all(a >= -tol)
    X = sol.x.sum()
    assert X <= 1 + tol
    assert sol.y_mixed.sum() <= (B - 1) * X + tol * B
    assert sol.y_solo.sum() <= B * (1 - X) + tol * B
    decodes = r["mu_m"] * sol.y_mixed + r["mu_s"] * sol.y_solo
    np.testing.assert_allclose(r["mu_p"] * sol.x + r["theta"] * sol.q_prefill, r["lam"], rtol=tol, atol=tol)
    np.testing.assert_allclose(r["mu_p"] * sol.x - r["theta"] * sol.q_decode, decodes, rtol=tol, atol=tol)
    np.testing.assert_allclose(sol.throughput, decodes, rtol=1e-9, atol=1e-12)
    assert sol.revenue_per_gpu == pytest.approx(hand_revenue(sol, scenario, pricing), rel=1e-9, abs=1e-12)


def differential(scenario: Scenario, pricing: str, slis: tuple) -> None:
    try:
        a = pyomo_solve(scenario, pricing, slis)
    except InfeasibleError as e:
        assert e.conflicting, "HiGHS must name the conflicting rows"
        with pytest.raises(InfeasibleError):
            solve_fluid_cvxpy(scenario, pricing, slis)
        # Checked, but not counted: every one of the max_examples counted instances is feasible.
        assume(False)
    try:
        b = solve_fluid_cvxpy(scenario, pricing, slis)
    except SolverError as e:
        # Clarabel (an interior-point method) can stop short on a badly scaled instance; the same
        # independent cvxpy formulation is then solved by cvxpy's HiGHS interface instead.
        if "optimal_inaccurate" not in str(e):
            raise
        b = solve_fluid_cvxpy(scenario, pricing, slis, solver="HIGHS")
    assert a.objective_per_gpu == pytest.approx(b.objective_per_gpu, rel=RTOL, abs=1e-9)
    check_equations(a, scenario, pricing)
    # the cvxpy point, evaluated by hand, earns what cvxpy reports (its own coefficients are its own)
    assert b.revenue_per_gpu == pytest.approx(hand_revenue(b, scenario, pricing), rel=RTOL, abs=1e-9)
    if slis:
        assert np.all(a.q_decode == 0.0)
    elif pricing == "bundled" and scenario.gpu.decode_buffer_free:
        assert np.all(a.q_decode <= 1e-9), "Prop. 3.2: the bundled optimum returned has no decode buffer"


@pytest.mark.integration
@SETTINGS
@given(scenarios())
def test_bundled_agrees_with_cvxpy(scenario):
    differential(scenario, "bundled", ())


@pytest.mark.integration
@SETTINGS
@given(scenarios())
def test_separate_agrees_with_cvxpy(scenario):
    differential(scenario, "separate", ())


@pytest.mark.integration
@SETTINGS
@given(st.data())
def test_bundled_with_slis_agrees_with_cvxpy(data):
    scenario = data.draw(scenarios())
    differential(scenario, "bundled", data.draw(sli_sets(scenario)))


@pytest.mark.integration
@SETTINGS
@given(st.data())
def test_separate_with_slis_agrees_with_cvxpy(data):
    scenario = data.draw(scenarios())
    differential(scenario, "separate", data.draw(sli_sets(scenario)))


def test_cvxpy_duals_match_highs_on_paper_instance():
    """The paper instance's duals are unique (non-degenerate); both formulations report the same."""
    s = fluidopt.default_scenario()
    for slis in ((), (TPOT(0.0242),)):
        a, b = solve_fluid(s, "bundled", slis), solve_fluid_cvxpy(s, "bundled", slis)
        for row in ("mixed_decode_capacity", "solo_decode_capacity", "prefill_balance[long-prompt]"):
            assert b.duals[row] == pytest.approx(a.duals[row], rel=1e-6, abs=1e-6)
        assert b.gpu_shadow_price == pytest.approx(a.gpu_shadow_price, rel=1e-6, abs=1e-6)
        assert b.sli_shadow_prices == pytest.approx(a.sli_shadow_prices, rel=1e-6, abs=1e-6)


def test_cvxpy_with_highs_backend_agrees():
    s = fluidopt.default_scenario()
    assert solve_fluid_cvxpy(s, "separate", solver="HIGHS").objective_per_gpu == pytest.approx(298.58655675, rel=1e-9)


# -- proportional fairness -----------------------------------------------------------------------
def twin_classes(lam: float) -> Scenario:
    cls = {"prompt": 1000.0, "decode": 500.0, "rate": lam * 10, "patience": 0.2}
    return Scenario(gpu=paper_gpu(), gpus=10, prefill_price=0.1, decode_price=0.2, name="twins",
                    classes=(RequestClass("a", **cls), RequestClass("b", **cls)))


def test_proportional_fair_splits_capacity_by_weight():
    """Two identical classes, demand far above capacity: the feasible throughputs are exactly
    {t_a + t_b <= T*} (T* = the LP's maximal throughput, the classes being interchangeable), and
    maximising w_a log t_a + w_b log t_b on it gives t_i = T* w_i / (w_a + w_b)."""
    s = twin_classes(lam=5.0)
    lp = solve_fluid(s)
    T = lp.throughput.sum()
    assert T < 5.0  # capacity-bound: lambda does not bind
    pf = solve_proportional_fair(s, weights=[1.0, 2.0])
    np.testing.assert_allclose(pf.throughput, [T / 3, 2 * T / 3], rtol=1e-6)
    assert pf.utility == pytest.approx(np.log(T / 3) + 2 * np.log(2 * T / 3), rel=1e-7)
    assert pf.revenue_per_gpu == pytest.approx(lp.objective_per_gpu, rel=1e-6)  # same total, same price


def test_proportional_fair_single_class_is_max_throughput():
    """With one class, log is increasing, so PF maximises throughput, i.e. (bundled, w > 0) revenue."""
    s = Scenario(gpu=paper_gpu(), gpus=4, prefill_price=0.1, decode_price=0.2, name="one",
                 classes=(RequestClass("only", prompt=300, decode=1000, rate=8.0, patience=0.1),))
    lp, pf = solve_fluid(s), solve_proportional_fair(s)
    assert pf.throughput[0] == pytest.approx(lp.throughput[0], rel=1e-7)


def test_proportional_fair_trades_revenue_for_balance():
    """At 4x the paper's load the revenue LP starves short-prompt; proportional fairness serves both."""
    s = paper_scenario(lam=(2.0, 2.0))
    lp, pf = solve_fluid(s), solve_proportional_fair(s)
    assert lp.throughput[0] == 0.0 and lp.throughput[1] > 1.4
    assert pf.throughput.min() > 0.3
    assert pf.revenue_per_gpu < 0.7 * lp.revenue_per_gpu
    assert pf.utility == pytest.approx(np.log(pf.throughput).sum(), rel=1e-9)
    # Optimality along a feasible segment: moving towards the LP point lowers the utility.
    for t in (0.01, 0.1, 0.5):
        mix = (1 - t) * pf.throughput + t * lp.throughput
        assert np.log(mix).sum() < pf.utility
    with pytest.raises(fluidopt.ScenarioError, match=r"weights: expected 2 finite numbers >= 0 \(one per class\)"):
        solve_proportional_fair(s, weights=[1.0, -1.0])

@pytest.mark.parametrize("case", ["separate-paper", "bundled-slow-solo"])
def test_least_buffer_matches_a_cvxpy_second_stage(case):
    """The lexicographic stage returns (to ~1e-6) the smallest total decode buffer among optima,
    here checked against a second stage written in cvxpy: min sum q_d s.t. revenue >= R* (1 - 1e-10)."""
    import cvxpy as cp

    from fluidopt.fluid.convex import CLARABEL_TIGHT, _formulate

    s = fluidopt.default_scenario()
    pricing = "separate"
    if case == "bundled-slow-solo":  # gamma tau < (B-1)/B: Prop. 3.2 does not apply
        s = Scenario(gpu=GPUProfile.from_gamma(alpha=0.0174, beta=6.2e-5, gamma=20.0, chunk=256, batch=16),
                     gpus=s.gpus, classes=s.classes, prefill_price=0.1, decode_price=0.2)
        pricing = "bundled"
    sol = solve_fluid(s, pricing)
    f = _formulate(s, pricing, ())
    qd = f["vars"][4]
    rows = list(f["rows"].values()) + f["extra"] + [f["revenue"] >= sol.objective_per_gpu * (1 - 1e-10)]
    prob = cp.Problem(cp.Minimize(cp.sum(qd)), rows)
    prob.solve(solver="CLARABEL", **CLARABEL_TIGHT)
    assert prob.status == "optimal"
    assert prob.value > 0.01  # a buffer is needed at every optimum here: the check is not vacuous
    assert sol.q_decode.sum() == pytest.approx(prob.value, rel=1e-5, abs=1e-7)
