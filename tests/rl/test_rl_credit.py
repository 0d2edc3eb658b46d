"""Per-request credit (objectives ``request-latency`` / ``request-normalized``, docs/rl.md section 2).

Each dispatch is credited, when its request resolves, with minus the request's time from dispatch to
resolution (or, request-normalized, minus its time to first token plus the predicted output times its
time per output token); ``RouterEnv.last_credits`` lists (index of the dispatching step, credit) and
the step's reward is their sum. Request ids are engine slots, reused once a request has left."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fluidopt.rl.core import RewardConfig
from fluidopt.workloads import TraceWorkload
from tests.rl.conftest import RL_SCENARIO, tiny_scenario

pytest.importorskip("gymnasium")

LAT = RewardConfig(variant="baseline", objective="request-latency")
NORM = RewardConfig(variant="baseline", objective="request-normalized")
EXCESS = RewardConfig(variant="baseline", objective="request-excess")


def _workload(rows) -> TraceWorkload:
    df = pd.DataFrame(rows, columns=["time", "prompt", "output", "cls"])
    return TraceWorkload(df, ("short", "long"), name="credit")


# tiny_scenario(): alpha = tau = 0.017 s, beta = 3.2e-4 s per prompt token, 7e-7 s per resident KV token.
# Prefill of p tokens: 0.017 + 3.2e-4 p + 7e-7 p (the first token); then `output` decode iterations,
# the j-th (0-based) 0.017 + 7e-7 (p + j).
def _prefill(p: int) -> float:
    return 0.017 + 3.2e-4 * p + 7e-7 * p


def _decode(p: int, out: int) -> float:
    return sum(0.017 + 7e-7 * (p + j) for j in range(out))


def _solo(p: int, out: int) -> float:  # the solo service time alpha + beta p + out tau_solo of request-excess
    return 0.017 + 3.2e-4 * p + out * 0.017


@pytest.mark.parametrize("reward", [LAT, NORM, EXCESS], ids=["request-latency", "request-normalized", "request-excess"])
def test_credit_on_a_hand_computed_case(reward):
    """Request 0 (50 prompt, 20 output tokens) arrives at 1 ms, request 1 (100, 10) at 30 ms. Decisions
    at 0.02 s (request 0 to instance 0; multi-dispatch, the queue is then empty, the environment runs
    to the next decision) and 0.04 s (request 1 to instance 1; the episode then runs to its end).
    request-latency: -0.373868 and -0.2198015 s. request-normalized with the exact oracle (both in
    bucket 0, 128 predicted tokens): -(prefill) - 128 x decode / output. request-excess: request-latency
    plus the solo time; on idle instances only the KV terms are left (-0.000868 and -0.0008015 s)."""
    from fluidopt.rl.env import RouterEnv

    wl = _workload([(0.001, 50, 20, 0), (0.03, 100, 10, 0)])
    env = RouterEnv(tiny_scenario(), reward=reward, workload=wl, multi_dispatch=True, accuracy=1.0)
    env.reset(seed=0)
    assert env.eng.now == pytest.approx(0.02)
    _, r, term, trunc, _ = env.step(0)
    assert env.eng.now == pytest.approx(0.04) and not (term or trunc)
    assert r == 0.0 and env.last_credits == []  # nothing resolved yet
    _, r, term, trunc, _ = env.step(1)
    assert term and not trunc
    if reward is LAT:
        c0, c1 = -(_prefill(50) + _decode(50, 20)), -(_prefill(100) + _decode(100, 10))
        assert c0 == pytest.approx(-0.373868, abs=1e-12) and c1 == pytest.approx(-0.2198015, abs=1e-12)
    elif reward is NORM:
        c0 = -_prefill(50) - 128 * _decode(50, 20) / 20
        c1 = -_prefill(100) - 128 * _decode(100, 10) / 10
    else:
        c0 = -(_prefill(50) + _decode(50, 20)) + _solo(50, 20)
        c1 = -(_prefill(100) + _decode(100, 10)) + _solo(100, 10)
        assert c0 == pytest.approx(-0.000868, abs=1e-12) and c1 == pytest.approx(-0.0008015, abs=1e-12)
    credits = dict(env.last_credits)
    assert sorted(credits) == [0, 1]  # keyed by the index of the dispatching step
    assert [i for i, _ in env.last_credits] == [1, 0]  # in order of resolution: request 1 finishes first
    assert credits[0] == pytest.approx(c0, abs=1e-12)
    assert credits[1] == pytest.approx(c1, abs=1e-12)
    assert r == pytest.approx(c0 + c1, abs=1e-12)
    res = env.result()
    if reward is LAT:  # the credit is the end-to-end latency less the router wait (19 ms and 10 ms)
        assert -(c0 + c1) == pytest.approx(2 * res.cluster["e2e_mean"] - 0.019 - 0.010, abs=1e-12)


@pytest.mark.parametrize("reward", [LAT, NORM, EXCESS], ids=["request-latency", "request-normalized", "request-excess"])
def test_every_dispatch_is_credited_exactly_once(reward):
    """A 300-request episode (ids recycled) with a fixed mixed policy, dispatches and waits: the credited
    step indices are exactly the dispatching steps, once each; no wait is credited; the rewards sum to the
    credits; request-latency's credits sum to minus (total time in system - total router wait)."""
    from fluidopt.rl.env import RouterEnv
    from fluidopt.scenario import load_scenario

    env = RouterEnv(load_scenario(RL_SCENARIO), reward=reward, n_requests=300, multi_dispatch=True, reward_scale=0.01)
    env.reset(seed=5)
    m = env.m
    dispatched, credited, ids = [], [], []
    total = credit_sum = 0.0
    done, k = False, 0
    while not done:
        a = k % m if k % 7 else m  # mostly dispatches, some waits
        if a < m:
            dispatched.append(k)
            ids.append(env.eng.head(env.core.router_queue))
        _, r, term, trunc, _ = env.step(a)
        for i, c in env.last_credits:
            credited.append(i)
            credit_sum += c
            assert c < 0.0
        total += r
        k += 1
        done = term or trunc
    assert term
    assert len(ids) == 300 and len(set(ids)) < 300  # every request dispatched once; some ids reused
    assert sorted(credited) == dispatched
    assert len(set(credited)) == len(credited)
    assert total == pytest.approx(credit_sum, rel=1e-12)
    core = env.core
    assert core.departures == [] and env._pending == {}
    if reward is LAT:
        busy = core.time_in_system(env.eng.now) - core.router_wait  # request-seconds from dispatch to departure
        assert credit_sum == pytest.approx(-0.01 * busy, rel=1e-9)


@pytest.mark.parametrize("reward", [LAT, EXCESS], ids=["request-latency", "request-excess"])
def test_truncation_credits_pending_dispatches_up_to_the_truncation(reward):
    """3,000-token outputs, truncated at 0.5 s (nothing finishes): every dispatched request is credited at
    truncation with minus the time from its dispatch (request-excess: less its solo time, 51 s, capped at
    0); requests never dispatched get no credit."""
    from fluidopt.rl.env import RouterEnv

    wl = _workload([(0.001, 50, 3000, 0), (0.002, 50, 3000, 0), (0.003, 50, 3000, 0)])
    env = RouterEnv(tiny_scenario(), reward=reward, workload=wl, max_time=0.5)  # one dispatch per epoch
    env.reset(seed=0)
    times = []
    done = False
    while not done:
        a = 0 if not times else 2  # dispatch one request, then wait
        if a == 0:
            times.append(env.eng.now)
        _, r, term, trunc, _ = env.step(a)
        done = term or trunc
        if not done:
            assert env.last_credits == []
    assert trunc and not term
    t = env.eng.now
    assert t == pytest.approx(0.5)
    c = -(t - times[0]) if reward is LAT else 0.0
    assert env.last_credits == [(0, pytest.approx(c, abs=1e-12))]
    assert r == pytest.approx(c, abs=1e-12)


def test_a_reused_id_is_not_credited_with_an_earlier_departure():
    """Request 0 (1 output token) is pinned to instance 0 and leaves before the first decision; request 1
    arrives at 0.1 s and gets the same engine id. Its credit is its own: dispatched at 0.12 s, prefill +
    20 decode iterations on an idle instance, not the pinned request's departure."""
    from fluidopt.rl.env import RouterEnv

    wl = _workload([(0.001, 50, 1, 0), (0.1, 50, 20, 0)])
    env = RouterEnv(tiny_scenario(), reward=LAT, workload=wl, pin={0: 0})
    env.reset(seed=0)
    assert env.eng.now == pytest.approx(0.12)
    assert env.core.resolved == 1 and env.eng.head(env.core.router_queue) == 0  # the pinned request's id
    _, r, term, _, _ = env.step(1)
    assert term
    c = -(_prefill(50) + _decode(50, 20))
    assert env.last_credits == [(0, pytest.approx(c, abs=1e-12))]
    assert r == pytest.approx(c, abs=1e-12)


def test_the_default_objectives_log_nothing():
    from fluidopt.rl.env import RouterEnv

    env = RouterEnv(tiny_scenario(), reward=RewardConfig(variant="baseline", objective="time-in-system"),
                    workload=_workload([(0.001, 50, 20, 0)]))
    env.reset(seed=0)
    assert env.core.departures is None and env.core.first_token is None
    env.step(0)
    assert env.last_credits == []


def _tiny_train(objective: str):
    from fluidopt.rl.dqn import DQNConfig, train

    cfg = DQNConfig(variant="wg", episodes=2, n_requests=40, seed=3, objective=objective, arch="shared",
                    multi_dispatch=True, wait_mask="fits", learn_starts=16, batch_size=16, target_sync=20,
                    eps_episodes=2)
    return train(tiny_scenario(), cfg)


@pytest.mark.parametrize("objective", ["request-latency", "request-normalized", "request-excess"])
def test_training_on_per_request_credit_is_deterministic(objective):
    pytest.importorskip("torch")
    import json

    a, b = _tiny_train(objective), _tiny_train(objective)
    assert json.loads(a.net.config)["objective"] == objective
    assert a.state["updates"] > 0
    assert len(a.net.layers) == len(b.net.layers)
    for (wa, ba), (wb, bb) in zip(a.net.layers, b.net.layers):
        assert np.array_equal(wa, wb) and np.array_equal(ba, bb)
    pd.testing.assert_frame_equal(a.curves.drop(columns="wall_seconds"), b.curves.drop(columns="wall_seconds"))
