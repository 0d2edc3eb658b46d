"""Bundled vs separate pricing on the paper's instance (paper Fig. 2; docs/results.md).

Gate-and-Route runs the bundled LP's plan and is paid per completed request (bundled revenue);
Prioritize-and-Route runs the separate LP's plan (gate by largest D_i/P_i) and is paid per prefill and
per decode (separate revenue). Both are simulated at several fleet sizes (``markov`` service, several
seeds); we report each policy's revenue over its own LP optimum and the queues. The separate LP's
optimum keeps a decode backlog (sum_i q_d,i* = 0.32 per GPU at its least; paper Sec. 3), the bundled
one none (Prop. 3.2): the simulated decode buffer of Prioritize-and-Route should settle near 0.32 per
GPU, and Gate-and-Route's should shrink toward 0 as n grows.

The runs go through :func:`fluidopt.harness.compare` (its tables and results store in ``--out``).
Outputs: a markdown table on stdout, the harness's tables in ``<out>``, ``<fig-dir>/separate_pricing.png``.

    python examples/separate_pricing.py            # n in {50, 200, 500, 2000}, 3 seeds (about 12 min, 2 cores)
    python examples/separate_pricing.py --quick
"""

from __future__ import annotations

from fluidopt.core.interrupt import script_guard

script_guard()  # Ctrl-C / SIGTERM from here on, the imports below included: one line, exit 130 / 143

import argparse
import dataclasses
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
HORIZON = {20: 8000.0, 50: 6000.0, 200: 3000.0, 500: 2000.0, 2000: 1000.0}
WARMUP = 300.0
PATH_N = 2000
POLICY = {"bundled": "gate-and-route", "separate": "prioritize-and-route"}
PRICING_OF = {p: pr for pr, p in POLICY.items()}  # each policy is paid under its own pricing


def fleet(n: int) -> fluidopt.Scenario:
    """The paper instance on n GPUs, named for the harness's tables."""
    return dataclasses.replace(fluidopt.default_scenario().with_gpus(n), name=f"n={n}")


def own_ratio(c: Comparison) -> pd.DataFrame:
    """Each run's revenue under its policy's own pricing, over that pricing's LP optimum."""
    pricing = c.runs["policy"].map(PRICING_OF)
    bounds = c.bounds.set_index("scenario")
    bound = [bounds.loc[s, f"lp_{pr}"] for s, pr in zip(c.runs["scenario"], pricing)]
    rev = np.where(pricing == "bundled", c.runs["revenue_per_gpu"], c.runs["revenue_per_gpu_separate"])
    return c.runs.assign(pricing=pricing, ratio=rev / np.asarray(bound))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ns", type=int, nargs="+", default=[50, 200, 500, 2000])
    ap.add_argument("--seeds", type=int, default=3)
    add_executor_arguments(ap, workers=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--replot", action="store_true", help="tables and figure from the tables in <out>")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "examples" / "separate_pricing")
    ap.add_argument("--fig-dir", type=Path, default=Path("fluidopt-examples"))
    a = ap.parse_args(argv)
    scale = 1.0
    if a.quick:
        a.ns, a.seeds, scale = [20, 200], 2, 0.15
    fleets = [fleet(n) for n in a.ns]
    if a.replot:
        c = Comparison.load(a.out)
    else:
        # One harness run: both LPs of every fleet solved once, each policy given its own pricing's plan.
        with executor_from_args(a) as ex:
            c = compare(fleets, list(POLICY.values()), seeds=range(a.seeds), executor=ex, out=a.out, progress=True,
                        horizon={s.name: HORIZON.get(s.gpus, 2000.0) * scale for s in fleets},
                        warmup=WARMUP * min(1.0, 2 * scale),
                        sample_interval={s.name: 2.0 if s.gpus == PATH_N else None for s in fleets})
    # the ratio under each policy's own pricing, then the harness's t-intervals over seeds
    own = dataclasses.replace(c, runs=own_ratio(c))
    summ_t = own.summary(ci="t").set_index(["scenario", "policy"])
    per_class = c.class_means().set_index(["scenario", "policy", "name"])
    paths = {}
    if c.timeseries is not None:
        for pol, g in c.timeseries[(c.timeseries["seed"] == 0) & (c.timeseries["scenario"] == f"n={PATH_N}")].groupby("policy"):
            qd = sum(g[f"q_decode[{nm}]"] for nm in fluidopt.default_scenario().class_names) / PATH_N
            paths[PRICING_OF[pol]] = pd.DataFrame({"time": g["time"], "Qd/n": qd})
    base = fluidopt.default_scenario()
    sols = {pr: solve_fluid(base, pr) for pr in POLICY}
    names = base.class_names

    rows = []
    for (scen, pol), g in own.runs.groupby(["scenario", "policy"], sort=False):
        t = summ_t.loc[(scen, pol)]
        row = {"pricing": g["pricing"].iloc[0], "n": int(g["gpus"].iloc[0]), "policy": pol, "seeds": len(g),
               "ratio": t["ratio"], "ci95": t["ratio_ci"], "rev_b": g["revenue_per_gpu"].mean(),
               "rev_s": g["revenue_per_gpu_separate"].mean()}
        for i, nm in enumerate(names):
            pc = per_class.loc[(scen, pol, nm)]
            row[f"x{i + 1}"], row[f"qp{i + 1}"], row[f"qd{i + 1}"] = pc["x_mean"], pc["q_prefill_mean"], pc["q_decode_mean"]
        row["qd"] = sum(row[f"qd{i + 1}"] for i in range(len(names)))
        row["wall"] = g["wall_seconds"].mean()
        rows.append(row)
    summ = pd.DataFrame(rows).sort_values(["pricing", "n"])
    summ.to_csv(a.out / "summary_by_pricing.csv", index=False)

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
    print(f"{len(c.runs)} runs in {c.wall_seconds:.0f} s wall ({a.workers} workers)")

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
    print(f"figure: {save_figure(fig, a.fig_dir / 'separate_pricing.png', dpi=85)}")
    return 0


if __name__ == "__main__":
    from fluidopt.core.interrupt import script_main

    # Ctrl-C / SIGTERM: one line on what was kept, exit 130 / 143, no traceback
    raise SystemExit(script_main(main))
