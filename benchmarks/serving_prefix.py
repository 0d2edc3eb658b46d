"""Benchmark: SGLang's cache-aware router against round robin on a Mooncake slice in the serving loop, with
the stand-ins' prefix cache (docs/serving.md, "The prefix cache in the loop").

    python benchmarks/serving_prefix.py [--requests 150] [--min-turns 5] [--engines 4] [--load 0.7] [--speed 2] [--reps 3]
                                        [--routers sglang:cache_aware,sglang:round_robin] [--engine paper]
                                        [--trace PATH] [--out DIR]

The slice: the Mooncake conversation trace's first --requests requests (block hashes and lengths as
shipped) of the sessions with at least --min-turns requests (a session: the requests sharing their
second block id; the first is the system prompt every request shares), their times scaled so that the
slice's cache-blind fluid load on --engines GPUs of qwen-8b-a100 is --load. (A run of consecutive
requests reuses little: a session's turns are minutes apart, so the first 150 requests of the trace
have an ideal hit ratio of 0.046; this slice's is 0.56, round robin over 4 instances 0.18.) Each router runs --reps times (`fluidopt loop`'s run_loop, in this process),
the stand-ins with their prefix cache in blocks of the trace's 512 tokens; printed: a markdown table of
mean +- the 95% t-interval half-width over repetitions of the measured hit ratio, TTFT mean / p99 and
E2E mean (ms, the model's clock), with the simulator's hit ratio and TTFT / E2E mean for the same slice,
fleet and policy (cache_aware: the simulator's `sglang`; round_robin: `round-robin`; `-chunked` with the
paper engine). DIR gets the slice, every run's JSON and table.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from serving_table import ci

from fluidopt.serving.loop import fluid_load, run_loop
from fluidopt.serving.replayer import read_trace

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = Path(os.environ.get("FLUIDOPT_SHARED_DATA", ROOT.parent / "shared" / "data")) / \
    "mooncake-traces" / "conversation_trace.jsonl"
METRICS = (("hit_ratio", "hit ratio"), ("ttft_mean_s", "TTFT mean (ms)"), ("ttft_p99_s", "TTFT p99 (ms)"),
           ("e2e_mean_s", "E2E mean (ms)"))


def write_slice(src: Path, dst: Path, requests: int, engines: int, load: float, min_turns: int) -> float:
    """The first ``requests`` lines of ``src`` in sessions of ``min_turns`` or more, times scaled to fluid
    load ``load`` (starting at 0); the scale."""
    with open(src) as f:
        rows = [json.loads(x) for x in f if x.strip()]
    key = [r["hash_ids"][1] if len(r["hash_ids"]) > 1 else None for r in rows]
    turns: dict = {}
    for k in key:
        turns[k] = turns.get(k, 0) + 1
    lines = [r for r, k in zip(rows, key) if k is not None and turns[k] >= min_turns][:requests]
    t0 = lines[0]["timestamp"]
    lines = [{**x, "timestamp": x["timestamp"] - t0} for x in lines]
    tmp = dst.with_suffix(".raw.jsonl")
    tmp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    stretch = fluid_load(read_trace(tmp), engines, "qwen-8b-a100") / load
    tmp.unlink()
    # the trace's times are whole seconds (51 of this slice's 149 gaps are 0): requests sent at one instant
    # reach the router in any order, and a round robin then differs from the simulator's (arrival order);
    # the k-th of a tie goes k x 100 ms of model time later (50 ms of wall time at speed 2), so both see one
    # order
    out, last, k = [], None, 0
    for x in lines:
        k = k + 1 if x["timestamp"] == last else 0
        last = x["timestamp"]
        out.append({**x, "timestamp": x["timestamp"] * stretch + 100.0 * k})
    dst.write_text("".join(json.dumps(x) + "\n" for x in out))
    return stretch


def table(results: dict[str, list[dict]]) -> str:
    head = ["router", "engine", "reps", "failed"] + [t for _, t in METRICS] + ["sim hit ratio", "sim TTFT / E2E mean (ms)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for router, runs in results.items():
        ok = [r for r in runs if "measured" in r]
        if not ok:
            continue
        cells = [f"`{router}`", ok[0]["engine"], str(len(ok)), str(sum(r["measured"]["failed"] for r in ok))]
        for key, _ in METRICS:
            scale, fmt = (1.0, "{:.4f}") if key == "hit_ratio" else (1000.0, "{:.0f}")
            m, h = ci([scale * r["measured"][key] for r in ok])
            cells.append(fmt.format(m) + ("" if math.isnan(h) else " ± " + fmt.format(h)))
        sim = next((r["simulated"] for r in ok if "simulated" in r), None)
        cells.append(f"{sim['hit_ratio']:.4f}" if sim and sim.get("hit_ratio") is not None else "")
        cells.append(f"{1000 * sim['ttft_mean_s']:.0f} / {1000 * sim['e2e_mean_s']:.0f} ({sim['policy']})" if sim else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--min-turns", type=int, default=5)
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--load", type=float, default=0.7)
    ap.add_argument("--speed", type=float, default=2.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--engine", default="paper")
    ap.add_argument("--routers", default="sglang:cache_aware,sglang:round_robin")
    ap.add_argument("--trace", default=str(MOONCAKE))
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    out = Path(a.out or tempfile.mkdtemp(prefix="serving_prefix_"))
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "slice.jsonl"
    stretch = write_slice(Path(a.trace), trace, a.requests, a.engines, a.load, a.min_turns)
    print(f"writing to {out}; slice: {a.requests} Mooncake requests of sessions of >= {a.min_turns} turns, "
          f"times x {stretch:.3f} (fluid load "
          f"{a.load:.0%} of {a.engines} GPUs, cache-blind); speed {a.speed:g}", file=sys.stderr)
    results: dict[str, list[dict]] = {}
    for router in a.routers.split(","):
        results[router] = []
        for rep in range(a.reps):
            t0 = time.perf_counter()
            try:
                r = run_loop(trace, engines=a.engines, router=router, speed=a.speed, progress=False,
                             simulate=rep == 0, timeout=300.0, engine=a.engine)
            except Exception as e:  # a failed run is reported and left out of the table
                r = {"router": router, "error": f"{type(e).__name__}: {e}"}
            (out / f"{router.replace(':', '_')}_{rep}.json").write_text(json.dumps(r, indent=1) + "\n")
            results[router].append(r)
            m = r.get("measured", {})
            print(f"{router} rep {rep}: {time.perf_counter() - t0:.0f} s, failed {m.get('failed')}, hit "
                  f"{m.get('hit_ratio')}, ttft {m.get('ttft_mean_s')}, e2e {m.get('e2e_mean_s')}, lag "
                  f"{r.get('engine_schedule', {}).get('lag_s')} {r.get('error', '')}", file=sys.stderr)
    text = table(results)
    (out / "table.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
