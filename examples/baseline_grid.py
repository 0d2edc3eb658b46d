"""Gate-and-Route (GG-SP) against the paper's baselines on random instances (paper Fig. 7; docs/results.md).

Instances are drawn (seeded) from the paper's ranges: alpha ~ U(0.015, 0.02) s, beta log-uniform in
[1e-5, 1e-3] s/token, gamma ~ U(10, 50) tokens/s, P_i and D_i ~ U(200, 3000) tokens,
lambda_i ~ U(0.25, 0.5) per GPU, two classes; fixed as in the paper's instance: B = 16, C = 256,
theta_i = 0.1 /s, c_p = 0.1, c_d = 0.2 per token. Each instance runs at n = 500 under the five
policies (same seed, hence the same arrivals, for all), ``markov`` service; revenue per GPU is
normalised by the bundled LP optimum R* of the instance.

The runs go through :func:`fluidopt.harness.compare` (its tables and results store in ``--out``).
Outputs: a markdown table on stdout (per instance and summary), ``<out>/runs.csv`` (the harness's
tables) and ``<fig-dir>/baseline_grid.png``.

    python examples/baseline_grid.py                 # 16 instances x 5 policies (about 20 min on 2 cores)
    python examples/baseline_grid.py --quick         # 3 instances at n = 50
"""

from __future__ import annotations

from fluidopt.core.interrupt import script_guard

script_guard()  # Ctrl-C / SIGTERM from here on, the imports below included: one line, exit 130 / 143

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from fluidopt import GPUProfile, RequestClass, Scenario
from fluidopt.fluid import solve_fluid
from fluidopt.harness import compare
from fluidopt.harness.executor import add_executor_arguments, executor_from_args
from fluidopt.harness.plots import save_figure

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("gate-and-route", "fi-wsp", "gi-wsp", "gf-wsp", "fg-sp")
# Not one of the paper's five: the general SLI-aware policy (paper EC 13), Gate-and-Route's variant for
# plans with a decode buffer (q_d* > 0, which the bundled LP has when gamma * tau < (B-1)/B).
EXTRA = ("sli-weighted-gate-and-route",)
LABEL = {"gate-and-route": "GG-SP", "fi-wsp": "FI-WSP", "gi-wsp": "GI-WSP", "gf-wsp": "GF-WSP", "fg-sp": "FG-SP",
         "sli-weighted-gate-and-route": "GG-SP-W"}


def draw_instances(k: int, seed: int, n: int) -> list[Scenario]:
    """k two-class instances from the paper's parameter ranges, seeded."""
    rng = np.random.default_rng(seed)
    out = []
    for j in range(k):
        gpu = GPUProfile.from_gamma(alpha=float(rng.uniform(0.015, 0.02)),
                                    beta=float(10 ** rng.uniform(-5, -3)),
                                    gamma=float(rng.uniform(10, 50)), chunk=256, batch=16, name=f"draw{j}")
        classes = tuple(
            RequestClass(f"class{i + 1}", prompt=float(rng.uniform(200, 3000)), decode=float(rng.uniform(200, 3000)),
                         rate=float(rng.uniform(0.25, 0.5)) * n, patience=0.1)
            for i in range(2)
        )
        out.append(Scenario(gpu=gpu, gpus=n, classes=classes, prefill_price=0.1, decode_price=0.2, name=f"inst{j:02d}"))
    return out


def slowest_decode(s: Scenario) -> float:
    """Mean duration (s) of the slowest decode: the largest D_i at the slower of the two GPU modes."""
    g = s.gpu
    return max(c.decode for c in s.classes) * max(g.tau_mix, 1.0 / g.gamma)


def window(s: Scenario, scale: float) -> tuple[float, float]:
    """(horizon, warm-up) in seconds: warm-up 3 T, measured window 10 T (at least 900 s), T the slowest decode.

    The drawn instances decode for 1-10 minutes per request (D up to 3,000 tokens at 10-50 tokens/s, or
    at tau_mix up to 0.27 s per iteration), so a fixed horizon would measure some of them mid-transient.
    """
    T = slowest_decode(s)
    warm = 3.0 * T * scale
    return warm + max(900.0, 10.0 * T) * scale, warm


def describe(s: Scenario) -> dict:
    sol = solve_fluid(s)
    g = s.gpu
    d = {"instance": int(s.name[4:]), "alpha": g.alpha, "beta": g.beta, "gamma": g.gamma, "tau": g.tau_mix,
         "gamma_tau": g.gamma * g.tau_mix, "P1": s.classes[0].prompt, "D1": s.classes[0].decode,
         "P2": s.classes[1].prompt, "D2": s.classes[1].decode, "lam1": s.classes[0].rate / s.gpus,
         "lam2": s.classes[1].rate / s.gpus, "R_star": sol.objective_per_gpu, "X_star": sol.prefill_occupancy,
         "q_d_star": float(sol.q_decode.sum()), "served1": float(sol.served_fraction[0]),
         "served2": float(sol.served_fraction[1])}
    return d


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances", type=int, default=12)
    ap.add_argument("--gpus", type=int, default=500)
    ap.add_argument("--horizon-scale", type=float, default=1.0, help="multiply each instance's window")
    ap.add_argument("--draw-seed", type=int, default=2026)
    ap.add_argument("--seed", type=int, default=1, help="simulation seed (the same for every policy)")
    add_executor_arguments(ap, workers=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--replot", action="store_true", help="redraw from <out>/runs.csv without simulating")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "examples" / "baseline_grid")
    ap.add_argument("--fig-dir", type=Path, default=Path("fluidopt-examples"))
    a = ap.parse_args(argv)
    if a.quick:
        a.instances, a.gpus, a.horizon_scale = 3, 50, 0.2
    insts = draw_instances(a.instances, a.draw_seed, a.gpus)
    windows = {s.name: window(s, a.horizon_scale) for s in insts}
    if a.replot:  # tables and figure from a previous run's tables (same --instances/--draw-seed/--gpus)
        runs, total = pd.read_csv(a.out / "runs.csv"), float("nan")
    else:
        # Same seed for every policy: the same arrivals. The harness solves each instance's LP once.
        with executor_from_args(a) as ex:
            c = compare(insts, POLICIES + EXTRA, seeds=[a.seed], executor=ex, out=a.out, progress=True,
                        horizon={k: h for k, (h, _) in windows.items()}, warmup={k: w for k, (_, w) in windows.items()})
        runs, total = c.runs, c.wall_seconds
    df = runs.assign(instance=runs["scenario"].str[4:].astype(int), R_star=runs["lp_bound"])
    inst = pd.DataFrame([describe(s) for s in insts]).set_index("instance")
    a.out.mkdir(parents=True, exist_ok=True)
    inst.to_csv(a.out / "instances.csv")
    wide_all = df.pivot(index="instance", columns="policy", values="ratio")[list(POLICIES + EXTRA)]
    wide_all.columns = [LABEL[p] for p in POLICIES + EXTRA]
    wide = wide_all[[LABEL[p] for p in POLICIES]]
    best = wide.idxmax(axis=1)  # among the paper's five

    # -- tables -----------------------------------------------------------------------------------
    print("\nInstances (LP per GPU; gamma*tau >= 15/16 means the bundled LP needs no decode buffer):\n")
    print("| # | alpha | beta | gamma | gamma*tau | (P1, D1) | (P2, D2) | (lam1, lam2) | R* | sum x* | served* |")
    print("|---" * 11 + "|")
    for j, r in inst.iterrows():
        print(f"| {j} | {r.alpha:.4f} | {r.beta:.2e} | {r.gamma:.1f} | {r.gamma_tau:.2f} | ({r.P1:.0f}, {r.D1:.0f}) | "
              f"({r.P2:.0f}, {r.D2:.0f}) | ({r.lam1:.3f}, {r.lam2:.3f}) | {r.R_star:.1f} | {r.X_star:.3f} | "
              f"({r.served1:.2f}, {r.served2:.2f}) |")
    print(f"\nRevenue / R* at n = {a.gpus} (seed {a.seed}; window per instance: warm-up 3T, then 10T, T = "
          "slowest mean decode):\n")
    hz = df.groupby("instance")[["horizon", "warmup"]].first()
    print("| # | horizon (s) | " + " | ".join(wide.columns) + " | best of five | "
          + " | ".join(f"{c} (extra)" for c in wide_all.columns[len(POLICIES):]) + " |")
    print("|---" * (len(wide_all.columns) + 3) + "|")
    for j, r in wide_all.iterrows():
        v = r.to_numpy()
        print(f"| {j} | {hz.loc[j, 'horizon']:.0f} | " + " | ".join(f"{x:.4f}" for x in v[:len(POLICIES)])
              + f" | {best[j]} | " + " | ".join(f"{x:.4f}" for x in v[len(POLICIES):]) + " |")
    for lab, fn in (("mean", lambda d: d.mean()), ("std", lambda d: d.std(ddof=1))):
        v = fn(wide_all).to_numpy()
        print(f"| {lab} | | " + " | ".join(f"{x:.4f}" for x in v[:len(POLICIES)]) + " | | "
              + " | ".join(f"{x:.4f}" for x in v[len(POLICIES):]) + " |")
    print("| times best | | " + " | ".join(str(int((best == c).sum())) for c in wide.columns) + " | | |")
    nobuf = inst.index[inst["q_d_star"] <= 1e-9]
    print(f"\nInstances whose bundled LP has no decode buffer (q_d* = 0; Thm 4.1's setting): {list(nobuf)}")
    print("| subset | " + " | ".join(wide_all.columns) + " |")
    print("|---" * (len(wide_all.columns) + 1) + "|")
    for lab, idx in (("q_d* = 0", nobuf), ("q_d* > 0", inst.index.difference(nobuf))):
        if len(idx):
            print(f"| {lab} ({len(idx)}) mean | " + " | ".join(f"{x:.4f}" for x in wide_all.loc[idx].mean()) + " |")
    ci = df.groupby("policy")["revenue_ci"].median() / df.groupby("policy")["R_star"].median()
    print(f"\nmedian batch-means 95% half-width of a ratio: {ci.median():.4f}")
    print(f"{len(df)} runs in {total:.0f} s wall ({a.workers} workers); mean {df['wall_seconds'].mean():.0f} s/run")

    # -- figure -----------------------------------------------------------------------------------
    a.fig_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [1, 1.6]})
    m, sd = wide.mean(), wide.std(ddof=1)
    ax[0].bar(range(len(m)), m, yerr=sd, capsize=4, color=[f"C{i}" for i in range(len(m))])
    ax[0].set_xticks(range(len(m)), m.index, fontsize=8)
    ax[0].set_ylim(max(0.0, float((m - sd).min()) - 0.05), 1.02)
    ax[0].set_ylabel("revenue / R* (mean +/- sd over instances)")
    ax[0].set_title(f"{len(wide)} random instances, n = {a.gpus}")
    for i, c in enumerate(wide.columns):
        ax[1].plot(wide.index, wide[c], marker="o", ms=4, lw=0.8, label=c, color=f"C{i}")
    for c in wide_all.columns[len(POLICIES):]:
        ax[1].plot(wide_all.index, wide_all[c], marker="x", ms=5, lw=0.8, ls="--", color="k",
                   label=f"{c} (EC 13, not in the paper's Fig. 7)")
    ax[1].set_xlabel("instance")
    ax[1].set_ylabel("revenue / R*")
    ax[1].set_title("per instance")
    ax[1].legend(fontsize=7, ncol=3, loc="lower center")
    print(f"figure: {save_figure(fig, a.fig_dir / 'baseline_grid.png', dpi=90)}")
    return 0


if __name__ == "__main__":
    from fluidopt.core.interrupt import script_main

    # Ctrl-C / SIGTERM: one line on what was kept, exit 130 / 143, no traceback
    raise SystemExit(script_main(main))
