"""The Chiron workflow (docs/orchestration.md): interactive and batch SLOs on an autoscaling fleet.

Interactive Gamma arrivals (mean 30/s, CV 4) on an over-provisioned fleet of 15 instances; at minute 5
a batch backlog arrives (default 100,000 requests; the seed's 1,000,000 with --backlog 1000000),
due at minute 65; at most 50 instances. Each controller runs with several seeds; the script prints
and writes the table (GPU-hours, SLO attainment of both classes, with 95% intervals over seeds, and
GPU-hours over the multi-period LP's lower bound) and the figures (fleet size and batch queue over time).

    python examples/orchestration.py                        # 100,000-request backlog, 5 seeds
    python examples/orchestration.py --backlog 10000 --seeds 2 --out /tmp/orch   # a quick look
    python examples/orchestration.py --azure PATH           # interactive arrivals from the Azure trace
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from fluidopt.executor import add_executor_arguments, executor_from_args, run_jobs
from fluidopt.fluid.multiperiod import BacklogJob, plan_fleet
from fluidopt.plots import save_figure
from fluidopt.scenario import load_scenario
from fluidopt.sim.api import simulate
from fluidopt.sim.workload import Backlog, BacklogWorkload, ClassSpec, Exponential, GammaRenewal, SyntheticWorkload

HERE = Path(__file__).resolve().parent
SCENARIO = HERE / "scenarios" / "chiron-workflow.toml"
POLICIES = ("chiron", "qlm", "utilisation-autoscaler", "fluid-plan")
BACKLOG_AT = 300.0  # s: minute 5


class Renamed:
    """A one-class workload under another class name."""

    def __init__(self, base, name: str):
        self.base = base
        self.class_names = (name,)

    def batches(self, rng, horizon, size=65536):
        return self.base.batches(rng, horizon, size)


def scenario_for(azure: str | None):
    """The workflow scenario; with the Azure trace, its interactive class takes the trace's mean
    prompt, output and rate (the controllers size their pools from them)."""
    sc = load_scenario(SCENARIO)
    if not azure:
        return sc
    from dataclasses import replace

    from fluidopt.sim.trace import read_azure_trace

    df = read_azure_trace(azure)
    dur = float(df["time"].max() - df["time"].min())
    inter = replace(sc.classes[0], prompt=float(df["prompt"].mean()), decode=float(df["output"].mean()),
                    rate=len(df) / dur)
    return replace(sc, classes=(inter, sc.classes[1]), name="chiron-workflow-azure")


def workload(scenario, backlog: int, *, cv: float = 4.0, azure: str | None = None):
    """Interactive arrivals (Gamma with the class's rate and CV ``cv``, or the Azure conversation trace)
    plus the batch backlog at minute 5."""
    inter, bat = scenario.classes
    if azure:
        from fluidopt.sim.trace import load_azure_trace

        base = Renamed(load_azure_trace(azure, classes="single"), inter.name)
    else:
        base = SyntheticWorkload([ClassSpec(GammaRenewal(inter.rate, cv), Exponential(inter.prompt),
                                            Exponential(inter.decode), name=inter.name)])
    return BacklogWorkload(base, [Backlog(bat.name, backlog, BACKLOG_AT, Exponential(bat.prompt), Exponential(bat.decode))],
                           class_names=scenario.class_names)


def run_one(job: dict) -> dict:
    """One controller on the workflow (job: policy, seed, backlog, horizon, azure)."""
    policy, seed, backlog, horizon, azure = (job[k] for k in ("policy", "seed", "backlog", "horizon", "azure"))
    sc = scenario_for(azure)
    t0 = time.perf_counter()
    res = simulate(sc, policy, horizon=horizon, seed=seed, service="tokens", workload=workload(sc, backlog, azure=azure),
                   sample_interval=30.0)
    ts = res.timeseries
    bq = ts["q_prefill[batch]"] + ts["q_decode[batch]"]
    bs = bq + ts["x[batch]"] + ts["y_mixed[batch]"] + ts["y_solo[batch]"]
    log = res.meta.get("fleet_log")
    if log is None:
        log = pd.DataFrame({"time": [0.0], "gpus": [res.n_gpus], "online": [res.n_gpus]})
    pc = res.per_class
    return {
        "policy": policy, "seed": seed, "gpu_hours": res.gpu_hours, "wall": time.perf_counter() - t0,
        "slo_interactive": float(pc.loc["interactive", "slo_attainment"]),
        "slo_batch": float(pc.loc["batch", "slo_attainment"]),
        "batch_done": int(pc.loc["batch", "completed"]), "in_system": res.totals["in_system"],
        "ttft_p99_interactive": float(pc.loc["interactive", "ttft_p99"]),
        "tpot_mean_interactive": float(pc.loc["interactive", "tpot_mean"]),
        "preemptions": res.totals["preemptions"], "max_gpus": int(log["gpus"].max()),
        "ts_time": ts["time"].tolist(), "batch_waiting": bq.tolist(), "batch_in_system": bs.tolist(),
        "fleet_time": log["time"].tolist(), "fleet_gpus": log["gpus"].tolist(),
    }


def ci(v) -> tuple[float, float]:
    v = np.asarray(v, dtype=float)
    if v.size < 2:
        return float(v.mean()), math.nan
    return float(v.mean()), float(stats.t.ppf(0.975, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))


def lower_bound(backlog: int, horizon: float, rate=None, azure=None) -> float:
    sc = scenario_for(azure)
    dl = sc.classes[1].deadline_at
    plan = plan_fleet(sc, [BacklogJob("batch", backlog, BACKLOG_AT, dl)], end=horizon, slot=60.0,
                      utilisation=1.0, interactive_rate=rate)
    return plan.gpu_hours


def figures(rows: list[dict], out: Path, tag: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    seed0 = min(r["seed"] for r in rows)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for r in rows:
        if r["seed"] == seed0:
            t = np.array(r["fleet_time"] + [r["ts_time"][-1]]) / 60
            g = np.array(r["fleet_gpus"] + [r["fleet_gpus"][-1]])
            ax.step(t, g, where="post", label=r["policy"])
    ax.set_xlabel("minute")
    ax.set_ylabel("instances (incl. starting, draining)")
    ax.set_title(f"Fleet size over time (seed {seed0})")
    ax.legend(fontsize=8)
    paths.append(save_figure(fig, out / f"orch_fleet{tag}.png", dpi=110))
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for r in rows:
        if r["seed"] == seed0:
            ax.plot(np.array(r["ts_time"]) / 60, r["batch_in_system"], label=r["policy"])
    ax.axvline(65, color="k", ls=":", lw=1)
    ax.set_xlabel("minute")
    ax.set_ylabel("batch requests not done")
    ax.set_title(f"Batch queue over time (seed {seed0}; dotted: the deadline)")
    ax.legend(fontsize=8)
    paths.append(save_figure(fig, out / f"orch_batch_queue{tag}.png", dpi=110))
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backlog", type=int, default=100_000)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--horizon", type=float, default=4200.0, help="s (default 70 min: past the 65-minute deadline)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    add_executor_arguments(ap, workers=1)
    ap.add_argument("--azure", default=None, help="the Azure conversation trace CSV for the interactive arrivals")
    ap.add_argument("--out", default="fluidopt-examples")
    ap.add_argument("--tag", default="")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [{"policy": p, "seed": s, "backlog": a.backlog, "horizon": a.horizon, "azure": a.azure}
            for p in a.policies.split(",") for s in range(1, a.seeds + 1)]

    def note(job: dict, r: dict) -> str:
        return (f"{r['policy']} seed {r['seed']}: {r['gpu_hours']:.2f} GPU-h, SLO interactive "
                f"{r['slo_interactive']:.4f}, batch {r['slo_batch']:.4f}")

    # the runs go through fluidopt.executor: a local pool by default, --dask or --scheduler to scale out
    with executor_from_args(a) as ex:
        # Ctrl-C raises fluidopt.interrupt.Interrupted: no table is written from an incomplete sweep
        done = run_jobs(run_one, jobs, executor=ex, progress=True, desc="simulations", note=note)
    rows = [done[k] for k in sorted(done)]
    rate = None
    if a.azure:
        t = np.concatenate([b.time for b in workload(scenario_for(a.azure), 0, azure=a.azure)
                            .batches(np.random.default_rng(0), a.horizon)])
        counts = np.histogram(t, bins=np.arange(0, a.horizon + 60, 60.0))[0]
        rate = (counts / 60.0).tolist()
    from fluidopt.errors import InfeasibleError

    try:
        lb = lower_bound(a.backlog, a.horizon, rate, a.azure)
    except InfeasibleError as e:  # e.g. the seed's 1,000,000 requests on at most 50 instances
        print(f"multi-period LP: {e}")
        lb = math.nan
    table = []
    for p in a.policies.split(","):
        rs = [r for r in rows if r["policy"] == p]
        gh = ci([r["gpu_hours"] for r in rs])
        si = ci([r["slo_interactive"] for r in rs])
        sb = ci([r["slo_batch"] for r in rs])
        table.append({"policy": p, "gpu_hours": gh[0], "gpu_hours_ci": gh[1], "ratio_to_lp": gh[0] / lb,
                      "slo_interactive": si[0], "slo_interactive_ci": si[1], "slo_batch": sb[0], "slo_batch_ci": sb[1],
                      "max_gpus": max(r["max_gpus"] for r in rs), "seeds": len(rs),
                      "wall_s": float(np.mean([r["wall"] for r in rs]))})
    tab = pd.DataFrame(table)
    print(f"\nbacklog {a.backlog:,} at minute 5, deadline minute 65; multi-period LP lower bound {lb:.2f} GPU-hours")
    print(tab.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    tab.to_csv(out / f"orch_table{a.tag}.csv", index=False)
    (out / f"orch_runs{a.tag}.json").write_text(json.dumps(
        {"lp_lower_bound": lb, "backlog": a.backlog, "runs": [{k: v for k, v in r.items() if not isinstance(v, list)}
                                                              for r in rows]}, indent=1))
    for p in figures(rows, out, a.tag):
        print("wrote", os.path.relpath(p))
    return 0


if __name__ == "__main__":
    from fluidopt.interrupt import script_main

    # Ctrl-C / SIGTERM: one line on what was kept, exit 130 / 143, no traceback
    raise SystemExit(script_main(main))
