"""The table of named controllers and :func:`register`, the one way to add to it.

Kept apart from :mod:`fluidopt.control.registry` (which loads the built-in modules, the entry points and
the user's modules, then looks names up) so that a built-in controller's module can register itself
without importing the module that imports it: the control layer has no import circle. Users import
``register`` from either module; it is the same function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fluidopt.control.protocol import Controller
from fluidopt.core.errors import UsageError

__all__ = ["Factory", "register"]

Factory = Callable[..., Controller]


@dataclass(frozen=True)
class _Entry:
    name: str
    factory: Factory
    description: str


_REGISTRY: dict[str, _Entry] = {}


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def register(name: str, factory: Factory | None = None, *, description: str = "", aliases: tuple[str, ...] = ()):
    """Register ``factory(scenario, **options) -> Controller`` under ``name`` (a decorator).

    ``register(name, factory)`` is the same call without the decorator syntax, for factories made
    in a loop. Registering a second, different factory under a taken name raises ``ValueError``.
    """
    if not isinstance(name, str) or not name.strip():
        raise UsageError(f"register: name: expected a non-empty string, got {name!r}")

    def deco(f: Factory) -> Factory:
        if not callable(f):
            raise UsageError(f"register({name!r}): expected a callable factory, got {type(f).__name__}")
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
