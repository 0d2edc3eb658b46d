"""SLI-aware routing on the paper's instance (paper Fig. 6; docs/results.md).

Part 1, decode fairness: with the SLI max_i y_s,i - min_i y_s,i <= 0.5 (solo decode slots per GPU) the
SLI LP puts every mixed decode slot on class 1 (y_m* = (3.11, 0), y_s* = (4.90, 4.40)). SLI-aware
Gate-and-Route sends class i's decodes to the solo pool with probability p_s,i (one buffer per pool);
plain Gate-and-Route from the same LP uses the greedy solo-first router. Both run at several n
(``markov``, several seeds); we report the class-wise decode occupancies against y*, the fairness
gap y_s,1 - y_s,2 and the revenue.

Part 2, a plan with a decode backlog (q_d* > 0): the separate-pricing LP. The general SLI-aware policy
(per-class buffers, a freed slot of pool k serves class i with probability proportional to
mu_k,i y_k,i*) against the plain SLI-aware policy and Prioritize-and-Route, at one n.

The runs go through :func:`fluidopt.harness.compare`, one comparison per part (its tables and
results store in ``<out>/fairness`` and ``<out>/backlog``). Outputs: markdown tables on stdout,
those tables, ``<fig-dir>/sli_routing.png``.

    python examples/sli_routing.py            # about 12 min on 2 cores
    python examples/sli_routing.py --quick
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
from fluidopt.fluid import DecodeFairness, solve_fluid
from fluidopt.harness import Comparison, compare
from fluidopt.harness.executor import add_executor_arguments, executor_from_args
from fluidopt.harness.plots import save_figure

ROOT = Path(__file__).resolve().parents[1]
HORIZON = {50: 6000.0, 200: 3000.0, 500: 2000.0, 2000: 1000.0}
WARMUP = 300.0
PATH_N = 2000
SLIS = (DecodeFairness(0.5),)
SLI_SPEC = "decode_fairness=0.5"  # the same SLI as a scenario declares it
LABEL = {"sli": "SLI-aware", "greedy": "greedy (plain G&R)", "weighted": "general SLI-aware",
         "sli-sep": "SLI-aware", "par": "Prioritize-and-Route"}


# label -> registered policy, and its options (part 2 runs the separate-pricing plan)
PART1 = {"sli": "sli-gate-and-route", "greedy": "gate-and-route"}
PART2 = {"weighted": "sli-weighted-gate-and-route", "sli-sep": "sli-gate-and-route", "par": "prioritize-and-route"}
PART2_OPTIONS = {"weighted": {"pricing": "separate"}, "sli-sep": {"pricing": "separate"}}


def fleet(n: int, slis: bool) -> fluidopt.Scenario:
    """The paper instance on n GPUs, with the decode-fairness SLI (part 1) or without (part 2)."""
    s = fluidopt.default_scenario().with_gpus(n)
    if slis:
        return dataclasses.replace(s, name=f"fair n={n}", meta={**s.meta, "slis": [SLI_SPEC]})
    return dataclasses.replace(s, name=f"n={n}")


def per_kind(c: Comparison, pricing: str) -> pd.DataFrame:
    """Means over seeds per (kind, n): the class-wise occupancies as ``col[k]`` and the ratio to R*."""
    cm = c.class_means()
    names = list(dict.fromkeys(cm["name"]))
    cm["k"] = cm["name"].map({nm: k for k, nm in enumerate(names)})
    wide = cm.pivot_table(index=["scenario", "policy"], columns="k", sort=False,
                          values=["y_mixed_mean", "y_solo_mean", "x_mean", "q_decode_mean"])
    wide.columns = [f"{q}[{k}]" for q, k in wide.columns]
    col = "revenue_per_gpu" if pricing == "bundled" else "revenue_per_gpu_separate"
    runs = c.runs.assign(ratio=c.runs[col] / c.bounds.set_index("scenario").loc[c.runs["scenario"], f"lp_{pricing}"].to_numpy())
    means = runs.groupby(["scenario", "policy"], sort=False).agg(n=("gpus", "first"), ratio=("ratio", "mean"),
                                                                 wall_seconds=("wall_seconds", "mean"))
    out = means.join(wide).reset_index().rename(columns={"policy": "kind"})
    return out.drop(columns="scenario").set_index(["kind", "n"]).sort_index()


def y_paths(c: Comparison, names) -> dict[str, pd.DataFrame]:
    """Seed 0's decode occupancies per GPU at n = PATH_N, {kind: frame}."""
    ts = c.timeseries
    if ts is None or ts.empty:
        return {}
    ts = ts[(ts["seed"] == 0) & (ts["scenario"] == f"fair n={PATH_N}")]
    return {kind: pd.DataFrame({"time": g["time"], **{f"{q}{k}": g[f"{q}[{nm}]"] / PATH_N for q in ("y_mixed", "y_solo")
                                                       for k, nm in enumerate(names)}})
            for kind, g in ts.groupby("policy")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ns", type=int, nargs="+", default=[50, 200, 500, 2000])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--backlog-n", type=int, default=500)
    add_executor_arguments(ap, workers=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--replot", action="store_true", help="tables and figure from the tables in <out>")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "examples" / "sli_routing")
    ap.add_argument("--fig-dir", type=Path, default=Path("fluidopt-examples"))
    a = ap.parse_args(argv)
    scale = 1.0
    if a.quick:
        a.ns, a.seeds, a.backlog_n, scale = [50, 200], 1, 200, 0.15
    w = WARMUP * min(1.0, 2 * scale)
    part1 = [fleet(n, slis=True) for n in a.ns]
    part2 = [fleet(a.backlog_n, slis=False)]
    if a.replot:
        c1, c2 = Comparison.load(a.out / "fairness"), Comparison.load(a.out / "backlog")
    else:
        with executor_from_args(a) as ex:
            common = dict(seeds=range(a.seeds), executor=ex, progress=True, warmup=w)
            c1 = compare(part1, list(PART1.items()), out=a.out / "fairness",
                         horizon={s.name: HORIZON.get(s.gpus, 2000.0) * scale for s in part1},
                         sample_interval={s.name: 2.0 if s.gpus == PATH_N else None for s in part1}, **common)
            c2 = compare(part2, list(PART2.items()), options=PART2_OPTIONS, out=a.out / "backlog", pricing="separate",
                         horizon=HORIZON.get(a.backlog_n, 2000.0) * scale, **common)
    base = fluidopt.default_scenario()
    names = base.class_names
    paths = y_paths(c1, names)
    summ = pd.concat([per_kind(c1, "bundled"), per_kind(c2, "separate")])
    summ.to_csv(a.out / "summary_by_kind.csv")
    sol_sli = solve_fluid(base, "bundled", SLIS)
    sol_sep = solve_fluid(base, "separate")
    cols = [f"{q}[{k}]" for q in ("y_mixed_mean", "y_solo_mean") for k in range(len(names))]

    def target(sol):
        return np.concatenate([sol.y_mixed, sol.y_solo])

    print(f"\nPart 1: decode fairness {SLIS[0]} (bundled). LP: y_m* = {np.round(sol_sli.y_mixed, 3).tolist()}, "
          f"y_s* = {np.round(sol_sli.y_solo, 3).tolist()}, x* = {np.round(sol_sli.x, 5).tolist()}, "
          f"R* = {sol_sli.objective_per_gpu:.2f}\n")
    print("| policy | n | " + " | ".join(f"y_m {nm}" for nm in names) + " | " + " | ".join(f"y_s {nm}" for nm in names)
          + f" | max abs error vs y* | y_s gap (SLI <= 0.5) | X/n class 1 (x* = {sol_sli.x[0]:.4f}) | revenue / R* |")
    print("|---" * (6 + 2 * len(names)) + "|")
    for kind in ("sli", "greedy"):
        for n, r in summ.loc[kind].iterrows():
            y = r[cols].to_numpy(dtype=float)
            err = np.abs(y - target(sol_sli)).max()
            gap = y[2] - y[3]
            print(f"| {LABEL[kind]} | {n} | " + " | ".join(f"{v:.3f}" for v in y) + f" | {err:.3f} | {gap:.3f} | "
                  f"{r['x_mean[0]']:.4f} | {r['ratio']:.4f} |")
    print(f"\nPart 2: separate-pricing LP with a decode backlog, n = {a.backlog_n}. LP: y_m* = "
          f"{np.round(sol_sep.y_mixed, 3).tolist()}, y_s* = {np.round(sol_sep.y_solo, 3).tolist()}, "
          f"q_d* = {np.round(sol_sep.q_decode, 3).tolist()}\n")
    print("| policy | " + " | ".join(f"y_m {nm}" for nm in names) + " | " + " | ".join(f"y_s {nm}" for nm in names)
          + " | max abs error vs y* | " + " | ".join(f"Q_d/n {nm}" for nm in names) + " | separate revenue / R* |")
    print("|---" * (3 + 3 * len(names)) + "|")
    for kind in ("weighted", "sli-sep", "par"):
        r = summ.loc[(kind, a.backlog_n)]
        y = r[cols].to_numpy(dtype=float)
        print(f"| {LABEL[kind]} | " + " | ".join(f"{v:.3f}" for v in y) + f" | {np.abs(y - target(sol_sep)).max():.3f} | "
              f"{r['q_decode_mean[0]']:.3f} | {r['q_decode_mean[1]']:.3f} | {r['ratio']:.4f} |")
    print(f"\n{len(c1.runs) + len(c2.runs)} runs in {c1.wall_seconds + c2.wall_seconds:.0f} s wall ({a.workers} workers)")

    # -- figure (like the paper's Fig. 6) --------------------------------------------------------
    a.fig_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.7))
    tgt = target(sol_sli)
    labels = [f"y_m {nm}" for nm in names] + [f"y_s {nm}" for nm in names]
    for j, kind in enumerate(("sli", "greedy")):
        s = summ.loc[kind]
        for c in range(len(cols)):
            ax[j].plot(s.index, s[cols[c]], marker="o", color=f"C{c}", label=labels[c])
            ax[j].axhline(tgt[c], color=f"C{c}", ls="--", lw=0.8)
        ax[j].set_xscale("log")
        ax[j].set_xlabel("GPUs n")
        ax[j].set_ylabel("decode slots per GPU")
        ax[j].set_title(f"{LABEL[kind]} (dashed: SLI LP y*)")
        ax[j].legend(fontsize=7)
    for kind, ls in (("sli", "-"), ("greedy", ":")):
        if kind in paths:
            p = paths[kind]
            for k in range(len(names)):
                ax[2].plot(p["time"], p[f"y_solo{k}"], lw=0.7, ls=ls, color=f"C{2 + k}",
                           label=f"y_s {names[k]}, {LABEL[kind]}")
    for k in range(len(names)):
        ax[2].axhline(sol_sli.y_solo[k], color=f"C{2 + k}", ls="--", lw=0.8)
    ax[2].set_xlabel("time (s)")
    ax[2].set_ylabel("solo decode slots per GPU")
    ax[2].set_title(f"Paths, n = {PATH_N}")
    if paths:
        ax[2].legend(fontsize=6)
    print(f"figure: {save_figure(fig, a.fig_dir / 'sli_routing.png', dpi=85)}")
    return 0


if __name__ == "__main__":
    from fluidopt.core.interrupt import script_main

    # Ctrl-C / SIGTERM: one line on what was kept, exit 130 / 143, no traceback
    raise SystemExit(script_main(main))
