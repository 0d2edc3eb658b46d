"""Exceptions raised at fluidopt's edges.

Every error names the offending field or row, the value seen and what was expected, so that a
user can fix the input without reading a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable


class FluidoptError(Exception):
    """Base class for all errors fluidopt raises on purpose. ``exit_status``: the command line's exit
    code for it (2: bad input or an unusable output; 3: the cluster running the work was lost)."""

    exit_status = 2


class ScenarioError(FluidoptError, ValueError):
    """A scenario (TOML file, dict or dataclass arguments) is malformed or out of range."""


class UsageError(FluidoptError, ValueError):
    """A bad argument that is not part of a scenario: an unknown option, backend, environment
    variable, module to import, output path or worker count."""


class OutputError(FluidoptError):
    """An output folder or file cannot be written (missing parent, read-only, full, in use by another
    process). The message names the path; what was finished before it is kept in the results store."""


class FolderInUseError(OutputError):
    """A results folder is held by another live process (its PID is in the message)."""


class ExecutorLost(FluidoptError):
    """The Dask scheduler or every worker was lost mid-sweep; the finished runs are stored, and a rerun
    resumes from them."""

    exit_status = 3


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


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """`` (did you mean 'jsq'?)`` for the closest known names to a misspelt ``name``, or ``""``."""
    import difflib

    close = difflib.get_close_matches(str(name).strip().lower(), [str(k) for k in known], n=3, cutoff=0.75)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
