"""RL environment speed: steps per CPU second with a random policy on the RL setting (docs/rl.md).

    python benchmarks/bench_rl.py [--episodes 3] [--requests 2000] [--profile]
    python benchmarks/bench_rl.py --updates      # CPU per Double DQN update: shared network vs flat MLP

Measures CPU time (time.process_time) of env.step only (resets timed apart), so other processes on a
shared machine do not count against it. Prints steps, CPU seconds, steps per CPU second, reset cost.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from pathlib import Path

import numpy as np

from fluidopt.rl.env import RouterEnv

ROOT = Path(__file__).resolve().parents[1]


def bench(scenario: str, episodes: int, requests: int, seed: int = 0) -> dict:
    env = RouterEnv(scenario, n_requests=requests)
    rng = np.random.default_rng(seed)
    n_act = env.action_space.n
    steps = 0
    cpu_step = cpu_reset = 0.0
    for k in range(episodes):
        c0 = time.process_time()
        env.reset(seed=seed if k == 0 else None)
        cpu_reset += time.process_time() - c0
        acts = rng.integers(n_act, size=200_000)
        c0 = time.process_time()
        i = 0
        while True:
            _, _, term, trunc, _ = env.step(acts[i])
            i += 1
            if term or trunc:
                break
        cpu_step += time.process_time() - c0
        steps += i
    return {"scenario": Path(scenario).name, "steps": steps, "cpu_seconds": cpu_step,
            "steps_per_cpu_second": steps / cpu_step, "reset_cpu_seconds": cpu_reset / episodes}


def bench_updates(m: int, batch: int, arch: str, reps: int = 3, n: int = 20) -> float:
    """CPU milliseconds of one Double DQN update (target max, Huber loss, Adam step), best of ``reps``."""
    import torch

    from fluidopt.rl.dqn import SharedQ, build_qnet

    torch.set_num_threads(1)
    torch.manual_seed(0)
    if arch == "shared":
        online, target = SharedQ(32), SharedQ(32)
        q_sa = online.q_sa
    else:
        h = max(8, int(round(64 * m / 4)))
        online, target = build_qnet(6 * m + 3, h, m + 1), build_qnet(6 * m + 3, h, m + 1)
        q_sa = lambda s, a: online(s).gather(1, a.unsqueeze(1)).squeeze(1)  # noqa: E731
    opt = torch.optim.Adam(online.parameters())
    s = torch.rand(batch, 6 * m + 3)
    a = torch.randint(0, m + 1, (batch,))
    best = float("inf")
    for _ in range(reps):
        c0 = time.process_time()
        for _ in range(n):
            with torch.no_grad():
                q2 = target(s).gather(1, online(s).argmax(1, keepdim=True)).squeeze(1)
            loss = torch.nn.functional.smooth_l1_loss(q_sa(s, a), q2)
            opt.zero_grad()
            loss.backward()
            opt.step()
        best = min(best, (time.process_time() - c0) / n * 1e3)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", action="store_true", help="CPU per DQN update instead of environment steps")
    ap.add_argument("--episodes", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    if a.updates:
        for m, batch in ((4, 512), (8, 512), (16, 512), (64, 128)):
            print(f"{m} instances, batch {batch}: shared {bench_updates(m, batch, 'shared'):.2f} ms, "
                  f"flat MLP {bench_updates(m, batch, 'mlp'):.2f} ms per update (CPU)")
        return
    for name in ("rl-router-v100.toml", "rl-router-v100-8.toml"):
        sc = str(ROOT / "examples" / "scenarios" / name)
        if a.profile:
            cProfile.runctx("bench(sc, a.episodes, a.requests)", globals(), locals(), "/tmp/bench_rl.prof")
            pstats.Stats("/tmp/bench_rl.prof").sort_stats("tottime").print_stats(15)
        r = bench(sc, a.episodes, a.requests)
        print(f"{r['scenario']}: {r['steps']:,} steps in {r['cpu_seconds']:.2f} CPU s = "
              f"{r['steps_per_cpu_second']:,.0f} steps per CPU second (random policy); reset {r['reset_cpu_seconds']:.3f} CPU s")


if __name__ == "__main__":
    main()
