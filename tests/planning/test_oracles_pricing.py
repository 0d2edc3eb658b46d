"""Oracles for `fluidopt price --simulate` (fluidopt.pricing.simulate_points): each simulated point is charged
its own (prefill, decode) token prices, checked against the run's own completion counts, the LP promise by
hand, and the direction revenue must move in.

Definitions (docs/planning.md section 3, docs/simulator.md section 5): bundled revenue per GPU per second
is sum_i w_i * (class-i completions in the window) / (GPUs * window seconds), w_i = c_p P_i + c_d D_i
(markov service: the class's mean lengths); the LP promise of a scenario whose capacity serves every
arrival is sum_i lambda_i w_i per GPU (lambda_i = the class's cluster rate / GPUs). With a policy whose
decisions do not look at prices (FCFS), the sample path of a seed is the same at every price point, so
simulated revenue is linear in (c_p, c_d).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluidopt.core.model import GPUProfile, RequestClass, Scenario
from fluidopt.harness.executor import LocalExecutor
from fluidopt.pricing import simulate_points
from fluidopt.sim.api import simulate

GPU = GPUProfile(alpha=0.01, beta=0.001, tau_solo=0.005, chunk=10, batch=4)
# per GPU: class a 2/s of (20, 5) tokens, class b 1/s of (40, 30): about a fifth of the fleet's capacity
SC = Scenario(gpu=GPU, gpus=2, classes=(RequestClass("a", prompt=20, decode=5, rate=4.0, patience=1.0),
                                        RequestClass("b", prompt=40, decode=30, rate=2.0, patience=1.0)),
              prefill_price=1.0, decode_price=1.0, name="price-hand")
P, D, LAM = (20.0, 40.0), (5.0, 30.0), (2.0, 1.0)
RUN = dict(seeds=(0,), horizon=200.0, warmup=50.0, progress=False)


def _points(points, policy="fcfs"):
    return simulate_points(SC, points, policy=policy, executor=LocalExecutor(1), **RUN)


def _completions():
    res = simulate(SC, "fcfs", horizon=200.0, warmup=50.0, seed=0, service="markov", progress=False)
    return res.per_class["completed"].to_numpy(float), float(res.cluster["window_seconds"])


def test_each_point_is_charged_its_own_prices():
    done, W = _completions()
    assert W == 150.0 and done.min() > 200
    df = _points([(0.1, 0.2), (0.2, 0.1)])
    assert list(df["prefill_price"]) == [0.1, 0.2] and list(df["decode_price"]) == [0.2, 0.1]
    for (cp, cd), row in zip([(0.1, 0.2), (0.2, 0.1)], df.itertuples()):
        w = [cp * p + cd * d for p, d in zip(P, D)]
        sim = sum(wi * ci for wi, ci in zip(w, done)) / (2 * W)
        lp = sum(li * wi for li, wi in zip(LAM, w))  # 16.0 and 20.0 per GPU per second
        assert row.sim_revenue_per_gpu == pytest.approx(sim, rel=1e-12)
        assert row.lp_revenue_per_gpu == pytest.approx(lp, rel=1e-7)
        assert row.ratio == pytest.approx(sim / lp, rel=1e-7)
        assert row.gap_per_gpu == pytest.approx(lp - sim, rel=1e-6, abs=1e-9)
        assert row.pricing == "bundled" and row.policy == "fcfs" and row.sim_revenue_ci > 0
    assert df["lp_revenue_per_gpu"].tolist() == pytest.approx([16.0, 20.0], rel=1e-7)


def test_gate_and_route_points_are_charged_their_prices_too():
    """The default policy plans from the LP at each point's prices; its revenue is still sum_i w_i
    completions_i / (n W) at that point's w (checked here through the LP promise, which the fleet's
    spare capacity meets to within a few percent)."""
    df = _points([(0.0, 1.0), (1.0, 0.0)], policy="gate-and-route")
    assert df["lp_revenue_per_gpu"].tolist() == pytest.approx([2 * 5 + 1 * 30, 2 * 20 + 1 * 40], rel=1e-7)
    assert df["ratio"].between(0.9, 1.1).all()


@settings(max_examples=6, deadline=None, derandomize=True)
@given(cp=st.floats(0.05, 1.0), cd=st.floats(0.0, 1.0), more=st.floats(0.01, 1.0))
def test_revenue_is_linear_in_the_prices_and_rises_with_the_decode_price(cp, cd, more):
    df = _points([(1.0, 0.0), (0.0, 1.0), (cp, cd), (cp, cd + more)])
    r = df["sim_revenue_per_gpu"].to_numpy()
    assert r[2] == pytest.approx(cp * r[0] + cd * r[1], rel=1e-9, abs=1e-12)
    assert r[3] - r[2] == pytest.approx(more * r[1], rel=1e-9)
    assert r[3] > r[2]  # a point with decodes earns more at a higher decode price
    lp = df["lp_revenue_per_gpu"].to_numpy()
    assert lp[3] >= lp[2]


def test_a_free_point_earns_nothing_and_has_no_ratio():
    """c_p = c_d = 0: LP and simulation earn 0; the ratio (and its half-width) is undefined, not a crash
    (Comparison.summary divided the pooled half-width by the zero bound: ZeroDivisionError)."""
    import math

    df = _points([(0.0, 0.0), (0.1, 0.0)])
    free = df.iloc[0]
    assert free["lp_revenue_per_gpu"] == 0.0 and free["sim_revenue_per_gpu"] == 0.0
    assert math.isnan(free["ratio"]) and free["gap_per_gpu"] == 0.0
    assert df.iloc[1]["lp_revenue_per_gpu"] == pytest.approx(0.1 * (2 * 20 + 1 * 40), rel=1e-7)


def test_grid_figure_shows_each_grid_value_on_its_own_scale():
    """One heatmap per (pricing, column): its pixels are the grid's values (decode price up, prefill price
    across), revenue on its own scale, served fractions on [0, 1]."""
    import matplotlib

    matplotlib.use("Agg")
    import numpy as np
    import pandas as pd

    from fluidopt.pricing import grid_figure

    rows = [{"pricing": "bundled", "prefill_price": cp, "decode_price": cd, "revenue_per_gpu": 10 * cp + cd,
             "served[a]": 0.5 + cp / 4} for cp in (0.0, 1.0, 2.0) for cd in (0.0, 0.5)]
    fig = grid_figure(pd.DataFrame(rows))
    rev, served = fig.axes[0], fig.axes[1]  # (the colorbar axes come after the heatmaps)
    img = rev.images[0]
    assert np.asarray(img.get_array()).tolist() == [[0.0, 10.0, 20.0], [0.5, 10.5, 20.5]]
    assert img.get_clim() == (0.0, 20.5) and tuple(img.get_extent()) == (0.0, 2.0, 0.0, 0.5)
    assert served.images[0].get_clim() == (0.0, 1.0)
    assert rev.get_title() == "bundled: revenue per GPU per s" and served.get_title() == "bundled: served fraction [a]"


def test_pareto_figure_plots_revenue_against_the_bound_per_pricing():
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd

    from fluidopt.pricing import pareto_figure

    df = pd.DataFrame({"sli": "tpot", "pricing": ["bundled"] * 2 + ["separate"] * 2, "bound": [0.03, 0.05] * 2,
                       "revenue_per_gpu": [1.0, 2.0, 1.5, 2.5]})
    ax = pareto_figure(df).axes[0]
    assert [list(ln.get_ydata()) for ln in ax.lines] == [[1.0, 2.0], [1.5, 2.5]]
    assert ax.lines[0].get_markersize() == 3 and ax.get_title() == "price of the tpot SLI"
    assert ax.get_xlabel() == "TPOT bound (s per output token)"
    leg = ax.get_legend()
    assert [t.get_text() for t in leg.get_texts()] == ["bundled", "separate"] and leg.get_texts()[0].get_fontsize() == 8


def test_separate_pricing_points_report_the_simulators_separate_revenue():
    """pricing='separate': each point's simulated revenue is the run's separate-pricing revenue (c_p P at
    the first prefill completion, c_d D at completion) at that point's prices, and the LP promise the
    separate LP's; the same run's bundled revenue differs (window edges)."""
    df = simulate_points(SC, [(0.1, 0.2)], policy="fcfs", pricing="separate", executor=LocalExecutor(1), **RUN)
    res = simulate(SC.with_prices(0.1, 0.2), "fcfs", horizon=200.0, warmup=50.0, seed=0, service="markov",
                   progress=False)
    row = df.iloc[0]
    assert row["pricing"] == "separate"
    assert row["sim_revenue_per_gpu"] == pytest.approx(res.cluster["revenue_per_gpu_separate"], rel=1e-12)
    assert res.cluster["revenue_per_gpu_separate"] != pytest.approx(res.cluster["revenue_per_gpu"], rel=1e-9)
    assert row["lp_revenue_per_gpu"] == pytest.approx(16.0, rel=1e-7)  # every arrival served: same total


def test_shadow_prices_table():
    """Ample capacity: no capacity row binds, so one more GPU earns nothing and the rows' duals are 0."""
    from fluidopt.pricing import shadow_prices

    t = shadow_prices(SC)
    assert list(t.columns) == ["pricing", "item", "shadow_price", "unit"]
    items = ["gpu", "row:prefill_capacity", "row:mixed_decode_capacity", "row:solo_decode_capacity"]
    assert list(t["pricing"]) == ["bundled"] * 4 + ["separate"] * 4 and list(t["item"]) == items * 2
    assert t["shadow_price"].abs().max() == pytest.approx(0.0, abs=1e-9)
    assert t["unit"].iloc[0] == "revenue per s per extra GPU"
    from fluidopt.fluid.sli import TPOT

    s = shadow_prices(SC, pricings=("bundled",), slis=[TPOT(0.5)])
    assert list(s["item"]) == ["gpu", "sli:tpot", *items[1:]]
    assert s.loc[1, "unit"] == "revenue per GPU per s per unit of the bound" and s.loc[1, "pricing"] == "bundled"
