"""Staffed Prioritize-and-Route against Prioritize-and-Route under separate pricing (docs/robust-control.md).

Two tables, every run through the harness (``fluidopt.harness.compare``, separate pricing, revenue over
the separate LP's R*; same seed, same arrivals for every variant):

1. the paper instance at n = 50 (3,000 s, warm-up 300 s) and n = 500 (600 s, warm-up 150 s), seeds
   0-4: Prioritize-and-Route, each mechanism alone, the default without one of them, and the default;
   mean ratio with the runs' batch-means 95% half-widths pooled (sqrt(sum h^2) / k), the long-prompt
   class's X/n, and the per-seed difference to Prioritize-and-Route;
2. beyond the paper instance: the 8 Dolly instances at n = 50 (600 s, warm-up 200 s) and the 12
   random instances of examples/baseline_grid.py at n = 100 (0.3x their windows), seed 0; the Azure
   conversation trace (../shared/data, skipped when absent) at 8, 32 and 200 GPUs sped up 1x, 4x, 25x,
   ``tokens`` service, seeds 0-1, revenue over R*(window) (the harness's ``ratio_realised``).

    python examples/separate_robust.py              # both tables (about 3 minutes of CPU)
    python examples/separate_robust.py --quick      # a smoke run
"""

from __future__ import annotations

from fluidopt.core.interrupt import script_guard

script_guard()  # Ctrl-C / SIGTERM from here on, the imports below included: one line, exit 130 / 143

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import fluidopt  # noqa: E402
from fluidopt.harness import compare  # noqa: E402

BASE, NEW = "prioritize-and-route", "staffed-prioritize-and-route"
VARIANTS = {  # label: options of staffed-prioritize-and-route (None: Prioritize-and-Route itself)
    "Prioritize-and-Route": None,
    "staffing": {"overflow": False, "resolve": False},
    "overflow": {"staffing": False, "resolve": False},
    "resolve": {"staffing": False, "overflow": False},
    "backpressure": {"staffing": False, "overflow": False, "resolve": False, "backpressure": True},
    "default - staffing": {"staffing": False},
    "default - overflow": {"overflow": False},
    "default + backpressure": {"backpressure": True},
    "default (staffing, overflow, resolve)": {},
}


def _run(scenario, label, seeds, horizon, warmup, workers, service="markov", workload=None) -> pd.DataFrame:
    opts = VARIANTS.get(label, {})
    pol = BASE if opts is None else NEW
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a trace ends before the horizon: expected
        c = compare(scenario, [pol], seeds=seeds, horizon=horizon, warmup=warmup, pricing="separate",
                    workers=workers, service=service, options={pol: opts} if opts else None,
                    workloads={scenario.name: workload} if workload is not None else None)
    runs = c.runs.assign(variant=label)
    x = c.classes.pivot_table(index="seed", columns="name", values="x_mean")
    return runs.merge(x.add_prefix("x:"), left_on="seed", right_index=True)


def _pooled(g: pd.DataFrame, bound_col: str = "lp_bound") -> tuple[float, float]:
    ratio = g["revenue"] / g[bound_col]
    return float(ratio.mean()), float(np.sqrt(np.sum((g["revenue_ci"] / g[bound_col]) ** 2)) / len(g))


def paper_table(cases, seeds, workers) -> pd.DataFrame:
    rows = []
    for n, horizon, warmup in cases:
        sc = fluidopt.default_scenario().with_gpus(n)
        runs = pd.concat([_run(sc, v, seeds, horizon, warmup, workers) for v in VARIANTS])
        ref = runs[runs["variant"] == "Prioritize-and-Route"].set_index("seed")["ratio"]
        for v, g in runs.groupby("variant", sort=False):
            m, hw = _pooled(g)
            d = g.set_index("seed")["ratio"] - ref
            rows.append({"n": n, "variant": v, "ratio": m, "ci": hw, "X/n long-prompt": g["x:long-prompt"].mean(),
                         "diff min": d.min(), "diff mean": d.mean(), "diff max": d.max()})
    return pd.DataFrame(rows)


def breadth_table(families, workers, quick: bool) -> pd.DataFrame:
    import policy_grid as pg

    cases = []  # (family, scenario, horizon, warmup, service, workload, seeds)
    if "dolly" in families:
        cases += [("dolly n=50", pg.dolly_scenario(j, 50), 600.0, 200.0, "markov", None, [0])
                  for j in range(2 if quick else 8)]
    if "grid" in families:
        cases += [("grid n=100", c["scenario"], c["horizon"], c["warmup"], "markov", None, [0])
                  for c in pg.grid_cases(100, 0.05 if quick else 0.3, which=[0, 1] if quick else None)]
    if "trace" in families and pg.TRACE.is_file():
        for n, speed in ((8, 1.0),) if quick else ((8, 1.0), (32, 4.0), (200, 25.0)):
            sc, wl = pg._trace_scenario(n, speed, 3000 if quick else None)
            cases.append((f"azure-conv {n} GPUs x{speed:g}", sc, wl.duration, 0.1 * wl.duration, "tokens", wl, [0, 1]))
    rows = []
    for fam, sc, horizon, warmup, service, wl, seeds in cases:
        col = "lp_bound" if wl is None else "lp_bound_realised"
        rec = {"family": fam, "case": sc.name}
        for label in ("Prioritize-and-Route", "default (staffing, overflow, resolve)"):
            g = _run(sc, label, seeds, horizon, warmup, workers, service, wl)
            key = "P&R" if label.startswith("Prio") else "staffed"
            rec[key], rec[f"{key} ci"] = _pooled(g, col)
            rec[f"{key} abandoned"] = g["abandoned_fraction"].mean()
        rec["diff"] = rec["staffed"] - rec["P&R"]
        rows.append(rec)
        print(f"  {fam:24s} {sc.name:16s} P&R {rec['P&R']:.4f}  staffed {rec['staffed']:.4f}", flush=True)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short runs, two seeds, a few cases (smoke test)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--tables", nargs="*", default=["paper", "breadth"], choices=["paper", "breadth"])
    ap.add_argument("--families", nargs="*", default=["dolly", "grid", "trace"], choices=["dolly", "grid", "trace"])
    ap.add_argument("--out", default=None, help="folder for paper.csv and breadth.csv")
    a = ap.parse_args(argv)
    pd.set_option("display.width", 200)
    out = Path(a.out) if a.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    if "paper" in a.tables:
        cases = ((20, 150.0, 50.0),) if a.quick else ((50, 3000.0, 300.0), (500, 600.0, 150.0))
        t = paper_table(cases, [0, 1] if a.quick else [0, 1, 2, 3, 4], a.workers)
        print(t.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        if out is not None:
            t.to_csv(out / "paper.csv", index=False)
    if "breadth" in a.tables:
        t = breadth_table(a.families, a.workers, a.quick)
        print(t.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        if not t.empty:
            for fam, g in t.groupby("family", sort=False):
                print(f"{fam}: P&R {g['P&R'].mean():.4f}, staffed {g['staffed'].mean():.4f}, "
                      f"better on {(g['diff'] > 0).sum()}/{len(g)}")
        if out is not None:
            t.to_csv(out / "breadth.csv", index=False)
    return 0


if __name__ == "__main__":
    from fluidopt.core.interrupt import script_main

    # Ctrl-C / SIGTERM: one line on what was kept, exit 130 / 143, no traceback
    raise SystemExit(script_main(main))
