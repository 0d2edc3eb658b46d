"""The fluid LP (docs/model.md): paper check values, single-class closed forms, duals, the model API.

Expected values are derived here, from the published inputs (P, D, alpha, beta, gamma, C, B, lambda,
theta, prices), never through ``Scenario.rates()`` or ``fluidopt.fluid.lp.objective_coefficients``:
a wrong rate or reward in the model would otherwise appear on both sides of a check.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pyomo.environ as pyo
import pytest

import fluidopt
from fluidopt import GPUProfile, InfeasibleError, RequestClass, Scenario, ScenarioError
from fluidopt.core.model import paper_gpu, paper_scenario
from fluidopt.fluid import (
    TPOT,
    FluidModel,
    MinServedFraction,
    build_fluid_model,
    solve_fluid,
)

# The paper's instance, as published: I = 2, B = 16, C = 256, alpha = 0.0174 s, beta = 6.2e-5 s per
# token, gamma = 45.45 tokens/s; (P, D) = (300, 1000) and (3000, 400); lambda = 0.5 and theta = 0.1
# per class and GPU; c_p = 0.1, c_d = 0.2.
ALPHA, BETA, GAMMA, CHUNK, BATCH = 0.0174, 6.2e-5, 45.45, 256, 16
P_PAPER, D_PAPER = np.array([300.0, 3000.0]), np.array([1000.0, 400.0])
LAM_PAPER, THETA_PAPER = np.array([0.5, 0.5]), np.array([0.1, 0.1])
CP, CD = 0.1, 0.2


def hand_rates(P, D, *, alpha=ALPHA, beta=BETA, gamma=GAMMA, chunk=CHUNK) -> dict[str, np.ndarray]:
    """mu_p = C / (P tau_mix), mu_m = 1 / (D tau_mix), mu_s = gamma / D, tau_mix = alpha + beta C."""
    P, D = np.asarray(P, dtype=float), np.asarray(D, dtype=float)
    tau_mix = alpha + beta * chunk
    return {"mu_p": chunk / (P * tau_mix), "mu_m": 1.0 / (D * tau_mix), "mu_s": gamma / D}


def hand_objective(sol, P, D, pricing, cp=CP, cd=CD, **gpu) -> float:
    """Revenue per GPU per second of the point ``sol``, evaluated from the definitions.

    Bundled: w_i = c_p P_i + c_d D_i per completed decode, completions mu_m,i y_m,i + mu_s,i y_s,i.
    Separate: c_p P_i per completed prefill (mu_p,i x_i) plus c_d D_i per completed decode.
    """
    r = hand_rates(P, D, **gpu)
    P, D = np.asarray(P, dtype=float), np.asarray(D, dtype=float)
    decodes = r["mu_m"] * sol.y_mixed + r["mu_s"] * sol.y_solo
    if pricing == "bundled":
        return float(((cp * P + cd * D) * decodes).sum())
    return float((cp * P * r["mu_p"] * sol.x).sum() + (cd * D * decodes).sum())


@pytest.fixture(scope="module")
def separate(paper):
    return solve_fluid(paper, "separate")


def rhs_dot_duals(sol, scenario) -> float:
    """Sum over rows of rhs * dual for the rows without SLIs (strong duality: equals the optimum)."""
    B = scenario.gpu.batch
    lam = np.array([c.rate for c in scenario.classes]) / scenario.gpus  # per GPU
    total = sol.duals["prefill_capacity"] * 1 + sol.duals["solo_decode_capacity"] * B
    total += sum(lam[i] * sol.duals[f"prefill_balance[{c}]"] for i, c in enumerate(scenario.class_names))
    return total


# -- paper instance --------------------------------------------------------------------------------
def test_paper_bundled_optimum(bundled):
    assert bundled.status == "optimal"
    assert bundled.objective_per_gpu == pytest.approx(297.70, abs=0.01)
    assert bundled.objective_per_gpu == pytest.approx(297.7032, abs=1e-4)  # scipy linprog
    np.testing.assert_allclose(bundled.x, [0.01826, 0.19495], atol=1e-5)
    assert bundled.prefill_occupancy == pytest.approx(0.21321, abs=1e-5)
    assert bundled.objective == pytest.approx(500 * bundled.objective_per_gpu)
    assert bundled.mixed_gpus == math.ceil(500 * 0.21321144) == 107
    assert bundled.solo_gpus == 393


def test_paper_bundled_has_no_decode_buffer(paper, bundled):
    """Prop. 3.2: gamma tau >= (B-1)/B, so the returned bundled optimum has q_d = 0."""
    assert paper.gpu.decode_buffer_free
    assert np.all(bundled.q_decode == 0.0)


def test_paper_separate_optimum(separate):
    assert separate.objective_per_gpu == pytest.approx(298.59, abs=0.01)
    assert separate.objective_per_gpu == pytest.approx(298.5866, abs=1e-4)
    assert separate.prefill_occupancy == pytest.approx(0.21445, abs=1e-5)
    # Separate pricing keeps a decode backlog at every optimum: all prefills are served ...
    np.testing.assert_allclose(separate.prefill_throughput, separate.lam, rtol=1e-9)
    # ... but not all decodes; the lexicographic stage picks the least backlog.
    assert separate.q_decode.sum() > 0.3
    unpolished = solve_fluid(fluidopt.default_scenario(), "separate", lexicographic=False)
    assert unpolished.objective_per_gpu == pytest.approx(separate.objective_per_gpu, rel=1e-12)
    assert separate.q_decode.sum() <= unpolished.q_decode.sum() + 1e-9


def test_hand_derived_rates_of_the_paper_instance(paper):
    """The rates and rewards, from the published inputs (and what Scenario.rates() must agree with)."""
    tau_mix = 0.0174 + 6.2e-5 * 256
    assert tau_mix == pytest.approx(0.033272, rel=1e-12)
    r = hand_rates(P_PAPER, D_PAPER)
    np.testing.assert_allclose(r["mu_p"], [256 / (300 * 0.033272), 256 / (3000 * 0.033272)], rtol=1e-12)
    np.testing.assert_allclose(r["mu_m"], [1 / (1000 * 0.033272), 1 / (400 * 0.033272)], rtol=1e-12)
    np.testing.assert_allclose(r["mu_s"], [45.45 / 1000, 45.45 / 400], rtol=1e-12)
    model = paper.rates()
    for k, v in r.items():
        np.testing.assert_allclose(getattr(model, k), v, rtol=1e-12, err_msg=k)
    np.testing.assert_allclose(model.lam, LAM_PAPER, rtol=1e-12)
    np.testing.assert_allclose(model.theta, THETA_PAPER, rtol=1e-12)
    np.testing.assert_allclose(model.w, [0.1 * 300 + 0.2 * 1000, 0.1 * 3000 + 0.2 * 400], rtol=1e-12)  # 230, 380


@pytest.mark.parametrize("pricing,published", [("bundled", 297.70), ("separate", 298.59)])
def test_published_optimum_by_hand(paper, pricing, published):
    """The returned point, evaluated by hand, earns the published R* and satisfies every row."""
    sol = solve_fluid(paper, pricing)
    r = hand_rates(P_PAPER, D_PAPER)
    value = hand_objective(sol, P_PAPER, D_PAPER, pricing)
    assert value == pytest.approx(published, abs=0.005)
    assert sol.objective_per_gpu == pytest.approx(value, rel=1e-9)
    assert sol.revenue_per_gpu == pytest.approx(value, rel=1e-9)
    if pricing == "bundled":
        np.testing.assert_allclose(sol.x, [0.01826, 0.19495], atol=5e-6)
    tol = 1e-7  # HiGHS's feasibility tolerance
    for a in (sol.x, sol.y_mixed, sol.y_solo, sol.q_prefill, sol.q_decode):
        assert np.all(a >= -tol)
    X = sol.x.sum()
    assert X <= 1 + tol
    assert sol.y_mixed.sum() <= (BATCH - 1) * X + tol
    assert sol.y_solo.sum() <= BATCH * (1 - X) + tol
    # prefill_balance[i]: mu_p x + theta q_p = lambda; decode_balance[i]: mu_p x - theta q_d = decode completions
    np.testing.assert_allclose(r["mu_p"] * sol.x + THETA_PAPER * sol.q_prefill, LAM_PAPER, rtol=1e-9, atol=tol)
    decodes = r["mu_m"] * sol.y_mixed + r["mu_s"] * sol.y_solo
    np.testing.assert_allclose(r["mu_p"] * sol.x - THETA_PAPER * sol.q_decode, decodes, rtol=1e-9, atol=tol)
    np.testing.assert_allclose(sol.throughput, decodes, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(sol.served_fraction, decodes / LAM_PAPER, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(sol.prefill_wait, sol.q_prefill / LAM_PAPER, rtol=1e-9, atol=1e-12)


def test_published_optimum_by_an_independent_lp():
    """R* of both pricings, re-solved from scratch with scipy's HiGHS on hand-built rows."""
    from scipy.optimize import linprog

    r = hand_rates(P_PAPER, D_PAPER)
    I, B = 2, BATCH
    # variables: x (I), y_m (I), y_s (I), q_p (I), q_d (I)
    nv = 5 * I

    def col(block: int, i: int) -> int:
        return block * I + i

    A_ub, b_ub = [], []
    row = np.zeros(nv)
    row[[col(0, i) for i in range(I)]] = 1.0
    A_ub.append(row), b_ub.append(1.0)  # sum x <= 1
    row = np.zeros(nv)
    row[[col(1, i) for i in range(I)]] = 1.0
    row[[col(0, i) for i in range(I)]] = -(B - 1)
    A_ub.append(row), b_ub.append(0.0)  # sum y_m <= (B-1) sum x
    row = np.zeros(nv)
    row[[col(2, i) for i in range(I)]] = 1.0
    row[[col(0, i) for i in range(I)]] = B
    A_ub.append(row), b_ub.append(float(B))  # sum y_s + B sum x <= B
    A_eq, b_eq = [], []
    for i in range(I):
        row = np.zeros(nv)
        row[col(0, i)], row[col(3, i)] = r["mu_p"][i], THETA_PAPER[i]
        A_eq.append(row), b_eq.append(LAM_PAPER[i])
        row = np.zeros(nv)
        row[col(0, i)], row[col(4, i)] = r["mu_p"][i], -THETA_PAPER[i]
        row[col(1, i)], row[col(2, i)] = -r["mu_m"][i], -r["mu_s"][i]
        A_eq.append(row), b_eq.append(0.0)
    w = CP * P_PAPER + CD * D_PAPER
    for pricing, published in (("bundled", 297.7032), ("separate", 298.5866)):
        c = np.zeros(nv)
        reward_decode = w if pricing == "bundled" else CD * D_PAPER
        for i in range(I):
            c[col(1, i)] = reward_decode[i] * r["mu_m"][i]
            c[col(2, i)] = reward_decode[i] * r["mu_s"][i]
            if pricing == "separate":
                c[col(0, i)] = CP * P_PAPER[i] * r["mu_p"][i]
        res = linprog(-c, A_ub=np.array(A_ub), b_ub=b_ub, A_eq=np.array(A_eq), b_eq=b_eq, bounds=(0, None),
                      method="highs")
        assert res.status == 0
        assert -res.fun == pytest.approx(published, abs=1e-4)
        assert solve_fluid(fluidopt.default_scenario(), pricing).objective_per_gpu == pytest.approx(-res.fun, rel=1e-9)


@pytest.mark.parametrize("pricing", ["bundled", "separate"])
def test_strong_duality(paper, pricing):
    """sum_rows rhs * dual = optimum: the duals are a dual-optimal point with the documented signs."""
    sol = solve_fluid(paper, pricing)
    assert rhs_dot_duals(sol, paper) == pytest.approx(sol.objective_per_gpu, rel=1e-9)
    assert sol.duals["mixed_decode_capacity"] >= 0 and sol.duals["solo_decode_capacity"] >= 0


def test_prefill_balance_dual_is_d_objective_d_lambda(paper, bundled):
    """dual(prefill_balance[i]) = d R / d lambda_i (per extra arrival per GPU per second)."""
    h = 1e-6
    for i, c in enumerate(paper.class_names):
        lam = [0.5, 0.5]
        lam[i] += h
        up = solve_fluid(paper_scenario(lam=lam), "bundled").objective_per_gpu
        assert (up - bundled.objective_per_gpu) / h == pytest.approx(bundled.duals[f"prefill_balance[{c}]"], abs=1e-3)
    assert bundled.duals["prefill_balance[long-prompt]"] == pytest.approx(264.4606, abs=1e-3)


def test_gpu_shadow_price(paper, bundled):
    """gpu_shadow_price = dual(prefill_capacity) + B dual(solo) = d(cluster revenue)/d n at fixed cluster demand.

    Cluster revenue n r(Lambda/n) has derivative r - sum_i lambda_i dual_i (strong duality); and one
    more GPU (500 -> 501, same cluster arrival rates) must add about that much.
    """
    pb = np.array([bundled.duals[f"prefill_balance[{c}]"] for c in paper.class_names])
    assert bundled.gpu_shadow_price == pytest.approx(bundled.objective_per_gpu - LAM_PAPER @ pb, rel=1e-9)
    bigger = solve_fluid(replace(paper, gpus=501), "bundled")
    assert bigger.objective - bundled.objective == pytest.approx(bundled.gpu_shadow_price, rel=1e-3)


# -- single class: closed forms --------------------------------------------------------------------
def one_class(lam: float, theta: float, cp: float = 0.1, cd: float = 0.2, P: float = 300, D: float = 1000) -> Scenario:
    return Scenario(
        gpu=paper_gpu(), gpus=100, prefill_price=cp, decode_price=cd, name="one",
        classes=(RequestClass("only", prompt=P, decode=D, rate=lam * 100, patience=theta),),
    )


def one_class_rates(P: float = 300, D: float = 1000) -> tuple[float, float, float]:
    """(mu_p, mu_m, mu_s) of a one-class scenario on the paper's GPU, by hand."""
    r = hand_rates([P], [D])
    return float(r["mu_p"][0]), float(r["mu_m"][0]), float(r["mu_s"][0])


def x_balance(P: float = 300, D: float = 1000, B: int = BATCH) -> float:
    """Occupancy at which prefill output equals the whole decode capacity (see the test docstrings)."""
    mu_p, mu_m, mu_s = one_class_rates(P, D)
    return mu_s * B / (mu_p + mu_s * B - mu_m * (B - 1))


def test_single_class_demand_bound():
    """One class, bundled, gamma tau >= (B-1)/B (paper GPU: 45.45 * 0.03327 = 1.51 >= 15/16).

    Revenue is w T with T = mu_m y_m + mu_s y_s <= mu_p x (decode balance, q_d >= 0) and
    T <= mu_m (B-1) x + mu_s B (1-x) (both decode capacity rows). The second bound falls in x since
    mu_m (B-1) - mu_s B = ((B-1)/tau - gamma B)/D <= 0, so T is largest where the two meet,
    x_bal = mu_s B / (mu_p + mu_s B - mu_m (B-1)), unless demand stops x earlier: prefill balance
    mu_p x + theta q_p = lambda caps x at lambda/mu_p. With lambda/mu_p <= x_bal (lambda = 0.5 per
    GPU here; x_bal mu_p = 0.72) everyone is served: x* = lambda/mu_p, q_p = q_d = 0, R* = w lambda, and
    one more arrival per second is worth w: dual(prefill_balance) = w.
    """
    s = one_class(lam=0.5, theta=0.1)
    mu_p, _, _ = one_class_rates()
    assert GAMMA * (ALPHA + BETA * CHUNK) >= (BATCH - 1) / BATCH and 0.5 / mu_p <= x_balance()
    sol = solve_fluid(s)
    w = 0.1 * 300 + 0.2 * 1000
    assert sol.objective_per_gpu == pytest.approx(w * 0.5, rel=1e-9)
    assert sol.x[0] == pytest.approx(0.5 / mu_p, rel=1e-9)
    assert sol.served_fraction[0] == pytest.approx(1.0, rel=1e-9)
    assert sol.q_prefill[0] == pytest.approx(0.0, abs=1e-12) and sol.q_decode[0] == 0.0
    assert sol.duals["prefill_balance[only]"] == pytest.approx(w, rel=1e-9)
    # Infinitely patient customers change nothing when capacity suffices.
    assert solve_fluid(one_class(lam=0.5, theta=0.0)).objective_per_gpu == pytest.approx(w * 0.5, rel=1e-9)


def test_single_class_capacity_bound():
    """Same class with lambda = 2 per GPU > mu_p x_bal: capacity binds (derivation in the test above).

    x* = x_bal; both decode capacity rows are tight, y_m = (B-1) x_bal and y_s = B (1 - x_bal);
    R* = w mu_p x_bal; the excess abandons from the prefill queue, q_p = (lambda - mu_p x_bal)/theta.
    With theta = 0 no excess can leave: infeasible, and the conflict names the prefill balance.
    """
    s = one_class(lam=2.0, theta=0.1)
    B = BATCH
    mu_p, _, _ = one_class_rates()
    xb = x_balance()
    assert mu_p * xb < 2.0
    sol = solve_fluid(s)
    w = 0.1 * 300 + 0.2 * 1000
    assert sol.x[0] == pytest.approx(xb, rel=1e-9)
    assert sol.objective_per_gpu == pytest.approx(w * mu_p * xb, rel=1e-9)
    assert sol.y_mixed[0] == pytest.approx((B - 1) * xb, rel=1e-9)
    assert sol.y_solo[0] == pytest.approx(B * (1 - xb), rel=1e-9)
    assert sol.q_prefill[0] == pytest.approx((2.0 - mu_p * xb) / 0.1, rel=1e-9)
    assert sol.duals["prefill_balance[only]"] == 0.0
    with pytest.raises(InfeasibleError) as e:
        solve_fluid(one_class(lam=2.0, theta=0.0))
    assert "prefill_balance[only]" in e.value.conflicting
    assert "prefill_balance[only]" in str(e.value)


def test_single_class_separate_with_decode_backlog():
    """Separate pricing, expensive prompts: revenue c_p P mu_p x + c_d D T with T = min(mu_p x, cap(x)).

    Past x_bal the slope is c_p P mu_p + c_d D (mu_m (B-1) - mu_s B) > 0 for c_p = 1, c_d = 0.01, so
    x* = min(lambda/mu_p, 1) = lambda/mu_p: every prompt is prefilled, decodes are capacity-bound,
    T = mu_m (B-1) x* + mu_s B (1-x*), and the backlog abandons: q_d = (mu_p x* - T)/theta.
    """
    s = one_class(lam=2.0, theta=0.1, cp=1.0, cd=0.01)
    B = BATCH
    mu_p, mu_m, mu_s = one_class_rates()
    x = 2.0 / mu_p
    assert x > x_balance()
    T = mu_m * (B - 1) * x + mu_s * B * (1 - x)
    sol = solve_fluid(s, "separate")
    assert sol.x[0] == pytest.approx(x, rel=1e-9)
    assert sol.throughput[0] == pytest.approx(T, rel=1e-9)
    assert sol.q_decode[0] == pytest.approx((2.0 - T) / 0.1, rel=1e-9)
    assert sol.objective_per_gpu == pytest.approx(1.0 * 300 * 2.0 + 0.01 * 1000 * T, rel=1e-9)


def test_lexicographic_stage_without_prop_3_2():
    """gamma tau < (B-1)/B: the second stage keeps the optimum and never enlarges the decode buffer."""
    gpu = GPUProfile.from_gamma(alpha=0.0174, beta=6.2e-5, gamma=20.0, chunk=256, batch=16)
    assert not gpu.decode_buffer_free
    s = replace(fluidopt.default_scenario(), gpu=gpu)
    for pricing in ("bundled", "separate"):
        a = solve_fluid(s, pricing, lexicographic=True)
        b = solve_fluid(s, pricing, lexicographic=False)
        assert a.objective_per_gpu == pytest.approx(b.objective_per_gpu, rel=1e-9)
        assert a.q_decode.sum() <= b.q_decode.sum() + 1e-9


# -- the model API ---------------------------------------------------------------------------------
def test_user_constraint_is_respected_and_priced(paper, bundled):
    fm = build_fluid_model(paper)
    m = fm.model
    m.cap_long = pyo.Constraint(expr=m.x["long-prompt"] <= 0.15)
    sol = fm.solve()
    assert sol.x[1] <= 0.15 + 1e-9
    assert sol.objective_per_gpu < bundled.objective_per_gpu - 1.0
    assert sol.duals["cap_long"] > 0
    # Removing it restores the optimum with the same persistent solver.
    m.cap_long.deactivate()
    assert fm.solve().objective_per_gpu == pytest.approx(bundled.objective_per_gpu, rel=1e-12)


def test_user_constraint_named_in_conflict(paper):
    fm = build_fluid_model(paper)
    m = fm.model
    # Prefilling more than arrives needs a negative queue: x_long <= lambda/mu_p = 0.195.
    m.too_busy = pyo.Constraint(expr=m.x["long-prompt"] >= 0.5)
    with pytest.raises(InfeasibleError) as e:
        fm.solve()
    assert set(e.value.conflicting) == {"too_busy", "prefill_balance[long-prompt]"}
    assert "q_prefill[long-prompt] >= 0" in str(e.value)
    # The public-API deletion filter (fallback for HiGHS's IIS) finds the same rows.
    assert set(fm._deletion_filter()) == {"too_busy", "prefill_balance[long-prompt]"}


def test_update_matches_fresh_build(paper):
    fm = FluidModel(paper, "bundled", [TPOT(0.0243)])
    fm.solve()
    other = paper_scenario(lam=(0.3, 0.8), theta=(0.2, 0.05)).with_prices(0.05, 0.3)
    fm.update(other, pricing="separate", slis=[TPOT(0.0241)])
    got = fm.solve()
    want = solve_fluid(other, "separate", [TPOT(0.0241)])
    assert got.objective_per_gpu == pytest.approx(want.objective_per_gpu, rel=1e-12)
    np.testing.assert_allclose(got.x, want.x, rtol=1e-9)
    other_gpu = replace(paper, gpu=GPUProfile(alpha=0.02, beta=1e-4, tau_solo=0.03, chunk=512, batch=8))
    fm.update(other_gpu, pricing="bundled", slis=[TPOT(0.04)])
    assert fm.solve().objective_per_gpu == pytest.approx(
        solve_fluid(other_gpu, "bundled", [TPOT(0.04)]).objective_per_gpu, rel=1e-12)


def test_update_rejects_other_classes_and_sli_rows(paper):
    fm = FluidModel(paper, "bundled", [TPOT(0.03)])
    renamed = replace(paper, classes=(replace(paper.classes[0], name="a"), paper.classes[1]))
    with pytest.raises(ScenarioError, match=r"update\(\) needs the classes short-prompt, long-prompt in this order, got a, long-prompt"):
        fm.update(renamed)
    with pytest.raises(ScenarioError, match=r"tpot \(hard\).*got tpot=0.03:penalty=5"):
        fm.update(slis=[TPOT(0.03, penalty=5)])
    with pytest.raises(ScenarioError, match="got served:short-prompt=0.5"):
        fm.update(slis=[MinServedFraction("short-prompt", 0.5)])


def test_bad_inputs(paper):
    with pytest.raises(ScenarioError, match="pricing: expected one of bundled, separate, got 'flat'"):
        solve_fluid(paper, "flat")
    with pytest.raises(ScenarioError, match="scenario: expected a fluidopt Scenario, got dict"):
        solve_fluid({"classes": []})
    with pytest.raises(ScenarioError, match="slis: expected SLI objects .* got 0.03"):
        solve_fluid(paper, slis=[0.03])


def test_infeasible_message_names_rows(paper):
    s = paper_scenario(lam=(5.0, 5.0), theta=(0.0, 0.0))
    with pytest.raises(InfeasibleError) as e:
        solve_fluid(s)
    msg = str(e.value)
    assert "infeasible" in msg and "paper-two-class" in msg
    assert any(r.startswith("prefill_balance[") for r in e.value.conflicting)
    for r in e.value.conflicting:
        assert r in msg
    sol = FluidModel(s).solve(raise_infeasible=False)
    assert sol.status == "infeasible" and np.isnan(sol.objective_per_gpu)
    d = json.loads(json.dumps(sol.to_dict(), allow_nan=False))
    assert d["status"] == "infeasible" and d["objective_per_gpu"] is None and d["mixed_gpus"] is None
    with pytest.raises(ValueError, match="mixed GPUs: no prefill occupancy"):
        _ = sol.mixed_gpus


def test_to_frame_and_to_dict(bundled):
    df = bundled.to_frame()
    assert list(df.index) == ["short-prompt", "long-prompt"]
    np.testing.assert_allclose(df["x"], bundled.x)
    np.testing.assert_allclose(df["served_fraction"], bundled.throughput / bundled.lam)
    assert df.attrs["mixed_gpus"] == 107
    d = json.loads(json.dumps(bundled.to_dict()))
    assert d["objective_per_gpu"] == pytest.approx(297.7032, abs=1e-4)
    assert d["mixed_gpus"] == 107 and d["duals"]["solo_decode_capacity"] > 0
    assert [c["name"] for c in d["classes"]] == ["short-prompt", "long-prompt"]
    assert set(d["classes"][0]) >= {"name", "x", "y_mixed", "y_solo", "q_prefill", "q_decode", "throughput",
                                    "served_fraction"}
    with pytest.raises(ValueError):
        bundled.x[0] = 1.0  # arrays are read-only


def test_sweep_reuses_one_model(paper):
    from fluidopt.fluid import sweep

    df = sweep(paper, [0.05, 0.1], [0.1, 0.2, 0.3])
    assert len(df) == 6 and df.attrs["points"] == 6
    assert df.attrs["seconds"] >= df.attrs["solve_seconds"] > 0
    row = df[(df.prefill_price == 0.1) & (df.decode_price == 0.2)].iloc[0]
    assert row.objective_per_gpu == pytest.approx(297.7032, abs=1e-4)
    for _, r in df.iterrows():
        want = solve_fluid(paper.with_prices(r.prefill_price, r.decode_price)).objective_per_gpu
        assert r.objective_per_gpu == pytest.approx(want, rel=1e-9)
    pairs = sweep(paper, [0.05, 0.1], [0.1, 0.2], grid=False, pricing="separate")
    assert list(zip(pairs.prefill_price, pairs.decode_price)) == [(0.05, 0.1), (0.1, 0.2)]
    with pytest.raises(ScenarioError, match="equal lengths, got 2 and 3"):
        sweep(paper, [0.05, 0.1], [0.1, 0.2, 0.3], grid=False)
    with pytest.raises(ScenarioError, match="prefill_prices: expected finite prices >= 0"):
        sweep(paper, [-1.0])
    infeasible = sweep(paper, [0.1], slis=[TPOT(0.0219)])
    assert infeasible.status.tolist() == ["infeasible"]
