"""Demand models (fluidopt/demand.py) by hand: the TOML table each model writes back, and the rates of
the two per-class models at hand-picked prices."""

from __future__ import annotations

import math

import pytest

from fluidopt.demand import Demand


def test_each_model_writes_its_own_fields_and_a_logit_without_outside_option_says_so():
    assert Demand("linear", max_rate=10.0, slope=0.5).to_dict() == {"model": "linear", "max_rate": 10.0, "slope": 0.5}
    assert Demand("constant-elasticity", rate_ref=4.0, price_ref=2.0, elasticity=1.5).to_dict() == {
        "model": "constant-elasticity", "rate_ref": 4.0, "price_ref": 2.0, "elasticity": 1.5}
    with_outside = Demand("logit", market="m", market_size=100.0, utility=1.0, price_sensitivity=0.01)
    d = with_outside.to_dict()
    assert d["model"] == "logit" and d["market"] == "m" and d["market_size"] == 100.0
    assert "outside_option" not in d  # the default, true, is not written
    without = Demand("logit", market="m", market_size=100.0, utility=1.0, price_sensitivity=0.01, outside_option=False)
    assert without.to_dict()["outside_option"] is False


def test_rates_by_hand():
    lin = Demand("linear", max_rate=10.0, slope=0.5)
    assert lin.rate(4.0) == 8.0 and lin.rate(20.0) == 0.0 and lin.rate(30.0) == 0.0  # no negative rate
    ce = Demand("constant-elasticity", rate_ref=4.0, price_ref=2.0, elasticity=0.5)
    assert ce.rate(8.0) == pytest.approx(4.0 * (8.0 / 2.0) ** -0.5) == pytest.approx(2.0)
    assert ce.rate(0.5) == pytest.approx(8.0)
    assert ce.rate(0.0) == math.inf
