"""fluidopt: operations research for LLM-inference GPU fleets.

Calibrate the iteration-time law, solve the steady-state fluid LP, run gate-and-route
controllers, and measure them on a many-server simulator.
"""

import importlib
import importlib.abc
import importlib.util
import sys
from pathlib import Path

from fluidopt.core.errors import (
    ActionError,
    CalibrationError,
    FluidoptError,
    InfeasibleError,
    ScenarioError,
    SolverError,
    TraceError,
    UsageError,
)

__version__ = "0.1.0"

# Everything past the errors loads on first use (numpy and the model included), so `import fluidopt`
# stays fast and the command line has its signal handlers in place before any heavy import: a Ctrl-C
# during start-up is then one line, not a traceback from inside an import.
_LAZY = {
    "GPUProfile": "fluidopt.core.model",
    "Rates": "fluidopt.core.model",
    "RequestClass": "fluidopt.core.model",
    "Scenario": "fluidopt.core.model",
    "paper_scenario": "fluidopt.core.model",
    "default_scenario": "fluidopt.scenario",
    "load_scenario": "fluidopt.scenario",
    "loads_scenario": "fluidopt.scenario",
    "scenario_from_dict": "fluidopt.scenario",
    "solve_fluid": "fluidopt.fluid.lp",
    "build_fluid_model": "fluidopt.fluid.lp",
    "FluidSolution": "fluidopt.fluid.solution",
    "sweep": "fluidopt.fluid.sweeps",
    "simulate": "fluidopt.sim.api",
    "make_engine": "fluidopt.sim.api",
    "check_controller": "fluidopt.sim.check",
    "make_controller": "fluidopt.control.registry",
    "register": "fluidopt.control.registry",
    "fit_iteration_time": "fluidopt.calibration.fit",
    "load_profile": "fluidopt.calibration.profiles",
}


# Where modules moved when the package was laid out by question (fluidopt 0.1 -> the packages):
# the former names still import, as the same module objects, so ``from fluidopt.calibrate import
# load_profile`` and ``import fluidopt.sim.workload`` keep working.
MOVED: dict[str, str] = {
    "fluidopt.errors": "fluidopt.core.errors",
    "fluidopt._files": "fluidopt.core.files",
    "fluidopt.interrupt": "fluidopt.core.interrupt",
    "fluidopt.model": "fluidopt.core.model",
    "fluidopt.demand": "fluidopt.core.demand",
    "fluidopt.tables": "fluidopt.core.tables",
    "fluidopt.calibrate": "fluidopt.calibration",
    "fluidopt.vidur": "fluidopt.calibration.vidur",
    "fluidopt.executor": "fluidopt.harness.executor",
    "fluidopt.plots": "fluidopt.harness.plots",
    "fluidopt.plan": "fluidopt.planning.fleet",
    "fluidopt.dayplan": "fluidopt.planning.day",
    "fluidopt.pricing_opt": "fluidopt.pricing.optimize",
    "fluidopt.sim.trace": "fluidopt.workloads.traces",
    "fluidopt.sim.workload": "fluidopt.workloads",
}


class _MovedModule(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a former module name as the module that now holds it (the same object)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module):
        # already executed under its own name; importlib has just set the alias's spec on it: put the
        # module's own back, so that it still names where it lives
        alias = module.__spec__
        module.__spec__ = alias.loader_state


if not any(isinstance(f, _MovedModule) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModule())


def __getattr__(name: str):
    mod = _LAZY.get(name)
    if mod is None:
        here = Path(__file__).parent
        if (here / f"{name}.py").is_file() or (here / name / "__init__.py").is_file() or f"fluidopt.{name}" in MOVED:
            return importlib.import_module(f"fluidopt.{name}")  # a submodule, e.g. fluidopt.scenario
        raise AttributeError(f"module 'fluidopt' has no attribute {name!r}")

    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value

__all__ = [
    "ActionError",
    "CalibrationError",
    "FluidoptError",
    "GPUProfile",
    "InfeasibleError",
    "Rates",
    "RequestClass",
    "Scenario",
    "ScenarioError",
    "SolverError",
    "TraceError",
    "UsageError",
    "default_scenario",
    "load_scenario",
    "loads_scenario",
    "paper_scenario",
    "scenario_from_dict",
    "solve_fluid",
    "build_fluid_model",
    "FluidSolution",
    "sweep",
    "simulate",
    "make_engine",
    "check_controller",
    "make_controller",
    "register",
    "fit_iteration_time",
    "load_profile",
]
