"""Benchmark: the routers' comparison table of issue 45 (docs/serving.md, "The comparison").

    python benchmarks/serving_table.py [--engines 4] [--reps 3] [--load 0.7] [--requests 150] [--speed 0.25]
                                       [--routers R1,R2,...] [--out DIR]

Writes one trace slice (Poisson arrivals whose fluid load on the fleet is --load, prompts 1000-1900
tokens, outputs 10-30: prefill-heavy, so that LiteLLM's work per streamed token does not saturate a
shared core; the prompts stay under the vLLM-style stand-in's 2,048-token context), runs `fluidopt loop`
on it (run_loop, in this process) --reps times per router on --engines stand-ins, and prints a markdown
table: mean +- the 95% t-interval half-width over repetitions of TTFT mean / p99, TPOT mean and E2E mean
(ms, on the model's clock), with the simulator's TTFT / E2E mean for the same slice, fleet and policy
(deterministic on a fixed slice: one value). DIR gets the slice, every run's JSON and table.md.

A timing figure, so it lives here and not in the test suite. Speed below 1 slows the engines and the
replayer down together: the router's own wall-clock cost then weighs less on the model's clock.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from fluidopt.serving.loop import poisson_slice, run_loop

ROUTERS = ("litellm:gate-and-route", "litellm-builtin:least-busy",
           "litellm-builtin:simple-shuffle", "sglang:cache_aware", "sglang:round_robin")
METRICS = (("ttft_mean_s", "TTFT mean"), ("ttft_p99_s", "TTFT p99"), ("tpot_mean_s", "TPOT mean"),
           ("e2e_mean_s", "E2E mean"))


def ci(xs: list[float]) -> tuple[float, float]:
    """(mean, 95% t-interval half-width; NaN for one value)."""
    from scipy import stats

    a = np.asarray(xs, dtype=float)
    if a.size < 2:
        return float(a.mean()), math.nan
    return float(a.mean()), float(stats.t.ppf(0.975, a.size - 1) * a.std(ddof=1) / math.sqrt(a.size))


def table(results: dict[str, list[dict]]) -> str:
    """The markdown table of ``results`` (router -> run_loop outputs)."""
    head = ["router", "engine", "reps", "failed"] + [f"{t} (ms)" for _, t in METRICS] + ["sim TTFT / E2E mean (ms)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for router, runs in results.items():
        ok = [r for r in runs if "measured" in r]
        if not ok:
            lines.append(f"| `{router}` | | 0 | | " + " | ".join("" for _ in METRICS) + " | |")
            continue
        cells = [f"`{router}`", ok[0]["engine"], str(len(ok)), str(sum(r["measured"]["failed"] for r in ok))]
        for key, _ in METRICS:
            m, h = ci([1000 * r["measured"][key] for r in ok])
            cells.append(f"{m:.0f}" if math.isnan(h) else f"{m:.0f} ± {h:.0f}")
        sim = next((r["simulated"] for r in ok if "simulated" in r), None)
        cells.append(f"{1000 * sim['ttft_mean_s']:.0f} / {1000 * sim['e2e_mean_s']:.0f} ({sim['policy']})"
                     if sim else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--load", type=float, default=0.7)
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--speed", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--routers", default=",".join(ROUTERS))
    ap.add_argument("--out", help="folder for the slice, the runs' JSON and table.md (default: a new temporary one)")
    a = ap.parse_args(argv)
    out = Path(a.out or tempfile.mkdtemp(prefix="serving_table_"))
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "slice.csv"
    rate = poisson_slice(trace, load=a.load, gpus=a.engines, requests=a.requests, prompt=(1000, 1900),
                         output=(10, 30), seed=a.seed)
    print(f"writing to {out}", file=sys.stderr)
    print(f"slice: {a.requests} requests at {rate:.2f} per s, fluid load {a.load:.0%} of {a.engines} GPUs "
          f"(qwen-8b-a100); speed {a.speed:g}", file=sys.stderr)
    results: dict[str, list[dict]] = {}
    for router in a.routers.split(","):
        results[router] = []
        for rep in range(a.reps):
            t0 = time.perf_counter()
            try:
                r = run_loop(trace, engines=a.engines, router=router, speed=a.speed, progress=False,
                             simulate=rep == 0, timeout=120.0)
            except Exception as e:  # a run that fails is reported and left out of the table
                r = {"router": router, "error": f"{type(e).__name__}: {e}"}
            (out / f"{router.replace(':', '_')}_{rep}.json").write_text(json.dumps(r, indent=1) + "\n")
            results[router].append(r)
            m = r.get("measured", {})
            print(f"{router} rep {rep}: {time.perf_counter() - t0:.0f} s, failed {m.get('failed')}, "
                  f"ttft {m.get('ttft_mean_s')}, e2e {m.get('e2e_mean_s')} {r.get('error', '')}", file=sys.stderr)
    text = table(results)
    (out / "table.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
