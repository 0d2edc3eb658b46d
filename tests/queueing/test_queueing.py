"""Closed-form queues checked against published values, independent implementations and identities."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import poisson

from fluidopt.core.errors import ScenarioError
from fluidopt.queueing import (
    erlang_a,
    erlang_b,
    erlang_c,
    mmc_mean_wait,
    mmc_metrics,
    mmc_staffing,
    mmc_wait_tail,
    mmck_metrics,
)

# --- independent reference implementations ---------------------------------------------------


def erlang_b_exact(c: int, a: int) -> float:
    """Erlang B from its definition in exact rational arithmetic (small c, integer load)."""
    terms = [Fraction(a**k, math.factorial(k)) for k in range(c + 1)]
    return float(terms[-1] / sum(terms))


def erlang_b_poisson(c: int, a: float) -> float:
    """Erlang B = P(Poisson(a) = c) / P(Poisson(a) <= c), in logs (scipy)."""
    return math.exp(poisson.logpmf(c, a) - poisson.logcdf(c, a))


def erlang_c_poisson(c: int, a: float) -> float:
    """Erlang C from Poisson terms: pmf(c) c/(c-a) / (cdf(c-1) + pmf(c) c/(c-a)), in logs."""
    lt = poisson.logpmf(c, a) + math.log(c / (c - a))
    lh = poisson.logcdf(c - 1, a)
    return math.exp(lt - np.logaddexp(lt, lh))


def ctmc_birth_death(lam: float, mu: float, c: int, theta: float, N: int) -> np.ndarray:
    """Stationary law of the truncated CTMC (states 0..N) by a direct linear solve of pi Q = 0."""
    Q = np.zeros((N + 1, N + 1))
    for n in range(N + 1):
        if n < N:
            Q[n, n + 1] = lam
        if n > 0:
            Q[n, n - 1] = min(n, c) * mu + max(n - c, 0) * theta
        Q[n, n] = -Q[n].sum()
    A = Q.T.copy()
    A[-1, :] = 1.0
    b = np.zeros(N + 1)
    b[-1] = 1.0
    return np.linalg.solve(A, b)


# --- Erlang B / C ---------------------------------------------------------------------------------


def test_erlang_b_published_and_exact():
    # Classic table values; each also computed exactly (rationals) and via Poisson terms.
    assert erlang_b(10, 5) == pytest.approx(0.018385, abs=5e-7)
    assert erlang_b(5, 2) == pytest.approx(0.036697, abs=5e-7)
    for c, a in [(1, 1), (5, 2), (10, 5), (20, 15), (30, 30)]:
        assert erlang_b(c, a) == pytest.approx(erlang_b_exact(c, a), rel=1e-12)
        assert erlang_b(c, a) == pytest.approx(erlang_b_poisson(c, a), rel=1e-10)
    assert erlang_b(0, 3.0) == 1.0
    assert erlang_b(4, 0.0) == 0.0


def test_erlang_c_published_value():
    # c = 10 servers, a = 8 erlangs: P(wait) = 0.4092 (standard Erlang C table).
    assert erlang_c(10, 8) == pytest.approx(0.4092, abs=5e-5)
    assert erlang_c(10, 8) == pytest.approx(erlang_c_poisson(10, 8), rel=1e-12)
    # M/M/1: P(wait) = rho.
    assert erlang_c(1, 0.3) == pytest.approx(0.3, rel=1e-14)
    assert erlang_c(5, 5.0) == 1.0 and erlang_c(5, 7.0) == 1.0


@pytest.mark.parametrize("c", [100, 1000, 10_000])
@pytest.mark.parametrize("load", [0.5, 0.9, 0.99])
def test_erlang_large_c_is_stable(c, load):
    a = load * c
    b, pc = erlang_b(c, a), erlang_c(c, a)
    assert 0 <= b <= pc <= 1
    assert b == pytest.approx(erlang_b_poisson(c, a), rel=1e-9)
    assert pc == pytest.approx(erlang_c_poisson(c, a), rel=1e-9)


def test_mmc_metrics_identities():
    m = mmc_metrics(8.0, 1.0, 10)
    assert m.p_wait == pytest.approx(erlang_c(10, 8))
    assert m.mean_wait == pytest.approx(m.p_wait / (10 - 8))
    assert m.mean_queue == pytest.approx(8.0 * m.mean_wait)  # Little
    assert m.mean_in_system == pytest.approx(m.mean_queue + 8.0)
    assert m.mean_response == pytest.approx(m.mean_wait + 1.0)
    assert mmc_mean_wait(8.0, 1.0, 10) == m.mean_wait
    # M/M/1 closed form: Wq = rho / (mu - lam)
    assert mmc_mean_wait(0.6, 1.0, 1) == pytest.approx(0.6 / 0.4)
    # Wait tail: P(W > 0) = P(wait); integrates to the mean wait.
    assert mmc_wait_tail(8.0, 1.0, 10, 0.0) == pytest.approx(m.p_wait)
    assert mmc_wait_tail(8.0, 1.0, 10, 1.0) == pytest.approx(m.p_wait * math.exp(-2.0))
    frame = m.to_frame()
    assert list(frame["p_wait"]) == [m.p_wait]


def test_mmc_unstable_reports_infinity():
    m = mmc_metrics(10.0, 1.0, 10)
    assert m.p_wait == 1.0 and math.isinf(m.mean_wait) and math.isinf(m.mean_queue)


@pytest.mark.parametrize("lam,mu,target", [(8.0, 1.0, 0.2), (950.0, 0.5, 0.05), (10_000.0, 1.0, 0.01)])
def test_mmc_staffing_is_minimal(lam, mu, target):
    c = mmc_staffing(lam, mu, max_p_wait=target)
    a = lam / mu
    assert erlang_c(c, a) <= target < erlang_c(c - 1, a)


def test_mmc_staffing_mean_wait_target():
    c = mmc_staffing(100.0, 1.0, max_mean_wait=0.01)
    assert mmc_mean_wait(100.0, 1.0, c) <= 0.01 < mmc_mean_wait(100.0, 1.0, c - 1)


# --- M/M/c/K --------------------------------------------------------------------------------------


def test_mmck_loss_system_is_erlang_b():
    m = mmck_metrics(5.0, 1.0, 10, 10)
    assert m.p_block == pytest.approx(erlang_b(10, 5.0), rel=1e-12)
    assert m.mean_queue == 0 and m.p_wait == 0


@pytest.mark.parametrize("lam,mu,c,K", [(3.0, 1.0, 4, 9), (12.0, 2.0, 5, 30), (9.0, 1.0, 3, 6)])
def test_mmck_matches_ctmc_solve(lam, mu, c, K):
    pi = ctmc_birth_death(lam, mu, c, 0.0, K)
    n = np.arange(K + 1)
    m = mmck_metrics(lam, mu, c, K)
    assert m.p_block == pytest.approx(pi[-1], rel=1e-9)
    assert m.mean_queue == pytest.approx(float(np.maximum(n - c, 0) @ pi), rel=1e-9)
    assert m.mean_in_system == pytest.approx(float(n @ pi), rel=1e-9)
    # flow balance: admitted rate = mean busy servers * mu
    assert lam * (1 - m.p_block) == pytest.approx(m.utilisation * c * mu, rel=1e-9)


def test_mmck_large_k_tends_to_mmc():
    m, ref = mmck_metrics(8.0, 1.0, 10, 400), mmc_metrics(8.0, 1.0, 10)
    assert m.mean_queue == pytest.approx(ref.mean_queue, rel=1e-9)
    assert m.p_wait == pytest.approx(ref.p_wait, rel=1e-9)


# --- Erlang A -------------------------------------------------------------------------------------


def test_erlang_a_small_theta_is_erlang_c():
    e, ref = erlang_a(8.0, 1.0, 10, 1e-7), mmc_metrics(8.0, 1.0, 10)
    assert e.p_wait == pytest.approx(ref.p_wait, rel=1e-5)
    assert e.mean_queue == pytest.approx(ref.mean_queue, rel=1e-5)
    assert e.p_abandon == pytest.approx(1e-7 * ref.mean_queue / 8.0, rel=1e-4)
    zero = erlang_a(8.0, 1.0, 10, 0.0)
    assert zero.p_wait == ref.p_wait and zero.p_abandon == 0.0


@pytest.mark.parametrize(
    "lam,mu,c,theta", [(7.0, 1.0, 5, 0.3), (20.0, 2.0, 8, 1.5), (3.0, 1.0, 4, 0.05), (50.0, 1.0, 30, 2.0)]
)
@pytest.mark.integration
def test_erlang_a_matches_ctmc_solve(lam, mu, c, theta):
    e = erlang_a(lam, mu, c, theta)
    N = c + 400  # generous truncation for the dense solve
    pi = ctmc_birth_death(lam, mu, c, theta, N)
    n = np.arange(N + 1)
    eq = float(np.maximum(n - c, 0) @ pi)
    assert e.p_wait == pytest.approx(pi[c:].sum(), rel=1e-9)
    assert e.mean_queue == pytest.approx(eq, rel=1e-9)
    # identities: abandonment flow, Little, and flow balance (served rate = busy servers * mu)
    assert e.p_abandon == pytest.approx(theta * e.mean_queue / lam, rel=1e-12)
    assert e.mean_wait == pytest.approx(e.mean_queue / lam, rel=1e-12)
    busy = float(np.minimum(n, c) @ pi)
    assert lam * (1 - e.p_abandon) == pytest.approx(busy * mu, rel=1e-9)
    assert e.utilisation == pytest.approx(busy / c, rel=1e-9)


def test_erlang_a_theta_equal_mu_is_poisson():
    # With theta = mu every customer in system leaves at rate mu: N ~ Poisson(lam / mu) (M/M/inf).
    lam, mu, c = 12.0, 1.5, 9
    e = erlang_a(lam, mu, c, mu)
    a = lam / mu
    assert e.p_wait == pytest.approx(poisson.sf(c - 1, a), rel=1e-10)
    n = np.arange(0, 200)
    assert e.mean_queue == pytest.approx(float(np.maximum(n - c, 0) @ poisson.pmf(n, a)), rel=1e-10)


def test_erlang_a_impatient_limit_is_erlang_b():
    # theta -> inf: whoever would wait abandons at once, so P(abandon) -> Erlang B.
    e = erlang_a(8.0, 1.0, 10, 1e7)
    assert e.p_abandon == pytest.approx(erlang_b(10, 8.0), rel=1e-5)


def test_erlang_a_overloaded_and_large():
    # Overload is stable with abandonment: throughput = c mu at most, the rest abandons.
    e = erlang_a(15.0, 1.0, 10, 0.5)
    assert 1 - 10 / 15 < e.p_abandon < 1
    big = erlang_a(9_900.0, 1.0, 10_000, 0.1)
    assert 0 < big.p_wait < 1
    assert 9_900.0 * (1 - big.p_abandon) == pytest.approx(big.utilisation * 10_000, rel=1e-9)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: erlang_b(-1, 2.0), "erlang_b: c"),
        (lambda: erlang_c(10, -1.0), "erlang_c: a"),
        (lambda: mmc_metrics(1.0, 0.0, 3), "mmc_metrics: mu"),
        (lambda: erlang_a(1.0, 1.0, 3, float("nan")), "erlang_a: theta"),
        (lambda: mmck_metrics(1.0, 1.0, 3, 2), "mmck_metrics: K"),
        (lambda: mmc_staffing(1.0, 1.0), "max_p_wait"),
    ],
)
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(ScenarioError, match=match):
        call()
