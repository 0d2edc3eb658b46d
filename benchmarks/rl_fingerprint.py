"""Fingerprint of the RL environment and the shipped routers, to show that a speed change changes nothing.

    python benchmarks/rl_fingerprint.py OUT.json      # then: cmp BEFORE.json AFTER.json

A SHA-256 of every observation, reward, epoch count and guidance value of seeded random-policy
episodes (4 and 8 instances, the three reward variants, a preempting overload on both engine
backends), and the evaluation numbers of the shipped routers on one episode of each RL scenario.
"""
import dataclasses
import hashlib
import json
import os
import sys

import numpy as np
from fluidopt.rl.env import RouterEnv
from fluidopt.rl.evaluate import evaluate
from fluidopt.scenario import load_scenario

os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # scenario paths below are relative

out = {}
for name, variant in (("rl-router-v100.toml", "wg"), ("rl-router-v100-8.toml", "wa"), ("rl-router-v100.toml", "baseline")):
    env = RouterEnv(f"examples/scenarios/{name}", variant=variant, n_requests=2000)
    rng = np.random.default_rng(7)
    h = hashlib.sha256()
    steps = 0
    for k in range(2):
        obs, _ = env.reset(seed=3 if k == 0 else None)
        h.update(obs.tobytes())
        while True:
            a = int(rng.integers(env.action_space.n))
            obs, r, term, trunc, info = env.step(a)
            h.update(obs.tobytes()); h.update(np.float64(r).tobytes()); h.update(np.float64(env.last_epochs).tobytes())
            h.update(np.float64(env.last_guidance).tobytes())
            steps += 1
            if term or trunc:
                h.update(repr(sorted(info.items())).encode())
                break
        res = env.result()
        h.update(repr((res.cluster["e2e_mean"], res.cluster["ttft_mean"], res.cluster["preemptions"])).encode())
    out[f"env:{name}:{variant}"] = [h.hexdigest(), steps]
for name in ("rl-router-v100.toml", "rl-router-v100-8.toml"):
    sc = load_scenario(f"examples/scenarios/{name}")
    df = evaluate(sc, ["wg-rl", "wa-rl", "baseline-rl", "jsq"], episodes=1, n_requests=2000, seed=1000)
    out[f"eval:{name}"] = df[["policy", "e2e_mean", "ttft_mean", "tpot_mean", "e2e_p99", "preemptions", "router_wait_mean", "completed", "t_end"]].to_dict("records")
base = load_scenario("examples/scenarios/rl-router-v100.toml")
sc = dataclasses.replace(base, classes=tuple(dataclasses.replace(c, rate=c.rate * 2.5) for c in base.classes))
for backend in ("auto", "python"):
    env = RouterEnv(sc, variant="wg", n_requests=1500, backend=backend)
    rng = np.random.default_rng(11)
    h = hashlib.sha256(); steps = 0
    obs, _ = env.reset(seed=5)
    while True:
        a = 0 if rng.random() < 0.5 else int(rng.integers(env.action_space.n))
        obs, r, term, trunc, info = env.step(a)
        h.update(obs.tobytes()); h.update(np.float64(r).tobytes()); h.update(np.float64(env.last_guidance).tobytes())
        steps += 1
        if term or trunc:
            break
    res = env.result()
    out[f"env:heavy:{backend}"] = [h.hexdigest(), steps, int(res.cluster["preemptions"])]
json.dump(out, open(sys.argv[1], "w"), indent=1, default=float)
print(json.dumps(out, default=float)[:2000])
