"""The time-in-system objective (docs/rl.md section 2): minus the request-seconds spent in the system.

An episode's undiscounted rewards sum to minus the total time in system of its requests (Little's
law over the episode): minus the sum of the end-to-end latencies when every request completes,
and, when the episode is truncated, minus the time each unresolved request has spent in the system
up to the truncation."""

from __future__ import annotations

import pandas as pd
import pytest

from fluidopt.rl.core import RewardConfig
from fluidopt.workloads import TraceWorkload
from tests.rl.conftest import RL_SCENARIO, tiny_scenario

pytest.importorskip("gymnasium")

TIS = RewardConfig(variant="baseline", objective="time-in-system")


def _three(output: int = 20) -> TraceWorkload:
    df = pd.DataFrame({"time": [0.001, 0.002, 0.003], "prompt": [50, 50, 50], "output": [output] * 3, "cls": [0, 0, 0]})
    return TraceWorkload(df, ("short", "long"), name="three")


def test_reward_on_a_hand_computed_state():
    """Three requests at 1, 2, 3 ms; the first decision is the tick at 0.02 s (3 in the router queue).
    A wait: one epoch, 3 requests in the system throughout, plus (first step) the time before the first
    decision: -(0.019 + 0.018 + 0.017) - 3 x 0.02 = -0.114. Dispatches within the epoch (multi-dispatch):
    no time passes, reward 0. The last dispatch runs the episode to its end; the sum is minus the total
    end-to-end latency."""
    from fluidopt.rl.env import RouterEnv

    env = RouterEnv(tiny_scenario(), reward=TIS, workload=_three(), multi_dispatch=True)
    env.reset(seed=0)
    assert env.eng.now == pytest.approx(0.02)
    _, r, *_ = env.step(2)  # wait
    assert env.eng.now == pytest.approx(0.04)
    assert r == pytest.approx(-0.114, abs=1e-12)
    total = r
    for a, expect in ((0, 0.0), (1, 0.0)):
        _, r, term, trunc, _ = env.step(a)
        assert r == expect and not (term or trunc)
        total += r
    _, r, term, trunc, _ = env.step(0)
    assert term and r < 0
    total += r
    res = env.result()
    assert res.totals["completed"] == 3
    assert total == pytest.approx(-3 * res.cluster["e2e_mean"], rel=1e-12)


def test_episode_sum_is_minus_the_total_end_to_end_latency():
    from fluidopt.rl.env import RouterEnv
    from fluidopt.scenario import load_scenario

    env = RouterEnv(load_scenario(RL_SCENARIO), reward=TIS, n_requests=200, multi_dispatch=True)
    env.reset(seed=3)
    total, done, k = 0.0, False, 0
    while not done:
        _, r, term, trunc, _ = env.step(k % 5 if k % 7 else 4)  # dispatches and some waits
        assert r <= 0.0
        total += r
        k += 1
        done = term or trunc
    res = env.result()
    assert term and res.totals["completed"] == 200
    assert total == pytest.approx(-200 * res.cluster["e2e_mean"], rel=1e-9)


def test_truncated_episode_counts_the_requests_still_in_the_system():
    """Truncated at 0.5 s with nothing finished (3,000-token outputs take about 51 s): the sum is minus
    the time every arrival has spent in the system up to the truncation."""
    from fluidopt.rl.env import RouterEnv

    wl = _three(output=3000)
    env = RouterEnv(tiny_scenario(), reward=TIS, workload=wl, max_time=0.5)  # the paper's MDP: one dispatch per epoch
    env.reset(seed=0)
    total, done = 0.0, False
    while not done:
        _, r, term, trunc, _ = env.step(1)
        total += r
        done = term or trunc
    assert trunc and not term
    t = env.eng.now
    assert t == pytest.approx(0.5)
    assert total == pytest.approx(-sum(t - a for a in wl.time.tolist()), rel=1e-12)


def test_guidance_is_added_as_for_the_other_objectives():
    from fluidopt.rl.env import RouterEnv
    from fluidopt.scenario import load_scenario

    sc = load_scenario(RL_SCENARIO)
    env = RouterEnv(sc, reward=RewardConfig(variant="wa", objective="time-in-system"), n_requests=100,
                    multi_dispatch=True)
    env.reset(seed=1)
    total = guid = 0.0
    done, k = False, 0
    while not done:
        _, r, term, trunc, _ = env.step(k % 4)
        total += r
        guid += env.last_guidance
        k += 1
        done = term or trunc
    res = env.result()
    assert guid < 0
    assert total - guid == pytest.approx(-100 * res.cluster["e2e_mean"], rel=1e-9)


def test_training_on_time_in_system_records_the_objective():
    pytest.importorskip("torch")
    import json

    from fluidopt.rl.dqn import DQNConfig, train

    cfg = DQNConfig(variant="baseline", episodes=1, n_requests=40, seed=0, objective="time-in-system", arch="shared",
                    multi_dispatch=True, learn_starts=20, batch_size=16, max_steps=60)
    res = train(tiny_scenario(), cfg)
    assert json.loads(res.net.config)["objective"] == "time-in-system"
    assert res.state["steps"] == 60
