"""Workloads: arrival processes, token-length distributions, and their composition.

A :class:`Workload` hands the simulator its arrivals lazily, as :class:`ArrivalBatch` chunks sorted
by time, so a run of millions of requests never holds them all in memory. Building blocks compose
like scikit-learn estimators:

* arrival processes (times in seconds, rates in requests per second, for the whole cluster):
  :class:`Poisson`, :class:`GammaRenewal` (a renewal process with a given coefficient of variation:
  bursty when ``cv > 1``), :class:`PiecewiseRate` (a nonhomogeneous Poisson process with a
  piecewise-constant rate, optionally periodic);
* token-length distributions (integers >= 1): :class:`Fixed`, :class:`Exponential` (geometric with
  the exact mean), :class:`LogNormal` (exact mean), :class:`Empirical` (resampling observed values);
* :class:`SyntheticWorkload` (one :class:`ClassSpec` per class) and :class:`TraceWorkload` (replay
  of a recorded trace; see :mod:`fluidopt.sim.trace` for the file loaders).

Randomness. ``batches(rng, ...)`` derives independent child streams from ``rng`` for each class and
each quantity (arrival times, prompt lengths, output lengths), and draws them in internal blocks of
fixed size. Hence the same seed gives the same arrivals bit for bit, whatever the ``size`` of the
yielded chunks, and a shorter horizon gives a prefix of the arrivals of a longer one. Changing one
class's length distribution leaves every arrival time unchanged (common random numbers).
See docs/workloads.md for the discretisation rules.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import pandas as pd

from fluidopt.errors import ScenarioError, TraceError
from fluidopt.model import RequestClass, Scenario

__all__ = [
    "WorkflowWarning",
    "check_workflow",
    "read_slot_rates",
    "workflow_workload",
    "ArrivalBatch",
    "ArrivalProcess",
    "Backlog",
    "BacklogWorkload",
    "ClassSpec",
    "Empirical",
    "Exponential",
    "Fixed",
    "GammaRenewal",
    "LengthDistribution",
    "LogNormal",
    "PiecewiseRate",
    "Poisson",
    "SyntheticWorkload",
    "TraceWarning",
    "TraceWorkload",
    "Workload",
    "collect",
    "workload_from_scenario",
]

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


# --------------------------------------------------------------------------------------------
# Arrival processes
# --------------------------------------------------------------------------------------------


class ArrivalProcess:
    """A point process on [0, inf). Subclasses implement :meth:`stream` and :attr:`mean_rate`."""

    @property
    def mean_rate(self) -> float:
        """Long-run arrivals per second."""
        raise NotImplementedError

    def stream(self, rng: np.random.Generator) -> Iterator[np.ndarray]:
        """Endless blocks of increasing absolute arrival times (seconds); may stop if the rate ends."""
        raise NotImplementedError

    def times(self, rng: np.random.Generator, horizon: float) -> np.ndarray:
        """All arrival times in [0, horizon) (convenience; materialises them)."""
        horizon = _check_horizon(horizon)
        if math.isinf(horizon):
            raise ScenarioError("times: horizon: expected a finite number of seconds, got inf")
        out = []
        for block in self.stream(rng):
            if block.size and block[-1] >= horizon:
                out.append(block[block < horizon])
                break
            out.append(block)
        return np.concatenate(out) if out else np.empty(0)


class Poisson(ArrivalProcess):
    """Homogeneous Poisson arrivals at ``rate`` per second."""

    def __init__(self, rate: float):
        self.rate = _num("Poisson.rate", rate)

    def __repr__(self) -> str:
        return f"Poisson(rate={self.rate!r})"

    @property
    def mean_rate(self) -> float:
        return self.rate

    def stream(self, rng: np.random.Generator) -> Iterator[np.ndarray]:
        t = 0.0
        scale = 1.0 / self.rate
        while True:
            block = t + np.cumsum(rng.exponential(scale, _BLOCK))
            t = float(block[-1])
            yield block


class GammaRenewal(ArrivalProcess):
    """Renewal arrivals with Gamma inter-arrival times: mean ``1/rate`` s, coefficient of variation ``cv``.

    ``cv = 1`` is Poisson, ``cv > 1`` bursty, ``cv < 1`` smoother, ``cv = 0`` deterministic spacing.
    With ``stationary=True`` (default) the first arrival comes after an equilibrium residual time
    (``U * L`` with ``U`` uniform and ``L`` a length-biased interval, Gamma(k + 1)), so the process is
    stationary from time 0: the expected count in [0, t) is exactly ``rate * t``. With
    ``stationary=False`` time 0 is itself a renewal (an arrival "just happened").
    """

    def __init__(self, rate: float, cv: float, *, stationary: bool = True):
        self.rate = _num("GammaRenewal.rate", rate)
        self.cv = _num("GammaRenewal.cv", cv, strict=False)
        self.stationary = bool(stationary)

    def __repr__(self) -> str:
        return f"GammaRenewal(rate={self.rate!r}, cv={self.cv!r}, stationary={self.stationary})"

    @property
    def mean_rate(self) -> float:
        return self.rate

    def _gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.cv == 0.0:
            return np.full(n, 1.0 / self.rate)
        k = 1.0 / self.cv**2  # shape; scale makes the mean 1/rate
        return rng.gamma(k, 1.0 / (self.rate * k), n)

    def stream(self, rng: np.random.Generator) -> Iterator[np.ndarray]:
        if self.stationary:
            u = rng.random()
            if self.cv == 0.0:
                first = u / self.rate
            else:
                k = 1.0 / self.cv**2
                first = u * rng.gamma(k + 1.0, 1.0 / (self.rate * k))
            t = first
            block = t + np.concatenate(([0.0], np.cumsum(self._gaps(rng, _BLOCK - 1))))
        else:
            block = np.cumsum(self._gaps(rng, _BLOCK))
        while True:
            t = float(block[-1])
            yield block
            block = t + np.cumsum(self._gaps(rng, _BLOCK))


class PiecewiseRate(ArrivalProcess):
    """Nonhomogeneous Poisson arrivals with a piecewise-constant rate (requests per second).

    ``rates[j]`` holds on ``[times[j], times[j+1])``; ``times[0]`` must be 0 and ``times`` strictly
    increasing. Without ``period`` the last rate holds forever (a last rate of 0 ends the arrivals);
    with ``period`` (> ``times[-1]``) the schedule repeats every ``period`` seconds, the last piece
    lasting until ``period``. Exact: unit-rate Poisson points mapped through the inverse of the
    cumulative intensity.
    """

    def __init__(self, times: Sequence[float], rates: Sequence[float], *, period: float | None = None):
        t = np.asarray(times, dtype=float).ravel()
        r = np.asarray(rates, dtype=float).ravel()
        if t.size == 0 or t.size != r.size:
            raise ScenarioError(
                f"PiecewiseRate: expected as many times as rates (>= 1), got {t.size} times and {r.size} rates"
            )
        if t[0] != 0.0:
            raise ScenarioError(f"PiecewiseRate.times[0]: expected 0 (the schedule starts at time 0), got {float(t[0])!r}")
        if not np.all(np.isfinite(t)) or np.any(np.diff(t) <= 0):
            raise ScenarioError(f"PiecewiseRate.times: expected strictly increasing finite seconds, got {t.tolist()}")
        bad = np.flatnonzero(~np.isfinite(r) | (r < 0))
        if bad.size:
            j = int(bad[0])
            raise ScenarioError(f"PiecewiseRate.rates[{j}]: expected a finite rate >= 0, got {float(r[j])!r}")
        if period is not None:
            period = _num("PiecewiseRate.period", period)
            if period <= t[-1]:
                raise ScenarioError(
                    f"PiecewiseRate.period: expected a period > the last breakpoint {t[-1]:g}, got {period!r}"
                )
        if not np.any(r > 0):
            raise ScenarioError("PiecewiseRate.rates: expected at least one positive rate, got all zero")
        self.breaks = t
        self.rates = r
        self.period = period
        ends = np.append(t[1:], period if period is not None else np.inf)
        self._ends = ends
        # cumulative intensity at each breakpoint (and at the period end)
        lengths = ends[:-1] - t[:-1]
        self._cum = np.concatenate(([0.0], np.cumsum(r[:-1] * lengths)))
        self._per_period = None if period is None else float(self._cum[-1] + r[-1] * (period - t[-1]))

    def __repr__(self) -> str:
        return f"PiecewiseRate(times={self.breaks.tolist()}, rates={self.rates.tolist()}, period={self.period!r})"

    @property
    def mean_rate(self) -> float:
        """Long-run rate: the per-period average, or the last rate without a period."""
        if self.period is None:
            return float(self.rates[-1])
        return self._per_period / self.period

    def expected_count(self, t0: float, t1: float) -> float:
        """Expected arrivals in [t0, t1) (the integral of the rate)."""
        return self.cumulative(t1) - self.cumulative(t0)

    def cumulative(self, t: float | np.ndarray) -> np.ndarray | float:
        """Cumulative intensity Lambda(t) = integral of the rate over [0, t)."""
        t = np.asarray(t, dtype=float)
        n = np.zeros_like(t)
        if self.period is not None:
            n = np.floor(t / self.period)
            t = t - n * self.period
        j = np.searchsorted(self.breaks, t, side="right") - 1
        val = self._cum[j] + self.rates[j] * (t - self.breaks[j])
        if self.period is not None:
            val = val + n * self._per_period
        return val if val.ndim else float(val)

    def _invert(self, s: np.ndarray) -> np.ndarray:
        n = np.zeros_like(s)
        if self.period is not None:
            n = np.floor(s / self._per_period)
            s = s - n * self._per_period
        # Search only the pieces with a positive rate: their cumulative starts are strictly
        # increasing, so every s maps to one piece (zero-rate pieces receive no arrivals).
        pos = self.rates > 0
        starts, breaks, rates = self._cum[pos], self.breaks[pos], self.rates[pos]
        j = np.maximum(np.searchsorted(starts, s, side="right") - 1, 0)
        t = breaks[j] + (s - starts[j]) / rates[j]
        if self.period is not None:
            t = t + n * self.period
        return t

    def stream(self, rng: np.random.Generator) -> Iterator[np.ndarray]:
        s = 0.0
        total = np.inf if (self.period is not None or self.rates[-1] > 0) else float(self._cum[-1])
        while True:
            cum = s + np.cumsum(rng.exponential(1.0, _BLOCK))
            s = float(cum[-1])
            if s >= total:
                cum = cum[cum < total]
                if cum.size:
                    yield self._invert(cum)
                return
            yield self._invert(cum)


# --------------------------------------------------------------------------------------------
# Token-length distributions (integers >= 1)
# --------------------------------------------------------------------------------------------


def _randomized_round(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """floor(x) + Bernoulli(frac(x)): an integer with exactly the mean of x."""
    fl = np.floor(x)
    return (fl + (rng.random(x.shape) < (x - fl))).astype(np.int64)


class LengthDistribution:
    """Distribution of a token count (an integer >= 1). Subclasses implement :meth:`sample`."""

    kind = ""

    @property
    def mean(self) -> float:
        raise NotImplementedError

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` int64 token counts, each >= 1."""
        raise NotImplementedError


class Fixed(LengthDistribution):
    """Always ``n`` tokens. A non-integer ``n`` (e.g. a mean of 300.5) alternates at random between
    floor(n) and ceil(n) with the probabilities that make the mean exactly ``n``."""

    kind = "fixed"

    def __init__(self, n: float):
        self.n = _num("Fixed.n", n, minimum=1.0, strict=False)

    def __repr__(self) -> str:
        return f"Fixed({self.n!r})"

    @property
    def mean(self) -> float:
        return self.n

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if float(self.n).is_integer():
            return np.full(n, int(self.n), dtype=np.int64)
        return _randomized_round(np.full(n, self.n), rng)


class Exponential(LengthDistribution):
    """The discrete analogue of an exponential length with mean ``mean`` tokens (>= 1).

    Geometric on {1, 2, ...}: P(L = k) = (1 - p)^(k-1) p with p = 1/mean, so E[L] = mean exactly and
    Var[L] = mean (mean - 1) (an exponential has mean^2). L is memoryless like the exponential: it is
    the ceiling of an exponential with rate -ln(1 - p).
    """

    kind = "exponential"

    def __init__(self, mean: float):
        self._mean = _num("Exponential.mean", mean, minimum=1.0, strict=False)

    def __repr__(self) -> str:
        return f"Exponential(mean={self._mean!r})"

    @property
    def mean(self) -> float:
        return self._mean

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.geometric(1.0 / self._mean, n).astype(np.int64)


class LogNormal(LengthDistribution):
    """Lognormal length with mean ``mean`` tokens (>= 1) and log-scale shape ``sigma``.

    L = 1 + R(Y) where Y is lognormal with E[Y] = mean - 1 (log-mean ln(mean - 1) - sigma^2/2, log-sd
    sigma) and R(y) = floor(y) + Bernoulli(frac(y)) is randomized rounding, so L >= 1 and E[L] = mean
    exactly. For means of tens of tokens or more the shift by one token is immaterial.
    """

    kind = "lognormal"

    def __init__(self, mean: float, sigma: float):
        self._mean = _num("LogNormal.mean", mean, minimum=1.0, strict=False)
        self.sigma = _num("LogNormal.sigma", sigma)

    def __repr__(self) -> str:
        return f"LogNormal(mean={self._mean!r}, sigma={self.sigma!r})"

    @property
    def mean(self) -> float:
        return self._mean

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        m = self._mean - 1.0
        if m <= 0.0:
            return np.ones(n, dtype=np.int64)
        y = rng.lognormal(math.log(m) - 0.5 * self.sigma**2, self.sigma, n)
        return 1 + _randomized_round(y, rng)


class Empirical(LengthDistribution):
    """Resample observed token counts uniformly with replacement (only the given values occur)."""

    kind = "empirical"

    def __init__(self, values: Sequence[int] | np.ndarray):
        v = np.asarray(values)
        if v.ndim != 1 or v.size == 0:
            raise ScenarioError(f"Empirical.values: expected a non-empty 1-D sequence of token counts, got shape {v.shape}")
        if not np.issubdtype(v.dtype, np.number) or np.issubdtype(v.dtype, np.complexfloating):
            raise ScenarioError(f"Empirical.values: expected integers >= 1, got dtype {v.dtype}")
        vf = v.astype(float)
        bad = np.flatnonzero(~np.isfinite(vf) | (vf < 1) | (vf != np.round(vf)))
        if bad.size:
            j = int(bad[0])
            raise ScenarioError(f"Empirical.values[{j}]: expected an integer >= 1, got {v[j].item()!r}")
        self.values = vf.astype(np.int64)

    def __repr__(self) -> str:
        return f"Empirical(<{self.values.size} values, mean {self.mean:.4g}>)"

    @property
    def mean(self) -> float:
        return float(self.values.mean())

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.values[rng.integers(0, self.values.size, n)]


# --------------------------------------------------------------------------------------------
# Synthetic workloads
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassSpec:
    """One request class of a synthetic workload: arrivals plus prompt and output length laws."""

    arrivals: ArrivalProcess
    prompt: LengthDistribution
    output: LengthDistribution
    name: str | None = None

    def __post_init__(self) -> None:
        w = f"ClassSpec({self.name or '?'})"
        if not isinstance(self.arrivals, ArrivalProcess):
            raise ScenarioError(f"{w}.arrivals: expected an ArrivalProcess (Poisson, ...), got {self.arrivals!r}")
        for f in ("prompt", "output"):
            v = getattr(self, f)
            if not isinstance(v, LengthDistribution):
                raise ScenarioError(f"{w}.{f}: expected a LengthDistribution (Exponential, ...), got {v!r}")


def _class_stream(spec: ClassSpec, gens: list[np.random.Generator], horizon: float):
    """Blocks (time, prompt, output) of one class, times < horizon. Lengths are drawn per full block
    (then cut at the horizon) so the sample depends only on the seed, never on the horizon cut."""
    g_t, g_p, g_o = gens
    for t in spec.arrivals.stream(g_t):
        n = t.size
        p = spec.prompt.sample(g_p, n)
        o = spec.output.sample(g_o, n)
        if n and t[-1] >= horizon:
            k = int(np.searchsorted(t, horizon, side="left"))
            if k:
                yield t[:k], p[:k], o[:k]
            return
        if n:
            yield t, p, o


class SyntheticWorkload:
    """Independent per-class arrival streams with per-class length laws, merged lazily in time order.

    ``classes``: :class:`ClassSpec` items or ``(arrivals, prompt, output)`` tuples; ``class_names``
    defaults to the specs' names, else ``class-0``, ``class-1``, ...
    """

    def __init__(
        self,
        classes: Sequence[ClassSpec | tuple[ArrivalProcess, LengthDistribution, LengthDistribution]],
        class_names: Sequence[str] | None = None,
    ):
        specs = []
        for i, c in enumerate(classes):
            if isinstance(c, ClassSpec):
                specs.append(c)
            elif isinstance(c, tuple) and len(c) in (3, 4):
                specs.append(ClassSpec(*c))
            else:
                raise ScenarioError(
                    f"SyntheticWorkload.classes[{i}]: expected a ClassSpec or (arrivals, prompt, output), got {c!r}"
                )
        if not specs:
            raise ScenarioError("SyntheticWorkload.classes: expected at least one class, got none")
        if class_names is None:
            class_names = [s.name or f"class-{i}" for i, s in enumerate(specs)]
        names = tuple(str(n) for n in class_names)
        if len(names) != len(specs):
            raise ScenarioError(
                f"SyntheticWorkload.class_names: expected {len(specs)} names (one per class), got {len(names)}"
            )
        if len(set(names)) != len(names):
            raise ScenarioError(f"SyntheticWorkload.class_names: expected unique names, got {list(names)}")
        self.specs: tuple[ClassSpec, ...] = tuple(specs)
        self.class_names: tuple[str, ...] = names

    def __repr__(self) -> str:
        body = ", ".join(f"{n}: ({s.arrivals!r}, {s.prompt!r}, {s.output!r})" for n, s in zip(self.class_names, self.specs))
        return f"SyntheticWorkload({body})"

    @property
    def mean_rates(self) -> np.ndarray:
        """Long-run arrivals per second of each class (whole cluster)."""
        return np.array([s.arrivals.mean_rate for s in self.specs])

    def request_classes(self, patience: float | Sequence[float] = 0.0) -> list[RequestClass]:
        """Model classes (mean prompt, mean output, long-run rate) for building a Scenario and its LP."""
        pat = np.broadcast_to(np.asarray(patience, dtype=float), (len(self.specs),))
        out = []
        for name, s, th in zip(self.class_names, self.specs, pat):
            kw: dict = {}
            if s.prompt.kind == s.output.kind == "fixed":
                kw["lengths"] = "fixed"
            elif s.prompt.kind == s.output.kind == "lognormal":
                kw.update(lengths="lognormal", prompt_sigma=s.prompt.sigma, decode_sigma=s.output.sigma)
            out.append(
                RequestClass(name, prompt=s.prompt.mean, decode=s.output.mean, rate=s.arrivals.mean_rate,
                             patience=float(th), **kw)
            )
        return out

    def batches(self, rng: np.random.Generator, horizon: float, size: int = 65536) -> Iterator[ArrivalBatch]:
        """Arrivals with time < ``horizon`` in non-empty time-sorted chunks of at most ``size``.

        Memory is O(number of classes * 4096 + size) whatever the horizon.
        """
        horizon = _check_horizon(horizon)
        size = _check_size(size)
        k = len(self.specs)
        gens = _children(rng, 3 * k)
        streams = [_class_stream(s, gens[3 * i : 3 * i + 3], horizon) for i, s in enumerate(self.specs)]
        return _merge(streams, size)


def _merge(streams: list, size: int) -> Iterator[ArrivalBatch]:
    """Lazy k-way merge of per-class block streams into time-sorted chunks of at most ``size``."""
    k = len(streams)
    buf: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None] = [None] * k
    alive = [True] * k
    pend_t: list[np.ndarray] = []
    pend_c: list[np.ndarray] = []
    pend_p: list[np.ndarray] = []
    pend_o: list[np.ndarray] = []
    n_pend = 0

    def refill(i: int) -> None:
        try:
            buf[i] = next(streams[i])
        except StopIteration:
            buf[i] = None
            alive[i] = False

    for i in range(k):
        refill(i)
    while True:
        live = [i for i in range(k) if buf[i] is not None]
        if not live:
            break
        # Everything up to the earliest buffered block end is final: no class can still produce
        # an earlier arrival (each stream is increasing and that class's buffer ends there).
        frontier = min(float(buf[i][0][-1]) for i in live)
        ts, cs, ps, os_ = [], [], [], []
        for i in live:
            t, p, o = buf[i]
            j = int(np.searchsorted(t, frontier, side="right"))
            if j:
                ts.append(t[:j])
                cs.append(np.full(j, i, dtype=np.int64))
                ps.append(p[:j])
                os_.append(o[:j])
                if j == t.size:
                    refill(i)
                else:
                    buf[i] = (t[j:], p[j:], o[j:])
        t = np.concatenate(ts)
        c = np.concatenate(cs)
        order = np.lexsort((c, t))  # by time, ties by class index
        pend_t.append(t[order])
        pend_c.append(c[order])
        pend_p.append(np.concatenate(ps)[order])
        pend_o.append(np.concatenate(os_)[order])
        n_pend += t.size
        while n_pend >= size:
            yield _take(pend_t, pend_c, pend_p, pend_o, size)
            n_pend -= size
    if n_pend:
        yield _take(pend_t, pend_c, pend_p, pend_o, n_pend)


def _take(pt: list, pc: list, pp: list, po: list, n: int) -> ArrivalBatch:
    """Pop the first ``n`` pending arrivals (lists of arrays, modified in place)."""
    out = []
    for lst in (pt, pc, pp, po):
        cat = np.concatenate(lst) if len(lst) > 1 else lst[0]
        out.append(cat[:n])
        lst.clear()
        if cat.size > n:
            lst.append(cat[n:])
    return ArrivalBatch(time=out[0], cls=out[1], prompt=out[2], output=out[3])


def _length_law(where: str, kind: str, mean: float, sigma: float | None) -> LengthDistribution:
    if kind == "exponential":
        return Exponential(max(mean, 1.0))
    if kind == "fixed":
        return Fixed(max(mean, 1.0))
    if kind == "lognormal":
        return LogNormal(max(mean, 1.0), sigma)
    raise ScenarioError(f"{where}.lengths: expected exponential, fixed or lognormal, got {kind!r}")


def workload_from_scenario(scenario: Scenario, *, cv: float = 1.0) -> SyntheticWorkload:
    """The scenario's own workload: Poisson arrivals per class at ``RequestClass.rate`` (whole cluster)
    and lengths per ``RequestClass.lengths`` with means ``prompt``/``decode`` (a mean below one token is
    raised to 1, since every request has at least one prompt and one output token).

    ``cv != 1`` replaces each Poisson stream by a stationary :class:`GammaRenewal` stream with the same
    rate and that coefficient of variation (a burstiness stress test of a plan made for Poisson).
    A scenario with a workflow (``[[arrivals]]`` / ``[[backlogs]]``) gives :func:`workflow_workload`
    (with ``cv`` = 1).
    """
    if not isinstance(scenario, Scenario):
        raise ScenarioError(f"workload_from_scenario: expected a Scenario, got {type(scenario).__name__}")
    cv = _num("workload_from_scenario: cv", cv, strict=False)
    if scenario.workflow is not None and cv == 1.0:
        return workflow_workload(scenario)
    specs = []
    for c in scenario.classes:
        w = f"classes[{c.name}]"
        specs.append(
            ClassSpec(
                Poisson(c.rate) if cv == 1.0 else GammaRenewal(c.rate, cv),
                _length_law(w, c.lengths, c.prompt, c.prompt_sigma),
                _length_law(w, c.lengths, c.decode, c.decode_sigma),
                name=c.name,
            )
        )
    return SyntheticWorkload(specs, class_names=scenario.class_names)


# --------------------------------------------------------------------------------------------
# Trace replay
# --------------------------------------------------------------------------------------------


class TraceWorkload:
    """Replay of a recorded trace: the arrivals are the trace's rows, in order; ``rng`` is unused.

    ``frame`` has columns ``time`` (seconds, nondecreasing, >= 0), ``prompt`` and ``output`` (integer
    tokens >= 1) and ``cls`` (class index into ``class_names``). ``speedup`` divides every time (2.0
    replays twice as fast: double the rate); ``max_requests`` keeps the first rows only. Replay does
    not loop: when a finite horizon lies beyond the last arrival a :class:`TraceWarning` says so.
    Loaders: :func:`fluidopt.sim.trace.load_azure_trace`, :func:`fluidopt.sim.trace.load_trace_csv`.
    """

    def __init__(
        self,
        frame: pd.DataFrame,
        class_names: Sequence[str],
        *,
        speedup: float = 1.0,
        max_requests: int | None = None,
        name: str = "trace",
        notes: Sequence[str] = (),
    ):
        if not isinstance(frame, pd.DataFrame):
            raise TraceError(f"TraceWorkload: expected a pandas DataFrame, got {type(frame).__name__}")
        missing = [c for c in ("time", "prompt", "output", "cls") if c not in frame.columns]
        if missing:
            raise TraceError(
                f"TraceWorkload: missing column(s) {', '.join(missing)}; found {', '.join(map(str, frame.columns))}"
            )
        speedup = _num("TraceWorkload.speedup", speedup)
        names = tuple(str(n) for n in class_names)
        if max_requests is not None:
            if isinstance(max_requests, bool) or not isinstance(max_requests, (int, np.integer)) or max_requests < 1:
                raise TraceError(f"TraceWorkload.max_requests: expected an integer >= 1, got {max_requests!r}")
            frame = frame.iloc[: int(max_requests)]
        if len(frame) == 0:
            raise TraceError("TraceWorkload: the trace has no requests")
        t = frame["time"].to_numpy(dtype=float)
        arrays = {}
        for col in ("prompt", "output", "cls"):
            v = frame[col].to_numpy()
            if not np.issubdtype(v.dtype, np.integer):
                raise TraceError(f"TraceWorkload: column {col}: expected integers, got dtype {v.dtype}")
            arrays[col] = v.astype(np.int64)
        bad = np.flatnonzero(~np.isfinite(t) | (t < 0))
        if bad.size:
            raise TraceError(f"TraceWorkload: position {int(bad[0])}: time = {float(t[bad[0]])!r}: expected finite seconds >= 0")
        dec = np.flatnonzero(np.diff(t) < 0)
        if dec.size:
            raise TraceError(
                f"TraceWorkload: position {int(dec[0]) + 1}: time = {float(t[dec[0] + 1])!r} is before the previous row's "
                f"{float(t[dec[0]])!r}: expected nondecreasing times (the loaders sort them)"
            )
        for col in ("prompt", "output"):
            bad = np.flatnonzero(arrays[col] < 1)
            if bad.size:
                raise TraceError(
                    f"TraceWorkload: position {int(bad[0])}: {col} = {int(arrays[col][bad[0]])}: expected an integer >= 1"
                )
        c = arrays["cls"]
        bad = np.flatnonzero((c < 0) | (c >= len(names)))
        if bad.size:
            raise TraceError(
                f"TraceWorkload: position {int(bad[0])}: cls = {c[bad[0]]}: expected a class index in 0..{len(names) - 1}"
            )
        self.time = t / speedup
        self.prompt = arrays["prompt"]
        self.output = arrays["output"]
        self.cls = c
        self.class_names: tuple[str, ...] = names
        self.speedup = speedup
        self.name = name
        self.notes: tuple[str, ...] = tuple(notes)
        for a in (self.time, self.prompt, self.output, self.cls):
            a.setflags(write=False)

    def __repr__(self) -> str:
        return (
            f"TraceWorkload({self.name!r}, {self.n_requests} requests over {self.duration:.6g} s, "
            f"classes {list(self.class_names)}, speedup {self.speedup:g})"
        )

    def __len__(self) -> int:
        return self.n_requests

    @property
    def n_requests(self) -> int:
        return int(self.time.size)

    @property
    def duration(self) -> float:
        """Time of the last arrival (seconds, after speedup)."""
        return float(self.time[-1])

    @property
    def frame(self) -> pd.DataFrame:
        """The replayed arrivals (after speedup) with a ``class`` name column."""
        return pd.DataFrame(
            {
                "time": self.time,
                "prompt": self.prompt,
                "output": self.output,
                "cls": self.cls,
                "class": pd.Categorical.from_codes(self.cls, categories=list(self.class_names)),
            }
        )

    def batches(self, rng: np.random.Generator | None, horizon: float, size: int = 65536) -> Iterator[ArrivalBatch]:
        """The trace's arrivals with time < ``horizon``, in chunks of at most ``size`` (``rng`` unused)."""
        horizon = _check_horizon(horizon)
        size = _check_size(size)
        n = int(np.searchsorted(self.time, horizon, side="left"))
        if n == self.n_requests and math.isfinite(horizon):
            warnings.warn(
                f"{self.name}: the trace ends at t = {self.duration:.6g} s, before the horizon {horizon:.6g} s; "
                "replay stops there (it does not loop)",
                TraceWarning,
                stacklevel=2,
            )
        for a in range(0, n, size):
            b = min(a + size, n)
            # copies: callers may modify their batch; the trace itself stays read-only
            yield ArrivalBatch(
                self.time[a:b].copy(), self.cls[a:b].copy(), self.prompt[a:b].copy(), self.output[a:b].copy()
            )


# --------------------------------------------------------------------------------------------
# Batch backlogs on top of ongoing arrivals
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Backlog:
    """``n`` requests of class ``cls`` (a name) all arriving at time ``at`` (seconds): a batch job's
    queue dumped at once, with prompt and output lengths drawn from the given laws."""

    cls: str
    n: int
    at: float
    prompt: LengthDistribution
    output: LengthDistribution

    def __post_init__(self) -> None:
        w = f"Backlog({self.cls!r})"
        if isinstance(self.n, bool) or not isinstance(self.n, (int, np.integer)) or self.n < 0:
            raise ScenarioError(f"{w}.n: expected an integer >= 0 (requests), got {self.n!r}")
        _num(f"{w}.at", self.at, minimum=0.0, strict=False)
        for f in ("prompt", "output"):
            if not isinstance(getattr(self, f), LengthDistribution):
                raise ScenarioError(f"{w}.{f}: expected a LengthDistribution (Exponential, ...), got {getattr(self, f)!r}")


class BacklogWorkload:
    """A base workload plus batch backlogs (:class:`Backlog`) injected at given times.

    ``class_names``: the full class list (default: the base's); the base's classes and every
    backlog's class must be in it. At equal times base arrivals come before backlog requests, and
    backlogs in the order given. The backlog's lengths come from their own child streams of ``rng``,
    so adding a backlog leaves the base's arrivals unchanged for a given seed.
    """

    def __init__(self, base, backlogs: Sequence[Backlog], class_names: Sequence[str] | None = None):
        names = tuple(base.class_names if class_names is None else class_names)
        for nm in base.class_names:
            if nm not in names:
                raise ScenarioError(f"BacklogWorkload: base class {nm!r} is not among class_names {list(names)}")
        for b in backlogs:
            if not isinstance(b, Backlog):
                raise ScenarioError(f"BacklogWorkload.backlogs: expected Backlog items, got {b!r}")
            if b.cls not in names:
                raise ScenarioError(f"BacklogWorkload: backlog class {b.cls!r} is not among class_names {list(names)}")
        self.base = base
        self.backlogs = tuple(backlogs)
        self.class_names = names
        self._map = np.array([names.index(nm) for nm in base.class_names], dtype=np.int64)

    def __repr__(self) -> str:
        return f"BacklogWorkload({self.base!r}, {list(self.backlogs)!r})"

    def batches(self, rng: np.random.Generator, horizon: float, size: int = 65536) -> Iterator[ArrivalBatch]:
        horizon = _check_horizon(horizon)
        size = _check_size(size)
        base_rng, *gens = _children(rng, 1 + 2 * len(self.backlogs))
        bt, bc, bp, bo = [], [], [], []
        for j, b in enumerate(self.backlogs):
            if b.n and b.at < horizon:
                bt.append(np.full(b.n, float(b.at)))
                bc.append(np.full(b.n, self.class_names.index(b.cls), dtype=np.int64))
                bp.append(b.prompt.sample(gens[2 * j], b.n))
                bo.append(b.output.sample(gens[2 * j + 1], b.n))
        if bt:
            t = np.concatenate(bt)
            order = np.argsort(t, kind="stable")
            q = [t[order], np.concatenate(bc)[order], np.concatenate(bp)[order], np.concatenate(bo)[order]]
        else:
            q = [np.empty(0), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)]
        pos = 0
        for batch in self.base.batches(base_rng, horizon, size):
            if len(batch) == 0:
                continue
            k = int(np.searchsorted(q[0], batch.time[-1], side="left"))  # backlog strictly before the batch end
            if k > pos:
                src = np.concatenate([np.zeros(len(batch), dtype=np.int64), np.ones(k - pos, dtype=np.int64)])
                tt = np.concatenate([batch.time, q[0][pos:k]])
                order = np.lexsort((src, tt))
                parts = [tt[order], np.concatenate([self._map[batch.cls], q[1][pos:k]])[order],
                         np.concatenate([batch.prompt, q[2][pos:k]])[order],
                         np.concatenate([batch.output, q[3][pos:k]])[order]]
                pos = k
            else:
                parts = [batch.time, self._map[batch.cls], batch.prompt, batch.output]
            for s in range(0, parts[0].size, size):
                yield ArrivalBatch(*(p[s:s + size] for p in parts))
        for s in range(pos, q[0].size, size):
            yield ArrivalBatch(*(p[s:s + size] for p in q))


# --------------------------------------------------------------------------------------------
# A scenario's workflow ([[arrivals]] and [[backlogs]] in the scenario file)
# --------------------------------------------------------------------------------------------


class WorkflowWarning(UserWarning):
    """A workflow that will not do what it says within the run (e.g. a batch class that never arrives)."""


class _Renamed:
    """A one-class workload under another class name."""

    def __init__(self, base, name: str):
        self.base = base
        self.class_names = (name,)

    def __repr__(self) -> str:
        return f"{self.base!r} as {self.class_names[0]!r}"

    def batches(self, rng, horizon, size=65536):
        return self.base.batches(rng, horizon, size)


class _Nothing:
    """No ongoing arrivals (a workflow of backlogs only)."""

    class_names: tuple[str, ...] = ()

    def batches(self, rng, horizon, size=65536):
        return iter(())


class _Merged:
    """Several workloads merged in time order (ties: the parts' order); each part gets its own child
    stream of ``rng``. Collects every part over the horizon first (a finite horizon is needed)."""

    def __init__(self, parts, class_names: Sequence[str]):
        self.parts = list(parts)
        self.class_names = tuple(class_names)
        self._maps = [np.array([self.class_names.index(n) for n in p.class_names], dtype=np.int64) for p in self.parts]

    def __repr__(self) -> str:
        return f"Merged({self.parts!r})"

    def batches(self, rng: np.random.Generator, horizon: float, size: int = 65536) -> Iterator[ArrivalBatch]:
        horizon = _check_horizon(horizon)
        if not math.isfinite(horizon):
            raise ScenarioError("workflow: several arrival processes with a trace need a finite horizon")
        gens = _children(rng, len(self.parts))
        got = [collect(p, g, horizon) for p, g in zip(self.parts, gens)]
        t = np.concatenate([b.time for b in got])
        src = np.concatenate([np.full(len(b), k) for k, b in enumerate(got)])
        order = np.lexsort((src, t))
        cls = np.concatenate([m[b.cls] for m, b in zip(self._maps, got)])[order]
        pp = np.concatenate([b.prompt for b in got])[order]
        po = np.concatenate([b.output for b in got])[order]
        t = t[order]
        for s in range(0, t.size, size):
            yield ArrivalBatch(t[s:s + size], cls[s:s + size], pp[s:s + size], po[s:s + size])


def _arrival_part(spec, c: RequestClass):
    """One [[arrivals]] table as a one-class workload."""
    w = f"arrivals[{c.name}]"
    if spec.process == "trace":
        from fluidopt.sim.trace import _is_azure, load_azure_trace, load_trace_csv

        load = load_azure_trace if _is_azure(spec.file) else load_trace_csv
        return _Renamed(load(spec.file, classes="single"), c.name)
    prompt = _length_law(f"classes[{c.name}]", c.lengths, c.prompt, c.prompt_sigma)
    output = _length_law(f"classes[{c.name}]", c.lengths, c.decode, c.decode_sigma)
    rate = c.rate if spec.rate is None else spec.rate
    if spec.process == "poisson":
        proc: ArrivalProcess = Poisson(rate)
    elif spec.process == "gamma":
        proc = GammaRenewal(rate, spec.cv)
    else:  # rates: a CSV of per-slot rates
        r = read_slot_rates(spec.file, f"{w}.file")
        proc = PiecewiseRate(spec.slot * np.arange(r.size + 1), np.append(r, 0.0))
    return SyntheticWorkload([ClassSpec(proc, prompt, output, name=c.name)])


def read_slot_rates(path, where: str) -> np.ndarray:
    """Per-slot rates (requests/s) from a CSV: a ``rate`` column, or one column of numbers without a
    header; blank lines skipped. Errors name ``where``, the line and the value."""
    import csv

    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            rows = [(n, r) for n, r in enumerate(csv.reader(f), start=1) if any(c.strip() for c in r)]
    except (OSError, UnicodeDecodeError) as e:
        raise ScenarioError(f"{where}: cannot read {str(path)!r}: {e}") from None
    head = [c.strip().lower() for c in rows[0][1]] if rows else []
    col = 0
    if "rate" in head:
        col = head.index("rate")
        rows = rows[1:]
    if not rows:
        raise ScenarioError(f"{where}: {str(path)!r}: expected one rate per slot, got no rows")
    out = np.empty(len(rows))
    for k, (line, r) in enumerate(rows):
        v = r[col].strip() if col < len(r) else ""
        try:
            x = float(v)
        except ValueError:
            x = math.nan
        if not math.isfinite(x) or x < 0:
            raise ScenarioError(f"{where}: {str(path)!r} line {line}: rate = {v!r}: expected requests/s >= 0")
        out[k] = x
    if not np.any(out > 0):
        raise ScenarioError(f"{where}: {str(path)!r}: expected at least one positive rate, got all zero")
    return out


def workflow_workload(scenario: Scenario):
    """The workload of a scenario's workflow (:class:`fluidopt.model.Workflow`): the ``[[arrivals]]``
    processes (the synthetic ones in one :class:`SyntheticWorkload`, in class order; a trace merged in
    time order) plus the ``[[backlogs]]`` (:class:`BacklogWorkload`, lengths from the class). A class
    without an ``[[arrivals]]`` table has no ongoing arrivals."""
    wf = scenario.workflow
    if wf is None:
        raise ScenarioError(f"workflow_workload: scenario {scenario.name!r} has no workflow ([[arrivals]] / [[backlogs]])")
    names = scenario.class_names
    cl = {c.name: c for c in scenario.classes}
    specs = sorted(wf.arrivals, key=lambda a: names.index(a.cls))
    synth = [s for s in specs if s.process != "trace"]
    parts = []
    if synth:
        ws = [_arrival_part(s, cl[s.cls]) for s in synth]
        parts.append(SyntheticWorkload([w.specs[0] for w in ws]))
    parts += [_arrival_part(s, cl[s.cls]) for s in specs if s.process == "trace"]
    if not parts:
        base = _Nothing()
    elif len(parts) == 1:
        base = parts[0]
    else:
        base = _Merged(parts, [n for n in names if any(n in p.class_names for p in parts)])
    backlogs = [Backlog(b.cls, int(b.count), float(b.at),
                        _length_law(f"classes[{b.cls}]", cl[b.cls].lengths, cl[b.cls].prompt, cl[b.cls].prompt_sigma),
                        _length_law(f"classes[{b.cls}]", cl[b.cls].lengths, cl[b.cls].decode, cl[b.cls].decode_sigma))
                for b in wf.backlogs]
    return BacklogWorkload(base, backlogs, class_names=names)


def check_workflow(scenario: Scenario, horizon: float) -> list[str]:
    """Warnings for a workflow run over [0, ``horizon``): a batch class (one with a deadline) that gets
    fewer than one request in expectation (no backlog before the horizon, no arrivals process bringing
    one) completes nothing; each is also issued as a :class:`WorkflowWarning`. Returns the messages."""
    wf = scenario.workflow
    if wf is None:
        return []
    out = []
    for c in scenario.classes:
        if c.deadline is None and c.deadline_at is None:
            continue
        n = sum(b.count for b in wf.backlogs if b.cls == c.name and b.at < horizon)
        for a in wf.arrivals:
            if a.cls == c.name:
                n += math.inf if a.process in ("trace", "rates") else (c.rate if a.rate is None else a.rate) * horizon
        if n < 1:
            late = [b for b in wf.backlogs if b.cls == c.name]
            why = (f"its backlog arrives at {min(b.at for b in late):g} s, not before the horizon {horizon:g} s"
                   if late else "it has no [[backlogs]] table and no [[arrivals]] table bringing a request")
            out.append(f"workflow: batch class {c.name!r} never arrives within the horizon ({why}): no request of it "
                       "will be served")
    for m in out:
        warnings.warn(m, WorkflowWarning, stacklevel=2)
    return out
