"""``price --grid`` by hand (fluidopt.pricing.price_grid), with and without a demand model: each point's
rate and revenue from the linear demand at that point's price, one row per (pricing, c_p, c_d) numbered
0..N-1, and the ``points``/``seconds`` attributes (mutation survivors of issue 35's rerun after the
demand-aware pricing merge)."""

from __future__ import annotations

import numpy as np
import pytest

from fluidopt.core.demand import Demand
from fluidopt.core.model import RequestClass, Scenario, paper_gpu
from fluidopt.pricing import price_grid


def _one_class(n: int, demand: Demand | None, rate: float) -> Scenario:
    c = RequestClass("short", prompt=300, decode=1000, rate=rate, patience=0.1, demand=demand)
    return Scenario(gpu=paper_gpu(), gpus=n, classes=(c,), prefill_price=0.1, decode_price=0.2)


def test_demand_grid_rates_and_revenue_by_hand():
    # linear demand rate = 2 - 0.004 p at price p = 300 c_p + 1000 c_d per request; 100 GPUs serve it all
    # (0.1, 0.2): p = 230, rate 1.08, revenue 248.4/s, 2.484 per GPU; (0.1, 0.3): 330, 0.68, 224.4;
    # (0.2, 0.2): 260, 0.96, 249.6; (0.2, 0.3): 360, 0.56, 201.6. Both pricings charge the same here.
    sc = _one_class(100, Demand("linear", max_rate=2.0, slope=0.004), rate=1.0)
    g = price_grid(sc, [0.1, 0.2], [0.2, 0.3])
    assert list(g.index) == list(range(8))  # one numbering across both pricings
    assert list(g["pricing"]) == ["bundled"] * 4 + ["separate"] * 4
    assert list(g["prefill_price"]) == [0.1, 0.1, 0.2, 0.2] * 2
    assert list(g["decode_price"]) == [0.2, 0.3, 0.2, 0.3] * 2
    np.testing.assert_allclose(g["rate[short]"], [1.08, 0.68, 0.96, 0.56] * 2, rtol=1e-9)
    np.testing.assert_allclose(g["revenue_per_s"], [248.4, 224.4, 249.6, 201.6] * 2, rtol=1e-6)
    np.testing.assert_allclose(g["revenue_per_gpu"], [2.484, 2.244, 2.496, 2.016] * 2, rtol=1e-6)
    assert g.attrs["points"] == 8
    assert isinstance(g.attrs["seconds"], float) and g.attrs["seconds"] >= 0.0


def test_fixed_rate_grid_numbering_and_attributes():
    # no demand model: the rate is fixed at 1/s and 100 GPUs serve it all, so revenue per GPU is
    # (300 c_p + 1000 c_d) / 100
    sc = _one_class(100, None, rate=1.0)
    g = price_grid(sc, [0.1, 0.2], [0.3, 0.2, 0.1])
    assert list(g.index) == list(range(12))
    assert list(g["decode_price"])[:6] == [0.1, 0.2, 0.3, 0.1, 0.2, 0.3]  # sorted within each pricing
    want = [(300 * cp + 1000 * cd) / 100 for cp in (0.1, 0.2) for cd in (0.1, 0.2, 0.3)]
    np.testing.assert_allclose(g["revenue_per_gpu"], want * 2, rtol=1e-6)
    assert g.attrs["points"] == 12
    assert isinstance(g.attrs["seconds"], float) and g.attrs["seconds"] >= 0.0


def test_an_empty_price_list_is_refused_with_or_without_demand():
    from fluidopt.core.errors import UsageError

    for demand in (None, Demand("linear", max_rate=2.0, slope=0.004)):
        for cps, cds in (([], [0.2]), ([0.1], [])):
            with pytest.raises(UsageError, match=r"^price grid: expected at least one prefill and one decode price$"):
                price_grid(_one_class(10, demand, 1.0), cps, cds)


def test_a_demand_grid_with_one_price_each_is_one_point_per_pricing():
    # (0.2, 0.2): p = 260, rate 2 - 0.004 x 260 = 0.96, revenue 249.6/s on 100 GPUs
    g = price_grid(_one_class(100, Demand("linear", max_rate=2.0, slope=0.004), 1.0), [0.2], [0.2])
    assert list(g["pricing"]) == ["bundled", "separate"] and g.attrs["points"] == 2
    np.testing.assert_allclose(g["revenue_per_s"], [249.6, 249.6], rtol=1e-6)


def test_simulated_points_under_demand_use_the_demand_at_each_points_prices():
    # 2 GPUs, linear demand 2 - 0.004 p: at (0.2, 0.2) p = 260, rate 0.96/s (the scenario's own 1.0/s is
    # not used), which 2 GPUs serve in full (about 0.72/s each), so the LP earns 0.96 x 260 / 2 = 124.8
    # per GPU; at (0.1, 0.3) p = 330, rate 0.68, 0.68 x 330 / 2 = 112.2
    from fluidopt.pricing import simulate_points

    sc = _one_class(2, Demand("linear", max_rate=2.0, slope=0.004), rate=1.0)
    df = simulate_points(sc, [(0.2, 0.2), (0.1, 0.3)], horizon=60.0, warmup=10.0, progress=False)
    assert list(zip(df["prefill_price"], df["decode_price"])) == [(0.2, 0.2), (0.1, 0.3)]
    np.testing.assert_allclose(df["lp_revenue_per_gpu"], [124.8, 112.2], rtol=1e-6)
    np.testing.assert_allclose(df["gap_per_gpu"], df["lp_revenue_per_gpu"] - df["sim_revenue_per_gpu"], rtol=1e-12)
