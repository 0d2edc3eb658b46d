"""Is a queue growing? A batch-means test of linear growth in a simulated number-in-system path.

A stable queue's number in system N(t) has a stationary law; an unstable one grows like (lam - mu) t.
The test cuts the run after a warm-up share into ``batches`` windows of equal length, takes the
time average of N in each (the *batch means* Y_1..Y_k), and fits Y_i = c + s * i by least squares.
When the windows are long compared with the queue's correlation time (docs/run-length.md: tau_int),
a stable queue's batch means are close to independent and identically distributed, so the t
statistic of the slope s has Student's t law with k - 2 degrees of freedom. The run is called
*unstable* when the one-sided p-value P(t_{k-2} >= t) is below 1 - ``confidence``: a stable queue is
misjudged with probability about 1 - confidence, and an unstable one is found with probability that
goes to 1 as the run grows (its batch means rise by (lam - mu) * window per batch, its residuals do
not grow with them).

Pure numpy/scipy; the path is given as arrival and departure instants (seconds).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from fluidopt.core.errors import ScenarioError

__all__ = ["GrowthTest", "batch_means", "growth_test", "number_in_system"]


@dataclass(frozen=True)
class GrowthTest:
    """Outcome of :func:`growth_test`. ``slope``: growth of the batch means, requests per second;
    ``stderr``: its standard error (same unit); ``t``: slope / stderr; ``p_value``: one-sided
    P(t_{k-2} >= t); ``unstable``: p_value < 1 - confidence; ``means``: the batch means (requests)."""

    slope: float
    stderr: float
    t: float
    p_value: float
    confidence: float
    unstable: bool
    batches: int
    window: float  # seconds per batch
    mean_in_system: float  # requests, over the analysed part of the run
    means: tuple[float, ...]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["means"] = list(self.means)
        return d


def number_in_system(arrivals, departures, t) -> np.ndarray:
    """N(t) = arrivals up to t minus departures up to t (right-continuous), at each instant of ``t``.
    NaN departures (never served) never count."""
    a = np.sort(np.asarray(arrivals, dtype=float))
    d = np.asarray(departures, dtype=float)
    d = np.sort(d[~np.isnan(d)])
    t = np.asarray(t, dtype=float)
    return np.searchsorted(a, t, side="right") - np.searchsorted(d, t, side="right")


def batch_means(arrivals, departures, start: float, stop: float, batches: int) -> np.ndarray:
    """Exact time averages of N(t) over ``batches`` equal windows of [start, stop] (requests)."""
    edges = np.linspace(start, stop, batches + 1)
    a = np.sort(np.asarray(arrivals, dtype=float))
    d = np.asarray(departures, dtype=float)
    d = np.sort(d[~np.isnan(d)])

    def area(x: np.ndarray, upto: np.ndarray) -> np.ndarray:
        # int_0^u #{x_i <= s} ds = sum_i max(u - x_i, 0), via prefix sums of the sorted instants
        cs = np.concatenate(([0.0], np.cumsum(x)))
        k = np.searchsorted(x, upto, side="right")
        return k * upto - cs[k]

    cum = area(a, edges) - area(d, edges)
    return np.diff(cum) / np.diff(edges)


def growth_test(arrivals, departures, horizon: float, *, warmup: float = 0.2, batches: int = 20,
                confidence: float = 0.99) -> GrowthTest:
    """Test the number-in-system path for linear growth on [warmup * horizon, horizon] (module
    docstring). ``horizon``: end of the analysed run, s (take the last arrival: after it a queue
    drains whatever its stability). ``confidence``: 1 - the chance of calling a stable queue
    unstable."""
    from scipy.stats import t as student_t

    if not (isinstance(batches, int) and batches >= 3):
        raise ScenarioError(f"growth_test: batches = {batches!r}: expected an integer >= 3")
    if not 0 <= warmup < 1:
        raise ScenarioError(f"growth_test: warmup = {warmup!r}: expected a share in [0, 1)")
    if not 0 < confidence < 1:
        raise ScenarioError(f"growth_test: confidence = {confidence!r}: expected a number in (0, 1)")
    if not horizon > 0:
        raise ScenarioError(f"growth_test: horizon = {horizon!r}: expected seconds > 0")
    start = warmup * horizon
    y = batch_means(arrivals, departures, start, horizon, batches)
    window = (horizon - start) / batches
    x = (np.arange(batches) + 0.5) * window
    xc = x - x.mean()
    slope = float(xc @ (y - y.mean()) / (xc @ xc))
    resid = y - y.mean() - slope * xc
    s2 = float(resid @ resid) / (batches - 2)
    se = float(np.sqrt(s2 / (xc @ xc)))
    if se > 0:
        t = slope / se
    else:
        t = np.inf if slope > 0 else (-np.inf if slope < 0 else 0.0)
    p = float(student_t.sf(t, batches - 2))
    return GrowthTest(slope, se, float(t), p, confidence, bool(p < 1 - confidence), batches, window,
                      float(y.mean()), tuple(float(v) for v in y))
