"""The run-length report (fluidopt.queueing.runlength.run_length_report) says the same numbers as the
module's single-purpose functions, and the M/M/1 closed forms (docs/run-length.md): mutation survivors of
issue 35 (a report field dropped or computed for the wrong estimator or parameter)."""

from __future__ import annotations

import math

import pytest

from fluidopt.queueing.runlength import (
    customers_for_precision,
    erlang_a_abandon_relative_sd,
    mmc_mean_wait_relative_sd,
    mmc_time_average_variance,
    run_length_report,
)


@pytest.mark.parametrize("theta", [0.0, 0.5])
def test_report_fields_agree_with_the_functions(theta):
    lam, mu, c, n = 8.0, 1.0, 10, 50_000.0
    r = run_length_report(lam, mu, c, n, theta=theta, rel_halfwidth=0.05, confidence=0.9)
    assert (r.lam, r.mu, r.c, r.theta, r.customers) == (lam, mu, c, theta, n)
    assert r.run_time == pytest.approx(n / lam)
    assert r.rel_sd_wait_time == pytest.approx(mmc_mean_wait_relative_sd(lam, mu, c, n, theta, estimator="time"),
                                               rel=1e-12)
    assert r.rel_sd_wait_customer == pytest.approx(
        mmc_mean_wait_relative_sd(lam, mu, c, n, theta, estimator="customer"), rel=1e-12)
    assert r.rel_sd_wait_customer != pytest.approx(r.rel_sd_wait_time, rel=1e-6)
    assert r.customers_needed == customers_for_precision(lam, mu, c, 0.05, 0.9, theta=theta, metric="wait",
                                                         estimator="customer")
    assert r.p_within == pytest.approx(math.erf(0.05 / (r.rel_sd_wait_customer * math.sqrt(2))), rel=1e-12)
    assert r.sigma2_queue == pytest.approx(mmc_time_average_variance(lam, mu, c, "queue", theta), rel=1e-12)
    assert r.mean_wait == pytest.approx(r.mean_queue / lam)
    if theta == 0:
        assert r.p_abandon == 0.0 and math.isnan(r.rel_sd_abandon_time) and math.isnan(r.customers_needed_abandon)
    else:
        assert r.p_abandon == pytest.approx(theta * r.mean_queue / lam)
        assert r.rel_sd_abandon_time == pytest.approx(erlang_a_abandon_relative_sd(lam, mu, c, theta, n), rel=1e-12)
        assert r.rel_sd_abandon_customer == pytest.approx(
            erlang_a_abandon_relative_sd(lam, mu, c, theta, n, estimator="customer"), rel=1e-12)
        assert r.customers_needed_abandon == customers_for_precision(lam, mu, c, 0.05, 0.9, theta=theta,
                                                                     metric="abandon", estimator="customer")
    assert r.to_frame().iloc[0]["theta"] == theta


def test_mm1_queue_length_variance_closed_form():
    """M/M/1: the asymptotic variance of the time-average number in system is 2 rho (1 + rho) / (mu (1 - rho)^4)."""
    for rho in (0.3, 0.8):
        assert mmc_time_average_variance(rho, 1.0, 1, "in_system") == pytest.approx(
            2 * rho * (1 + rho) / (1 - rho) ** 4, rel=1e-9)
