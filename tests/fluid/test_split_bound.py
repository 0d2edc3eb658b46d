"""The single-class closed form of the disaggregated steady state, worked out by hand."""

from __future__ import annotations

import pytest

from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw
from fluidopt.core.errors import InfeasibleError
from fluidopt.fluid.split_bound import min_instances

PRE = IterationLaw(PrefillLaw(0.010, 0.001, 0.0), DecodeLaw((0.005, 0.0, 0.001)))
DEC = IterationLaw(PrefillLaw(0.010, 0.001, 0.0), DecodeLaw((0.005, 1e-5, 0.001)))


def test_kv_bound_by_hand():
    # prefill: a batch of m 100-token prompts takes 0.010 + 0.1 m s; TTFT 0.25 s allows m = 2 (0.21 s), the
    # 1,000-token limit 10: m = 2, 0.21 / 2 = 0.105 instance-s per request, x 10/s = 1.05 instances.
    # decode: mean context 100 + 11/2 = 105.5 tokens; KV 2,000 tokens allows B = 18.957; TPOT 0.05 s allows
    # (0.05 - 0.005) / (1e-5 x 105.5 + 0.001) = 21.898: KV binds. Step 0.005 + 0.002055 x 18.957 = 0.043957 s;
    # 10 steps per request: 10/s x 10 x 0.043957 / 18.957 = 0.23188 instances.
    r = min_instances(10.0, 100, 11, PRE, DEC, kv_tokens=2000, ttft=0.25, tpot=0.05, max_tokens=1000,
                      prefill_tp=2, decode_tp=1)
    assert r.batch_prompts == 2 and r.prefill_instances == pytest.approx(1.05, abs=1e-9)
    B = 2000 / 105.5
    assert r.binding == "kv" and r.decode_batch == pytest.approx(B, abs=1e-9)
    assert r.step == pytest.approx(0.005 + 0.002055 * B, abs=1e-12)
    assert r.decode_instances == pytest.approx(10 * 10 * (0.005 + 0.002055 * B) / B, abs=1e-9)
    assert r.gpus == pytest.approx(2 * 1.05 + r.decode_instances, abs=1e-9)


def test_tpot_bound_and_the_large_batch_law():
    # with unlimited KV, TPOT 0.05 s binds at B = 0.045 / 0.002055 = 21.898 (step exactly 0.05 s);
    # a large-batch law from 20 requests (0.004 + 1e-5 T + 0.0015 B) gives (0.046) / 0.002555 = 18.004 < 20,
    # infeasible in its range, so the small law just below 20 wins
    r = min_instances(1.0, 100, 11, PRE, DEC, kv_tokens=float("inf"), ttft=1.0, tpot=0.05)
    assert r.binding == "tpot" and r.decode_batch == pytest.approx(0.045 / 0.002055) and r.step == pytest.approx(0.05)
    big = IterationLaw(DEC.prefill, DecodeLaw((0.005, 1e-5, 0.001), (0.004, 1e-5, 0.0015), 20))
    r = min_instances(1.0, 100, 11, PRE, big, kv_tokens=float("inf"), ttft=1.0, tpot=0.05)
    assert r.decode_batch == pytest.approx(20.0) and r.decode_batch < 20
    assert r.decode_instances == pytest.approx(10 * (0.005 + 0.002055 * 20) / 20)


def test_bounds_no_batch_meets_are_infeasible():
    with pytest.raises(InfeasibleError, match="TTFT bound"):
        min_instances(1.0, 100, 11, PRE, DEC, kv_tokens=2000, ttft=0.1, tpot=0.05)  # one prompt takes 0.11 s
    with pytest.raises(InfeasibleError, match="TPOT"):
        min_instances(1.0, 100, 11, PRE, DEC, kv_tokens=2000, ttft=1.0, tpot=0.004)


def test_the_faster_regime_wins_even_with_the_smaller_batch():
    """Small law (0.005, 1e-5, 0.001) below 20 requests, large (0.030, 1e-5, 0.0005) from 20; TPOT 0.08 s,
    no KV limit; mean context 100 + 11/2 = 105.5. Small: B <= 0.075 / 0.002055 = 36.5, capped just
    below 20: 20 / 0.0461 = 433.8 requests-steps/s. Large: B = 0.05 / 0.001555 = 32.15, step 0.08 s:
    401.9. The smaller batch is the faster; the LP, which weighs both regimes, agrees to 1e-6."""
    from fluidopt.fluid.disaggregated import DisaggClass, DisaggPools, solve_disaggregated

    law = IterationLaw(DEC.prefill, DecodeLaw((0.005, 1e-5, 0.001), (0.030, 1e-5, 0.0005), 20))
    r = min_instances(3.0, 100, 11, PRE, law, kv_tokens=float("inf"), ttft=1.0, tpot=0.08)
    assert r.decode_batch == pytest.approx(20.0) and r.decode_batch < 20
    assert r.decode_instances == pytest.approx(3 * 10 * (0.005 + 0.002055 * 20) / 20, rel=1e-9)
    lp = solve_disaggregated([DisaggClass("a", 3.0, 100, 11, ttft=1.0, tpot=0.08)], DisaggPools(PRE, law))
    assert lp.decode_instances_total == pytest.approx(r.decode_instances, rel=1e-6)
    assert lp.decode_batch[0] == pytest.approx(20.0, rel=1e-6)
