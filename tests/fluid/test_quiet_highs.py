"""QuietHighs (fluidopt.fluid.quiet_highs): the same solves as Pyomo's HiGHS interface, without its output capture."""

from __future__ import annotations

import pytest
from pyomo.contrib.solver.solvers import highs as pyomo_highs

from fluidopt import RequestClass, Scenario
from fluidopt.core.model import paper_gpu, paper_scenario
from fluidopt.fluid.lp import FluidModel
from fluidopt.fluid.quiet_highs import QuietHighs, _pyomo_solve_known


def _solve_with(model: FluidModel, opt):
    model._solver = None
    cfg = model.solver.config  # the configured interface's (output off, no solution loading)
    opt.config.load_solutions = cfg.load_solutions
    opt.config.raise_exception_on_nonoptimal_result = cfg.raise_exception_on_nonoptimal_result
    opt.config.solver_options["output_flag"] = False
    model._solver = opt
    return model.solve(raise_infeasible=False)


def _numbers(sol) -> dict:
    return {k: v for k, v in sol.to_dict().items() if k != "solve_seconds"}  # (wall time)


@pytest.mark.parametrize("pricing", ["bundled", "separate"])
def test_same_solution_as_pyomos_highs(pricing):
    """Values, objective and duals equal to the last bit, bundled and separate, and an infeasible case alike."""
    # the paper's instance, and one class with more prompts than the prefill can take and no patience: infeasible
    stuck = Scenario(gpu=paper_gpu(), gpus=100, prefill_price=0.1, decode_price=0.2, name="stuck",
                     classes=(RequestClass("only", prompt=300, decode=1000, rate=200.0, patience=0.0),))
    for scenario in (paper_scenario(), stuck):
        quiet = _solve_with(FluidModel(scenario, pricing=pricing), QuietHighs())
        loud = _solve_with(FluidModel(scenario, pricing=pricing), pyomo_highs.Highs())
        assert quiet.status == loud.status
        # repr: every float to the last bit, and NaN equal to NaN (an infeasible solution's values)
        assert repr(_numbers(quiet)) == repr(_numbers(loud))


def test_the_installed_pyomo_is_the_one_repeated_or_its_own_method_runs(monkeypatch):
    """Where the installed Pyomo's method is the one QuietHighs repeats, a re-solve opens no capture; a solve asking
    for a tee stream still goes through Pyomo's own method."""
    calls = []
    real = pyomo_highs.capture_output

    def spy(*a, **k):
        calls.append(k)
        return real(*a, **k)

    model = FluidModel(paper_scenario())
    model.solve()  # the first solve builds HiGHS's model: Pyomo's set_instance captures its banner, as it should
    monkeypatch.setattr(pyomo_highs, "capture_output", spy)
    model.solve()
    if not _pyomo_solve_known():
        assert calls, "another Pyomo: its own method (with the capture) runs"
        pytest.skip("the installed Pyomo's Highs._solve is not the one QuietHighs repeats: no saving, same results")
    assert calls == []
    import io

    model.solver.config.tee = [io.StringIO()]
    model.solve()
    assert calls  # (one per solve: the lexicographic stage may add a second)


def test_an_unknown_pyomo_method_runs_pyomos_own(monkeypatch):
    import fluidopt.fluid.quiet_highs as qh

    monkeypatch.setattr(qh, "_PYOMO_SOLVE_SHA256", "0" * 64)
    qh._pyomo_solve_known.cache_clear()
    try:
        calls = []
        real = pyomo_highs.capture_output
        monkeypatch.setattr(pyomo_highs, "capture_output", lambda *a, **k: calls.append(1) or real(*a, **k))
        sol = FluidModel(paper_scenario()).solve()
        assert calls and sol.status == "optimal"
    finally:
        qh._pyomo_solve_known.cache_clear()
