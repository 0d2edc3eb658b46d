"""Pyomo's persistent HiGHS interface without its per-solve output capture.

``pyomo.contrib.solver.solvers.highs.Highs._solve`` runs every solve inside
``capture_output(TeeStream(...), capture_fd=True)``: an OS pipe, the process's stdout and stderr file
descriptors duplicated onto it and back, and a reader thread, so that HiGHS's log can be returned in
``Results.solver_log``. fluidopt turns HiGHS's output off (``output_flag = False``), so there is nothing to
capture. The capture was about 1.3 ms of a 3.1 ms re-solve of the paper's two-class LP (CPU time), which a
price grid or a Nelder-Mead search over prices pays once per point.

:class:`QuietHighs` runs the same steps as Pyomo's method, in the same order, without the capture; its
``Results.solver_log`` is empty, as it was with the output off. It does so only while Pyomo's method is the
one this was written from (Pyomo 6.10: the SHA-256 of its source, checked once per process) and only for a
solve that asks for no output (no ``tee`` stream, ``output_flag`` off); otherwise Pyomo's own method runs,
so another Pyomo release only loses the saving.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import io

from pyomo.contrib.solver.solvers.highs import Highs

__all__ = ["QuietHighs"]

# Pyomo 6.10.1's Highs._solve, whose steps QuietHighs._solve repeats
_PYOMO_SOLVE_SHA256 = "2b0fd1a80fe5b16a4857d3fba1890e75c83252326e8bca817076ad1481106e40"


@functools.cache
def _pyomo_solve_known() -> bool:
    """Whether the installed Pyomo's ``Highs._solve`` is the method QuietHighs repeats."""
    try:
        src = inspect.getsource(Highs._solve)
    except (OSError, TypeError):  # no source shipped: assume nothing
        return False
    return hashlib.sha256(src.encode("utf-8")).hexdigest() == _PYOMO_SOLVE_SHA256


class QuietHighs(Highs):
    """``Highs`` whose solves with the output off skip Pyomo's output capture (same solver calls, same results)."""

    def _solve(self):
        config = self._active_config
        options = config.solver_options
        # (a ConfigDict's get() returns an uninitialised marker for a key set on the solver's own config: read
        # the items, as Pyomo's loop below does)
        if config.tee or dict(options.items()).get("output_flag", True) is not False or not _pyomo_solve_known():
            return super()._solve()
        timer = config.timer
        highs = self._solver_model
        highs.setOptionValue("log_to_console", True)
        if config.threads is not None:
            highs.setOptionValue("threads", config.threads)
        if config.time_limit is not None:
            highs.setOptionValue("time_limit", config.time_limit)
        if config.rel_gap is not None:
            highs.setOptionValue("mip_rel_gap", config.rel_gap)
        if config.abs_gap is not None:
            highs.setOptionValue("mip_abs_gap", config.abs_gap)
        for key, option in options.items():
            highs.setOptionValue(key, option)
        timer.start("optimize")
        if self.version()[:2] >= (1, 8):
            highs.HandleKeyboardInterrupt = True
        highs.run()
        timer.stop("optimize")
        return self._postsolve(io.StringIO())
