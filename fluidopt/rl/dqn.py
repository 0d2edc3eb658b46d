"""Double DQN in torch for the RL router (needs the ``rl`` extra; CPU only, one thread).

The paper's agent (Jain et al., Sec. 4.3 and App. C.10) with the values it leaves open filled in
(docs/rl.md section 4): an MLP ``(6 m + 3) -> H -> H -> m + 1`` with ReLU, H = 64 for 4 instances
(scaled by m / 4), Adam (lr 1e-3), Huber loss, batch 512, replay buffer 100,000 transitions, a
target network synced every 1,000 updates, one update per step once 1,000 transitions are stored,
epsilon-greedy for the first ``eps_episodes`` (20) episodes with epsilon falling linearly from 1
to 0.05 over them, greedy afterwards. Double DQN target:
``y = r + gamma_k^e (1 - terminal) Q_target(s', argmax_a Q_online(s', a))`` with gamma_k the variant's
discount per decision epoch in episode k (0.99; WG-RL: 0.99 (1 - e^(-0.5 k))) and e the epochs
(0.02 s) the step spanned (the environment skips epochs with an empty router queue).

``arch="shared"`` replaces the MLP by the per-instance shared-weights scorer plus a wait head
(:class:`SharedQ`, :class:`~fluidopt.rl.mlp.SharedQNetwork`; hidden width 32 by default, whatever
m), and ``multi_dispatch=True`` trains in the environment's multi-dispatch epochs (a step after a
dispatch at the same epoch spans e = 0 epochs: no discount).

``wait_mask="fits"`` trains under the environment's wait mask (docs/rl.md section 2): "wait" is
left out of the epsilon-greedy choice (random and greedy) where it is invalid, and out of the
Double DQN target's argmax where it is invalid in s' (each transition stores that bit). The weight
file records the mask, and the shipped routers apply it at inference.

Deterministic bit for bit from ``seed`` on one CPU thread: the network's initialisation comes from
``torch.manual_seed(seed)``, exploration and replay sampling from a numpy Generator seeded with
``seed``, episodes from :func:`fluidopt.rl.env.episode_seed`.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from fluidopt.core.errors import ScenarioError
from fluidopt.rl.core import CREDIT_OBJECTIVES, STATE_LAYOUT, RewardConfig
from fluidopt.rl.env import RouterEnv
from fluidopt.rl.mlp import GLOBAL_FEATURES, INST_FEATURES, SCORER_IN, WAIT_IN, QNetwork, SharedQNetwork

__all__ = ["DQNConfig", "SharedQ", "TrainResult", "build_qnet", "to_numpy_net", "train"]


@dataclass(frozen=True)
class DQNConfig:
    """Training settings (see the module doc); ``episodes`` x ``n_requests`` requests in all."""

    variant: str = "wg"
    episodes: int = 30
    n_requests: int = 2000
    seed: int = 0
    hidden: int | None = None
    batch_size: int = 512
    lr: float = 1e-3
    buffer_size: int = 100_000
    target_sync: int = 1000
    learn_starts: int = 1000
    train_every: int = 1  # environment steps per gradient update
    eps_episodes: int = 20
    eps_start: float = 1.0
    eps_end: float = 0.05
    reward_scale: float = 0.01
    accuracy: float = 0.79
    gamma: float = 0.99
    max_steps: int | None = None  # stop after this many environment steps in all (tests)
    objective: str = "latency"  # or "revenue", "lost-revenue", "time-in-system", "request-latency",
    # "request-normalized", "request-excess" (RewardConfig.objective; the request-* ones: per-request credit,
    # gamma = 0 targets)
    arch: str = "mlp"  # or "shared" (SharedQ)
    multi_dispatch: bool = False  # the environment's multi-dispatch epochs (RouterEnv)
    wait_mask: str = "none"  # or "fits" (RouterEnv.wait_mask)


@dataclass
class TrainResult:
    net: QNetwork
    curves: pd.DataFrame
    config: DQNConfig
    wall_seconds: float
    state: dict = field(default_factory=dict)


def build_qnet(n_in: int, hidden: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, n_out))


class SharedQ(nn.Module):
    """The shared-weights Q-network in torch (the numpy twin: :class:`~fluidopt.rl.mlp.SharedQNetwork`).

    ``scorer`` (21 -> H -> H -> 1) scores each instance from [its 6 entries, mean and max of the
    6 entries over the instances, the 3 global entries]; ``wait`` (15 -> H -> H -> 1) gives the
    wait action's advantage over the mean instance score from [mean, max, global]:
    Q(s, wait) = mean_g f(x_g, ctx) + w(ctx). Output: m + 1 Q-values (m from the input length).
    """

    def __init__(self, hidden: int):
        super().__init__()
        self.scorer = build_qnet(SCORER_IN, hidden, 1)
        self.wait = build_qnet(WAIT_IN, hidden, 1)

    @staticmethod
    def _inputs(x: torch.Tensor):
        m = (x.shape[1] - GLOBAL_FEATURES) // INST_FEATURES
        inst = x[:, : INST_FEATURES * m].reshape(-1, m, INST_FEATURES)
        ctx = torch.cat([inst.mean(1), inst.amax(1), x[:, INST_FEATURES * m:]], 1)
        return torch.cat([inst, ctx.unsqueeze(1).expand(-1, m, -1)], 2), ctx, m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        one = x.dim() == 1
        if one:
            x = x.unsqueeze(0)
        X, ctx, _ = self._inputs(x)
        f = self.scorer(X).squeeze(2)
        q = torch.cat([f, f.mean(1, keepdim=True) + self.wait(ctx)], 1)
        return q[0] if one else q

    def q_sa(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """Q(s, a) for a batch (a: actions)."""
        return self.forward(x).gather(1, a.unsqueeze(1)).squeeze(1)


def _linears(q: nn.Module) -> tuple:
    return tuple((mod.weight.detach().numpy().T.copy(), mod.bias.detach().numpy().copy())
                 for mod in q if isinstance(mod, nn.Linear))


def to_numpy_net(q: nn.Module, m: int, variant: str, config: str = "{}", dispatch: str = "single",
                 wait_mask: str = "none", layout: str = STATE_LAYOUT):
    if isinstance(q, SharedQ):
        return SharedQNetwork(_linears(q.scorer), _linears(q.wait), m, variant, config, dispatch, wait_mask, layout)
    return QNetwork(_linears(q), m, variant, config, dispatch, wait_mask, layout)


def _config_json(cfg: DQNConfig) -> str:
    """The configuration as JSON; without ``wait_mask`` when it is ``"none"`` (the files of the
    paper's MDP keep the configuration text they had before the option existed)."""
    d = asdict(cfg)
    if d["wait_mask"] == "none":
        del d["wait_mask"]
    return json.dumps(d, sort_keys=True)


def _progress(msg: str, enabled: bool) -> None:
    if enabled:
        sys.stderr.write("\r" + msg[:118].ljust(118))
        sys.stderr.flush()


def train(scenario, config: DQNConfig = DQNConfig(), *, env: RouterEnv | None = None, checkpoint: str | Path | None = None,
          progress: bool = False) -> TrainResult:
    """Train a Double DQN router on ``scenario``; returns the numpy network and per-episode curves.

    ``env``: an environment to train in instead of ``RouterEnv(scenario, ...)`` built from the
    config. ``checkpoint``: a path where the torch state (networks, optimiser, counters) is saved
    after every episode (``torch.save``; load with ``torch.load``). ``progress``: a progress line on
    stderr with the episode reward.
    """
    cfg = config
    if cfg.wait_mask not in ("none", "fits"):
        raise ScenarioError(f"train: wait_mask {cfg.wait_mask!r}: Double DQN masks only 'wait' ('none' or 'fits'); "
                            "the reserve mask's router is fitted with fluidopt.rl.imitate (fluidopt rl imitate)")
    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    reward = RewardConfig(variant=cfg.variant, gamma=cfg.gamma, objective=cfg.objective)
    if env is None:
        env = RouterEnv(scenario, variant=cfg.variant, n_requests=cfg.n_requests, accuracy=cfg.accuracy,
                        reward=reward, reward_scale=cfg.reward_scale, multi_dispatch=cfg.multi_dispatch,
                        wait_mask=cfg.wait_mask)
    else:
        env.reward_cfg = reward
        env.reward_scale = cfg.reward_scale
        env.multi_dispatch = cfg.multi_dispatch
        env.wait_mask = cfg.wait_mask
    masked = cfg.wait_mask != "none"
    m = env.m
    n_in = env.observation_space.shape[0]
    if cfg.arch == "shared":
        hidden = cfg.hidden or 32
        online, target = SharedQ(hidden), SharedQ(hidden)
    elif cfg.arch == "mlp":
        hidden = cfg.hidden or max(8, int(round(64 * m / 4)))
        online = build_qnet(n_in, hidden, m + 1)
        target = build_qnet(n_in, hidden, m + 1)
    else:
        raise ValueError(f"DQNConfig.arch: expected 'mlp' or 'shared', got {cfg.arch!r}")
    q_sa = online.q_sa if cfg.arch == "shared" else (lambda s, a: online(s).gather(1, a.unsqueeze(1)).squeeze(1))
    target.load_state_dict(online.state_dict())
    opt = torch.optim.Adam(online.parameters(), lr=cfg.lr)
    loss_fn = nn.SmoothL1Loss()

    N = cfg.buffer_size
    S = np.zeros((N, n_in), dtype=np.float32)
    S2 = np.zeros((N, n_in), dtype=np.float32)
    A = np.zeros(N, dtype=np.int64)
    R = np.zeros(N, dtype=np.float32)
    D = np.zeros(N, dtype=np.float32)
    G = np.zeros(N, dtype=np.float32)  # epochs the transition spans: its discount is gamma_k ** G
    W2 = np.ones(N, dtype=bool) if masked else None  # whether "wait" is valid in s' (the target's argmax)
    size = ptr = 0
    updates = steps = 0

    def store(s, a: int, r: float, s2, d: float, g: float, w2: bool) -> None:
        """One transition into the replay buffer (w2: whether "wait" is valid in s2, masked only)."""
        nonlocal ptr, size
        S[ptr] = s
        A[ptr] = a
        R[ptr] = r
        S2[ptr] = s2
        D[ptr] = d
        G[ptr] = g
        if masked:
            W2[ptr] = w2
        ptr = ptr + 1 if ptr + 1 < N else 0
        size = min(size + 1, N)

    # Per-request credit (docs/rl.md section 2): a dispatch's transition waits here, keyed by its step index
    # in the episode, until its request resolves and the environment hands out its credit (last_credits); it
    # then enters the buffer as a terminal transition (a gamma = 0, contextual-bandit target: y = credit +
    # its guidance). Waits are not stored (no request's credit is theirs).
    credit = cfg.objective in CREDIT_OBJECTIVES
    pend: dict[int, tuple] = {}
    rows = []
    t0 = time.perf_counter()
    obs, _ = env.reset(seed=cfg.seed)
    wait_ok = env.wait_valid() if masked else True
    stop = False
    for k in range(cfg.episodes):
        if k > 0:
            obs, _ = env.reset()
            if masked:
                wait_ok = env.wait_valid()
        eps = 0.0
        if k < cfg.eps_episodes:
            frac = k / max(1, cfg.eps_episodes - 1)
            eps = cfg.eps_start + (cfg.eps_end - cfg.eps_start) * frac
        gamma_k = reward.discount(k)
        w_k = reward.guidance_weight(k)
        ep_r = ep_h = 0.0
        n_steps = waits = 0
        sent = np.zeros(m, dtype=np.int64)
        losses = []
        done = False
        pend.clear()
        while not done:
            if eps > 0.0 and rng.random() < eps:
                a = int(rng.integers(m + 1 if wait_ok else m))
            else:
                with torch.no_grad():
                    qv = online(torch.from_numpy(obs))
                    a = int(qv.argmax()) if wait_ok else int(qv[:m].argmax())
            obs2, r, term, trunc, _ = env.step(a)
            if masked:
                wait_ok = env.wait_valid()
            if credit:
                if a < m:
                    pend[n_steps] = (obs, a, env.last_guidance * w_k * cfg.reward_scale)
                for i, c in env.last_credits:
                    s_i, a_i, h_i = pend.pop(i)
                    store(s_i, a_i, c + h_i, s_i, 1.0, 0.0, True)  # (s2 unused: terminal)
            else:
                store(obs, a, r, obs2, 1.0 if term else 0.0, env.last_epochs, wait_ok)
            ep_r += r / cfg.reward_scale
            ep_h += env.last_guidance * w_k
            n_steps += 1
            waits += a == m
            if a < m:
                sent[a] += 1
            steps += 1
            obs = obs2
            done = term or trunc
            if size >= min(cfg.learn_starts, N) and steps % cfg.train_every == 0:
                idx = rng.integers(0, size, size=cfg.batch_size)
                s = torch.from_numpy(S[idx])
                s2 = torch.from_numpy(S2[idx])
                with torch.no_grad():
                    if masked:  # Double DQN's argmax over the actions valid in s'
                        qo = online(s2)
                        qo[:, m] = torch.where(torch.from_numpy(W2[idx]), qo[:, m], torch.tensor(-math.inf))
                        a2 = qo.argmax(1, keepdim=True)
                    else:
                        a2 = online(s2).argmax(1, keepdim=True)
                    q2 = target(s2).gather(1, a2).squeeze(1)
                    disc = torch.from_numpy(np.power(gamma_k, G[idx], dtype=np.float32))
                    y = torch.from_numpy(R[idx]) + disc * (1.0 - torch.from_numpy(D[idx])) * q2
                q = q_sa(s, torch.from_numpy(A[idx]))
                loss = loss_fn(q, y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                updates += 1
                if updates % 50 == 0:
                    losses.append(float(loss.detach()))
                if updates % cfg.target_sync == 0:
                    target.load_state_dict(online.state_dict())
            if cfg.max_steps is not None and steps >= cfg.max_steps:
                stop = True
                break
            if progress and steps % 500 == 0:
                _progress(f"{cfg.variant}-rl episode {k + 1}/{cfg.episodes} step {n_steps} reward {ep_r:,.0f}", True)
        res = env.result() if done else None
        rows.append({
            "episode": k, "steps": n_steps, "reward": ep_r, "reward_without_guidance": ep_r - ep_h,
            "guidance": ep_h, "epsilon": eps, "discount": gamma_k, "guidance_weight": w_k,
            "wait_fraction": waits / max(1, n_steps),
            # the busiest instance's share of the episode's dispatches (1 / m when balanced): a collapse shows here
            "max_instance_share": float(sent.max() / max(1, sent.sum())),
            "e2e_mean": float(res.cluster["e2e_mean"]) if res is not None else math.nan,
            "revenue_per_gpu": float(res.cluster.get("revenue_per_gpu", math.nan)) if res is not None else math.nan,
            "loss": float(np.mean(losses)) if losses else math.nan, "wall_seconds": time.perf_counter() - t0,
        })
        _progress(f"{cfg.variant}-rl episode {k + 1}/{cfg.episodes}: reward {ep_r:,.0f}, "
                  f"e2e {rows[-1]['e2e_mean']:.3f} s, {time.perf_counter() - t0:.0f} s", progress)
        if checkpoint is not None:
            from fluidopt.core.files import atomic_path

            with atomic_path(checkpoint) as tmp:  # a kill mid-save leaves the last whole checkpoint
                torch.save({"online": online.state_dict(), "target": target.state_dict(),
                            "optimizer": opt.state_dict(), "episode": k, "steps": steps, "updates": updates,
                            "config": asdict(cfg)}, tmp)
        if stop:
            break
    if progress:
        sys.stderr.write("\n")
    env.close()
    net = to_numpy_net(online, m, cfg.variant, _config_json(cfg), "multi" if cfg.multi_dispatch else "single",
                       cfg.wait_mask)
    return TrainResult(net, pd.DataFrame(rows), cfg, time.perf_counter() - t0,
                       {"online": online, "steps": steps, "updates": updates})
