"""Reference agents from stable-baselines3 (DQN, PPO) on the regime router's environment (docs/rl.md 6b).

The environment is the one our imitation router lives in: :class:`~fluidopt.rl.env.RouterEnv` with
multi-dispatch epochs and the ``reserve`` action mask, rewarded with the time-in-system objective
(minus the request-seconds in the system during a step, router queue included; its undiscounted
episode sum is minus the total end-to-end latency, so it ranks policies as the table does), scaled
by ``reward_scale``. stable-baselines3's DQN and PPO take no action mask, so :class:`DecisionEnv`
wraps it:

* *decisions only*: a step where only one action is valid (a forced wait: no instance can hold the
  head; or a single valid instance) is taken by the wrapper, its reward added to the next decision's,
  so the agent sees the states where it has a choice (about 840 per 2,000-request episode here);
* *invalid actions*: an action that the mask forbids is replaced by a valid one drawn uniformly from
  the wrapper's own seeded generator (never the rule's choice, so the agent gets no hint).

A trained agent's network is exported to the numpy format of the shipped routers (``QNetwork``: a
ReLU MLP, 27 -> 64 -> 64 -> 5): DQN's Q-network, and PPO's actor (its logits, with ReLU hidden
layers set at training) whose argmax is the deterministic policy. The registered routers ``sb3-dqn``
and ``sb3-ppo`` (:mod:`fluidopt.rl.policies`) run them under the same mask: the best valid instance,
else wait. Training: ``python examples/rl_sb3.py`` (needs stable-baselines3).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from fluidopt.rl.core import RewardConfig
from fluidopt.rl.env import RouterEnv

__all__ = ["DecisionEnv", "export_dqn", "export_ppo", "make_env"]


class DecisionEnv(gym.Wrapper):
    """``env`` (a RouterEnv with an action mask) seen at its decisions with a choice (module doc)."""

    def __init__(self, env: RouterEnv, *, seed: int = 0):
        super().__init__(env)
        self._rng = np.random.default_rng(seed)
        self.replaced = 0  # invalid actions replaced by a random valid one

    def _skip(self, obs, rew: float, term: bool, trunc: bool, info: dict):
        env = self.env
        while not (term or trunc):
            valid = env.action_masks()
            if valid.sum() > 1:
                break
            obs, r, term, trunc, info = env.step(int(np.flatnonzero(valid)[0]))
            rew += r
        return obs, rew, term, trunc, info

    def reset(self, **kw):
        obs, info = self.env.reset(**kw)
        obs, _, term, trunc, info = self._skip(obs, 0.0, False, False, info)
        return obs, info

    def step(self, action):
        valid = self.env.action_masks()
        a = int(action)
        if not valid[a]:
            a = int(self._rng.choice(np.flatnonzero(valid)))
            self.replaced += 1
        obs, rew, term, trunc, info = self.env.step(a)
        return self._skip(obs, rew, term, trunc, info)


def make_env(scenario, *, seed: int, n_requests: int = 2000, accuracy=0.79, reward_scale: float = 0.01) -> DecisionEnv:
    """The reference agents' environment on ``scenario`` (module doc), episodes from ``seed``."""
    env = RouterEnv(scenario, n_requests=n_requests, accuracy=accuracy, multi_dispatch=True, wait_mask="reserve",
                    reward=RewardConfig(variant="baseline", objective="time-in-system"), reward_scale=reward_scale,
                    seed=seed)
    return DecisionEnv(env, seed=seed)


def _layers(modules) -> tuple:
    import torch.nn as nn

    return tuple((mod.weight.detach().cpu().numpy().T.astype(np.float32).copy(),
                  mod.bias.detach().cpu().numpy().astype(np.float32).copy())
                 for mod in modules if isinstance(mod, nn.Linear))


def export_dqn(model, m: int, config: str):
    """A stable-baselines3 DQN's Q-network as a numpy ``QNetwork`` under the reserve mask."""
    from fluidopt.rl.mlp import QNetwork

    return QNetwork(_layers(model.q_net.q_net), m, "baseline", config, "multi", "reserve")


def export_ppo(model, m: int, config: str):
    """A stable-baselines3 PPO's actor (ReLU hidden layers, then the action logits) as a ``QNetwork``."""
    from fluidopt.rl.mlp import QNetwork

    pol = model.policy
    return QNetwork(_layers(pol.mlp_extractor.policy_net) + _layers([pol.action_net]), m, "baseline", config,
                    "multi", "reserve")
