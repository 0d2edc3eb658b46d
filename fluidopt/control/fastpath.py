"""Where the built-in controllers hand over to a compiled fast path, if the simulator installed one.

The controllers whose handlers are written once (gate_handlers.py, fiwsp_handlers.py,
fcfs_handlers.py) call :func:`bind` at the end of ``setup``. The control layer knows nothing of the
simulator: the simulator layer (:mod:`fluidopt.sim.controller_fastpath`, imported with
:mod:`fluidopt.sim`) registers the binder that, on its compiled engine core, installs the compiled
build of those same handlers as the engine's callbacks and returns the bound object (None everywhere
else: the Python handlers run). ``FLUIDOPT_FAST_CONTROLLERS=0`` in the
environment switches it off (the differential tests and the benchmarks use it). Same decisions bit
for bit either way (docs/simulator.md section 9).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

__all__ = ["bind", "enabled", "set_binder"]

_binder: Callable[[Any, Any], Any] | None = None


def set_binder(binder: Callable[[Any, Any], Any] | None) -> None:
    """Install (or with None remove) the function ``binder(controller, ctx) -> fast object or None``."""
    global _binder
    _binder = binder


def enabled() -> bool:
    """False when ``FLUIDOPT_FAST_CONTROLLERS=0`` (run the Python handlers everywhere)."""
    return os.environ.get("FLUIDOPT_FAST_CONTROLLERS", "").strip() != "0"


def bind(ctrl: Any, ctx: Any) -> Any:
    """The fast path of ``ctrl`` on ``ctx`` (installed on ``ctx``), or None: the Python handlers run."""
    if _binder is None or not enabled():
        return None
    return _binder(ctrl, ctx)
