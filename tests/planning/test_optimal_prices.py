"""Optimal prices under capacity (fluidopt.pricing.optimize_prices): closed forms, an independent scipy
solve of the same program, the grid's best point, and the demand models' validation."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fluidopt.core.demand import Demand, demand_rates
from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import RequestClass, Scenario, paper_gpu
from fluidopt.fluid.lp import solve_fluid
from fluidopt.pricing import optimize_fleet, optimize_prices, price_grid, priced_scenario
from fluidopt.scenario import loads_scenario, scenario_from_dict, scenario_to_dict

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples/scenarios/paper-two-class-demand.toml"
# An 11 x 11 grid of token prices (0 to 0.5) for the tests that only compare the program with the grid's best
# point, an inequality that holds on any grid; the default 21 x 21 is 441 fluid LPs, most of such a test's time.
# test_paper_instance_... keeps the default grid (its best point is interior there).
COARSE_GRID = (np.linspace(0.0, 0.5, 11), np.linspace(0.0, 0.5, 11))


def one_class(n: int, demand: Demand, rate: float) -> Scenario:
    """The paper's short-prompt class alone on ``n`` GPUs at c_p = 0.1, c_d = 0.2 (230 per request)."""
    c = RequestClass("short", prompt=300, decode=1000, rate=rate, patience=0.1, demand=demand)
    return Scenario(gpu=paper_gpu(), gpus=n, classes=(c,), prefill_price=0.1, decode_price=0.2)


def capacity_one_class(n: int) -> float:
    """Most requests/s ``n`` GPUs serve of the short class, by hand (docs/lp.md): a fraction x of the GPU
    prefills at mu_p per slot; decodes run on the (B-1) x mixed slots at mu_m and the B (1-x) solo slots at
    mu_s; throughput min(mu_p x, (B-1) x mu_m + B (1-x) mu_s) is largest where the two are equal."""
    g = paper_gpu()
    tau = g.alpha + g.beta * g.chunk
    mu_p, mu_m, mu_s, B = g.chunk / (300 * tau), 1 / (1000 * tau), (1 / g.tau_solo) / 1000, g.batch
    x = B * mu_s / (mu_p - (B - 1) * mu_m + B * mu_s)
    return n * mu_p * x


# -- closed forms ------------------------------------------------------------------------------------
def test_linear_demand_slack_capacity_prices_at_half_the_choke_price():
    a, slope = 10.0, 6.0 / 230  # rate 4 at today's 230; the fleet serves 7.2/s, a / 2 = 5 fits
    sc = one_class(10, Demand("linear", max_rate=a, slope=slope), rate=4.0)
    assert a / 2 < capacity_one_class(10)
    r = optimize_prices(sc, compare=False)
    assert r.status == "optimal" and r.concave
    assert r.price[0] == pytest.approx(a / (2 * slope), rel=1e-6)
    assert r.rate[0] == pytest.approx(a / 2, rel=1e-6)
    assert r.revenue_per_s == pytest.approx(a * a / (4 * slope), rel=1e-6)
    assert r.shadow_price[0] == pytest.approx(0.0, abs=1e-4) and r.gpu_shadow_price == pytest.approx(0.0, abs=1e-3)


def test_linear_demand_binding_capacity_prices_where_the_rate_fills_the_fleet():
    a, slope = 20.0, 16.0 / 230
    cap = capacity_one_class(10)
    assert a / 2 > cap
    r = optimize_prices(one_class(10, Demand("linear", max_rate=a, slope=slope), rate=4.0), compare=False)
    assert r.status == "optimal"
    assert r.rate[0] == pytest.approx(cap, rel=1e-6)
    assert r.price[0] == pytest.approx((a - cap) / slope, rel=1e-6)
    # the capacity's shadow price is the marginal revenue there, and one more GPU earns it on cap / n more
    assert r.shadow_price[0] == pytest.approx((a - 2 * cap) / slope, rel=1e-6)
    assert r.gpu_shadow_price == pytest.approx((a - 2 * cap) / slope * cap / 10, rel=1e-6)


def test_constant_elasticity_above_one_fills_the_fleet_and_is_unbounded_without_a_limit():
    d = Demand("constant-elasticity", rate_ref=4.0, price_ref=230.0, elasticity=2.0)
    sc = one_class(10, d, rate=4.0)
    cap = capacity_one_class(10)
    r = optimize_prices(sc, compare=False)
    assert r.status == "optimal"
    assert r.price[0] == pytest.approx(230.0 * (cap / 4.0) ** -0.5, rel=1e-5)
    slack = optimize_prices(sc, compare=False, capacity=False)
    assert slack.status == "unbounded" and not slack.success
    assert "revenue unbounded" in slack.message and "elasticity 2 > 1" in slack.message
    assert math.isinf(slack.revenue_per_s) and np.isnan(slack.price).all()


def test_constant_elasticity_at_most_one_is_unbounded_whatever_the_fleet():
    sc = one_class(10, Demand("constant-elasticity", rate_ref=4.0, price_ref=230.0, elasticity=0.5), rate=4.0)
    r = optimize_prices(sc, compare=False)
    assert r.status == "unbounded" and "price -> infinity" in r.message


def test_logit_without_capacity_gives_every_class_the_same_markup():
    # MNL with a common price sensitivity b and no costs: every price is 1 / (b s_0) at the optimum
    text = EXAMPLE.read_text().replace('model = "linear"   # rate = max_rate - slope * price; max_rate = 250 + 2 * 230 = 710 is derived\nslope = 2.0',
                                       'model = "logit"\nmarket = "chat"\nmarket_size = 800.0\nprice_sensitivity = 0.01')
    text = text.replace('model = "linear"   # max_rate = 250 + 1 * 380 = 630\nslope = 1.0',
                        'model = "logit"\nmarket = "chat"\nmarket_size = 800.0\nprice_sensitivity = 0.01')
    sc = loads_scenario(text)
    assert [c.demand.model for c in sc.classes] == ["logit", "logit"]
    np.testing.assert_allclose(demand_rates(sc.classes, [230.0, 380.0]), [250.0, 250.0], rtol=1e-12)
    r = optimize_prices(sc, compare=False, capacity=False)
    s0 = 1 - r.rate.sum() / 800.0
    np.testing.assert_allclose(r.price, 1 / (0.01 * s0), rtol=1e-5)
    np.testing.assert_allclose(demand_rates(sc.classes, r.price), r.rate, rtol=1e-6)
    capped = optimize_prices(sc, compare=False)
    assert capped.revenue_per_s <= r.revenue_per_s * (1 + 1e-9)


# -- the paper's two-class instance with linear demand ---------------------------------------------------
def scipy_two_class(n: int) -> tuple[np.ndarray, float]:
    """The pricing program written again from the math (docs/planning.md section 4), solved by SLSQP.

    Variables per GPU: x_i (prefilling), y_m,i, y_s,i (decode slots); every induced request is served, so
    Lambda_i = n mu_p,i x_i and decode completions equal prefills. Revenue sum_i Lambda_i (a_i - Lambda_i) / b_i.
    """
    from scipy.optimize import minimize

    alpha, beta, gamma, C, B = 0.0174, 6.2e-5, 45.45, 256, 16
    tau = alpha + beta * C
    P, D = np.array([300.0, 3000.0]), np.array([1000.0, 400.0])
    mu_p, mu_m, mu_s = C / (P * tau), 1 / (D * tau), gamma / D
    price0 = 0.1 * P + 0.2 * D
    slope = np.array([2.0, 1.0])
    a = 250.0 + slope * price0
    scale = 1e5

    def rev(v):
        lam = n * mu_p * v[0:2]
        return float(np.sum(lam * (a - lam) / slope)) / scale

    cons = [
        {"type": "ineq", "fun": lambda v: 1 - v[0] - v[1]},
        {"type": "ineq", "fun": lambda v: (B - 1) * (v[0] + v[1]) - v[2] - v[3]},
        {"type": "ineq", "fun": lambda v: B - B * (v[0] + v[1]) - v[4] - v[5]},
        {"type": "eq", "fun": lambda v: mu_p * v[0:2] - mu_m * v[2:4] - mu_s * v[4:6]},
    ]
    v0 = np.array([0.01, 0.05, 0.5, 0.5, 5.0, 5.0])
    res = minimize(lambda v: -rev(v), v0, method="SLSQP", bounds=[(0, None)] * 6, constraints=cons,
                   options={"ftol": 1e-15, "maxiter": 2000})
    assert res.success, res.message
    lam = n * mu_p * res.x[0:2]
    return (a - lam) / slope, float(np.sum(lam * (a - lam) / slope))


def test_paper_instance_matches_an_independent_scipy_solve_and_the_grid_optimum_is_interior():
    from fluidopt.scenario import load_scenario

    sc = load_scenario(EXAMPLE)
    r = optimize_prices(sc)
    prices, revenue = scipy_two_class(500)
    np.testing.assert_allclose(r.price, prices, rtol=1e-4)
    assert r.revenue_per_s == pytest.approx(revenue, rel=1e-6)
    # capacity binds on this instance (the unconstrained prices a / 2b = 177.5, 315 need 670 requests/s)
    assert r.shadow_price.min() > 1 and r.price[0] > 177.5 and r.price[1] > 315
    # today's prices: the fluid LP of the scenario as it is (the rates are the demand at today's prices)
    assert r.today["revenue_per_s"] == pytest.approx(solve_fluid(sc).revenue_per_gpu * 500, rel=1e-9)
    # the grid's best token prices are interior, and the program beats them and today's prices
    gb = r.grid_best
    assert gb["interior"] and 0 < gb["prefill_price"] < 0.5 and 0 < gb["decode_price"] < 0.5
    assert r.revenue_per_s > gb["revenue_per_s"] > r.today["revenue_per_s"]
    # the fluid LP at the optimal prices and the rates they induce serves everything and earns the same
    lp = solve_fluid(priced_scenario(sc, r.price))
    assert lp.revenue_per_gpu * 500 == pytest.approx(r.revenue_per_s, rel=1e-6)
    np.testing.assert_allclose(lp.served_fraction, 1.0, atol=1e-6)
    # one more GPU: the dual-based value against central differences of the re-optimised revenue
    up, down = (optimize_prices(sc, gpus=k, compare=False).revenue_per_s for k in (501, 499))
    assert r.gpu_shadow_price == pytest.approx((up - down) / 2, rel=2e-3)


def test_two_token_prices_reach_the_per_class_optimum_with_two_classes():
    from fluidopt.scenario import load_scenario

    sc = load_scenario(EXAMPLE)
    per_class = optimize_prices(sc, compare=False)
    tokens = optimize_prices(sc, tiers="tokens", grid=COARSE_GRID)  # the grid's best is Nelder-Mead's start
    assert tokens.status == "local" and not tokens.concave
    # two classes, two token prices: every pair of per-request prices is reachable (here with c_p, c_d > 0)
    assert tokens.revenue_per_s == pytest.approx(per_class.revenue_per_s, rel=1e-6)
    np.testing.assert_allclose(tokens.price, per_class.price, rtol=1e-3)
    assert tokens.revenue_per_s >= tokens.grid_best["revenue_per_s"]


def test_without_demand_revenue_is_linear_in_price_and_the_grid_best_is_a_corner():
    from fluidopt.core.model import paper_scenario

    g = price_grid(paper_scenario(), np.linspace(0, 0.5, 6), np.linspace(0, 0.5, 6), pricings=("bundled",))
    best = g.loc[g["revenue_per_gpu"].idxmax()]
    assert (best["prefill_price"], best["decode_price"]) == (0.5, 0.5)
    with pytest.raises(ScenarioError, match="no class has a demand model"):
        optimize_prices(paper_scenario())


def test_fleet_profit_is_largest_where_a_gpu_earns_its_price():
    from fluidopt.scenario import load_scenario

    sc = load_scenario(EXAMPLE)
    price = 100 * 3600.0  # 100 per GPU per second, in the instance's currency
    f = optimize_fleet(sc, gpu_price_per_hour=price, sizes=[100, 300, 500, 700, 900])
    per_s = price / 3600
    # at the best integer fleet one more GPU earns about its cost, one less loses more than it saves
    assert f.best.gpu_shadow_price == pytest.approx(per_s, rel=0.05)
    for k in (f.gpus - 1, f.gpus + 1):
        other = optimize_prices(sc, gpus=k, compare=False).revenue_per_s - k * per_s
        assert f.profit_per_s >= other - 1e-6
    assert f.curve["profit_per_s"].max() == pytest.approx(f.profit_per_s)


# -- the scenario file ----------------------------------------------------------------------------------
def test_example_round_trips_and_derives_the_missing_parameters():
    from fluidopt.scenario import load_scenario

    sc = load_scenario(EXAMPLE)
    assert sc.classes[0].demand == Demand("linear", max_rate=710.0, slope=2.0)
    assert sc.classes[1].demand == Demand("linear", max_rate=630.0, slope=1.0)
    assert scenario_from_dict(scenario_to_dict(sc)) == sc


def with_demand(table: str, cls: int = 0) -> str:
    text = EXAMPLE.read_text()
    head, *rest = text.split("[classes.demand]")
    parts = [head, *rest]
    # replace the demand table of class ``cls`` (the text after its "[classes.demand]" up to the next blank line)
    body = parts[cls + 1]
    end = body.index("\n\n") if "\n\n" in body else len(body)
    parts[cls + 1] = "\n" + table.strip() + "\n" + body[end:]
    return "[classes.demand]".join(parts)


@pytest.mark.parametrize("table, message", [
    ('model = "linear"\nslope = -1.0', r"classes\[0\].demand.slope: expected a number > 0, got -1.0"),
    ('model = "linear"', r"classes\[0\].demand.slope: missing"),
    ('model = "linear"\nslope = 2.0\nmax_rate = 800.0', r"must lie on its demand curve .* gives 340"),
    ('model = "linear"\nslope = 2.0\nelasticity = 2.0', r"unknown key 'elasticity' for model = 'linear'"),
    ('model = "constant-elasticity"\nelasticity = 0.0', r"demand.elasticity: expected a number > 0, got 0.0"),
    ('model = "constant-elasticity"\nelasticity = -2', r"demand.elasticity: expected a number > 0, got -2"),
    ('model = "constant-elasticity"', r"demand.elasticity: missing"),
    ('model = "cobb-douglas"', r"demand.model: expected one of linear, constant-elasticity, logit, got 'cobb-douglas'"),
    ('model = "logit"\nmarket = "m"\nmarket_size = 100.0\nprice_sensitivity = 0.01',
     r"market_size: expected more than the sum of the rates .* \(250 requests/s.*got 100"),
    ('model = "logit"\nmarket = "m"\nmarket_size = 250.0\nprice_sensitivity = 0.01\noutside_option = false',
     r"logit market 'm' has one class and no outside option"),
    ('model = "logit"\nmarket = "m"\nmarket_size = 1000.0\nprice_sensitivity = -0.01',
     r"price_sensitivity: expected a number > 0, got -0.01"),
])
def test_bad_demand_tables_name_the_field_and_the_value(table, message):
    with pytest.raises(ScenarioError, match=message):
        loads_scenario(with_demand(table))


def test_a_logit_market_shares_its_size():
    t0 = 'model = "logit"\nmarket = "m"\nmarket_size = 1000.0\nprice_sensitivity = 0.01'
    t1 = 'model = "logit"\nmarket = "m"\nmarket_size = 2000.0\nprice_sensitivity = 0.01'
    with pytest.raises(ScenarioError, match=r"market_size: expected 1000.0, the value of class 'short-prompt'"):
        loads_scenario(with_demand(t1, 1).replace(
            'model = "linear"   # rate = max_rate - slope * price; max_rate = 250 + 2 * 230 = 710 is derived\nslope = 2.0',
            t0))


def test_a_demand_shifts_with_prices_only_through_the_curve():
    from fluidopt.scenario import load_scenario

    sc = load_scenario(EXAMPLE)
    p = np.array([300.0, 400.0])
    moved = priced_scenario(sc, p)
    np.testing.assert_allclose([c.rate for c in moved.classes], [710 - 600, 630 - 400])
    # the per-class token prices scale today's c_p, c_d to the new price per request
    cp, cd = moved.class_prices()
    np.testing.assert_allclose(cp * [300, 3000] + cd * [1000, 400], p)
    assert replace(moved, name="x").classes[0].demand == sc.classes[0].demand


@pytest.mark.slow
def test_gate_and_route_at_the_optimal_prices_earns_within_3_percent_of_the_program():
    from fluidopt.pricing.optimize import simulate_prices
    from fluidopt.scenario import load_scenario

    sc = load_scenario(EXAMPLE)
    r = optimize_prices(sc, compare=False)
    sim = simulate_prices(sc, r, policies=("gate-and-route", "backpressure-gate-and-route"), seeds=(0, 1),
                          horizon=600.0, warmup=150.0, progress=False)
    assert (sim["lp_revenue_per_gpu"] - r.revenue_per_gpu).abs().max() < 1e-6 * r.revenue_per_gpu
    for _, row in sim.iterrows():  # measured: 0.9885 and 0.9963 of 303.55 per GPU per s (3 seeds)
        assert 0.97 <= row["ratio_to_program"] <= 1.0 + 3 * row["sim_revenue_ci"] / row["program_revenue_per_gpu"]


def test_figures_and_their_tables():
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from fluidopt.pricing.optimize import (
        fleet_figure,
        price_response,
        price_response_figure,
        sli_pareto,
        sli_pareto_figure,
    )
    from fluidopt.scenario import load_scenario

    sc = load_scenario(EXAMPLE)
    r = optimize_prices(sc, compare=False)
    resp = price_response(sc, r, points=11)
    for _, g in resp.groupby("class", sort=False):
        # the LP at the induced rates earns the most at the optimal price (the middle point of the sweep)
        assert g["revenue_per_s"].idxmax() == g.index[5]
        assert g["revenue_per_s"].max() == pytest.approx(r.revenue_per_s, rel=1e-6)
        assert (g["served"] <= g["rate"] * (1 + 1e-9)).all()
    curve = sli_pareto(sc, "tpot", [0.0225, 0.024, 0.03])
    assert (curve["revenue_per_s"] >= curve["today_revenue_per_s"] - 1e-6).all()
    assert curve["revenue_per_s"].is_monotonic_increasing
    assert curve["revenue_per_s"].iloc[-1] == pytest.approx(r.revenue_per_s, rel=1e-6)  # TPOT 30 ms is slack
    f = optimize_fleet(sc, gpu_price_per_hour=360000.0, sizes=[200, 500, 800])
    for fig in (price_response_figure(resp), sli_pareto_figure(curve), fleet_figure(f)):
        assert isinstance(fig, Figure)


def test_a_class_without_demand_keeps_its_price_and_the_fluid_lp_agrees():
    text = EXAMPLE.read_text().replace('[classes.demand]\nmodel = "linear"   # max_rate = 250 + 1 * 380 = 630\nslope = 1.0',
                                       "")
    sc = loads_scenario(text)
    assert sc.classes[1].demand is None
    r = optimize_prices(sc, grid=COARSE_GRID)
    assert r.price[1] == 380.0 and r.rate[1] == 250.0
    # the fluid LP at the program's prices and rates earns the program's value
    lp = solve_fluid(priced_scenario(sc, r.price))
    assert lp.revenue_per_gpu * 500 == pytest.approx(r.revenue_per_s, rel=1e-6)
    assert r.revenue_per_s >= r.today["revenue_per_s"] and r.revenue_per_s >= r.grid_best["revenue_per_s"] - 1e-6
    up, down = (optimize_prices(sc, gpus=k, compare=False).revenue_per_s for k in (501, 499))
    assert r.gpu_shadow_price == pytest.approx((up - down) / 2, rel=2e-3)


def logit_example() -> Scenario:
    text = EXAMPLE.read_text()
    for old in ('model = "linear"   # rate = max_rate - slope * price; max_rate = 250 + 2 * 230 = 710 is derived\n'
                'slope = 2.0', 'model = "linear"   # max_rate = 250 + 1 * 380 = 630\nslope = 1.0'):
        text = text.replace(old, 'model = "logit"\nmarket = "chat"\nmarket_size = 3000.0\nprice_sensitivity = 0.01')
    return loads_scenario(text)


def test_logit_with_binding_capacity_matches_scipy_in_the_prices():
    """The same program solved by SLSQP in the prices themselves (the MNL rates written out), not the shares."""
    from scipy.optimize import minimize

    sc = logit_example()
    r = optimize_prices(sc, compare=False)
    assert r.shadow_price.min() > 1  # 500 GPUs bind
    alpha, beta, gamma, C, B, n = 0.0174, 6.2e-5, 45.45, 256, 16, 500
    tau = alpha + beta * C
    P, D = np.array([300.0, 3000.0]), np.array([1000.0, 400.0])
    mu_p, mu_m, mu_s = C / (P * tau), 1 / (D * tau), gamma / D
    # utilities from the rates 250, 250 of a market of 3000 at today's 230 and 380: ln(s_i / s_0) + b P_i
    u = np.log(250 / 2500) + 0.01 * np.array([230.0, 380.0])

    def rates(p):
        e = np.exp(u - 0.01 * p)
        return 3000 * e / (1 + e.sum())

    # variables: prices (2), then per GPU x (2), y_m (2), y_s (2)
    cons = [
        {"type": "eq", "fun": lambda v: n * mu_p * v[2:4] - rates(v[0:2])},
        {"type": "eq", "fun": lambda v: mu_p * v[2:4] - mu_m * v[4:6] - mu_s * v[6:8]},
        {"type": "ineq", "fun": lambda v: 1 - v[2] - v[3]},
        {"type": "ineq", "fun": lambda v: (B - 1) * (v[2] + v[3]) - v[4] - v[5]},
        {"type": "ineq", "fun": lambda v: B - B * (v[2] + v[3]) - v[6] - v[7]},
    ]
    v0 = np.array([300.0, 400.0, 0.01, 0.05, 0.5, 0.5, 5.0, 5.0])
    res = minimize(lambda v: -float(v[0:2] @ rates(v[0:2])) / 1e5, v0, method="SLSQP",
                   bounds=[(0, None)] * 8, constraints=cons, options={"ftol": 1e-15, "maxiter": 3000})
    assert res.success, res.message
    np.testing.assert_allclose(r.price, res.x[0:2], rtol=1e-4)
    up, down = (optimize_prices(sc, gpus=k, compare=False).revenue_per_s for k in (501, 499))
    assert r.gpu_shadow_price == pytest.approx((up - down) / 2, rel=2e-3)


def test_slis_hard_and_soft_in_the_pricing_program():
    from fluidopt.fluid.sli import parse_slis
    from fluidopt.scenario import load_scenario

    sc = load_scenario(EXAMPLE)
    free = optimize_prices(sc, slis=(), compare=False)
    hard = optimize_prices(sc, slis=parse_slis(["tpot=0.023"]), compare=False)
    heavy = optimize_prices(sc, slis=parse_slis(["tpot=0.023:penalty=1e6"]), compare=False)
    light = optimize_prices(sc, slis=parse_slis(["tpot=0.023:penalty=1"]), compare=False)
    assert hard.revenue_per_s < 0.8 * free.revenue_per_s  # a tight TPOT costs capacity, so prices rise
    assert heavy.revenue_per_s == pytest.approx(hard.revenue_per_s, rel=1e-6)  # an exact penalty acts as the row
    assert light.revenue_per_s == pytest.approx(free.revenue_per_s, rel=1e-6)  # a cheap one is paid, not met
    # the fluid LP with the same hard SLI at the program's prices and rates earns the same
    lp = solve_fluid(priced_scenario(sc, hard.price), slis=parse_slis(["tpot=0.023"]))
    assert lp.revenue_per_gpu * 500 == pytest.approx(hard.revenue_per_s, rel=1e-6)
