"""The capacity plan of the Mooncake trace with and without a prefix cache, each verified by replaying it (issue 42).

    python benchmarks/prefix_plan.py [--trace PATH] [--rule sglang] [--kv both|unlimited|80gb]
                                     [--served 0.99] [--ttft S] [--out OUT.json]

Plan (fluidopt.planning.prefix.fluid_cache_plan): the fluid fleet that serves every request of the trace at
its observed rate and mean lengths (12,031 requests in 3,537 s, the trace as shipped, no time scaling) on
examples/scenarios/mooncake-conversation.toml's GPU, without a cache (h = 0) and with the hit ratio h that
``--rule`` keeps over the planned fleet's instances (fluidopt.workloads.prefix.hit_ratio, iterated until the
fleet repeats), with each instance's cache unlimited or an 80 GB GPU's KV (377,061 tokens = 736 blocks of 512).

Check (fluidopt.planning.prefix.smallest_fleet): replay the trace on n GPUs, tokens mode, with the router
the plan assumes: the rule's registered policy with the cache on for the cache plan, ``least-requests``
with the cache off for the plan without one. The routers run chunked prefill (the ``-chunked`` policies:
C = 256 tokens per iteration, each paying the intercept), the time law the fluid model is built on. The
SLO is the plan's own SLI, every request served: at least ``--served`` of the requests complete by the
trace's last arrival (a fleet that falls behind leaves a backlog that grows with the trace); ``--ttft``
adds a mean TTFT bound. The search starts at the plan's ceil(n) and steps up until the SLO holds; the
fleet one GPU smaller is replayed beside it. Unchunked routers (prefill first, one iteration per prompt:
about half the chunked prefill time for Mooncake's 12k-token prompts) are replayed at the same fleets
for comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's fluidopt, not another checkout's editable install
sys.path.insert(0, str(Path(__file__).resolve().parent))
from prefix_headtohead import KV_SETTINGS, SCENARIO, TRACE, _trace_file  # noqa: E402

from fluidopt.workloads.prefix import RULES  # noqa: E402

BLOCK = 512


def _row(label: str, c, planned: int) -> str:
    m = c.metrics
    mark = "meets" if c.met else "misses"
    return (f"| {label} | {c.policy} | {'on' if c.prefix_cache else 'off'} | {c.gpus}{' (plan)' if c.gpus == planned else ''} "
            f"| {m['hit_ratio']:.3f} | {m['served']:.4f} | {m['ttft_mean']:.2f} | {m['ttft_p90']:.2f} | "
            f"{m['ttft_p99']:.2f} | {m['e2e_mean']:.2f} | {mark} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--rule", default="sglang", choices=RULES)
    ap.add_argument("--kv", choices=("both", "unlimited", "80gb"), default="both")
    ap.add_argument("--served", type=float, default=0.99)
    ap.add_argument("--ttft", type=float, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    trace = _trace_file("prefix_plan", args.trace)
    if trace is None:
        return 2
    warnings.simplefilter("ignore")
    from fluidopt.planning.prefix import RULE_POLICY, TraceSLO, fluid_cache_plan, replay_check, smallest_fleet
    from fluidopt.scenario import load_scenario
    from fluidopt.workloads.traces import replay

    t_start = time.perf_counter()
    base, wl = replay(trace, load_scenario(SCENARIO), speedup=1.0)
    slo = TraceSLO(served=args.served, ttft_mean=args.ttft)
    pol = RULE_POLICY[args.rule]
    print(f"Mooncake conversation trace: {wl.n_requests} requests over {float(wl.frame['time'].max()):.0f} s; "
          f"SLO: {slo.describe()}; cache rule {args.rule}")
    kvs = KV_SETTINGS[args.kv]
    result: dict = {"slo": slo.describe(), "rule": args.rule, "kv": {}}
    for label, kv in kvs:
        sc = replace(base, gpu=replace(base.gpu, kv_capacity=None if kv is None else float(kv)))
        blocks = None if kv is None else kv // BLOCK
        plans = {"no cache": fluid_cache_plan(sc, wl, None), "cache": fluid_cache_plan(sc, wl, args.rule,
                                                                                       capacity_blocks=blocks)}
        runs, rows = {}, []
        for name, p in plans.items():
            cache = name == "cache"
            chunked = f"{pol if cache else 'least-requests'}-chunked"
            n_sim, checks = smallest_fleet(sc, wl, p.gpus, chunked, slo, prefix_cache=cache)
            unchunked = [replay_check(sc, wl, c.gpus, pol if cache else "least-requests", slo, prefix_cache=cache)
                         for c in checks]
            runs[name] = {"plan": asdict(p), "n_sim": n_sim, "checks": [asdict(c) for c in checks + unchunked]}
            rows += [_row(name, c, p.gpus) for c in checks + unchunked]
        print(f"\nKV {label} ({'unlimited' if kv is None else f'{kv:,} tokens, {blocks} blocks'} per GPU)")
        print("| plan | h planned (rule, instances) | fluid GPUs | planned | simulated (smallest meeting the SLO) |")
        print("|---|---|---|---|---|")
        for name, p in plans.items():
            h = "0" if p.rule is None else f"{p.hit_ratio:.4f} ({p.rule}, {p.steps[-1][0]}; ideal {p.ideal:.4f})"
            print(f"| {name} | {h} | {p.n_fluid:.2f} | {p.gpus} | {runs[name]['n_sim']} |")
        print("\n| plan | router | cache | GPUs | hit ratio | served by last arrival | mean TTFT (s) | p90 TTFT (s) | "
              "p99 TTFT (s) | mean E2E (s) | SLO |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        print("\n".join(rows))
        result["kv"][label] = {"capacity_tokens": kv, **runs}
    total = time.perf_counter() - t_start
    print(f"\ntotal {total:.0f} s wall")
    result["wall_seconds"] = total
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
