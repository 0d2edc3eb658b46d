"""The Chiron workflow (docs/orchestration.md): interactive and batch SLOs on an autoscaling fleet.

The whole workflow is the scenario file examples/scenarios/chiron-workflow.toml (interactive Gamma
arrivals, mean 30/s, CV 4, on an over-provisioned fleet of 15 instances; at minute 5 a batch backlog
of 100,000 requests due at minute 65; at most 50 instances; 70 minutes); this script only runs it for
several controllers and seeds (`fluidopt simulate FILE --policy chiron` runs one), and prints and writes
the table (GPU-hours, SLO attainment of both classes, with 95% intervals over seeds, and GPU-hours
over the multi-period LP's lower bound with calibrated throughputs) and the figures.

    python examples/orchestration.py                        # 100,000-request backlog, 5 seeds
    python examples/orchestration.py --backlog 10000 --seeds 2 --out /tmp/orch   # a quick look
    python examples/orchestration.py --azure PATH           # interactive arrivals from the Azure trace
"""

from __future__ import annotations

from fluidopt.core.interrupt import script_guard

script_guard()  # Ctrl-C / SIGTERM from here on, the imports below included: one line, exit 130 / 143

import argparse
import json
import math
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from fluidopt.core.model import ArrivalSpec
from fluidopt.fluid.multiperiod import BacklogJob, plan_fleet
from fluidopt.harness.executor import add_executor_arguments, executor_from_args, run_jobs
from fluidopt.harness.plots import save_figure
from fluidopt.scenario import load_scenario
from fluidopt.sim.api import simulate

HERE = Path(__file__).resolve().parent
SCENARIO = HERE / "scenarios" / "chiron-workflow.toml"
POLICIES = ("chiron", "qlm", "utilisation-autoscaler", "fluid-plan")


def scenario_for(azure: str | None, backlog: int | None = None):
    """The workflow scenario (its backlog's size replaced by ``backlog``); with the Azure trace, the
    interactive arrivals are the trace's and the interactive class takes its mean prompt, output and
    rate (the controllers size their pools from them)."""
    sc = load_scenario(SCENARIO)
    wf = sc.workflow
    if backlog is not None:
        wf = replace(wf, backlogs=tuple(replace(b, count=backlog) for b in wf.backlogs))
    if azure:
        from fluidopt.workloads.traces import read_azure_trace

        df = read_azure_trace(azure)
        dur = float(df["time"].max() - df["time"].min())
        inter = replace(sc.classes[0], prompt=float(df["prompt"].mean()), decode=float(df["output"].mean()),
                        rate=len(df) / dur)
        sc = replace(sc, classes=(inter, sc.classes[1]), name="chiron-workflow-azure")
        wf = replace(wf, arrivals=(ArrivalSpec(inter.name, "trace", file=str(azure)),))
    return replace(sc, workflow=wf)


def run_one(job: dict) -> dict:
    """One controller on the workflow (job: policy, seed, backlog, horizon, azure)."""
    policy, seed, backlog, horizon, azure = (job[k] for k in ("policy", "seed", "backlog", "horizon", "azure"))
    sc = scenario_for(azure, backlog)
    t0 = time.perf_counter()
    res = simulate(sc, policy, horizon=horizon, seed=seed, service="tokens", sample_interval=30.0)
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


def lower_bound(backlog: int, horizon: float, rate=None, azure=None, *, calibrated: bool = True,
                kept: float = 0.0) -> float:
    """The multi-period LP's fewest GPU-hours for the workflow over [0, horizon) in minute slots (rho = 1):
    with the calibrated throughputs (the simulator's saturated rates; False: the fluid estimates) and
    ``kept`` base GPUs in every slot."""
    sc = scenario_for(azure, backlog)
    b = sc.workflow.backlogs[0]
    plan = plan_fleet(sc, [BacklogJob(b.cls, b.count, b.at, sc.classes[1].deadline_at)], end=horizon, slot=60.0,
                      utilisation=1.0, interactive_rate=rate, calibrated=calibrated, min_gpus=kept)
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
    ap.add_argument("--backlog", type=int, default=None, help="requests (default the file's: 100,000)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--horizon", type=float, default=None, help="s (default the file's: 70 min, past the 65-minute "
                    "deadline)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    add_executor_arguments(ap, workers=1)
    ap.add_argument("--azure", default=None, help="the Azure conversation trace CSV for the interactive arrivals")
    ap.add_argument("--out", default="fluidopt-examples")
    ap.add_argument("--tag", default="")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    sc0 = scenario_for(None)
    if a.backlog is None:
        a.backlog = sc0.workflow.backlogs[0].count
    if a.horizon is None:
        a.horizon = sc0.workflow.horizon
    jobs = [{"policy": p, "seed": s, "backlog": a.backlog, "horizon": a.horizon, "azure": a.azure}
            for p in a.policies.split(",") for s in range(1, a.seeds + 1)]

    def note(job: dict, r: dict) -> str:
        return (f"{r['policy']} seed {r['seed']}: {r['gpu_hours']:.2f} GPU-h, SLO interactive "
                f"{r['slo_interactive']:.4f}, batch {r['slo_batch']:.4f}")

    # the runs go through fluidopt.harness.executor: a local pool by default, --dask or --scheduler to scale out
    with executor_from_args(a) as ex:
        # Ctrl-C raises fluidopt.core.interrupt.Interrupted: no table is written from an incomplete sweep
        done = run_jobs(run_one, jobs, executor=ex, progress=True, desc="simulations", note=note)
    rows = [done[k] for k in sorted(done)]
    rate = None
    if a.azure:
        from fluidopt.workloads import workflow_workload

        t = np.concatenate([b.time for b in workflow_workload(scenario_for(a.azure, 0))
                            .batches(np.random.default_rng(0), a.horizon)])
        counts = np.histogram(t, bins=np.arange(0, a.horizon + 60, 60.0))[0]
        rate = (counts / 60.0).tolist()
    from fluidopt.core.errors import InfeasibleError

    try:
        lb = lower_bound(a.backlog, a.horizon, rate, a.azure)
        lb_fluid = lower_bound(a.backlog, a.horizon, rate, a.azure, calibrated=False)
        lb_kept = lower_bound(a.backlog, a.horizon, rate, a.azure, kept=scenario_for(a.azure).fleet.initial)
    except InfeasibleError as e:  # e.g. the seed's 1,000,000 requests on at most 50 instances
        print(f"multi-period LP: {e}")
        lb = lb_fluid = lb_kept = math.nan
    table = []
    for p in a.policies.split(","):
        rs = [r for r in rows if r["policy"] == p]
        gh = ci([r["gpu_hours"] for r in rs])
        si = ci([r["slo_interactive"] for r in rs])
        sb = ci([r["slo_batch"] for r in rs])
        ratios = [r["gpu_hours"] / lb for r in rs]
        table.append({"policy": p, "gpu_hours": gh[0], "gpu_hours_ci": gh[1], "ratio_to_lp": gh[0] / lb,
                      "min_ratio_to_lp": min(ratios), "ratio_to_lp_kept": gh[0] / lb_kept,
                      "ratio_to_fluid_lp": gh[0] / lb_fluid,
                      "slo_interactive": si[0], "slo_interactive_ci": si[1], "slo_batch": sb[0], "slo_batch_ci": sb[1],
                      "max_gpus": max(r["max_gpus"] for r in rs), "seeds": len(rs),
                      "wall_s": float(np.mean([r["wall"] for r in rs]))})
    tab = pd.DataFrame(table)
    print(f"\nbacklog {a.backlog:,} at minute 5, deadline minute 65; multi-period LP lower bound {lb:.2f} GPU-hours "
          f"(calibrated throughputs; {lb_kept:.2f} with the initial fleet kept; {lb_fluid:.2f} with the fluid ones)")
    print(tab.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    tab.to_csv(out / f"orch_table{a.tag}.csv", index=False)
    (out / f"orch_runs{a.tag}.json").write_text(json.dumps(
        {"lp_lower_bound": lb, "lp_lower_bound_kept": lb_kept, "lp_lower_bound_fluid": lb_fluid, "backlog": a.backlog, "runs": [{k: v for k, v in r.items() if not isinstance(v, list)}
                                                              for r in rows]}, indent=1))
    for p in figures(rows, out, a.tag):
        print("wrote", os.path.relpath(p))
    return 0


if __name__ == "__main__":
    from fluidopt.core.interrupt import script_main

    # Ctrl-C / SIGTERM: one line on what was kept, exit 130 / 143, no traceback
    raise SystemExit(script_main(main))
