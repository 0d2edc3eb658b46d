"""Ablation beside the paper's MDP: RL routers trained on per-request credit (docs/rl.md section 6).

    python examples/rl_request_credit.py [--train [--only FILE,...]] [--weights-dir examples/weights]
        [--episodes 20] [--requests 2000] [--seed 1000] [--out docs/data]

The per-request objectives (``--objective request-latency`` / ``request-normalized`` /
``request-excess``, docs/rl.md section 2) credit each dispatch, when its request resolves, with minus
that request's own time from dispatch to resolution (request-normalized: its time to first token plus
the *predicted* output times its time per output token; request-excess: that time less the request's
solo service time); the agent is trained on these credits as gamma = 0 (contextual-bandit)
targets, so no other request's arrival or completion enters a dispatch's target. ``--train`` first
trains the agents of ``AGENTS`` on the 4-instance RL setting, one after the other, with the
``fluidopt rl train`` commands printed (deterministic bit for bit from the seed), into
``--weights-dir``, with their training curves (``rl_curves_req_*.csv``) in ``--out``; without it the
weight files must be there already.

Then every router runs on the paper-table protocol of examples/rl_time_in_system.py (the same 20
episodes of seed 1000, the same noisy-oracle predictions): round robin, least requests, least requests
on the RL routers' 0.02 s ticks, time-in-system agents of that script (``REFERENCE``; their weight
files come from ``rl_time_in_system.py --train``) and the per-request-credit agents, each of them
trained with the recipe and seed of one of the time-in-system agents. Writes rl_credit_episodes.csv
(one row per router and episode), rl_credit.csv (means, 95% CIs, improvement over round robin, over
least requests and over the time-in-system agent of the same recipe and seed, with paired CIs) and rl_credit_diagnostics.csv (Q-values over
the greedy decisions of evaluation episode 0, TD error of the last ten training episodes), and prints
markdown tables.
"""

from __future__ import annotations

from fluidopt.core.interrupt import script_guard

script_guard()  # Ctrl-C / SIGTERM from here on, the imports below included: one line, exit 130 / 143

import math
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from rl_time_in_system import SCENARIO, diagnostics_row, parse_and_train, print_q_table, run, run_on_ticks  # noqa: E402

from fluidopt.rl.evaluate import summarize  # noqa: E402
from fluidopt.scenario import load_scenario  # noqa: E402

LAT = "--objective request-latency"
NORM = "--objective request-normalized"
EXCESS = "--objective request-excess"
RECIPE = "--train-every 4 --arch shared --wait-mask fits"  # beside COMMON; gamma: the default 0.99 (section 2)
AGENTS = (
    # label, variant, weight file, training arguments beside rl_time_in_system.COMMON, the time-in-system agent
    # of the same recipe and seed (REFERENCE) it is paired with
    ("req-latency wg-rl", "wg", "wg-rl-reqlat-shared-fits-4.npz", f"{LAT} --seed 0 {RECIPE}", "tis-wg-rl"),
    ("req-latency wg-rl, seed 1", "wg", "wg-rl-reqlat-shared-fits-seed1-4.npz", f"{LAT} --seed 1 {RECIPE}",
     "tis-wg-rl, seed 1"),
    ("req-latency wg-rl, seed 2", "wg", "wg-rl-reqlat-shared-fits-seed2-4.npz", f"{LAT} --seed 2 {RECIPE}",
     "tis-wg-rl, seed 2"),
    ("req-normalized wg-rl", "wg", "wg-rl-reqnorm-shared-fits-4.npz", f"{NORM} --seed 0 {RECIPE}", "tis-wg-rl"),
    ("req-normalized wg-rl, seed 1", "wg", "wg-rl-reqnorm-shared-fits-seed1-4.npz", f"{NORM} --seed 1 {RECIPE}",
     "tis-wg-rl, seed 1"),
    ("req-normalized wg-rl, seed 2", "wg", "wg-rl-reqnorm-shared-fits-seed2-4.npz", f"{NORM} --seed 2 {RECIPE}",
     "tis-wg-rl, seed 2"),
    ("req-excess wg-rl", "wg", "wg-rl-reqexcess-shared-fits-4.npz", f"{EXCESS} --seed 0 {RECIPE}", "tis-wg-rl"),
    ("req-excess wg-rl, seed 1", "wg", "wg-rl-reqexcess-shared-fits-seed1-4.npz", f"{EXCESS} --seed 1 {RECIPE}",
     "tis-wg-rl, seed 1"),
    ("req-excess wg-rl, seed 2", "wg", "wg-rl-reqexcess-shared-fits-seed2-4.npz", f"{EXCESS} --seed 2 {RECIPE}",
     "tis-wg-rl, seed 2"),
    # two more seeds of request-latency and request-excess (no time-in-system agent of these seeds to pair with)
    ("req-latency wg-rl, seed 3", "wg", "wg-rl-reqlat-shared-fits-seed3-4.npz", f"{LAT} --seed 3 {RECIPE}", None),
    ("req-latency wg-rl, seed 4", "wg", "wg-rl-reqlat-shared-fits-seed4-4.npz", f"{LAT} --seed 4 {RECIPE}", None),
    ("req-excess wg-rl, seed 3", "wg", "wg-rl-reqexcess-shared-fits-seed3-4.npz", f"{EXCESS} --seed 3 {RECIPE}", None),
    ("req-excess wg-rl, seed 4", "wg", "wg-rl-reqexcess-shared-fits-seed4-4.npz", f"{EXCESS} --seed 4 {RECIPE}", None),
    ("req-latency wg-rl, one update per step", "wg", "wg-rl-reqlat-shared-fits-every1-4.npz",
     f"{LAT} --seed 0 --train-every 1 --arch shared --wait-mask fits", "tis-wg-rl, one update per step"),
    ("req-latency baseline-rl", "baseline", "baseline-rl-reqlat-shared-fits-4.npz", f"{LAT} --seed 0 {RECIPE}",
     "tis-baseline-rl"),
    ("req-latency baseline-rl, seed 1", "baseline", "baseline-rl-reqlat-shared-fits-seed1-4.npz",
     f"{LAT} --seed 1 {RECIPE}", "tis-baseline-rl, seed 1"),
)
REFERENCE = (
    # time-in-system agents of examples/rl_time_in_system.py (its --train writes them), for paired comparisons
    ("tis-wg-rl", "wg", "wg-rl-tis-shared-fits-4.npz"),
    ("tis-wg-rl, seed 1", "wg", "wg-rl-tis-shared-fits-seed1-4.npz"),
    ("tis-wg-rl, seed 2", "wg", "wg-rl-tis-shared-fits-seed2-4.npz"),
    ("tis-wg-rl, one update per step", "wg", "wg-rl-tis-shared-fits-every1-4.npz"),
    ("tis-baseline-rl", "baseline", "baseline-rl-tis-shared-fits-4.npz"),
    ("tis-baseline-rl, seed 1", "baseline", "baseline-rl-tis-shared-fits-seed1-4.npz"),
)


def main() -> None:
    a, wdir, out = parse_and_train(AGENTS, "req")
    sc = load_scenario(ROOT / SCENARIO)
    t0 = time.time()
    kw = {"episodes": a.episodes, "n_requests": a.requests, "seed": a.seed}
    rows = []
    for pol in ("round-robin", "least-requests"):
        rows += run(sc, pol, pol, None, **kw)
    rows += run_on_ticks(sc, "least-requests on 0.02 s ticks", "least-requests", **kw)
    agents = []
    for label, variant, fname, *_ in REFERENCE + AGENTS:
        if (wdir / fname).exists():
            agents.append((label, variant, fname))
        else:
            print(f"skipping {label}: {wdir / fname} not found", file=sys.stderr)
    for label, variant, fname in agents:
        rows += run(sc, label, f"{variant}-rl", str(wdir / fname), **kw)
    df = pd.DataFrame(rows)
    df.to_csv(out / "rl_credit_episodes.csv", index=False)
    s = summarize(df)
    vl = summarize(df, baseline="least-requests").set_index("policy")
    s["vs_least_requests_pct"] = s["policy"].map(vl["improvement_pct"])
    s["vs_least_requests_ci"] = s["policy"].map(vl["improvement_ci"])
    names = set(df.policy)
    s["vs_time_in_system_pct"] = s["vs_time_in_system_ci"] = math.nan
    for label, *_, ref in AGENTS:  # paired against the time-in-system agent of the same recipe and seed
        if label in names and ref in names:
            v = summarize(df[df.policy.isin((label, ref))], baseline=ref).set_index("policy")
            s.loc[s.policy == label, ["vs_time_in_system_pct", "vs_time_in_system_ci"]] = (
                v.at[label, "improvement_pct"], v.at[label, "improvement_ci"])
    extra = df.groupby("policy", sort=False)[["wait_fraction", "max_instance_share", "min_instance_share"]].mean()
    s = s.join(extra, on="policy")
    s.to_csv(out / "rl_credit.csv", index=False)
    diag = []
    for label, _, fname in agents:
        stem = Path(fname).stem  # curves written by --train (this script's or rl_time_in_system.py's)
        diag.append(diagnostics_row(sc, label, wdir / fname,
                                    [out / f"rl_curves_req_{stem}.csv", out / f"rl_curves_tis_{stem}.csv"],
                                    n_requests=a.requests, seed=a.seed))
    pd.DataFrame(diag).to_csv(out / "rl_credit_diagnostics.csv", index=False)
    print(f"{a.episodes} episodes x {a.requests} requests, seed {a.seed}, {time.time() - t0:.0f} s wall\n")
    print("| router | episodes | mean e2e (s) | vs round robin | vs least requests | vs time-in-system agent | "
          "TTFT (s) | TPOT (ms) | busiest / least busy instance |")
    print("|---|---|---|---|---|---|---|---|---|")
    for _, r in s.iterrows():
        sh = ("" if math.isnan(r["max_instance_share"]) else
              f"{100 * r['max_instance_share']:.1f}% / {100 * r['min_instance_share']:.1f}%")
        vt = ("" if math.isnan(r.get("vs_time_in_system_pct", math.nan)) else
              f"{r['vs_time_in_system_pct']:.2f}% ± {r['vs_time_in_system_ci']:.2f}")
        print(f"| {r['policy']} | {r['episodes']} | {r['e2e_mean']:.3f} ± {r['e2e_mean_ci']:.3f} | "
              f"{r['improvement_pct']:.2f}% ± {r['improvement_ci']:.2f} | {r['vs_least_requests_pct']:.2f}% ± "
              f"{r['vs_least_requests_ci']:.2f} | {vt} | {r['ttft_mean']:.3f} | {1000 * r['tpot_mean']:.2f} | {sh} |")
    print_q_table(diag, 4)


if __name__ == "__main__":
    from fluidopt.core.interrupt import script_main

    # Ctrl-C / SIGTERM: one line on what was kept, exit 130 / 143, no traceback
    raise SystemExit(script_main(main))
