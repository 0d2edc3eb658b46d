"""The interface the simulator consumes: a :class:`Workload` yields :class:`ArrivalBatch` chunks in time order.

Also the validation helpers and the random-stream rules every workload shares (see :mod:`fluidopt.workloads`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import pandas as pd

from fluidopt.core.errors import ScenarioError

__all__ = ["ArrivalBatch", "TraceWarning", "Workload", "collect"]

# Internal block size of every random stream. Fixed (not the caller's chunk size) so that the
# sample does not depend on how the caller chunks it.
_BLOCK = 4096


class TraceWarning(UserWarning):
    """A trace was usable but needed a fix-up (sorted, zero tokens raised to 1) or ran out early."""




# --------------------------------------------------------------------------------------------
# The interface the simulator consumes
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArrivalBatch:
    """One chunk of arrivals, sorted by time.

    ``time``: float64 seconds, nondecreasing, absolute simulation time; ``cls``: int64 class index
    (into ``scenario.classes`` / ``workload.class_names``); ``prompt`` / ``output``: int64 token
    counts, each >= 1.
    """

    time: np.ndarray
    cls: np.ndarray
    prompt: np.ndarray
    output: np.ndarray

    def __len__(self) -> int:
        return int(self.time.shape[0])

    def to_frame(self, class_names: Sequence[str] | None = None) -> pd.DataFrame:
        """The batch as a DataFrame (columns time, cls, prompt, output, and class when names given)."""
        df = pd.DataFrame({"time": self.time, "cls": self.cls, "prompt": self.prompt, "output": self.output})
        if class_names is not None:
            df["class"] = np.asarray(class_names, dtype=object)[self.cls]
        return df


@runtime_checkable
class Workload(Protocol):
    """Anything that yields arrivals lazily in time order."""

    class_names: tuple[str, ...]

    def batches(self, rng: np.random.Generator, horizon: float, size: int = 65536) -> Iterator[ArrivalBatch]:
        """Arrivals with time < ``horizon`` (seconds), in non-empty chunks of at most ``size``."""
        ...


def collect(workload: Workload, rng: np.random.Generator, horizon: float, size: int = 65536) -> ArrivalBatch:
    """All arrivals before ``horizon`` in one batch (for tests and small runs; not bounded in memory)."""
    parts = list(workload.batches(rng, horizon, size))
    if not parts:
        e_f, e_i = np.empty(0, dtype=np.float64), np.empty(0, dtype=np.int64)
        return ArrivalBatch(e_f, e_i, e_i.copy(), e_i.copy())
    return ArrivalBatch(
        time=np.concatenate([p.time for p in parts]),
        cls=np.concatenate([p.cls for p in parts]),
        prompt=np.concatenate([p.prompt for p in parts]),
        output=np.concatenate([p.output for p in parts]),
    )


# --------------------------------------------------------------------------------------------
# Validation helpers (errors name the parameter, the value and what was expected)
# --------------------------------------------------------------------------------------------


def _num(where: str, value: object, *, minimum: float = 0.0, strict: bool = True, allow_inf: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ScenarioError(f"{where}: expected a number, got {value!r} ({type(value).__name__})")
    v = float(value)
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise ScenarioError(f"{where}: expected a finite number, got {value!r}")
    if (strict and v <= minimum) or (not strict and v < minimum):
        op = ">" if strict else ">="
        raise ScenarioError(f"{where}: expected a number {op} {minimum:g}, got {value!r}")
    return v


def _check_size(size: object) -> int:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ScenarioError(f"batches: size: expected an integer >= 1, got {size!r}")
    return int(size)


def _check_horizon(horizon: object) -> float:
    return _num("batches: horizon", horizon, minimum=0.0, strict=False, allow_inf=True)


def _children(rng: np.random.Generator, n: int) -> list[np.random.Generator]:
    """``n`` independent generators derived deterministically from ``rng`` (advances ``rng``)."""
    if not isinstance(rng, np.random.Generator):
        raise ScenarioError(
            f"batches: rng: expected a numpy.random.Generator (np.random.default_rng(seed)), got {type(rng).__name__}"
        )
    entropy = rng.integers(0, 2**63, size=4, dtype=np.int64).tolist()
    return [np.random.default_rng(s) for s in np.random.SeedSequence(entropy).spawn(n)]
