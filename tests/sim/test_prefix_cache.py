"""The simulator's prefix (KV) cache (issue 42; docs/simulator.md section 1.2): the independent count on
the Mooncake trace, hand-computed timing, readiness and eviction cases, the view's query, the compiled
core against the Python engine with the cache on, and the cache off giving today's numbers."""

from __future__ import annotations

import functools
import math
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fluidopt import GPUProfile, RequestClass, Scenario
from fluidopt.control.registry import available
from fluidopt.core.errors import ScenarioError
from fluidopt.sim import backend as core
from fluidopt.sim.api import make_engine, simulate
from fluidopt.workloads import TraceWorkload

pytestmark = pytest.mark.filterwarnings("ignore::fluidopt.workloads.base.TraceWarning")

_DATA = Path(os.environ.get("FLUIDOPT_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared/data"))
MOONCAKE = _DATA / "mooncake-traces/conversation_trace.jsonl"
needs_mooncake = pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"shared Mooncake trace not found at {MOONCAKE}")
COMPILED, WHY = core.compiled_status()
needs_core = pytest.mark.skipif(not COMPILED, reason=f"compiled core not usable: {WHY}")
ROOT = Path(__file__).resolve().parents[2]


def _scenario(n: int = 1, *, kv: float | None = None, chunk: int = 10, batch: int = 4) -> Scenario:
    # a whole-prompt prefill of P tokens takes alpha + beta P = 0.01 + 0.001 P s (round robin, vLLM's
    # prefill first); a chunk 0.01 + 0.001 * 10 = 0.02 s (round-robin-chunked); nobody abandons
    gpu = GPUProfile.from_gamma(alpha=0.01, beta=0.001, gamma=40.0, chunk=chunk, batch=batch, kv_capacity=kv)
    return Scenario(gpu=gpu, gpus=n, classes=(RequestClass("c", prompt=40, decode=2, rate=0.01, patience=0.0),),
                    prefill_price=0.1, decode_price=0.2, name="prefix-cache")


def _workload(rows, block: int = 10) -> TraceWorkload:
    """rows: (time, prompt, output, block ids)."""
    frame = pd.DataFrame({"time": [float(r[0]) for r in rows], "prompt": [r[1] for r in rows],
                          "output": [r[2] for r in rows], "cls": [0] * len(rows)})
    return TraceWorkload(frame, ("c",), hashes=[r[3] for r in rows], block_size=block)


def _records(tmp_path, sc, wl, policy="round-robin", name="r.csv", **kw) -> tuple[pd.DataFrame, object]:
    path = tmp_path / name
    res = simulate(sc, policy, horizon=wl.duration + 1000.0, service="tokens", workload=wl, records=path,
                   progress=False, **kw)
    return pd.read_csv(path).sort_values("id").reset_index(drop=True), res


# -- the independent count (the acceptance) -----------------------------------------------------
@needs_mooncake
@pytest.mark.parametrize("n", [1, 4, 8])
def test_round_robin_never_evicting_equals_a_count_from_the_trace_alone(n):
    # The count, from the JSON lines alone: request i (arrival order) goes to instance i mod n; its
    # cached prefix is the longest run of its leading block ids that an earlier request on that instance
    # carried, min(run * 512, input) tokens. The whole trace (12,031 requests), stretched 20 times so
    # that prefills end before the next arrival (an instance's prefills run one at a time, first come
    # first served, so the count holds at any speed; the stretch is the statement of it).
    from builders import round_robin_cached_tokens

    want, requests, prompt_tokens = round_robin_cached_tokens(MOONCAKE, n)

    sc, wl = _mooncake(0.05)
    sc = replace(sc, gpus=n)  # (replay keeps the scenario's fleet: only its classes may change)
    res = simulate(sc, "round-robin", horizon=wl.duration + 1e5, service="tokens", workload=wl, progress=False)
    assert res.totals["completed"] == requests
    assert res.totals["cached_prompt_tokens"] == want
    assert res.totals["prompt_tokens"] == prompt_tokens
    assert res.meta["prefix_cache"]["cached_prompt_tokens"].sum() == want
    assert res.meta["prefix_cache_evictions"] == 0


# -- hand-computed cases --------------------------------------------------------------------------------
def test_only_the_uncached_tokens_are_prefilled(tmp_path):
    # Request 2 finds blocks 1, 2, 3 (30 tokens) of request 1 and computes 15 tokens (its last block is
    # partial, 5 tokens): one whole-prompt iteration of 0.01 + 0.001 * 15 s; chunked, 2 chunks of 0.02 s.
    wl = _workload([(0, 40, 2, [1, 2, 3, 4]), (100, 45, 2, [1, 2, 3, 9, 10])])
    on, res = _records(tmp_path, _scenario(), wl)
    off, res_off = _records(tmp_path, _scenario(), wl, name="off.csv", prefix_cache=False)
    assert on.cached_prompt.tolist() == [0, 30]
    assert on.ttft.tolist() == pytest.approx([0.05, 0.025], abs=1e-12)
    assert off.ttft.tolist() == pytest.approx([0.05, 0.055], abs=1e-12)
    chunked, _ = _records(tmp_path, _scenario(), wl, "round-robin-chunked", name="chunked.csv")
    assert chunked.ttft.tolist() == pytest.approx([4 * 0.02, 2 * 0.02], abs=1e-12)
    assert "cached_prompt" not in off.columns
    assert res.totals["prompt_tokens"] == 85 and res.totals["cached_prompt_tokens"] == 30
    assert res.per_class.loc["c", "hit_ratio"] == pytest.approx(30 / 85)
    assert "prompt_tokens" not in res_off.totals


def test_a_whole_prompt_cached_still_computes_one_token(tmp_path):
    wl = _workload([(0, 40, 2, [1, 2, 3, 4]), (100, 40, 2, [1, 2, 3, 4])])
    on, _ = _records(tmp_path, _scenario(), wl)
    assert on.cached_prompt.tolist() == [0, 40]
    assert on.ttft.tolist() == pytest.approx([0.05, 0.011], abs=1e-12)


def test_blocks_are_cached_per_instance_and_only_once_computed(tmp_path):
    # two requests of one burst on two instances do not hit each other; a later one on instance 0 hits
    wl = _workload([(0, 40, 2, [1, 2, 3, 4]), (0, 40, 2, [1, 2, 3, 4]), (100, 40, 2, [1, 2, 7, 8])])
    on, res = _records(tmp_path, _scenario(2), wl)
    assert on.prefill_gpu.tolist() == [0, 1, 0]
    assert on.cached_prompt.tolist() == [0, 0, 20]
    inst = res.meta["prefix_cache"]
    assert inst["cached_prompt_tokens"].tolist() == [20, 0] and inst["prompt_tokens"].tolist() == [80, 40]


def test_a_block_is_not_visible_before_its_prefill_completes():
    # one GPU, two identical requests at t = 0: while the first prefills (4 iterations), the second
    # sees nothing cached; once the first completes, the second's prefill starts and finds all of it
    wl = _workload([(0, 40, 20, [1, 2, 3, 4]), (0, 40, 20, [1, 2, 3, 4])])
    eng = make_engine(_scenario(), "round-robin", horizon=1000.0, service="tokens", workload=wl, progress=False)
    eng.start()
    eng.advance(0.02)
    r1 = eng.gpu_prefill(0)
    (r2,) = eng.queue_requests(eng.instance_queue(0))
    assert eng.cached_prefix_tokens(r2, 0) == 0 and eng.cached_prefix_tokens(r1, 0) == 0
    eng.advance(0.06)  # the first prefill ended at 0.05
    assert eng.cached_prefix_tokens(r2, 0) == 40
    eng.advance(2.0)
    res = eng.finish()
    assert res.totals["cached_prompt_tokens"] == 40


def test_eviction_is_lru_deepest_first_and_cached_blocks_give_way_to_running_requests(tmp_path):
    # K = 100 tokens, blocks of 10. After A and B: unheld blocks, oldest first, 4 3 2 1 (A's, deepest
    # first) then B's 15 .. 11. C holds 1, 2 (cached) and reserves 40: room 60 for 70 unheld tokens, so
    # block 4 goes. C's decode grows its KV to 41 at its last boundary: block 3 goes. D then finds 1, 2,
    # and evicts B's deepest blocks the same way: 15 for its prefill, 14 for its decode's growth.
    rows = [(0, 40, 1, [1, 2, 3, 4]), (100, 50, 1, [11, 12, 13, 14, 15]), (200, 40, 1, [1, 2, 21, 22]),
            (300, 40, 1, [1, 2, 3, 4])]
    on, res = _records(tmp_path, _scenario(kv=100.0), _workload(rows))
    assert on.cached_prompt.tolist() == [0, 0, 20, 20]
    assert res.meta["prefix_cache_evictions"] == 4
    assert res.totals["preemptions"] == 0
    unlimited, _ = _records(tmp_path, _scenario(), _workload(rows), name="u.csv")
    assert unlimited.cached_prompt.tolist() == [0, 0, 20, 40]


def test_a_prefill_evicted_part_way_leaves_the_blocks_of_its_completed_chunks():
    from fluidopt.sim.fleet import evict

    wl = _workload([(0, 60, 2, [1, 2, 3, 4, 5, 6]), (100, 60, 2, [1, 2, 3, 4, 5, 6])])
    eng = make_engine(_scenario(), "round-robin-chunked", horizon=1000.0, service="tokens", workload=wl,
                      progress=False)
    eng.start()
    eng.advance(0.05)  # boundaries at 0.02, 0.04: two chunks (blocks 1, 2) done, the third running
    r = eng.gpu_prefill(0)
    assert evict(eng, r, host=False)  # takes effect at boundary 0.06: three chunks done
    assert eng.cached_prefix_tokens(r, 0) == 30
    res = eng.finish()
    assert res.totals["preemptions"] == 1


# -- the cache off is today's engine ----------------------------------------------------------------------
def test_the_cache_off_or_no_hashes_gives_the_same_numbers_and_records(tmp_path):
    rows = [(0.1 * i, 30 + 7 * (i % 5), 3 + i % 4, [i % 3, 10 + i % 2, 20 + i][: 1 + (30 + 7 * (i % 5) - 1) // 20])
            for i in range(60)]
    wl = _workload(rows, block=20)
    bare = TraceWorkload(wl.frame[["time", "prompt", "output", "cls"]], ("c",))
    sc = _scenario(3, kv=200.0)
    a, ra = _records(tmp_path, sc, wl, "least-requests", name="a.csv", prefix_cache=False)
    b, rb = _records(tmp_path, sc, bare, "least-requests", name="b.csv")
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert ra.totals == rb.totals and ra.events == rb.events
    c, rc = _records(tmp_path, sc, wl, "least-requests", name="c.csv")
    assert rc.totals["cached_prompt_tokens"] > 0
    markov = simulate(_scenario(3), "least-requests", horizon=10.0, service="markov", workload=wl, progress=False)
    assert "prompt_tokens" not in markov.totals  # no token model, no cache


def test_bad_prefix_cache_argument_is_one_line():
    wl = _workload([(0, 40, 2, [1, 2, 3, 4])])
    with pytest.raises(ScenarioError, match="prefix_cache"):
        simulate(_scenario(), "round-robin", horizon=10.0, service="tokens", workload=wl, prefix_cache="yes")
    bare = TraceWorkload(wl.frame[["time", "prompt", "output", "cls"]], ("c",))
    with pytest.raises(ScenarioError, match="no block hashes"):
        simulate(_scenario(), "round-robin", horizon=10.0, service="tokens", workload=bare, prefix_cache=True)
    with pytest.raises(ScenarioError, match="no token model"):
        simulate(_scenario(), "round-robin", horizon=10.0, service="markov", workload=wl, prefix_cache=True)


# -- the compiled core and the Python engine, cache on ----------------------------------------------------
@functools.cache
def _mooncake(speedup: float):
    """The Mooncake example scenario and the whole trace replayed at ``speedup``, read once per process:
    reading the 12,031 JSON lines was about 0.37 CPU-s of each of some 80 tests. Both are immutable (a
    frozen dataclass; a TraceWorkload hands out a new iterator per run), so tests may share them."""
    from fluidopt.scenario import load_scenario
    from fluidopt.workloads.traces import replay

    return replay(MOONCAKE, load_scenario(ROOT / "examples/scenarios/mooncake-conversation.toml"), speedup=speedup)


@functools.cache
def _mooncake_prefix(n_requests: int, speedup: float):
    sc, wl = _mooncake(speedup)
    wl = TraceWorkload(wl.frame[["time", "prompt", "output", "cls"]], wl.class_names, max_requests=n_requests,
                       hashes=wl.hashes, block_size=wl.block_size)
    return sc, wl


@pytest.mark.integration
@needs_core
@needs_mooncake
@pytest.mark.parametrize("policy", sorted(p for p in available() if not p.startswith("sb3-")))
def test_compiled_and_python_agree_with_the_cache_on(policy, tmp_path):
    # 250 requests compressed 3 times on 4 GPUs with an 80,000-token KV cache: evictions of cached
    # blocks, preemptions and re-prefills under every registered policy
    # (a patience, so that the LP-guided policies' fluid plans are feasible: requests may abandon)
    sc, wl = _mooncake_prefix(250, 3.0)
    sc = replace(sc, gpus=4, gpu=replace(sc.gpu, kv_capacity=80000.0),
                 classes=tuple(replace(c, patience=60.0) for c in sc.classes))
    out = {}
    for backend in ("compiled", "python"):
        path = tmp_path / f"{backend}.csv"
        res = simulate(sc, policy, horizon=wl.duration + 300.0, warmup=5.0, seed=3, service="tokens", workload=wl,
                       records=path, progress=False, backend=backend, batches=4)
        out[backend] = (res, path.read_bytes())
    (a, fa), (b, fb) = out["compiled"], out["python"]
    assert a.events == b.events and a.totals == b.totals
    pd.testing.assert_frame_equal(a.per_class, b.per_class, check_exact=True)
    pd.testing.assert_frame_equal(a.meta["prefix_cache"], b.meta["prefix_cache"], check_exact=True)
    assert a.meta["prefix_cache_evictions"] == b.meta["prefix_cache_evictions"]
    assert fa == fb
    assert a.totals["cached_prompt_tokens"] > 0


@needs_core
@needs_mooncake
def test_compiled_and_python_agree_on_the_cached_timing_with_evictions(tmp_path):
    sc, wl = _mooncake_prefix(400, 2.0)
    sc = replace(sc, gpus=3, gpu=replace(sc.gpu, kv_capacity=60000.0))
    got = []
    for backend in ("compiled", "python"):
        path = tmp_path / f"{backend}.csv"
        res = simulate(sc, "least-requests", horizon=wl.duration + 600.0, service="tokens", workload=wl, records=path,
                       progress=False, backend=backend)
        got.append((res.totals, res.meta["prefix_cache_evictions"], path.read_bytes()))
    assert got[0] == got[1]
    assert got[0][0]["preemptions"] > 0 and got[0][1] > 0


def _with_law(sc: Scenario, c: float = 1e-5) -> Scenario:
    from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw

    law = IterationLaw(PrefillLaw(0.01, 0.001, c), DecodeLaw((0.025, 2e-6, 1e-3), (0.02, 3e-6, 2e-3), 3))
    return replace(sc, gpu=replace(sc.gpu, timemodel=law))


def test_a_law_charges_the_uncached_tokens_and_their_attention_over_the_cached_prefix(tmp_path):
    # prefill 0.01 + 0.001 l + 1e-5 ((o + l)^2 - o^2). Request 1 (40 tokens): 0.01 + 0.04 + 0.016 = 0.066 s
    # whole, 4 chunks 0.04 + 0.04 + 0.016 = 0.096 s. Request 2 finds 30 tokens and computes 15 over them:
    # whole 0.01 + 0.015 + 1e-5 (45^2 - 30^2) = 0.03625 s; chunked 10 over 30 (0.01 + 0.01 + 0.007) then 5
    # over 40 (0.01 + 0.005 + 0.00425): 0.04625 s
    wl = _workload([(0, 40, 2, [1, 2, 3, 4]), (100, 45, 2, [1, 2, 3, 9, 10])])
    whole, _ = _records(tmp_path, _with_law(_scenario()), wl)
    chunked, _ = _records(tmp_path, _with_law(_scenario()), wl, "round-robin-chunked", name="chunked.csv")
    assert whole.cached_prompt.tolist() == [0, 30]
    assert whole.ttft.tolist() == pytest.approx([0.066, 0.03625], abs=1e-12)
    assert chunked.ttft.tolist() == pytest.approx([0.096, 0.04625], abs=1e-12)


@pytest.mark.integration
@needs_core
@needs_mooncake
@pytest.mark.parametrize("policy", ["round-robin", "round-robin-chunked", "sglang", "dynamo-kv-chunked", "gate-and-route"])
def test_compiled_and_python_agree_under_a_law_with_the_cache_on(policy, tmp_path):
    # the law's clock (timelaw.refresh, the same cold code in both) beside the compiled and the Python kernel:
    # cached prefixes (attention over them), preemptions, re-prefills and a batch-size switch
    sc, wl = _mooncake_prefix(250, 3.0)
    sc = replace(_with_law(sc, 2e-9), gpus=4, gpu=replace(_with_law(sc, 2e-9).gpu, kv_capacity=80000.0),
                 classes=tuple(replace(c, patience=60.0) for c in sc.classes))
    got = []
    for backend in ("compiled", "python"):
        path = tmp_path / f"{backend}.csv"
        res = simulate(sc, policy, horizon=wl.duration + 300.0, warmup=5.0, seed=3, service="tokens", workload=wl,
                       records=path, progress=False, backend=backend, batches=4)
        got.append((res.events, res.totals, path.read_bytes()))
    assert got[0] == got[1]
    assert got[0][1]["cached_prompt_tokens"] > 0


def test_the_hit_ratio_is_a_ratio_of_the_totals(tmp_path):
    wl = _workload([(0, 40, 2, [1, 2, 3, 4]), (50, 40, 2, [1, 2, 5, 6]), (100, 40, 2, [1, 7, 8, 9])])
    _, res = _records(tmp_path, _scenario(), wl)
    s = res.summary()
    assert s["cached_prompt_tokens"] == 20 + 10 and s["prompt_tokens"] == 120
    assert s["hit_ratio"] == pytest.approx(30 / 120)
    assert [i["cached_prompt_tokens"] for i in s["instances"]] == [30]
    assert math.isclose(s["classes"][0]["hit_ratio"], 0.25)
    assert np.array_equal(res.meta["prefix_cache"]["prefilled"].to_numpy(), [3])


@needs_mooncake
def test_the_set_path_and_renumbered_ids_give_the_same_numbers(monkeypatch):
    # the never-evicting cache keeps one byte per (GPU, block) up to _DENSE_BYTES, else sets; block ids
    # that are not small non-negative integers are renumbered. Neither changes a number.
    import fluidopt.sim.prefix_cache as PC

    sc, wl = _mooncake_prefix(600, 2.0)
    sc = replace(sc, gpus=4)

    def run(w):
        res = simulate(sc, "jsq", horizon=w.duration + 600.0, service="tokens", workload=w, progress=False,
                       backend="python")
        return res.totals, res.meta["prefix_cache"]

    dense = run(wl)
    big = TraceWorkload(wl.frame[["time", "prompt", "output", "cls"]], wl.class_names,
                        hashes=[np.asarray(h) * 7919 - (1 << 40) for h in wl.hashes], block_size=wl.block_size)
    renumbered = run(big)
    monkeypatch.setattr(PC, "_DENSE_BYTES", 0)
    sets = run(wl)
    for other in (renumbered, sets):
        assert other[0] == dense[0]
        pd.testing.assert_frame_equal(other[1], dense[1])
    assert dense[0]["cached_prompt_tokens"] > 0


@needs_core
def test_the_compiled_core_runs_the_compiled_cache_when_it_is_built():
    from fluidopt.sim.prefix_cache import PrefixCache, compiled_class

    cls, why = compiled_class()
    if cls is None:
        pytest.skip(f"fluidopt.sim._c_prefix_cache: {why}")
    wl = _workload([(0, 40, 2, [1, 2, 3, 4])])
    kinds = {}
    for backend in ("compiled", "python"):
        eng = make_engine(_scenario(), "round-robin", horizon=10.0, service="tokens", workload=wl, progress=False,
                          backend=backend)
        kinds[backend] = type(eng._pc)
    assert kinds == {"compiled": cls, "python": PrefixCache}


@needs_mooncake
def test_the_typed_lru_and_the_dicts_give_the_same_numbers(monkeypatch, tmp_path):
    # with a KV capacity the cache keeps typed slots per (GPU, block) up to _LRU_BYTES, else dicts and an
    # OrderedDict per GPU: the same holds, releases and evictions, in the same order
    import fluidopt.sim.prefix_cache as PC

    sc, wl = _mooncake_prefix(500, 2.5)
    sc = replace(sc, gpus=3, gpu=replace(sc.gpu, kv_capacity=70000.0))

    def run(name):
        path = tmp_path / name
        res = simulate(sc, "least-requests", horizon=wl.duration + 600.0, service="tokens", workload=wl,
                       records=path, progress=False, backend="python")
        return res.totals, res.meta["prefix_cache_evictions"], path.read_bytes()

    typed = run("typed.csv")
    monkeypatch.setattr(PC, "_LRU_BYTES", 0)
    dicts = run("dicts.csv")
    assert typed == dicts
    assert typed[1] > 0 and typed[0]["preemptions"] > 0
