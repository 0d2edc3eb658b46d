"""How long must a queueing simulation run? Exact asymptotic variances for M/M/c and M/M/c+M.

A simulation estimates E[f(N)] by a time average (1/T) int_0^T f(N(t)) dt of the number in system
N(t). For an ergodic chain, sqrt(T) (average - E f) -> Normal(0, sigma^2): sigma^2 (the *asymptotic
variance*, also called the time-average variance constant) fixes the run length a target precision
needs. This module computes sigma^2 exactly for the birth-death chain of M/M/c (Erlang C) and
M/M/c+M (Erlang A: each waiting customer abandons at rate ``theta``), and turns it into run-length
answers: the relative standard deviation of the mean-wait (or abandonment-probability) estimate of a
run of n customers, the chance that such a run lands within +-h of the exact value, and the number
of customers a run needs for a given precision.

Method. For a birth-death chain with birth rates lam_n, stationary law pi and fbar = f - E f,
Poisson's equation Q g = -fbar telescopes: with F_n = sum_{k <= n} pi_k fbar_k (= -sum_{k > n}
pi_k fbar_k), g_{n+1} - g_n = -F_n / (pi_n lam_n), and summation by parts gives

    sigma^2 = 2 sum_n pi_n fbar_n g_n = 2 sum_n F_n^2 / (pi_n lam_n).

(Whitt, "Asymptotic formulas for Markov processes with applications to simulation", Oper. Res. 40
(1992).) For the nondecreasing f used here fbar changes sign once, so F_n <= 0 everywhere; F_n is
accumulated from the left below the sign change and from the right above it, so every sum adds terms
of one sign (no cancellation), in logarithms (no under- or overflow for c in the tens of thousands).
The same martingale decomposition gives the cross-constants that the per-customer estimators
(ratios to the number of arrivals, abandonment counts) need; see :func:`mmc_mean_wait_relative_sd`.

Truncation. The chain is cut at K >= c. What is computed is exactly sigma^2 of the chain with births
blocked at K. Beyond K the ratios p_{n+1}/p_n = lam / mu_{n+1} are at most r = lam / mu_{K+1} < 1
(death rates never decrease), and |fbar_k| <= A + B k, so three neglected quantities have
closed-form geometric bounds (``_tail_bound``): the terms n >= K of the sigma^2 sum, the mass beyond
K, and sum_{k > K} pi_k |fbar_k|, which bounds the change of every kept F_n (through the missing tail
and through E f). K is doubled until the resulting first-order bound on the relative error of
sigma^2 is below ``tol`` (default 1e-14; the issue's M/M/100 at load 0.9 stops at 613 states with a
bound of 3e-19). With theta = 0 the ratio bound is attained (r = lam / (c mu) for every n > c); with
theta > 0 the tail decays faster than the bound.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy.special import logsumexp

from fluidopt.core.errors import ScenarioError
from fluidopt.queueing.closed_forms import _rate, _servers

__all__ = [
    "RunLengthReport",
    "customers_for_precision",
    "erlang_a_abandon_relative_sd",
    "mmc_mean_wait_relative_sd",
    "mmc_time_average_variance",
    "run_length_report",
]

FUNCTIONS = ("queue", "busy", "in_system")
ESTIMATORS = ("time", "customer")
_MAX_STATES = 20_000_000


class _Analysis(NamedTuple):
    """Asymptotic constants of one functional f of the truncated chain (rates per second)."""

    mean: float  # E f
    log_mean: float  # log E f (finite even when E f underflows)
    var: float  # stationary Var f
    sigma2: float  # asymptotic variance of the time average of f (units f^2 * s)
    log_sigma2: float
    cross_arrivals: float  # lim Cov(int fbar dt, A(T) - lam T) / T, A = arrivals
    cross_abandon: float  # lim Cov(int fbar dt, D(T) - theta int Q dt) / T, D = abandonments
    states: int
    rel_error_bound: float  # first-order bound on the relative truncation error of sigma2


def _check_f(name: str, f: str) -> str:
    if f not in FUNCTIONS:
        raise ScenarioError(f"{name}: expected one of {', '.join(FUNCTIONS)}, got {f!r}")
    return f


def _check_estimator(name: str, estimator: str) -> str:
    if estimator not in ESTIMATORS:
        raise ScenarioError(f"{name}: expected one of {', '.join(ESTIMATORS)}, got {estimator!r}")
    return estimator


def _check_open01(name: str, v: float) -> float:
    v = _rate(name, v)
    if not v < 1:
        raise ScenarioError(f"{name}: expected a number in (0, 1), got {v!r}")
    return v


def _validate(fn: str, lam: float, mu: float, c: int, theta: float) -> tuple[float, float, int, float]:
    lam = _rate(f"{fn}: lam", lam)
    mu = _rate(f"{fn}: mu", mu)
    c = _servers(f"{fn}: c", c)
    theta = _rate(f"{fn}: theta", theta, zero=True)
    if theta == 0 and lam >= c * mu:
        raise ScenarioError(
            f"{fn}: lam = {lam!r} >= c * mu = {c * mu!r}: the M/M/c queue is unstable (no steady state, "
            "infinite variance); expected lam < c * mu, or theta > 0 (abandonment)"
        )
    return lam, mu, c, theta


def _tail_bound(log_piK: float, r: float, K: int, A: float, B: float) -> tuple[float, float, float]:
    """Geometric bounds on what the truncation at K neglects, for |fbar_k| <= A + B k and
    p_{k+1} / p_k <= r < 1 beyond K. Returns the logs of (tail mass, tail of sum pi_k |fbar_k|,
    tail of sum_{n >= K} F_n^2 / pi_n), all normalised by the kept mass."""
    q = r / (1.0 - r)
    # sum_{j >= 1} r^j (A + B (n + j)) = (A + B n) q + B r / (1 - r)^2  =: s(n)
    s_K = (A + B * K) * q + B * r / (1.0 - r) ** 2
    # n >= K: |F_n| <= pi_n s(n), pi_n <= pi_K r^(n-K), so sum F_n^2/pi_n <= pi_K sum_m r^m (s_K + beta m)^2
    beta = B * q
    geo = s_K**2 / (1 - r) + 2 * s_K * beta * r / (1 - r) ** 2 + beta**2 * r * (1 + r) / (1 - r) ** 3
    return log_piK + math.log(q), log_piK + math.log(s_K), log_piK + math.log(geo)


def _first_queue_states(lam: float, mu: float, c: int, theta: float) -> int:
    """Queue states of the first truncation: 256, or with abandonment in overload enough that the death
    rate beats the birth rate (r < 1) with room to spare, so the first truncation is already stable
    instead of doubling its way there."""
    if theta == 0:
        return 256
    return max(256, 2 * math.ceil(max(lam - c * mu, 0.0) / theta) + 64)


def _analyse(lam: float, mu: float, c: int, theta: float, f: str, tol: float) -> _Analysis:
    """sigma^2 and cross-constants of f(N) for the validated chain (see the module docstring)."""
    a = lam / mu
    log_lam = math.log(lam)
    n_srv = np.arange(1, c + 1, dtype=float)
    lp_srv = np.concatenate(([0.0], np.cumsum(math.log(a) - np.log(n_srv))))  # log a^n / n!
    J = _first_queue_states(lam, mu, c, theta)
    while True:
        j = np.arange(1, J + 1, dtype=float)
        death_q = c * mu + j * theta
        lp = np.concatenate((lp_srv, lp_srv[-1] + np.cumsum(log_lam - np.log(death_q))))
        K = c + J
        r = lam / (c * mu + (J + 1) * theta)
        if r < 1:
            res = _analyse_truncated(lp, lam, mu, c, theta, f, r, K)
            if res.rel_error_bound <= tol:
                return res
        if K > _MAX_STATES:
            raise ScenarioError(
                f"mmc_time_average_variance: more than {_MAX_STATES} states needed for tol = {tol!r} "
                f"(lam = {lam!r}, c * mu = {c * mu!r}, theta = {theta!r}); the load is too close to 1 "
                "or theta too small"
            )
        J *= 2


def _analyse_truncated(
    lp: np.ndarray, lam: float, mu: float, c: int, theta: float, f: str, r: float, K: int
) -> _Analysis:
    n = np.arange(K + 1, dtype=float)
    lpi = lp - logsumexp(lp)
    # fbar = f - E f, its sign and log |fbar|. Where f is flat (f = 0 for the queue below c, f = c for
    # busy above c) |fbar| is E f or E[idle servers] exactly, taken in logs: computing it as f - E f
    # would lose it to rounding (E[Q] ~ 1e-24 at c = 10,000, load 0.9; c - E[busy] ~ 1e-155 in overload).
    with np.errstate(divide="ignore"):
        if f == "queue":
            fv = np.maximum(n - c, 0.0)
            pos = fv > 0
            log_mean = float(logsumexp(lpi[pos] + np.log(fv[pos])))
            mean = math.exp(log_mean)
            fbar = np.where(pos, fv - mean, -mean)
            labs = np.where(pos, np.log(np.abs(fbar)), log_mean)
            A, B = mean, 1.0  # |fbar_k| <= A + B k beyond K (for the truncation bound)
        elif f == "busy":
            fv = np.minimum(n, float(c))
            log_mean = float(logsumexp(lpi[1:] + np.log(fv[1:])))
            mean = math.exp(log_mean)
            log_idle = float(logsumexp(lpi[:c] + np.log(c - n[:c])))  # E[c - busy] > 0
            idle = math.exp(log_idle)
            flat = n >= c
            fbar = np.where(flat, idle, idle - (c - n))
            labs = np.where(flat, log_idle, np.log(np.abs(fbar)))
            A, B = idle, 0.0
        else:
            fv = n
            log_mean = float(logsumexp(lpi[1:] + np.log(n[1:])))
            mean = math.exp(log_mean)
            fbar = n - mean
            labs = np.log(np.abs(fbar))
            A, B = mean, 1.0
        # f is nondecreasing, so fbar changes sign once, at kstar
        fbar_pos = fbar > 0
        # (no sign change only for a constant f: then fbar = 0, F = 0 whatever kstar is, and argmax gives 0)
        kstar = int(np.argmax(fbar_pos))
        w = lpi + labs  # log pi_k |fbar_k|
        logF = np.empty(K)  # log |F_n|, n = 0..K-1 (F_K = 0 for the chain blocked at K)
        if kstar > 0:
            logF[: min(kstar, K)] = np.logaddexp.accumulate(w[: min(kstar, K)])
        if kstar < K:
            right = np.logaddexp.accumulate(w[::-1])[::-1]  # log sum_{k >= n}
            logF[kstar:] = right[kstar + 1 :]
        var = float(np.exp(logsumexp(lpi + 2 * labs)))
    lpiK = lpi[:K]
    log_S2 = float(logsumexp(2 * logF - lpiK))  # log sum F_n^2 / pi_n
    log_sigma2 = math.log(2.0) - math.log(lam) + log_S2
    cross_arr = float(np.exp(logsumexp(logF)))  # lam sum pi_n (g_{n+1} - g_n) = -sum F_n = sum |F_n|
    cross_ab = 0.0
    if theta > 0 and K > c:
        # <M_g, M_ab>: abandonment n -> n-1 at rate theta (n - c); jump of M_g is F_{n-1} / (pi_{n-1} lam)
        # (<= 0 here), and pi_n / (pi_{n-1} lam) = 1 / mu_n.
        m = np.arange(c + 1, K + 1)
        log_mu_n = np.log(c * mu + (m - c) * theta)
        cross_ab = -theta * float(np.exp(logsumexp(np.log(m - c) + logF[m - 1] - log_mu_n)))
    # Truncation error bound, first order: the neglected sigma^2 terms, plus the change of every kept
    # F_n (at most 2 x the neglected sum pi_k |fbar_k|: the missing tail and the shift of E f), plus the
    # renormalisation of pi.
    log_mass, log_absf, log_tail_S2 = _tail_bound(float(lpi[K]), r, K, A, B)
    log_S1 = float(logsumexp(logF - lpiK))  # log sum |F_n| / pi_n
    # all ratios in logs: with a vanishing E[Q] both sigma^2 and the tails are astronomically small
    bound = (
        math.exp(min(log_tail_S2 - log_S2, 0.0))
        + 4 * math.exp(min(log_absf + log_S1 - log_S2, 0.0))
        + 2 * math.exp(log_mass)
    )
    return _Analysis(mean, log_mean, var, math.exp(log_sigma2), log_sigma2, cross_arr, cross_ab, K + 1, bound)


def mmc_time_average_variance(
    lam: float, mu: float, c: int, f: str = "queue", theta: float = 0.0, tol: float = 1e-14
) -> float:
    """Asymptotic variance sigma^2 of the time average of f(N(t)) for M/M/c (theta = 0) or M/M/c+M.

    N(t) is the number in system; births at ``lam`` per second, deaths at n ``mu`` (n <= c) and
    c ``mu`` + (n - c) ``theta`` (n > c). ``f``: "queue" (waiting, max(N - c, 0)), "busy" (busy
    servers, min(N, c)) or "in_system" (N). sqrt(T) (avg_T f - E f) -> Normal(0, sigma^2) as the run
    length T (seconds) grows, so Var(avg_T f) ~ sigma^2 / T; sigma^2 is in units of f^2 * seconds.
    Exact up to a truncation of the state space whose relative error is bounded by ``tol``.
    """
    lam, mu, c, theta = _validate("mmc_time_average_variance", lam, mu, c, theta)
    f = _check_f("mmc_time_average_variance: f", f)
    tol = _check_open01("mmc_time_average_variance: tol", tol)
    return _analyse(lam, mu, c, theta, f, tol).sigma2


def _rel_var_rate(a: _Analysis, lam: float, theta: float, metric: str, estimator: str) -> float:
    """T * Var(estimate) / exact^2 in the long run (per second of simulated time)."""
    # log-space for the ratio sigma^2 / E[Q]^2 so that a vanishing queue does not give 0 / 0
    x = a.log_sigma2 - 2 * a.log_mean
    if x > 700 or a.log_mean < -300:  # E[Q] is astronomically small: no run length will estimate it
        return math.inf
    base = math.exp(x)
    if estimator == "time":
        return base
    if estimator != "customer":
        raise ValueError(f"estimator {estimator!r}: expected one of {ESTIMATORS}")
    # Per-customer ratios est = X(T) / A(T), with A(T) the arrivals (a Poisson martingale, <M_A> = lam).
    # Linearising around (E X T, lam T) with the martingale covariances of the module docstring.
    cross_a = a.cross_arrivals / (lam * a.mean)
    if metric == "wait":  # sum of waits ~ int Q dt (Little, sample path)
        return base - 2 * cross_a + 1.0 / lam
    # abandonments D(T) = theta int Q dt + M_ab, <M_ab> = theta E[Q]
    return base + 2 * a.cross_abandon / (theta * a.mean**2) + 1.0 / (theta * a.mean) - 2 * cross_a + 1.0 / lam


def _customers(name: str, customers: float) -> float:
    return _rate(name, customers)


def mmc_mean_wait_relative_sd(
    lam: float, mu: float, c: int, customers: float, theta: float = 0.0, *, estimator: str = "time"
) -> float:
    """Relative standard deviation of the mean-wait estimate of a run of ``customers`` arrivals.

    The run lasts T = customers / lam seconds. ``estimator="time"``: mean wait = time-average queue /
    lam (Little's law with the known lam), so the relative sd is sqrt(sigma^2_queue / T) / E[Q].
    ``estimator="customer"``: the average of the customers' own waits (what a simulator reports; with
    abandonment the abandoning customers' waits count, so the exact value is still E[Q] / lam). By the
    sample-path Little's law it equals int_0^T Q dt / A(T) up to O(1 / T), A(T) the number of
    arrivals, and linearising the ratio gives the relative asymptotic variance rate
    sigma^2_Q / E[Q]^2 - 2 C_QA / (lam E[Q]) + 1 / lam, where C_QA = lim Cov(int Q dt, A(T)) / T
    = -sum_n F_n from the Poisson equation. So the two are equal only to first order in those
    corrections: at M/M/100, load 0.9, the per-customer variance is 1.4% smaller (sd 0.7%); at small
    c the gap is larger (M/M/10+M, lam = 10, theta = 0.5: 16%). ``run_length_report`` shows both.

    Both values are asymptotic (long-run) standard deviations, the normal approximation's scale: they
    are accurate when the run is long against the queue's integrated autocorrelation time
    (``RunLengthReport.tau_int``) and start-up bias is removed (a warm-up or a stationary start).
    """
    fn = "mmc_mean_wait_relative_sd"
    lam, mu, c, theta = _validate(fn, lam, mu, c, theta)
    customers = _customers(f"{fn}: customers", customers)
    estimator = _check_estimator(f"{fn}: estimator", estimator)
    a = _analyse(lam, mu, c, theta, "queue", 1e-14)
    return math.sqrt(_rel_var_rate(a, lam, theta, "wait", estimator) * lam / customers)


def erlang_a_abandon_relative_sd(
    lam: float, mu: float, c: int, theta: float, customers: float, *, estimator: str = "time"
) -> float:
    """Relative standard deviation of the P(abandon) estimate of an Erlang A run of ``customers``.

    P(abandon) = theta E[Q] / lam. ``estimator="time"``: theta x time-average queue / lam, whose
    relative sd equals the mean wait's. ``estimator="customer"``: abandonments / arrivals; the
    abandonment count adds its own Poisson-like noise (<M_ab> = theta E[Q]) and its covariance with
    the queue, both exact here. Asymptotic values, as in :func:`mmc_mean_wait_relative_sd`.
    """
    fn = "erlang_a_abandon_relative_sd"
    lam = _rate(f"{fn}: lam", lam)
    theta = _rate(f"{fn}: theta", theta)
    lam, mu, c, theta = _validate(fn, lam, mu, c, theta)
    customers = _customers(f"{fn}: customers", customers)
    estimator = _check_estimator(f"{fn}: estimator", estimator)
    a = _analyse(lam, mu, c, theta, "queue", 1e-14)
    return math.sqrt(_rel_var_rate(a, lam, theta, "abandon", estimator) * lam / customers)


def _z(confidence: float) -> float:
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def _needed(fn: str, rel_var_per_customer: float, z2: float, mean_queue_log: float) -> int:
    n = rel_var_per_customer * z2
    if not math.isfinite(n):
        raise ScenarioError(
            f"{fn}: no finite number of customers is enough: E[Q] = exp({mean_queue_log:.6g}) is practically 0 "
            "(the queue is almost never non-empty at this load)"
        )
    return max(1, math.ceil(n))


def customers_for_precision(
    lam: float,
    mu: float,
    c: int,
    rel_halfwidth: float,
    confidence: float = 0.95,
    theta: float = 0.0,
    *,
    metric: str = "wait",
    estimator: str = "time",
) -> int:
    """Customers a run needs so that its estimate is within +-``rel_halfwidth`` (relative) of the
    exact value with probability ``confidence`` (normal approximation, asymptotic variance):
    ceil((z rsd_1 / rel_halfwidth)^2) with rsd_1 the relative sd per customer^(1/2).
    ``metric``: "wait" (mean wait) or "abandon" (P(abandon); needs theta > 0)."""
    fn = "customers_for_precision"
    lam, mu, c, theta = _validate(fn, lam, mu, c, theta)
    rel_halfwidth = _rate(f"{fn}: rel_halfwidth", rel_halfwidth)
    confidence = _check_open01(f"{fn}: confidence", confidence)
    estimator = _check_estimator(f"{fn}: estimator", estimator)
    if metric not in ("wait", "abandon"):
        raise ScenarioError(f"{fn}: metric: expected 'wait' or 'abandon', got {metric!r}")
    if metric == "abandon" and theta == 0:
        raise ScenarioError(f"{fn}: metric 'abandon' needs theta > 0, got theta = {theta!r}")
    a = _analyse(lam, mu, c, theta, "queue", 1e-14)
    rate = _rel_var_rate(a, lam, theta, metric, estimator) * lam  # relative variance x customers
    return _needed(fn, rate, (_z(confidence) / rel_halfwidth) ** 2, a.log_mean)


@dataclass(frozen=True)
class RunLengthReport:
    """Run-length summary of one M/M/c(+M) configuration for a run of ``customers`` arrivals.

    Times in seconds. ``rel_sd_*``: relative standard deviation of the estimate (``_time``: from the
    time-average queue and the known lam; ``_customer``: per-customer averages and counts);
    ``p_within``: probability (normal approximation) that one run's per-customer mean wait is within
    +-``rel_halfwidth`` of the exact value; ``customers_needed``: customers for that with probability
    ``confidence`` (per-customer estimator); ``tau_int``: integrated autocorrelation time of the
    queue, sigma^2 / (2 Var Q) (a run should be many of these long). Abandonment fields are NaN for
    theta = 0.
    """

    lam: float
    mu: float
    c: int
    theta: float
    customers: float
    run_time: float  # customers / lam
    mean_queue: float
    mean_wait: float
    sigma2_queue: float  # asymptotic variance of the time-average queue (customers^2 * s)
    tau_int: float
    rel_sd_wait_time: float
    rel_sd_wait_customer: float
    rel_halfwidth: float
    confidence: float
    p_within: float
    customers_needed: int
    p_abandon: float
    rel_sd_abandon_time: float
    rel_sd_abandon_customer: float
    p_within_abandon: float
    customers_needed_abandon: float

    def to_dict(self) -> dict:
        return asdict(self)

    def to_frame(self) -> pd.DataFrame:
        """One-row DataFrame of the inputs and results."""
        return pd.DataFrame([self.to_dict()])


def _p_within(rel_sd: float, h: float) -> float:
    return math.erf(h / (rel_sd * math.sqrt(2.0))) if rel_sd > 0 else 1.0


def run_length_report(
    lam: float,
    mu: float,
    c: int,
    customers: float,
    theta: float = 0.0,
    rel_halfwidth: float = 0.03,
    confidence: float = 0.95,
) -> RunLengthReport:
    """All run-length numbers of one configuration (see :class:`RunLengthReport`)."""
    fn = "run_length_report"
    lam, mu, c, theta = _validate(fn, lam, mu, c, theta)
    customers = _customers(f"{fn}: customers", customers)
    rel_halfwidth = _rate(f"{fn}: rel_halfwidth", rel_halfwidth)
    confidence = _check_open01(f"{fn}: confidence", confidence)
    a = _analyse(lam, mu, c, theta, "queue", 1e-14)
    z2 = (_z(confidence) / rel_halfwidth) ** 2

    def rsd(metric: str, est: str) -> float:
        return math.sqrt(_rel_var_rate(a, lam, theta, metric, est) * lam / customers)

    def need(metric: str) -> int:
        return _needed(fn, _rel_var_rate(a, lam, theta, metric, "customer") * lam, z2, a.log_mean)

    rw_c = rsd("wait", "customer")
    nan = math.nan
    if theta > 0:
        ra_t, ra_c = rsd("abandon", "time"), rsd("abandon", "customer")
        ab = (theta * a.mean / lam, ra_t, ra_c, _p_within(ra_c, rel_halfwidth), float(need("abandon")))
    else:
        ab = (0.0, nan, nan, nan, nan)
    return RunLengthReport(
        lam, mu, c, theta, customers, customers / lam,
        mean_queue=a.mean,
        mean_wait=a.mean / lam,
        sigma2_queue=a.sigma2,
        tau_int=a.sigma2 / (2 * a.var) if a.var > 0 else 0.0,
        rel_sd_wait_time=rsd("wait", "time"),
        rel_sd_wait_customer=rw_c,
        rel_halfwidth=rel_halfwidth,
        confidence=confidence,
        p_within=_p_within(rw_c, rel_halfwidth),
        customers_needed=need("wait"),
        p_abandon=ab[0],
        rel_sd_abandon_time=ab[1],
        rel_sd_abandon_customer=ab[2],
        p_within_abandon=ab[3],
        customers_needed_abandon=ab[4],
    )
