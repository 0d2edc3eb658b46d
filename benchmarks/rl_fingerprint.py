"""Fingerprint of the RL environment and the shipped routers, to show that a speed change changes nothing.

    python benchmarks/rl_fingerprint.py OUT.json      # then: cmp BEFORE.json AFTER.json

A SHA-256 of every observation, reward, epoch count and guidance value of seeded random-policy
episodes (4 and 8 instances, the three reward variants, a preempting overload on both engine
backends), and the evaluation numbers of the shipped routers on one episode of each RL scenario.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from fluidopt.rl.env import RouterEnv
from fluidopt.rl.evaluate import evaluate
from fluidopt.scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parents[1] / "examples" / "scenarios"
EVAL_COLUMNS = ["policy", "e2e_mean", "ttft_mean", "tpot_mean", "e2e_p99", "preemptions", "router_wait_mean",
                "completed", "t_end"]


def _f64(x: float) -> bytes:
    return np.float64(x).tobytes()


def random_episodes(name: str, variant: str) -> list:
    """Hash of two seeded random-policy episodes: [sha256, steps]."""
    env = RouterEnv(str(SCENARIOS / name), variant=variant, n_requests=2000)
    rng = np.random.default_rng(7)
    h = hashlib.sha256()
    steps = 0
    for k in range(2):
        obs, _ = env.reset(seed=3 if k == 0 else None)
        h.update(obs.tobytes())
        while True:
            obs, r, term, trunc, info = env.step(int(rng.integers(env.action_space.n)))
            for b in (obs.tobytes(), _f64(r), _f64(env.last_epochs), _f64(env.last_guidance)):
                h.update(b)
            steps += 1
            if term or trunc:
                h.update(repr(sorted(info.items())).encode())
                break
        res = env.result()
        h.update(repr((res.cluster["e2e_mean"], res.cluster["ttft_mean"], res.cluster["preemptions"])).encode())
    return [h.hexdigest(), steps]


def overload(backend: str) -> list:
    """Hash of one episode at 2.5 x the 4-instance rate, half the decisions to instance 0 (preemptions):
    [sha256, steps, preemptions]."""
    base = load_scenario(SCENARIOS / "rl-router-v100.toml")
    sc = dataclasses.replace(base, classes=tuple(dataclasses.replace(c, rate=c.rate * 2.5) for c in base.classes))
    env = RouterEnv(sc, variant="wg", n_requests=1500, backend=backend)
    rng = np.random.default_rng(11)
    h = hashlib.sha256()
    steps = 0
    env.reset(seed=5)
    while True:
        a = 0 if rng.random() < 0.5 else int(rng.integers(env.action_space.n))
        obs, r, term, trunc, _ = env.step(a)
        for b in (obs.tobytes(), _f64(r), _f64(env.last_guidance)):
            h.update(b)
        steps += 1
        if term or trunc:
            break
    res = env.result()
    return [h.hexdigest(), steps, int(res.cluster["preemptions"])]


def main() -> None:
    out: dict = {}
    for name, variant in (("rl-router-v100.toml", "wg"), ("rl-router-v100-8.toml", "wa"), ("rl-router-v100.toml", "baseline")):
        out[f"env:{name}:{variant}"] = random_episodes(name, variant)
    for name in ("rl-router-v100.toml", "rl-router-v100-8.toml"):
        df = evaluate(load_scenario(SCENARIOS / name), ["wg-rl", "wa-rl", "baseline-rl", "jsq"], episodes=1,
                      n_requests=2000, seed=1000)
        out[f"eval:{name}"] = df[EVAL_COLUMNS].to_dict("records")
    for backend in ("auto", "python"):
        out[f"env:heavy:{backend}"] = overload(backend)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1, default=float)
    print(json.dumps(out, default=float)[:2000])


if __name__ == "__main__":
    main()
