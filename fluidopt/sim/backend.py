"""Which event engine runs a simulation: the compiled core or the pure-Python engine.

Both are the same code: ``fluidopt/sim/engine.py`` is the engine, and at install time Cython compiles
a copy of it, with the static types declared in ``fluidopt/sim/engine.pxd``, into the extension
``fluidopt.sim._cengine`` (see setup.py). Results are identical bit for bit (tested); the compiled
core is about 4x faster. The compiled core is used only when it was built from the engine.py that
is on disk now (it carries the SHA-256 of engine.py and engine.pxd), and with a compiled prefix cache
built from the prefix_cache.py and prefix_cache.pxd on disk (the core calls it at C level, and records
the .pxd it was built against), so editing any of them never runs a stale build: the pure-Python engine
runs instead, with one warning, until the package is reinstalled.

``backend``: ``"auto"`` (default: the compiled core when usable, else Python), ``"compiled"`` (an
error if it is not usable) or ``"python"``. The environment variable ``FLUIDOPT_ENGINE`` sets the
default for ``"auto"`` (``python`` or ``compiled``).
"""

from __future__ import annotations

import functools
import hashlib
import os
import warnings
from pathlib import Path

from fluidopt.core.errors import UsageError

__all__ = ["BACKENDS", "compiled_status", "engine_class"]

BACKENDS = ("auto", "compiled", "python")


@functools.lru_cache(maxsize=1)
def compiled_status() -> tuple[bool, str]:
    """(usable, reason): whether the compiled core can run, and why not if it cannot."""
    try:
        from fluidopt.sim import _cengine  # type: ignore[attr-defined]
    except ImportError as exc:
        return False, f"the compiled core is not installed ({exc}); reinstall with a C compiler to build it"
    here = Path(__file__).parent
    try:
        digest = hashlib.sha256(
            (here / "engine.py").read_bytes() + b"\0" + (here / "engine.pxd").read_bytes()
        ).hexdigest()
    except OSError:
        return True, "engine.py or engine.pxd not found next to the compiled core; using the compiled core"
    if digest != getattr(_cengine, "SOURCE_SHA256", None):
        return False, (
            "the compiled core was built from another version of fluidopt/sim/engine.py or engine.pxd; "
            "reinstall (pip install -e .) to rebuild it"
        )
    # the core calls the compiled prefix cache at C level (engine.pxd types it): the two run together, both
    # built from the sources on disk, or the Python engine runs (with the Python cache)
    from fluidopt.sim.prefix_cache import compiled_class

    try:
        types = hashlib.sha256((here / "prefix_cache.pxd").read_bytes()).hexdigest()
    except OSError:
        types = getattr(_cengine, "PREFIX_CACHE_TYPES_SHA256", None)
    cache, why = compiled_class()
    if cache is not None and types != getattr(_cengine, "PREFIX_CACHE_TYPES_SHA256", None):
        cache, why = None, "built from another version of prefix_cache.pxd than the core"
    if cache is None:
        return False, (f"the compiled core's prefix cache (fluidopt.sim._c_prefix_cache) was {why}; "
                       "reinstall (pip install -e .) to rebuild it")
    return True, "compiled core built from the current engine.py and engine.pxd, with its prefix cache"


@functools.cache
def _warn_once(reason: str) -> None:
    warnings.warn(f"fluidopt: running the pure-Python engine: {reason}", RuntimeWarning, stacklevel=4)


def engine_class(backend: str = "auto") -> tuple[type, str]:
    """The Engine class for ``backend`` and the name of the one chosen (``"compiled"`` or ``"python"``)."""
    if backend not in BACKENDS:
        raise UsageError(f"simulate: backend: expected one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if backend == "auto":
        env = os.environ.get("FLUIDOPT_ENGINE", "").strip().lower()
        if env in ("compiled", "python"):
            backend = env
        elif env not in ("", "auto"):
            raise UsageError(f"FLUIDOPT_ENGINE: expected 'auto', 'compiled' or 'python', got {env!r}")
    if backend == "python":
        from fluidopt.sim.engine import Engine

        return Engine, "python"
    ok, reason = compiled_status()
    if ok:
        from fluidopt.sim._cengine import Engine  # type: ignore[attr-defined]

        return Engine, "compiled"
    if backend == "compiled":
        raise UsageError(f"simulate: backend='compiled': {reason}")
    # a missing build is a documented install choice (no compiler): say so only for a stale build
    if "another version" in reason:
        _warn_once(reason)
    from fluidopt.sim.engine import Engine

    return Engine, "python"
