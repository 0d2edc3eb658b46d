"""fluidopt.fluid.scipy_import: scipy's part loads without Pyomo's finalizer, Pyomo's own use of scipy still
runs it, and a Pyomo without the private table only costs time."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import scipy.linalg

from fluidopt.fluid import scipy_import
from fluidopt.fluid.scipy_import import _held_hook, _import_holding, import_scipy

ROOT = Path(__file__).resolve().parents[2]


def test_pyomos_hook_waits_for_pyomos_own_use_of_scipy():
    # one subprocess (about 1.3 CPU-s): scipy must not be loaded yet, which no pytest worker can offer
    code = ("import sys\n"
            "import pyomo.environ\n"
            "import pyomo.common.dependencies as deps\n"
            "from fluidopt.fluid.scipy_import import import_scipy\n"
            "la = import_scipy('scipy.linalg')\n"
            "print(la.__name__, 'scipy.stats' in sys.modules, 'scipy' in deps.DeferredImportCallbackFinder._callbacks)\n"
            "print(bool(deps.scipy_available), 'scipy.stats' in sys.modules, deps.scipy.stats.__name__)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # loaded without scipy.stats, the hook back in Pyomo's table; then Pyomo's first ask runs the finalizer
    assert r.stdout.split("\n")[:2] == ["scipy.linalg False True", "True True scipy.stats"]


def test_the_hook_is_taken_out_and_put_back_unchanged():
    hook = object()
    table = {"scipy": hook, "numpy": "other"}
    deps = types.SimpleNamespace(DeferredImportCallbackFinder=types.SimpleNamespace(_callbacks=table))
    assert _held_hook(deps) == (table, hook) and table == {"numpy": "other"}
    # an unknown Pyomo (no finder, no table, a table without scipy, no Pyomo at all): nothing to hold
    for odd in (types.SimpleNamespace(), types.SimpleNamespace(DeferredImportCallbackFinder=object()),
                types.SimpleNamespace(DeferredImportCallbackFinder=types.SimpleNamespace(_callbacks={"numpy": 1})),
                None):
        assert _held_hook(odd) == (None, None)
    # the table comes back whole after an import, and after a failed one, whose error is the import's own
    table["scipy"] = hook
    assert _import_holding(deps, "json") is json and table == {"numpy": "other", "scipy": hook}
    with pytest.raises(ModuleNotFoundError, match="fluidopt._no_such_module_"):
        _import_holding(deps, "fluidopt._no_such_module_")
    assert table == {"numpy": "other", "scipy": hook}


def test_with_scipy_loaded_it_is_a_plain_import():
    assert import_scipy("scipy.linalg") is scipy.linalg
    assert scipy_import.__all__ == ["import_scipy"]
