"""Named controllers: ``simulate(..., controller="fi-wsp")`` and ``fluidopt simulate --policy NAME``.

There is one way to register a controller, for built-in and user policies alike: decorate its
factory with :func:`register`::

    from fluidopt.control.registration import register

    @register("my-policy", description="what it does")
    def make_my_policy(scenario, *, threshold: float = 0.5):
        return MyController(scenario, threshold=threshold)

The factory receives the scenario and the caller's keyword options. Its keyword parameters *are*
the policy's options: :func:`make_controller` rejects any other key with a :class:`UsageError`
that lists them, and ``fluidopt simulate --list-policies`` prints them. A factory that declares a
``plan`` parameter is LP-guided: it receives the caller's already-solved
:class:`~fluidopt.fluid.solution.FluidSolution` (``plan=``) instead of solving the LP itself, so a
harness solves each scenario's LP once and hands it to every run.

Where registrations come from, in this order: the control layer's own modules in
:data:`BUILTIN_MODULES` (each must import; an import error is raised, never skipped), the
``fluidopt.policies`` entry-point group of installed packages (an entry point either names a factory,
registered under the entry point's name, or a module whose import registers its policies), and
modules or ``.py`` files the user names with :func:`import_user_modules` (``--import`` on the command
line). Layers above control register from below through the same entry-point group: fluidopt's own
``pyproject.toml`` declares ``fluidopt-rl = "fluidopt.rl.policies"`` (the RL routers), so this module
names no module of a higher layer (tests/meta/test_layering.py reads string imports too).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fluidopt.control.protocol import Controller
from fluidopt.control.registration import _REGISTRY, Factory, _Entry, _norm, register
from fluidopt.core.errors import FluidoptError, ScenarioError, UsageError, did_you_mean
from fluidopt.core.model import Scenario

__all__ = [
    "BUILTIN_MODULES",
    "ENTRY_POINT_GROUP",
    "available",
    "import_user_modules",
    "make_controller",
    "policy_options",
    "register",
]

# Modules whose import registers the control layer's controllers (higher layers, such as fluidopt.rl,
# register through the ENTRY_POINT_GROUP entry points: pyproject.toml).
BUILTIN_MODULES = (
    "fluidopt.control.fcfs",
    "fluidopt.control.instance",
    "fluidopt.control.gate_and_route",
    "fluidopt.control.paper_baselines",
    "fluidopt.control.load_balancers",
    "fluidopt.control.prefix_routers",
    "fluidopt.control.prefix_gate",
    "fluidopt.control.robust",
    "fluidopt.control.orchestration",
)
ENTRY_POINT_GROUP = "fluidopt.policies"

_loaded = False


def _load_entry_points() -> None:
    try:
        eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # pragma: no cover - a broken metadata store must not break the built-ins
        return
    for ep in eps:
        try:
            obj = ep.load()
        except Exception as e:
            raise UsageError(f"entry point {ep.name!r} = {ep.value!r} (group {ENTRY_POINT_GROUP}): cannot load it: "
                             f"{type(e).__name__}: {e}") from None
        if isinstance(obj, types.ModuleType):
            continue  # its import registered its policies
        if _norm(ep.name) not in _REGISTRY:
            register(ep.name, obj, description=(inspect.getdoc(obj) or "").split("\n")[0])


def _load_builtins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for mod in BUILTIN_MODULES:
        importlib.import_module(mod)
    _load_entry_points()


def _parameters(factory: Factory) -> dict[str, inspect.Parameter]:
    """The factory's keyword options (everything after the scenario), and whether it takes **kw."""
    params = list(inspect.signature(factory).parameters.values())[1:]
    return {p.name: p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY, p.VAR_KEYWORD)}


def _entry(name: str, caller: str = "controller") -> _Entry:
    _load_builtins()
    entry = _REGISTRY.get(_norm(name))
    if entry is None:
        known = sorted(e.name for e in _REGISTRY.values())
        raise UsageError(f"{caller}: unknown policy {name!r}{did_you_mean(_norm(name), known)}; registered: "
                         f"{', '.join(known)}")
    return entry


def available() -> dict[str, str]:
    """Registered controller names and their one-line descriptions."""
    _load_builtins()
    return {e.name: e.description for _, e in sorted(_REGISTRY.items())}


def policy_options(name: str) -> tuple[str, ...]:
    """The option names a registered policy accepts (its factory's keyword parameters).

    ``plan`` is not listed: it is the fluid solution a harness passes, not a user option. A factory
    that takes ``**options`` and checks them itself declares their names in ``factory.options``.
    """
    factory = _entry(name).factory
    declared = getattr(factory, "options", None)
    if declared is not None:
        return tuple(declared)
    return tuple(p.name for p in _parameters(factory).values() if p.name != "plan" and p.kind is not p.VAR_KEYWORD)


def uses_plan(name: str) -> bool:
    """Whether the registered policy takes a fluid plan (``plan=``) from its caller."""
    return "plan" in _parameters(_entry(name).factory)


def make_controller(spec: str | Controller, scenario: Scenario, *, plan: Any = None, **options) -> Controller:
    """A controller object from a registered name (or the object itself, returned as is).

    ``plan``: the scenario's solved :class:`~fluidopt.fluid.solution.FluidSolution`, handed to
    LP-guided policies so that they do not solve the LP again (ignored by policies that plan
    nothing). Unknown option keys raise :class:`UsageError` naming the keys the policy takes.
    """
    if isinstance(spec, Controller):
        if options:
            raise UsageError("make_controller: options are only accepted with a controller name")
        return spec
    if not isinstance(spec, str):
        raise UsageError(
            f"controller: expected a registered name or a Controller object, got {type(spec).__name__}"
        )
    entry = _entry(spec)
    params = _parameters(entry.factory)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    if not takes_any:
        bad = sorted(k for k in options if k not in params or k == "plan")
        if bad:
            known = [k for k in params if k != "plan"]
            raise UsageError(f"policy {entry.name!r}: unknown option {', '.join(map(repr, bad))}; "
                             f"it takes: {', '.join(known) if known else 'no options'}")
    if plan is not None and "plan" in params:
        options = {**options, "plan": plan}
    try:
        ctrl = entry.factory(scenario, **options)
    except FluidoptError:
        raise
    except TypeError as e:
        # A factory with **kw that rejects a key, or a missing required option.
        raise UsageError(f"policy {entry.name!r}: {e}") from None
    if not isinstance(ctrl, Controller):
        raise ScenarioError(f"controller {spec!r}: its factory returned {type(ctrl).__name__}, not a Controller")
    return ctrl


_imported_files: set[Path] = set()


def import_user_modules(names: Iterable[str]) -> None:
    """Import modules by dotted name or by path to a ``.py`` file (their import registers policies).

    Each file is executed once per process, however often it is named. Any failure (no such file, a
    syntax error, an exception at import) is one :class:`UsageError` line naming the module.
    """
    for name in names:
        path = Path(name)
        try:
            if name.endswith(".py"):
                if path.is_dir():
                    raise UsageError(f"--import {name!r}: is a folder, expected a .py file")
                if not path.is_file():
                    raise UsageError(f"--import {name!r}: no such file")
                if path.resolve() in _imported_files:
                    continue
                spec = importlib.util.spec_from_file_location(path.stem, path)
                mod = importlib.util.module_from_spec(spec)
                sys.modules[path.stem] = mod
                try:
                    spec.loader.exec_module(mod)
                except BaseException:
                    sys.modules.pop(path.stem, None)
                    raise
                _imported_files.add(path.resolve())
            else:
                importlib.import_module(name)
        except FluidoptError:
            raise
        except SyntaxError as e:
            raise UsageError(f"--import {name!r}: syntax error at line {e.lineno}: {e.msg}") from None
        except ImportError as e:
            raise UsageError(f"--import {name!r}: cannot import it: {e}") from None
        except Exception as e:
            raise UsageError(f"--import {name!r}: importing it raised {type(e).__name__}: {e}") from None
