"""The cache-aware routers (issue 42, step 6): SGLang's longest-match-unless-imbalanced rule and llm-d's
weighted scorer, decided through the protocol's cached_prefix_tokens query, on hand-built cases."""

from __future__ import annotations

import pandas as pd
import pytest

from fluidopt import GPUProfile, RequestClass, Scenario
from fluidopt.control.prefix_routers import LLMDScorer, SGLangRouter
from fluidopt.control.registry import make_controller
from fluidopt.core.errors import ScenarioError, UsageError
from fluidopt.sim.api import simulate
from fluidopt.sim.check import check_controller
from fluidopt.workloads import TraceWorkload

pytestmark = pytest.mark.filterwarnings("ignore::fluidopt.workloads.base.TraceWarning")


def _scenario(n: int = 2) -> Scenario:
    gpu = GPUProfile.from_gamma(alpha=0.01, beta=0.001, gamma=40.0, chunk=10, batch=4)
    return Scenario(gpu=gpu, gpus=n, classes=(RequestClass("c", prompt=40, decode=2, rate=0.01, patience=0.0),),
                    prefill_price=0.1, decode_price=0.2, name="prefix-routers")


def _gpus(tmp_path, policy, **options) -> list[int]:
    # A (blocks 1-4) decodes for 1000 tokens (25 s) on instance 0; B, at t = 1 s, shares 30 of its 40
    # prompt tokens with A: instance 0 has them and one outstanding request, instance 1 nothing and none
    rows = [(0.0, 40, 1000, [1, 2, 3, 4]), (1.0, 40, 2, [1, 2, 3, 9])]
    frame = pd.DataFrame({"time": [r[0] for r in rows], "prompt": [r[1] for r in rows], "output": [r[2] for r in rows],
                          "cls": [0, 0]})
    wl = TraceWorkload(frame, ("c",), hashes=[r[3] for r in rows], block_size=10)
    path = tmp_path / "r.csv"
    simulate(_scenario(), policy, horizon=100.0, service="tokens", workload=wl, records=path, progress=False,
             controller_options=options)
    return pd.read_csv(path).sort_values("id").prefill_gpu.tolist()


def test_sglang_takes_the_longest_match_unless_the_loads_are_imbalanced(tmp_path):
    assert _gpus(tmp_path, "sglang") == [0, 0]  # loads 1 vs 0: balanced by SGLang's thresholds (32)
    assert _gpus(tmp_path, "sglang", balance_abs_threshold=0.5) == [0, 1]  # 1 - 0 > 0.5 and 1 > 1.0001 * 0
    assert _gpus(tmp_path, "sglang", cache_threshold=0.8) == [0, 1]  # a match rate of 0.75 is below 0.8


def test_llm_d_weighs_the_prefix_against_the_queue(tmp_path):
    # instance 0: 3 x 30/40 + 2 x 0 + 2 = 4.25; instance 1: 0 + 2 x 1 + 2 = 4
    assert _gpus(tmp_path, "llm-d") == [0, 0]
    # prefix weight 1: 0.75 + 0 + 2 = 2.75 against 4
    assert _gpus(tmp_path, "llm-d", prefix_weight=1.0) == [0, 1]


def test_without_a_cache_they_balance_load(tmp_path):
    frame = pd.DataFrame({"time": [0.0, 1.0], "prompt": [40, 40], "output": [1000, 2], "cls": [0, 0]})
    for policy in ("sglang", "llm-d"):
        path = tmp_path / f"{policy}.csv"
        simulate(_scenario(), policy, horizon=100.0, service="tokens", workload=TraceWorkload(frame, ("c",)),
                 records=path, progress=False)
        assert pd.read_csv(path).sort_values("id").prefill_gpu.tolist() == [0, 1], policy


def test_options_are_checked_and_the_chunked_variants_exist():
    sc = _scenario()
    assert isinstance(make_controller("sglang-chunked", sc), SGLangRouter)
    assert make_controller("llm-d-chunked", sc).chunked_prefill
    assert isinstance(make_controller("llm-d", sc, kv_weight=0.0), LLMDScorer)
    with pytest.raises(UsageError, match="unknown option"):
        make_controller("sglang", sc, prefix_weight=1.0)
    with pytest.raises(ScenarioError, match="cache_threshold"):
        make_controller("sglang", sc, cache_threshold=2.0)
    with pytest.raises(ScenarioError, match="queue_weight"):
        make_controller("llm-d", sc, queue_weight=-1.0)


@pytest.mark.integration
@pytest.mark.parametrize("policy", ["sglang", "llm-d-chunked", "consistent-hash", "consistent-hash-bounded",
                                    "dynamo-kv", "mooncake"])
def test_the_routers_pass_the_controller_checks(policy):
    check_controller(policy)


def _ring_owner(n: int, vnodes: int, blocks: list[int], k: int) -> int:
    # the ring as docs/prefix-cache.md states it, written here from hashlib: vnodes points per instance at
    # BLAKE2b-64("instance-g-v"), a key at BLAKE2b-64 of its first k ids joined by commas, the first point at
    # or after the key (wrapping)
    import hashlib

    def h(text: str) -> int:
        return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")

    pts = sorted((h(f"instance-{g}-{v}"), g) for g in range(n) for v in range(vnodes))
    key = h(",".join(map(str, blocks[:k])))
    return next((g for p, g in pts if p >= key), pts[0][1])


def test_consistent_hashing_keeps_sessions_on_the_ring_owner(tmp_path):
    # 12 sessions of 3 turns each, spread in time; a turn shares its session's first two blocks
    rows = []
    for turn in range(3):
        for s in range(12):
            ids = [1000 * s + 1, 1000 * s + 2] + [1000 * s + 10 * turn + j for j in range(3, 5)]
            rows.append((100.0 * turn + s, 40, 2, ids))
    frame = pd.DataFrame({"time": [r[0] for r in rows], "prompt": [r[1] for r in rows],
                          "output": [r[2] for r in rows], "cls": [0] * len(rows)})
    wl = TraceWorkload(frame, ("c",), hashes=[r[3] for r in rows], block_size=10)
    path = tmp_path / "ch.csv"
    res = simulate(_scenario(4), "consistent-hash", horizon=400.0, service="tokens", workload=wl, records=path,
                   progress=False, controller_options={"vnodes": 16})
    got = pd.read_csv(path).sort_values("id").prefill_gpu.tolist()
    assert got == [_ring_owner(4, 16, r[3], 2) for r in rows]
    assert len(set(got)) > 1  # the sessions spread
    # later turns find their session's first two blocks: 20 of 40 tokens for each of 24 requests
    assert res.totals["cached_prompt_tokens"] == 24 * 20


def test_bounded_consistent_hashing_caps_the_load():
    # 9 requests of one session at t = 0 on 3 instances: plain hashing piles them on the owner; with
    # epsilon = 0 no instance may reach ceil((total + 1) / 3) outstanding requests when one is routed
    frame = pd.DataFrame({"time": [0.0] * 9, "prompt": [40] * 9, "output": [50] * 9, "cls": [0] * 9})
    wl = TraceWorkload(frame, ("c",), hashes=[[1, 2, 3, 4]] * 9, block_size=10)
    counts = {}
    for policy, opts in (("consistent-hash", {}), ("consistent-hash-bounded", {"epsilon": 0.0})):
        res = simulate(_scenario(3), policy, horizon=100.0, service="tokens", workload=wl, progress=False,
                       controller_options=opts)
        counts[policy] = res.meta["prefix_cache"]["prefilled"].tolist()
    assert sorted(counts["consistent-hash"]) == [0, 0, 9]
    assert counts["consistent-hash-bounded"] == [3, 3, 3]


def test_consistent_hashing_without_block_ids_goes_to_the_least_loaded(tmp_path):
    frame = pd.DataFrame({"time": [0.0, 1.0], "prompt": [40, 40], "output": [1000, 2], "cls": [0, 0]})
    path = tmp_path / "n.csv"
    simulate(_scenario(), "consistent-hash", horizon=100.0, service="tokens", workload=TraceWorkload(frame, ("c",)),
             records=path, progress=False)
    assert pd.read_csv(path).sort_values("id").prefill_gpu.tolist() == [0, 1]
