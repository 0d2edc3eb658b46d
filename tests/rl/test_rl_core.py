"""The MDP pieces without torch/gymnasium: reward terms on hand-computed states, the state vector."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from fluidopt.core.errors import ScenarioError
from fluidopt.rl.core import RewardConfig, RouterCore, episode_workload, in_system, obs_dim
from fluidopt.rl.predictors import BUCKET_TOKENS, NoisyOracle
from fluidopt.scenario import load_scenario
from fluidopt.sim.api import make_engine
from fluidopt.workloads import TraceWarning

from .conftest import RL_SCENARIO, blocked_workload, tiny_scenario


def test_reward_config_variants():
    b, wa, wg = (RewardConfig(variant=v) for v in ("baseline", "wa", "wg"))
    assert b.guidance_weight(0) == 0.0 and b.discount(3) == 0.99
    assert wa.guidance_weight(0) == wa.guidance_weight(9) == 1.0 and wa.discount(0) == 0.99
    assert wg.guidance_weight(0) == pytest.approx(0.99) and wg.discount(0) == 0.0
    assert wg.guidance_weight(4) == pytest.approx(0.99 * math.exp(-2.0))
    assert wg.discount(4) == pytest.approx(0.99 * (1 - math.exp(-2.0)))
    assert wg.guidance_weight(4) + wg.discount(4) == pytest.approx(0.99)
    with pytest.raises(ScenarioError, match="variant"):
        RewardConfig(variant="xx")


def test_r_mix_hand_computed():
    rc = RewardConfig()  # grad1 3.2e-4, grad2 1/30000, eps 1 s, alpha 0.5
    # light instance: T_p = 3.2e-4 * (100 + 1000) = 0.352 s <= eps -> r_p = 1
    assert rc.r_mix(1000, 100, 128) == pytest.approx(0.5 * 1 + 0.5 * -(1000 + 100 + 128) / 30000)
    # loaded: T_p = 3.2e-4 * 6100 = 1.952 s -> r_p = 1 - 1.952 = -0.952
    assert rc.r_mix(6000, 100, 128) == pytest.approx(0.5 * (1 - 1.952) + 0.5 * -(6000 + 228) / 30000)


def _engine(scenario, workload, core, horizon=200.0):
    eng = make_engine(scenario, core, horizon=horizon, service="tokens", seed=1, workload=workload, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        eng.start()
    return eng


def test_progress_penalty_and_guidance_on_a_hand_built_state():
    sc = tiny_scenario()
    wl = blocked_workload(batch=2, n_short=3, long_out=3000)  # 2 long (t=0, 0.001), 3 short (0.05, 0.15, 0.25)
    core = RouterCore(sc.gpu, predictor=NoisyOracle(1.0), pin={0: 0, 1: 0})
    eng = _engine(sc, wl, core)
    eng.advance(0.12)  # both long requests pinned to instance 0 and decoding; the first short one waits in the router queue
    gpu = sc.gpu
    T_long = gpu.alpha + gpu.beta * 50 + BUCKET_TOKENS[2] * gpu.tau_solo
    T_short = gpu.alpha + gpu.beta * 50 + BUCKET_TOKENS[0] * gpu.tau_solo
    assert eng.qlen(core.router_queue) == 1
    assert core.sum_invT == pytest.approx(2 / T_long + 1 / T_short)
    # the long ones are decoding: P = sum 1/T - sum_decoding (1/T) o / d
    gens = [eng.req_generated(r) for r in core.dec[0]]
    assert len(gens) == 2 and min(gens) >= 1
    expect = 2 / T_long + 1 / T_short - sum(g / (T_long * BUCKET_TOKENS[2]) for g in gens)
    assert core.progress_penalty(eng) == pytest.approx(expect, rel=1e-12)
    # guidance: instance 1 is empty, instance 0 carries 2 x (50 + 3072) tokens
    r = eng.head(core.router_queue)
    rc = core.reward
    mx0 = rc.r_mix(2 * (50 + BUCKET_TOKENS[2]), 50, BUCKET_TOKENS[0])
    mx1 = rc.r_mix(0.0, 50, BUCKET_TOKENS[0])
    assert core.mixing(eng, r) == pytest.approx([mx0, mx1])
    assert core.guidance(eng, r, 1) == 0.0
    assert core.guidance(eng, r, 0) == pytest.approx(mx0 - mx1) and mx0 < mx1
    assert core.guidance(eng, r, 2) == 0.0  # wait
    # the state vector: 6 per instance + 3, all in [0, 1]
    obs = core.observe(eng)
    assert obs.shape == (obs_dim(2),) and obs.dtype == np.float32
    assert (obs >= 0).all() and (obs <= 1).all()
    B = sc.gpu.batch
    assert obs[0] == 0.0 and obs[3] == pytest.approx(2 / B)  # instance 0: no prompt phase, 2 in bucket 2
    assert obs[4] == pytest.approx(min((B - 2) / B, (100000 - eng.gpu_kv_used(0)) / 100000), rel=1e-6)
    assert obs[6:12].tolist() == [0.0, 0.0, 0.0, 0.0, 1.0, 0.0]  # instance 1 idle
    assert obs[12] == pytest.approx(1 / 512)
    assert obs[13] == pytest.approx(math.log2(51) / 12, rel=1e-6) and obs[14] == 0.0
    # send it to 1: the ledgers move and the request completes; P drops by its 1/T
    core.dispatch(eng, r, 1)
    assert core.cnt[1] == [1, 0, 0] and core.n_prompt[1] == 1 and core.load[1] == 50 + BUCKET_TOKENS[0]
    eng.advance(0.6)
    assert core.n_prompt[1] == 0 and core.completed == 1  # prefill ~0.033 s + 20 tokens x ~0.017 s
    assert core.sum_invT == pytest.approx(2 / T_long + 2 / T_short)  # two more short ones wait (t = 0.15, 0.25)
    eng.finish()


def test_episode_workload_and_layout_of_the_paper_setting():
    sc = load_scenario(RL_SCENARIO)
    assert sc.gpus == 4 and sc.gpu.batch == 128 and obs_dim(4) == 27
    wl = episode_workload(sc, 2000, 5)
    assert wl.n_requests == 2000
    assert episode_workload(sc, 2000, 5).frame.equals(wl.frame)
    assert 80 < wl.duration < 120  # 2,000 arrivals at 20 per second
    assert not episode_workload(sc, 2000, 6).frame.equals(wl.frame)


def test_markov_service_runs_with_a_degenerate_state():
    # every registered controller runs in both services; without tokens nothing is generated early
    sc = tiny_scenario(kv=None)
    core = RouterCore(sc.gpu, pin={i: i % 2 for i in range(20)})
    eng = make_engine(sc, core, horizon=10.0, service="markov", seed=0, workload=blocked_workload(batch=4, n_short=16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        eng.start()
    eng.advance(1.0)
    obs, P = core.observe_with_penalty(eng)
    assert P == pytest.approx(core.sum_invT)  # no request has generated a token yet
    assert (obs >= 0).all() and (obs <= 1).all()
    eng.finish()


def test_in_system_counts(tiny):
    core = RouterCore(tiny.gpu, pin={i: 0 for i in range(10)})
    eng = _engine(tiny, blocked_workload(batch=3, n_short=2), core)
    eng.advance(0.2)
    assert in_system(eng) == 5
    eng.finish()


def _brute_penalty(core, eng):
    """P by definition: a loop over every decoding request with the engine's own token counts."""
    done = core.banked
    for g in range(core.n):
        for r, e in core.dec[g].items():
            o = eng.req_generated(r)
            done += e[1] if o >= e[4] else e[2] * o
    return core.sum_invT - done


@pytest.mark.integration
def test_o1_progress_and_state_match_brute_force_under_preemption():
    # a small KV cache and long outputs: instances preempt (recompute) and requests outrun predictions
    from fluidopt.scenario import scenario_from_dict

    sc = scenario_from_dict({
        "gpu": {"alpha": 0.017, "beta": 3.2e-4, "tau_solo": 0.017, "chunk": 256, "batch": 16,
                "kv_capacity": 3000, "kv_time_per_token": 7e-7},
        "cluster": {"gpus": 3},
        "classes": [{"name": "a", "prompt": 100, "decode": 150, "rate": 12.0},
                    {"name": "b", "prompt": 300, "decode": 400, "rate": 3.0}],
    })
    wl = episode_workload(sc, 300, 11)
    core = RouterCore(sc.gpu, predictor=NoisyOracle(0.6, seed=2))
    core.pause_on_decision = True
    core.pause_at_resolved = 300
    eng = _engine(sc, wl, core, horizon=3000.0)
    rng = np.random.default_rng(0)
    checked = 0
    while core.resolved < 300 and not eng.done:
        eng.advance(2999.0)
        if eng.qlen(core.router_queue):
            obs, P = core.observe_with_penalty(eng)
            assert P == pytest.approx(_brute_penalty(core, eng), rel=1e-9, abs=1e-9)
            for g in range(core.n):  # earliest completion: min over decoding requests of predicted - generated
                rem = [e[4] - eng.req_generated(r) for r, e in core.dec[g].items()]
                rem = [x for x in rem if x > 0]
                if rem:
                    tau = sc.gpu.tau_solo + sc.gpu.kv_time_per_token * eng.gpu_kv_used(g)
                    assert obs[6 * g + 5] == pytest.approx(min(1.0, min(rem) * tau / 10.0), rel=1e-5)
            # the count entries are cached between events (refilled for instances marked dirty):
            # they equal the engine's own queues and instances, by predicted bucket
            B = float(eng.batch)
            for g in range(core.n):
                queued = eng.queue_requests(eng.instance_queue(g))
                on_gpu = eng.gpu_requests(g)
                pre = eng.gpu_prefill(g)
                counts = [0, 0, 0]
                for r in queued + on_gpu:
                    counts[core.rec[r][1]] += 1
                want = [len(queued) + (pre >= 0)] + counts
                assert obs[6 * g: 6 * g + 4].tolist() == [np.float32(min(1.0, x / B)) for x in want]
            core._dirty = [True] * core.n  # a full refill gives the same vector, bit for bit
            again, P2 = core.observe_with_penalty(eng)
            assert np.array_equal(again, obs) and P2 == P
            checked += 1
            r = eng.head(core.router_queue)
            core.dispatch(eng, r, int(rng.integers(core.n)))
    res = eng.finish()
    assert checked >= 300 and res.cluster["preemptions"] > 0 and core.resolved == 300


@pytest.mark.parametrize("same", [True, False])
def test_bulk_predictions_are_the_predictors_own(tiny, same):
    # RouterCore.precompute predicts a trace in bulk; route uses that only for the arrival with the
    # same index, time and output, so a stale table (another trace) falls back to the predictor
    wl = episode_workload(tiny, 150, 4)
    other = episode_workload(tiny, 150, 5)
    orc = NoisyOracle(0.6, seed=9)
    core = RouterCore(tiny.gpu, predictor=orc)
    core.precompute(wl if same else other)
    assert core.predicted is not None
    core.pause_on_decision = True
    core.pause_at_resolved = 150
    eng = _engine(tiny, wl, core, horizon=500.0)
    seen = set()
    while core.resolved < 150 and not eng.done:
        eng.advance(499.0)
        for r in eng.queue_requests(core.router_queue):
            assert core.held[r][0] == orc.bucket(eng, r)
            seen.add((eng.req_arrival(r), r))
        if eng.qlen(core.router_queue):
            core.dispatch(eng, eng.head(core.router_queue), len(seen) % 2)
    eng.finish()
    assert len(seen) >= 150
