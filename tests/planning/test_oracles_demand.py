"""Demand models (fluidopt/core/demand.py) by hand: the TOML table each model writes back, the rates of the
two per-class models at hand-picked prices, the curves ``[classes.demand]`` tables derive through the
class's rate (linear, constant elasticity, logit with and without the outside option) and their refusals.

Imports use the module names before the package move (``fluidopt.demand``, ``fluidopt.errors``,
``fluidopt.model``), which still work: docs/testing.md's mutation runs apply their mutants to a copy of
that layout, where the new names would import the unmutated installed package."""

from __future__ import annotations

import math

import pytest
from fluidopt.demand import Demand  # the former module names: the file also runs in the layout before the move


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


def test_a_linear_table_with_max_rate_alone_derives_its_slope_and_names_a_bad_value():
    from fluidopt.demand import demands_from_tables
    from fluidopt.errors import ScenarioError
    from fluidopt.model import RequestClass

    cls = [RequestClass("a", prompt=100, decode=200, rate=4.0)]
    (c,) = demands_from_tables([{"demand": {"model": "linear", "max_rate": 10.0, "price_ref": 100.0}}], cls, 0.1, 0.2)
    # through (100, 4) with rate 10 at price 0: slope (10 - 4) / 100
    assert c.demand.max_rate == 10.0 and c.demand.slope == pytest.approx(0.06, rel=1e-12)
    with pytest.raises(ScenarioError) as e:
        demands_from_tables([{"demand": {"model": "linear", "max_rate": "x"}}], cls, 0.1, 0.2)
    assert str(e.value) == "classes[0].demand.max_rate: expected a number, got 'x' (str)"


def test_a_constant_elasticity_table_with_rate_ref_passes_through_the_class_rate_and_names_a_bad_value():
    # former module names (fluidopt.demand ...), which still import: the same file runs in the scratch
    # copies of docs/testing.md's mutation runs
    from fluidopt.demand import demands_from_tables
    from fluidopt.errors import ScenarioError
    from fluidopt.model import RequestClass

    cls = [RequestClass("a", prompt=100, decode=200, rate=4.0)]  # 100 x 0.1 + 200 x 0.2 = 50 per request today
    # 2 requests/s at price 100 with elasticity 1: 2 (50 / 100)^-1 = 4 at today's 50, the class's rate
    t = {"demand": {"model": "constant-elasticity", "rate_ref": 2.0, "price_ref": 100.0, "elasticity": 1.0}}
    (c,) = demands_from_tables([t], cls, 0.1, 0.2)
    assert (c.demand.rate_ref, c.demand.price_ref, c.demand.elasticity) == (2.0, 100.0, 1.0)
    assert c.demand.rate(50.0) == pytest.approx(4.0)
    off = {"demand": dict(t["demand"], rate_ref=3.0)}  # 3 (50 / 100)^-1 = 6, not 4
    with pytest.raises(ScenarioError, match=r"^classes\[0\]\.demand: the class's rate \(4 requests/s\) must lie"):
        demands_from_tables([off], cls, 0.1, 0.2)
    for bad, why in (("x", "expected a number, got 'x' (str)"), (0.0, "expected a number > 0, got 0.0")):
        with pytest.raises(ScenarioError) as e:
            demands_from_tables([{"demand": dict(t["demand"], rate_ref=bad)}], cls, 0.1, 0.2)
        assert str(e.value) == f"classes[0].demand.rate_ref: {why}"


def test_a_logit_outside_option_that_is_not_true_or_false_is_named_with_its_value():
    from fluidopt.demand import demands_from_tables
    from fluidopt.errors import ScenarioError
    from fluidopt.model import RequestClass

    cls = [RequestClass("a", prompt=100, decode=200, rate=4.0)]
    t = {"demand": {"model": "logit", "market": "m", "market_size": 100.0, "price_sensitivity": 0.01,
                    "outside_option": "yes"}}
    with pytest.raises(ScenarioError) as e:
        demands_from_tables([t], cls, 0.1, 0.2)
    assert str(e.value) == "classes[0].demand.outside_option: expected true or false, got 'yes'"


def _two_logit_classes(rates, **extra):
    from fluidopt.model import RequestClass

    # today's prices per request: 100 x 0.1 + 200 x 0.2 = 50 and 200 x 0.1 + 400 x 0.2 = 100
    cls = [RequestClass("a", prompt=100, decode=200, rate=rates[0]), RequestClass("b", prompt=200, decode=400,
                                                                                   rate=rates[1])]
    tables = [{"demand": {"model": "logit", "market": "m", "market_size": 10.0, "price_sensitivity": 0.01, **extra}}
              for _ in cls]
    return cls, tables


def test_logit_utilities_derived_from_the_rates_give_them_back_with_and_without_the_outside_option():
    from fluidopt.demand import demand_rates, demands_from_tables

    # with the outside option: shares 0.4, 0.2 and 0.4 outside; exp(u_i - b P_i) = s_i / s_0 (docs/scenarios.md)
    cls, t = _two_logit_classes((4.0, 2.0))
    a, b = demands_from_tables(t, cls, 0.1, 0.2)
    assert a.demand.utility == pytest.approx(0.5) and b.demand.utility == pytest.approx(math.log(0.5) + 1.0)
    assert (a.demand.market_size, a.demand.price_sensitivity, a.demand.outside_option) == (10.0, 0.01, True)
    assert b.demand.market == "m" and b.demand.market_size == 10.0
    assert demand_rates((a, b), [50.0, 100.0]) == pytest.approx([4.0, 2.0])
    # at 150 and 100: exp(-1) and 0.5 against the outside option's 1
    z = 1 + math.exp(-1) + 0.5
    assert demand_rates((a, b), [150.0, 100.0]) == pytest.approx([10 * math.exp(-1) / z, 10 * 0.5 / z])
    # without it the rates must fill the market (4 + 6 = 10); shares exp(u_i - b P_i) / sum_j = 0.4, 0.6
    cls, t = _two_logit_classes((4.0, 6.0), outside_option=False)
    a, b = demands_from_tables(t, cls, 0.1, 0.2)
    v = [a.demand.utility - 0.5, b.demand.utility - 1.0]
    assert math.exp(v[0]) / (math.exp(v[0]) + math.exp(v[1])) == pytest.approx(0.4)
    assert not a.demand.outside_option and not b.demand.outside_option
    assert demand_rates((a, b), [50.0, 100.0]) == pytest.approx([4.0, 6.0])
    # 5 + 6 = 11 requests/s is more than the market's 10 without an outside option to absorb it
    cls, t = _two_logit_classes((5.0, 6.0), outside_option=False)
    with pytest.raises(Exception, match=r"^classes\[0\]\.demand\.market_size: without the outside option the rates "
                                         r"of logit market 'm' must add up to market_size \(11\), got 10$"):
        demands_from_tables(t, cls, 0.1, 0.2)


def test_logit_utilities_given_for_every_class_must_reproduce_the_rates_and_each_market_size_is_named():
    from fluidopt.demand import demands_from_tables
    from fluidopt.errors import ScenarioError

    cls, t = _two_logit_classes((4.0, 2.0))
    for tab, u in zip(t, (0.5, math.log(0.5) + 1.0)):
        tab["demand"]["utility"] = u
    a, b = demands_from_tables(t, cls, 0.1, 0.2)
    assert (a.demand.utility, b.demand.utility) == (0.5, math.log(0.5) + 1.0)
    t[1]["demand"]["utility"] = 1.0  # exp(0) for both and the outside option: 10 / 3 each, not 4 and 2
    with pytest.raises(ScenarioError, match=r"^classes\[0\]\.demand: the class's rate \(4 requests/s\) must lie on "
                                            r"its demand curve at the reference price 50, where the logit market gives "
                                            r"3\.33333;"):
        demands_from_tables(t, cls, 0.1, 0.2)
    cls, t = _two_logit_classes((4.0, 2.0))
    t[1]["demand"]["market_size"] = "x"  # the first class's size is the market's; the second's is read on its own
    with pytest.raises(ScenarioError) as e:
        demands_from_tables(t, cls, 0.1, 0.2)
    assert str(e.value) == "classes[1].demand.market_size: expected a number, got 'x' (str)"
