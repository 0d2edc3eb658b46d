"""Benchmark: CPU cost per request of a disaggregated replay against the colocated replay of the same
requests (issue 44's speed acceptance: at most 1.5x).

Not a test. Run from the repository root (needs ../shared/data/distserve-opt13b-a100):

    python benchmarks/bench_disagg.py            # fastest of 15 back-to-back pairs per scenario

Scenarios: DistServe's four measured disaggregated runs (300 requests at 3, 6, 9, 12 requests/s) and
2,000 requests drawn from their lengths at 5 requests/s (Poisson, seed 0). Each runs on
:func:`fluidopt.engines.disaggregated.replay_disaggregated` (prefill TP 2 + decode TP 1 of DistServe's
profile, KV from ``max_num_tokens.csv``; once per policy: distserve-fcfs, least-load, gate-and-route with
one class) and on the colocated instance-level engine, :func:`fluidopt.engines.replay` (vLLM's
prefill-first schedule on the same profile), three ways: the whole stream on one TP 1 instance (the
decode instance's law and KV; overloaded at these rates), on one TP 2 instance (the prefill instance's
law), and the same three GPUs as three TP 1 instances, each at a third of the rate (the placement
search's colocated split). All are timed with ``time.process_time``, interleaved, fastest kept. The
acceptance's comparison, "the colocated run of the same scenario", is the same requests on the same GPUs:
the 3 x TP 1 column; the last line gives the worst ratio of each column over the measured runs and the
2,000 requests.

Then a comparison of the policies (attainment, TTFT, TPOT, decode wait) on 2 prefill + 2 decode
instances with two classes. docs/fidelity.md ("Disaggregated replay": "Policies", "Speed") records the
numbers.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_engines import distserve_data  # noqa: E402

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


def policy_table(lp, ld, P, O, link) -> None:
    """Attainment and latencies of each policy on a fleet of 2 prefill (TP 2) + 2 decode (TP 1) instances,
    requests drawn from the measured lengths in two classes (prompt <= 512 tokens or longer), the LP's
    targets for gate-and-route from the two classes' means (TTFT 0.2 s, TPOT 0.1 s)."""
    from fluidopt.engines.disagg_policies import targets_from_lp
    from fluidopt.fluid.disaggregated import DisaggClass, DisaggPools, solve_disaggregated

    rng = np.random.default_rng(1)
    pick = rng.integers(0, len(P), 3000)
    p, o = P[pick], O[pick]
    cls = (p > 512).astype(int)
    classes = [DisaggClass(f"c{i}", float((cls == i).mean()), float(p[cls == i].mean()), float(o[cls == i].mean()),
                           ttft=0.2, tpot=0.1) for i in (0, 1)]
    sol = solve_disaggregated(classes, DisaggPools(lp, ld, 2, 1, kv_tokens=66144), "min_gpus")
    targets = targets_from_lp(sol)
    print(f"\nPolicies on prefill 2 x TP2 + decode 2 x TP1, 3,000 requests of the measured lengths, two classes "
          f"(LP shares x = {targets.prefill_share[0]:.3f} / {targets.prefill_share[1]:.3f}, decode targets "
          f"y = {targets.decode_per_instance[0]:.1f} / {targets.decode_per_instance[1]:.1f} requests per instance)\n")
    print("| rate req/s | policy | attainment (200 ms / 100 ms) | TTFT mean / p90 ms | TPOT mean / p90 ms | decode wait mean ms |")
    print("|---:|---|---:|---|---|---:|")
    pre, dec = Pool(lp, instances=2, kv_tokens=163008), Pool(ld, instances=2, kv_tokens=66144)
    unit = np.cumsum(rng.exponential(1.0, len(p)))
    for rate in (8.0, 10.0, 12.0):
        for pol in ("distserve-fcfs", "round-robin", "least-load", "gate-and-route"):
            r = replay_disaggregated(pre, dec, unit / rate, p, o, cls=cls, policy=pol, targets=targets, **link)
            print(f"| {rate:g} | {pol} | {r.attainment(0.2, 0.1):.3f} | {np.mean(r.ttft) * 1e3:.0f} / "
                  f"{np.percentile(r.ttft, 90) * 1e3:.0f} | {np.mean(r.tpot) * 1e3:.1f} / {np.percentile(r.tpot, 90) * 1e3:.1f}"
                  f" | {np.nanmean(r.decode_wait) * 1e3:.1f} |", flush=True)


def main() -> int:
    data = distserve_data()
    if data is None:
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
    # the two costs apart: requests that never meet (one prefill batch, one transfer and one decode step
    # each: the per-request events) and one long request (decode steps alone)
    scenarios.append(("2,000 alone, 780/2 tokens (events per request)", (np.arange(2000.0), np.full(2000, 780),
                                                                        np.full(2000, 2))))
    scenarios.append(("1 request, 780/20,000 tokens (decode steps)", (np.zeros(1), np.full(1, 780), np.full(1, 20000))))
    one = DisaggTargets((1.0,), (1.0,))
    policies = ("distserve-fcfs", "least-load", "gate-and-route")
    cfg2 = engine_config("vllm", kv_tokens=163008)
    print("CPU ms per request, fastest of", REPEATS, "interleaved runs; in brackets distserve-fcfs over each colocated run\n")
    print("| scenario | " + " | ".join(f"disaggregated {p}" for p in policies) + " | colocated TP1, the whole stream "
          "| colocated TP2, the whole stream | colocated 3 x TP1 (the same 3 GPUs, each at rate/3) |")
    print("|---|" + "---:|" * (len(policies) + 3))
    worst = [0.0] * 3
    for k, (name, m) in enumerate(scenarios):
        a, p, o = (m.arrival, m.prompt, m.output) if hasattr(m, "arrival") else m
        n = len(a)
        fns = [lambda pol=pol, a=a, p=p, o=o: replay_disaggregated(pre, dec, a, p, o, policy=pol, targets=one, **link)
               for pol in policies]
        fns += [lambda a=a, p=p, o=o: replay(ld, cfg, a, p, o), lambda a=a, p=p, o=o: replay(lp, cfg2, a, p, o),
                # a Poisson stream split at random over 3 instances: each sees rate/3 (the placement search's rule)
                lambda a=a, p=p, o=o: replay(ld, cfg, np.asarray(a) * 3, p, o)]
        t = best_of(fns)
        cells = [f"{x / n * 1e3:.4f}" for x in t[: len(policies)]]
        cells += [f"{x / n * 1e3:.4f} ({t[0] / x:.2f}x)" for x in t[len(policies):]]
        if k < len(runs) + 1:  # the measured runs and the 2,000 requests, not the two cost probes
            worst = [max(w, t[0] / x) for w, x in zip(worst, t[len(policies):])]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    print("\n(the last row: one request, 19,999 decode steps, so its ratios are per decode step)")
    print(f"worst distserve-fcfs / colocated over the measured runs and the 2,000: {worst[2]:.2f}x the same 3 GPUs "
          f"(3 x TP1, the acceptance's comparison), {worst[0]:.2f}x one TP1 instance, {worst[1]:.2f}x one TP2 instance")
    policy_table(lp, ld, P, O, link)
    return 0


if __name__ == "__main__":
    sys.exit(main())
