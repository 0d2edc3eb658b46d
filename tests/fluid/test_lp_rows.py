"""What the fluid LP reports about its rows and its solver (docs/lp.md), on the paper instance."""

from __future__ import annotations

import pytest

from fluidopt import InfeasibleError, ScenarioError
from fluidopt.fluid import TPOT, FluidModel, MinServedFraction, solve_fluid


def test_solution_names_its_solver_and_rows(paper):
    sol = solve_fluid(paper)
    assert sol.solver == "highs" and sol.status == "optimal"
    names = paper.class_names
    want = {"prefill_capacity", "mixed_decode_capacity", "solo_decode_capacity"}
    want |= {f"prefill_balance[{c}]" for c in names} | {f"decode_balance[{c}]" for c in names}
    assert set(sol.duals) == want  # the stage-2 floor row is internal: never reported


def test_update_names_the_sli_rows_it_keeps(paper):
    fm = FluidModel(paper, "bundled", [TPOT(0.03, penalty=5.0), MinServedFraction("long-prompt", 0.5)])
    with pytest.raises(ScenarioError) as e:
        fm.update(slis=[TPOT(0.03)])
    msg = str(e.value)
    assert msg.startswith("slis: update() keeps the SLI rows of the built model "
                          "(tpot (penalty), served_fraction[long-prompt] (hard)); got tpot=0.03")
    assert msg.endswith("build a new model for other SLIs")


def test_infeasible_hard_slis_suggest_relaxing_or_penalties(paper):
    slis = [MinServedFraction("short-prompt", 1.0), MinServedFraction("long-prompt", 1.0), TPOT(0.05)]
    with pytest.raises(InfeasibleError) as e:
        solve_fluid(paper, slis=slis)
    assert str(e.value).endswith("; relax the SLIs named, or make them soft with ':penalty=WEIGHT'")
