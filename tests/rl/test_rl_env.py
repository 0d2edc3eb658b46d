"""The Gymnasium environment: contract (check_env), determinism, episodes, stable-baselines3."""

from __future__ import annotations

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

from fluidopt.rl.env import RouterEnv  # noqa: E402

from .conftest import RL_SCENARIO, blocked_workload, tiny_scenario  # noqa: E402


@pytest.mark.integration
def test_check_env_passes():
    from gymnasium.utils.env_checker import check_env

    env = RouterEnv(RL_SCENARIO, n_requests=100)
    check_env(env, skip_render_check=True)
    assert env.observation_space.shape == (27,) and env.action_space.n == 5


def _rollout(env, seed, n=400):
    env.reset(seed=seed)
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        o, r, term, trunc, _ = env.step(int(rng.integers(env.action_space.n)))
        out.append((o.copy(), r))
        if term or trunc:
            env.reset()
    return out


@pytest.mark.integration
def test_same_seed_same_trajectory_bit_for_bit():
    a = _rollout(RouterEnv(RL_SCENARIO, n_requests=150), 4)
    b = _rollout(RouterEnv(RL_SCENARIO, n_requests=150), 4)
    assert all(np.array_equal(x[0], y[0]) and x[1] == y[1] for x, y in zip(a, b))
    c = _rollout(RouterEnv(RL_SCENARIO, n_requests=150), 5)
    assert any(x[1] != y[1] for x, y in zip(a, c))


def test_an_episode_resolves_every_request_and_counts_rewards():
    env = RouterEnv(RL_SCENARIO, n_requests=300, variant="baseline")
    env.reset(seed=1)
    total = 0.0
    steps = 0
    done = False
    while not done:
        _, r, term, trunc, info = env.step(steps % 4)  # round robin through the environment
        total += r
        steps += 1
        done = term or trunc
    assert term and not trunc and info["completed"] == 300
    assert steps == 300  # no waits: one decision per request
    res = env.result()
    assert res.totals["completed"] == 300
    # completions bring 60 each; the progress penalty is what keeps the sum below 300 x 60
    assert 0 < total < 300 * 60


def test_revenue_reward_is_the_simulators_revenue_with_abandonment():
    # the prefill/decode paper's instance: patience 0.1/s, so requests abandon from the router queue and
    # the instance queues; the revenue reward (without guidance) sums to the simulator's own revenue
    from fluidopt.core.model import paper_scenario
    from fluidopt.rl.core import RewardConfig

    sc = paper_scenario(gpus=2)
    env = RouterEnv(sc, reward=RewardConfig(variant="baseline", objective="revenue"), n_requests=300)
    env.reset(seed=2)
    total, done, steps = 0.0, False, 0
    while not done:
        _, r, term, trunc, info = env.step(0 if steps % 3 else 2)  # instance 0, and a wait every third step
        total += r
        steps += 1
        done = term or trunc
    core = env.core
    res = env.result()
    assert term and core.resolved == 300 and res.totals["abandoned"] > 0
    assert res.totals["completed"] + res.totals["abandoned"] == 300
    assert not core.held and not core.rec and core.sum_invT == pytest.approx(0.0, abs=1e-9)
    assert total == pytest.approx(res.cluster["revenue_per_gpu"] * 2 * (res.t_end - res.warmup), rel=1e-9)
    cp, cd = sc.class_prices()
    assert 0 < total < 300 * max(cp[i] * c.prompt + cd[i] * c.decode for i, c in enumerate(sc.classes)) * 5
    with pytest.raises(Exception, match="objective"):
        RewardConfig(objective="profit")


def test_pinned_background_load_never_asks_the_agent():
    env = RouterEnv(tiny_scenario(), workload=blocked_workload(n_short=10), pin={i: 0 for i in range(8)})
    env.reset(seed=0)
    steps, done = 0, False
    while not done:
        _, _, term, trunc, _ = env.step(1)
        steps += 1
        done = term or trunc
    assert steps == 10 and term


@pytest.mark.integration
def test_stable_baselines3_dqn_trains_unchanged():
    sb3 = pytest.importorskip("stable_baselines3")
    import torch
    from stable_baselines3.common.logger import Logger

    torch.set_num_threads(1)  # two threads on a shared 2-core machine are slower than one
    env = RouterEnv(RL_SCENARIO, n_requests=200)
    model = sb3.DQN("MlpPolicy", env, learning_starts=1000, buffer_size=5000, batch_size=32, seed=0, verbose=0,
                    train_freq=8, policy_kwargs={"net_arch": [32, 32]})
    model.set_logger(Logger(folder=None, output_formats=[]))  # SB3's default logger leaves a folder in /tmp
    model.learn(total_timesteps=2000)
    obs, _ = env.reset(seed=9)
    a, _ = model.predict(obs, deterministic=True)
    assert 0 <= int(a) <= 4
