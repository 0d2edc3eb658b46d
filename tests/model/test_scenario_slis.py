"""SLIs given in the scenario TOML (top-level ``slis``, the ``--sli`` spec strings)."""

from pathlib import Path

import pytest

from fluidopt.core.errors import ScenarioError
from fluidopt.fluid import solve_fluid
from fluidopt.scenario import loads_scenario, scenario_from_dict, scenario_to_dict

EXAMPLE = (Path(__file__).resolve().parents[2] / "examples/scenarios/paper-two-class.toml").read_text()


def with_slis(line: str):
    return loads_scenario(line + "\n" + EXAMPLE)


def test_slis_round_trip_and_reach_the_solver_through_the_cli():
    s = with_slis('slis = ["tpot=0.0235"]')
    assert s.meta["slis"] == ("tpot=0.0235",)
    assert scenario_from_dict(scenario_to_dict(s)).meta["slis"] == ("tpot=0.0235",)
    # The TPOT bound binds (unconstrained TPOT is 0.02429 s), so revenue drops.
    free = solve_fluid(s, slis=()).objective_per_gpu
    bound = solve_fluid(s).objective_per_gpu  # the scenario's own SLIs by default
    assert bound < free - 1e-6


@pytest.mark.parametrize(
    "line, message",
    [
        ('slis = "tpot=0.03"', r"slis: expected an array of SLI spec strings"),
        ("slis = [3]", r"slis: expected an array of SLI spec strings"),
        ('slis = ["tpot=abc"]', r"slis\[0\] 'tpot=abc': expected a number"),
        ('slis = ["served:nope=0.9"]', r"unknown class 'nope'"),
        ('slis = ["tpot=0.03", "tpot=0.04"]', r"given twice"),
    ],
)
def test_bad_slis_name_the_entry(line, message):
    with pytest.raises(ScenarioError, match=message):
        with_slis(line)
