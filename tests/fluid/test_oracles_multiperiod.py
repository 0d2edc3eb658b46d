"""Oracles for the multi-period fluid LP's throughputs and GPU-hours (fluidopt.fluid.multiperiod), from
its docstrings and docs/orchestration.md section 4, written out again here (not imported).

GPU law: a decode iteration of b requests takes tau_mix (with a prefill chunk) or tau_solo, plus
kv_time_per_token * b * context; a decoding request's mean resident context is prompt + output / 2.
The local autoscaler's batch limit: the largest b in 1..B-1 whose mixed iteration meets the ITL target.
The *mixed* GPUs (base GPUs: interactive work, lending their leftover to batch work) serve both kinds of
request, so their limit is set by the longest mean context of either; batch instances by the batch
classes' context and the batch ITL. Throughput of a GPU keeping b decodes of (P, D) busy: f = b/D *
ceil(P/C) mixed share; decode-bound b/D / (f tau_mix + (1-f) tau_solo + kv) below f = 1, else
1 / (ceil(P/C) (tau_mix + kv)).
"""

from __future__ import annotations

import functools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluidopt.core.model import GPUProfile, RequestClass, Scenario
from fluidopt.fluid.multiperiod import BacklogJob, largest_batch
from fluidopt.fluid.multiperiod import plan_fleet as _plan_fleet

# These oracles derive the plan by hand from the documented fluid throughputs (docs/orchestration.md); the
# calibrated ones (the default since the saturation model) have their own test (tests/fluid/test_saturation.py).
plan_fleet = functools.partial(_plan_fleet, calibrated=False)

KAP = 1e-5
GPU = GPUProfile(alpha=0.02, beta=0.0, tau_solo=0.01, chunk=100, batch=16, kv_time_per_token=KAP)


def scenario(*, batch_prompt: float = 300.0, batch_decode: float = 200.0, batch_itl: float | None = None,
             gpus: int = 50, inter_prompt: float = 100.0, inter_decode: float = 100.0) -> Scenario:
    cl = (RequestClass("interactive", prompt=inter_prompt, decode=inter_decode, rate=2.0, itl_slo=0.05),
          RequestClass("batch", prompt=batch_prompt, decode=batch_decode, rate=1e-6, deadline=7200.0,
                       itl_slo=batch_itl))
    return Scenario(gpu=GPU, gpus=gpus, classes=cl, name="mp-hand")


def my_limit(itl, ctx, B=16, tau_mix=0.02, kap=KAP):
    if itl is None:
        return B - 1
    b = B - 1
    while b > 1 and tau_mix + kap * b * ctx > itl:
        b -= 1
    return b


def my_throughput(b, P, D, C=100, tau_mix=0.02, tau_solo=0.01, kap=KAP):
    chunks = math.ceil(P / C)
    f = b / D * chunks
    kv = kap * b * (P + D / 2)
    if f >= 1:
        return 1 / (chunks * (tau_mix + kv))
    return (b / D) / (f * tau_mix + (1 - f) * tau_solo + kv)


def test_mixed_gpus_batch_limit_uses_the_longest_context_by_hand():
    """Interactive context 100 + 50 = 150, batch context 300 + 100 = 400 tokens; ITL 0.05 s.
    Mixed limit from the batch context: 0.02 + 1e-5 b 400 <= 0.05 -> b <= 7.5 -> 7 (from the interactive
    context alone it would be 15). Batch instances: no batch ITL -> B - 1 = 15.
      mu_int = thr(7; 100, 100):  f = 0.07,  kv = 0.0105, tau = 0.0014 + 0.0093 + 0.0105 = 0.0212 -> 0.07 / 0.0212
      mu_mix = thr(7; 300, 200):  f = 0.105, kv = 0.028,  tau = 0.0021 + 0.00895 + 0.028 = 0.03905 -> 0.035 / 0.03905
      mu_bat = thr(15; 300, 200): f = 0.225, kv = 0.06,   tau = 0.0045 + 0.00775 + 0.06 = 0.07225 -> 0.075 / 0.07225
    """
    fp = plan_fleet(scenario(), [BacklogJob("batch", 100.0, 0.0, 3600.0)], slot=3600.0, utilisation=1.0)
    assert fp.mu_int == pytest.approx(0.07 / 0.0212, rel=1e-12)
    assert fp.mu_mix == pytest.approx(0.035 / 0.03905, rel=1e-12)
    assert fp.mu_bat == pytest.approx(0.075 / 0.07225, rel=1e-12)
    # and the one-slot LP: interactive 2 / mu_int GPUs; the 100 requests on batch instances (mu_bat > mu_mix)
    assert fp.gpu_hours == pytest.approx(2 / fp.mu_int + 100 / fp.mu_bat / 3600, rel=1e-7)
    assert fp.served_batch[0] == pytest.approx(100.0, rel=1e-7) and fp.served_mixed[0] == pytest.approx(0, abs=1e-6)


def test_a_batch_itl_limits_batch_instances_by_the_batch_context():
    """Batch ITL 0.04: 0.02 + 1e-5 b 400 <= 0.04 -> b = 5 on batch instances: mu_bat = thr(5; 300, 200):
    f = 0.075, kv = 0.02, tau = 0.0015 + 0.00925 + 0.02 = 0.03075 -> 0.025 / 0.03075."""
    fp = plan_fleet(scenario(batch_itl=0.04), [BacklogJob("batch", 10.0, 0.0, 60.0)], slot=60.0)
    assert fp.mu_bat == pytest.approx(0.025 / 0.03075, rel=1e-12)
    assert fp.mu_int == pytest.approx(0.07 / 0.0212, rel=1e-12)  # the mixed limit is unchanged (7)


def test_interactive_context_longer_than_batch_sets_the_mixed_limit():
    """Interactive 1000 + 50 = 1050 tokens against batch 400: 0.03 / (1e-5 * 1050) = 2.86 -> b = 2 on mixed
    GPUs: mu_int = thr(2; 1000, 100) = prefill-bound? f = 0.02 * 10 = 0.2 < 1: kv = 0.021,
    tau = 0.004 + 0.008 + 0.021 = 0.033 -> 0.02 / 0.033."""
    fp = plan_fleet(scenario(inter_prompt=1000.0), [BacklogJob("batch", 10.0, 0.0, 60.0)], slot=60.0)
    assert fp.mu_int == pytest.approx(0.02 / 0.033, rel=1e-12)
    assert fp.mu_mix == pytest.approx(my_throughput(2, 300, 200), rel=1e-12)


def test_constant_rate_gpu_hours_closed_form():
    """No backlog work: every slot needs lambda / (rho mu_int) GPUs; K slots of s seconds."""
    fp = plan_fleet(scenario(), [], start=0.0, end=4 * 900.0, slot=900.0, interactive_rate=3.0, utilisation=0.75)
    need = 3.0 / (0.75 * (0.07 / 0.0212))
    assert fp.interactive_demand == pytest.approx([need] * 4, rel=1e-12)
    assert fp.gpu_hours == pytest.approx(4 * 900 / 3600 * need, rel=1e-7)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(bp=st.floats(10.0, 3000.0), bd=st.floats(10.0, 1000.0), ip=st.floats(10.0, 3000.0), idc=st.floats(10.0, 1000.0))
def test_throughputs_follow_the_documented_limits(bp, bd, ip, idc):
    """For any lengths: the mixed limit is set by the longest context of either kind, the batch
    instances' by the batch context (no batch ITL: B - 1)."""
    fp = plan_fleet(scenario(batch_prompt=bp, batch_decode=bd, inter_prompt=ip, inter_decode=idc),
                    [BacklogJob("batch", 1.0, 0.0, 60.0)], slot=60.0, max_gpus=10**6)
    b_mix = my_limit(0.05, max(ip + idc / 2, bp + bd / 2))
    assert fp.mu_int == pytest.approx(my_throughput(b_mix, ip, idc), rel=1e-9)
    assert fp.mu_mix == pytest.approx(my_throughput(b_mix, bp, bd), rel=1e-9)
    assert fp.mu_bat == pytest.approx(my_throughput(15, bp, bd), rel=1e-9)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(itl=st.floats(0.021, 0.5), ctx=st.floats(1.0, 5000.0), more=st.floats(0.0, 5000.0))
def test_a_longer_context_never_raises_a_batch_limit(itl, ctx, more):
    b = largest_batch(GPU, itl, ctx)
    assert b == my_limit(itl, ctx)
    assert largest_batch(GPU, itl, ctx + more) <= b
    assert largest_batch(GPU, itl * 1.5, ctx) >= b  # a looser ITL never lowers it


def test_the_first_stage_serves_batch_work_as_early_as_possible():
    """Without levelling, the tiny cost on late service picks, among the equally cheap schedules, the one
    that serves the backlog first: all of it in the first slot of its window."""
    fp = plan_fleet(scenario(), [BacklogJob("batch", 500.0, 60.0, 240.0)], start=0.0, end=240.0, slot=60.0,
                    interactive_rate=0.0, level=False)
    assert fp.served_batch == pytest.approx([0.0, 500.0, 0.0, 0.0], abs=1e-6)
    assert fp.batch[1] == pytest.approx(500.0 / (60.0 * fp.mu_bat), rel=1e-7)
    # levelled: spread evenly over slots 1-3, the same GPU-hours
    lv = plan_fleet(scenario(), [BacklogJob("batch", 500.0, 60.0, 240.0)], start=0.0, end=240.0, slot=60.0,
                    interactive_rate=0.0, level=True)
    assert lv.batch == pytest.approx([0.0] + [500.0 / (180.0 * fp.mu_bat)] * 3, rel=1e-6)
    assert lv.gpu_hours == pytest.approx(fp.gpu_hours, rel=1e-8)


def test_interactive_rate_as_a_function_of_the_slot_start_and_an_unknown_backlog_class():
    from fluidopt.core.errors import ScenarioError

    fp = plan_fleet(scenario(), [], start=0.0, end=180.0, slot=60.0, utilisation=1.0,
                    interactive_rate=lambda t: 1.0 if t < 60.0 else 3.0)
    mu = 0.07 / 0.0212
    assert fp.interactive_demand == pytest.approx([1.0 / mu, 3.0 / mu, 3.0 / mu], rel=1e-12)
    assert fp.gpu_hours == pytest.approx(60.0 * 7.0 / mu / 3600.0, rel=1e-7)
    with pytest.raises(ScenarioError, match="plan_fleet: backlog class 'nope' is not a class of the scenario"):
        plan_fleet(scenario(), [BacklogJob("nope", 1.0, 0.0, 60.0)], slot=60.0)
