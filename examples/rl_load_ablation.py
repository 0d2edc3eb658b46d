"""Ablation: does routing matter more as the RL setting's load grows? (docs/rl.md section 6)

    python examples/rl_load_ablation.py [--episodes 5] [--rates 20,40,60] [--out docs/data]

The paper's round-robin latency (about 168 s for 2,000 requests at 20 req/s) says its instances were
heavily loaded; with the shipped llama2-7b-v100 profile the same arrivals load them lightly (mean
e2e under 5 s, no preemptions). This runs the same episodes scaled to higher arrival rates (the
mix unchanged) for a few routers. The RL routers were trained at 20 req/s only.
"""

from __future__ import annotations

from fluidopt.core.interrupt import script_guard

script_guard()  # Ctrl-C / SIGTERM from here on, the imports below included: one line, exit 130 / 143

import argparse
import dataclasses
from pathlib import Path

import pandas as pd

from fluidopt.rl.evaluate import evaluate, summarize
from fluidopt.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("round-robin", "least-requests", "jsq", "min-min", "decode-balancer", "baseline-rl", "wa-rl", "wg-rl")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=5)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rates", default="20,40,60")
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--out", default="fluidopt-examples/data")
    a = ap.parse_args()
    base = load_scenario(ROOT / "examples" / "scenarios" / "rl-router-v100.toml")
    total = sum(c.rate for c in base.classes)
    rows = []
    for rate in (float(x) for x in a.rates.split(",")):
        f = rate / total
        sc = dataclasses.replace(base, classes=tuple(dataclasses.replace(c, rate=c.rate * f) for c in base.classes))
        s = summarize(evaluate(sc, POLICIES, episodes=a.episodes, n_requests=a.requests, seed=a.seed))
        s.insert(0, "rate", rate)
        rows.append(s)
    df = pd.concat(rows)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    df.to_csv(Path(a.out) / "rl_load_ablation.csv", index=False)
    print("| req/s | router | mean e2e (s) | vs round robin | TTFT (s) | preemptions / episode |")
    print("|---|---|---|---|---|---|")
    for _, r in df.iterrows():
        print(f"| {r['rate']:g} | {r['policy']} | {r['e2e_mean']:.2f} ± {r['e2e_mean_ci']:.2f} | "
              f"{r['improvement_pct']:.2f}% ± {r['improvement_ci']:.2f} | {r['ttft_mean']:.2f} | {r['preemptions']:.0f} |")


if __name__ == "__main__":
    from fluidopt.core.interrupt import script_main

    # Ctrl-C / SIGTERM: one line on what was kept, exit 130 / 143, no traceback
    raise SystemExit(script_main(main))
