"""Benchmark the many-server simulator: speed, memory, and the 1M-customer Erlang checks.

Not a test. Run from the repository root:

    python benchmarks/bench_sim.py speed              # paper instance, n = 500, both service modes
    python benchmarks/bench_sim.py scaling            # requests/s for n = 50, 500, 5000
    python benchmarks/bench_sim.py memory             # peak RSS of a 5-million-request run (no records)
    python benchmarks/bench_sim.py erlang             # M/M/100 at load 0.9 and M/M/100+M: 40 x 1M customers,
                                                      # the bare birth-death chain alike, two 17M runs
    python benchmarks/bench_sim.py all

Prints markdown tables; the recorded numbers are in docs/benchmarks-sim.md. Speed is reported per
wall second and per CPU second of this process (the benchmark machine is shared: CPU time excludes
waiting for a core). Every run is seeded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

import numpy as np

import fluidopt
from fluidopt.queueing import erlang_a
from fluidopt.sim.api import simulate
from fluidopt.sim.textbook import erlang_setup


def timed(fn, *args, **kwargs):
    """fn(*args, **kwargs), its wall seconds and this process's CPU seconds."""
    w, c = time.perf_counter(), time.process_time()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - w, time.process_time() - c


def bench_speed(horizon: float, policies: list[str], services: list[str], gpus: int = 500) -> list[dict]:
    rows = []
    sc = fluidopt.default_scenario(gpus=gpus)
    for pol in policies:
        for svc in services:
            res, wall, cpu = timed(simulate, sc, pol, horizon=horizon, warmup=0.1 * horizon, seed=1, service=svc,
                                   progress=False)
            n = res.totals["requests"]
            rows.append({"policy": pol, "service": svc, "gpus": gpus, "horizon_s": horizon, "requests": n,
                         "events": res.events, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                         "req_per_wall_s": round(n / wall), "req_per_cpu_s": round(n / cpu),
                         "events_per_cpu_s": round(res.events / cpu),
                         "revenue_per_gpu": round(res.cluster["revenue_per_gpu"], 3)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def bench_scaling(requests: int, policy: str, service: str) -> list[dict]:
    rows = []
    for n in (50, 500, 5000):
        sc = fluidopt.default_scenario(gpus=n)
        horizon = requests / (1.0 * n)  # the paper instance has 1 arrival per GPU per second
        res, wall, cpu = timed(simulate, sc, policy, horizon=horizon, warmup=0.1 * horizon, seed=1, service=service,
                               progress=False)
        k = res.totals["requests"]
        rows.append({"gpus": n, "policy": policy, "service": service, "requests": k,
                     "in_system_at_end": res.totals["in_system"], "cpu_s": round(cpu, 2),
                     "req_per_cpu_s": round(k / cpu), "req_per_wall_s": round(k / wall)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _memory_child(requests: float, service: str, policy: str) -> None:
    sc = fluidopt.default_scenario(gpus=500)
    horizon = requests / 500.0
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    res, wall, cpu = timed(simulate, sc, policy, horizon=horizon, warmup=0.1 * horizon, seed=1, service=service,
                           progress=False)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"policy": policy, "service": service, "requests": res.totals["requests"],
                      "peak_rss_mb": round(rss / 1024, 1), "rss_after_imports_mb": round(rss0 / 1024, 1),
                      "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
                      "req_per_wall_s": round(res.totals["requests"] / wall),
                      "req_per_cpu_s": round(res.totals["requests"] / cpu),
                      "revenue_per_gpu": round(res.cluster["revenue_per_gpu"], 3),
                      "revenue_ci": round(res.cluster["revenue_per_gpu_ci"], 3)}), flush=True)


def bench_memory(requests: float, service: str, policy: str) -> dict:
    """Run in a fresh interpreter so that the peak RSS is this run's alone."""
    out = subprocess.run([sys.executable, __file__, "_memory_child", "--requests", str(requests), "--service", service,
                          "--policy", policy], check=True, capture_output=True, text=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps(row), flush=True)
    return row


def _birth_death_queue(c: int, lam: float, mu: float, customers: int, warmup: float, seed: int) -> float:
    """Time-average queue E[(N - c)+] of the bare M/M/c birth-death chain: an independent reference."""
    rng = np.random.default_rng(10_000 + seed)
    horizon = customers / lam
    E = rng.standard_exponential(3 * customers).tolist()
    U = rng.random(3 * customers).tolist()
    t, n, area, i = 0.0, 0, 0.0, 0
    while True:
        rate = lam + min(n, c) * mu
        tn = t + E[i] / rate
        q = n - c if n > c else 0
        if tn >= horizon:
            area += q * (horizon - max(t, warmup))
            break
        if tn > warmup:
            area += q * (tn - max(t, warmup))
        t = tn
        n += 1 if U[i] * rate < lam else -1
        i += 1
    return area / (horizon - warmup)


def bench_erlang(customers: int, seeds: int, long_run: int, long_seeds: int) -> list[dict]:
    """M/M/100 at load 0.9 (Erlang C) and with patience 0.5 (Erlang A): ``seeds`` runs of ``customers``,
    the same for the bare birth-death chain, and ``long_seeds`` M/M/100 runs of ``long_run`` customers
    (the default 17M: about what 3% at 95% confidence needs, see fluidopt.queueing_runlength)."""
    rows = []
    c, mu, lam = 100, 1.0, 90.0
    for theta in (0.0, 0.5):
        ex = erlang_a(lam, mu, c, theta)
        model = f"M/M/{c}" + ("+M" if theta else "")
        runs = [(s, customers) for s in range(seeds)]
        if theta == 0:
            runs += [(1001 + j, long_run) for j in range(long_seeds)]
        for seed, k in runs:
            sc, ctrl = erlang_setup(c, lam, mu, theta)
            res, wall, cpu = timed(simulate, sc, ctrl, horizon=k / lam, warmup=100.0, seed=seed, progress=False)
            pc = res.per_class.loc["customers"]
            ci = res.ci.set_index(["metric", "class"])
            hw = ci.loc[("wait_prefill_mean", "customers"), "half_width"]
            row = {"model": model, "seed": seed, "customers": res.totals["requests"],
                   "wait_sim": round(pc.wait_prefill_mean, 6), "wait_exact": round(ex.mean_wait, 6),
                   "wait_rel_err": round(pc.wait_prefill_mean / ex.mean_wait - 1, 4),
                   "wait_rel_ci": round(hw / ex.mean_wait, 4),
                   "queue_rel_err": round(pc.q_prefill_mean * c / ex.mean_queue - 1, 4),
                   "util_sim": round(pc.x_mean, 5), "util_exact": round(ex.utilisation, 5), "cpu_s": round(cpu, 1)}
            if theta:
                row.update({"p_ab_sim": round(pc.abandoned_prefill_fraction, 6), "p_ab_exact": round(ex.p_abandon, 6),
                            "p_ab_ci": round(ci.loc[("abandoned_prefill_fraction", "customers"), "half_width"], 6)})
            rows.append(row)
            print(json.dumps(row), flush=True)
        errs = np.array([r["wait_rel_err"] for r in rows if r["model"] == model and r["customers"] < 2 * customers])
        cover = np.mean([abs(r["wait_rel_err"]) <= r["wait_rel_ci"] for r in rows if r["model"] == model])
        print(f"# {model}, {customers} customers x {errs.size} seeds: mean wait relative error {errs.mean():+.4f} "
              f"(se {errs.std(ddof=1) / np.sqrt(errs.size):.4f}), sd per run {errs.std(ddof=1):.4f}, "
              f"within 3%: {np.mean(np.abs(errs) <= 0.03):.2f}, 95% CI covers exact: {cover:.2f}", flush=True)
        # the exact per-run sd of the per-customer mean wait (fluidopt.queueing_runlength) and where the
        # observed sd falls: the ratio observed/exact has a chi-square 95% interval for errs.size runs
        from scipy.stats import chi2, norm

        from fluidopt.queueing_runlength import mmc_mean_wait_relative_sd

        rsd = mmc_mean_wait_relative_sd(lam, mu, c, customers, theta, estimator="customer")
        df = errs.size - 1
        lo, hi = np.sqrt(chi2.ppf(0.025, df) / df), np.sqrt(chi2.ppf(0.975, df) / df)
        print(f"# exact per-run sd {rsd:.4f} (P(within 3%) = {2 * norm.cdf(0.03 / rsd) - 1:.2f}); observed/exact "
              f"{errs.std(ddof=1) / rsd:.3f}, 95% range for an exact simulator {lo:.3f}-{hi:.3f}", flush=True)
        if theta == 0:
            bd = np.array([_birth_death_queue(c, lam, mu, customers, 100.0, s) / ex.mean_queue - 1 for s in range(seeds)])
            print(f"# bare birth-death chain, same sizes: E[Q] relative error {bd.mean():+.4f} "
                  f"(se {bd.std(ddof=1) / np.sqrt(bd.size):.4f}), sd per run {bd.std(ddof=1):.4f}, "
                  f"within 3%: {np.mean(np.abs(bd) <= 0.03):.2f}", flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("speed", "scaling", "memory", "erlang", "all", "_memory_child"))
    p.add_argument("--horizon", type=float, default=600.0, help="speed: simulated seconds (n = 500: 500 req/s)")
    p.add_argument("--policies", nargs="+", default=["fi-wsp", "gate-and-route"])
    p.add_argument("--services", nargs="+", default=["markov", "tokens"])
    p.add_argument("--requests", type=float, default=5e6, help="memory: requests in the run")
    p.add_argument("--service", default="markov")
    p.add_argument("--policy", default="fi-wsp")
    p.add_argument("--customers", type=int, default=1_000_000)
    p.add_argument("--seeds", type=int, default=40)
    p.add_argument("--long-run", type=int, default=17_000_000, help="erlang: customers of each long M/M/100 run")
    p.add_argument("--long-seeds", type=int, default=2, help="erlang: how many long M/M/100 runs")
    a = p.parse_args(argv)
    if a.what == "_memory_child":
        _memory_child(a.requests, a.service, a.policy)
        return 0
    print(f"# fluidopt {fluidopt.__version__}, Python {platform.python_version()}, {platform.machine()}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}", flush=True)
    if a.what in ("speed", "all"):
        bench_speed(a.horizon, a.policies, a.services)
    if a.what in ("scaling", "all"):
        bench_scaling(200_000, "fi-wsp", "markov")
    if a.what in ("memory", "all"):
        bench_memory(a.requests, a.service, a.policy)
    if a.what in ("erlang", "all"):
        bench_erlang(a.customers, a.seeds, a.long_run, a.long_seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
