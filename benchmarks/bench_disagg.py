"""Benchmark: CPU cost per request of a disaggregated replay against the colocated replay of the same
requests (issue 44's speed acceptance: at most 1.5x).

Not a test. Run from the repository root (needs ../shared/data/distserve-opt13b-a100):

    python benchmarks/bench_disagg.py            # fastest of 15 back-to-back pairs per scenario

Scenarios: DistServe's four measured disaggregated runs (300 requests at 3, 6, 9, 12 requests/s) and
2,000 requests drawn from their lengths at 5 requests/s (Poisson, seed 0). Each runs on
:func:`fluidopt.engines.disaggregated.replay_disaggregated` (prefill TP 2 + decode TP 1 of DistServe's
profile, KV from ``max_num_tokens.csv``; once per policy: distserve-fcfs, least-load, gate-and-route with
the LP's targets for one class) and on the colocated instance-level engine, :func:`fluidopt.engines.replay`
(vLLM's prefill-first schedule, the same profile at TP 1, the decode instance's 66,144 KV tokens). The two
are timed back to back with ``time.process_time``, alternating, and the fastest of each is kept; the ratio
is disaggregated / colocated per request. docs/fidelity.md ("Disaggregated replay", "Speed") records the
numbers.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fluidopt.calibration.timemodels import load_distserve_profile  # noqa: E402
from fluidopt.engines import engine_config, replay  # noqa: E402
from fluidopt.engines.disagg_policies import DisaggTargets  # noqa: E402
from fluidopt.engines.disaggregated import Pool, model_kv_bytes, replay_disaggregated  # noqa: E402
from fluidopt.engines.validation import read_measured  # noqa: E402

MODEL = "facebook/opt-13b"
REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 15


def best_of(fns, repeats: int = REPEATS) -> list[float]:
    """Fastest CPU time of each function, calling them in turn ``repeats`` times (interleaved, so a
    slow spell of the machine hits all of them alike)."""
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, f in enumerate(fns):
            t = time.process_time()
            f()
            best[i] = min(best[i], time.process_time() - t)
    return best


def main() -> int:
    data = next((p / "shared/data/distserve-opt13b-a100" for p in ROOT.parents
                 if (p / "shared/data/distserve-opt13b-a100").is_dir()), None)
    if data is None:
        print("../shared/data/distserve-opt13b-a100 not found", file=sys.stderr)
        return 2
    prof = data / "profiler-a100-80g.distserve.json"
    lp, ld = load_distserve_profile(prof, MODEL, 2), load_distserve_profile(prof, MODEL, 1)
    pre, dec = Pool(lp, kv_tokens=163008), Pool(ld, kv_tokens=66144)
    cfg = engine_config("vllm", kv_tokens=66144)
    link = dict(kv_bytes_per_token=model_kv_bytes(MODEL))
    runs = sorted(data.glob("measured/distserve-c21d11-300-*.exp"), key=lambda f: int(f.stem.split("-")[-1]))
    scenarios = [(f"{f.stem} (300 at {f.stem.split('-')[-1]}/s)", read_measured(f)) for f in runs]
    P = np.concatenate([m.prompt for _, m in scenarios])
    O = np.concatenate([m.output for _, m in scenarios])
    rng = np.random.default_rng(0)
    pick = rng.integers(0, len(P), 2000)
    arr = np.cumsum(rng.exponential(1 / 5.0, 2000))
    scenarios.append(("2,000 at 5/s from their lengths", (arr - arr[0], P[pick], O[pick])))
    one = DisaggTargets((1.0,), (1.0,))
    policies = ("distserve-fcfs", "least-load", "gate-and-route")
    print("| scenario | colocated ms/request | " + " | ".join(f"{p} ms/request (ratio)" for p in policies) + " |")
    print("|---|---:|" + "---:|" * len(policies))
    for name, m in scenarios:
        a, p, o = (m.arrival, m.prompt, m.output) if hasattr(m, "arrival") else m
        n = len(a)
        fns = [lambda: replay(ld, cfg, a, p, o)]
        fns += [lambda pol=pol: replay_disaggregated(pre, dec, a, p, o, policy=pol, targets=one, **link)
                for pol in policies]
        t = best_of(fns)
        cells = " | ".join(f"{x / n * 1e3:.3f} ({x / t[0]:.2f}x)" for x in t[1:])
        print(f"| {name} | {t[0] / n * 1e3:.3f} | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
