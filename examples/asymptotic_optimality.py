"""Asymptotic optimality of Gate-and-Route on the paper's instance (paper Figs. 4 and 5; docs/results.md).

For each fleet size n, simulate Gate-and-Route (built once from the bundled LP, per-GPU targets scaled
to n) on ``fluidopt.default_scenario().with_gpus(n)`` with ``markov`` service over several seeds, and
report per-GPU revenue over the LP optimum R*, the prefill occupancies X_i/n against x_i*, the queues,
and where the finite-n revenue gap goes: by the exponential-patience identity the abandonment rate of
class i from a queue is theta_i times its mean length, so the loss against the LP splits exactly (in
expectation) into

    w_i theta_i (q_p,i - q_p,i*)   extra abandonment while waiting for a prefill, and
    w_i theta_i q_d,i              abandonment in the decode buffer (q_d* = 0 in the LP).

Outputs: a markdown table on stdout, ``<out>/runs.csv`` (one row per run), and two figures under
``docs/figures/``: ``asymptotic_revenue.png`` (ratio and queues vs n) and ``occupancy_paths.png``
(X_i(t)/n sample paths).

    python examples/asymptotic_optimality.py                  # full size (about 15 min on 2 cores)
    python examples/asymptotic_optimality.py --quick          # smoke run (under a minute)
"""

from __future__ import annotations

import argparse
import math
import os
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
from fluidopt.control.gate_and_route import GateAndRoute
from fluidopt.fluid import solve_fluid
from fluidopt.sim.api import simulate

ROOT = Path(__file__).resolve().parents[1]
# Simulated seconds per fleet size: n * horizon ~ constant-ish (the batch-means half-width of the
# ratio scales like 1/sqrt(n * horizon)), never below 1,500 s (the slowest mode, the decode of a
# class-1 request, is ~22 s; relaxation takes a few hundred seconds).
HORIZON = {5: 20000.0, 20: 10000.0, 50: 6000.0, 200: 3000.0, 500: 2000.0, 2000: 1500.0}
WARMUP = 300.0
PATH_NS = (20, 200, 2000)  # fleets whose sample paths go in the occupancy figure (seed 0)
PATH_WINDOW = 600.0  # seconds of sample path shown


def run_one(task: tuple[int, int, float, float, bool]) -> dict:
    n, seed, horizon, warmup, paths = task
    base = fluidopt.default_scenario()
    sol = solve_fluid(base)
    s = base.with_gpus(n)
    ctrl = GateAndRoute.from_solution(sol)
    t0 = time.perf_counter()
    res = simulate(s, ctrl, horizon=horizon, warmup=warmup, seed=seed, service="markov",
                   sample_interval=1.0 if paths else None)
    wall = time.perf_counter() - t0
    pc = res.per_class
    rec = {"n": n, "seed": seed, "horizon": horizon, "warmup": warmup, "mixed_gpus": ctrl.mixed_gpus,
           "revenue_per_gpu": res.cluster["revenue_per_gpu"], "revenue_ci": res.cluster["revenue_per_gpu_ci"],
           "R_star": sol.objective_per_gpu, "wall_seconds": wall, "events": res.events,
           "requests": res.totals["requests"]}
    rec["ratio"] = rec["revenue_per_gpu"] / sol.objective_per_gpu
    for k in range(len(s.class_names)):
        for col in ("x_mean", "y_mixed_mean", "y_solo_mean", "q_prefill_mean", "q_decode_mean", "throughput",
                    "abandoned_prefill_fraction", "abandoned_decode_fraction"):
            rec[f"{col}[{k}]"] = float(pc[col].iloc[k])
    if paths and res.timeseries is not None:
        ts = res.timeseries
        rec["_path"] = pd.DataFrame({"time": ts["time"], **{f"X{k}/n": ts[f"x[{nm}]"] / n
                                                              for k, nm in enumerate(s.class_names)}})
    return rec


def summarise(df: pd.DataFrame, sol, scenario) -> pd.DataFrame:
    r = scenario.rates()
    w, theta = r.w, r.theta
    rows = []
    for n, g in df.groupby("n"):
        k = len(g)
        m, sd = g["ratio"].mean(), g["ratio"].std(ddof=1) if k > 1 else float("nan")
        hw = stats.t.ppf(0.975, k - 1) * sd / math.sqrt(k) if k > 1 else float("nan")
        row = {"n": n, "M": int(g["mixed_gpus"].iloc[0]), "seeds": k, "horizon_s": g["horizon"].iloc[0],
               "ratio": m, "ratio_ci95": hw, "revenue_per_gpu": g["revenue_per_gpu"].mean()}
        loss = 0.0
        for i in range(len(w)):
            row[f"x{i + 1}"] = g[f"x_mean[{i}]"].mean()
            row[f"q_p{i + 1}"] = g[f"q_prefill_mean[{i}]"].mean()
            row[f"q_d{i + 1}"] = g[f"q_decode_mean[{i}]"].mean()
            lp = w[i] * theta[i] * (row[f"q_p{i + 1}"] - sol.q_prefill[i])
            ld = w[i] * theta[i] * row[f"q_d{i + 1}"]
            row[f"loss_prefill{i + 1}"] = lp
            row[f"loss_decode{i + 1}"] = ld
            loss += lp + ld
        row["loss_explained"] = loss
        row["loss_observed"] = sol.objective_per_gpu - row["revenue_per_gpu"]
        row["wall_s_per_run"] = g["wall_seconds"].mean()
        rows.append(row)
    return pd.DataFrame(rows).set_index("n")


def figures(summary: pd.DataFrame, df: pd.DataFrame, paths: dict, sol, names, fig_dir: Path) -> list[Path]:
    fig_dir.mkdir(parents=True, exist_ok=True)
    out = []
    ns = summary.index.to_numpy()
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
    ax[0].errorbar(ns, summary["ratio"], yerr=summary["ratio_ci95"], marker="o", capsize=3, label="Gate-and-Route")
    for _, g in df.groupby("n"):
        ax[0].plot(g["n"], g["ratio"], ".", color="0.6", ms=3)
    ax[0].axhline(1.0, color="k", lw=0.8, ls="--", label="LP optimum R*")
    ax[0].set_xscale("log")
    ax[0].set_xlabel("GPUs n")
    ax[0].set_ylabel("revenue per GPU / R*")
    ax[0].set_title("Revenue (mean and 95% CI over seeds)")
    ax[0].legend(loc="lower right", fontsize=8)
    for i, nm in enumerate(names):
        ax[1].plot(ns, summary[f"q_p{i + 1}"], marker="o", label=f"Q_p/n {nm}")
        ax[1].plot(ns, summary[f"q_d{i + 1}"], marker="s", ls=":", label=f"Q_d/n {nm}")
        ax[1].axhline(sol.q_prefill[i], color=f"C{2 * i}", lw=0.8, ls="--")
    ax[1].set_xscale("log")
    ax[1].set_xlabel("GPUs n")
    ax[1].set_ylabel("requests waiting per GPU")
    ax[1].set_title("Queues (dashed: LP q_p*; LP q_d* = 0)")
    ax[1].legend(fontsize=7)
    fig.tight_layout()
    p = fig_dir / "asymptotic_revenue.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    out.append(p)
    if paths:
        fig, ax = plt.subplots(1, len(names), figsize=(10, 3.6))
        for i, nm in enumerate(names):
            for j, n in enumerate(sorted(paths)):
                pth = paths[n]
                pth = pth[pth["time"] <= PATH_WINDOW]
                ax[i].plot(pth["time"], pth[f"X{i}/n"], lw=0.4 + 0.4 * j, color=f"C{j}", label=f"n = {n}",
                           alpha=0.5 if j == 0 else 1.0)
            ax[i].set_ylim(max(0.0, sol.x[i] - 0.03), sol.x[i] + 0.03)  # +/- 3% of a GPU around x*
            ax[i].axhline(sol.x[i], color="k", ls="--", lw=1.0, label="x* (LP)")
            ax[i].set_xlabel("time (s)")
            ax[i].set_ylabel(f"X/n, class {nm}")
            ax[i].set_title(f"Prefill occupancy, {nm}")
            ax[i].legend(fontsize=7)
        fig.tight_layout()
        p = fig_dir / "occupancy_paths.png"
        fig.savefig(p, dpi=80)
        plt.close(fig)
        out.append(p)
    return out


def markdown(summary: pd.DataFrame, names) -> str:
    k = int(summary["seeds"].iloc[0])
    lines = [f"| n | M | horizon (s) | revenue / R* (mean +/- 95% CI, {k} seeds) | "
             + " | ".join(f"X/n {nm}" for nm in names) + " | "
             + " | ".join(f"Q_p/n {nm}" for nm in names) + " | "
             + " | ".join(f"Q_d/n {nm}" for nm in names) + " | wall s/run |",
             "|---" * (5 + 3 * len(names)) + "|"]
    for n, r in summary.iterrows():
        lines.append(
            f"| {n} | {int(r['M'])} | {r['horizon_s']:.0f} | {r['ratio']:.4f} +/- {r['ratio_ci95']:.4f} | "
            + " | ".join(f"{r[f'x{i + 1}']:.5f}" for i in range(len(names))) + " | "
            + " | ".join(f"{r[f'q_p{i + 1}']:.3f}" for i in range(len(names))) + " | "
            + " | ".join(f"{r[f'q_d{i + 1}']:.3f}" for i in range(len(names))) + f" | {r['wall_s_per_run']:.0f} |")
    lines.append("")
    lines.append("Loss against R* per GPU per second, by class and queue (w_i theta_i times the excess queue):")
    lines.append("")
    lines.append("| n | " + " | ".join(f"prefill {nm} | decode buffer {nm}" for nm in names)
                 + " | explained | observed |")
    lines.append("|---" * (3 + 2 * len(names)) + "|")
    for n, r in summary.iterrows():
        lines.append(f"| {n} | " + " | ".join(f"{r[f'loss_prefill{i + 1}']:.2f} | {r[f'loss_decode{i + 1}']:.2f}"
                                              for i in range(len(names)))
                     + f" | {r['loss_explained']:.2f} | {r['loss_observed']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ns", type=int, nargs="+", default=sorted(HORIZON))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--horizon-scale", type=float, default=1.0, help="multiply every horizon (and the warm-up)")
    ap.add_argument("--quick", action="store_true", help="n in {5, 20, 200}, 2 seeds, short horizons")
    ap.add_argument("--replot", action="store_true", help="redraw from <out>/runs.csv and paths.csv only")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "examples" / "asymptotic_optimality")
    ap.add_argument("--fig-dir", type=Path, default=Path("fluidopt-examples"))
    a = ap.parse_args(argv)
    if a.replot:  # redraw the figures and tables from a previous run's CSVs, without simulating
        df = pd.read_csv(a.out / "runs.csv")
        pf = a.out / "paths.csv"
        paths = {int(n): g.drop(columns="n") for n, g in pd.read_csv(pf).groupby("n")} if pf.exists() else {}
        return report(df, paths, a, total=float("nan"), runs=len(df))
    ns, seeds, scale = a.ns, a.seeds, a.horizon_scale
    if a.quick:
        ns, seeds, scale = [5, 20, 200], 2, 0.1
    tasks = []
    for n in ns:
        h = HORIZON.get(n, max(1500.0, 1e6 / n)) * scale
        for seed in range(seeds):
            tasks.append((n, seed, h, WARMUP * min(1.0, scale * 2), seed == 0 and n in PATH_NS))
    tasks.sort(key=lambda t: -t[0] * t[2])  # longest first: better packing on the workers
    t0 = time.perf_counter()
    with Pool(a.workers) as pool:
        recs = []
        for rec in pool.imap_unordered(run_one, tasks):
            recs.append(rec)
            print(f"  n={rec['n']:5d} seed={rec['seed']} ratio={rec['ratio']:.4f} wall={rec['wall_seconds']:.0f}s",
                  flush=True)
    total = time.perf_counter() - t0
    paths = {r["n"]: r.pop("_path") for r in recs if "_path" in r}
    df = pd.DataFrame(recs).sort_values(["n", "seed"])
    a.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(a.out / "runs.csv", index=False)
    if paths:
        pd.concat([p.assign(n=n) for n, p in paths.items()]).to_csv(a.out / "paths.csv", index=False)
    return report(df, paths, a, total=total, runs=len(tasks))


def report(df: pd.DataFrame, paths: dict, a: argparse.Namespace, *, total: float, runs: int) -> int:
    base = fluidopt.default_scenario()
    sol = solve_fluid(base)
    summary = summarise(df, sol, base)
    summary.to_csv(a.out / "summary.csv")
    figs = figures(summary, df, paths, sol, base.class_names, a.fig_dir)
    print(markdown(summary, base.class_names))
    print(f"\nLP: R* = {sol.objective_per_gpu:.4f} per GPU per s, x* = {np.round(sol.x, 5).tolist()}, "
          f"q_p* = {np.round(sol.q_prefill, 4).tolist()}")
    print(f"{runs} runs in {total:.0f} s wall ({a.workers} workers, pid {os.getpid()}); "
          f"figures: {', '.join(str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p) for p in figs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
