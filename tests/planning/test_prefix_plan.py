"""The capacity plan of a trace with a prefix cache (fluidopt.planning.prefix; docs/prefix-cache.md, "The capacity
plan"): hand-computed replays (TTFT, served share, hit ratio), the fleet search, and the fluid plan's identities."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from fluidopt import GPUProfile, RequestClass, Scenario
from fluidopt.core.errors import UsageError
from fluidopt.planning.prefix import TraceSLO, fluid_cache_plan, replay_check, smallest_fleet
from fluidopt.workloads import TraceWorkload

pytestmark = pytest.mark.filterwarnings("ignore::fluidopt.workloads.base.TraceWarning")


def _scenario() -> Scenario:
    # a whole-prompt prefill of P uncached tokens takes alpha + beta P = 0.01 + 0.001 P s (vLLM's prefill
    # first, no chunking); nobody abandons
    gpu = GPUProfile.from_gamma(alpha=0.01, beta=0.001, gamma=40.0, chunk=10, batch=4)
    return Scenario(gpu=gpu, gpus=1, classes=(RequestClass("c", prompt=40, decode=2, rate=0.1, patience=0.0),),
                    prefill_price=0.1, decode_price=0.2, name="prefix-plan")


def _workload(rows, block: int = 10) -> TraceWorkload:
    """rows: (time, prompt, output, block ids)."""
    frame = pd.DataFrame({"time": [float(r[0]) for r in rows], "prompt": [r[1] for r in rows],
                          "output": [r[2] for r in rows], "cls": [0] * len(rows)})
    return TraceWorkload(frame, ("c",), hashes=[np.asarray(r[3], np.int64) for r in rows], block_size=block)


# four requests 10 s apart, each done long before the next; the third shares nothing, the second its
# first two blocks (20 tokens) with the first, the fourth its first three (30 tokens)
ROWS = [(0, 40, 2, [1, 2, 3, 4]), (10, 40, 2, [1, 2, 5, 6]), (20, 40, 2, [7, 8, 9, 10]), (30, 40, 2, [1, 2, 3, 11])]


def test_a_replay_on_one_gpu_gives_the_hand_computed_ttft_served_share_and_hit_ratio():
    c = replay_check(_scenario(), _workload(ROWS), 1, "round-robin", TraceSLO(served=0.75))
    cached = np.array([0, 20, 0, 30])
    ttft = 0.01 + 0.001 * (40 - cached)  # one prefill iteration over the uncached tokens
    assert c.metrics["ttft_mean"] == pytest.approx(ttft.mean(), abs=1e-9)
    assert c.metrics["ttft_p99"] == pytest.approx(np.percentile(ttft, 99), abs=1e-9)
    assert c.metrics["hit_ratio"] == pytest.approx(50 / 160)
    # the last request arrives at the trace's end, so it cannot be complete by then: 3 of 4
    assert c.metrics["served"] == 0.75 and c.metrics["completed"] == 1.0
    assert c.met and c.prefix_cache
    assert not replay_check(_scenario(), _workload(ROWS), 1, "round-robin", TraceSLO(served=0.76)).met
    off = replay_check(_scenario(), _workload(ROWS), 1, "round-robin", TraceSLO(served=0.75), prefix_cache=False)
    assert off.metrics["hit_ratio"] == 0.0
    assert off.metrics["ttft_mean"] == pytest.approx(0.05, abs=1e-9)
    # a TTFT bound between the two means separates them
    slo = TraceSLO(served=0.75, ttft_mean=0.04)
    assert replay_check(_scenario(), _workload(ROWS), 1, "round-robin", slo).met
    assert not replay_check(_scenario(), _workload(ROWS), 1, "round-robin", slo, prefix_cache=False).met


def test_the_search_finds_the_smallest_fleet_and_replays_the_one_below():
    # pairs of unrelated requests arriving together: round robin over two GPUs starts both at once
    # (TTFT 0.05 s each, the mean 0.05); one GPU cannot, so a mean TTFT of 0.05 s needs two
    rows = [(t, 40, 2, [100 * k + 10 * j + i for i in range(4)]) for k, t in enumerate((0, 10, 20, 30)) for j in (0, 1)]
    sc, wl = _scenario(), _workload(rows)
    slo = TraceSLO(served=0.75, ttft_mean=0.05 + 1e-9)
    n, checks = smallest_fleet(sc, wl, 1, "round-robin", slo, prefix_cache=False)
    assert n == 2 and [(c.gpus, c.met) for c in checks] == [(1, False), (2, True)]
    assert checks[1].metrics["ttft_mean"] == pytest.approx(0.05, abs=1e-9)
    n, checks = smallest_fleet(sc, wl, 2, "round-robin", slo, prefix_cache=False)
    assert n == 2 and [(c.gpus, c.met) for c in checks] == [(1, False), (2, True)]
    with pytest.raises(UsageError, match="plan: round-robin misses the SLO"):
        smallest_fleet(sc, wl, 1, "round-robin", TraceSLO(served=0.75, ttft_mean=0.01), prefix_cache=False)


def _long_prompt_trace(n: int = 400, seed: int = 7) -> TraceWorkload:
    # sessions of growing prompts (a turn extends the previous one by two blocks), long prompts and
    # short answers so that prefill binds the fluid fleet, as on Mooncake
    rng = np.random.default_rng(seed)
    rows, nxt, sessions = [], 0, []
    for i in range(n):
        if not sessions or rng.random() < 0.3:
            sessions.append([nxt, nxt + 1])
            nxt += 2
        s = sessions[rng.integers(len(sessions))]
        s += [nxt, nxt + 1]
        nxt += 2
        rows.append((i * 2.0, 512 * len(s), 20, list(s)))
    return _workload(rows, block=512)


def test_the_fluid_plan_with_h_is_the_blind_plan_scaled_by_one_minus_h_when_prefill_binds():
    from fluidopt.workloads.prefix import hit_ratio

    sc, wl = _scenario(), _long_prompt_trace()
    blind = fluid_cache_plan(sc, wl, None)
    assert blind.hit_ratio == 0.0 and blind.gpus == math.ceil(blind.n_fluid) and "prefill" in blind.binding
    p = fluid_cache_plan(sc, wl, "consistent-hash")
    # the fixed point: h is the rule's ratio over the plan's own fleet
    assert p.steps[-1][0] == p.gpus
    g = sc.gpu
    want = hit_ratio(wl, "consistent-hash", p.gpus, None, prefill_time_per_token=g.tau_mix / g.chunk,
                     decode_time_per_token=g.tau_mix)
    assert p.hit_ratio == want.hit_ratio and p.ideal == want.ideal and 0.3 < p.hit_ratio < 1
    # prefill work per request is (1 - h) P and it binds: the fleet shrinks in proportion
    assert "prefill" in p.binding
    assert p.n_fluid == pytest.approx(blind.n_fluid * (1 - p.hit_ratio), rel=1e-6)
    assert p.gpus < blind.gpus
