"""Where a controller's handlers run compiled (docs/simulator.md section 9, "One source for a controller's handlers").

A controller whose handlers are written once, as a mixin class in a handler module
``fluidopt/control/<stem>.py`` with the static types ``fluidopt/sim/<stem>.pxd`` (the gate-and-route
family: :mod:`fluidopt.control.gate_handlers`; FI-WSP: :mod:`fluidopt.control.fiwsp_handlers`; the
reference FCFS policy: :mod:`fluidopt.control.fcfs_handlers`), has that same file compiled by setup.py
into ``fluidopt.sim._c_<stem>`` (:func:`compiled_name`; every such pair is found, no list). :func:`bind`,
registered with :func:`fluidopt.control.fastpath.set_binder` when this module is imported (by
``fluidopt/sim/__init__.py``) and called through :func:`fluidopt.control.fastpath.bind` at the end of
the controller's ``setup``, installs the compiled class's handlers as the engine's event callbacks, with
the controller's state (the handler module's ``STATE``) copied over, when all of these hold:

* the context is the compiled engine (``fluidopt.sim._cengine.Engine``): a pure-Python engine, a
  router's snapshot or any other :class:`~fluidopt.control.protocol.Context` gets the Python handlers
  (the same source);
* the compiled module was built from the handler module and .pxd on disk now and against the engine
  core in use (both carry SHA-256 digests, like the core itself: a stale build never runs);
* every method of the handler class resolves, on the controller's class, to the handler class's own (a
  subclass that overrides one, a user's or a built-in baseline's, runs the Python code, overrides
  included);
* ``FLUIDOPT_FAST_CONTROLLERS`` is not ``0`` in the environment (the switch the differential tests
  and benchmarks use to run the Python handlers on the compiled engine).

The decisions are the same bit for bit either way (the same source, the same draws, the same
arithmetic compiled without fused multiply-adds): tests/control/test_fast_path.py compares whole runs,
per-request records included, with the compiled handlers on and off. A controller that changes its plan
during a run (a re-solve) calls ``_fast.sync()`` to copy the state again; per-class arrays in the state
are shared with the controller, not copied, so counts the handlers keep (arrival counts, the overflow
count) are the controller's.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from pathlib import Path
from typing import Any

from fluidopt.control import fastpath as _hook

__all__ = ["bind", "compiled_name", "single_source_digest", "status"]

# handler name -> the engine attribute that holds its callback (fluidopt/sim/engine.pxd)
_CALLBACKS = (("on_arrival", "_cb_arrival"), ("on_prefill_done", "_cb_pdone"), ("on_slot_freed", "_cb_freed"),
              ("on_abandon", "_cb_abandon"), ("on_preempt", "_cb_preempt"), ("on_drop", "_cb_drop"))


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

    __slots__ = ("handlers", "_ctrl", "_state", "_check")

    def __init__(self, handlers: Any, ctrl: Any, state: tuple[str, ...], check: Any = None) -> None:
        self.handlers = handlers
        self._ctrl, self._state, self._check = ctrl, state, check
        self.sync()

    def sync(self) -> None:
        """Copy the controller's state to the handlers (at bind, and after every change of plan), after the
        handler module's ``check_state`` (if it has one) has checked it."""
        ctrl, handlers = self._ctrl, self.handlers
        if self._check is not None:
            self._check(ctrl)
        for attr in self._state:
            setattr(handlers, attr, getattr(ctrl, attr))

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
def _single_spec(cls: type) -> tuple[type, tuple[str, ...], Any] | None:
    """(the compiled handler class, the state to copy, the module's state check or None) for controllers
    of ``cls``, or None: the handler class on ``cls``'s MRO whose every method ``cls`` resolves to the
    handler class's own."""
    for base in cls.__mro__:
        if compiled_name(base.__module__) is None:
            continue
        own = [k for k, v in vars(base).items() if callable(v) and not k.startswith("__")]
        if any(getattr(cls, k) is not getattr(base, k) for k in own):
            return None  # a subclass overrides a handler: the Python code runs
        mod, _ = _single_module(base.__module__)
        if mod is None:
            return None
        source = sys.modules[base.__module__]
        return getattr(mod, base.__name__), tuple(source.STATE), getattr(source, "check_state", None)
    return None


def status() -> tuple[bool, str]:
    """(usable, reason): whether compiled handlers can run at all (the compiled core and every handler
    module's compiled twin built from the sources on disk)."""
    from fluidopt.sim.backend import compiled_status

    ok, why = compiled_status()
    if not ok:
        return False, f"compiled core not usable: {why}"
    stems = sorted(p.stem for p in Path(__file__).parent.glob("*.pxd")
                   if p.name not in ("engine.pxd", "prefix_cache.pxd"))  # (the prefix cache is not a handler)
    for stem in stems:
        mod, why = _single_module(f"fluidopt.control.{stem}")
        if mod is None:
            return False, why
    return True, f"compiled handlers built from the current sources ({', '.join(stems)})"


def bind(ctrl: Any, ctx: Any) -> Any:
    """Install ``ctrl``'s compiled handlers on ``ctx`` (see the module docstring); the fast object or None."""
    if not _hook.enabled():
        return None
    single = _single_spec(type(ctrl))
    if single is not None:
        from fluidopt.sim import _cengine  # type: ignore[attr-defined]

        if type(ctx) is not _cengine.Engine:
            return None
        compiled_cls, state, check = single
        bound = Bound(compiled_cls(), ctrl, state, check)
        for name, attr in _CALLBACKS:
            if hasattr(bound.handlers, name) and getattr(ctx, attr) == getattr(ctrl, name, None):
                setattr(ctx, attr, getattr(bound.handlers, name))
        return bound
    return None


_hook.set_binder(bind)
