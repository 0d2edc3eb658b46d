"""Token-tier prices (``optimize_prices(tiers="tokens")``) checked against what the docs promise: with two
classes the two token prices reach the per-class optimum (any pair of per-request prices is 300 c_p +
1000 c_d and 3000 c_p + 400 c_d for some c_p, c_d), whatever the currency unit, and the result's
``served`` is the fluid LP's requests/s per class.

Imports use the module names that predate the package move (``fluidopt.pricing_opt``), which still work,
so the same file runs against the scratch copies of docs/testing.md's mutation runs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from fluidopt.pricing_opt import optimize_prices

from fluidopt.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples/scenarios/paper-two-class-demand.toml"


def in_dollars_per_token(k: float):
    """The two-class demand example with every price in a unit ``1/k`` times larger: token prices x k,
    the slopes (requests/s lost per unit of price) / k; the rates at today's prices are unchanged."""
    sc = load_scenario(EXAMPLE)
    cls = tuple(replace(c, demand=replace(c.demand, slope=c.demand.slope / k)) for c in sc.classes)
    return replace(sc, classes=cls, prefill_price=sc.prefill_price * k, decode_price=sc.decode_price * k)


def test_token_prices_in_small_units_reach_the_per_class_optimum_and_report_what_is_served():
    # 1e-7 and 2e-7 per token (0.1 and 0.2 per million): a revenue of about 0.15 per s, so the search's
    # stopping rule must be relative to these magnitudes, not to absolute defaults of 1e-4
    k = 1e-6
    sc = in_dollars_per_token(k)
    per_class = optimize_prices(sc, compare=False)  # a concave program: the global optimum
    grid = (np.linspace(0, 0.5 * k, 6), np.linspace(0, 0.5 * k, 6))
    tokens = optimize_prices(sc, tiers="tokens", grid=grid)
    assert tokens.status == "local" and tokens.tiers == "tokens"
    assert tokens.revenue_per_s == pytest.approx(per_class.revenue_per_s, rel=1e-6)
    np.testing.assert_allclose(tokens.price, per_class.price, rtol=1e-4)
    # the token prices that give the per-class prices: 300 cp + 1000 cd = p1, 3000 cp + 400 cd = p2 by hand
    p1, p2 = per_class.price
    cd = (10 * p1 - p2) / (10 * 1000 - 400)
    cp = (p1 - 1000 * cd) / 300
    assert tokens.prefill_price == pytest.approx(cp, rel=1e-3)
    assert tokens.decode_price == pytest.approx(cd, rel=1e-3)
    # capacity binds at the optimum and the induced rates just fill it: the LP serves every request, so
    # served (requests/s per class) equals the rate, and revenue = price x served adds up to the total
    assert per_class.shadow_price.min() > 0
    np.testing.assert_allclose(tokens.served, tokens.rate, rtol=1e-4)
    np.testing.assert_allclose(tokens.served, per_class.served, rtol=1e-4)
    np.testing.assert_allclose(tokens.revenue, tokens.price * tokens.served, rtol=1e-12)
    assert tokens.revenue.sum() == pytest.approx(tokens.revenue_per_s, rel=1e-6)
    d = tokens.to_frame()
    np.testing.assert_allclose(d["served"].to_numpy(float), tokens.rate, rtol=1e-4)
