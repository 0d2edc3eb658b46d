"""The stand-in's prefix cache (docs/serving.md, "The prefix cache"): hand-computed hits and prefill
times, readiness, the block ids of the replayer's text, vLLM's metric names, the switch, and the live
engines against the simulator's cache on a Mooncake slice (same routing, same cached tokens). All in
process: no server is started."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw
from fluidopt.engines import engine_config
from fluidopt.engines.live import LiveEngine
from fluidopt.serving.engine_server import EngineServer
from fluidopt.serving.prefix import LivePrefixCache, block_ids
from fluidopt.serving.replayer import prompt_text

LAW = IterationLaw(PrefillLaw(0.02, 1e-4, 1e-6), DecodeLaw((0.01, 0.0, 0.0)))
_DATA = Path(os.environ.get("FLUIDOPT_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared/data"))
MOONCAKE = _DATA / "mooncake-traces/conversation_trace.jsonl"


def _words(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{j}" for j in range(n)]


def _engine(kind: str, bs: int = 16, kv: int | None = None, **over) -> LiveEngine:
    cfg = engine_config(kind, kv_tokens=kv, **over)
    return LiveEngine(LAW, cfg, cache=LivePrefixCache(bs, kv))


def _add(eng: LiveEngine, words: list[str], output: int) -> int:
    return eng.add(len(words), output, block_ids(words, eng.cache.bs))


# two prompts of 100 words sharing their first 64 (k = 4 blocks of 16), then differing
A = _words("s", 64) + _words("a", 36)
B = _words("s", 64) + _words("b", 36)


def test_a_shared_prefix_is_cached_after_the_first_prefill_and_only_the_rest_is_computed():
    eng = _engine("vllm")
    _add(eng, A, 2)
    s1 = eng.step()  # A's whole-prompt prefill: 0.02 + 1e-4 * 100 + 1e-6 * 100^2
    assert s1.prefill and s1.duration == pytest.approx(0.02 + 0.01 + 0.01)
    _add(eng, B, 2)  # after A's prefill completed: its 4 shared blocks are ready
    s2 = eng.step()
    # B computes 100 - 64 = 36 tokens, which attend to the 64 cached ones: c x (100^2 - 64^2)
    assert s2.prefill and s2.duration == pytest.approx(0.02 + 1e-4 * 36 + 1e-6 * (100**2 - 64**2))
    assert eng.cached == [0, 64]
    assert (eng.prefix_queries, eng.prefix_hits) == (200, 64)


def test_requests_of_one_burst_do_not_hit_each_other():
    # both wait for the same prefill iteration: neither's blocks exist until it completes
    eng = _engine("vllm")
    _add(eng, A, 2)
    _add(eng, B, 2)
    s = eng.step()
    assert s.duration == pytest.approx(0.02 + 1e-4 * 200 + 1e-6 * 2 * 100**2)
    assert eng.cached == [0, 0]
    # a third with A's prompt, after: A's 6 full blocks and its partial 7th are cached; one token is computed
    _add(eng, A, 1)
    s = eng.step()  # prefill first: it runs before the first two decode
    assert eng.cached[2] == 100 and s.duration == pytest.approx(0.02 + 1e-4 + 1e-6 * (100**2 - 99**2))


def test_chunked_prefill_runs_only_the_uncached_chunks():
    # the paper's engine: one prompt chunk of C = 32 tokens per iteration
    eng = _engine("paper", max_num_batched_tokens=32)
    _add(eng, A, 1)
    n = 0
    while eng.step() is not None:
        n += 1
    assert n == 4  # ceil(100 / 32)
    _add(eng, B, 1)
    n = 0
    while eng.step() is not None:
        n += 1
    assert n == 2 and eng.cached == [0, 64]  # ceil(36 / 32)


def test_without_the_cache_every_number_is_as_before():
    cfg = engine_config("vllm")
    eng = LiveEngine(LAW, cfg)
    eng.add(100, 2)
    eng.step()
    eng.add(100, 2)
    assert eng.step().duration == pytest.approx(0.04)
    assert eng.prefix_queries == 0 and eng.cached == [-1, -1]


def test_cached_blocks_give_way_to_running_requests_deepest_first():
    # KV of 160 tokens (10 blocks of 16), prefix blocks of 16 words. A (100 words, 7 blocks) ends: its
    # blocks stay cached (112 tokens). A request of 80 words runs: the room is 160 - 80, so two of A's
    # blocks go, its deepest (a prefix is evicted from its tail); A's prompt again then finds 5 blocks
    eng = _engine("vllm", kv=160, watermark=0.0)
    _add(eng, A, 1)
    eng.step()
    assert eng.cache.blocks_cached() == 7
    _add(eng, _words("z", 80), 1)
    eng.step()
    assert eng.cache.evictions == 2
    _add(eng, A, 1)
    eng.step()
    assert eng.cached == [0, 0, 80]


def test_the_replayers_blocks_give_the_traces_block_ids():
    # ids 0 and 1 shared, then 2 vs 3; the partial last block has the trace's id too
    hashes = [[0, 1, 2], [0, 1, 3], [0, 4]]
    lens = [1100, 1300, 700]
    ids = [block_ids(prompt_text(i, p, h, 512).split(), 512) for i, (p, h) in enumerate(zip(lens, hashes))]
    assert [len(x) for x in ids] == [3, 3, 2]
    assert ids[0][:2] == ids[1][:2] and ids[0][2] != ids[1][2]
    assert ids[2][0] == ids[0][0] and ids[2][1] not in ids[0] + ids[1]
    assert block_ids(["x"] * 20, 16) == block_ids(["x"] * 20, 16)  # deterministic, no salted hash


def _served(cache: bool) -> tuple[str, list[int]]:
    """Two requests through an in-process server (speed 10^4), the second after the first: /metrics."""
    async def main():
        law, cfg = LAW, engine_config("vllm")
        srv = EngineServer(law, cfg, speed=1e4, prefix_cache=cache)
        srv.start()
        try:
            for words in (A, B):
                _, lv = srv.submit(len(words), 2, words)
                while await lv.queue.get() is not None:
                    pass
            return srv.metrics_text(), srv.engine.cached
        finally:
            await srv.stop()
    return asyncio.run(main())


def test_the_server_exposes_vllms_prefix_cache_metrics():
    text, cached = _served(True)
    lab = '{model_name="fluidopt-standin"}'
    assert cached == [0, 64]
    for line in (f"vllm:prefix_cache_queries_total{lab} 200", f"vllm:prefix_cache_hits_total{lab} 64",
                 f"vllm:gpu_prefix_cache_hit_rate{lab} 0.32", f"fluidopt:prefix_cache_cached_tokens_total{lab} 64",
                 f"fluidopt:prefix_cache_prompt_tokens_total{lab} 200"):
        assert line in text.splitlines()
    text, cached = _served(False)  # --no-enable-prefix-caching
    assert "prefix_cache" not in text and cached == [-1, -1]


def _drive(engines: list[LiveEngine], arrival, words, output, route) -> None:
    """Route each arrival to ``route(i)`` and run every engine on one virtual clock (each iteration
    admits what arrived by its start, as the server does)."""
    now = [0.0] * len(engines)
    nxt, n = 0, len(arrival)
    while True:
        busy = [(now[g], g) for g, e in enumerate(engines) if e.busy()]
        t_busy, g_busy = min(busy) if busy else (np.inf, -1)
        if nxt < n and arrival[nxt] <= t_busy:
            g = route(nxt)
            e = engines[g]
            if not e.busy():
                now[g] = max(now[g], arrival[nxt])
            _add(e, words[nxt], int(output[nxt]))
            nxt += 1
            continue
        if g_busy < 0:
            break
        s = engines[g_busy].step()
        now[g_busy] += s.duration if s is not None else 0.0


@pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"shared Mooncake trace not found at {MOONCAKE}")
@pytest.mark.filterwarnings("ignore::fluidopt.workloads.base.TraceWarning")
def test_live_engines_cache_what_the_simulators_cache_caches_on_a_mooncake_slice(tmp_path):
    """Round robin over 4 instances, the first 100 Mooncake requests of at most 3,000 prompt tokens (of its first 400) (outputs
    capped at 16 tokens, chunk 1,024: cheap), at their trace times, KV unlimited: each request's cached
    tokens are the simulator's (round-robin-chunked: the paper engine's one chunk of C per iteration),
    request by request. The live side reads only the replayer's text."""
    from fluidopt import RequestClass, Scenario
    from fluidopt.calibration.profiles import load_profile
    from fluidopt.sim.api import simulate
    from fluidopt.workloads import TraceWorkload
    from fluidopt.workloads.jsonl import read_jsonl_trace

    n_req, n = 100, 4
    head = tmp_path / "head.jsonl"  # the trace's first 400 lines: reading all 12,031 costs about a second
    with open(MOONCAKE) as f:
        head.write_text("".join(f.readline() for _ in range(400)))
    df = read_jsonl_trace(head)
    df = df[df["prompt"] <= 3000].iloc[:n_req].copy()
    df["output"] = df["output"].clip(upper=16)
    arrival = df["time"].to_numpy(float)
    gpu = replace(load_profile("qwen-8b-a100"), kv_capacity=None, chunk=1024)
    sc = Scenario(gpu=gpu, gpus=n, classes=(RequestClass("c", float(df.prompt.mean()), float(df.output.mean()), 1.0),),
                  prefill_price=1.0, decode_price=1.0, name="mooncake-slice")
    frame = pd.DataFrame({"time": arrival, "prompt": df["prompt"].to_numpy(), "output": df["output"].to_numpy(),
                          "cls": 0})
    wl = TraceWorkload(frame, ("c",), hashes=list(df["hashes"]), block_size=512)
    simulate(sc, "round-robin-chunked", horizon=wl.duration + 1e5, service="tokens", workload=wl,
             records=tmp_path / "r.csv", progress=False)
    want = pd.read_csv(tmp_path / "r.csv").sort_values("id")["cached_prompt"].to_numpy()

    law = IterationLaw.from_gpu_profile(gpu)
    cfg = engine_config("paper", max_num_batched_tokens=gpu.chunk, max_num_seqs=gpu.batch)
    engines = [LiveEngine(law, cfg, cache=LivePrefixCache(512, None)) for _ in range(n)]
    words = [prompt_text(i, int(p), h, 512).split() for i, (p, h) in enumerate(zip(df["prompt"], df["hashes"]))]
    _drive(engines, arrival, words, df["output"].to_numpy(), lambda i: i % n)
    got = np.array([engines[i % n].cached[i // n] for i in range(n_req)])
    assert got.sum() > 0.2 * df["prompt"].sum()  # the slice does reuse prefixes
    np.testing.assert_array_equal(got, want)


def test_the_litellm_plug_in_gives_a_cache_aware_controller_the_prefixes():
    """The plug-in with block_size: SGLang's rule (the simulator's `sglang`) sends a request sharing 64 of
    its 100 words (match 0.64 >= 0.5) to the engine that computed them, and an unrelated one to the least
    loaded; without block ids the first goes to the least loaded too."""
    from fluidopt.calibration.profiles import load_profile
    from fluidopt.control.registry import make_controller
    from fluidopt.core.model import RequestClass, Scenario
    from fluidopt.serving.litellm_router import ControllerRouting, deployments_for

    sc = Scenario(gpu=load_profile("qwen-8b-a100"), gpus=2, classes=(RequestClass("all", 100, 10, 1.0),),
                  prefill_price=1, decode_price=1)

    def picks(block_size):
        strat = ControllerRouting(make_controller("sglang", sc), deployments_for(["http://127.0.0.1:9"] * 2),
                                  batch=16, mean_output=10, scrape_interval=0, block_size=block_size)

        async def pick(words):
            h = {}
            await strat.async_get_available_deployment("m", input=" ".join(words),
                                                       request_kwargs={"metadata": {"fluidopt": h}})
            return h

        async def main():
            a = await pick(A)
            strat.first_token(a["r"])  # A's prefill is done: its blocks are in the index of its engine
            b = await pick(B)
            c = await pick(_words("c", 100))
            return a["g"], b["g"], c["g"]

        return asyncio.run(main())

    ga, gb, gc = picks(16)
    assert gb == ga and gc != ga
    ga, gb, _ = picks(None)
    assert gb != ga
