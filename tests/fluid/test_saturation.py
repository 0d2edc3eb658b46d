"""Calibrated planning rates (fluidopt.fluid.saturation, issue 31): the length laws' moments in closed
form, the decode chain's hand-solvable case, and the differential test: for each instance role and a
sweep of batch sizes, the planned throughput equals the simulator's saturated throughput within 2%."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fluidopt.core.model import GPUProfile, RequestClass, Scenario
from fluidopt.fluid.multiperiod import BacklogJob, batch_throughput, plan_fleet, role_rates
from fluidopt.fluid.saturation import length_law, saturated_throughput
from fluidopt.scenario import load_scenario

GPU = GPUProfile(alpha=0.0174, beta=6.2e-5, tau_solo=1 / 45.45, chunk=256, batch=128, kv_time_per_token=1.5e-6)
WORKFLOW = Path(__file__).resolve().parents[2] / "examples/scenarios/chiron-workflow.toml"


def test_length_law_moments():
    g = length_law("exponential", 400)
    assert g.mean == pytest.approx(400, rel=1e-9)
    # geometric: E[D (D-1)] / 2 = m (m - 1): a running decode's mean generated count is m - 1, not m / 2
    assert g.expect(lambda v: v * (v - 1) / 2) == pytest.approx(400 * 399, rel=1e-6)
    # E[ceil(P / C)] of a geometric prompt: 1 / (1 - (1 - p)^C)
    p = length_law("exponential", 300)
    assert p.expect(lambda v: np.ceil(v / 256)) == pytest.approx(1 / (1 - (1 - 1 / 300) ** 256), rel=1e-9)
    f = length_law("fixed", 300.25)
    assert f.values.tolist() == [300, 301] and f.mean == pytest.approx(300.25)
    ln = length_law("lognormal", 400, 1.0)
    # L = 1 + R(Y), E[Y] = 399, E[R(Y)^2] = E[Y^2] + E[frac (1 - frac)]: within a token of E[Y^2] = 399^2 e
    assert ln.mean == pytest.approx(400, rel=1e-7)
    assert ln.expect(lambda v: (v - 1.0) ** 2) == pytest.approx(399**2 * math.e, rel=1e-5)


def test_one_decode_at_a_time_by_hand():
    """b = 1: the GPU alternates one prefill (K chunks) and its decode (D iterations), so x = 1 / (E[K] +
    E[D]) completions per iteration; the mean iteration and the rate follow by hand."""
    P, D = length_law("exponential", 300), length_law("exponential", 400)
    s = saturated_throughput(GPU, 1, P, D)
    EK = P.expect(lambda v: np.ceil(v / 256))
    x = 1 / (EK + 400)
    assert s.per_iteration == pytest.approx(x, rel=1e-9) and s.decodes == pytest.approx(400 * x, rel=1e-9)
    kv = x * (P.expect(lambda v: np.ceil(v / 256) * v) + 400 * 300 + 400 * 399)
    it = x * EK * GPU.tau_mix + x * 400 * GPU.tau_solo + 1.5e-6 * kv
    assert s.iteration == pytest.approx(it, rel=1e-9) and s.rate == pytest.approx(x / it, rel=1e-9)


def test_without_kv_time_and_fixed_lengths_a_hand_cycle():
    """kappa = 0, fixed prompt of one chunk and fixed output D, b = 1: one mixed iteration then D solo
    ones per request."""
    gpu = GPUProfile(alpha=0.02, beta=5e-5, tau_solo=0.02, chunk=256, batch=8)
    s = saturated_throughput(gpu, 1, length_law("fixed", 200), length_law("fixed", 50))
    assert s.rate == pytest.approx(1 / (gpu.tau_mix + 50 * gpu.tau_solo), rel=0.01)


def test_plan_rates_are_the_saturated_throughputs_of_the_roles():
    sc = load_scenario(WORKFLOW)
    r = role_rates(sc, [0], [1])
    assert (r.b_int, r.b_bat) == (35, 127)
    inter, bat = sc.classes
    li, lb = (length_law("exponential", inter.prompt), length_law("exponential", inter.decode)), \
        (length_law("exponential", bat.prompt), length_law("exponential", bat.decode))
    assert r.mu_int == pytest.approx(saturated_throughput(sc.gpu, 35, *li).rate, rel=1e-12)
    assert r.mu_mix == pytest.approx(saturated_throughput(sc.gpu, 35, *lb).rate, rel=1e-12)
    assert r.mu_bat == pytest.approx(saturated_throughput(sc.gpu, 127, *lb).rate, rel=1e-12)
    # the fluid estimates overstate a saturated GPU (issue 31: 0.95x, 0.82x, 0.76x measured)
    f = role_rates(sc, [0], [1], calibrated=False)
    assert f.mu_bat == batch_throughput(sc.gpu, 127, 300, 400)
    assert r.mu_int / f.mu_int == pytest.approx(0.947, abs=0.005)
    assert r.mu_mix / f.mu_mix == pytest.approx(0.828, abs=0.005)
    assert r.mu_bat / f.mu_bat == pytest.approx(0.768, abs=0.005)
    # the multi-period bound with them: the workflow's 100,000 requests, 70 minutes
    job = [BacklogJob("batch", 100_000, 300.0, 3900.0)]
    cal = plan_fleet(sc, job, end=4200.0, slot=60.0, utilisation=1.0)
    old = plan_fleet(sc, job, end=4200.0, slot=60.0, utilisation=1.0, calibrated=False)
    assert old.gpu_hours == pytest.approx(15.71, abs=0.005) and cal.gpu_hours == pytest.approx(19.27, abs=0.005)
    # no base fleet kept: the interactive GPU-hours plus N / mu_bat on batch instances
    assert cal.gpu_hours == pytest.approx((4200 * 30.0 / r.mu_int + 100_000 / r.mu_bat) / 3600, rel=1e-6)


def _simulated(b: int, prompt, output, *, planned: float, n: int = 32, horizon: float = 2500.0,
               warmup: float = 500.0, seed: int = 2) -> float:
    """Completions per second per GPU of ``n`` GPUs kept saturated at batch limit ``b`` (a backlog larger
    than they finish; the utilisation autoscaler on a fixed fleet: one prefill at a time, admitted while
    the decodes are below b), counted over [warmup, horizon].

    The backlog is 25% over what the planned rate ``planned`` (per GPU per s) finishes by the horizon,
    capped at 8 per GPU-second: every request of it arrives at time 0 and is routed then, so its size is
    most of the run's cost where few finish. The run is the same whatever the backlog's size while it
    stays saturated (checked: identical rates at 8 per GPU-second and at this size), and the assertion
    below fails the test if it does not."""
    from fluidopt.sim.api import simulate
    from fluidopt.workloads import Backlog, BacklogWorkload, ClassSpec, Poisson, SyntheticWorkload

    sc = Scenario(gpu=GPU, gpus=n, classes=(RequestClass("w", prompt=prompt.mean, decode=output.mean, rate=1e-6),),
                  name="saturated")
    base = SyntheticWorkload([ClassSpec(Poisson(1e-9), prompt, output, name="w")])
    backlog = min(int(8 * n * horizon), math.ceil(1.25 * planned * n * horizon) + n * (b + 1))
    wl = BacklogWorkload(base, [Backlog("w", backlog, 0.0, prompt, output)], class_names=sc.class_names)
    res = simulate(sc, "utilisation-autoscaler", horizon=horizon, seed=seed, service="tokens", workload=wl,
                   sample_interval=warmup, controller_options={"batch_size": b})
    ts = res.timeseries
    c, t = ts["completed[w]"].to_numpy(), ts["time"].to_numpy()
    assert c[-1] < backlog  # still saturated at the end
    return float((c[-1] - c[1]) / (t[-1] - t[1]) / n)


# The interactive role (300-token prompts, 100-token outputs) at b >= 8 finishes about three times as many
# requests per GPU-second as the batch role (400-token outputs), and a run's cost is its requests: its runs
# count over [500, 1500] s instead of [500, 2500]. Measured at 1,500 s (issue 47, sixth cut), seeds 2-6, the
# largest deviation from the plan was 0.70% (b = 35; 0.65% at b = 64, 0.60% at 96, 0.47% at 8, 0.19% at 16)
# against the 2% tolerance. One decode at a time (b = 1) and the batch role keep 2,500 s: fewer completions.
INTERACTIVE_HORIZON = 1500.0


def _check(b, kind, P, D, sigma=None, horizon: float = 2500.0):
    from fluidopt.workloads import Exponential, Fixed, LogNormal

    make = {"exponential": lambda m: Exponential(m), "fixed": lambda m: Fixed(m),
            "lognormal": lambda m: LogNormal(m, sigma)}[kind]
    planned = saturated_throughput(GPU, b, length_law(kind, P, sigma), length_law(kind, D, sigma)).rate
    sim = _simulated(b, make(P), make(D), planned=planned, horizon=horizon)
    return planned, sim


@pytest.mark.integration
def test_planned_equals_simulated_for_the_workflow_roles():
    """The three roles at the workflow's planned batch limits: interactive (300/100 tokens at 35),
    mixed (300/400 at 35), batch (300/400 at 127)."""
    for b, P, D, h in ((35, 300, 100, INTERACTIVE_HORIZON), (35, 300, 400, 2500.0), (127, 300, 400, 2500.0)):
        planned, sim = _check(b, "exponential", P, D, horizon=h)
        assert sim == pytest.approx(planned, rel=0.02), (b, P, D)


@pytest.mark.slow
@pytest.mark.parametrize("b", [1, 8, 16, 64, 96])
@pytest.mark.parametrize("role", ["interactive", "batch"])
def test_planned_equals_simulated_over_a_sweep_of_batch_sizes(role, b):
    P, D = (300, 100) if role == "interactive" else (300, 400)
    horizon = INTERACTIVE_HORIZON if role == "interactive" and b >= 8 else 2500.0
    planned, sim = _check(b, "exponential", P, D, horizon=horizon)
    assert sim == pytest.approx(planned, rel=0.02)


@pytest.mark.slow
def test_planned_equals_simulated_prefill_bound_and_fixed_lengths():
    # long prompts, short outputs: the GPU is prefill-bound (the fluid estimate is off 12x here)
    planned, sim = _check(127, "exponential", 3000, 20)
    assert sim == pytest.approx(planned, rel=0.02)
    assert batch_throughput(GPU, 127, 3000, 20) < 0.2 * planned
    planned, sim = _check(35, "fixed", 300, 400)
    assert sim == pytest.approx(planned, rel=0.02)


def test_prefill_cycle_chain_equals_the_iteration_chain():
    """The decode-count chain embedded at prefill starts equals the iteration-by-iteration one."""
    from fluidopt.fluid.saturation import _decode_chain, _prefill_cycles

    for b, P, D in ((35, 300, 100), (127, 300, 400), (1, 300, 400), (64, 3000, 20), (5, 1, 1), (3, 700, 2)):
        law = length_law("exponential", P)
        k = np.ceil(law.values / 256).astype(int)
        kp = np.bincount(k, weights=law.probs)[1:]
        a, c = _decode_chain(b, 1 / D, kp), _prefill_cycles(b, 1 / D, kp)
        assert c == pytest.approx(a, rel=1e-10, abs=1e-12), (b, P, D)
