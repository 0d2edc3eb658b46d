"""A run's window: what simulated time a run covers and measures, checked once and passed down.

:class:`RunWindow` holds the horizon, the warm-up, the service model, the sampling interval and the
drain of one run. It is validated where it is made (its constructor is the only check of these
values): ``simulate`` / ``make_engine`` make one from their keyword arguments, the harness makes one
per scenario before any worker starts and hands it to every run (a pickled window is not checked
again), and the engine reads it as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fluidopt.core.errors import ScenarioError, UsageError

__all__ = ["SERVICES", "RunWindow"]

SERVICES = ("markov", "tokens")


def _seconds(caller: str, name: str, v: object, *, zero: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ScenarioError(f"{caller}: {name}: expected a number of seconds, got {v!r} ({type(v).__name__})")
    v = float(v)
    if not math.isfinite(v) or v < 0 or (v == 0 and not zero):
        raise ScenarioError(f"{caller}: {name}: expected a finite number of seconds {'>= 0' if zero else '> 0'}, got {v!r}")
    return v


def _drain(caller: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise UsageError(f"{caller}: drain: expected a number of seconds > 0 (or None), got {v!r}")
    if not math.isfinite(float(v)) or float(v) <= 0:
        raise UsageError(f"{caller}: drain: expected a finite number of seconds > 0, got {v!r}")
    return float(v)


@dataclass(frozen=True)
class RunWindow:
    """Simulated time ``[0, horizon)`` seconds, measured from ``warmup`` on, under ``service``.

    ``sample_interval``: seconds between samples of the state (None: no time series). ``drain``:
    seconds the run may go on past the horizon so that the window's arrivals resolve (None: it stops
    at the horizon). ``caller`` names the function in the error messages (not part of the window).
    """

    horizon: float
    warmup: float = 0.0
    service: str = "markov"
    sample_interval: float | None = None
    drain: float | None = None
    caller: str = field(default="simulate", repr=False, compare=False)

    def __post_init__(self) -> None:
        c = self.caller
        horizon = _seconds(c, "horizon", self.horizon)
        warmup = _seconds(c, "warmup", self.warmup, zero=True)
        if warmup >= horizon:
            raise ScenarioError(f"{c}: warmup: expected less than the horizon {horizon:g} s, got {warmup:g} s")
        if self.service not in SERVICES:
            raise ScenarioError(f"{c}: service: expected 'markov' or 'tokens', got {self.service!r}")
        sample = None if self.sample_interval is None else _seconds(c, "sample_interval", self.sample_interval)
        drain = None if self.drain is None else _drain(c, self.drain)
        for name, v in (("horizon", horizon), ("warmup", warmup), ("sample_interval", sample), ("drain", drain)):
            object.__setattr__(self, name, v)
