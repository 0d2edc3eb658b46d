"""Head-to-head of routing policies with per-instance prefix caches on the Mooncake trace (issue 42).

    python benchmarks/prefix_headtohead.py [--load 0.75] [--kv both|unlimited|80gb] [--boot 1000] [--out OUT.json]
                                           [--trace PATH]   # default ../shared/data/mooncake-traces/conversation_trace.jsonl
                                           [--only ROW,ROW]  # these rows (and least-requests) only

Replays ../shared/data/mooncake-traces/conversation_trace.jsonl (12,031 requests, 512-token block hashes) on
examples/scenarios/mooncake-conversation.toml with 8 GPUs, tokens mode, the prefix cache on, time compressed
(``speedup``) so that the trace's fluid load (``fluidopt.workloads.traces.fleet_load``, cache-blind, what
``simulate --json`` reports as ``fluid_load``) is ``--load``; each policy replays the whole trace once and
runs until every request is resolved. KV capacity: unlimited, and an 80 GB GPU's, 0.9 x 80e9 bytes less
Qwen3-8B's fp16 weights (8.2e9 parameters) over its KV bytes per token (36 layers, 8 KV heads, head dim
128, fp16: 147,456 B): 377,000 tokens (the scenario's GPU law is the paper's Qwen-8B fit).

Per policy: mean and p99 TTFT, mean and p99 E2E (seconds, completed requests), the token hit ratio (cached
over prompt tokens of the requests whose prefill completed) beside the ideal (one global cache of
unlimited capacity, fluidopt.workloads.prefix.hit_ratio's ``ideal`` with the scenario GPU's time law), and
revenue against the LP bound: the revenue of the requests that completed (bundled prices: every prompt and
output token) per GPU-second of the trace's span, over the bundled fluid LP's R* for the trace's observed
rate and mean lengths (cache-blind: the bound of a fleet that prefills every token).

Confidence intervals. The replay is deterministic and so are most policies (round robin, the balancers,
the cache-aware routers, ``dynamo-kv`` at its default temperature 0: ties to the least loaded, then the lowest
index), so seeds would not vary them. The CIs are a paired
block bootstrap over time: the trace is cut into ``WINDOWS`` windows of equal length by arrival time; a
replicate draws that many windows with replacement, the same draw for every policy, and computes each
statistic on the pooled requests of the drawn windows, for the policy and for least-load
(``least-requests``); the 95% interval is the 2.5-97.5 percentiles of the relative difference
policy / least-load - 1 over ``--boot`` replicates (seeded). The gate-and-route family draws random idle
GPUs; those runs use seed 0.

The cache-aware gate-and-route variants run with their defaults (lookahead 8, cache-blind LP targets),
with lookahead 1 (FCFS within the class: only the choice among idle GPUs is cache-aware), and with LP
targets from a hit ratio h: ``h=own``, the hit ratio the same policy kept in its default row (a pilot
run), and ``h=sglang``, the ratio SGLang's rule keeps on this trace by the model of fluidopt.workloads.prefix
(8 instances, unlimited caches, the GPU's time law), what ``--from-trace --cache-rule sglang`` gives. The
instance policies run prefill-first without chunking; their ``-chunked`` rows run chunked prefill, the
time law (C tokens per iteration, each iteration paying the intercept alpha) that gate-and-route runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's fluidopt, not another checkout's editable install
TRACE = ROOT.parent / "shared" / "data" / "mooncake-traces" / "conversation_trace.jsonl"
SCENARIO = ROOT / "examples" / "scenarios" / "mooncake-conversation.toml"
GPUS = 8
WINDOWS = 10


def kv_tokens(gb: float) -> int:
    """KV tokens per GPU of a ``gb`` GB GPU: 0.9 of its memory less Qwen3-8B's fp16 weights (8.2e9 parameters),
    over 147,456 bytes of KV per token (module docstring)."""
    return int((0.9 * gb * 1e9 - 8.2e9 * 2) / (2 * 36 * 8 * 128 * 2))


KV_80GB = kv_tokens(80)
KV_SETTINGS = {"both": [("unlimited", None), ("80gb", KV_80GB)], "unlimited": [("unlimited", None)],
               "80gb": [("80gb", KV_80GB)]}  # --kv: (label, KV tokens per GPU or None) to run
BASELINE = "least-requests"
# (row label, registered policy, options); "H" as an option value: the hit ratio the same policy kept in its
# row without h (a pilot run: the h this very routing reaches, not another rule's)
POLICIES = [
    ("round-robin", "round-robin", {}), ("least-requests", "least-requests", {}), ("jsq", "jsq", {}),
    ("min-min", "min-min", {}), ("sglang", "sglang", {}), ("llm-d", "llm-d", {}), ("dynamo-kv", "dynamo-kv", {}),
    ("mooncake", "mooncake", {}),
    ("consistent-hash", "consistent-hash", {}), ("consistent-hash-bounded", "consistent-hash-bounded", {}),
    # the instance policies with chunked prefill: the time law gate-and-route runs (chunk C per iteration)
    ("least-requests-chunked", "least-requests-chunked", {}), ("jsq-chunked", "jsq-chunked", {}),
    ("sglang-chunked", "sglang-chunked", {}), ("llm-d-chunked", "llm-d-chunked", {}),
    ("dynamo-kv-chunked", "dynamo-kv-chunked", {}), ("mooncake-chunked", "mooncake-chunked", {}),
    ("gate-and-route", "gate-and-route", {}), ("backpressure-gate-and-route", "backpressure-gate-and-route", {}),
    ("gate-and-route-prefix", "gate-and-route-prefix", {}),
    ("backpressure-gate-and-route-prefix", "backpressure-gate-and-route-prefix", {}),
    ("gate-and-route-prefix lookahead=1", "gate-and-route-prefix", {"lookahead": 1}),
    ("backpressure-gate-and-route-prefix lookahead=1", "backpressure-gate-and-route-prefix", {"lookahead": 1}),
    ("gate-and-route-prefix h=own", "gate-and-route-prefix", {"hit_ratio": "H"}),
    ("backpressure-gate-and-route-prefix h=own", "backpressure-gate-and-route-prefix", {"hit_ratio": "H"}),
    ("gate-and-route-prefix h=sglang", "gate-and-route-prefix", {"hit_ratio": "SGLANG"}),
    ("backpressure-gate-and-route-prefix h=sglang", "backpressure-gate-and-route-prefix", {"hit_ratio": "SGLANG"}),
]
DRAIN = 600.0  # s after the last arrival: every request resolves (the longest E2E is under 100 s)


def _trace_file(script: str, path: str) -> Path | None:
    """``--trace`` as a Path, or None after one line on stderr when there is no such file."""
    trace = Path(path)
    if trace.is_file():
        return trace
    print(f"{script}: --trace {str(trace)!r}: no such file (the Mooncake trace lives in ../shared/data)",
          file=sys.stderr)
    return None


def _replay_at_load(trace: Path, load: float, base):
    """(speedup, fluid load at it, scenario, workload): the trace replayed at fluid load ``load`` on ``base``'s
    fleet. The load is linear in the arrival rate, so one replay at speedup 1 tells the speedup."""
    from fluidopt.workloads.traces import fleet_load, replay

    _, wl = replay(trace, base, speedup=1.0)
    k = load / fleet_load(wl, base)
    sc, wl = replay(trace, base, speedup=k)
    return k, fleet_load(wl, base), sc, wl


def _run(sc, wl, name: str, opts: dict, tmp: Path) -> tuple[pd.DataFrame, float]:
    from fluidopt.sim.api import simulate

    horizon = float(wl.frame["time"].max()) + DRAIN
    path = tmp / "records.csv"
    t0 = time.perf_counter()
    simulate(sc, name, horizon=horizon, warmup=0.0, service="tokens", workload=wl, records=path, progress=False,
             seed=0, controller_options=opts)
    return pd.read_csv(path), time.perf_counter() - t0


def _prefilled(rec: pd.DataFrame) -> pd.DataFrame:
    """The requests whose prompt was prefilled (a first token and a cached count): the hit ratio's base."""
    return rec[rec.cached_prompt.notna() & rec.ttft.notna()] if "ttft" in rec else rec


def _stats(rec: pd.DataFrame, span: float, prices: tuple[float, float]) -> dict:
    done = rec[rec.outcome == "completed"]
    pre = _prefilled(rec)
    rev = float((prices[0] * done.prompt + prices[1] * done.output).sum()) / (GPUS * span)
    return {"ttft_mean": float(done.ttft.mean()), "ttft_p99": float(np.percentile(done.ttft, 99)),
            "e2e_mean": float(done.e2e.mean()), "e2e_p99": float(np.percentile(done.e2e, 99)),
            "hit_ratio": float(pre.cached_prompt.sum() / pre.prompt.sum()), "revenue_per_gpu": rev,
            "completed": int(len(done)), "requests": int(len(rec))}


def _rel(r: dict, base: dict, ci: dict, m: str) -> str:
    """``policy / least-load - 1`` of statistic ``m``, in percent, with its bootstrap interval."""
    lo, hi = ci[m]

    def pct(x: float) -> float:
        return round(100 * x, 1) + 0.0  # no "-0.0": equal revenues differ by rounding only

    return f"{pct(r[m] / base[m] - 1):+.1f}% [{pct(lo):+.1f}, {pct(hi):+.1f}]"


def _window(rec: pd.DataFrame, edges: np.ndarray) -> np.ndarray:
    return np.clip(np.searchsorted(edges, rec.arrival.to_numpy(), side="right") - 1, 0, WINDOWS - 1)


def _boot(recs: dict, span: float, n_boot: int, seed: int = 42, prices: tuple[float, float] | None = None) -> dict:
    """Paired block bootstrap over arrival windows: 95% CI of stat(policy) / stat(least-load) - 1 for the TTFT and
    E2E statistics and, with ``prices``, the revenue of completed requests; of stat(policy) - stat(least-load)
    for the token hit ratio (a difference of fractions)."""
    rng = np.random.default_rng(seed)
    edges = np.linspace(0.0, span, WINDOWS + 1)
    per, sums = {}, {}
    for p, rec in recs.items():
        done = rec[rec.outcome == "completed"]
        w = _window(done, edges)
        per[p] = [(done.ttft.to_numpy()[w == k], done.e2e.to_numpy()[w == k]) for k in range(WINDOWS)]
        pre = _prefilled(rec)
        wp = _window(pre, edges)
        cached = np.bincount(wp, pre.cached_prompt.to_numpy(float), WINDOWS)
        prompt = np.bincount(wp, pre.prompt.to_numpy(float), WINDOWS)
        rev = np.bincount(w, (prices[0] * done.prompt + prices[1] * done.output).to_numpy(float), WINDOWS) \
            if prices else np.zeros(WINDOWS)
        sums[p] = (cached, prompt, rev)
    draws = rng.integers(0, WINDOWS, size=(n_boot, WINDOWS))
    ratio = ("ttft_mean", "ttft_p99", "e2e_mean", "e2e_p99") + (("revenue",) if prices else ())
    out = {p: {m: [] for m in ratio + ("hit_ratio",)} for p in recs}
    for d in draws:
        val = {}
        for p in recs:
            t = np.concatenate([per[p][k][0] for k in d])
            e = np.concatenate([per[p][k][1] for k in d])
            cached, prompt, rev = sums[p]
            val[p] = {"ttft_mean": t.mean(), "ttft_p99": np.percentile(t, 99), "e2e_mean": e.mean(),
                      "e2e_p99": np.percentile(e, 99), "revenue": rev[d].sum(),
                      "hit_ratio": cached[d].sum() / prompt[d].sum()}
        for p in recs:
            for m in ratio:
                out[p][m].append(val[p][m] / val[BASELINE][m] - 1.0)
            out[p]["hit_ratio"].append(val[p]["hit_ratio"] - val[BASELINE]["hit_ratio"])
    return {p: {m: [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))] for m, v in ms.items()}
            for p, ms in out.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--load", type=float, default=0.75)
    ap.add_argument("--kv", choices=("both", "unlimited", "80gb"), default="both")
    ap.add_argument("--boot", type=int, default=1000)
    ap.add_argument("--out", default=None)
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--only", default=None)
    args = ap.parse_args(argv)
    policies = POLICIES
    if args.only:
        want = {BASELINE, *(x.strip() for x in args.only.split(","))}
        unknown = sorted(want - {p for p, _, _ in POLICIES})
        if unknown:
            print(f"prefix_headtohead: --only {unknown[0]!r}: no such row; rows: {', '.join(p for p, _, _ in POLICIES)}",
                  file=sys.stderr)
            return 2
        want |= {p.split(" ")[0] for p, _, o in POLICIES if p in want and "H" in o.values()}  # h=own needs its pilot
        policies = [row for row in POLICIES if row[0] in want]
    trace = _trace_file("prefix_headtohead", args.trace)
    if trace is None:
        return 2
    warnings.simplefilter("ignore")
    from fluidopt.fluid.lp import solve_fluid
    from fluidopt.scenario import load_scenario
    from fluidopt.workloads.prefix import hit_ratio
    from fluidopt.workloads.traces import classes_from_trace

    t_start = time.perf_counter()
    base = replace(load_scenario(SCENARIO), gpus=GPUS)
    k, load, base, wl = _replay_at_load(trace, args.load, base)
    span = float(wl.frame["time"].max())
    g = base.gpu
    law = dict(prefill_time_per_token=g.tau_mix / g.chunk, decode_time_per_token=g.tau_mix)
    t0 = time.perf_counter()
    h = min(hit_ratio(wl, "sglang", GPUS, None, **law).hit_ratio, 0.999)
    ideal = hit_ratio(wl, "round-robin", 1, None, **law).ideal
    t_h = time.perf_counter() - t0
    lp_sc = replace(base, classes=tuple(classes_from_trace(wl)))
    bound = float(solve_fluid(lp_sc, "bundled").revenue_per_gpu)
    prices = (float(base.prefill_price), float(base.decode_price))
    print(f"Mooncake conversation trace: {wl.n_requests} requests over {span:.0f} s, speedup {k:.4f}, fluid load "
          f"{load:.4f}, {GPUS} GPUs; h(sglang model) = {h:.4f}, ideal (one global cache) = {ideal:.4f} "
          f"[{t_h:.1f} s]; LP bound R* = {bound:.2f} revenue/GPU/s")
    result = {"speedup": k, "fluid_load": load, "h": h, "ideal_hit_ratio": ideal, "lp_bound": bound, "kv": {}}
    kvs = KV_SETTINGS[args.kv]
    import tempfile

    for label, cap in kvs:
        sc = replace(base, gpu=replace(base.gpu, kv_capacity=None if cap is None else float(cap)))
        recs, rows = {}, {}
        with tempfile.TemporaryDirectory() as tmp:
            for p, name, opts in policies:
                plain = p.split(" ")[0]
                opts = {k: (rows[plain]["hit_ratio"] if v == "H" else h if v == "SGLANG" else v)
                        for k, v in opts.items()}
                rec, sec = _run(sc, wl, name, opts, Path(tmp))
                recs[p] = rec
                rows[p] = {**_stats(rec, span, prices), "wall_s": sec}
                rows[p]["revenue_vs_bound"] = rows[p]["revenue_per_gpu"] / bound
                rows[p]["options"] = opts
        ci = _boot(recs, span, args.boot, prices=prices)
        kvname = "unlimited" if cap is None else f"{cap:,} tokens"
        print(f"\nKV {kvname}; CIs: paired block bootstrap over {WINDOWS} arrival windows, {args.boot} replicates, "
              f"relative to {BASELINE}")
        print("| policy | hit ratio | vs least-load (points) | mean TTFT (s) | vs least-load | p99 TTFT (s) | vs least-load | "
              "mean E2E (s) | vs least-load | p99 E2E (s) | vs least-load | revenue / bound | vs least-load | completed |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for p, _, _ in policies:
            r, c = rows[p], ci[p]

            h_opt = f" ({r['options']['hit_ratio']:.4f})" if "hit_ratio" in r["options"] else ""
            dh, (hl, hh) = r["hit_ratio"] - rows[BASELINE]["hit_ratio"], c["hit_ratio"]
            rv = dict(r, revenue=r["revenue_per_gpu"])
            print(f"| `{p}`{h_opt} | {r['hit_ratio']:.4f} | {dh:+.3f} [{hl:+.3f}, {hh:+.3f}] | {r['ttft_mean']:.3f} | {_rel(r, rows[BASELINE], c, 'ttft_mean')} | {r['ttft_p99']:.2f} | "
                  f"{_rel(r, rows[BASELINE], c, 'ttft_p99')} | {r['e2e_mean']:.2f} | {_rel(r, rows[BASELINE], c, 'e2e_mean')} | {r['e2e_p99']:.2f} | "
                  f"{_rel(r, rows[BASELINE], c, 'e2e_p99')} | {r['revenue_vs_bound']:.4f} | "
                  f"{_rel(rv, dict(rows[BASELINE], revenue=rows[BASELINE]['revenue_per_gpu']), c, 'revenue')} | {r['completed']} |")
        result["kv"][label] = {"capacity_tokens": cap, "rows": rows, "ci": ci}
    total = time.perf_counter() - t_start
    print(f"\ntotal {total:.0f} s wall")
    result["wall_seconds"] = total
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2, allow_nan=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
