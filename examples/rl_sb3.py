"""Train the stable-baselines3 reference agents (DQN, PPO) on the regime router's environment.

    python examples/rl_sb3.py --algo dqn --out fluidopt/rl/weights/sb3-dqn-regime.npz
    python examples/rl_sb3.py --algo ppo --out fluidopt/rl/weights/sb3-ppo-regime.npz

The environment (fluidopt.rl.sb3: multi-dispatch epochs, the reserve action mask, the time-in-system
reward, decisions with a choice only) and the export to the shipped routers' numpy format are in
fluidopt.rl.sb3; the written files run as ``--policy sb3-dqn`` / ``sb3-ppo`` without torch. Seeded (one
CPU thread), so a rerun on the same machine gives the same weights. docs/rl.md section 6b.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REGIME = ROOT / "examples" / "scenarios" / "rl-router-paper-regime.toml"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--algo", choices=("dqn", "ppo"), required=True)
    ap.add_argument("--scenario", default=str(REGIME))
    ap.add_argument("--timesteps", type=int, default=40_000, help="agent decisions (default 40,000)")
    ap.add_argument("--requests", type=int, default=2000, help="requests per training episode (default 2000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    import torch
    from stable_baselines3 import DQN, PPO
    from stable_baselines3.common.logger import Logger

    from fluidopt.rl.mlp import save_weights
    from fluidopt.rl.predictors import scenario_accuracy
    from fluidopt.rl.sb3 import export_dqn, export_ppo, make_env
    from fluidopt.scenario import load_scenario

    torch.set_num_threads(1)
    sc = load_scenario(a.scenario)
    env = make_env(sc, seed=a.seed, n_requests=a.requests, accuracy=scenario_accuracy(sc))
    t0 = time.perf_counter()
    if a.algo == "dqn":
        model = DQN("MlpPolicy", env, learning_rate=1e-3, buffer_size=50_000, learning_starts=1000, batch_size=128,
                    gamma=0.99, train_freq=4, target_update_interval=1000, exploration_fraction=0.3,
                    exploration_final_eps=0.05, policy_kwargs={"net_arch": [64, 64]}, seed=a.seed, device="cpu")
    else:
        model = PPO("MlpPolicy", env, learning_rate=3e-4, n_steps=2048, batch_size=256, gamma=0.99, seed=a.seed,
                    policy_kwargs={"net_arch": {"pi": [64, 64], "vf": [64, 64]}, "activation_fn": torch.nn.ReLU},
                    device="cpu")
    # a logger with no outputs: SB3's default one makes an empty folder in the temp directory per run
    model.set_logger(Logger(folder=None, output_formats=[]))
    model.learn(total_timesteps=a.timesteps)
    wall = time.perf_counter() - t0
    cfg = json.dumps({"method": f"stable-baselines3 {a.algo}", "timesteps": a.timesteps, "seed": a.seed,
                      "requests": a.requests, "objective": "time-in-system"})  # no wall time: a rerun gives the same file
    m = sc.gpus
    net = export_dqn(model, m, cfg) if a.algo == "dqn" else export_ppo(model, m, cfg)
    cmd = (f"python examples/rl_sb3.py --algo {a.algo} --timesteps {a.timesteps} --requests {a.requests} "
           f"--seed {a.seed} --out {a.out}")
    path = save_weights(a.out, net, command=cmd)
    print(f"wrote {path}: sb3 {a.algo}, {a.timesteps:,} decisions, {wall:.0f} s, "
          f"{env.replaced:,} invalid actions replaced", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from fluidopt.core.interrupt import script_main

    sys.exit(script_main(main))
