"""The within-group rules of docs/rl.md section 6b's ablation, run as routers (no network).

Each rule decides, under the ``small-large`` action mask (only the instances of the head's Dedicated
Small-Large group are valid), which instance of the group takes the head of the router queue:

* ``tokens-v1``: the least predicted work read from the v1 state (bucket counts / 128, capped at 1,
  times the buckets' tokens): the rule the second version of the regime router was fitted to;
* ``tokens``: the least predicted work from the exact counts;
* ``requests``: the fewest unfinished requests from the exact counts (what the log-count state gives
  back exactly; the rule the shipped router is fitted to).

Ties go to the most free capacity, then the lowest index. Round robin and Small-Large (its own round
robin inside the groups) run on the same episodes (``fluidopt rl evaluate``'s: seed 1000, episode k
is ``episode_seed(1000, k)``). Prints each rule's mean E2E and the paired improvement (per-episode
percentages, mean and 95% t interval) over round robin and over Small-Large.

    python examples/rl_within_group_rules.py examples/scenarios/rl-router-paper-regime.toml --episodes 20
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
from scipy import stats

from fluidopt.rl.core import STATE_LAYOUT, episode_seed, episode_workload
from fluidopt.rl.evaluate import policy_options, run_episode
from fluidopt.rl.policies import RLRouter
from fluidopt.rl.predictors import BUCKET_TOKENS, NoisyOracle, scenario_accuracy
from fluidopt.scenario import load_scenario

RULES = ("tokens-v1", "tokens", "requests")


class RuleNet:
    """A within-group rule in the shape of a weight file's network: ``q(obs)`` scores each instance
    (higher is better; "wait" never wins) from the state or from the router's exact counters."""

    dispatch = "multi"
    wait_mask = "small-large"
    layout = STATE_LAYOUT
    arch = "rule"

    def __init__(self, rule: str, n_instances: int):
        self.rule = rule
        self.n_instances = n_instances
        self.router: RLRouter | None = None

    def fits(self, m: int) -> bool:
        return True

    def q(self, obs: np.ndarray) -> np.ndarray:
        cnt = self.router.cnt
        n = self.router.n
        out = np.empty(n + 1)
        for g in range(n):
            if self.rule == "tokens-v1":
                work = round(128 * float(sum(obs[6 * g + 1 + j] * BUCKET_TOKENS[j] for j in range(3))))
            elif self.rule == "tokens":
                work = sum(cnt[g][j] * BUCKET_TOKENS[j] for j in range(3))
            else:
                work = sum(cnt[g])
            out[g] = -work + 1e-6 * float(obs[6 * g + 4])  # free capacity (<= 1) breaks ties only
        out[n] = -np.inf
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario")
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1000)
    args = ap.parse_args()
    sc = load_scenario(args.scenario)
    acc = scenario_accuracy(sc)
    rows = []
    for k in range(args.episodes):
        es = episode_seed(args.seed, k)
        wl = episode_workload(sc, args.requests, es)
        for pol in ("round-robin", "small-large", *RULES):
            if pol in RULES:
                net = RuleNet(pol, sc.gpus)
                router = RLRouter(sc, net, predictor=NoisyOracle(acc, seed=es), name=pol)
                net.router = router
                res = run_episode(sc, router, wl, seed=es)
            else:
                res = run_episode(sc, pol, wl, seed=es, options=policy_options(pol, es, accuracy=acc))
            rows.append({"policy": pol, "episode": k, "e2e_mean": res.cluster["e2e_mean"]})
    p = pd.DataFrame(rows).pivot(index="episode", columns="policy", values="e2e_mean")
    n = len(p)
    t = stats.t.ppf(0.975, n - 1) if n > 1 else float("nan")
    print(f"{sc.name}: {n} episodes x {args.requests} requests, seed {args.seed}")
    for pol in ("round-robin", "small-large", *RULES):
        cells = []
        for base in ("round-robin", "small-large"):
            d = 100.0 * (p[base] - p[pol]) / p[base]
            cells.append(f"vs {base} {d.mean():+6.2f}% +- {t * d.std(ddof=1) / np.sqrt(n):.2f}")
        print(f"{pol:12s} e2e {p[pol].mean():8.2f} s  " + "  ".join(cells))


if __name__ == "__main__":
    main()
