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
@pytest.mark.parametrize("policy", ["sglang", "llm-d-chunked"])
def test_the_routers_pass_the_controller_checks(policy):
    check_controller(policy)
