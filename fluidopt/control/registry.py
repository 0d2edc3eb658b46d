"""Named controllers: ``simulate(..., controller="fi-wsp")`` and ``fluidopt simulate --policy NAME``.

A module registers its controllers at import time::

    from fluidopt.control.registry import register

    @register("my-policy", description="what it does")
    def _make(scenario, **options):
        return MyController(scenario, **options)

The factory receives the scenario (the controller may plan from it, e.g. solve the fluid LP) and the
caller's keyword options. Lookups import the built-in controller modules listed in
:data:`BUILTIN_MODULES` first (a module not written yet is skipped), so registering needs no edit
here beyond adding a new module's name to that tuple.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from fluidopt.control.protocol import Controller
from fluidopt.errors import ScenarioError
from fluidopt.model import Scenario

__all__ = ["BUILTIN_MODULES", "available", "make_controller", "register"]

# Modules whose import registers controllers (missing ones are skipped silently).
BUILTIN_MODULES = (
    "fluidopt.control.baselines",
    "fluidopt.control.instance",
    "fluidopt.control.gate_and_route",
    "fluidopt.control.paper_baselines",
    "fluidopt.control.heuristics",
    "fluidopt.control.rl",
)

Factory = Callable[..., Controller]


@dataclass(frozen=True)
class _Entry:
    name: str
    factory: Factory
    description: str


_REGISTRY: dict[str, _Entry] = {}
_loaded = False


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def register(name: str, factory: Factory | None = None, *, description: str = "", aliases: tuple[str, ...] = ()):
    """Register ``factory(scenario, **options) -> Controller`` under ``name`` (usable as a decorator)."""

    def deco(f: Factory) -> Factory:
        for nm in (name, *aliases):
            key = _norm(nm)
            old = _REGISTRY.get(key)
            if old is not None and old.factory is not f:
                raise ValueError(f"register: a controller named {nm!r} is already registered")
            _REGISTRY[key] = _Entry(nm, f, description if nm == name else f"alias of {name}")
        return f

    if factory is not None:
        return deco(factory)
    return deco


def _load_builtins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for mod in BUILTIN_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise


def available() -> dict[str, str]:
    """Registered controller names and their one-line descriptions."""
    _load_builtins()
    return {e.name: e.description for _, e in sorted(_REGISTRY.items())}


def make_controller(spec: str | Controller, scenario: Scenario, **options) -> Controller:
    """A controller object from a registered name (or the object itself, returned as is)."""
    if isinstance(spec, Controller):
        if options:
            raise ScenarioError("make_controller: options are only accepted with a controller name")
        return spec
    if not isinstance(spec, str):
        raise ScenarioError(
            f"controller: expected a registered name or a Controller object, got {type(spec).__name__}"
        )
    _load_builtins()
    entry = _REGISTRY.get(_norm(spec))
    if entry is None:
        names = ", ".join(sorted(e.name for e in _REGISTRY.values()))
        raise ScenarioError(f"controller: unknown policy {spec!r}; registered: {names}")
    ctrl = entry.factory(scenario, **options)
    if not isinstance(ctrl, Controller):
        raise ScenarioError(f"controller {spec!r}: its factory returned {type(ctrl).__name__}, not a Controller")
    return ctrl
