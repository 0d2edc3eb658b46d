"""Optimal prices and fleets (fluidopt/pricing/optimize.py) by hand: the per-class table against today's price
and rate, the profit-maximising fleet's own solution, the fitted-demand comments, and the two figures
read back from their artists (hand-made inputs, no solve)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest

from fluidopt.core.demand import Demand
from fluidopt.core.model import RequestClass, Scenario, paper_gpu
from fluidopt.pricing.optimize import (
    FleetResult,
    demand_toml,
    fit_demand,
    fleet_figure,
    optimize_fleet,
    optimize_prices,
    price_response_figure,
)


def one_class(n: int, demand: Demand, rate: float) -> Scenario:
    """The paper's short-prompt class alone on ``n`` GPUs at c_p = 0.1, c_d = 0.2: 300 x 0.1 + 1000 x 0.2 =
    230 per request today."""
    c = RequestClass("short", prompt=300, decode=1000, rate=rate, patience=0.1, demand=demand)
    return Scenario(gpu=paper_gpu(), gpus=n, classes=(c,), prefill_price=0.1, decode_price=0.2)


def test_the_table_shows_todays_price_and_the_rate_it_induces():
    # linear demand 10 - (6/230) p: 4 requests/s at today's 230; slack capacity, optimum at a / 2 (closed form)
    r = optimize_prices(one_class(10, Demand("linear", max_rate=10.0, slope=6.0 / 230), rate=4.0),
                        grid=([0.0, 0.1], [0.0, 0.2]))  # a small comparison grid: only today matters here
    d = r.to_frame()
    assert list(d.columns) == ["class", "price", "rate", "served", "revenue_per_s", "shadow_price", "today_price",
                               "today_rate"]
    assert d["today_price"].iloc[0] == pytest.approx(230.0, rel=1e-12)
    assert d["today_rate"].iloc[0] == pytest.approx(4.0, rel=1e-9)
    assert d["price"].iloc[0] == pytest.approx(10.0 / (2 * 6.0 / 230), rel=1e-6)


def test_the_fleets_solution_is_the_one_at_the_best_size():
    # capacity binds below ~14 GPUs (the fleet serves ~0.72/s per GPU, demand peaks at a / 2 = 10/s), so
    # the best fleet is not the scenario's 10
    sc = one_class(10, Demand("linear", max_rate=20.0, slope=16.0 / 230), rate=4.0)
    per_gpu_h = 36.0  # 0.01 per GPU per s
    f = optimize_fleet(sc, gpu_price_per_hour=per_gpu_h, sizes=[5, 10, 15, 20])
    assert f.gpus != sc.gpus
    assert f.best.gpus == f.gpus
    assert f.profit_per_s == pytest.approx(f.best.revenue_per_s - f.gpus * per_gpu_h / 3600.0, rel=1e-12)
    alone = optimize_prices(sc, gpus=f.gpus, compare=False)
    assert f.best.revenue_per_s == pytest.approx(alone.revenue_per_s, rel=1e-9)


def test_the_fitted_tables_comment_names_the_alternatives():
    fit = pd.DataFrame([
        {"class": "a", "model": "linear", "aic": 1.0, "best": True, "estimate": 2.0, "estimate2": 600.0,
         "ci_low": 1.9, "ci_high": 2.1, "param2": "max_rate"},
        {"class": "a", "model": "constant-elasticity", "aic": 2.5, "best": False, "estimate": 0.5, "estimate2": 40.0,
         "ci_low": 0.4, "ci_high": 0.6, "param2": "rate_ref"},
        {"class": "b", "model": "constant-elasticity", "aic": -3.0, "best": True, "estimate": 1.25, "estimate2": 9.0,
         "ci_low": 1.0, "ci_high": 1.5, "param2": "rate_ref"},
    ])
    lines = demand_toml(fit).split("\n")
    assert lines[0] == "# class 'a': linear fits best (AIC 1.00; constant-elasticity AIC 2.50)"
    assert lines[3] == 'model = "linear"'
    assert lines[4] == "slope = 2   # 95% CI [1.9, 2.1]"
    assert lines[6] == "# class 'b': constant-elasticity fits best (AIC -3.00)"
    assert lines[10] == "elasticity = 1.25   # 95% CI [1, 1.5]"


def test_fitted_classes_keep_the_order_of_the_observations():
    rng = np.random.default_rng(3)
    rows = []
    for name, a in (("zeta", 50.0), ("alpha", 80.0)):  # not alphabetical
        for p in np.linspace(1.0, 10.0, 8):
            rows.append({"class": name, "price": p, "rate": a - 2.0 * p + rng.normal(0, 0.1)})
    fit = fit_demand(pd.DataFrame(rows))
    assert list(dict.fromkeys(fit["class"])) == ["zeta", "alpha"]


def test_price_response_figure_read_back():
    rows = []
    for name, opt in (("s", 2.0), ("l", 3.0)):
        for p in (1.0, 2.0, 3.0):
            rows.append({"class": name, "price": p, "revenue_per_s": 10 * p, "rate": 5 - p, "served": 4 - p,
                         "optimal_price": opt})
    fig = price_response_figure(pd.DataFrame(rows))
    w, h = fig.get_size_inches()
    assert (w, h) == pytest.approx((9.2, 6.4))
    top, bottom = fig.axes[0], fig.axes[2]  # class s: revenue above, rates below
    assert top.get_title() == "s: revenue against its price (others optimal)"
    (rev, vline) = top.lines
    assert list(rev.get_ydata()) == [10.0, 20.0, 30.0]
    assert list(vline.get_xdata()) == [2.0, 2.0] and vline.get_color() == "k" and vline.get_linestyle() == ":"
    induced, served, vline = bottom.lines
    assert list(induced.get_ydata()) == [4.0, 3.0, 2.0] and list(served.get_ydata()) == [3.0, 2.0, 1.0]
    assert vline.get_color() == "k" and list(vline.get_xdata()) == [2.0, 2.0]
    leg = bottom.get_legend()
    assert [t.get_text() for t in leg.get_texts()] == ["induced rate", "served rate"]
    assert leg.get_texts()[0].get_fontsize() == 8
    assert fig.axes[1].lines[1].get_xdata()[0] == 3.0  # class l's optimum


def test_fleet_figure_read_back():
    curve = pd.DataFrame({"gpus": [5, 10, 20], "profit_per_s": [1.0, 3.0, 2.0], "price[a]": [9.0, 8.0, 7.0],
                          "price[b]": [4.0, 3.5, 3.0], "rate[a]": [1.0, 1.0, 1.0]})
    fig = fleet_figure(FleetResult(gpus=10, profit_per_s=3.0, gpu_price_per_hour=36.0, best=None, curve=curve))
    left, right = fig.axes
    assert [ln.get_label() for ln in left.lines] == ["a", "b"]
    assert list(left.lines[1].get_ydata()) == [4.0, 3.5, 3.0]
    assert all(ln.get_marker() == "o" and ln.get_markersize() == 3 for ln in left.lines + right.lines[:1])
    assert left.get_legend().get_texts()[0].get_fontsize() == 8
    assert left.get_ylabel() == "optimal price per request" and left.get_xlabel() == "GPUs"
    profit, vline = right.lines
    assert list(profit.get_ydata()) == [1.0, 3.0, 2.0]
    assert list(vline.get_xdata()) == [10, 10] and vline.get_color() == "k"
    assert right.get_ylabel() == "optimal profit per s (GPU at 36/h)"
