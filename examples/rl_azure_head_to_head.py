"""Head to head (c): the Azure conversation trace replayed on the 8-instance RL setting.

    python examples/rl_azure_head_to_head.py [--trace FILE] [--requests 2000] [--speedups 1,2]
                                             [--seed 1000] [--out docs/data]

The trace (Azure LLM inference 2023, conversation service; 19,366 requests over 58 minutes) is cut
into consecutive windows of N requests (fluidopt.rl.evaluate.trace_episodes; the tail shorter than
N is dropped), each replayed from time 0 on `rl-router-v100-8.toml` (8 Llama-2-7B/V100 instances,
prefill first, KV capacity, recompute preemption) at each speed-up (1 = the trace's own rate).
Every router runs on the same windows with the same noisy-oracle bucket predictions (accuracy 0.79,
seeded per window). The scenario's classes are the trace's (split at its median prompt and output
lengths, fluidopt.workloads.traces.replay), which only the gate-and-route family's fluid LP uses; as in
head to head (a) they plan with c_p = c_d = 1 per token. The RL routers use the shipped 8-instance
weights as they are (trained on the five-task mix at 40 req/s, not on this trace).

Writes rl_azure_table_episodes.csv (one row per speed-up, policy and window) and rl_azure_table.csv
(per speed-up and policy: means, 95% CIs over windows, improvement over round robin with a paired
CI), and prints a markdown table. Without the trace file it says so in one line and exits 2.
"""

from __future__ import annotations

from fluidopt.core.interrupt import script_guard

script_guard()  # Ctrl-C / SIGTERM from here on, the imports below included: one line, exit 130 / 143

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

import pandas as pd

from fluidopt.rl.evaluate import GATE_AND_ROUTE_POLICIES, PAPER_POLICIES, evaluate, summarize, trace_episodes
from fluidopt.scenario import load_scenario
from fluidopt.workloads.traces import replay

ROOT = Path(__file__).resolve().parents[1]
AZURE = ROOT.parent / "shared" / "data" / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_conv.csv"


def run(trace: Path, *, requests: int, speedups: list[float], seed: int, max_episodes: int | None = None,
        policies=PAPER_POLICIES, gate_and_route=GATE_AND_ROUTE_POLICIES) -> pd.DataFrame:
    """One row per (speed-up, policy, window)."""
    base = load_scenario(ROOT / "examples" / "scenarios" / "rl-router-v100-8.toml")
    frames = []
    for sp in speedups:
        sc, tr = replay(trace, base, speedup=sp)
        eps = trace_episodes(tr, requests, max_episodes=max_episodes)
        df = evaluate(sc, policies, workloads=eps, seed=seed)
        if gate_and_route:
            priced = dataclasses.replace(sc, prefill_price=1.0, decode_price=1.0)
            df = pd.concat([df, evaluate(priced, gate_and_route, workloads=eps, seed=seed)])
        df.insert(0, "speedup", sp)
        df.insert(1, "rate", requests / float(pd.Series([w.duration for w in eps]).mean()))
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(AZURE))
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--speedups", default="1,2")
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--episodes", type=int, default=None, help="at most this many windows per speed-up")
    ap.add_argument("--out", default="fluidopt-examples/data")
    ap.add_argument("--policies", default=None, help="comma-separated routers (default: all of the table)")
    a = ap.parse_args()
    if not Path(a.trace).is_file():
        print(f"rl_azure_head_to_head: trace file {a.trace!r}: no such file (the Azure conversation trace)", file=sys.stderr)
        sys.exit(2)
    t0 = time.time()
    kw = {}
    if a.policies:
        chosen = [p.strip() for p in a.policies.split(",") if p.strip()]
        kw = {"policies": [p for p in chosen if p not in GATE_AND_ROUTE_POLICIES],
              "gate_and_route": [p for p in chosen if p in GATE_AND_ROUTE_POLICIES]}
    df = run(Path(a.trace), requests=a.requests, speedups=[float(x) for x in a.speedups.split(",")], seed=a.seed,
             max_episodes=a.episodes, **kw)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "rl_azure_table_episodes.csv", index=False)
    rows = []
    for sp, g in df.groupby("speedup", sort=True):
        s = summarize(g.drop(columns=["speedup", "rate"]))
        s.insert(0, "speedup", sp)
        s.insert(1, "rate", float(g["rate"].iloc[0]))
        rows.append(s)
    s = pd.concat(rows, ignore_index=True).drop(columns=["paper_improvement_pct"])
    s.to_csv(out / "rl_azure_table.csv", index=False)
    n_ep = int(df.groupby(["speedup", "policy"]).size().min())
    print(f"{n_ep} windows x {a.requests} requests per speed-up, seed {a.seed}, {time.time() - t0:.0f} s wall\n")
    print("| speed-up (req/s) | router | mean e2e (s) | vs round robin | TTFT (s) | TPOT (ms) | preemptions / window | router wait (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for _, r in s.iterrows():
        rw = "" if math.isnan(r["router_wait_mean"]) else f"{r['router_wait_mean']:.3f}"
        print(f"| {r['speedup']:g}x ({r['rate']:.1f}) | {r['policy']} | {r['e2e_mean']:.2f} ± {r['e2e_mean_ci']:.2f} | "
              f"{r['improvement_pct']:.2f}% ± {r['improvement_ci']:.2f} | {r['ttft_mean']:.2f} | "
              f"{1000 * r['tpot_mean']:.1f} | {r['preemptions']:.0f} | {rw} |")


if __name__ == "__main__":
    from fluidopt.core.interrupt import script_main

    # Ctrl-C / SIGTERM: one line on what was kept, exit 130 / 143, no traceback
    raise SystemExit(script_main(main))
