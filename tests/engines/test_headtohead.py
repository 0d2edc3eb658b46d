"""The head-to-head on Vidur's Llama-2-7B / A100 law (docs/theory.md, "Head-to-head"): a small seeded
version of benchmarks/bench_theory.py's heavy-load cell. Skips without the Vidur profiles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fluidopt.calibration import vidur
from fluidopt.engines.headtohead import head_to_head, vidur_law

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "vidur-profiling"
if not (DATA / "compute").is_dir():
    DATA = Path("/work/shared/data/vidur-profiling")
needs_data = pytest.mark.skipif(not (DATA / "compute").is_dir(), reason=f"Vidur profiling data not found at {DATA}")


@needs_data
def test_law_follows_the_composed_iterations():
    law, kv, err = vidur_law(DATA)
    t = vidur.read_operator_table(DATA, "a100", "meta-llama/Llama-2-7b-hf", 1)
    assert kv == pytest.approx(vidur.kv_capacity(t), rel=1e-12)
    # a quadratic cannot follow the composed GEMM steps between 256 and 512 tokens (+14..17%); from
    # 1,024 tokens on, where most prefill time goes, it is within 5%; decode within 7% on its grid
    for l in (1024, 2048, 4096):
        assert law.prefill.time([l]) == pytest.approx(float(vidur.iteration_time(t, l, 0)), rel=0.05)
    for l in (256, 384):
        assert law.prefill.time([l]) == pytest.approx(float(vidur.iteration_time(t, l, 0)), rel=0.18)
    for B, ctx in ((1, 64), (32, 512), (128, 2048), (256, 4096)):
        assert law.decode.time(B * ctx, B) == pytest.approx(float(vidur.iteration_time(t, 0, B, ctx)), rel=0.07)
    assert err < 0.2


@needs_data
def test_nested_wait_serves_at_least_vllm_at_heavy_load():
    # the authors' model and mix (Llama-3-8B on an A100; results_analysis/test31: 10 types of 60
    # prompt tokens and 50..500 output tokens) at their rate, 66 requests/s, about 1.6 x the service
    # rate, with their booking limit L = 128 and vLLM-style capped at 128 sequences
    law, kv, _ = vidur_law(DATA, model="meta-llama/Meta-Llama-3-8B")
    outputs, rates = np.arange(50, 501, 50), np.array([23, 11, 8, 7, 6, 4, 3, 2, 1, 1.0])

    def sample(n, seed):
        rng = np.random.default_rng(10_000 + seed)
        return np.full(n, 60), outputs[rng.choice(10, n, p=rates / rates.sum())]

    wp = {"total_limit": 128, "outputs": outputs, "rates": rates}
    cells = head_to_head(law, kv, [66.0], sample, seeds=range(4), requests=2000, wait_params=wp,
                         policies=("vllm", "nested-wait"))
    v, nw = cells
    d = nw.tokens - v.tokens
    half = 3.182 * d.std(ddof=1) / 2  # t_{0.975, 3} x sd / sqrt(4)
    assert d.mean() - half > 0  # output tokens/s, paired 95% interval above zero
    # the gain is of the size the authors measured (+12..31% in test31/test33); docs/theory.md: +22%
    assert 0.1 < d.mean() / v.tokens.mean() < 0.35
    assert nw.preemptions.max() == 0
