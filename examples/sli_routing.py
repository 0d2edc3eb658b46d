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

Outputs: markdown tables on stdout, ``<out>/runs.csv``, ``docs/figures/sli_routing.png``.

    python examples/sli_routing.py            # about 12 min on 2 cores
    python examples/sli_routing.py --quick
"""

from __future__ import annotations

import argparse
import time
from multiprocessing import Pool
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

import fluidopt
from fluidopt.control.gate_and_route import (
    GateAndRoute,
    PrioritizeAndRoute,
    SLIGateAndRoute,
    WeightedSLIGateAndRoute,
)
from fluidopt.fluid import DecodeFairness, solve_fluid
from fluidopt.sim.api import simulate

ROOT = Path(__file__).resolve().parents[1]
HORIZON = {50: 6000.0, 200: 3000.0, 500: 2000.0, 2000: 1000.0}
WARMUP = 300.0
PATH_N = 2000
SLIS = (DecodeFairness(0.5),)
LABEL = {"sli": "SLI-aware", "greedy": "greedy (plain G&R)", "weighted": "general SLI-aware",
         "sli-sep": "SLI-aware", "par": "Prioritize-and-Route"}


def build(kind: str, base):
    if kind in ("sli", "greedy"):
        sol = solve_fluid(base, "bundled", SLIS)
        return sol, (SLIGateAndRoute.from_solution(sol, base) if kind == "sli" else GateAndRoute.from_solution(sol))
    sol = solve_fluid(base, "separate")
    if kind == "weighted":
        return sol, WeightedSLIGateAndRoute.from_solution(sol, base)
    if kind == "sli-sep":
        return sol, SLIGateAndRoute.from_solution(sol, base)
    return sol, PrioritizeAndRoute.from_solution(sol, base)


def run_one(task) -> dict:
    kind, n, seed, horizon, warmup, path = task
    base = fluidopt.default_scenario()
    sol, ctrl = build(kind, base)
    t0 = time.perf_counter()
    res = simulate(base.with_gpus(n), ctrl, horizon=horizon, warmup=warmup, seed=seed,
                   sample_interval=2.0 if path else None)
    pricing_rev = res.cluster["revenue_per_gpu"] if kind in ("sli", "greedy") else res.cluster["revenue_per_gpu_separate"]
    rec = {"kind": kind, "n": n, "seed": seed, "horizon": horizon, "R_star": sol.objective_per_gpu,
           "ratio": pricing_rev / sol.objective_per_gpu, "wall_seconds": time.perf_counter() - t0}
    pc = res.per_class
    for k in range(len(base.classes)):
        for col in ("x_mean", "y_mixed_mean", "y_solo_mean", "q_prefill_mean", "q_decode_mean"):
            rec[f"{col}[{k}]"] = float(pc[col].iloc[k])
    if path and res.timeseries is not None:
        ts = res.timeseries
        rec["_path"] = pd.DataFrame({"time": ts["time"], **{f"{q}{k}": ts[f"{q}[{nm}]"] / n
                                                              for q in ("y_mixed", "y_solo")
                                                              for k, nm in enumerate(base.class_names)}})
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ns", type=int, nargs="+", default=[50, 200, 500, 2000])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--backlog-n", type=int, default=500)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "examples" / "sli_routing")
    ap.add_argument("--fig-dir", type=Path, default=Path("fluidopt-examples"))
    a = ap.parse_args(argv)
    scale = 1.0
    if a.quick:
        a.ns, a.seeds, a.backlog_n, scale = [50, 200], 1, 200, 0.15
    w = WARMUP * min(1.0, 2 * scale)
    tasks = [(k, n, s, HORIZON.get(n, 2000.0) * scale, w, n == PATH_N and s == 0)
             for k in ("sli", "greedy") for n in a.ns for s in range(a.seeds)]
    tasks += [(k, a.backlog_n, s, HORIZON.get(a.backlog_n, 2000.0) * scale, w, False)
              for k in ("weighted", "sli-sep", "par") for s in range(a.seeds)]
    tasks.sort(key=lambda t: -t[1] * t[3])
    t0 = time.perf_counter()
    recs = []
    with Pool(a.workers) as pool:
        for rec in pool.imap_unordered(run_one, tasks):
            recs.append(rec)
            print(f"  {rec['kind']:8s} n={rec['n']:5d} seed={rec['seed']} wall={rec['wall_seconds']:.0f}s", flush=True)
    total = time.perf_counter() - t0
    paths = {r["kind"]: r.pop("_path") for r in recs if "_path" in r}
    df = pd.DataFrame(recs).sort_values(["kind", "n", "seed"])
    a.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(a.out / "runs.csv", index=False)
    base = fluidopt.default_scenario()
    names = base.class_names
    sol_sli = solve_fluid(base, "bundled", SLIS)
    sol_sep = solve_fluid(base, "separate")
    cols = [f"{q}[{k}]" for q in ("y_mixed_mean", "y_solo_mean") for k in range(len(names))]
    summ = df.groupby(["kind", "n"])[cols + ["ratio", "x_mean[0]", "x_mean[1]", "q_decode_mean[0]",
                                              "q_decode_mean[1]", "wall_seconds"]].mean()
    summ.to_csv(a.out / "summary.csv")

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
    print(f"\n{len(tasks)} runs in {total:.0f} s wall ({a.workers} workers)")

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
    ax[2].legend(fontsize=6)
    fig.tight_layout()
    p = a.fig_dir / "sli_routing.png"
    fig.savefig(p, dpi=85)
    plt.close(fig)
    print(f"figure: {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
