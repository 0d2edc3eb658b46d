"""The steady-state fluid LP (docs/model.md, docs/lp.md): Pyomo/HiGHS models, SLIs, a cvxpy cross-check, sweeps.

Imports are lazy so that ``import fluidopt.fluid.sli`` (used by the CLI parser) does not load Pyomo.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "FluidModel": "lp",
    "build_fluid_model": "lp",
    "solve_fluid": "lp",
    "objective_coefficients": "lp",
    "PRICINGS": "lp",
    "FluidSolution": "solution",
    "tpot_of_occupancy": "solution",
    "SLI": "sli",
    "PrefillFairness": "sli",
    "DecodeFairness": "sli",
    "TPOT": "sli",
    "MinServedFraction": "sli",
    "MaxPrefillWait": "sli",
    "parse_sli": "sli",
    "parse_slis": "sli",
    "sli_spec": "sli",
    "solve_fluid_cvxpy": "convex",
    "solve_proportional_fair": "convex",
    "sweep": "sweeps",
    "sweep_scenarios": "sweeps",
}

__all__ = list(_EXPORTS)  # resolved lazily by __getattr__


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'fluidopt.fluid' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"fluidopt.fluid.{mod}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
