"""The run-length report (fluidopt.queueing.runlength.run_length_report) says the same numbers as the
module's single-purpose functions, and the M/M/1 closed forms (docs/run-length.md): mutation survivors of
issue 35 (a report field dropped or computed for the wrong estimator or parameter)."""

from __future__ import annotations

import math

import pytest

from fluidopt.core.errors import ScenarioError
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


def _simulate_abandon_share(lam, mu, c, theta, n, reps, seed):
    """Per-customer P(abandon) estimates of ``reps`` independent M/M/c+M runs of ``n`` arrivals each,
    started in the stationary law: uniformised birth-death chains stepped together (numpy)."""
    import numpy as np

    cap = c + 60  # the queue never gets near this at the loads used (checked below)
    rates = [lam + min(k, c) * mu + max(k - c, 0) * theta for k in range(cap + 1)]
    big = max(rates)
    pi = [1.0]
    for k in range(1, cap + 1):
        pi.append(pi[-1] * lam / (min(k, c) * mu + max(k - c, 0) * theta))
    pi = np.array(pi) / sum(pi)
    rng = np.random.default_rng(seed)
    N = rng.choice(cap + 1, size=reps, p=pi)
    arrivals = np.zeros(reps, int)
    abandons = np.zeros(reps, int)
    # the event thresholds of each state, lam + serv and lam + serv + aban, summed in that order once per
    # state (the same doubles as summing them at every step: the sample paths are bit for bit the same)
    k = np.arange(cap + 1)
    to_serv = lam + np.minimum(k, c) * mu
    to_aban = to_serv + np.maximum(k - c, 0) * theta
    live = arrivals < n
    while live.any():
        u = rng.random(reps) * big
        serv = to_serv[N]
        arr = (u < lam) & live
        dep = (u < serv) & live & ~arr  # lam <= u < lam + serv
        ab = (u >= serv) & (u < to_aban[N]) & live
        arrivals += arr
        abandons += ab
        N = N + arr - dep - ab
        assert N.max() < cap
        live = arrivals < n
    return abandons / n


@pytest.mark.parametrize("lam,c,theta", [(2.0, 1, 1.0), (6.0, 4, 2.0)])
def test_abandonment_estimate_spread_matches_a_simulation(lam, c, theta):
    """The relative sd of the per-customer P(abandon) estimate against 400 simulated runs of 2,000
    customers (a second implementation: the chain itself, not the Poisson-equation algebra). The sd of a
    sample sd of 400 is about 3.5%; the tolerance is 12%."""

    n, mu = 2000, 1.0
    est = _simulate_abandon_share(lam, mu, c, theta, n, reps=400, seed=7)
    r = run_length_report(lam, mu, c, n, theta=theta)
    assert float(est.mean()) == pytest.approx(r.p_abandon, rel=0.03)
    assert float(est.std(ddof=1)) / r.p_abandon == pytest.approx(r.rel_sd_abandon_customer, rel=0.12)


def test_the_state_cap_is_the_largest_truncation_allowed(monkeypatch):
    # M/M/1 at load 0.9 to tol 1e-14: the first truncation (1 + 256 states beyond 0) misses the
    # tolerance, the second (513) meets it. A cap of exactly 257 states still allows the doubling
    # that the 257-state truncation asks for; a cap of 256 refuses it, naming the cap.
    import fluidopt.queueing.runlength as runlength

    exact = runlength.mmc_time_average_variance(0.9, 1.0, 1, "queue")
    monkeypatch.setattr(runlength, "_MAX_STATES", 257)
    assert runlength.mmc_time_average_variance(0.9, 1.0, 1, "queue") == exact
    monkeypatch.setattr(runlength, "_MAX_STATES", 256)
    with pytest.raises(ScenarioError, match="more than 256 states needed for tol = 1e-14"):
        runlength.mmc_time_average_variance(0.9, 1.0, 1, "queue")


@pytest.mark.parametrize("lam,c,theta", [(5_000.0, 1_000, 1.0), (300.0, 10, 0.05), (12.0, 10, 2.0), (9.0, 10, 0.5)])
def test_the_first_truncation_of_an_erlang_a_chain_is_already_stable(lam, c, theta):
    # In overload the first truncation leaves room for enough queue states that the death rate
    # c mu + (J + 1) theta exceeds the arrival rate (r < 1 at once: no doubling to get there); at
    # least 256 states in any case.
    from fluidopt.queueing.runlength import _first_queue_states

    J = _first_queue_states(lam, 1.0, c, theta)
    assert J >= 256
    assert lam / (c * 1.0 + (J + 1) * theta) < 1
    assert J == max(256, 2 * math.ceil(max(lam - c, 0.0) / theta) + 64)


def test_an_unknown_estimator_inside_the_rate_is_refused_not_taken_for_the_customer_one():
    from fluidopt.queueing.runlength import _analyse, _rel_var_rate

    a = _analyse(0.9, 1.0, 1, 0.0, "queue", 1e-14)
    with pytest.raises(ValueError, match="estimator 'CUSTOMER'"):
        _rel_var_rate(a, 0.9, 0.0, "wait", "CUSTOMER")


@pytest.mark.parametrize("fn,args,message", [
    ("mmc_mean_wait_relative_sd", (0.5, 1.0, 1, -5), "mmc_mean_wait_relative_sd: customers: expected a finite number > 0, got -5.0"),
    ("erlang_a_abandon_relative_sd", (0.5, 1.0, 1, 0.1, -5), "erlang_a_abandon_relative_sd: customers: expected"),
    ("customers_for_precision", (0.5, 1.0, 1, -0.03), "customers_for_precision: rel_halfwidth: expected"),
    ("run_length_report", (0.5, 1.0, 1, -5), "run_length_report: customers: expected"),
    ("mmc_mean_wait_relative_sd", (0.5, 1.0, 1, 100), "mmc_mean_wait_relative_sd: estimator: expected one of time, customer"),
])
def test_bad_input_is_refused_naming_the_function_and_the_field(fn, args, message):
    import re

    import fluidopt.queueing.runlength as runlength

    kw = {"estimator": "x"} if "estimator" in message else {}
    with pytest.raises(ScenarioError, match=re.escape(message)):
        getattr(runlength, fn)(*args, **kw)
