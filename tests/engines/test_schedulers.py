"""Each engine scheduler on a few requests whose iterations, times and preemptions are worked out by
hand (docs/fidelity.md states the rules).

The law in every case: prefill ``0.010 + 0.001 * sum(l)`` s (``c`` as stated), decode
``0.005 + 0.001 * B`` s (no context term), so every time below is a sum of round numbers.
"""

from __future__ import annotations

import numpy as np
import pytest

from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw
from fluidopt.core.errors import UsageError
from fluidopt.engines import engine_config, replay


def law(c: float = 0.0) -> IterationLaw:
    return IterationLaw(PrefillLaw(0.010, 0.001, c), DecodeLaw((0.005, 0.0, 0.001)))


def run(engine, arrivals, prompts, outputs, c=0.0, **cfg):
    kv = cfg.pop("kv_tokens", None)
    return replay(law(c), engine_config(engine, kv_tokens=kv, **cfg), arrivals, prompts, outputs)


def test_vllm_batches_waiting_prompts_and_prefill_stalls_decodes():
    # r0 (P 32, O 3) and r1 (P 16, O 2) at 0; r2 (P 20, O 2) at 0.010.
    # it 1: prefill [32, 16]: 0.010 + 0.048 = 0.058 -> r0, r1 first token at 0.058
    # it 2: r2 waits (arrived during it 1) and is prefilled first: 0.010 + 0.020 -> 0.088, r2's first token
    # it 3: decode B = 3: 0.005 + 0.003 -> 0.096; r1 and r2 have their 2 tokens
    # it 4: decode B = 1: 0.006 -> 0.102; r0 has its 3 tokens
    r = run("vllm", [0.0, 0.0, 0.010], [32, 16, 20], [3, 2, 2])
    assert r.first_token == pytest.approx([0.058, 0.058, 0.088], abs=1e-12)
    assert r.finish == pytest.approx([0.102, 0.096, 0.096], abs=1e-12)
    assert r.ttft == pytest.approx([0.058, 0.058, 0.078], abs=1e-12)
    # TPOT: (last - first) / (output - 1)
    assert r.tpot == pytest.approx([(0.102 - 0.058) / 2, 0.096 - 0.058, 0.096 - 0.088], abs=1e-12)
    assert (r.iterations, r.prefill_iterations) == (4, 2)
    assert list(r.preemptions) == [0, 0, 0]


def test_vllm_token_limit_splits_the_prefill_batch():
    # max_num_batched_tokens 40: [32, 16] no longer fits one iteration (48 > 40): it 1 prefills r0 alone
    # (0.042), it 2 r1 alone (0.026 -> 0.068); then decode B = 2 (0.007 -> 0.075), B = 1 (0.006 -> 0.081)
    r = run("vllm", [0.0, 0.0], [32, 16], [3, 2], max_num_batched_tokens=40, max_model_len=40)
    assert r.first_token == pytest.approx([0.042, 0.068], abs=1e-12)
    assert r.finish == pytest.approx([0.081, 0.075], abs=1e-12)


def test_vllm_pads_a_prompt_batch_to_its_longest_prompt_when_asked():
    # vLLM <= 0.3 (max_paddings): a batch runs at its longest prompt's length, padding at most 256 tokens.
    # [100, 300]: 2 * 300 = 600 tokens, 200 of padding: one iteration, 0.010 + 0.600 (c = 1e-6 s/token^2:
    # + 2 * 300^2 * 1e-6 = 0.180) -> 0.790 for both. [100, 400]: 300 of padding > 256: r0 alone (0.110 + 0.010
    # = 0.120), then r1 alone (0.410 + 0.160 = 0.570 -> 0.690)
    r = run("vllm", [0.0, 0.0], [100, 300], [1, 1], c=1e-6, max_paddings=256)
    assert r.first_token == pytest.approx([0.790, 0.790], abs=1e-12)
    r = run("vllm", [0.0, 0.0], [100, 400], [1, 1], c=1e-6, max_paddings=256)
    assert r.first_token == pytest.approx([0.120, 0.690], abs=1e-12)
    # unpadded (the default): one iteration of 500 tokens, 0.010 + 0.500 + (100^2 + 400^2) * 1e-6 = 0.680
    r = run("vllm", [0.0, 0.0], [100, 400], [1, 1], c=1e-6)
    assert r.first_token == pytest.approx([0.680, 0.680], abs=1e-12)


def test_vllm_preempts_by_recompute_when_blocks_run_out():
    # 3 KV blocks of 16 tokens, no watermark. r0, r1: P 16, O 4, both at 0.
    # it 1: prefill [16, 16] (one block each, 1 left): 0.010 + 0.032 = 0.042; both hold 17 tokens
    # it 2: decode: each needs a second block (17 = 1 mod 16): r0 takes the last; r1 finds none and, being
    #       the last running, is preempted (its block freed: 1 free); decode B = 1: 0.006 -> 0.048
    # it 3, 4: r1 (17 tokens to recompute) needs 2 blocks, 1 free: decodes of r0 (0.054, 0.060); r0 done,
    #       its 2 blocks freed (3 free)
    # it 5: recompute prefill of 17 tokens: 0.010 + 0.017 -> 0.087, r1's second token
    # it 6, 7: decode B = 1 -> 0.093, 0.099: r1's 4th token
    r = run("vllm", [0.0, 0.0], [16, 16], [4, 4], kv_tokens=48, watermark=0.0)
    assert list(r.preemptions) == [0, 1]
    assert r.first_token == pytest.approx([0.042, 0.042], abs=1e-12)
    assert r.finish == pytest.approx([0.060, 0.099], abs=1e-12)
    assert r.tpot[1] == pytest.approx((0.099 - 0.042) / 3, abs=1e-12)
    assert (r.iterations, r.prefill_iterations) == (7, 2)


def test_vllm_rejects_a_prompt_longer_than_the_model_takes():
    r = run("vllm", [0.0, 0.0], [3000, 16], [2, 2])
    assert np.isnan(r.finish[0]) and r.first_token[1] == pytest.approx(0.026)


def test_chunked_mixes_decodes_with_prompt_chunks_under_a_token_budget():
    # budget 8 tokens, decodes take one each; prefill c = 1e-5 s/token^2 on (o + l)^2 - o^2.
    # r0 (P 10, O 2), r1 (P 4, O 2) at 0; r2 (P 3, O 2) at 0.020.
    # it 1: chunk r0[0:8]: 0.010 + 0.008 + 64e-5 = 0.01864
    # it 2: chunk r0[8:10] (100 - 64 = 36) + r1[0:4] (16): 0.010 + 0.006 + 52e-5 -> 0.03516; first tokens
    # it 3: 2 decodes (budget 6 left) + r2[0:3] (9): 0.010 + 0.003 + 9e-5 + 0.001 * 2 (decode's variable
    #       term; its intercept is not paid again) = 0.01509 -> 0.05025: r0, r1 done, r2's first token
    # it 4: decode B = 1: 0.006 -> 0.05625
    r = run("chunked", [0.0, 0.0, 0.020], [10, 4, 3], [2, 2, 2], c=1e-5, max_num_batched_tokens=8)
    assert r.first_token == pytest.approx([0.03516, 0.03516, 0.05025], abs=1e-12)
    assert r.finish == pytest.approx([0.05025, 0.05025, 0.05625], abs=1e-12)
    assert (r.iterations, r.prefill_iterations) == (4, 3)


def test_paper_runs_one_prefill_chunk_plus_the_decodes():
    # C = 8 tokens, one prompt per iteration, decodes outside the chunk, B = 2 requests.
    # r0 (P 10, O 2), r1 (P 8, O 2), r2 (P 4, O 1), all at 0.
    # it 1: r0[0:8]: 0.018;  it 2: r0[8:10]: 0.012 -> 0.030, r0's first token
    # it 3: r1[0:8] (all of C although r0 decodes) + 1 decode: 0.010 + 0.008 + 0.001 -> 0.049: r0 done,
    #       r1's first token
    # it 4: r2[0:4] + 1 decode: 0.015 -> 0.064: r1 done; r2's only token
    r = run("paper", [0.0, 0.0, 0.0], [10, 8, 4], [2, 2, 1], max_num_batched_tokens=8, max_num_seqs=2)
    assert r.first_token == pytest.approx([0.030, 0.049, 0.064], abs=1e-12)
    assert r.finish == pytest.approx([0.049, 0.064, 0.064], abs=1e-12)
    assert r.tpot[2] == 0.0


def test_paper_batch_limit_holds_prompts_back():
    # B = 1: r1 may not start its prefill until r0 has finished.
    # r0: 0.018 + 0.012 -> 0.030 first, decode 0.006 -> 0.036 done; r1: 0.018 -> 0.054
    r = run("paper", [0.0, 0.0], [10, 8], [2, 1], max_num_batched_tokens=8, max_num_seqs=1)
    assert r.finish == pytest.approx([0.036, 0.054], abs=1e-12)


def test_straight_line_law_gives_the_papers_iteration_times():
    # the paper engine with tau = alpha + beta * C: a 256-token prompt in chunks of 256 beside 3 decodes
    lin = IterationLaw.straight_line(0.0174, 6.2e-5, 0.022)
    r = replay(lin, engine_config("paper", max_num_batched_tokens=256), [0.0], [256], [3])
    assert r.first_token[0] == lin.prefill_time([256]) == 0.0174 + 6.2e-5 * 256
    assert r.finish[0] == pytest.approx(0.0174 + 6.2e-5 * 256 + 2 * 0.022, abs=1e-15)


def test_unknown_engine_says_did_you_mean():
    with pytest.raises(UsageError, match="'vlm': no such engine \\(did you mean 'vllm'\\?\\)"):
        engine_config("vlm")
