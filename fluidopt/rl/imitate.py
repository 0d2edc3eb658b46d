"""Learned routers on a rule's action mask, trained by imitation (needs the ``rl`` extra).

The router (docs/rl.md section 6b) decides for the head of the router queue at every 0.02 s tick
with multi-dispatch epochs under a rule's action mask: ``small-large``
(:meth:`~fluidopt.rl.core.RouterCore.group_valid`: only the instances of the head's Dedicated
Small-Large group, by its predicted output; it never waits) or ``reserve``
(:meth:`~fluidopt.rl.core.RouterCore.reserve_feasible`: only instances that can hold its prompt plus
its class's mean output; it waits exactly when none can). Which valid instance it picks is the
per-instance shared-weights network's argmax (:class:`~fluidopt.rl.dqn.SharedQ`, any fleet size),
fitted by behaviour cloning to the rule's own choice (:func:`small_large_action`,
:func:`expert_action`) with a cross-entropy loss over the valid instances' scores, on episodes
that the rule itself drives (no exploration: the rule's own state distribution).

Deterministic bit for bit from ``seed`` on one CPU thread: the episodes are ``episode_seed(seed, k)``,
the network is initialised from ``torch.manual_seed(seed)``, minibatches are drawn from a numpy
Generator seeded with ``seed``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

import numpy as np

from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import Scenario
from fluidopt.rl.core import STATE_LAYOUT, STATE_LAYOUT_LOG, STATE_LAYOUTS, bucket_counts
from fluidopt.rl.predictors import BUCKET_TOKENS

__all__ = ["ImitationConfig", "expert_action", "imitate"]

FREE = 4  # index of the free-capacity entry among an instance's 6 state entries


EXPERTS = ("reserve", "small-large")
"""The rules a router can be fitted to, each under its own action mask: ``reserve`` (the reserving
hold rule: the valid instance with the most free capacity) and ``small-large`` (Dedicated
Small-Large's groups: the instance of the head's group with the fewest requests)."""


@dataclass(frozen=True)
class ImitationConfig:
    """Behaviour cloning of a rule (``expert``, :data:`EXPERTS`): ``episodes`` x ``n_requests``
    rule-driven episodes (seed ``seed``), ``epochs`` passes of Adam (``lr``) over the recorded
    decisions in minibatches of ``batch_size``, hidden width ``hidden``; ``accuracy`` the predictor's
    bucket accuracy (one number or one per class)."""

    episodes: int = 4
    n_requests: int = 2000
    seed: int = 0
    epochs: int = 30
    batch_size: int = 256
    lr: float = 3e-3
    hidden: int = 32
    accuracy: float | tuple[float, ...] = 0.79
    expert: str = "reserve"
    layout: str = STATE_LAYOUT

    def __post_init__(self):
        if self.expert not in EXPERTS:
            raise ScenarioError(f"imitation: expert: expected one of {', '.join(EXPERTS)}, got {self.expert!r}")
        if self.layout not in STATE_LAYOUTS:
            raise ScenarioError(f"imitation: layout: expected one of {', '.join(STATE_LAYOUTS)}, got {self.layout!r}")
        for name in ("episodes", "n_requests", "epochs", "batch_size", "hidden"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ScenarioError(f"imitation: {name}: expected an integer >= 1, got {v!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ScenarioError(f"imitation: seed: expected an integer >= 0, got {self.seed!r}")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ScenarioError(f"imitation: lr: expected a number > 0, got {self.lr!r}")


def expert_action(obs: np.ndarray, valid: np.ndarray) -> int:
    """The reserving hold rule's choice from the state: the valid instance with the most free
    capacity (state entry 4 of each instance; ties: the lowest index), or "wait" (m) if none is valid."""
    m = len(valid) - 1
    best, bv = m, -np.inf
    for g in range(m):
        if valid[g] and obs[6 * g + FREE] > bv:
            best, bv = g, float(obs[6 * g + FREE])
    return best


def small_large_action(obs: np.ndarray, valid: np.ndarray, layout: str = STATE_LAYOUT) -> int:
    """Dedicated Small-Large's choice within the head's group (the valid instances of the
    ``small-large`` mask) from the state, then the most free capacity, then the lowest index.

    With the v1 layout (:data:`~fluidopt.rl.core.STATE_LAYOUT`): the least predicted work, the
    instance's bucket counts weighted by the buckets' tokens (the first fit; its counts saturate at
    B = 128 requests, so in a deep overload it falls back to free capacity and the index). With the
    log layout (:data:`~fluidopt.rl.core.STATE_LAYOUT_LOG`): the fewest unfinished requests (the sum
    of the three bucket counts, exact up to 8,192 requests)."""
    m = len(valid) - 1
    best, bv = m, (np.inf, 0.0)
    for g in range(m):
        if valid[g]:
            if layout == STATE_LAYOUT_LOG:
                work = float(sum(bucket_counts(obs, g, layout)))
            else:
                work = round(128 * float(obs[6 * g + 1] * BUCKET_TOKENS[0] + obs[6 * g + 2] * BUCKET_TOKENS[1]
                                         + obs[6 * g + 3] * BUCKET_TOKENS[2]))
            v = (work, -float(obs[6 * g + FREE]))
            if v < bv:
                best, bv = g, v
    return best


def imitate(scenario: Scenario, config: ImitationConfig = ImitationConfig(), *, progress=None):
    """Fit a router to the rule ``config.expert``; returns (numpy network, stats dict).

    ``progress``: called with a one-line message after every episode and every 10 epochs."""
    import torch

    from fluidopt.rl.dqn import SharedQ, to_numpy_net
    from fluidopt.rl.env import RouterEnv

    if not isinstance(scenario, Scenario):
        raise ScenarioError(f"imitate: expected a Scenario, got {type(scenario).__name__}")
    t0 = time.perf_counter()
    torch.set_num_threads(1)
    m = scenario.gpus
    sl = config.expert == "small-large"
    mask = config.expert  # the rule's own action mask
    env = RouterEnv(scenario, n_requests=config.n_requests, accuracy=config.accuracy, multi_dispatch=True,
                    wait_mask=mask, seed=config.seed, layout=config.layout)
    X, M, A = [], [], []
    waits = 0
    for k in range(config.episodes):
        obs, _ = env.reset(seed=config.seed) if k == 0 else env.reset()
        done = False
        while not done:
            valid = env.action_masks()
            a = small_large_action(obs, valid, config.layout) if sl else expert_action(obs, valid)
            if a < m:
                if valid[:m].sum() > 1:  # a decision with a choice: a training sample
                    X.append(obs)
                    M.append(valid[:m].copy())
                    A.append(a)
            else:
                waits += 1
            obs, _, term, trunc, _ = env.step(a)
            done = term or trunc
        if progress:
            progress(f"episode {k + 1}/{config.episodes}: {len(A)} decisions recorded")
    env.close()
    if not A:
        raise ScenarioError("imitate: the rule never had a choice of instance; nothing to learn")
    X = torch.tensor(np.asarray(X), dtype=torch.float32)
    Mk = torch.tensor(np.asarray(M), dtype=torch.bool)
    Y = torch.tensor(np.asarray(A), dtype=torch.long)
    torch.manual_seed(config.seed)
    net = SharedQ(config.hidden)
    opt = torch.optim.Adam(net.parameters(), lr=config.lr)
    rng = np.random.default_rng(config.seed)
    n = len(Y)
    loss_v = float("nan")
    for ep in range(config.epochs):
        perm = rng.permutation(n)
        tot = 0.0
        for i in range(0, n, config.batch_size):
            idx = torch.as_tensor(perm[i:i + config.batch_size])
            logits = net(X[idx])[:, :m].masked_fill(~Mk[idx], -1e9)
            loss = torch.nn.functional.cross_entropy(logits, Y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            tot += float(loss.detach()) * len(idx)
        loss_v = tot / n
        if progress and (ep + 1) % 10 == 0:
            progress(f"epoch {ep + 1}/{config.epochs}: cross-entropy {loss_v:.4f}")
    with torch.no_grad():
        pred = net(X)[:, :m].masked_fill(~Mk, -1e9).argmax(1)
        agree = float((pred == Y).float().mean())
    d = asdict(config)
    if d["layout"] == STATE_LAYOUT:  # the v1 files keep the configuration text they had before the option
        del d["layout"]
    cfg = json.dumps({"method": "imitation", **{k: (list(v) if isinstance(v, tuple) else v)
                                                 for k, v in d.items()}}, sort_keys=True)
    out = to_numpy_net(net, m, "wg", cfg, "multi", mask, config.layout)
    stats = {"samples": n, "waits": waits, "agreement": agree, "loss": loss_v,
             "wall_seconds": time.perf_counter() - t0}
    return out, stats
