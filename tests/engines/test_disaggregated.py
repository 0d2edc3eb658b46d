"""The disaggregated replay (prefill pool, KV transfer, decode pool): requests worked out by hand,
conservation across both pools and the link, and the KV admission rule."""

from __future__ import annotations

import numpy as np
import pytest

from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw
from fluidopt.core.errors import UsageError
from fluidopt.engines.disaggregated import Pool, check_fits, model_kv_bytes, replay_disaggregated

# prefill 10 ms + 1 ms per prompt token; decode step 5 ms + 1 ms per request (s)
LAW = IterationLaw(PrefillLaw(0.010, 0.001, 0.0), DecodeLaw((0.005, 0.0, 0.001)))
LINK = dict(kv_bytes_per_token=1000, link_bandwidth=1e6, link_latency=0.002)  # 1 ms per token + 2 ms


def test_kv_bytes_of_opt13b_from_its_shape():
    # K and V x 40 layers x 40 heads x 128 dims x 2 bytes (fp16)
    assert model_kv_bytes("facebook/opt-13b") == 2 * 40 * 40 * 128 * 2 == 819_200


def test_one_request_by_hand():
    # prefill 0.010 + 10 x 0.001 = 0.020 (first token); transfer 0.002 + 10 x 0.001 = 0.012;
    # two decode steps of 0.005 + 0.001 = 0.006: finish 0.044, TPOT (0.044 - 0.020) / 2 = 0.012
    s = replay_disaggregated(Pool(LAW), Pool(LAW), [0.0], [10], [3], **LINK)
    assert s.ttft == pytest.approx([0.020]) and s.transfer == pytest.approx([0.012])
    assert s.e2e == pytest.approx([0.044]) and s.tpot == pytest.approx([0.012])


def test_a_batch_then_the_link_in_turn():
    # both prompts in one batch: 0.010 + 0.030 = 0.040; the link sends r0 (0.012, to 0.052) then r1
    # (0.002 + 0.020, to 0.074); each decodes one step of 0.006 when it lands
    s = replay_disaggregated(Pool(LAW), Pool(LAW), [0.0, 0.0], [10, 20], [2, 2], **LINK)
    assert s.first_token == pytest.approx([0.040, 0.040])
    assert s.transfer_start == pytest.approx([0.040, 0.052]) and s.transfer_end == pytest.approx([0.052, 0.074])
    assert s.finish == pytest.approx([0.058, 0.080])
    # a token limit of 25 splits them: r0 alone (0.020), then r1 (0.030)
    s = replay_disaggregated(Pool(LAW, max_tokens=25), Pool(LAW), [0.0, 0.0], [10, 20], [2, 2], **LINK)
    assert s.first_token == pytest.approx([0.020, 0.050]) and s.prefill_iterations == 2


def test_decode_admits_a_request_only_when_its_kv_fits():
    # decode KV of 32 tokens = 2 blocks; r0 (20 tokens) takes both, r1 (10 tokens) waits for r0 to finish:
    # r0 lands at 0.040 + 0.022 = 0.062, two steps to 0.074; r1 leaves then: 0.074 + 0.012 + 0.006 = 0.092
    s = replay_disaggregated(Pool(LAW), Pool(LAW, kv_tokens=32), [0.0, 0.0], [20, 10], [3, 2], **LINK)
    assert s.finish[0] == pytest.approx(0.074)
    assert s.transfer_start[1] == pytest.approx(0.074) and s.finish[1] == pytest.approx(0.092)
    assert s.tpot[1] == pytest.approx(0.052)


def test_one_token_requests_never_leave_the_prefill_pool():
    s = replay_disaggregated(Pool(LAW), Pool(LAW), [0.0], [10], [1], **LINK)
    assert s.e2e == pytest.approx([0.020]) and np.isnan(s.transfer_start[0])
    assert s.counts == dict(arrived=1, prefilled=1, transferred=0, finished=1, rejected=0)


def test_conservation_across_both_pools_and_the_link():
    # two prefill and three decode instances with small caches (swaps happen): every request passes each
    # stage once, in order, and the decode steps a request was in sum to its output less the first token
    rng = np.random.default_rng(4)
    n = 400
    arr = np.cumsum(rng.exponential(0.02, n))
    P = rng.integers(1, 300, n)
    O = rng.integers(1, 120, n)
    s = replay_disaggregated(Pool(LAW, instances=2, kv_tokens=2000, max_tokens=600),
                             Pool(LAW, instances=3, kv_tokens=1200), arr, P, O, **LINK)
    moved = O > 1
    assert s.counts == dict(arrived=n, prefilled=n, transferred=int(moved.sum()), finished=n, rejected=0)
    assert np.all(np.isfinite(s.finish)) and np.all(s.first_token >= arr) and np.all(s.finish >= s.first_token)
    assert np.all(s.transfer_start[moved] >= s.first_token[moved])
    assert np.all(s.transfer_end[moved] > s.transfer_start[moved]) and np.all(s.finish[moved] > s.transfer_end[moved])
    assert set(s.prefill_instance) == {0, 1} and set(s.decode_instance[moved]) == {0, 1, 2}
    assert s.preemptions.sum() > 0  # the small decode caches forced swaps, and every swapped request finished
    # each decode step of an instance lasts at least the law's intercept plus 1 ms per request
    assert np.all(s.tpot[moved] >= 0.006 - 1e-12)


def test_bad_layouts_and_links_are_usage_errors():
    with pytest.raises(UsageError, match="bandwidth"):
        replay_disaggregated(Pool(LAW), Pool(LAW), [0.0], [1], [1], kv_bytes_per_token=1, link_bandwidth=0)
    with pytest.raises(UsageError, match="one decode instance"):
        replay_disaggregated(Pool(LAW), Pool(LAW, instances=0), [0.0], [1], [1], kv_bytes_per_token=1)
    with pytest.raises(UsageError, match="raise the TP degree"):
        check_fits("facebook/opt-66b", 1)  # 131 GB of fp16 weights on one 80 GB GPU
    check_fits("facebook/opt-13b", 1)
