"""The RL router paper's table on the RL setting, and the head-to-head (a) against gate-and-route.

    python examples/rl_paper_table.py [--episodes 20] [--requests 2000] [--seed 1000] [--out docs/data]

Every policy runs on the same episodes (episode k: the first N arrivals of the scenario's workload
drawn with episode_seed(seed, k)), with the same noisy-oracle bucket predictions (accuracy 0.79)
for the routers that use predictions. Writes rl_table_episodes.csv (one row per policy and episode),
rl_table.csv (means, 95% CIs over episodes, improvement over round robin with a paired CI) and
prints a markdown table. The gate-and-route family plans with an LP: this scenario has no prices, so
for them it is run with c_p = c_d = 1 per token (a throughput objective); the instance routers ignore
prices.
"""

from __future__ import annotations

from fluidopt.core.interrupt import script_guard

script_guard()  # Ctrl-C / SIGTERM from here on, the imports below included: one line, exit 130 / 143

import argparse
import dataclasses
import math
import time
from pathlib import Path

import pandas as pd

from fluidopt.rl.evaluate import GATE_AND_ROUTE_POLICIES as GATE_AND_ROUTE
from fluidopt.rl.evaluate import PAPER_POLICIES, evaluate, summarize
from fluidopt.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--out", default="fluidopt-examples/data")
    ap.add_argument("--no-gate-and-route", action="store_true")
    a = ap.parse_args()
    sc = load_scenario(ROOT / "examples" / "scenarios" / "rl-router-v100.toml")
    t0 = time.time()
    df = evaluate(sc, PAPER_POLICIES, episodes=a.episodes, n_requests=a.requests, seed=a.seed)
    if not a.no_gate_and_route:
        priced = dataclasses.replace(sc, prefill_price=1.0, decode_price=1.0)
        df = pd.concat([df, evaluate(priced, GATE_AND_ROUTE, episodes=a.episodes, n_requests=a.requests, seed=a.seed)])
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "rl_table_episodes.csv", index=False)
    s = summarize(df)
    s.to_csv(out / "rl_table.csv", index=False)
    print(f"{a.episodes} episodes x {a.requests} requests, seed {a.seed}, {time.time() - t0:.0f} s wall\n")
    print("| router | mean e2e (s) | vs round robin | paper | TTFT (s) | TPOT (ms) | preemptions / episode | router wait (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for _, r in s.iterrows():
        pap = "" if math.isnan(r["paper_improvement_pct"]) else f"{r['paper_improvement_pct']:.2f}%"
        rw = "" if math.isnan(r["router_wait_mean"]) else f"{r['router_wait_mean']:.3f}"
        print(f"| {r['policy']} | {r['e2e_mean']:.3f} ± {r['e2e_mean_ci']:.3f} | {r['improvement_pct']:.2f}% ± "
              f"{r['improvement_ci']:.2f} | {pap} | {r['ttft_mean']:.3f} | {1000 * r['tpot_mean']:.2f} | "
              f"{r['preemptions']:.1f} | {rw} |")


if __name__ == "__main__":
    from fluidopt.core.interrupt import script_main

    # Ctrl-C / SIGTERM: one line on what was kept, exit 130 / 143, no traceback
    raise SystemExit(script_main(main))
