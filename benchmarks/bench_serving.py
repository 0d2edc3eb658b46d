"""Benchmark: one stand-in engine at --speed 10 keeps the time model's schedule under load (issue 45).

    python benchmarks/bench_serving.py [REQUESTS]

Starts one `fluidopt serve-engine --speed 10` on loopback, replays REQUESTS (default 300) Poisson requests
(3 per model second, prompts 100-499 tokens, outputs 20-79) at speed 10, and prints the engine's own
counters: iterations, model seconds busy, wall seconds busy x 10 and their ratio. The stand-in keeps up
when the ratio is within 5% of 1 (recorded in docs/serving.md). A speed figure, so it lives here and not in
the test suite (a loaded machine would make a timed test fail for no fault of the code).
"""

from __future__ import annotations

import asyncio
import re
import sys

import httpx
import numpy as np
import pandas as pd

from fluidopt.serving.loop import start_engines, stop_all
from fluidopt.serving.replayer import replay_async


def main(n: int = 300) -> int:
    procs, urls = start_engines(1, ["--speed", "10"])
    try:
        rng = np.random.default_rng(1)
        t = np.cumsum(rng.exponential(1 / 3, n))
        frame = pd.DataFrame({"time": t - t[0], "prompt": rng.integers(100, 500, n), "output": rng.integers(20, 80, n)})
        recs, wall_s = asyncio.run(replay_async(frame, urls[0], speed=10, progress=False))
        text = httpx.get(urls[0] + "/metrics").text

        def metric(name: str) -> float:
            return float(re.search(re.escape(name) + r"\{[^}]*\} (\S+)", text).group(1))

        model = metric("fluidopt:model_busy_seconds_total")
        wall = metric("fluidopt:wall_busy_seconds_total")
        print(f"requests {n} (ok {sum(r.ok for r in recs)}), iterations {metric('fluidopt:iterations_total'):.0f}, "
              f"model busy {model:.2f} s, wall busy x 10 {wall * 10:.2f} s, ratio {wall * 10 / model:.4f}, "
              f"replay wall {wall_s:.1f} s")
        return 0 if all(r.ok for r in recs) else 1
    finally:
        stop_all(procs)


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 300))
