"""Bundled vs separate pricing on the paper's instance (paper Fig. 2; docs/results.md).

Gate-and-Route runs the bundled LP's plan and is paid per completed request (bundled revenue);
Prioritize-and-Route runs the separate LP's plan (gate by largest D_i/P_i) and is paid per prefill and
per decode (separate revenue). Both are simulated at several fleet sizes (``markov`` service, several
seeds); we report each policy's revenue over its own LP optimum and the queues. The separate LP's
optimum keeps a decode backlog (sum_i q_d,i* = 0.32 per GPU at its least; paper Sec. 3), the bundled
one none (Prop. 3.2): the simulated decode buffer of Prioritize-and-Route should settle near 0.32 per
GPU, and Gate-and-Route's should shrink toward 0 as n grows.

Outputs: a markdown table on stdout, ``<out>/runs.csv``, ``docs/figures/separate_pricing.png``.

    python examples/separate_pricing.py            # n in {50, 200, 500, 2000}, 3 seeds (about 12 min, 2 cores)
    python examples/separate_pricing.py --quick
"""

from __future__ import annotations

import argparse
import math
import time
from multiprocessing import Pool
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from scipy import stats

import fluidopt
from fluidopt.control.gate_and_route import GateAndRoute, PrioritizeAndRoute
from fluidopt.fluid import solve_fluid
from fluidopt.sim.api import simulate

ROOT = Path(__file__).resolve().parents[1]
HORIZON = {20: 8000.0, 50: 6000.0, 200: 3000.0, 500: 2000.0, 2000: 1000.0}
WARMUP = 300.0
PATH_N = 2000
POLICY = {"bundled": "gate-and-route", "separate": "prioritize-and-route"}


def run_one(task) -> dict:
    pricing, n, seed, horizon, warmup, path = task
    base = fluidopt.default_scenario()
    sol = solve_fluid(base, pricing)
    ctrl = GateAndRoute.from_solution(sol) if pricing == "bundled" else PrioritizeAndRoute.from_solution(sol, base)
    t0 = time.perf_counter()
    res = simulate(base.with_gpus(n), ctrl, horizon=horizon, warmup=warmup, seed=seed,
                   sample_interval=2.0 if path else None)
    rev = res.cluster["revenue_per_gpu"] if pricing == "bundled" else res.cluster["revenue_per_gpu_separate"]
    rec = {"pricing": pricing, "policy": ctrl.name, "n": n, "seed": seed, "horizon": horizon,
           "R_star": sol.objective_per_gpu, "revenue_per_gpu": rev, "ratio": rev / sol.objective_per_gpu,
           "revenue_bundled": res.cluster["revenue_per_gpu"], "revenue_separate": res.cluster["revenue_per_gpu_separate"],
           "wall_seconds": time.perf_counter() - t0}
    pc = res.per_class
    for k in range(len(base.classes)):
        for col in ("x_mean", "q_prefill_mean", "q_decode_mean", "y_mixed_mean", "y_solo_mean",
                    "abandoned_prefill_fraction", "abandoned_decode_fraction"):
            rec[f"{col}[{k}]"] = float(pc[col].iloc[k])
    if path and res.timeseries is not None:
        ts = res.timeseries
        qd = sum(ts[f"q_decode[{nm}]"] for nm in base.class_names) / n
        rec["_path"] = pd.DataFrame({"time": ts["time"], "Qd/n": qd})
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ns", type=int, nargs="+", default=[50, 200, 500, 2000])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "examples" / "separate_pricing")
    ap.add_argument("--fig-dir", type=Path, default=Path("fluidopt-examples"))
    a = ap.parse_args(argv)
    scale = 1.0
    if a.quick:
        a.ns, a.seeds, scale = [20, 200], 2, 0.15
    tasks = [(pr, n, seed, HORIZON.get(n, 2000.0) * scale, WARMUP * min(1.0, 2 * scale), n == PATH_N and seed == 0)
             for pr in POLICY for n in a.ns for seed in range(a.seeds)]
    tasks.sort(key=lambda t: -t[1] * t[3])
    t0 = time.perf_counter()
    with Pool(a.workers) as pool:
        recs = []
        for rec in pool.imap_unordered(run_one, tasks):
            recs.append(rec)
            print(f"  {rec['pricing']:8s} n={rec['n']:5d} seed={rec['seed']} ratio={rec['ratio']:.4f} "
                  f"wall={rec['wall_seconds']:.0f}s", flush=True)
    total = time.perf_counter() - t0
    paths = {r["pricing"]: r.pop("_path") for r in recs if "_path" in r}
    df = pd.DataFrame(recs).sort_values(["pricing", "n", "seed"])
    a.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(a.out / "runs.csv", index=False)
    base = fluidopt.default_scenario()
    sols = {pr: solve_fluid(base, pr) for pr in POLICY}
    names = base.class_names

    rows = []
    for (pr, n), g in df.groupby(["pricing", "n"]):
        k = len(g)
        hw = stats.t.ppf(0.975, k - 1) * g["ratio"].std(ddof=1) / math.sqrt(k) if k > 1 else float("nan")
        row = {"pricing": pr, "n": n, "policy": g["policy"].iloc[0], "seeds": k, "ratio": g["ratio"].mean(),
               "ci95": hw, "rev_b": g["revenue_bundled"].mean(), "rev_s": g["revenue_separate"].mean()}
        for i in range(len(names)):
            row[f"x{i + 1}"] = g[f"x_mean[{i}]"].mean()
            row[f"qp{i + 1}"] = g[f"q_prefill_mean[{i}]"].mean()
            row[f"qd{i + 1}"] = g[f"q_decode_mean[{i}]"].mean()
        row["qd"] = sum(row[f"qd{i + 1}"] for i in range(len(names)))
        row["wall"] = g["wall_seconds"].mean()
        rows.append(row)
    summ = pd.DataFrame(rows)
    summ.to_csv(a.out / "summary.csv", index=False)

    print("\n| pricing (policy) | n | revenue / own R* (mean +/- 95% CI) | bundled rev/GPU | separate rev/GPU | "
          + " | ".join(f"X/n {nm}" for nm in names) + " | " + " | ".join(f"Q_d/n {nm}" for nm in names)
          + " | Q_d/n total | wall s/run |")
    print("|---" * (7 + 2 * len(names)) + "|")
    for _, r in summ.iterrows():
        print(f"| {r.pricing} ({r.policy}) | {r.n} | {r.ratio:.4f} +/- {r.ci95:.4f} | {r.rev_b:.2f} | {r.rev_s:.2f} | "
              + " | ".join(f"{r[f'x{i + 1}']:.5f}" for i in range(len(names))) + " | "
              + " | ".join(f"{r[f'qd{i + 1}']:.3f}" for i in range(len(names))) + f" | {r.qd:.3f} | {r.wall:.0f} |")
    for pr, sol in sols.items():
        print(f"LP {pr}: R* = {sol.objective_per_gpu:.4f}, x* = {np.round(sol.x, 5).tolist()}, "
              f"q_d* = {np.round(sol.q_decode, 4).tolist()}, q_p* = {np.round(sol.q_prefill, 4).tolist()}, "
              f"M/n = {sol.prefill_occupancy:.5f}")
    print(f"{len(tasks)} runs in {total:.0f} s wall ({a.workers} workers)")

    # -- figure (like the paper's Fig. 2) --------------------------------------------------------
    a.fig_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.7))
    for j, pr in enumerate(POLICY):
        s = summ[summ.pricing == pr]
        lab = f"{pr}: {POLICY[pr]}"
        ax[0].errorbar(s.n, s.ratio, yerr=s.ci95, marker="o", capsize=3, label=lab, color=f"C{j}")
        ax[1].plot(s.n, s.qd, marker="s", color=f"C{j}", label=f"Q_d/n, {pr}")
        ax[1].plot(s.n, s.qp1 + s.qp2, marker="o", ls=":", color=f"C{j}", label=f"Q_p/n, {pr}")
        ax[1].axhline(float(sols[pr].q_decode.sum()), color=f"C{j}", lw=0.8, ls="--")
        if pr in paths:
            p = paths[pr]
            ax[2].plot(p["time"], p["Qd/n"], lw=0.7, color=f"C{j}", label=pr)
            ax[2].axhline(float(sols[pr].q_decode.sum()), color=f"C{j}", lw=0.8, ls="--")
    ax[0].axhline(1.0, color="k", lw=0.8, ls="--")
    ax[0].set_xscale("log")
    ax[0].set_xlabel("GPUs n")
    ax[0].set_ylabel("revenue / own LP optimum")
    ax[0].set_title("Revenue")
    ax[0].legend(fontsize=7, loc="lower right")
    ax[1].set_xscale("log")
    ax[1].set_xlabel("GPUs n")
    ax[1].set_ylabel("requests waiting per GPU")
    ax[1].set_title("Queues (dashed: LP decode backlog)")
    ax[1].legend(fontsize=7)
    ax[2].set_xlabel("time (s)")
    ax[2].set_ylabel("decode buffer Q_d/n")
    ax[2].set_title(f"Decode buffer path, n = {PATH_N}")
    ax[2].legend(fontsize=7)
    fig.tight_layout()
    p = a.fig_dir / "separate_pricing.png"
    fig.savefig(p, dpi=85)
    plt.close(fig)
    print(f"figure: {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
