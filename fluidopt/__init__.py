"""fluidopt: operations research for LLM-inference GPU fleets.

Calibrate the iteration-time law, solve the steady-state fluid LP, run gate-and-route
controllers, and measure them on a many-server simulator.
"""

from fluidopt.errors import (
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
    "GPUProfile": "fluidopt.model",
    "Rates": "fluidopt.model",
    "RequestClass": "fluidopt.model",
    "Scenario": "fluidopt.model",
    "paper_scenario": "fluidopt.model",
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
    "fit_iteration_time": "fluidopt.calibrate",
    "load_profile": "fluidopt.calibrate",
}


def __getattr__(name: str):
    import importlib

    mod = _LAZY.get(name)
    if mod is None:
        from pathlib import Path

        here = Path(__file__).parent
        if (here / f"{name}.py").is_file() or (here / name / "__init__.py").is_file():
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
