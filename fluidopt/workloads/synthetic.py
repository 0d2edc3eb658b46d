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
  of a recorded trace; see :mod:`fluidopt.workloads.traces` for the file loaders).

Randomness. ``batches(rng, ...)`` derives independent child streams from ``rng`` for each class and
each quantity (arrival times, prompt lengths, output lengths), and draws them in internal blocks of
fixed size. Hence the same seed gives the same arrivals bit for bit, whatever the ``size`` of the
yielded chunks, and a shorter horizon gives a prefix of the arrivals of a longer one. Changing one
class's length distribution leaves every arrival time unchanged (common random numbers).
See docs/workloads.md for the discretisation rules.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import RequestClass
from fluidopt.workloads.base import _BLOCK, ArrivalBatch, _check_horizon, _check_size, _children, _num

__all__ = ["ArrivalProcess", "ClassSpec", "Empirical", "Exponential", "Fixed", "GammaRenewal", "LengthDistribution", "LogNormal", "PiecewiseRate", "Poisson", "SyntheticWorkload"]

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

    @property
    def second_moment(self) -> float:
        """E[L^2], tokens^2 (what a law's quadratic terms average over: docs/simulator.md section 1.3)."""
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

    @property
    def second_moment(self) -> float:
        f = self.n - math.floor(self.n)  # randomized rounding between floor and ceil adds f (1 - f)
        return self.n * self.n + f * (1.0 - f)

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

    @property
    def second_moment(self) -> float:
        return 2.0 * self._mean * self._mean - self._mean  # Var + mean^2 = mean (mean - 1) + mean^2

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

    @property
    def second_moment(self) -> float:
        """1 + 2 E[Y] + E[Y]^2 exp(sigma^2), without the randomized rounding's variance (under 1/4 token^2)."""
        m = self._mean - 1.0
        return 1.0 + 2.0 * m + m * m * math.exp(self.sigma**2) if m > 0 else 1.0

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

    @property
    def second_moment(self) -> float:
        return float(np.mean(self.values.astype(float) ** 2))

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
