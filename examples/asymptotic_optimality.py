"""Asymptotic optimality of Gate-and-Route on the paper's instance (paper Figs. 4 and 5; docs/results.md).

For each fleet size n, simulate Gate-and-Route (built once from the bundled LP, per-GPU targets scaled
to n) on ``fluidopt.default_scenario().with_gpus(n)`` with ``markov`` service over several seeds, and
report per-GPU revenue over the LP optimum R*, the prefill occupancies X_i/n against x_i*, the queues,
and where the finite-n revenue gap goes: by the exponential-patience identity the abandonment rate of
class i from a queue is theta_i times its mean length, so the loss against the LP splits exactly (in
expectation) into

    w_i theta_i (q_p,i - q_p,i*)   extra abandonment while waiting for a prefill, and
    w_i theta_i q_d,i              abandonment in the decode buffer (q_d* = 0 in the LP).

The runs go through :func:`fluidopt.harness.compare` (one LP per fleet, a process pool, a results store
in ``--out`` so that a rerun after Ctrl-C does only what is missing). Outputs: a markdown table on
stdout, the harness's tables in ``<out>`` (runs.csv, classes.csv, bounds.csv, timeseries.csv, plus
summary_by_n.csv), and two figures under ``--fig-dir``: ``asymptotic_revenue.png`` (ratio and queues vs n) and ``occupancy_paths.png``
(X_i(t)/n sample paths).

    python examples/asymptotic_optimality.py                  # full size (about 15 min on 2 cores)
    python examples/asymptotic_optimality.py --quick          # smoke run (under a minute)
"""

from __future__ import annotations

from fluidopt.core.interrupt import script_guard

script_guard()  # Ctrl-C / SIGTERM from here on, the imports below included: one line, exit 130 / 143

import argparse
import dataclasses
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

import fluidopt
from fluidopt.fluid import solve_fluid
from fluidopt.harness import Comparison, compare
from fluidopt.harness.executor import add_executor_arguments, executor_from_args
from fluidopt.harness.plots import save_figure

ROOT = Path(__file__).resolve().parents[1]
# Simulated seconds per fleet size: n * horizon ~ constant-ish (the batch-means half-width of the
# ratio scales like 1/sqrt(n * horizon)), never below 1,500 s (the slowest mode, the decode of a
# class-1 request, is ~22 s; relaxation takes a few hundred seconds).
HORIZON = {5: 20000.0, 20: 10000.0, 50: 6000.0, 200: 3000.0, 500: 2000.0, 2000: 1500.0}
WARMUP = 300.0
PATH_NS = (20, 200, 2000)  # fleets whose sample paths go in the occupancy figure (seed 0)
PATH_WINDOW = 600.0  # seconds of sample path shown
POLICY = "gate-and-route"


def fleet(n: int) -> fluidopt.Scenario:
    """The paper instance on n GPUs, named for the harness's tables."""
    return dataclasses.replace(fluidopt.default_scenario().with_gpus(n), name=f"n={n}")


def summarise(c: Comparison, sol, scenario) -> pd.DataFrame:
    """One row per n: the ratio over seeds (95% t-interval), queues per class and the loss split."""
    r = scenario.rates()
    w, theta = r.w, r.theta
    summ = c.summary(ci="t").set_index("scenario")
    per_class = c.class_means().set_index(["scenario", "name"])
    mixed = c.bounds.set_index("scenario")["mixed_gpus_bundled"]
    rows = []
    for name, g in c.runs.groupby("scenario", sort=False):
        row = {"n": int(g["gpus"].iloc[0]), "M": int(mixed[name]), "seeds": len(g), "horizon_s": g["horizon"].iloc[0],
               "ratio": summ.loc[name, "ratio"], "ratio_ci95": summ.loc[name, "ratio_ci"],
               "revenue_per_gpu": summ.loc[name, "revenue"]}
        loss = 0.0
        for i, cname in enumerate(scenario.class_names):
            pc = per_class.loc[(name, cname)]
            row[f"x{i + 1}"], row[f"q_p{i + 1}"], row[f"q_d{i + 1}"] = pc["x_mean"], pc["q_prefill_mean"], pc["q_decode_mean"]
            lp = w[i] * theta[i] * (row[f"q_p{i + 1}"] - sol.q_prefill[i])
            ld = w[i] * theta[i] * row[f"q_d{i + 1}"]
            row[f"loss_prefill{i + 1}"] = lp
            row[f"loss_decode{i + 1}"] = ld
            loss += lp + ld
        row["loss_explained"] = loss
        row["loss_observed"] = sol.objective_per_gpu - row["revenue_per_gpu"]
        row["wall_s_per_run"] = g["wall_seconds"].mean()
        rows.append(row)
    return pd.DataFrame(rows).sort_values("n").set_index("n")


def sample_paths(timeseries: pd.DataFrame | None, names) -> dict[int, pd.DataFrame]:
    """X_i(t)/n of seed 0 for each sampled fleet, {n: frame with time and X{i}/n}."""
    if timeseries is None or timeseries.empty:
        return {}
    out = {}
    for scen, g in timeseries[timeseries["seed"] == 0].groupby("scenario"):
        n = int(str(scen).split("=")[1])
        out[n] = pd.DataFrame({"time": g["time"].to_numpy(),
                               **{f"X{k}/n": g[f"x[{nm}]"].to_numpy() / n for k, nm in enumerate(names)}})
    return out


def figures(summary: pd.DataFrame, df: pd.DataFrame, paths: dict, sol, names, fig_dir: Path) -> list[Path]:
    fig_dir.mkdir(parents=True, exist_ok=True)
    out = []
    ns = summary.index.to_numpy()
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
    ax[0].errorbar(ns, summary["ratio"], yerr=summary["ratio_ci95"], marker="o", capsize=3, label="Gate-and-Route")
    for _, g in df.groupby("gpus"):
        ax[0].plot(g["gpus"], g["ratio"], ".", color="0.6", ms=3)
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
    out.append(save_figure(fig, fig_dir / "asymptotic_revenue.png", dpi=90))
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
        out.append(save_figure(fig, fig_dir / "occupancy_paths.png", dpi=80))
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
    add_executor_arguments(ap, workers=2)
    ap.add_argument("--horizon-scale", type=float, default=1.0, help="multiply every horizon (and the warm-up)")
    ap.add_argument("--quick", action="store_true", help="n in {5, 20, 200}, 2 seeds, short horizons")
    ap.add_argument("--replot", action="store_true", help="redraw from the tables in <out> only")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "examples" / "asymptotic_optimality")
    ap.add_argument("--fig-dir", type=Path, default=Path("fluidopt-examples"))
    a = ap.parse_args(argv)
    if a.replot:  # redraw the figures and tables from a previous run's tables, without simulating
        return report(Comparison.load(a.out), a)
    ns, seeds, scale = a.ns, a.seeds, a.horizon_scale
    if a.quick:
        ns, seeds, scale = [5, 20, 200], 2, 0.1
    fleets = [fleet(n) for n in ns]
    # Runs go through the harness (one LP per fleet, handed to every run; a results store in --out,
    # so a rerun after Ctrl-C does only what is missing).
    with executor_from_args(a) as ex:
        c = compare(fleets, [POLICY], seeds=range(seeds), executor=ex, out=a.out, progress=True,
                    horizon={s.name: HORIZON.get(s.gpus, max(1500.0, 1e6 / s.gpus)) * scale for s in fleets},
                    warmup=WARMUP * min(1.0, scale * 2),
                    sample_interval={s.name: 1.0 if s.gpus in PATH_NS else None for s in fleets})
    return report(c, a)


def report(c: Comparison, a: argparse.Namespace) -> int:
    base = fluidopt.default_scenario()
    sol = solve_fluid(base)
    summary = summarise(c, sol, base)
    a.out.mkdir(parents=True, exist_ok=True)
    summary.to_csv(a.out / "summary_by_n.csv")
    figs = figures(summary, c.runs, sample_paths(c.timeseries, base.class_names), sol, base.class_names, a.fig_dir)
    print(markdown(summary, base.class_names))
    print(f"\nLP: R* = {sol.objective_per_gpu:.4f} per GPU per s, x* = {np.round(sol.x, 5).tolist()}, "
          f"q_p* = {np.round(sol.q_prefill, 4).tolist()}")
    print(f"{len(c.runs)} runs in {c.wall_seconds:.0f} s wall ({a.workers} workers, pid {os.getpid()}); "
          f"figures: {', '.join(str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p) for p in figs)}")
    return 0


if __name__ == "__main__":
    from fluidopt.core.interrupt import script_main

    # Ctrl-C / SIGTERM: one line on what was kept, exit 130 / 143, no traceback
    raise SystemExit(script_main(main))
