"""The package's front door: the former module names still import, as the same module objects, and the
public names of the package root resolve (issue 47 moved the modules into packages by question)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import fluidopt

# every former name and where it lives now
FORMER = sorted(fluidopt.MOVED.items())


@pytest.mark.parametrize("old, new", FORMER, ids=[o for o, _ in FORMER])
def test_a_former_module_name_imports_the_module_that_moved(old, new):
    moved = importlib.import_module(old)
    assert moved is importlib.import_module(new)
    assert moved.__name__ == new
    assert moved.__spec__.name == new  # the alias does not rename the module it hands out


def test_documented_imports_of_the_former_layout():
    from fluidopt.calibrate import fit_iteration_time, from_vidur, load_profile  # noqa: F401
    from fluidopt.model import Scenario
    from fluidopt.plan import plan
    from fluidopt.pricing_opt import fit_demand
    from fluidopt.sim.trace import load_azure_trace, read_trace_csv  # noqa: F401
    from fluidopt.sim.workload import Poisson, TraceWorkload, workload_from_scenario  # noqa: F401

    from fluidopt.control.orchestration import QLM, Chiron, FluidPlan, QLMGroups, UtilisationAutoscaler  # noqa: F401
    from fluidopt.control.registry import make_controller, register  # noqa: F401
    from fluidopt.harness import compare
    from fluidopt.pricing import optimize_prices, price_grid  # noqa: F401

    assert compare.__module__ == "fluidopt.harness.comparison"
    assert plan.__module__ == "fluidopt.planning.fleet"
    assert fit_demand.__module__ == "fluidopt.pricing.demand_fit"
    assert Scenario.__module__ == "fluidopt.core.model"
    from fluidopt.control.registration import register as reg

    assert register is reg


@pytest.mark.parametrize("name", fluidopt.__all__)
def test_every_public_name_of_the_root_resolves(name):
    assert getattr(fluidopt, name) is not None


def test_a_former_name_is_an_attribute_of_the_package():
    assert fluidopt.dayplan is importlib.import_module("fluidopt.planning.day")


def test_an_unknown_name_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        fluidopt.nonexistent  # noqa: B018
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("fluidopt.nonexistent")


def test_import_fluidopt_stays_light():
    """`import fluidopt` loads no numpy (the command line installs its signal handlers first)."""
    code = "import sys, fluidopt; print('numpy' in sys.modules, 'pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
