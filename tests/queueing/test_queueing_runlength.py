"""Asymptotic variances of M/M/c(+M) time averages: closed forms, an independent dense Poisson-equation
solve, a seeded birth-death chain simulation, and input validation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fluidopt.core.errors import ScenarioError
from fluidopt.queueing import erlang_a
from fluidopt.queueing.runlength import (
    RunLengthReport,
    _analyse,
    customers_for_precision,
    erlang_a_abandon_relative_sd,
    mmc_mean_wait_relative_sd,
    mmc_time_average_variance,
    run_length_report,
)

# --- closed forms -----------------------------------------------------------------------------


@pytest.mark.parametrize("rho", [0.1, 0.5, 0.8, 0.9, 0.95])
@pytest.mark.parametrize("mu", [1.0, 2.5])
def test_mm1_closed_forms(rho: float, mu: float) -> None:
    lam = rho * mu
    # Number in system (Whitt, "Planning queueing simulations", Management Sci. 35 (1989)):
    # 2 rho (1 + rho) / (mu (1 - rho)^4).
    n_exact = 2 * rho * (1 + rho) / (mu * (1 - rho) ** 4)
    assert mmc_time_average_variance(lam, mu, 1, "in_system") == pytest.approx(n_exact, rel=1e-10)
    # Busy indicator: an alternating renewal process (idle Exp(lam), busy period B with E B^2 =
    # 2 / (mu^2 (1 - rho)^3)); renewal-reward gives Var((1 - rho) B - rho I) / E[cycle] = 2 rho / mu.
    assert mmc_time_average_variance(lam, mu, 1, "busy") == pytest.approx(2 * rho / mu, rel=1e-10)
    # Queue = N - busy (worked out from the same sums by hand):
    q_exact = 2 * rho**2 * (1 + 4 * rho - 4 * rho**2 + rho**3) / (mu * (1 - rho) ** 4)
    assert mmc_time_average_variance(lam, mu, 1, "queue") == pytest.approx(q_exact, rel=1e-10)


def test_infinite_server_limits() -> None:
    # M/M/inf: N is Poisson(a) with autocovariance a exp(-mu t), so sigma^2 = 2 a / mu.
    lam, mu = 20.0, 1.0
    for f in ("in_system", "busy"):  # c = 200 servers at a = 20: P(N >= c) ~ 1e-120
        assert mmc_time_average_variance(lam, mu, 200, f) == pytest.approx(2 * lam / mu**2, rel=1e-8)
    # Erlang A with theta = mu is M/M/inf exactly, whatever c and the load (here overloaded: lam > c mu).
    lam, mu, c = 30.0, 1.5, 5
    assert mmc_time_average_variance(lam, mu, c, "in_system", theta=mu) == pytest.approx(
        2 * lam / mu**2, rel=1e-10
    )


@pytest.mark.parametrize(("lam", "c", "theta"), [(90.0, 100, 0.0), (0.5, 3, 0.0), (995.0, 1_000, 0.0),
                                              (90.0, 100, 0.5), (12.0, 10, 0.3), (5_200.0, 5_000, 2.0)])
def test_flow_conservation(lam: float, c: int, theta: float) -> None:
    # Departures D(T) = A(T) - N(T) + N(0); services and abandonments are counted by their
    # compensators mu int busy dt and theta int Q dt up to martingales orthogonal to the arrivals'
    # (no common jumps), each with quadratic variation ~ its count. Hence
    # Var(mu int busy + theta int Q) ~ Var(A) + Var(M_services) + Var(M_abandons) = 2 lam T:
    # sigma^2 of mu busy + theta queue is exactly 2 lam. With busy + queue = N, the cross-variance
    # is (sigma^2_N - sigma^2_busy - sigma^2_queue) / 2. (theta = 0: sigma^2_busy = 2 lam / mu^2.)
    mu = 1.0
    sb, sq, sn = (mmc_time_average_variance(lam, mu, c, f, theta) for f in ("busy", "queue", "in_system"))
    cross = (sn - sb - sq) / 2
    assert mu**2 * sb + theta**2 * sq + 2 * mu * theta * cross == pytest.approx(2 * lam, rel=1e-9)


def test_time_rescaling() -> None:
    # Speeding every rate up by k shrinks the time constants by k: sigma^2 / k; the relative sd of a
    # run of a given number of customers does not change.
    for theta in (0.0, 0.3):
        s1 = mmc_time_average_variance(9.0, 1.0, 10, "queue", theta=theta)
        s4 = mmc_time_average_variance(36.0, 4.0, 10, "queue", theta=4 * theta)
        assert s4 == pytest.approx(s1 / 4, rel=1e-12)
        for est in ("time", "customer"):
            r1 = mmc_mean_wait_relative_sd(9.0, 1.0, 10, 1e5, theta, estimator=est)
            r4 = mmc_mean_wait_relative_sd(36.0, 4.0, 10, 1e5, 4 * theta, estimator=est)
            assert r4 == pytest.approx(r1, rel=1e-12)


# --- an independent implementation: dense Poisson equation --------------------------------------


def dense_constants(lam: float, mu: float, c: int, theta: float, f: str, K: int) -> tuple[float, float, float]:
    """sigma^2, lim Cov(int fbar, A)/T and lim Cov(int fbar, D - theta int Q)/T from the generator
    matrix of the chain truncated at K (births blocked), solving Q g = -fbar with pi g = 0 densely."""
    n = np.arange(K + 1)
    death = np.where(n <= c, n * mu, c * mu + (n - c) * theta)
    Q = np.zeros((K + 1, K + 1))
    Q[n[:-1], n[:-1] + 1] = lam
    Q[n[1:], n[1:] - 1] = death[1:]
    Q[n, n] = -Q.sum(axis=1)
    # pi: left null vector, normalised (least squares on [Q^T; 1])
    A = np.vstack([Q.T, np.ones(K + 1)])
    pi = np.linalg.lstsq(A, np.r_[np.zeros(K + 1), 1.0], rcond=None)[0]
    fv = {"queue": np.maximum(n - c, 0), "busy": np.minimum(n, c), "in_system": n}[f].astype(float)
    fbar = fv - pi @ fv
    g = np.linalg.lstsq(np.vstack([Q, pi]), np.r_[-fbar, 0.0], rcond=None)[0]
    sigma2 = 2 * pi @ (fbar * g)
    dg = np.diff(g)  # g_{n+1} - g_n
    cross_a = lam * pi[:-1] @ dg  # arrivals move g up by dg_n
    cross_ab = float(np.sum(pi[1:] * theta * np.maximum(n[1:] - c, 0) * (-dg)))  # abandonment n -> n-1
    return float(sigma2), float(cross_a), cross_ab


@pytest.mark.integration
@pytest.mark.parametrize("theta", [0.0, 0.7])
@pytest.mark.parametrize("f", ["queue", "busy", "in_system"])
def test_dense_poisson_equation(theta: float, f: str) -> None:
    lam, mu, c = 2.4, 1.0, 3  # load 0.8; at K = 200 the neglected mass is below 1e-19
    s2, ca, cab = dense_constants(lam, mu, c, theta, f, K=200)
    a = _analyse(lam, mu, c, theta, f, 1e-14)
    assert a.sigma2 == pytest.approx(s2, rel=1e-8)
    assert a.cross_arrivals == pytest.approx(ca, rel=1e-8)
    if theta > 0 and f == "queue":
        assert a.cross_abandon == pytest.approx(cab, rel=1e-8)


def test_means_match_queueing_and_large_c() -> None:
    for lam, mu, c, theta in [(90.0, 1.0, 100, 0.0), (90.0, 1.0, 100, 0.5), (110.0, 1.0, 100, 0.2),
                              (9_900.0, 1.0, 10_000, 0.0), (9_000.0, 1.0, 10_000, 0.0)]:
        ex = erlang_a(lam, mu, c, theta)
        rep = run_length_report(lam, mu, c, 1e6, theta)
        assert rep.mean_queue == pytest.approx(ex.mean_queue, rel=1e-9)
        assert rep.mean_wait == pytest.approx(ex.mean_wait, rel=1e-9)
        if theta:
            assert rep.p_abandon == pytest.approx(ex.p_abandon, rel=1e-9)
    # c = 10,000 at load 0.9: busy servers behave like M/M/inf (sigma^2 = 2 a / mu); E[Q] ~ 2e-24 is
    # still resolved in logs, sigma^2 of the queue too.
    assert mmc_time_average_variance(9_000.0, 1.0, 10_000, "busy") == pytest.approx(18_000.0, rel=1e-9)
    sq = mmc_time_average_variance(9_000.0, 1.0, 10_000, "queue")
    assert 0 < sq < 1e-20
    # Vanishing queue: relative precision is hopeless, said plainly.
    assert mmc_mean_wait_relative_sd(100.0, 1.0, 10_000, 1e6) == math.inf
    with pytest.raises(ScenarioError, match="no finite number of customers is enough"):
        customers_for_precision(100.0, 1.0, 10_000, 0.03)


def test_truncation_tolerance() -> None:
    loose = _analyse(0.99, 1.0, 1, 0.0, "in_system", 1e-4)
    tight = _analyse(0.99, 1.0, 1, 0.0, "in_system", 1e-14)
    assert loose.states < tight.states
    assert loose.rel_error_bound <= 1e-4 and tight.rel_error_bound <= 1e-14
    assert loose.sigma2 == pytest.approx(tight.sigma2, rel=1e-4)
    assert tight.sigma2 == pytest.approx(2 * 0.99 * 1.99 / 0.01**4, rel=1e-10)


# --- the birth-death chain, simulated -----------------------------------------------------------


def simulate_chain(lam: float, mu: float, c: int, theta: float, T: float, reps: int, seed: int):
    """``reps`` independent stationary runs of length T (s), event by event, vectorised over runs.
    Returns per run: time-average queue, arrivals, abandonments."""
    rng = np.random.default_rng(seed)
    nmax = 1_000
    n_ = np.arange(nmax + 1)
    death = np.where(n_ <= c, n_ * mu, c * mu + (n_ - c) * theta)
    p = np.ones(nmax + 1)  # stationary law by products of rate ratios
    for k in range(1, nmax + 1):
        p[k] = p[k - 1] * lam / death[k]
    n = rng.choice(nmax + 1, size=reps, p=p / p.sum())
    rate = lam + death
    t = np.zeros(reps)
    area = np.zeros(reps)
    arrivals = np.zeros(reps)
    abandons = np.zeros(reps)
    active = np.ones(reps, dtype=bool)
    while active.any():
        r = rate[n]
        h = rng.standard_exponential(reps) / r
        u = rng.random(reps) * r
        area += np.where(active, np.maximum(n - c, 0) * np.minimum(h, T - t), 0.0)
        t += h
        ev = active & (t < T)
        birth = ev & (u < lam)
        death_ev = ev & ~birth
        arrivals += birth
        abandons += death_ev & (u >= lam + np.minimum(n, c) * mu)
        n = n + birth - death_ev
        active = ev
    assert n.max() < nmax
    return area / T, arrivals, abandons


def _var_and_se(x: np.ndarray) -> tuple[float, float]:
    d = (x - x.mean()) ** 2
    return float(d.mean() * x.size / (x.size - 1)), float(d.std(ddof=1) / math.sqrt(x.size))


def _cov_and_se(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    d = (x - x.mean()) * (y - y.mean())
    return float(d.mean() * x.size / (x.size - 1)), float(d.std(ddof=1) / math.sqrt(x.size))


def _close(est: float, se: float, exact: float, resolution: float = 0.04) -> None:
    # 3.5 standard errors plus 2% for the O(1/T) finite-run bias must pass; with se <= 4% of the
    # value an error above 16% fails (cross-constants, noisier: resolution 8%, errors above 30% fail).
    assert se <= resolution * abs(exact), (est, se, exact)
    assert abs(est - exact) <= 3.5 * se + 0.02 * abs(exact), (est, se, exact)


@pytest.mark.integration
@pytest.mark.parametrize(("lam", "c", "theta", "seed"), [(8.0, 10, 0.0, 1), (10.0, 10, 0.5, 2)])
def test_simulated_chain_matches(lam: float, c: int, theta: float, seed: int) -> None:
    mu, T, reps = 1.0, 1_000.0, 4_000
    qbar, arr, ab = simulate_chain(lam, mu, c, theta, T, reps, seed)
    a = _analyse(lam, mu, c, theta, "queue", 1e-14)
    # time-average queue: T Var -> sigma^2
    v, se = _var_and_se(qbar)
    _close(T * v, T * se, a.sigma2)
    # queue vs arrivals: T Cov(avg Q, A / T) -> cross constant
    cv, se = _cov_and_se(qbar, arr / T)
    _close(T * cv, T * se, a.cross_arrivals, 0.08)
    # per-customer mean wait, int Q dt / A(T) (sample-path Little): relative variance
    wait = qbar * T / arr
    ew = a.mean / lam
    v, se = _var_and_se(wait / ew)
    pred = mmc_mean_wait_relative_sd(lam, mu, c, lam * T, theta, estimator="customer") ** 2
    _close(v, se, pred)
    if theta > 0:
        cv, se = _cov_and_se(qbar, (ab - theta * qbar * T) / T)
        _close(T * cv, T * se, a.cross_abandon, 0.08)
        pab = theta * a.mean / lam
        v, se = _var_and_se(ab / arr / pab)
        pred_c = erlang_a_abandon_relative_sd(lam, mu, c, theta, lam * T, estimator="customer") ** 2
        pred_t = erlang_a_abandon_relative_sd(lam, mu, c, theta, lam * T, estimator="time") ** 2
        _close(v, se, pred_c)
        # the abandonment count estimator differs from theta x avg Q / lam by more than 20% here,
        # and the simulation sees it
        assert abs(pred_c / pred_t - 1) > 0.2
        assert abs(v - pred_c) < abs(v - pred_t)


# --- run-length answers -------------------------------------------------------------------------


def test_customers_for_precision_is_the_smallest() -> None:
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.975)
    for theta, metric in [(0.0, "wait"), (0.5, "wait"), (0.5, "abandon")]:
        for est in ("time", "customer"):
            n = customers_for_precision(90.0, 1.0, 100, 0.03, 0.95, theta, metric=metric, estimator=est)
            sds = [
                mmc_mean_wait_relative_sd(90.0, 1.0, 100, k, theta, estimator=est)
                if metric == "wait"
                else erlang_a_abandon_relative_sd(90.0, 1.0, 100, theta, k, estimator=est)
                for k in (n, n - 1)
            ]
            assert z * sds[0] <= 0.03 < z * sds[1]
    rep = run_length_report(90.0, 1.0, 100, customers_for_precision(90.0, 1.0, 100, 0.03, estimator="customer"))
    assert rep.p_within == pytest.approx(0.95, abs=1e-6)
    frame = rep.to_frame()
    assert frame.shape[0] == 1 and "rel_sd_wait_customer" in frame.columns
    assert isinstance(rep, RunLengthReport) and math.isnan(rep.rel_sd_abandon_time)


# --- validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: mmc_time_average_variance(-1.0, 1.0, 10), r"mmc_time_average_variance: lam: .*> 0, got -1.0"),
        (lambda: mmc_time_average_variance(1.0, 0.0, 10), r"mu: .*> 0, got 0.0"),
        (lambda: mmc_time_average_variance(1.0, 1.0, 0), r"c: expected an integer >= 1, got 0"),
        (lambda: mmc_time_average_variance(1.0, 1.0, 2.5), r"c: expected an integer >= 1, got 2.5"),
        (lambda: mmc_time_average_variance(1.0, 1.0, 2, theta=-0.1), r"theta: .*>= 0, got -0.1"),
        (lambda: mmc_time_average_variance(1.0, 1.0, 2, f="waiting"), r"f: expected one of queue, busy, in_system, got 'waiting'"),
        (lambda: mmc_time_average_variance(1.0, 1.0, 2, tol=0.0), r"tol: .*> 0, got 0.0"),
        (lambda: mmc_time_average_variance(100.0, 1.0, 100), r"lam = 100.0 >= c \* mu = 100.0: the M/M/c queue is unstable"),
        (lambda: mmc_mean_wait_relative_sd(9.0, 1.0, 10, 0), r"customers: .*> 0, got 0.0"),
        (lambda: mmc_mean_wait_relative_sd(9.0, 1.0, 10, 1e5, estimator="batch"), r"estimator: expected one of time, customer, got 'batch'"),
        (lambda: erlang_a_abandon_relative_sd(9.0, 1.0, 10, 0.0, 1e5), r"erlang_a_abandon_relative_sd: theta: .*> 0, got 0.0"),
        (lambda: customers_for_precision(9.0, 1.0, 10, 0.0), r"rel_halfwidth: .*> 0, got 0.0"),
        (lambda: customers_for_precision(9.0, 1.0, 10, 0.03, confidence=1.0), r"confidence: expected a number in \(0, 1\), got 1.0"),
        (lambda: customers_for_precision(9.0, 1.0, 10, 0.03, metric="abandon"), r"metric 'abandon' needs theta > 0"),
        (lambda: customers_for_precision(9.0, 1.0, 10, 0.03, metric="queue"), r"metric: expected 'wait' or 'abandon', got 'queue'"),
        (lambda: run_length_report(9.0, 1.0, 10, "many"), r"customers: expected a number, got 'many'"),
    ],
)
def test_validation(call, match: str) -> None:
    with pytest.raises(ScenarioError, match=match):
        call()
