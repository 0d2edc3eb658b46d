"""Benchmark the per-instance engine replay: CPU seconds to replay a measured 400-request run.

Not a test. Run from the repository root (needs ../shared/data/distserve-opt13b-a100):

    python benchmarks/bench_engines.py            # best and median of 20 replays per engine

Replays DistServe's ``vllm-400-4`` run (400 requests, 70,540 output tokens) with the shipped vLLM
profile on each engine, timing :func:`fluidopt.engines.replay` alone with ``time.process_time`` (the file
is read once). The target (issue 43) is under 0.5 CPU-s per replay; docs/fidelity.md records the numbers.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fluidopt.calibration.timemodels import load_distserve_profile  # noqa: E402
from fluidopt.engines import ENGINES, engine_config, replay  # noqa: E402
from fluidopt.engines.validation import read_measured  # noqa: E402


def distserve_data() -> Path | None:
    """The shared DistServe folder (../shared/data/distserve-opt13b-a100 above this tree), or None after one
    line on stderr."""
    data = next((p / "shared/data/distserve-opt13b-a100" for p in ROOT.parents
                 if (p / "shared/data/distserve-opt13b-a100").is_dir()), None)
    if data is None:
        print("../shared/data/distserve-opt13b-a100 not found", file=sys.stderr)
    return data


def main() -> int:
    data = distserve_data()
    if data is None:
        return 2
    run = read_measured(data / "measured/vllm-400-4.exp")
    law = load_distserve_profile(data / "profiler-a100-80g.vllm.json", "facebook/opt-13b", 1)
    print("| engine | requests | iterations | best CPU-s | median CPU-s |")
    print("|---|---|---|---|---|")
    for name in ENGINES:
        cfg = engine_config(name, kv_tokens=66144)
        times = []
        for _ in range(20):
            t = time.process_time()
            r = replay(law, cfg, run.arrival, run.prompt, run.output)
            times.append(time.process_time() - t)
        print(f"| {name} | {len(run.arrival)} | {r.iterations} | {min(times):.4f} | {statistics.median(times):.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
