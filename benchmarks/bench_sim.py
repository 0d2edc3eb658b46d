"""Benchmark the many-server simulator: speed, scaling, memory, the Erlang checks, before/after.

Not a test. Run from the repository root:

    python benchmarks/bench_sim.py speed              # paper instance, n = 500, both service modes
    python benchmarks/bench_sim.py scaling            # steady-state cost per request, n = 50 ... 50,000
    python benchmarks/bench_sim.py memory             # peak RSS of a 5-million-request run (no records)
    python benchmarks/bench_sim.py erlang             # M/M/100 at load 0.9 and M/M/100+M: 40 x 1M customers,
                                                      # the bare birth-death chain alike, two 17M runs
    python benchmarks/bench_sim.py erlang-speed       # the engine on M/M/100+M against a plain heapq loop
    python benchmarks/bench_sim.py race-latency       # the memory floor of a race pick at n = 50 and 50,000
                                                      # (benchmarks/race_latency.c, needs a C compiler)
    python benchmarks/bench_sim.py all                # speed, scaling, memory, erlang
    python benchmarks/bench_sim.py compare --before /tmp/fluidopt_before
                                                      # engine BEFORE vs AFTER (this tree), one run
    python benchmarks/bench_sim.py law-cost           # tokens mode with a generalised iteration-time law
                                                      # (gpu.timemodel) against the straight line, one run
    python benchmarks/bench_sim.py controller-cost    # the gate-and-route family's CPU per request against
                                                      # gate-and-route's (n = 500), compiled fast path
                                                      # and Python handlers, one run

Prints markdown tables; the recorded numbers are in docs/benchmarks-sim.md. Speed is reported per
wall second and per CPU second of this process (the benchmark machine is shared: CPU time excludes
waiting for a core). Every run is seeded.

Cost per request (scaling, compare). The arrival rate scales with n (1 request per GPU per second),
so a fixed number of requests is a horizon of requests / n seconds: at n = 50,000, 200k requests
are 4 simulated seconds, less than one decode (about 22 s), and a run that short measures an
emptying-in system (few completions, the engine's setup spread over few requests). The system
fills in about 60 simulated seconds whatever n (the decode times set the scale), so each run first
simulates ``--fill`` seconds (default 60; these are also the metrics' warm-up), then ``--requests``
more arrivals, and the steady-state cost per request is the CPU time between the two arrival counts
divided by the arrivals between them: every request's whole life (arrival, routing, prefill,
decode, completion or abandonment) at the system's steady occupancy. The CPU clock is read through
the workload: the scenario's own Poisson workload, unchanged, handed to the engine in chunks of
8,192 arrivals; each time the engine asks for the next chunk, the process CPU time and the
arrivals so far are noted (nothing in the simulation changes: same arrivals, same sample path,
same numbers). The setup (controller, engine, first arrivals) and the fill are reported apart,
and "run" columns give the whole run's requests per CPU second as ``speed`` does.

compare: every case in a fresh interpreter with ``PYTHONPATH=<tree>``, alternately the BEFORE tree
(``--before``, e.g. the session-start commit, exported and built in place by
benchmarks/make_before_tree.sh) and the AFTER tree (``--after``, default this repository), best of
``--reps`` (the n = 50,000 points: ``--big-reps``, default 1); each child checks that it imported
fluidopt from its tree and says which engine ran (compiled or python; not compiled is an error
unless ``--allow-python``). The AFTER tree's fluidopt package and this script are copied to a
temporary directory first, so that edits or a reinstall during the comparison change nothing in it.
The default comparison (14 cases, 200k requests, best of 3) is about 900 CPU s, a quarter of it
interpreter start-up; `--memory-requests 5e6` adds the peak RSS of a 5M-request run to both.
To compare against a working tree whose installed compiled core is stale, build a copy:
``benchmarks/make_before_tree.sh WORKTREE /tmp/fluidopt_after`` and pass ``--after /tmp/fluidopt_after``.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import platform
import random
import resource
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

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


# ---------------------------------------------------------------------------------------------
# Steady-state cost per request: the CPU clock read at arrival counts (see the module docstring)
# ---------------------------------------------------------------------------------------------


class ClockedWorkload:
    """``inner``'s arrivals, unchanged, in chunks of at most ``size``; notes (CPU s, arrivals so far,
    time of the last one) each time the engine asks for the next chunk. Same arrivals, same sample path."""

    def __init__(self, inner, size: int = 8192):
        self.inner = inner
        self.size = int(size)
        self.class_names = tuple(inner.class_names)
        self.marks: list[tuple[float, int, float]] = []

    def batches(self, rng, horizon: float, size: int = 65536):
        n, t_last, s = 0, 0.0, self.size
        for b in self.inner.batches(rng, horizon, size):
            k = len(b.time)
            for i in range(0, k, s):
                self.marks.append((time.process_time(), n, t_last))
                j = min(i + s, k)
                sub = b if (i == 0 and j == k) else type(b)(b.time[i:j], b.cls[i:j], b.prompt[i:j], b.output[i:j])
                n += j - i
                t_last = float(b.time[j - 1])
                yield sub
        self.marks.append((time.process_time(), n, t_last))


def run_stepped(sc, controller, *, service: str, requests: float, fill: float, seed: int = 1,
                chunk: int = 8192) -> dict:
    """One run: ``fill`` simulated seconds (also the warm-up), then about ``requests`` arrivals.

    Returns the engine that ran, whole-run and steady-state (after ``fill``) requests per CPU s, the
    setup and fill CPU seconds, and a few results (to see that two engines ran the same path).
    """
    from fluidopt.workloads import workload_from_scenario

    rate = sum(c.rate for c in sc.classes)
    horizon = fill + (requests + chunk) / rate  # the window starts at the first chunk boundary after the fill
    wl = ClockedWorkload(workload_from_scenario(sc), chunk)
    c0 = time.process_time()
    res, wall, cpu = timed(simulate, sc, controller, horizon=horizon, warmup=fill, seed=seed, service=service,
                           workload=wl, progress=False)
    marks = wl.marks
    i0 = next((i for i, m in enumerate(marks) if m[2] >= fill), len(marks) - 1)
    (ca, na, ta), (cb, nb, tb) = marks[i0], marks[-1]
    k = res.totals["requests"]
    return {
        "engine": res.meta.get("engine", "?"), "gpus": sc.gpus, "service": service, "requests": k,
        "events_per_req": round(res.events / k, 4) if k else None,
        "setup_cpu_s": round(marks[0][0] - c0, 3), "fill_cpu_s": round(ca - marks[0][0], 3),
        "window_requests": nb - na, "window_sim_s": round(tb - ta, 3), "window_cpu_s": round(cb - ca, 3),
        "req_per_cpu_s": round((nb - na) / (cb - ca)) if cb > ca else None,
        "cpu_s": round(cpu, 3), "wall_s": round(wall, 3),
        "run_req_per_cpu_s": round(k / cpu), "run_req_per_wall_s": round(k / wall),
        "in_system_at_end": res.totals["in_system"], "completed": res.totals["completed"],
        "revenue_per_gpu": round(float(res.cluster["revenue_per_gpu"]), 6),
        "_res": res,
    }


def run_fleet(policy: str, service: str, gpus: int, requests: float, fill: float, seed: int = 1) -> dict:
    """The paper instance (``fluidopt.default_scenario``) with ``gpus`` GPUs, stepped as run_stepped."""
    row = run_stepped(fluidopt.default_scenario(gpus=gpus), policy, service=service, requests=requests, fill=fill,
                      seed=seed)
    row.pop("_res")
    return {"policy": policy, **row}


def bench_scaling(requests: float, fill: float, gpus: list[int], combos: list[tuple[str, str]]) -> list[dict]:
    """Steady-state requests per CPU s (and the ratio to the first n) for each (policy, service)."""
    rows = []
    for pol, svc in combos:
        base = None
        for n in gpus:
            row = run_fleet(pol, svc, n, requests, fill)
            base = base or row["req_per_cpu_s"]
            row["vs_first_n"] = round(row["req_per_cpu_s"] / base, 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| policy | service | GPUs | req/CPU s (steady) | vs first n | CPU us/req | run req/CPU s | setup CPU s "
          "| fill CPU s | events/req |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['policy']} | {r['service']} | {r['gpus']:,} | {r['req_per_cpu_s']:,} | {r['vs_first_n']:.2f} "
              f"| {1e6 / r['req_per_cpu_s']:.1f} | {r['run_req_per_cpu_s']:,} | {r['setup_cpu_s']:.2f} "
              f"| {r['fill_cpu_s']:.1f} | {r['events_per_req']:.2f} |", flush=True)
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
    (the default 17M: about what 3% at 95% confidence needs, see fluidopt.queueing.runlength)."""
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
        # the exact per-run sd of the per-customer mean wait (fluidopt.queueing.runlength) and where the
        # observed sd falls: the ratio observed/exact has a chi-square 95% interval for errs.size runs
        from scipy.stats import chi2, norm

        from fluidopt.queueing.runlength import mmc_mean_wait_relative_sd

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


# ---------------------------------------------------------------------------------------------
# M/M/100+M: the engine against a plain heapq event loop, per customer
# ---------------------------------------------------------------------------------------------


def heapq_mmc_abandon(c: int, lam: float, mu: float, theta: float, customers: int, warmup: float,
                      seed: int = 1) -> dict:
    """M/M/c+M, FCFS, as a plain-Python heapq event loop: ``customers`` Poisson arrivals, c servers,
    Exp(mu) service, Exp(theta) patience while waiting (none when theta = 0). Customers arriving
    after ``warmup`` s count in the mean wait (abandoning ones: until they leave) and P(abandon)."""
    rng = random.Random(seed)
    expo, push, pop = rng.expovariate, heapq.heappush, heapq.heappop
    t_arr: list[float] = []  # arrival time of customer k
    waiting: list[bool] = []  # customer k still in the queue
    queue: deque[int] = deque()  # FCFS; customers who abandoned are skipped when they reach the head
    free, counted, abandoned, wait_sum = c, 0, 0, 0.0
    heap = [(expo(lam), 0, 0)]  # (time, kind, customer); kind 0 arrival, 1 service end, 2 patience end
    while heap:
        t, kind, k = pop(heap)
        if kind == 0:
            t_arr.append(t)
            if k + 1 < customers:
                push(heap, (t + expo(lam), 0, k + 1))
            if free:
                free -= 1
                waiting.append(False)
                push(heap, (t + expo(mu), 1, k))
                if t >= warmup:
                    counted += 1
            else:
                waiting.append(True)
                queue.append(k)
                if theta > 0:
                    push(heap, (t + expo(theta), 2, k))
        elif kind == 1:
            while queue and not waiting[queue[0]]:
                queue.popleft()
            if queue:
                j = queue.popleft()
                waiting[j] = False
                push(heap, (t + expo(mu), 1, j))
                if t_arr[j] >= warmup:
                    counted += 1
                    wait_sum += t - t_arr[j]
            else:
                free += 1
        elif waiting[k]:
            waiting[k] = False
            if t_arr[k] >= warmup:
                counted += 1
                abandoned += 1
                wait_sum += t - t_arr[k]
    return {"customers": customers, "counted": counted, "wait_mean": wait_sum / counted,
            "p_abandon": abandoned / counted}


def run_erlang_heapq(customers: int, c: int = 100, lam: float = 90.0, mu: float = 1.0, theta: float = 0.5,
                     fill: float = 20.0, seed: int = 1) -> dict:
    out, wall, cpu = timed(heapq_mmc_abandon, c, lam, mu, theta, customers, fill, seed)
    ex = erlang_a(lam, mu, c, theta)
    return {"model": f"M/M/{c}+M heapq", "engine": "heapq", "customers": customers, "cpu_s": round(cpu, 3),
            "run_req_per_cpu_s": round(customers / cpu), "req_per_cpu_s": round(customers / cpu),
            "wait_sim": round(out["wait_mean"], 6), "wait_exact": round(ex.mean_wait, 6),
            "p_ab_sim": round(out["p_abandon"], 6), "p_ab_exact": round(ex.p_abandon, 6)}


def run_erlang_engine(customers: int, c: int = 100, lam: float = 90.0, mu: float = 1.0, theta: float = 0.5,
                      fill: float = 20.0, seed: int = 1) -> dict:
    """The engine on erlang_setup(c, lam, mu, theta): ``fill`` s, then about ``customers`` arrivals."""
    sc, ctrl = erlang_setup(c, lam, mu, theta)
    row = run_stepped(sc, ctrl, service="markov", requests=customers - fill * lam, fill=fill, seed=seed)
    res = row.pop("_res")
    pc = res.per_class.loc["customers"]
    ex = erlang_a(lam, mu, c, theta)
    return {"model": f"M/M/{c}+M engine", **row,
            "wait_sim": round(float(pc.wait_prefill_mean), 6), "wait_exact": round(ex.mean_wait, 6),
            "p_ab_sim": round(float(pc.abandoned_prefill_fraction), 6), "p_ab_exact": round(ex.p_abandon, 6)}


def _erlang_noise(customers: int, c: int = 100, lam: float = 90.0, mu: float = 1.0, theta: float = 0.5) -> str:
    """What the simulated mean wait and P(abandon) of one run of ``customers`` may differ from erlang_a by."""
    try:
        from fluidopt.queueing.runlength import erlang_a_abandon_relative_sd, mmc_mean_wait_relative_sd

        w = mmc_mean_wait_relative_sd(lam, mu, c, customers, theta, estimator="customer")
        pa = erlang_a_abandon_relative_sd(lam, mu, c, theta, customers, estimator="customer")
        return (f"one run of {customers:,} customers: relative sd of the mean wait {w:.3f}, of P(abandon) {pa:.3f} "
                "(fluidopt.queueing.runlength); within 2 sd of exact is agreement")
    except Exception as exc:  # an older tree without these functions
        return f"(relative sd not available: {exc})"


def bench_race_latency(gpus: list[int], picks: int = 20_000_000, reps: int = 3) -> list[dict]:
    """The memory floor of a race completion (benchmarks/race_latency.c, built with the system C
    compiler): CPU ns per dependent pick at each n, best of ``reps``, for the engine's layout (4-byte
    ids, huge pages), the layout before (8-byte ids, pairs on 4 KB pages) and the engine's layout
    with an exact one-pick-ahead prefetch of the pair (what no event-driven engine can know)."""
    import shutil
    import sysconfig
    import tempfile

    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        cc = "cc"
    with tempfile.TemporaryDirectory() as d:
        exe = os.path.join(d, "race_latency")
        subprocess.run([cc, "-O2", "-o", exe, str(REPO / "benchmarks" / "race_latency.c")], check=True)
        layouts = [("engine (4-byte ids, huge pages)", 0, 4, 1), ("before (8-byte ids, 4 KB pages)", 0, 8, 0),
                   ("engine + exact look-ahead", 1, 4, 1)]
        rows = []
        for name, look, width, huge in layouts:
            for n in gpus:
                best = None
                for _ in range(reps):
                    out = subprocess.run([exe, str(n), str(picks), str(look), str(width), str(huge)], check=True,
                                         capture_output=True, text=True)
                    row = json.loads(out.stdout)
                    best = row if best is None or row["ns_per_pick"] < best["ns_per_pick"] else best
                best["layout"] = name
                rows.append(best)
                print(json.dumps(best), flush=True)
    print(f"\n| layout | GPUs | requests in flight | CPU ns per pick (best of {reps}) |\n|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['layout']} | {r['gpus']:,} | {r['in_flight']:,} | {r['ns_per_pick']:.0f} |", flush=True)
    return rows


def bench_erlang_speed(customers: int, reps: int = 3) -> list[dict]:
    """Customers per CPU s of the engine and of the plain heapq loop on M/M/100+M (load 0.9,
    patience rate 0.5), best of ``reps``, with their mean waits and P(abandon) against erlang_a."""
    best = {}
    for _ in range(reps):
        for name, fn in (("engine", run_erlang_engine), ("heapq", run_erlang_heapq)):
            row = fn(customers)
            print(json.dumps(row), flush=True)
            if name not in best or row["run_req_per_cpu_s"] > best[name]["run_req_per_cpu_s"]:
                best[name] = row
    print("\n| simulator | customers/CPU s (whole run) | customers/CPU s (after warm-up) | mean wait (exact) "
          "| P(abandon) (exact) |\n|---|---:|---:|---:|---:|")
    for r in best.values():
        print(f"| {r['model']} ({r['engine']}) | {r['run_req_per_cpu_s']:,} | {r['req_per_cpu_s']:,} "
              f"| {r['wait_sim']:.5f} ({r['wait_exact']:.5f}) | {r['p_ab_sim']:.5f} ({r['p_ab_exact']:.5f}) |")
    print(f"# {_erlang_noise(customers)}")
    e, h = best["engine"], best["heapq"]
    print(f"# engine / heapq, customers per CPU s: whole run {e['run_req_per_cpu_s'] / h['run_req_per_cpu_s']:.2f}, "
          f"after warm-up {e['req_per_cpu_s'] / h['run_req_per_cpu_s']:.2f}", flush=True)
    return list(best.values())


# ---------------------------------------------------------------------------------------------
# compare: BEFORE vs AFTER trees, each case in a fresh interpreter, alternating
# ---------------------------------------------------------------------------------------------

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent


def _case_child(spec: dict) -> None:
    """Run one case (in a fresh interpreter started by compare) and print its JSON row."""
    tree = os.environ.get("BENCH_TREE")
    where = Path(fluidopt.__file__).resolve()
    if tree and not where.is_relative_to(Path(tree).resolve()):
        raise SystemExit(f"bench_sim: fluidopt was imported from {where}, not from the tree {tree}")
    try:
        from fluidopt.sim.backend import compiled_status
    except ImportError:  # a BEFORE tree from before backend selection moved out of sim/core.py
        from fluidopt.sim.core import compiled_status

    kind = spec["kind"]
    if kind == "fleet":
        row = run_fleet(spec["policy"], spec["service"], spec["gpus"], spec["requests"], spec["fill"])
    elif kind == "erlang":
        row = run_erlang_engine(spec["customers"])
    elif kind == "heapq":
        row = run_erlang_heapq(spec["customers"])
    elif kind == "memory":
        sc = fluidopt.default_scenario(gpus=500)
        horizon = spec["requests"] / 500.0
        res, wall, cpu = timed(simulate, sc, spec["policy"], horizon=horizon, warmup=0.1 * horizon, seed=1,
                               service=spec["service"], progress=False)
        k = res.totals["requests"]
        row = {"engine": res.meta.get("engine", "?"), "requests": k, "cpu_s": round(cpu, 2),
               "run_req_per_cpu_s": round(k / cpu), "req_per_cpu_s": round(k / cpu),
               "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
               "revenue_per_gpu": round(float(res.cluster["revenue_per_gpu"]), 6)}
    else:
        raise SystemExit(f"bench_sim: unknown case kind {kind!r}")
    row["fluidopt"] = str(where.parent)
    row["compiled_status"] = compiled_status()[1]
    print(json.dumps(row), flush=True)


def _child_env(tree: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("FLUIDOPT_ENGINE", "PYTHONPATH")}
    env["PYTHONPATH"] = str(tree)
    env["BENCH_TREE"] = str(tree)
    return env


def _run_child(spec: dict, tree: Path, script: Path = HERE) -> dict:
    out = subprocess.run([sys.executable, str(script), "_case", "--spec", json.dumps(spec)], env=_child_env(tree),
                         cwd="/tmp", capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"bench_sim compare: the case {spec} failed in {tree}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _preflight(trees: dict[str, Path], allow_python: bool) -> dict[str, dict]:
    """Which engine each tree will run (checked in a fresh interpreter, which also compiles its .pyc
    files); stop unless both are compiled."""
    code = ("import fluidopt, fluidopt.sim.api, json, hashlib, pathlib, importlib\n"
            "try:\n    b = importlib.import_module('fluidopt.sim.backend')\n"
            "except ImportError:\n    b = importlib.import_module('fluidopt.sim.core')  # trees before the rename\n"
            "ok, why = b.compiled_status(); h = pathlib.Path(b.__file__).parent; "
            "sha = hashlib.sha256((h / 'engine.py').read_bytes() + b'\\0' + (h / 'engine.pxd').read_bytes()); "
            "sha = sha.hexdigest(); "
            "print(json.dumps({'file': fluidopt.__file__, 'compiled': ok, 'why': why, 'sha': sha}))")
    status = {}
    for name, tree in trees.items():
        out = subprocess.run([sys.executable, "-c", code], env=_child_env(tree), cwd="/tmp", capture_output=True,
                             text=True)
        if out.returncode != 0:
            raise SystemExit(f"bench_sim compare: {name}: cannot import fluidopt from {tree}:\n{out.stderr[-2000:]}")
        st = json.loads(out.stdout.strip().splitlines()[-1])
        if not Path(st["file"]).resolve().is_relative_to(tree.resolve()):
            raise SystemExit(f"bench_sim compare: {name}: fluidopt imports from {st['file']}, not from {tree}")
        st["engine"] = "compiled" if st["compiled"] else "python"
        status[name] = st
        print(f"# {name}: {tree}: {st['engine']} engine ({st['why']}); engine.py+pxd sha256 {st['sha'][:12]}",
              flush=True)
        if not st["compiled"]:
            msg = f"bench_sim compare: the {name} tree {tree} would run the pure-Python engine: {st['why']}"
            if not allow_python:
                raise SystemExit(msg + "\n(build its compiled core, or pass --allow-python to measure it anyway)")
            print(f"# WARNING: {msg}; measuring it anyway (--allow-python)", flush=True)
    return status


def _snapshot(tree: Path, work: Path) -> Path:
    """A copy of ``tree``'s fluidopt package (compiled core included) in ``work``: the AFTER engine stays
    the same through the whole comparison even if the working tree is edited or rebuilt meanwhile."""
    import shutil

    snap = work / "after"
    shutil.copytree(tree / "fluidopt", snap / "fluidopt", ignore=shutil.ignore_patterns("__pycache__"))
    return snap


def compare_cases(a) -> list[dict]:
    """The cases of compare: (a) speed at n = 500, (b) the scaling curve, (c) M/M/100+M, memory."""
    cases = []
    want = set(a.only) if a.only else {"speed", "scaling", "erlang", "memory"}
    combos = [(p, s) for p in a.policies for s in a.services] if "speed" in want else []
    scal = [tuple(x.split(":")) for x in a.scaling_combos] if "scaling" in want else []
    big = [tuple(x.split(":")) for x in a.big_combos]
    for n in sorted(set(a.gpus if scal else []) | ({500} if combos else set())):
        for pol, svc in combos + [c for c in scal if c not in combos]:
            if not ((n == 500 and (pol, svc) in combos) or ((pol, svc) in scal and (n < a.big_n or (pol, svc) in big))):
                continue
            cases.append({"kind": "fleet", "policy": pol, "service": svc, "gpus": n, "requests": a.requests,
                          "fill": a.fill, "reps": a.big_reps if n >= a.big_n else a.reps,
                          "name": f"{pol} {svc} n={n:,}"})
    if "erlang" in want:
        cases.append({"kind": "erlang", "customers": a.customers, "reps": a.reps, "name": "M/M/100+M engine"})
        cases.append({"kind": "heapq", "customers": a.customers, "reps": a.reps, "name": "M/M/100+M plain heapq",
                      "once": True})
    if "memory" in want and a.memory_requests > 0:
        cases.append({"kind": "memory", "policy": "fi-wsp", "service": "markov", "requests": a.memory_requests,
                      "reps": 1, "name": f"memory fi-wsp markov n=500, {a.memory_requests:.3g} req"})
    return cases


def _fmt(x, spec=",.0f"):
    return "-" if x is None else format(x, spec)


def _ratio(x, y, spec=".2f"):
    return "-" if x is None or y is None or y == 0 else format(x / y, spec)


def compare(a) -> int:
    snaps: list[Path] = []
    try:
        return _compare(a, snaps)
    finally:
        import shutil

        for s in snaps:
            shutil.rmtree(s, ignore_errors=True)


def _compare(a, snaps: list) -> int:
    before, after = Path(a.before).resolve(), Path(a.after).resolve()
    if not (before / "fluidopt").is_dir():
        raise SystemExit(f"bench_sim compare: no fluidopt package in --before {before} "
                         "(make it with benchmarks/make_before_tree.sh)")
    import shutil
    import tempfile

    # the children run a copy of this script: editing it during a comparison changes nothing there
    work = Path(tempfile.mkdtemp(prefix="bench_sim_", dir="/tmp"))
    snaps.append(work)
    script = work / HERE.name
    shutil.copyfile(HERE, script)
    run_after = after
    if a.snapshot:
        run_after = _snapshot(after, work)
        print(f"# after: {after} copied to {run_after} (its fluidopt package, compiled core included)", flush=True)
    trees = {"before": before, "after": run_after}
    status = _preflight(trees, a.allow_python)
    cases = compare_cases(a)
    print(f"# {len(cases)} cases: " + "; ".join(c["name"] for c in cases), flush=True)
    t0 = time.perf_counter()
    runs: dict[str, dict[str, list[dict]]] = {c["name"]: {"before": [], "after": []} for c in cases}
    error = None
    warned: set = set()
    try:
        for rep in range(max(c["reps"] for c in cases)):
            for case in cases:
                if rep >= case["reps"]:
                    continue
                order = ("before", "after") if rep % 2 == 0 else ("after", "before")
                if case.get("once"):  # the same plain-Python loop for both: run it once per repetition
                    order = ("after",)
                spec = {k: v for k, v in case.items() if k not in ("reps", "name", "once")}
                for side in order:
                    row = _run_child(spec, trees[side], script)
                    if case["kind"] != "heapq" and row["engine"] != "compiled":
                        msg = f"{case['name']} ({side}): the {row['engine']} engine ran ({row['compiled_status']})"
                        if not a.allow_python:
                            raise SystemExit(f"bench_sim compare: {msg}")
                        if (case["name"], side) not in warned:
                            warned.add((case["name"], side))
                            print(f"# WARNING: {msg}", flush=True)
                    runs[case["name"]][side].append(row)
                    print(json.dumps({"case": case["name"], "side": side, "rep": rep,
                                      "elapsed_s": round(time.perf_counter() - t0, 1),
                                      **{k: v for k, v in row.items() if k not in ("fluidopt", "compiled_status")}}),
                          flush=True)
    except (SystemExit, KeyboardInterrupt) as exc:
        error = exc
        print(f"\n# STOPPED: {exc}\n# the tables below hold the runs made so far", flush=True)

    def best(rows, key, f=max):
        vals = [r[key] for r in rows if r.get(key) is not None]
        return f(vals) if vals else None

    def engines(rows):
        return "+".join(sorted({r["engine"] for r in rows})) or "-"

    def done(case):
        r = runs[case["name"]]
        return bool(r["after"]) and (bool(r["before"]) or case.get("once"))

    print(f"\n# before: {before} ({status['before']['engine']}, engine sha {status['before']['sha'][:12]}); "
          f"after: {after} ({status['after']['engine']}, engine sha {status['after']['sha'][:12]}); best of {a.reps} "
          f"(n >= {a.big_n:,}: {a.big_reps}), alternating; {time.perf_counter() - t0:.0f} s in all; "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    table = []
    fleet = [c for c in cases if c["kind"] == "fleet" and done(c)]
    n0 = min(a.gpus)
    if fleet:
        print(f"# fleet cases: the paper instance, {a.fill:g} simulated s to fill, then ~{a.requests:,.0f} requests; "
              "req/CPU s = requests per CPU s after the fill (steady state), run = the whole run (setup and fill "
              f"included); vs n={n0}: req/CPU s over the same policy and service's at n = {n0}\n")
        print(f"| case | engine b/a | before req/CPU s | after req/CPU s | after/before | before vs n={n0} "
              f"| after vs n={n0} | before run req/CPU s | after run req/CPU s | run after/before | setup CPU s b/a "
              "| same path |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    base: dict = {}
    for case in fleet:
        rb, ra = runs[case["name"]]["before"], runs[case["name"]]["after"]
        b, aa = best(rb, "req_per_cpu_s"), best(ra, "req_per_cpu_s")
        br, ar = best(rb, "run_req_per_cpu_s"), best(ra, "run_req_per_cpu_s")
        key = (case["policy"], case["service"])
        if case["gpus"] == n0:
            base[key] = (b, aa)
        vb = _ratio(b, base[key][0]) if key in base else "-"
        va = _ratio(aa, base[key][1]) if key in base else "-"
        same = all(rb[0][k] == ra[0][k] for k in ("requests", "completed", "revenue_per_gpu", "events_per_req"))
        print(f"| {case['name']} | {engines(rb)}/{engines(ra)} | {_fmt(b)} | {_fmt(aa)} | {_ratio(aa, b)} | {vb} "
              f"| {va} | {_fmt(br)} | {_fmt(ar)} | {_ratio(ar, br)} | {best(rb, 'setup_cpu_s', min):.2f}/"
              f"{best(ra, 'setup_cpu_s', min):.2f} | {'yes' if same else 'no'} |")
        table.append({"case": case["name"], "before": b, "after": aa, "ratio": aa / b, "run_before": br,
                      "run_after": ar, "reps": [len(rb), len(ra)]})
    erl = [c for c in cases if c["kind"] == "erlang" and done(c)]
    hq = [c for c in cases if c["kind"] == "heapq" and done(c)]
    if erl:
        h = runs["M/M/100+M plain heapq"]["after"]
        hb = best(h, "run_req_per_cpu_s")
        print(f"\n# M/M/100+M (lam 90, mu 1, theta 0.5; {a.customers:,} customers, 20 s warm-up), customers per CPU s "
              "(run: whole run; steady: after the warm-up); the heapq loop is plain Python, the same for both\n")
        print("| case | before cust/CPU s (run / steady) | after cust/CPU s (run / steady) | after/before (run) "
              "| before/heapq | after/heapq | mean wait b / a (exact) | P(abandon) b / a (exact) |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        rb, ra = runs["M/M/100+M engine"]["before"], runs["M/M/100+M engine"]["after"]
        b1, b2 = best(rb, "run_req_per_cpu_s"), best(rb, "req_per_cpu_s")
        a1, a2 = best(ra, "run_req_per_cpu_s"), best(ra, "req_per_cpu_s")
        print(f"| engine | {_fmt(b1)} / {_fmt(b2)} | {_fmt(a1)} / {_fmt(a2)} | {_ratio(a1, b1)} | {_ratio(b1, hb)} "
              f"| {_ratio(a1, hb)} | {rb[0]['wait_sim']:.5f} / {ra[0]['wait_sim']:.5f} ({ra[0]['wait_exact']:.5f}) "
              f"| {rb[0]['p_ab_sim']:.5f} / {ra[0]['p_ab_sim']:.5f} ({ra[0]['p_ab_exact']:.5f}) |")
        if hq:
            print(f"| plain heapq loop | {_fmt(hb)} | {_fmt(hb)} | - | 1 | 1 | {h[0]['wait_sim']:.5f} "
                  f"({h[0]['wait_exact']:.5f}) | {h[0]['p_ab_sim']:.5f} ({h[0]['p_ab_exact']:.5f}) |")
        print(f"# {_erlang_noise(a.customers)}")
        table.append({"case": "M/M/100+M engine", "before": b1, "after": a1, "ratio": a1 / b1, "heapq": hb})
    for case in [c for c in cases if c["kind"] == "memory" and done(c)]:
        rb, ra = runs[case["name"]]["before"][0], runs[case["name"]]["after"][0]
        print(f"\n| {case['name']} | before | after | after/before |\n|---|---:|---:|---:|")
        print(f"| peak RSS MB | {rb['peak_rss_mb']:,} | {ra['peak_rss_mb']:,} "
              f"| {_ratio(ra['peak_rss_mb'], rb['peak_rss_mb'])} |")
        print(f"| req/CPU s (run) | {rb['run_req_per_cpu_s']:,} | {ra['run_req_per_cpu_s']:,} "
              f"| {_ratio(ra['run_req_per_cpu_s'], rb['run_req_per_cpu_s'])} |")
        table.append({"case": case["name"], "before": rb["peak_rss_mb"], "after": ra["peak_rss_mb"],
                      "ratio": ra["peak_rss_mb"] / rb["peak_rss_mb"]})
    if a.json:
        Path(a.json).write_text(json.dumps({"before": str(before), "after": str(after), "status": status,
                                            "runs": runs, "table": table, "error": str(error) if error else None},
                                           indent=1, default=str))
    return 1 if error else 0


# the robust variants and the plain controller each is measured against (docs/robust-control.md "Cost")
_PLAIN_OF = {"backpressure-gate-and-route": "gate-and-route", "staffed-prioritize-and-route": "prioritize-and-route",
             "backpressure-sli-gate-and-route": "sli-gate-and-route"}


def controller_cost(a) -> int:
    """CPU us per simulated request (steady state, run_fleet) of each policy, and its ratio to
    gate-and-route's and to its plain counterpart's, same service; every run in a fresh interpreter of
    this tree, the policies alternating in order, best of ``--reps``; with ``--python-handlers`` each
    policy is also run with ``FLUIDOPT_FAST_CONTROLLERS=0`` (the Python handlers on the compiled engine)."""
    pols = list(dict.fromkeys(["gate-and-route", *a.policies]))
    modes = ["fast", "python"] if a.python_handlers else ["fast"]
    keys = [(p, s, m) for s in a.services for p in pols for m in modes]
    runs: dict = {k: [] for k in keys}
    t0 = time.perf_counter()
    for rep in range(a.reps):
        for k in (keys if rep % 2 == 0 else keys[::-1]):
            pol, svc, mode = k
            old = os.environ.get("FLUIDOPT_FAST_CONTROLLERS")
            os.environ["FLUIDOPT_FAST_CONTROLLERS"] = "1" if mode == "fast" else "0"
            try:
                row = _run_child({"kind": "fleet", "policy": pol, "service": svc, "gpus": a.gpus[0],
                                  "requests": a.requests, "fill": a.fill}, REPO)
            finally:
                if old is None:
                    os.environ.pop("FLUIDOPT_FAST_CONTROLLERS", None)
                else:
                    os.environ["FLUIDOPT_FAST_CONTROLLERS"] = old
            if row["engine"] != "compiled":
                raise SystemExit(f"bench_sim controller-cost: {pol} {svc}: the {row['engine']} engine ran")
            runs[k].append(row)
            print(json.dumps({"policy": pol, "service": svc, "handlers": mode, "rep": rep,
                              "elapsed_s": round(time.perf_counter() - t0, 1),
                              **{x: v for x, v in row.items() if x not in ("fluidopt", "compiled_status")}}), flush=True)
    us = {k: 1e6 / max(r["req_per_cpu_s"] for r in v) for k, v in runs.items()}
    print(f"\n# n = {a.gpus[0]:,}, {a.fill:g} s fill, then ~{a.requests:,.0f} requests; CPU us per request in the "
          f"steady state, best of {a.reps}, alternating; fast = compiled fast path, python = "
          f"FLUIDOPT_FAST_CONTROLLERS=0; load {os.getloadavg()[0]:.1f}\n")
    print("| policy | service | handlers | CPU us / request | ratio to gate-and-route (fast) | ratio to its plain "
          "counterpart (same handlers) | revenue / GPU / s |\n|---|---|---|---:|---:|---:|---:|")
    for pol, svc, mode in keys:
        plain = _PLAIN_OF.get(pol)
        ref = us.get((plain, svc, mode)) if plain else None
        print(f"| {pol} | {svc} | {mode} | {us[(pol, svc, mode)]:.2f} | "
              f"{us[(pol, svc, mode)] / us[('gate-and-route', svc, 'fast')]:.2f} | "
              f"{'-' if ref is None else format(us[(pol, svc, mode)] / ref, '.2f')} | "
              f"{runs[(pol, svc, mode)][0]['revenue_per_gpu']:.3f} |", flush=True)
    return 0


def law_cost(a) -> int:
    """CPU us per simulated request (steady state, run_stepped) of the tokens-mode kernel on the paper instance
    with the GPU's straight line, with that same line given as a ``timemodel`` (the law's clock on an
    unchanged physics) and with a law that uses every term (quadratic prefill, per-token and per-request
    decode terms, a batch-size switch); the three alternate in this process, best of ``--reps``."""
    from dataclasses import replace

    from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw

    sc = fluidopt.default_scenario(gpus=a.gpus[0])
    g = sc.gpu
    laws = {"straight line": None, "straight line as a law": IterationLaw.straight_line(g.alpha, g.beta, g.tau_solo),
            "full law": IterationLaw(PrefillLaw(g.alpha, 0.8 * g.beta, 1e-8),
                                     DecodeLaw((0.8 * g.tau_solo, 2e-7, 1e-4), (0.7 * g.tau_solo, 3e-7, 2e-4), 8))}
    keys = [(pol, k) for pol in a.policies for k in laws]
    runs: dict = {k: [] for k in keys}
    for rep in range(a.reps):
        for pol, k in (keys if rep % 2 == 0 else keys[::-1]):
            s = replace(sc, gpu=replace(g, timemodel=laws[k]))
            row = run_stepped(s, pol, service="tokens", requests=a.requests, fill=a.fill)
            row.pop("_res")
            if row["engine"] != "compiled":
                raise SystemExit(f"bench_sim law-cost: the {row['engine']} engine ran")
            runs[(pol, k)].append(row)
            print(json.dumps({"policy": pol, "law": k, "rep": rep, **row}), flush=True)
    us = {k: 1e6 / max(r["req_per_cpu_s"] for r in v) for k, v in runs.items()}
    print(f"\n# tokens mode, n = {a.gpus[0]:,}, {a.fill:g} s fill, then ~{a.requests:,.0f} requests; CPU us per "
          f"request in the steady state, best of {a.reps}, alternating; load {os.getloadavg()[0]:.1f}\n")
    print("| policy | iteration law | CPU us / request | ratio to the straight line | revenue / GPU / s |\n"
          "|---|---|---:|---:|---:|")
    for pol, k in keys:
        print(f"| {pol} | {k} | {us[(pol, k)]:.2f} | {us[(pol, k)] / us[(pol, 'straight line')]:.2f} | "
              f"{runs[(pol, k)][0]['revenue_per_gpu']:.3f} |", flush=True)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("speed", "scaling", "memory", "erlang", "erlang-speed", "compare", "all",
                                    "controller-cost", "law-cost", "race-latency", "_memory_child", "_case"))
    p.add_argument("--horizon", type=float, default=600.0, help="speed: simulated seconds (n = 500: 500 req/s)")
    p.add_argument("--policies", nargs="+", default=["fi-wsp", "gate-and-route", "backpressure-gate-and-route"])
    p.add_argument("--services", nargs="+", default=["markov", "tokens"])
    p.add_argument("--requests", type=float, default=None,
                   help="memory: requests in the run (default 5e6); scaling, compare: requests after the fill "
                        "(default 2e5)")
    p.add_argument("--fill", type=float, default=60.0,
                   help="scaling, compare: simulated seconds before the measured requests (the system fills)")
    p.add_argument("--gpus", type=int, nargs="+", default=[50, 500, 5000, 50000], help="scaling, compare: n")
    p.add_argument("--scaling-combos", nargs="+", default=["fi-wsp:markov", "gate-and-route:markov", "fi-wsp:tokens"],
                   help="scaling, compare: policy:service pairs of the scaling curve")
    p.add_argument("--service", default="markov")
    p.add_argument("--policy", default="fi-wsp")
    p.add_argument("--customers", type=int, default=None,
                   help="erlang: customers per run (default 1M); erlang-speed, compare: (default 300k)")
    p.add_argument("--seeds", type=int, default=40)
    p.add_argument("--long-run", type=int, default=17_000_000, help="erlang: customers of each long M/M/100 run")
    p.add_argument("--long-seeds", type=int, default=2, help="erlang: how many long M/M/100 runs")
    g = p.add_argument_group("compare")
    g.add_argument("--before", default="/tmp/fluidopt_before", help="the BEFORE tree (built in place)")
    g.add_argument("--after", default=str(REPO), help="the AFTER tree (default: this repository)")
    g.add_argument("--reps", type=int, default=3, help="repetitions of each case and tree (best of)")
    g.add_argument("--big-n", type=int, default=50000, help="cases with n >= this many GPUs run --big-reps times")
    g.add_argument("--big-reps", type=int, default=1)
    g.add_argument("--big-combos", nargs="+", default=["fi-wsp:markov", "gate-and-route:markov"],
                   help="the policy:service pairs of the scaling curve run at n >= --big-n")
    g.add_argument("--no-snapshot", dest="snapshot", action="store_false",
                   help="run the AFTER tree in place (default: a copy of its fluidopt package, made at the start)")
    g.add_argument("--memory-requests", type=float, default=0.0,
                   help="also the peak RSS of a run of this many requests (fi-wsp markov, n = 500; 0: skip)")
    g.add_argument("--only", nargs="+", choices=("speed", "scaling", "erlang", "memory"), help="a subset of cases")
    g.add_argument("--allow-python", action="store_true", help="measure a tree whose compiled core is missing/stale")
    g.add_argument("--json", help="also write every run to this JSON file")
    g = p.add_argument_group("controller-cost")
    g.add_argument("--python-handlers", action="store_true",
                   help="also run every policy with its Python handlers (FLUIDOPT_FAST_CONTROLLERS=0)")
    p.add_argument("--spec", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.what == "_memory_child":
        _memory_child(a.requests if a.requests is not None else 5e6, a.service, a.policy)
        return 0
    if a.what == "_case":
        _case_child(json.loads(a.spec))
        return 0
    print(f"# fluidopt {fluidopt.__version__} ({Path(fluidopt.__file__).parent}), Python {platform.python_version()}, "
          f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}", flush=True)
    if a.what == "controller-cost":
        a.requests = 2e5 if a.requests is None else a.requests
        if a.policies == p.get_default("policies"):
            a.policies = ["gate-and-route", *_PLAIN_OF.values(), *_PLAIN_OF]
        if a.gpus == p.get_default("gpus"):
            a.gpus = [500]
        return controller_cost(a)
    if a.what == "law-cost":
        a.requests = 2e5 if a.requests is None else a.requests
        if a.policies == p.get_default("policies"):
            a.policies = ["gate-and-route", "round-robin", "round-robin-chunked"]
        if a.gpus == p.get_default("gpus"):
            a.gpus = [500]
        return law_cost(a)
    if a.what == "compare":
        a.requests = 2e5 if a.requests is None else a.requests
        a.customers = 300_000 if a.customers is None else a.customers
        return compare(a)
    if a.what in ("speed", "all"):
        bench_speed(a.horizon, a.policies, a.services)
    if a.what in ("scaling", "all"):
        bench_scaling(2e5 if a.requests is None or a.what == "all" else a.requests, a.fill, a.gpus,
                      [tuple(x.split(":")) for x in a.scaling_combos])
    if a.what in ("memory", "all"):
        bench_memory(5e6 if a.requests is None or a.what == "all" else a.requests, a.service, a.policy)
    if a.what == "race-latency":
        bench_race_latency([50, 50000] if a.gpus == p.get_default("gpus") else a.gpus)
    if a.what == "erlang-speed":
        bench_erlang_speed(300_000 if a.customers is None else a.customers)
    if a.what in ("erlang", "all"):
        bench_erlang(1_000_000 if a.customers is None else a.customers, a.seeds, a.long_run, a.long_seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
