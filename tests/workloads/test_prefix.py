"""The prefix-cache model outside the engine (issue 42, step 2): an independent count on the Mooncake
trace, and hand-built cases for readiness, LRU eviction, pinning and each routing rule."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fluidopt.core.errors import ScenarioError
from fluidopt.workloads.jsonl import read_jsonl_trace
from fluidopt.workloads.prefix import RULES, hit_ratio

_DATA = Path(os.environ.get("FLUIDOPT_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared/data"))
MOONCAKE = _DATA / "mooncake-traces/conversation_trace.jsonl"
needs_mooncake = pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"shared Mooncake trace not found at {MOONCAKE}")


def _frame(rows, block=4, classes=None):
    """rows: (time, prompt, output, hash ids)."""
    df = pd.DataFrame({"time": [float(r[0]) for r in rows], "prompt": [r[1] for r in rows],
                       "output": [r[2] for r in rows]})
    df["hashes"] = pd.Series([np.asarray(r[3], dtype=np.int64) for r in rows], dtype=object)
    if classes is not None:
        df["class"] = classes
    df.attrs["block_size"] = block
    return df


@needs_mooncake
@pytest.mark.parametrize("n", [1, 4, 8])
def test_round_robin_without_eviction_equals_a_count_from_the_trace_alone(n):
    # the count: request i goes to instance i mod n; its cached prefix is the longest run of its leading
    # block ids that an earlier request on that instance carried (every prefill done before the next arrival)
    from builders import round_robin_cached_tokens

    want, requests, prompt_tokens = round_robin_cached_tokens(MOONCAKE, n)
    got = hit_ratio(read_jsonl_trace(MOONCAKE), "round-robin", n, None)
    assert got.cached_tokens == want
    assert got.prompt_tokens == prompt_tokens
    assert got.by_instance["cached_tokens"].sum() == want
    if n == 1:
        assert got.ideal_cached_tokens == want  # one instance with an unlimited cache is the ideal
    assert got.ideal == pytest.approx(0.374, abs=0.0005)  # the 37.4% of prompt tokens repeat a prefix


def test_a_block_is_reusable_only_once_its_prefill_has_completed():
    # two identical requests 1 s apart; prefill of 8 tokens at 0.2 s per token = 1.6 s: the second misses
    rows = [(0.0, 8, 1, [0, 1]), (1.0, 8, 1, [0, 1]), (2.0, 8, 1, [0, 1])]
    r = hit_ratio(_frame(rows), "round-robin", 1, None, prefill_time_per_token=0.2)
    assert r.cached.tolist() == [0, 0, 8]
    assert r.ideal_cached_tokens == 8
    # instant prefills: both later requests hit the whole prompt
    assert hit_ratio(_frame(rows), "round-robin", 1).cached.tolist() == [0, 8, 8]


def test_lru_evicts_the_deepest_unheld_blocks_first():
    # capacity 3 blocks of 4 tokens. A = [0, 1, 2] fills it; B = [3] evicts A's deepest block (2), so a
    # repeat of A hits 2 blocks (8 tokens), and recomputing block 2 evicts B's block, the least recent.
    rows = [(0, 12, 1, [0, 1, 2]), (1, 4, 1, [3]), (2, 12, 1, [0, 1, 2])]
    r = hit_ratio(_frame(rows), "round-robin", 1, 3)
    assert r.cached.tolist() == [0, 0, 8]
    assert r.evictions == 2  # block 2 for B, then B's block 3 (older than A's touched prefix) for A's block 2


def test_blocks_held_by_running_requests_are_not_evicted():
    # A holds [0, 1] for 10 s (decode); B = [2, 3] needs room in a 3-block cache: only 1 block fits
    rows = [(0, 8, 10, [0, 1]), (1, 8, 1, [2, 3]), (2, 8, 1, [2, 3]), (20, 8, 1, [0, 1])]
    r = hit_ratio(_frame(rows), "round-robin", 1, 3, decode_time_per_token=1.0)
    # B keeps its leading block only; C then hits that one block; D (A done) still finds A's prefix
    assert r.cached.tolist() == [0, 0, 4, 8]


def test_the_partial_last_block_counts_only_its_tokens_and_classes_are_split():
    rows = [(0, 10, 1, [0, 1, 2]), (1, 10, 1, [0, 1, 2]), (2, 6, 1, [0, 5])]
    r = hit_ratio(_frame(rows, classes=["a", "a", "b"]), "round-robin", 1)
    assert r.cached.tolist() == [0, 10, 4]
    assert r.by_class.loc["a", "hit_ratio"] == pytest.approx(10 / 20)
    assert r.by_class.loc["b", "hit_ratio"] == pytest.approx(4 / 6)
    assert r.hit_ratio == pytest.approx(14 / 26) and r.ideal == pytest.approx(14 / 26)


def test_sglang_prefers_the_longest_match_until_loads_are_imbalanced():
    # warm instance 0 with [0, 1]; requests then all share [0, 1] and run 100 s each
    rows = [(0, 8, 1, [0, 1])] + [(1 + k, 8, 100, [0, 1]) for k in range(5)]
    base = hit_ratio(_frame(rows), "sglang", 2, decode_time_per_token=1.0, balance_abs_threshold=2,
                     balance_rel_threshold=1.0)
    # loads at each arrival on instance 0: 0, 1, 2, 3 -> imbalance 3 > 2 sends the 5th to instance 1; the 6th
    # (loads 3, 1: balanced) finds [0, 1] on both and takes the less loaded
    assert base.instance.tolist() == [0, 0, 0, 0, 1, 1]
    # a match rate below cache_threshold goes to the instance with the fewest cached blocks
    rows = [(0, 8, 1, [0, 1]), (1, 8, 1, [0, 2])]
    assert hit_ratio(_frame(rows), "sglang", 2).instance.tolist() == [0, 0]  # 1/2 matched: not below 0.5
    assert hit_ratio(_frame(rows), "sglang", 2, cache_threshold=0.6).instance.tolist() == [0, 1]
    assert hit_ratio(_frame(rows), "sglang", 2, cache_threshold=0.4).instance.tolist() == [0, 0]


def test_llm_d_weighs_prefix_against_queue():
    # instance 0 holds [0, 1] and one long request; instance 1 is idle and empty
    rows = [(0, 8, 100, [0, 1]), (1, 8, 1, [0, 1])]
    # prefix 3 * 1 + queue 2 * 0 on 0 against 0 + 2 * 1 on 1: instance 0
    assert hit_ratio(_frame(rows), "llm-d", 2, decode_time_per_token=1.0).instance.tolist() == [0, 0]
    # with the queue weighed 4: 3 < 4, instance 1
    assert hit_ratio(_frame(rows), "llm-d", 2, decode_time_per_token=1.0, queue_weight=4).instance.tolist() == [0, 1]


def test_consistent_hashing_keeps_a_session_and_the_bounded_variant_moves_it():
    rows = [(k, 8, 100, [0, 1, 10 + k]) for k in range(6)]  # one session (first 2 blocks equal)
    plain = hit_ratio(_frame(rows), "consistent-hash", 4, decode_time_per_token=1.0)
    assert len(set(plain.instance.tolist())) == 1
    bounded = hit_ratio(_frame(rows), "consistent-hash-bounded", 4, decode_time_per_token=1.0, epsilon=0.0)
    # bound ceil((L + 1) / 4): 1, 1, 1, 1, 2, 2 -> the first four spread over all instances
    assert sorted(bounded.instance.tolist()[:4]) == [0, 1, 2, 3]
    assert math.isclose(plain.hit_ratio, 5 * 8 / 48)


def test_every_rule_runs_and_bad_options_are_one_line():
    rows = [(k, 8, 1, [0, k + 1]) for k in range(10)]
    for rule in RULES:
        r = hit_ratio(_frame(rows), rule, 3, 4)
        assert 0 <= r.hit_ratio <= r.ideal + 1e-12 or rule == "round-robin"
    with pytest.raises(ScenarioError, match=r"^hit_ratio: rule = 'best': expected one of round-robin"):
        hit_ratio(_frame(rows), "best")
    with pytest.raises(ScenarioError, match=r"rule 'sglang' has no option k; it takes balance_abs_threshold"):
        hit_ratio(_frame(rows), "sglang", k=2)
    with pytest.raises(ScenarioError, match=r"capacity_blocks = 0: expected an integer >= 1 or None"):
        hit_ratio(_frame(rows), "round-robin", 2, 0)


def test_the_cli_lists_the_same_rules():
    from fluidopt.commands._cache import _RULES  # a copy, so --help needs no pandas import

    assert _RULES == RULES
