"""When the built-in gate-and-route controllers run their compiled fast path (docs/simulator.md section 9).

``fluidopt.sim._cgate`` (built by setup.py next to the compiled engine core, from
``fluidopt/sim/_cgate.pyx``) holds transcriptions of the Python handlers of the gate-and-route
family (Gate-and-Route, Prioritize-and-Route, SLI-aware Gate-and-Route and the robust variants of
:mod:`fluidopt.control.robust`), of the FI-WSP baseline and of the reference FCFS policy
(:mod:`fluidopt.control.fcfs`, the textbook queues' controller) that read the compiled engine's state as typed arrays and call its
actions at C level. :func:`bind`, registered with :func:`fluidopt.control.fastpath.set_binder` when
this module is imported (by ``fluidopt/sim/__init__.py``) and called through
:func:`fluidopt.control.fastpath.bind` at the end of the controllers' ``setup``, installs them as the
engine's event callbacks when all of these hold:

* the context is the compiled engine (``fluidopt.sim._cengine.Engine``): a pure-Python engine, a
  router's snapshot or any other :class:`~fluidopt.control.protocol.Context` gets the Python
  handlers;
* the extension was built from the ``_cgate.pyx`` on disk now and against the engine core in use
  (both carry SHA-256 digests, like the core itself: a stale build never runs);
* the controller's class is exactly one of the built-in classes in ``_cgate.MIRRORS`` (a user's
  subclass may override any method, so it runs the Python code), and the source of every Python
  method the fast path transcribes still hashes to the digest recorded there (an edited handler
  switches the fast path off, with one warning, until _cgate.pyx is updated);
* ``FLUIDOPT_FAST_CONTROLLERS`` is not ``0`` in the environment (the switch the differential tests
  and benchmarks use to run the Python handlers on the compiled engine).

The decisions are the same bit for bit either way (same draws from the controller's stream, same
arithmetic in the same order): tests/control/test_fast_path.py compares whole runs, per-request
records included, with the fast path on and off.

Controllers whose handlers are written once need no transcription: their handler class (a mixin of
the controller, in ``fluidopt/control/<stem>.py``) is compiled from that same file, with the types of
``fluidopt/sim/<stem>.pxd``, into ``fluidopt.sim._c_<stem>`` (:func:`compiled_name`; setup.py compiles
every such pair it finds). :func:`bind`
installs the compiled class's handlers for any controller class on which every method of the handler
class resolves to the handler class's own (a subclass that overrides one runs the Python code), with
the controller's state (the handler module's ``STATE``) copied over, when the compiled module was built
from the files on disk now and against the core in use.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import sys
import warnings
from pathlib import Path
from typing import Any

from fluidopt.control import fastpath as _hook

__all__ = ["bind", "compiled_name", "mirror_digest", "single_source_digest", "status"]

# handler name -> the engine attribute that holds its callback (fluidopt/sim/engine.pxd)
_CALLBACKS = (("on_arrival", "_cb_arrival"), ("on_prefill_done", "_cb_pdone"), ("on_slot_freed", "_cb_freed"),
              ("on_abandon", "_cb_abandon"), ("on_preempt", "_cb_preempt"), ("on_drop", "_cb_drop"))
_BUILTIN_MODULES = ("fluidopt.control.gate_and_route", "fluidopt.control.robust", "fluidopt.control.paper_baselines")




def compiled_name(source: str) -> str | None:
    """``fluidopt.sim._c_<stem>`` for a handler module ``fluidopt.control.<stem>`` written once (setup.py
    compiles every fluidopt/control/<stem>.py that has a fluidopt/sim/<stem>.pxd), else None."""
    pkg, _, stem = source.rpartition(".")
    if pkg != "fluidopt.control" or stem == "engine" or not Path(__file__).with_name(f"{stem}.pxd").is_file():
        return None
    return f"fluidopt.sim._c_{stem}"


def single_source_digest(py: bytes, pxd: bytes) -> str:
    """SHA-256 of a handler module's source and its .pxd (as setup.py records it in the compiled module)."""
    return hashlib.sha256(py + b"\0" + pxd).hexdigest()


def _gone() -> None:
    return None


class Bound:
    """A run's compiled handlers as the controller keeps them (``ctrl._fast``): a copy or a pickle of the
    controller leaves them behind (they hold the run's engine sets)."""

    __slots__ = ("handlers",)

    def __init__(self, handlers: Any) -> None:
        self.handlers = handlers

    def __reduce__(self):
        return _gone, ()

    def __deepcopy__(self, memo: dict) -> None:
        return None


@functools.cache
def _single_module(source: str) -> tuple[Any, str]:
    """(the compiled module of the handler module ``source``, why) or (None, why not)."""
    import importlib

    from fluidopt.sim.backend import compiled_status

    ok, why = compiled_status()
    if not ok:
        return None, f"compiled core not usable: {why}"
    name = compiled_name(source)
    try:
        from fluidopt.sim import _cengine  # type: ignore[attr-defined]

        compiled = importlib.import_module(name)
        py = Path(importlib.import_module(source).__file__)
    except ImportError as exc:
        return None, f"{source} is not compiled ({exc}); reinstall (pip install -e .) to build it"
    stem = source.rsplit(".", 1)[1]
    try:
        digest = single_source_digest(py.read_bytes(), Path(__file__).with_name(f"{stem}.pxd").read_bytes())
    except OSError:
        digest = getattr(compiled, "SOURCE_SHA256", None)  # an installed package without its sources
    if digest != getattr(compiled, "SOURCE_SHA256", None):
        return None, (f"{name} was built from another version of {py.name} or {stem}.pxd; "
                      "reinstall (pip install -e .) to rebuild it")
    if getattr(compiled, "ENGINE_SHA256", None) != getattr(_cengine, "SOURCE_SHA256", None):
        return None, f"{name} was built against another engine core; reinstall (pip install -e .)"
    return compiled, f"{name} built from the current {py.name}"


@functools.cache
def _single_spec(cls: type) -> tuple[type, tuple[str, ...]] | None:
    """(the compiled handler class, the state to copy) for controllers of ``cls``, or None: the handler
    class on ``cls``'s MRO whose every method ``cls`` resolves to the handler class's own."""
    for base in cls.__mro__:
        if compiled_name(base.__module__) is None:
            continue
        own = [k for k, v in vars(base).items() if callable(v) and not k.startswith("__")]
        if any(getattr(cls, k) is not getattr(base, k) for k in own):
            return None  # a subclass overrides a handler: the Python code runs
        mod, _ = _single_module(base.__module__)
        if mod is None:
            return None
        return getattr(mod, base.__name__), tuple(sys.modules[base.__module__].STATE)
    return None


@functools.lru_cache(maxsize=1)
def _module() -> tuple[Any, Any, str]:
    """(the _cgate module, the compiled Engine class, why) or (None, None, why not)."""
    from fluidopt.sim.backend import compiled_status

    ok, why = compiled_status()
    if not ok:
        return None, None, f"compiled core not usable: {why}"
    try:
        from fluidopt.sim import _cengine, _cgate  # type: ignore[attr-defined]
    except ImportError as exc:
        return None, None, f"compiled core's controller fast path is not installed ({exc}); reinstall to build it"
    src = Path(__file__).with_name("_cgate.pyx")
    try:
        digest = hashlib.sha256(src.read_bytes()).hexdigest()
    except OSError:
        digest = getattr(_cgate, "SOURCE_SHA256", None)  # an installed package without its sources
    if digest != getattr(_cgate, "SOURCE_SHA256", None):
        return None, None, ("compiled core's controller fast path was built from another version of "
                            "fluidopt/sim/_cgate.pyx; reinstall (pip install -e .) to rebuild it")
    if getattr(_cgate, "ENGINE_SHA256", None) != getattr(_cengine, "SOURCE_SHA256", None):
        return None, None, ("compiled core's controller fast path was built against another engine core; "
                            "reinstall (pip install -e .) to rebuild it")
    return _cgate, _cengine.Engine, "compiled controller fast path built from the current sources"


def status() -> tuple[bool, str]:
    """(usable, reason): whether the compiled fast path can run at all (on the compiled engine)."""
    mod, _, why = _module()
    return mod is not None, why


def mirror_digest(cls: type, methods: tuple[str, ...]) -> str:
    """SHA-256 of the source of ``cls``'s methods ``methods`` (as resolved on ``cls``; ``"Owner.name"``:
    the method ``name`` of the class ``Owner`` on ``cls``'s MRO, for a method a mixin wraps)."""
    h = hashlib.sha256()
    for name in methods:
        if "." in name:
            owner, attr = name.split(".", 1)
            base = next(k for k in cls.__mro__ if k.__name__ == owner)
            fn = inspect.unwrap(base.__dict__[attr])
        else:
            fn = inspect.unwrap(getattr(cls, name))
        h.update(f"{name}\0{inspect.getsource(fn)}\0".encode())
    return h.hexdigest()


@functools.cache
def _spec(cls: type) -> tuple[int, int] | None:
    """(routing, gate) of the fast path for exactly ``cls``, or None."""
    mod = _module()[0]
    if cls.__module__ not in _BUILTIN_MODULES or cls.__name__ not in mod.MIRRORS:
        return None
    route, gate, methods, digest = mod.MIRRORS[cls.__name__]
    try:
        now = mirror_digest(cls, methods)
    except (OSError, TypeError, AttributeError, KeyError, StopIteration):
        return None  # no source to check against: the Python handlers run
    if now != digest:
        warnings.warn(f"fluidopt: {cls.__name__}: the Python handlers differ from the ones the compiled fast "
                      "path transcribes (fluidopt/sim/_cgate.pyx); running the Python handlers",
                      RuntimeWarning, stacklevel=3)
        return None
    return route, gate


def bind(ctrl: Any, ctx: Any) -> Any:
    """Install ``ctrl``'s compiled handlers on ``ctx`` (see the module docstring); the fast object or None."""
    if not _hook.enabled():
        return None
    single = _single_spec(type(ctrl))
    if single is not None:
        from fluidopt.sim import _cengine  # type: ignore[attr-defined]

        if type(ctx) is not _cengine.Engine:
            return None
        compiled_cls, state = single
        handlers = compiled_cls()
        for attr in state:
            setattr(handlers, attr, getattr(ctrl, attr))
        for name, attr in _CALLBACKS:
            if hasattr(handlers, name) and getattr(ctx, attr) == getattr(ctrl, name, None):
                setattr(ctx, attr, getattr(handlers, name))
        return Bound(handlers)
    mod, engine_cls, _ = _module()
    if mod is None or type(ctx) is not engine_cls:
        return None
    spec = _spec(type(ctrl))
    if spec is None:
        return None
    from fluidopt.sim import metrics

    fast = mod.FastGate(ctrl, spec[0], spec[1], (metrics.N_CLASS_QTY, metrics.X_PREFILL, metrics.Y_MIXED, metrics.Y_SOLO))
    for name, attr in _CALLBACKS:
        handler = getattr(fast, name, None)
        if handler is not None and getattr(ctx, attr) == getattr(ctrl, name, None):
            if name in ("on_abandon", "on_preempt", "on_drop") and spec[0] != mod.ROUTE_ROBUST:
                # the SLI variant's time-averaged caps keep their state in the fast object
                if not (name != "on_abandon" and spec[0] == mod.ROUTE_SLI and fast.avg):
                    continue
            setattr(ctx, attr, handler)
    return fast


_hook.set_binder(bind)
