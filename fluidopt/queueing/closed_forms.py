"""Closed-form many-server queues: Erlang B, Erlang C (M/M/c), M/M/c/K and Erlang A (M/M/c+M).

Pure functions of (arrival rate ``lam`` per second, service rate ``mu`` per second per server,
``c`` servers, abandonment rate ``theta`` per second). They are the simulator's independent
reference in tests and a quick capacity-planning tool: "how many decode slots keep the probability
of waiting under 5 %?" is :func:`mmc_staffing`.

Numerics. Erlang B uses the recursion B(k) = a B(k-1) / (k + a B(k-1)), B(0) = 1, whose terms stay
in [0, 1]: stable for c in the tens of thousands (O(c) work). Erlang C follows from B. Erlang A and
M/M/c/K use the exact birth-death stationary distribution computed in logarithms and normalised with
log-sum-exp; Erlang A truncates the infinite state space only where a rigorous bound on the
remaining tail is below 1e-16 of the total mass.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy.special import logsumexp

from fluidopt.core.errors import ScenarioError

__all__ = [
    "ErlangAMetrics",
    "MMCKMetrics",
    "MMCMetrics",
    "erlang_a",
    "erlang_b",
    "erlang_c",
    "mmc_mean_wait",
    "mmc_metrics",
    "mmc_staffing",
    "mmc_wait_tail",
    "mg1_geometric_wait",
    "mmck_metrics",
]

_TAIL = 1e-16  # relative mass allowed beyond the truncation point of Erlang A
_MAX_STATES = 50_000_000


def _rate(name: str, v: float, *, zero: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise ScenarioError(f"{name}: expected a number, got {v!r} ({type(v).__name__})")
    v = float(v)
    if not math.isfinite(v) or v < 0 or (v == 0 and not zero):
        raise ScenarioError(f"{name}: expected a finite number {'>=' if zero else '>'} 0, got {v!r}")
    return v


def _servers(name: str, c: int, minimum: int = 1) -> int:
    if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < minimum:
        raise ScenarioError(f"{name}: expected an integer >= {minimum}, got {c!r}")
    return int(c)


class _Result:
    def to_dict(self) -> dict:
        return asdict(self)

    def to_frame(self) -> pd.DataFrame:
        """One-row DataFrame of the inputs and metrics."""
        return pd.DataFrame([self.to_dict()])


# --------------------------------------------------------------------------------------------
# Erlang B and C
# --------------------------------------------------------------------------------------------


def erlang_b(c: int, a: float) -> float:
    """Blocking probability of M/M/c/c (Erlang loss) with offered load ``a = lam / mu`` erlangs."""
    c = _servers("erlang_b: c", c, minimum=0)
    a = _rate("erlang_b: a", a, zero=True)
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return b


def erlang_c(c: int, a: float) -> float:
    """Probability that an arrival waits in M/M/c with offered load ``a = lam / mu`` erlangs
    (1.0 when a >= c: the queue is unstable and every arrival eventually waits)."""
    c = _servers("erlang_c: c", c)
    a = _rate("erlang_c: a", a, zero=True)
    if a >= c:
        return 1.0
    b = erlang_b(c, a)
    return c * b / (c - a * (1.0 - b))


def mmc_mean_wait(lam: float, mu: float, c: int) -> float:
    """Mean time in queue (s) of M/M/c: C(c, a) / (c mu - lam); inf when lam >= c mu."""
    return mmc_metrics(lam, mu, c).mean_wait


def mmc_wait_tail(lam: float, mu: float, c: int, t: float) -> float:
    """P(wait > t) in M/M/c (FCFS): C(c, a) exp(-(c mu - lam) t), t in seconds."""
    m = mmc_metrics(lam, mu, c)
    t = _rate("mmc_wait_tail: t", t, zero=True)
    if m.utilisation >= 1:
        return 1.0
    return m.p_wait * math.exp(-(c * mu - lam) * t)


@dataclass(frozen=True)
class MMCMetrics(_Result):
    """M/M/c steady state. Times in seconds, rates per second; ``utilisation`` = lam / (c mu)."""

    lam: float
    mu: float
    c: int
    offered_load: float  # a = lam / mu, erlangs
    utilisation: float
    p_wait: float  # Erlang C
    mean_wait: float  # E[time in queue], all arrivals
    mean_queue: float  # E[number waiting]
    mean_response: float  # E[wait + service]
    mean_in_system: float  # E[waiting + in service]


def mmc_metrics(lam: float, mu: float, c: int) -> MMCMetrics:
    """Erlang C metrics of M/M/c; an unstable queue (lam >= c mu) reports p_wait 1 and infinite
    waits and queue lengths instead of raising (handy in load sweeps)."""
    lam = _rate("mmc_metrics: lam", lam, zero=True)
    mu = _rate("mmc_metrics: mu", mu)
    c = _servers("mmc_metrics: c", c)
    a = lam / mu
    rho = a / c
    if rho >= 1:
        inf = math.inf
        return MMCMetrics(lam, mu, c, a, rho, 1.0, inf, inf, inf, inf)
    pw = erlang_c(c, a)
    wq = pw / (c * mu - lam)
    lq = lam * wq  # Little
    return MMCMetrics(lam, mu, c, a, rho, pw, wq, lq, wq + 1.0 / mu, lq + a)


def mmc_staffing(
    lam: float, mu: float, *, max_p_wait: float | None = None, max_mean_wait: float | None = None
) -> int:
    """Fewest servers c with lam < c mu meeting every given target (P(wait) <= max_p_wait, mean
    wait <= max_mean_wait seconds). Walks c upward with the O(1) Erlang B step, so c in the tens of
    thousands costs milliseconds."""
    lam = _rate("mmc_staffing: lam", lam)
    mu = _rate("mmc_staffing: mu", mu)
    if max_p_wait is None and max_mean_wait is None:
        raise ScenarioError("mmc_staffing: give max_p_wait and/or max_mean_wait")
    if max_p_wait is not None:
        max_p_wait = _rate("mmc_staffing: max_p_wait", max_p_wait, zero=True)
    if max_mean_wait is not None:
        max_mean_wait = _rate("mmc_staffing: max_mean_wait", max_mean_wait, zero=True)
    if max_p_wait == 0 or max_mean_wait == 0:
        raise ScenarioError("mmc_staffing: a target of 0 needs infinitely many servers; expected > 0")
    a = lam / mu
    c = math.floor(a) + 1
    b = erlang_b(c, a)
    while True:
        pw = c * b / (c - a * (1.0 - b))
        ok = (max_p_wait is None or pw <= max_p_wait) and (max_mean_wait is None or pw / (c * mu - lam) <= max_mean_wait)
        if ok:
            return c
        c += 1
        b = a * b / (c + a * b)


# --------------------------------------------------------------------------------------------
# Birth-death chains in log space
# --------------------------------------------------------------------------------------------


def _log_pi_servers(c: int, a: float, upto: int) -> np.ndarray:
    """log of unnormalised p_n = a^n / n! for n = 0..upto (upto <= c)."""
    n = np.arange(1, upto + 1, dtype=float)
    if a == 0:
        out = np.full(upto + 1, -np.inf)
        out[0] = 0.0
        return out
    return np.concatenate(([0.0], np.cumsum(math.log(a) - np.log(n))))


@dataclass(frozen=True)
class MMCKMetrics(_Result):
    """M/M/c/K steady state (K >= c: at most K in the system, arrivals finding K are lost)."""

    lam: float
    mu: float
    c: int
    K: int
    p_block: float  # arrivals lost (PASTA: P(N = K))
    p_wait: float  # arrivals that are admitted and wait: P(c <= N < K)
    mean_queue: float  # E[number waiting]
    mean_in_system: float
    mean_wait: float  # E[time in queue] of admitted arrivals (s)
    utilisation: float  # E[busy servers] / c


def mmck_metrics(lam: float, mu: float, c: int, K: int) -> MMCKMetrics:
    """Exact M/M/c/K metrics (any load; K = c is Erlang B's loss system)."""
    lam = _rate("mmck_metrics: lam", lam, zero=True)
    mu = _rate("mmck_metrics: mu", mu)
    c = _servers("mmck_metrics: c", c)
    K = _servers("mmck_metrics: K", K, minimum=c)
    a = lam / mu
    lp = _log_pi_servers(c, a, c)
    if K > c:
        j = np.arange(1, K - c + 1, dtype=float)
        beyond = lp[-1] + j * (math.log(a / c) if a > 0 else -np.inf)
        lp = np.concatenate((lp, beyond))
    p = np.exp(lp - logsumexp(lp))
    n = np.arange(K + 1)
    q = np.maximum(n - c, 0)
    lq = float(q @ p)
    ln = float(n @ p)
    p_block = float(p[-1])
    admitted = lam * (1.0 - p_block)
    return MMCKMetrics(
        lam, mu, c, K,
        p_block=p_block,
        p_wait=float(p[c:K].sum()),
        mean_queue=lq,
        mean_in_system=ln,
        mean_wait=lq / admitted if admitted > 0 else 0.0,
        utilisation=float(np.minimum(n, c) @ p) / c,
    )


@dataclass(frozen=True)
class ErlangAMetrics(_Result):
    """Erlang A (M/M/c+M) steady state: waiting customers abandon at rate ``theta`` each.

    ``p_wait``: arrivals that find all servers busy; ``p_abandon``: arrivals that abandon
    (= theta E[Q] / lam); ``mean_wait``: mean time in queue over all arrivals, abandoning ones
    included (= E[Q] / lam); ``mean_queue``: E[number waiting]; ``utilisation``: E[busy servers] / c
    (= lam (1 - p_abandon) / (c mu)); ``states``: states kept after truncation.
    """

    lam: float
    mu: float
    c: int
    theta: float
    p_wait: float
    p_abandon: float
    mean_wait: float
    mean_queue: float
    utilisation: float
    states: int


def erlang_a(lam: float, mu: float, c: int, theta: float) -> ErlangAMetrics:
    """Exact Erlang A metrics from the birth-death stationary distribution.

    Births at ``lam``; deaths at ``n mu`` for n <= c and ``c mu + (n - c) theta`` above. ``theta = 0``
    is M/M/c (Erlang C; unstable when lam >= c mu, reported as infinite waits).
    """
    lam = _rate("erlang_a: lam", lam, zero=True)
    mu = _rate("erlang_a: mu", mu)
    c = _servers("erlang_a: c", c)
    theta = _rate("erlang_a: theta", theta, zero=True)
    if theta == 0:
        m = mmc_metrics(lam, mu, c)
        return ErlangAMetrics(lam, mu, c, 0.0, m.p_wait, 0.0, m.mean_wait, m.mean_queue,
                              min(m.utilisation, 1.0), -1)
    if lam == 0:
        return ErlangAMetrics(lam, mu, c, theta, 0.0, 0.0, 0.0, 0.0, 0.0, 1)
    a = lam / mu
    lp_srv = _log_pi_servers(c, a, c)
    log_lam = math.log(lam)
    # Queue states n = c + j: ratios lam / (c mu + j theta) decrease in j, so once a ratio r < 1 the
    # tail beyond j is at most p_{c+j} r / (1 - r): stop when that is below _TAIL of the mass.
    J = max(256, 2 * math.ceil(max(lam - c * mu, 0.0) / theta) + 64)
    while True:
        j = np.arange(1, J + 1, dtype=float)
        lq = lp_srv[-1] + np.cumsum(log_lam - np.log(c * mu + j * theta))
        r_next = lam / (c * mu + (J + 1) * theta)
        total = np.logaddexp(logsumexp(lp_srv), logsumexp(lq))
        if r_next < 1 and lq[-1] + math.log(r_next / (1 - r_next)) - total < math.log(_TAIL):
            break
        if J > _MAX_STATES:  # pragma: no cover - needs theta ~ 1e-7 with heavy overload
            raise ScenarioError(
                f"erlang_a: more than {_MAX_STATES} queue states needed (theta = {theta!r} is tiny against "
                f"the overload lam - c mu = {lam - c * mu!r}); use a larger theta"
            )
        J *= 2
    p_srv = np.exp(lp_srv - total)
    p_q = np.exp(lq - total)
    eq = float(j @ p_q)
    p_wait = float(p_srv[-1] + p_q.sum())  # N >= c
    busy = float(np.arange(c + 1) @ p_srv) + c * float(p_q.sum())
    return ErlangAMetrics(
        lam, mu, c, theta,
        p_wait=p_wait,
        p_abandon=theta * eq / lam,
        mean_wait=eq / lam,
        mean_queue=eq,
        utilisation=busy / c,
        states=c + 1 + J,
    )


def mg1_geometric_wait(lam: float, alpha: float, mean_prompt: float) -> float:
    """Pollaczek-Khinchine mean wait (s) of M/G/1 with service alpha * P, P geometric on {1, 2, ...}.

    The M/G/1 reference of :func:`fluidopt.sim.textbook.mg1_setup` (a GPU that prefills one token per
    iteration of alpha seconds).

    E[P] = m, E[P^2] = (2 - p) / p^2 with p = 1/m; W = lam E[S^2] / (2 (1 - rho)), rho = lam E[S].
    """
    p = 1.0 / mean_prompt
    es2 = alpha**2 * (2.0 - p) / p**2
    rho = lam * alpha * mean_prompt
    return lam * es2 / (2.0 * (1.0 - rho))
