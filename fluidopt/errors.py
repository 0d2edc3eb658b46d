"""Exceptions raised at fluidopt's edges.

Every error names the offending field or row, the value seen and what was expected, so that a
user can fix the input without reading a traceback.
"""

from __future__ import annotations


class FluidoptError(Exception):
    """Base class for all errors fluidopt raises on purpose."""


class ScenarioError(FluidoptError, ValueError):
    """A scenario (TOML file, dict or dataclass arguments) is malformed or out of range."""


class UsageError(FluidoptError, ValueError):
    """A bad argument that is not part of a scenario: an unknown option, backend, environment
    variable, module to import, output path or worker count."""


class CalibrationError(FluidoptError, ValueError):
    """Calibration data cannot be fitted (too few points, bad values, missing columns)."""


class InfeasibleError(FluidoptError):
    """The fluid LP has no feasible point; ``conflicting`` names an irreducible set of rows."""

    def __init__(self, message: str, conflicting: tuple[str, ...] = ()):
        super().__init__(message)
        self.conflicting = tuple(conflicting)


class SolverError(FluidoptError):
    """The solver failed for a reason other than infeasibility (unbounded, numerical trouble)."""


class TraceError(FluidoptError, ValueError):
    """A workload trace file is malformed; the message names the row and column."""


class ActionError(FluidoptError):
    """A controller asked the simulator for an impossible action (busy slot, request not waiting)."""
