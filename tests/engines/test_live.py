"""The incremental engine (fluidopt.engines.live) against the batch stepper: same arrivals, same rules,
so the same iteration count, first-token and finish times, request by request."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw
from fluidopt.engines import engine_config, replay
from fluidopt.engines.live import LiveEngine

LAW = IterationLaw(PrefillLaw(0.02, 1.5e-4, 1e-8), DecodeLaw((0.02, 6e-7, 6e-5), (0.018, 5e-7, 1.2e-4), 40))


def drive(law, cfg, arrival, prompt, output):
    """The serving loop of fluidopt.serving.engine_server on a virtual clock."""
    eng = LiveEngine(law, cfg)
    n = len(arrival)
    first = np.full(n, np.nan)
    done = np.full(n, np.nan)
    ids: dict[int, int] = {}
    now, nxt = 0.0, 0
    while True:
        while nxt < n and arrival[nxt] <= now:
            try:
                ids[eng.add(prompt[nxt], output[nxt])] = nxt
            except ValueError:
                pass  # too long: the stepper drops it too
            nxt += 1
        s = eng.step()
        if s is None:
            if nxt >= n:
                break
            now = max(now, arrival[nxt])
            continue
        now += s.duration
        for r, k in s.tokens.items():
            if k >= 1 and math.isnan(first[ids[r]]):
                first[ids[r]] = now
        for r in s.finished:
            done[ids[r]] = now
    return eng, first, done


@pytest.mark.parametrize("engine", ["vllm", "chunked", "paper"])
@pytest.mark.parametrize("kv_tokens", [None, 6000])
def test_live_engine_equals_the_stepper(engine, kv_tokens):
    rng = np.random.default_rng(7)
    n = 300
    arrival = np.cumsum(rng.exponential(0.05, n))
    prompt = rng.integers(20, 1500, n)
    output = rng.integers(1, 300, n)
    cfg = engine_config(engine, kv_tokens=kv_tokens)
    want = replay(LAW, cfg, arrival, prompt, output)
    eng, first, done = drive(LAW, cfg, arrival, prompt, output)
    assert eng.iterations == want.iterations
    assert eng.prefill_iterations == want.prefill_iterations
    np.testing.assert_allclose(first, want.first_token, rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(done, want.finish, rtol=1e-12, equal_nan=True)
    if kv_tokens is not None:
        assert sum(eng.preemptions) == int(want.preemptions.sum())


def test_small_cache_preempts_and_still_matches():
    """A cache of 1,000 tokens forces preemptions; counts and times still agree."""
    rng = np.random.default_rng(3)
    n = 80
    arrival = np.cumsum(rng.exponential(0.01, n))
    prompt = rng.integers(50, 300, n)
    output = rng.integers(50, 400, n)
    cfg = engine_config("vllm", kv_tokens=1000)
    want = replay(LAW, cfg, arrival, prompt, output)
    eng, first, done = drive(LAW, cfg, arrival, prompt, output)
    assert want.preemptions.sum() > 0
    assert sum(eng.preemptions) == eng.n_preemptions == int(want.preemptions.sum())
    np.testing.assert_allclose(done, want.finish, rtol=1e-12)


def test_tokens_stream_one_per_decode_iteration():
    """One request alone: prefill emits token 1, then each decode iteration one more, the last finishing it."""
    eng = LiveEngine(LAW, engine_config("vllm"))
    r = eng.add(100, 4)
    seen = []
    while (s := eng.step()) is not None:
        seen.append((s.tokens.get(r), r in s.finished))
    assert seen == [(1, False), (2, False), (3, False), (4, True)]
    assert not eng.busy()
    with pytest.raises(ValueError, match="longer than this engine takes"):
        eng.add(5000, 1)
