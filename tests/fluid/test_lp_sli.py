"""SLIs on the fluid LP (docs/lp.md): binding thresholds, shadow prices, penalties, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from fluidopt import InfeasibleError, ScenarioError
from fluidopt.fluid import (
    TPOT,
    DecodeFairness,
    FluidModel,
    MaxPrefillWait,
    MinServedFraction,
    PrefillFairness,
    parse_sli,
    sli_spec,
    solve_fluid,
)
from fluidopt.fluid.sli import validate_slis

UNCONSTRAINED = 297.7031698642446  # bundled optimum of the paper instance (test_lp.py)


def central_difference(paper, make, bound: float, h: float) -> float:
    up = solve_fluid(paper, slis=[make(bound + h)]).objective_per_gpu
    down = solve_fluid(paper, slis=[make(bound - h)]).objective_per_gpu
    return (up - down) / (2 * h)


# -- TPOT --------------------------------------------------------------------------------------------
def test_tpot_threshold_on_paper_instance(paper):
    """The unconstrained optimum has TPOT 0.024285 s, so the SLI binds below about 0.0243 s."""
    free = solve_fluid(paper)
    assert 0.0242 < free.tpot < 0.0243
    loose = solve_fluid(paper, slis=[TPOT(0.0244)])
    assert loose.objective_per_gpu == pytest.approx(UNCONSTRAINED, rel=1e-12)
    assert loose.duals["tpot"] == 0.0 and loose.sli_shadow_prices["tpot"] == 0.0
    tight = solve_fluid(paper, slis=[TPOT(0.0242)])
    assert tight.objective_per_gpu < UNCONSTRAINED - 1.0
    assert tight.tpot == pytest.approx(0.0242, rel=1e-9)  # binding
    assert tight.duals["tpot"] > 0
    assert np.all(tight.q_decode == 0.0)


def test_tpot_infeasible_below_solo_iteration_time(paper):
    """TPOT >= 1/gamma = 0.0220022 s at every X (X = 0 is all-solo), so 0.0219 s is infeasible."""
    assert 1 / paper.gpu.gamma == pytest.approx(0.0220022, rel=1e-6)
    assert solve_fluid(paper, slis=[TPOT(0.0221)]).tpot == pytest.approx(0.0221, rel=1e-9)
    with pytest.raises(InfeasibleError) as e:
        solve_fluid(paper, slis=[TPOT(0.0219)])
    assert e.value.conflicting == ("tpot",)
    assert "tpot (SLI tpot=0.0219)" in str(e.value)
    assert "penalty" in str(e.value)  # tells the user how to soften it


def test_tpot_shadow_price_is_slope_of_pareto_curve(paper):
    sol = solve_fluid(paper, slis=[TPOT(0.0235)])
    slope = central_difference(paper, TPOT, 0.0235, 1e-6)
    assert sol.sli_shadow_prices["tpot"] == pytest.approx(slope, rel=1e-6)
    assert sol.sli_shadow_prices["tpot"] > 0


def test_tpot_penalty_is_exact_above_the_row_dual(paper):
    """Exact-penalty theorem: a weight above the row's dual reproduces the hard SLI, one below it does not."""
    hard = solve_fluid(paper, slis=[TPOT(0.0235)])
    d = hard.duals["tpot"]
    above = solve_fluid(paper, slis=[TPOT(0.0235, penalty=1.01 * d)])
    assert above.objective_per_gpu == pytest.approx(hard.objective_per_gpu, rel=1e-9)
    assert above.violations["tpot"] == pytest.approx(0.0, abs=1e-12)
    below = solve_fluid(paper, slis=[TPOT(0.0235, penalty=0.99 * d)])
    assert below.violations["tpot"] > 1e-6
    assert below.objective_per_gpu > hard.objective_per_gpu
    assert below.revenue_per_gpu - below.penalty_per_gpu == pytest.approx(below.objective_per_gpu, rel=1e-12)
    # The violation is (TPOT - eta) (B - X) / B (docs/lp.md).
    B, X = paper.gpu.batch, below.prefill_occupancy
    assert below.violations["tpot"] == pytest.approx((below.tpot - 0.0235) * (B - X) / B, rel=1e-9)
    zero = solve_fluid(paper, slis=[TPOT(0.0235, penalty=0.0)])
    assert zero.objective_per_gpu == pytest.approx(UNCONSTRAINED, rel=1e-12)


# -- fairness, served fraction, wait ---------------------------------------------------------------
def test_prefill_fairness(paper):
    free = solve_fluid(paper)
    assert np.ptp(free.x) > 0.17
    sol = solve_fluid(paper, slis=[PrefillFairness(0.05)])
    assert np.ptp(sol.x) == pytest.approx(0.05, rel=1e-9)
    slope = central_difference(paper, PrefillFairness, 0.05, 1e-6)
    assert sol.sli_shadow_prices["prefill_fairness"] == pytest.approx(slope, rel=1e-6)
    assert sol.duals["prefill_fairness"] == sol.sli_shadow_prices["prefill_fairness"] > 0


def test_decode_fairness(paper):
    free = solve_fluid(paper)
    assert np.ptp(free.y_solo) > 7.9
    sol = solve_fluid(paper, slis=[DecodeFairness(2.0)])
    assert np.ptp(sol.y_solo) <= 2.0 + 1e-9
    assert sol.objective_per_gpu < UNCONSTRAINED


def test_min_served_fraction(paper):
    free = solve_fluid(paper)
    assert free.served_fraction[0] == pytest.approx(0.93655, abs=1e-5)
    sol = solve_fluid(paper, slis=[MinServedFraction("short-prompt", 0.97)])
    assert sol.served_fraction[0] == pytest.approx(0.97, rel=1e-9)
    slope = central_difference(paper, lambda f: MinServedFraction("short-prompt", f), 0.97, 1e-6)
    price = sol.sli_shadow_prices["served_fraction[short-prompt]"]
    assert price < 0  # serving more costs revenue
    assert price == pytest.approx(slope, rel=1e-6)


def test_max_prefill_wait(paper):
    free = solve_fluid(paper)
    assert free.prefill_wait[0] == pytest.approx(0.63451, abs=1e-5)
    sol = solve_fluid(paper, slis=[MaxPrefillWait("short-prompt", 0.3)])
    assert sol.prefill_wait[0] == pytest.approx(0.3, rel=1e-9)
    slope = central_difference(paper, lambda w: MaxPrefillWait("short-prompt", w), 0.3, 1e-6)
    assert sol.sli_shadow_prices["prefill_wait[short-prompt]"] == pytest.approx(slope, rel=1e-6)
    assert slope > 0


def test_strong_duality_with_slis(paper):
    """optimum = sum rhs * dual with the SLI rows' right-hand sides (docs/lp.md row list)."""
    slis = [TPOT(0.0242), PrefillFairness(0.16), MinServedFraction("short-prompt", 0.97, penalty=50),
            MaxPrefillWait("long-prompt", 0.5, penalty=20)]
    sol = solve_fluid(paper, "separate", slis)
    assert sol.violations["prefill_wait[long-prompt]"] > 0.1 and sol.duals["prefill_fairness"] > 0
    B, g, lam = 16, 45.45, [0.5, 0.5]  # the paper's published B, gamma and per-GPU arrival rates
    d = sol.duals
    total = d["prefill_capacity"] + B * d["solo_decode_capacity"]
    total += sum(lam[i] * d[f"prefill_balance[{c}]"] for i, c in enumerate(paper.class_names))
    total += d["tpot"] * (0.0242 - 1 / g) + d["prefill_fairness"] * 0.16
    total += d["served_fraction[short-prompt]"] * 0.97 + d["prefill_wait[long-prompt]"] * 0.5
    assert total == pytest.approx(sol.objective_per_gpu, rel=1e-9)


def test_conflicting_slis_are_named(paper):
    """Serving every request of both classes does not fit once the decode buffer must stay empty."""
    slis = [MinServedFraction("short-prompt", 1.0), MinServedFraction("long-prompt", 1.0), TPOT(0.05)]
    with pytest.raises(InfeasibleError) as e:
        solve_fluid(paper, slis=slis)
    c = set(e.value.conflicting)
    assert {"served_fraction[short-prompt]", "served_fraction[long-prompt]"} <= c
    assert "tpot" not in c  # not part of the conflict
    msg = str(e.value)
    assert "served_fraction[short-prompt] (SLI served:short-prompt=1)" in msg
    # Soft versions are always feasible and report the violation.
    soft = solve_fluid(paper, slis=[MinServedFraction("short-prompt", 1.0, penalty=1.0),
                                    MinServedFraction("long-prompt", 1.0, penalty=1.0)])
    assert sum(soft.violations.values()) > 0


def test_slis_force_empty_decode_buffer(paper):
    sol = solve_fluid(paper, "separate", [TPOT(1.0)])  # never binding
    assert np.all(sol.q_decode == 0.0)
    assert sol.objective_per_gpu < solve_fluid(paper, "separate").objective_per_gpu


def test_update_sli_bounds_matches_fresh(paper):
    fm = FluidModel(paper, "bundled", [TPOT(0.024), MinServedFraction("long-prompt", 0.9, penalty=50)])
    for eta, f, w in [(0.0236, 0.95, 10.0), (0.023, 0.99, 1000.0)]:
        slis = [TPOT(eta), MinServedFraction("long-prompt", f, penalty=w)]
        fm.update(slis=slis)
        assert fm.solve().objective_per_gpu == pytest.approx(solve_fluid(paper, slis=slis).objective_per_gpu, rel=1e-12)


# -- parsing and validation ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec, want",
    [
        ("tpot=0.03", TPOT(0.03)),
        ("prefill_fairness=0.05", PrefillFairness(0.05)),
        ("decode_fairness=1.5", DecodeFairness(1.5)),
        ("served:short-prompt=0.9", MinServedFraction("short-prompt", 0.9)),
        ("served_fraction:short-prompt=0.9", MinServedFraction("short-prompt", 0.9)),
        ("wait:long-prompt=2.0", MaxPrefillWait("long-prompt", 2.0)),
        ("prefill_wait:long-prompt=2", MaxPrefillWait("long-prompt", 2.0)),
        ("tpot=0.03:penalty=100", TPOT(0.03, penalty=100.0)),
        (" served:a:b = 0.5 : penalty = 1e3", MinServedFraction("a:b", 0.5, penalty=1000.0)),
    ],
)
def test_parse_sli(spec, want):
    got = parse_sli(spec)
    assert got == want
    assert parse_sli(sli_spec(got)) == got


@pytest.mark.parametrize(
    "spec, message",
    [
        ("tpot", "expected NAME=VALUE"),
        ("=0.3", "expected NAME=VALUE"),
        ("tpot=abc", "expected a number for the bound, got 'abc'"),
        ("tpot=nan", "expected a finite number for the bound, got 'nan'"),
        ("latency=0.3", "unknown SLI 'latency'; expected one of tpot, prefill_fairness"),
        ("served=0.9", "'served' needs a class, e.g. served:CLASS=0.9"),
        ("served:=0.9", "missing class name after 'served:'"),
        ("tpot:x=0.9", "unknown per-class SLI 'tpot'"),
        ("tpot=0.03:weight=3", "unknown option 'weight=3'; the only option is ':penalty=WEIGHT'"),
        ("tpot=0.03:penalty=1:penalty=2", "':penalty=' given twice"),
        ("tpot=0.03:penalty=x", "expected a number for the penalty weight, got 'x'"),
        ("tpot=-0.03", "sli.tpot.max_seconds: expected a time per output token > 0 s, got -0.03"),
        ("tpot=0.03:penalty=-1", "sli.tpot.penalty: expected a weight >= 0"),
        ("prefill_fairness=-0.1", "sli.prefill_fairness.eta: expected a bound >= 0"),
        ("decode_fairness=-1", "sli.decode_fairness.eta: expected a bound >= 0"),
        ("served:a=1.5", "sli.served[a].fraction: expected a fraction in [0, 1], got 1.5"),
        ("wait:a=-2", "sli.wait[a].seconds: expected a mean wait >= 0 s, got -2.0"),
    ],
)
def test_parse_sli_errors(spec, message):
    with pytest.raises(ScenarioError) as e:
        parse_sli(spec, where="--sli")
    assert str(e.value).startswith(f"--sli {spec!r}: ")
    assert message in str(e.value)


def test_sli_objects_validate_their_fields():
    with pytest.raises(ScenarioError, match=r"sli.tpot.max_seconds: expected a number, got '0.03' \(str\)"):
        TPOT("0.03")
    with pytest.raises(ScenarioError, match="sli.tpot.max_seconds: expected a finite number, got inf"):
        TPOT(float("inf"))
    with pytest.raises(ScenarioError, match="sli.served.cls: expected a non-empty class name, got ''"):
        MinServedFraction("", 0.5)
    with pytest.raises(ScenarioError, match="sli.wait.cls: expected a non-empty class name, got 3"):
        MaxPrefillWait(3, 1.0)
    with pytest.raises(ScenarioError, match="sli.prefill_fairness.penalty: expected a number, got True"):
        PrefillFairness(0.1, penalty=True)


def test_sli_validation_against_scenario(paper):
    with pytest.raises(ScenarioError) as e:
        solve_fluid(paper, slis=[MinServedFraction("chat", 0.9)])
    assert str(e.value) == (
        "sli 'served:chat=0.9': unknown class 'chat'; the scenario's classes are short-prompt, long-prompt"
    )
    with pytest.raises(ScenarioError, match=r"sli tpot: given twice \('tpot=0.03' and 'tpot=0.04'\)"):
        solve_fluid(paper, slis=[TPOT(0.03), TPOT(0.04)])
    with pytest.raises(ScenarioError, match="unknown class 'nope'"):
        solve_fluid(paper, slis=["wait:nope=1"])
    assert validate_slis(["tpot=0.03"], paper.class_names) == (TPOT(0.03),)
    assert validate_slis(TPOT(0.03), paper.class_names) == (TPOT(0.03),)
