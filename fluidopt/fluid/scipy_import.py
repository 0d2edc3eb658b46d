"""Import a part of scipy in a process that has Pyomo, without Pyomo's scipy finalizer.

Pyomo (``pyomo.common.dependencies``, 6.7.2 and later) registers a post-import hook for scipy: the first
``import scipy`` after Pyomo's import (and Pyomo's import after scipy's) also imports scipy.stats,
scipy.integrate, scipy.sparse and scipy.spatial (its ``_finalize_scipy``): about 0.7 CPU-s in every
``fluidopt price`` process, whose direct LP path needs only scipy.linalg's LU factorisation. Pyomo offers
no setting to skip it. :func:`import_scipy` holds Pyomo's hook back while the named part of scipy loads
and puts it back unchanged, so nothing of Pyomo's is lost: its deferred ``scipy`` (``scipy_available``,
``pyomo.common.dependencies.scipy``) still resolves, and runs the finalizer, the first time Pyomo itself
asks for scipy. The hook is reached through a private name (``DeferredImportCallbackFinder._callbacks``);
where a Pyomo release renames it, the import simply runs the hook as before (same modules, same numbers,
only slower). ``tests/fluid/test_scipy_import.py`` checks both, and docs/testing.md ("Fourth round") the
time.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

__all__ = ["import_scipy"]


def _held_hook(deps: object) -> tuple[dict | None, object]:
    """Pyomo's table of post-import hooks and the entry for scipy taken out of it (``(None, None)``
    where ``deps`` has no such table, as a Pyomo that changed its internals would not)."""
    finder = getattr(deps, "DeferredImportCallbackFinder", None)
    table = getattr(finder, "_callbacks", None)
    if not isinstance(table, dict) or "scipy" not in table:
        return None, None
    return table, table.pop("scipy")


def import_scipy(name: str) -> ModuleType:
    """``importlib.import_module(name)`` for a part of scipy (``"scipy.linalg"``), with Pyomo's scipy
    finalizer (module docstring) left for Pyomo's own first use of scipy."""
    if "scipy" in sys.modules:  # scipy is loaded: its hook has run already or will run when Pyomo asks
        return importlib.import_module(name)
    return _import_holding(sys.modules.get("pyomo.common.dependencies"), name)


def _import_holding(deps: object, name: str) -> ModuleType:
    """Import ``name`` with the scipy entry of ``deps``' hook table out, and put it back whatever happens."""
    table, held = _held_hook(deps)
    try:
        return importlib.import_module(name)
    finally:
        if table is not None:
            table["scipy"] = held
