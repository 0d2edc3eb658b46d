"""The policy grid: Backpressure Gate-and-Route against the paper's five policies and round robin
(docs/robust-control.md, docs/results.md section 5).

Cases (families):

* ``paper``: the paper instance at n = 20, 50, 100, 200, 500, 2,000 (``markov`` service);
* ``grid``: the 12 random two-class instances of examples/baseline_grid.py (same draw, seed 2026);
* ``dolly``: 8 instances with the 8 Dolly-15k task classes (mean prompt / output tokens from the
  paper's statistics), the paper GPU, per-GPU arrival rates split in proportion to the samples of
  each task and scaled so the total load is drawn from U(1.5, 3.5) requests per GPU per second
  (seeded), patience 0.1 /s;
* ``trace``: the Azure LLM conversation trace (../shared/data; skipped when absent) on the paper GPU
  at 8, 32 and 200 GPUs, sped up 1x, 4x and 25x (the same load per GPU), ``tokens`` service,
  classes from ``classes_from_trace`` (patience 0.05), prices 0.1 / 0.2. The trace's score is the
  **arrival-cohort revenue** (the requests that arrived in the measured window, credited when they
  complete, the run draining past the window's end: ``simulate(..., drain=...)``,
  ``fluidopt.sim.cohort``) over R*(window), the LP optimum at those same arrivals
  (``fluidopt.fluid.realised``): a benchmark, not a bound (see docs/robust-control.md).
  ``--trace-measure window`` scores the completions inside the window instead (the measure before
  the cohort one; both are in runs.csv as ``ratio_cohort`` and ``ratio_window``).

Policies: the paper's five (gate-and-route = GG-SP, fi-wsp = FCFS/FIFO, gi-wsp, gf-wsp, fg-sp), round
robin (vLLM-style instances) and backpressure-gate-and-route (BP-GR). Same seed, same arrivals for
every policy. Ratios: revenue / R*, mean and 95% t-interval over seeds (one seed: the run's
batch-means interval).

    python examples/policy_grid.py                        # the documented reduced grid (see docs)
    python examples/policy_grid.py --full                 # 5 seeds, n up to 2,000, grid at n = 500
    python examples/policy_grid.py --quick                # a smoke run (tests use it)
    python examples/policy_grid.py --replot               # tables and figure from <out>/runs.csv
    python examples/policy_grid.py --ablation             # the mechanism ablation of docs/robust-control.md
    python examples/policy_grid.py --summary-from-table T.md   # family summary of a printed case table
"""

from __future__ import annotations

from fluidopt.core.interrupt import script_guard

script_guard()  # Ctrl-C / SIGTERM from here on, the imports below included: one line, exit 130 / 143

import argparse
import dataclasses
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from fluidopt import RequestClass, Scenario, default_scenario  # noqa: E402
from fluidopt.core.model import paper_gpu  # noqa: E402
from fluidopt.harness.executor import add_executor_arguments, executor_from_args  # noqa: E402
from fluidopt.harness.plots import save_figure  # noqa: E402

TRACE = ROOT.parent / "shared" / "data" / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_conv.csv"
NEW = "backpressure-gate-and-route"
PAPER5 = ("gate-and-route", "fi-wsp", "gi-wsp", "gf-wsp", "fg-sp")
BASELINES = PAPER5 + ("round-robin",)
POLICIES = BASELINES + (NEW,)
LABEL = {"gate-and-route": "GG-SP", "fi-wsp": "FI-WSP (FCFS)", "gi-wsp": "GI-WSP", "gf-wsp": "GF-WSP",
         "fg-sp": "FG-SP", "round-robin": "round robin", NEW: "BP-GR"}
# (task, mean prompt tokens, mean output tokens, samples): the paper's Dolly-15k statistics
DOLLY = (("brainstorming", 61, 331, 1764), ("classification", 123, 142, 2136), ("closed-qa", 992, 182, 1738),
         ("creative-writing", 89, 915, 699), ("general-qa", 69, 572, 2187), ("info-extraction", 1139, 273, 1462),
         ("open-qa", 45, 293, 3739), ("summarization", 1177, 436, 1150))
_ALL = dict(backpressure=True, caps=False, staffing=True, decode_order="value", overflow=True, resolve=True,
            elastic=True, elastic_slots=True, coupled=True)
_NONE = dict(backpressure=False, caps=False, staffing=False, decode_order="fcfs", overflow=False, resolve=False,
             elastic=False, elastic_slots=False, coupled=False)
ABLATION = {  # name -> options of backpressure-gate-and-route (explicit, independent of the defaults)
    "none (= GG-SP)": _NONE,
    "backpressure": {**_NONE, "backpressure": True},
    "caps": {**_NONE, "caps": True},
    "staffing": {**_NONE, "staffing": True},
    "value order": {**_NONE, "decode_order": "value"},
    "overflow": {**_NONE, "overflow": True},
    "overflow + elastic": {**_NONE, "overflow": True, "elastic": True},
    "overflow + elastic + slots": {**_NONE, "overflow": True, "elastic": True, "elastic_slots": True},
    "overflow + elastic + coupled": {**_NONE, "overflow": True, "elastic": True, "coupled": True},
    "resolve": {**_NONE, "resolve": True},
    "all six": _ALL,
    "all six - backpressure": {**_ALL, "backpressure": False},
    "all six - staffing (= default)": {**_ALL, "staffing": False},
    "all six - value order": {**_ALL, "decode_order": "fcfs"},
    "all six - overflow": {**_ALL, "overflow": False},
    "all six - elastic": {**_ALL, "elastic": False},
    "all six - coupled (floating slots)": {**_ALL, "coupled": False},
    "all six - coupled - elastic slots (one floating GPU)": {**_ALL, "coupled": False, "elastic_slots": False},
    "all six - staffing - elastic": {**_ALL, "staffing": False, "elastic": False},
    "all six - resolve": {**_ALL, "resolve": False},
    "all six + caps": {**_ALL, "caps": True},
}


# -- cases ----------------------------------------------------------------------------------------
def paper_cases(ns, horizons, warmup=300.0):
    return [{"family": "paper", "case": f"paper n={n}", "scenario": default_scenario().with_gpus(n),
             "horizon": h, "warmup": min(warmup, h / 3), "service": "markov"} for n, h in zip(ns, horizons)]


def grid_cases(n, scale, which=None):
    from baseline_grid import draw_instances, window

    out = []
    for j, s in enumerate(draw_instances(12, 2026, n)):
        if which is not None and j not in which:
            continue
        h, w = window(s, scale)
        out.append({"family": "grid", "case": f"grid {j:02d} n={n}", "scenario": s, "horizon": h, "warmup": w,
                    "service": "markov"})
    return out


def dolly_scenario(j: int, n: int) -> Scenario:
    rng = np.random.default_rng(1000 + j)
    load = float(rng.uniform(1.5, 3.5))  # requests per GPU per second, all tasks
    share = np.array([d[3] for d in DOLLY], float)
    share = share * rng.uniform(0.5, 1.5, len(DOLLY))  # a different task mix per instance
    share /= share.sum()
    classes = tuple(RequestClass(name, prompt=float(p), decode=float(d), rate=float(load * f * n), patience=0.1)
                    for (name, p, d, _), f in zip(DOLLY, share))
    return Scenario(gpu=paper_gpu(), gpus=n, classes=classes, prefill_price=0.1, decode_price=0.2,
                    name=f"dolly{j}")


def dolly_cases(n, horizon, k=8, warmup=300.0):
    return [{"family": "dolly", "case": f"dolly {j} n={n}", "scenario": dolly_scenario(j, n), "horizon": horizon,
             "warmup": min(warmup, horizon / 3), "service": "markov"} for j in range(k)]


def trace_cases(sizes=((8, 1.0), (32, 4.0), (200, 25.0)), max_requests=None):
    if not TRACE.is_file():
        print(f"trace not found at {TRACE}: trace cases skipped", file=sys.stderr)
        return []
    out = []
    for n, speed in sizes:
        out.append({"family": "trace", "case": f"azure-conv {n} GPUs x{speed:g}", "trace": (n, speed, max_requests),
                    "service": "tokens"})
    return out


def _trace_scenario(n, speed, max_requests):
    from fluidopt.workloads.traces import classes_from_trace, load_azure_trace

    w = load_azure_trace(TRACE, speedup=speed, max_requests=max_requests)
    sc = Scenario(gpu=paper_gpu(), gpus=n, classes=tuple(classes_from_trace(w, patience=0.05)),
                  prefill_price=0.1, decode_price=0.2, name=f"azure-conv-{n}")
    return sc, w


# -- the runs: one harness comparison per family ------------------------------------------------------
def case_scenario(case: dict) -> tuple[Scenario, object, float, float]:
    """(scenario named for the case, replay workload or None, horizon, warm-up) of one case."""
    if "trace" in case:
        sc, workload = _trace_scenario(*case["trace"])
        horizon = workload.duration
        return dataclasses.replace(sc, name=case["case"]), workload, horizon, 0.1 * horizon
    return dataclasses.replace(case["scenario"], name=case["case"]), None, case["horizon"], case["warmup"]


TRACE_DRAIN = 600.0  # seconds a trace run may go on past its window for the arrival cohort to resolve


def run_family(cases: list[dict], policies: list, options: dict, seeds: list[int], executor, out: Path,
               trace_measure: str = "cohort") -> pd.DataFrame:
    """Every policy on every case of one family through :func:`fluidopt.harness.compare`; one row per run.

    Trace cases drain (``compare(..., drain=TRACE_DRAIN)``) and their ``ratio`` is the arrival-cohort
    revenue / R*(window) (``trace_measure="cohort"``) or the window's completions / R*(window)
    (``"window"``); both are kept, as ``ratio_cohort`` and ``ratio_window``."""
    from fluidopt.harness import compare
    from fluidopt.workloads import TraceWarning

    built = {c["case"]: (c, *case_scenario(c)) for c in cases}
    scenarios = [sc for _, sc, _, _, _ in built.values()]
    workloads = {k: wl for k, (_, _, wl, _, _) in built.items() if wl is not None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        c = compare(scenarios, policies, options=options, seeds=seeds, executor=executor, out=out, progress=True,
                    horizon={k: h for k, (_, _, _, h, _) in built.items()},
                    warmup={k: w for k, (_, _, _, _, w) in built.items()},
                    service={k: case["service"] for k, (case, *_) in built.items()}, workloads=workloads,
                    drain={k: (TRACE_DRAIN if wl is not None else None) for k, (_, _, wl, _, _) in built.items()})
    x = c.classes.pivot_table(index=["scenario", "policy", "seed"], columns="name", values="x_mean", sort=False)
    registered = dict(p if isinstance(p, tuple) else (p, p) for p in policies)
    rows = []
    for r in c.runs.itertuples(index=False):
        case, sc, wl, _, _ = built[r.scenario]
        plan = c.plans[r.scenario]["bundled"]
        # On a trace the plan's R* is solved at the whole trace's mean rates while revenue is measured
        # over a window whose realised arrivals differ: divide by the harness's R*(window) instead,
        # and count the same arrivals on top (the arrival cohort, credited whenever it completes).
        bound = r.lp_bound_realised if wl is not None else r.lp_bound
        xs = x.loc[(r.scenario, r.policy, r.seed), list(sc.class_names)].to_numpy(dtype=float)
        label = r.policy
        if wl is not None and trace_measure == "cohort":
            rev, rev_ci, blabel = r.cohort_revenue_per_gpu, r.cohort_revenue_per_gpu_ci, "cohort revenue / R*(window)"
        else:
            rev, rev_ci = r.revenue_per_gpu, r.revenue_per_gpu_ci
            blabel = "window revenue / R*(window)" if wl is not None else "revenue / R*"
        cohort = {k: getattr(r, k, math.nan) for k in ("cohort_revenue_per_gpu", "cohort_arrived", "cohort_completed",
                                                        "cohort_abandoned", "cohort_dropped", "cohort_unresolved",
                                                        "drain_seconds", "cohort_drained")}
        rows.append({"family": case["family"], "case": r.scenario, "policy": registered[label],
                     "variant": label if label != registered[label] else "",
                     "seed": r.seed, "gpus": r.gpus, "horizon": r.horizon, "warmup": r.warmup,
                     "R_star_plan": r.lp_bound, "bound": bound, "bound_label": blabel,
                     "revenue_per_gpu": rev, "revenue_ci": rev_ci,
                     "ratio": rev / bound, "ratio_ci": rev_ci / bound,
                     "ratio_window": r.revenue_per_gpu / bound, "ratio_window_ci": r.revenue_per_gpu_ci / bound,
                     "ratio_cohort": cohort["cohort_revenue_per_gpu"] / bound if wl is not None else math.nan,
                     "ratio_cohort_ci": getattr(r, "cohort_revenue_per_gpu_ci", math.nan) / bound if wl is not None
                     else math.nan,
                     **cohort,
                     "abandoned_fraction": r.abandoned_fraction, "requests": r.requests, "wall_seconds": r.wall_seconds,
                     "mixed_gpus": plan.mixed_gpus, "x_over_n": ";".join(f"{v:.5f}" for v in xs),
                     "x_star": ";".join(f"{v:.5f}" for v in plan.x),
                     "x_err": float(np.max(np.abs(xs - np.asarray(plan.x)))) if wl is None else math.nan})
    return pd.DataFrame(rows)


def rescore(df: pd.DataFrame, trace_measure: str) -> pd.DataFrame:
    """The trace rows of a runs.csv scored by ``trace_measure`` ("cohort" or "window"), where it has both."""
    col = f"ratio_{trace_measure}"
    if col not in df.columns:
        return df
    df = df.copy()
    m = (df["family"] == "trace") & df[col].notna()
    df.loc[m, "ratio"] = df.loc[m, col]
    df.loc[m, "ratio_ci"] = df.loc[m, f"{col}_ci"]
    df.loc[m, "bound_label"] = f"{trace_measure} revenue / R*(window)"
    return df


# -- summary ----------------------------------------------------------------------------------------
def case_order(case: str) -> tuple:
    """Families in the order paper, grid, dolly, trace; numbers ascending within each."""
    fam = case.split()[0]
    rank = {"paper": 0, "grid": 1, "dolly": 2, "azure-conv": 3}.get(fam, 4)
    num = [float(t.split("=")[-1]) for t in case.replace("x", " ").split() if t.split("=")[-1].replace(".", "").isdigit()]
    return (rank, *num)


def summarise(df: pd.DataFrame) -> pd.DataFrame:
    """Per case and policy: mean ratio and a 95% half-width: the t-interval over seeds with 5 or more
    seeds; with fewer, the runs' own batch-means half-widths combined (sqrt(sum h_i^2) / k), since a
    t-interval on 2 seeds (t = 12.7) says little."""
    from scipy import stats

    rows = []
    df = df.assign(_order=df["case"].map(case_order))
    for (fam, case, pol), g in df.sort_values(["_order", "seed"]).groupby(["family", "case", "policy"], sort=False):
        k = len(g)
        # (rounded to 1e-12: policies that serve every request of a trace score 1 to the last bit but for
        # float noise in the sums, and should tie, not rank, in the tables)
        m = round(float(g["ratio"].mean()), 12)
        if k >= 5:
            hw = float(stats.t.ppf(0.975, k - 1) * g["ratio"].std(ddof=1) / math.sqrt(k))
        else:
            hw = float(np.sqrt(np.sum(np.square(g["ratio_ci"].to_numpy()))) / k)
        rows.append({"family": fam, "case": case, "policy": pol, "seeds": k, "ratio": m, "half_width": hw,
                     "x_err": float(g["x_err"].mean()), "abandoned": float(g["abandoned_fraction"].mean()),
                     "wall": float(g["wall_seconds"].mean())})
    return pd.DataFrame(rows)


def verdict(summ: pd.DataFrame) -> pd.DataFrame:
    """Per case: the new policy against the best baseline (paper's five and round robin)."""
    out = []
    for (fam, case), g in summ.groupby(["family", "case"], sort=False):
        g = g.set_index("policy")
        if NEW not in g.index:
            continue
        base = g.loc[[p for p in BASELINES if p in g.index]]
        if base.empty:  # BP-GR rows alone (e.g. before --merge): nothing to compare with
            continue
        best = base["ratio"].idxmax()
        new = g.loc[NEW]
        out.append({"family": fam, "case": case, "new": new["ratio"], "new_hw": new["half_width"],
                    "best": LABEL[best], "best_ratio": base.loc[best, "ratio"], "best_hw": base.loc[best, "half_width"],
                    # (rounded: policies that serve every request tie to the last bit but for float noise)
                    "margin": round(new["ratio"] - base.loc[best, "ratio"], 12),
                    "ok": round(new["ratio"] - base.loc[best, "ratio"], 12)
                    >= -max(new["half_width"], base.loc[best, "half_width"])})
    return pd.DataFrame(out)


def print_verdict(v: pd.DataFrame) -> None:
    """The per-family summary table of :func:`verdict`'s rows (and the "all" row over every case)."""
    print("| family | cases | BP-GR mean | best-baseline mean | mean margin | min margin (case) | cases within one half-width or better |")
    print("|---|---|---|---|---|---|---|")
    for fam, g in list(v.groupby("family", sort=False)) + [("all", v)]:
        worst = g.loc[g["margin"].idxmin()]
        print(f"| {fam} | {len(g)} | {g['new'].mean():.4f} | {g['best_ratio'].mean():.4f} | "
              f"{g['margin'].mean():+.4f} | {worst['margin']:+.4f} ({worst['case']}) | {int(g['ok'].sum())}/{len(g)} |")


def summary_from_table(text: str) -> pd.DataFrame:
    """:func:`summarise`'s rows (family, case, policy, ratio, half_width) parsed from a printed case
    table (``| case | GG-SP | ... | BP-GR |`` with ``v +/- hw`` cells, bold or not)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    by_label = {lab: p for p, lab in LABEL.items()}
    pols = [by_label[h] for h in head[1:]]
    fam_of = {"paper": "paper", "grid": "grid", "dolly": "dolly", "azure-conv": "trace"}
    rows = []
    for ln in lines[2:]:
        cells = [c.strip().strip("*") for c in ln.strip("|").split("|")]
        case = cells[0]
        for p, cell in zip(pols, cells[1:]):
            if cell:
                v, hw = (float(x) for x in cell.split("+/-"))
                rows.append({"family": fam_of[case.split()[0]], "case": case, "policy": p, "ratio": v,
                             "half_width": hw})
    return pd.DataFrame(rows)


def print_tables(df: pd.DataFrame) -> None:
    summ = summarise(df)
    pols = [p for p in POLICIES if p in set(summ["policy"])]
    print("\n| case | " + " | ".join(LABEL[p] for p in pols) + " |")
    print("|---" * (len(pols) + 1) + "|")
    for (_fam, case), g in summ.groupby(["family", "case"], sort=False):
        g = g.set_index("policy")
        best = max((g.loc[p, "ratio"] for p in pols if p in g.index and p != NEW), default=math.nan)
        cells = []
        for p in pols:
            if p not in g.index:
                cells.append("")
                continue
            v, hw = g.loc[p, "ratio"], g.loc[p, "half_width"]
            s = f"{v:.4f} +/- {hw:.4f}"
            cells.append(f"**{s}**" if (p == NEW and v > best) or (p != NEW and v == best) else s)
        print(f"| {case} | " + " | ".join(cells) + " |")
    v = verdict(summ)
    if len(v):
        print("\nBP-GR against the best baseline (paper's five and round robin), per case:\n")
        print_verdict(v)
    paper = summ[(summ["family"] == "paper") & (summ["policy"] == NEW)]
    if len(paper):
        print("\nBP-GR on the paper instance: X/n against x* (max abs error over classes):")
        for _, r in paper.iterrows():
            print(f"  {r['case']}: ratio {r['ratio']:.4f} +/- {r['half_width']:.4f}, max |X/n - x*| = {r['x_err']:.4f}")


def s_label(df: pd.DataFrame, fam: str) -> str:
    """The y label of a family's panel: what its ratio divides (runs.csv's bound_label)."""
    lab = df.loc[df["family"] == fam, "bound_label"].dropna().unique() if "bound_label" in df else []
    return lab[0] if len(lab) == 1 else "revenue / R*(window)"


def figure(df: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summ = summarise(df)
    fams = [f for f in ("paper", "grid", "dolly", "trace") if f in set(summ["family"])]
    fig, axes = plt.subplots(1, len(fams), figsize=(4.2 * len(fams), 4.0), squeeze=False)
    for ax, fam in zip(axes[0], fams):
        s = summ[summ["family"] == fam]
        cases = list(dict.fromkeys(s["case"]))
        for k, p in enumerate(POLICIES):
            g = s[s["policy"] == p].set_index("case").reindex(cases)
            style = dict(color="k", lw=2.0, marker="o", zorder=5) if p == NEW else dict(lw=0.8, marker=".", color=f"C{k}")
            ax.errorbar(range(len(cases)), g["ratio"], yerr=g["half_width"], label=LABEL[p], capsize=2, **style)
        ax.set_xticks(range(len(cases)), [c.replace("paper ", "").replace(" n=", "\nn=") for c in cases],
                      rotation=90 if len(cases) > 6 else 0, fontsize=7)
        lo = float(np.nanpercentile(s["ratio"], 10))
        ax.set_ylim(max(0.0, min(lo, float(s[s["policy"] == NEW]["ratio"].min())) - 0.02), 1.04)
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set_title(fam)
        ax.set_ylabel("revenue / R*" if fam != "trace" else str(s_label(df, fam)))
    axes[0][0].legend(fontsize=7, loc="lower right")
    print(f"figure: {save_figure(fig, path, dpi=90)}")


# -- main -------------------------------------------------------------------------------------------
def build_runs(a) -> tuple[list[dict], dict[str, list[int]], list, dict]:
    """The cases, seeds per family, policies (labelled ablation variants with --ablation) and options."""
    if a.quick:
        cases = (paper_cases([20], [300.0]) + grid_cases(20, 0.05, which={0, 3}) + dolly_cases(10, 300.0, k=1)
                 + trace_cases(((8, 1.0),), max_requests=1500))
        seeds = {"paper": [0], "grid": [0], "dolly": [0], "trace": [0]}
    elif a.full:
        cases = (paper_cases([20, 50, 100, 200, 500, 2000], [10000, 6000, 4000, 3000, 2000, 1500])
                 + grid_cases(500, 1.0) + dolly_cases(100, 3000.0) + trace_cases())
        seeds = {f: list(range(5)) for f in ("paper", "grid", "dolly", "trace")}
    else:  # the documented reduced grid (docs/robust-control.md)
        cases = (paper_cases([20, 50, 100, 200, 500, 2000], [3000, 2000, 1000, 600, 400, 200])
                 + grid_cases(100, 0.3) + dolly_cases(50, 600.0) + trace_cases())
        seeds = {"paper": list(range(a.seeds)), "trace": list(range(a.seeds)),
                 "grid": list(range(a.grid_seeds)), "dolly": list(range(a.grid_seeds))}
    if a.families:
        cases = [c for c in cases if c["family"] in a.families]
    if a.cases:
        cases = [c for c in cases if any(k in c["case"] for k in a.cases)]
    if a.ablation:
        policies = [(name, NEW) for name in ABLATION] + [("GI-WSP (reference)", "gi-wsp")]
        return cases, seeds, policies, dict(ABLATION)
    return cases, seeds, list(a.policies or POLICIES), {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smoke run (a minute)")
    ap.add_argument("--full", action="store_true", help="the issue's full grid: 5 seeds, grid at n = 500")
    ap.add_argument("--seeds", type=int, default=2, help="seeds of the reduced grid's paper and trace cases")
    ap.add_argument("--grid-seeds", type=int, default=1,
                    help="seeds of the reduced grid's random and Dolly instances (one: batch-means intervals)")
    ap.add_argument("--policies", nargs="*", choices=POLICIES, help="run only these policies")
    ap.add_argument("--merge", type=Path, help="a runs.csv whose other policies' rows are kept (rerun one policy)")
    ap.add_argument("--cases", nargs="*", help="keep only cases whose name contains one of these strings")
    ap.add_argument("--families", nargs="*", choices=("paper", "grid", "dolly", "trace"))
    ap.add_argument("--ablation", action="store_true", help="run the mechanism ablation instead of the policies")
    ap.add_argument("--trace-measure", choices=("cohort", "window"), default="cohort",
                    help="trace score: the arrival cohort's revenue (default) or the completions inside the "
                         "window, each over R*(window); both are in runs.csv (with --replot: rescores it)")
    add_executor_arguments(ap, workers=2)
    ap.add_argument("--replot", action="store_true", help="tables and figure from <out>/runs.csv")
    ap.add_argument("--summary-from-table", type=Path, metavar="MD",
                    help="print the per-family summary of a case table copied from the docs (a file holding "
                         "it); nothing is run")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--fig", type=Path, default=None)
    a = ap.parse_args(argv)
    tag = "ablation" if a.ablation else "policy_grid"
    out = a.out or ROOT / "out" / "examples" / (tag + ("_quick" if a.quick else ""))
    fig = a.fig or (None if a.quick or a.ablation else Path("fluidopt-examples") / "robust_policy_grid.png")
    t0 = time.perf_counter()
    if a.summary_from_table is not None:
        print_verdict(verdict(summary_from_table(a.summary_from_table.read_text())))
        return 0
    if a.replot:
        df = rescore(pd.read_csv(out / "runs.csv"), a.trace_measure)
    else:
        cases, seeds, policies, options = build_runs(a)
        frames = []
        with executor_from_args(a) as ex:
            for fam in dict.fromkeys(c["family"] for c in cases):
                # one comparison per family (each has its own seeds); its results store lets a rerun resume
                frames.append(run_family([c for c in cases if c["family"] == fam], policies, options, seeds[fam], ex,
                                         out / fam, a.trace_measure))
        df = pd.concat(frames, ignore_index=True)
        if a.merge is not None:
            old = pd.read_csv(a.merge)
            df = rescore(pd.concat([old[~old["policy"].isin(set(df["policy"]))], df], ignore_index=True),
                         a.trace_measure)
        out.mkdir(parents=True, exist_ok=True)
        df.to_csv(out / "runs.csv", index=False)
    if a.ablation:
        print_ablation(df)
    else:
        print_tables(df)
        if fig is not None:
            figure(df, fig)
    print(f"\n{len(df)} runs, {time.perf_counter() - t0:.0f} s wall ({a.workers} workers)")
    return 0


def print_ablation(df: pd.DataFrame) -> None:
    df = df.copy()
    df["policy"] = df["variant"]
    summ = summarise(df)
    fams = list(dict.fromkeys(summ["family"]))
    present = set(summ["policy"])
    names = [nm for nm in [*ABLATION, "GI-WSP (reference)"] if nm in present]
    print("\nMean revenue / R* per family (seeds and cases averaged):\n")
    print("| mechanisms | " + " | ".join(fams) + " |")
    print("|---" * (len(fams) + 1) + "|")
    for nm in names:
        cells = [f"{summ[(summ['family'] == f) & (summ['policy'] == nm)]['ratio'].mean():.4f}" for f in fams]
        print(f"| {nm} | " + " | ".join(cells) + " |")
    print("\nPer case:\n")
    cases = list(dict.fromkeys(summ["case"]))
    print("| mechanisms | " + " | ".join(cases) + " |")
    print("|---" * (len(cases) + 1) + "|")
    for nm in names:
        s = summ[summ["policy"] == nm].set_index("case")
        print(f"| {nm} | " + " | ".join(f"{s.loc[c, 'ratio']:.4f}" if c in s.index else "" for c in cases) + " |")


if __name__ == "__main__":
    from fluidopt.core.interrupt import script_main

    # Ctrl-C / SIGTERM: one line on what was kept, exit 130 / 143, no traceback
    raise SystemExit(script_main(main))
