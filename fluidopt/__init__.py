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
)
from fluidopt.model import GPUProfile, Rates, RequestClass, Scenario, paper_scenario
from fluidopt.scenario import default_scenario, load_scenario, loads_scenario, scenario_from_dict

__version__ = "0.1.0"

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
    "default_scenario",
    "load_scenario",
    "loads_scenario",
    "paper_scenario",
    "scenario_from_dict",
]
