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
from fluidopt.model import GPUProfile, Rates, RequestClass, Scenario, paper_scenario
from fluidopt.scenario import default_scenario, load_scenario, loads_scenario, scenario_from_dict

__version__ = "0.1.0"

# Heavy parts (Pyomo, statsmodels, the simulator) load on first use, so `import fluidopt` stays fast.
_LAZY = {
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
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'fluidopt' has no attribute {name!r}")
    import importlib

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
