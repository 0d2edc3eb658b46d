"""Double DQN fine-tuning of a regime router from its imitation warm start (docs/rl.md section 6b).

The environment is the regime router's: multi-dispatch epochs, the ``small-large`` action mask, the
log-count state, the time-in-system objective (its episode sum is minus the total E2E). The Q-network
(the shared-weights scorer, H = 32) starts from the imitation weights. The imitation network's
scores are logits, not values, so training runs in two phases:

1. *policy evaluation* (``--eval-episodes``): the imitation policy acts (greedy over the valid
   instances); the Q-network learns its values, y = r + gamma^e Q'(s', pi(s'));
2. *improvement* (``--episodes``): the Q-network acts (greedy over the valid instances, a uniformly
   random valid instance with probability ``--eps``); Double DQN targets over the instances valid in s'.

Seeded (``--seed``: episodes, initial exploration, minibatches), one torch thread: the same command
gives the same weights bit for bit. Writes a weight file for ``fluidopt rl evaluate --option
wg-rl:weights=FILE``.

    python examples/rl_finetune_regime.py --out /tmp/ft.npz
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from torch import nn

from fluidopt.rl.core import STATE_LAYOUT_LOG, RewardConfig
from fluidopt.rl.dqn import SharedQ, to_numpy_net
from fluidopt.rl.env import RouterEnv
from fluidopt.rl.mlp import load_weights, save_weights
from fluidopt.rl.predictors import scenario_accuracy
from fluidopt.scenario import load_scenario


def load_into(net: SharedQ, path: str) -> None:
    """Copy a shared-weights numpy file into a SharedQ (W is in x out: torch's weight transposed)."""
    src = load_weights(path)
    for mods, layers in ((net.scorer, src.scorer), (net.wait, src.wait)):
        lins = [m for m in mods if isinstance(m, nn.Linear)]
        for lin, (W, b) in zip(lins, layers):
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(np.ascontiguousarray(W.T)))
                lin.bias.copy_(torch.from_numpy(b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="examples/scenarios/rl-router-paper-regime.toml")
    ap.add_argument("--weights", default="fluidopt/rl/weights/wg-rl-regime.npz", help="the warm start")
    ap.add_argument("--eval-episodes", type=int, default=4)
    ap.add_argument("--episodes", type=int, default=6)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gamma", type=float, default=0.998, help="discount per 0.02 s epoch")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--eps", type=float, default=0.05)
    ap.add_argument("--reward-scale", type=float, default=1e-3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    sc = load_scenario(args.scenario)
    env = RouterEnv(sc, reward=RewardConfig(variant="wg", objective="time-in-system", gamma=args.gamma),
                    n_requests=args.requests, accuracy=scenario_accuracy(sc), reward_scale=args.reward_scale,
                    multi_dispatch=True, wait_mask="small-large", layout=STATE_LAYOUT_LOG, seed=args.seed)
    m = env.m
    pi, online, target = SharedQ(32), SharedQ(32), SharedQ(32)
    for net in (pi, online):
        load_into(net, args.weights)
    target.load_state_dict(online.state_dict())
    opt = torch.optim.Adam(online.parameters(), lr=args.lr)
    n_in = env.observation_space.shape[0]
    N = 200_000
    S, S2 = np.zeros((N, n_in), np.float32), np.zeros((N, n_in), np.float32)
    A, R, D, E = np.zeros(N, np.int64), np.zeros(N, np.float32), np.zeros(N, np.float32), np.zeros(N, np.float32)
    M2 = np.zeros((N, m), bool)
    n = steps = updates = 0
    t0 = time.perf_counter()
    total = args.eval_episodes + args.episodes
    for k in range(total):
        obs, _ = env.reset(seed=args.seed) if k == 0 else env.reset()
        improving = k >= args.eval_episodes
        valid = env.action_masks()[:m]
        done = False
        ep_r = 0.0
        while not done:
            idx = np.flatnonzero(valid)
            if improving and rng.random() < args.eps:
                a = int(rng.choice(idx))
            else:
                with torch.no_grad():
                    q = (online if improving else pi)(torch.from_numpy(obs))[:m].numpy()
                a = int(idx[np.argmax(q[idx])])
            obs2, r, term, trunc, _ = env.step(a)
            valid2 = env.action_masks()[:m]
            i = n % N
            S[i], A[i], R[i], S2[i], D[i], E[i], M2[i] = obs, a, r, obs2, float(term), env.last_epochs, valid2
            n += 1
            steps += 1
            ep_r += r / args.reward_scale
            obs, valid, done = obs2, valid2, term or trunc
            if n >= 1000 and steps % 4 == 0:
                b = torch.from_numpy(rng.integers(min(n, N), size=256))
                s, s2 = torch.from_numpy(S)[b], torch.from_numpy(S2)[b]
                mk = torch.from_numpy(M2)[b]
                with torch.no_grad():
                    chooser = online if improving else pi
                    a2 = chooser(s2)[:, :m].masked_fill(~mk, -torch.inf).argmax(1, keepdim=True)
                    q2 = target(s2)[:, :m].gather(1, a2).squeeze(1)
                    y = torch.from_numpy(R)[b] + torch.pow(torch.tensor(args.gamma), torch.from_numpy(E)[b]) \
                        * (1.0 - torch.from_numpy(D)[b]) * q2
                q = online.q_sa(s, torch.from_numpy(A)[b])
                loss = nn.functional.smooth_l1_loss(q, y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                updates += 1
                if updates % 1000 == 0:
                    target.load_state_dict(online.state_dict())
        phase = "improve" if improving else "evaluate"
        print(f"episode {k + 1}/{total} ({phase}): total E2E {-ep_r:,.0f} request-s, {time.perf_counter() - t0:.0f} s",
              flush=True)
    env.close()
    cfg = json.dumps({"method": "dqn-finetune", **{k: v for k, v in vars(args).items() if k != "out"}}, sort_keys=True)
    net = to_numpy_net(online, m, "wg", cfg, "multi", "small-large", STATE_LAYOUT_LOG)
    save_weights(args.out, net, command="python examples/rl_finetune_regime.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
