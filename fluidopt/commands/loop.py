"""``fluidopt loop``: stand-in engines, a router and the replayer on loopback; measured vs simulated."""

from __future__ import annotations

import argparse
import json


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "loop",
        help="run N stand-in engines, a router and the trace replayer on loopback; measured vs simulated "
             "(docs/serving.md)",
        description=(
            "Start N stand-in engines (fluidopt serve-engine), a router (LiteLLM with a fluidopt controller: "
            "litellm:POLICY, or LiteLLM's own strategy: litellm-builtin:simple-shuffle|least-busy) and the replayer "
            "on 127.0.0.1, replay TRACE, tear everything down (also on Ctrl-C and SIGTERM), and print the measured "
            "figures next to the simulator's prediction for the same trace, fleet and policy. Latencies are on the "
            "trace's clock (wall x K)."
        ),
    )
    p.add_argument("trace", metavar="TRACE", help="trace file (Mooncake JSON lines, Azure CSV or the generic CSV)")
    p.add_argument("--engines", type=int, required=True, metavar="N", help="stand-in engines")
    p.add_argument("--router", required=True, help="litellm:POLICY, litellm-builtin:STRATEGY or sglang:POLICY")
    p.add_argument("--speed", type=float, default=1.0, metavar="K", help="time speed-up of engines and replayer "
                   "(default 1; the HTTP and router overhead is multiplied by K on the trace's clock)")
    p.add_argument("--requests", type=int, metavar="N", help="the trace's first N requests (default all)")
    p.add_argument("--engine", help="the stand-ins' scheduler (default: the one the simulator gives the policy)")
    p.add_argument("--profile", metavar="NAME", help="named GPU profile of every engine (default qwen-8b-a100)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S", help="wall seconds a request may take")
    p.add_argument("--no-simulate", action="store_true", help="skip the simulator's prediction")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="the stand-ins' prefix cache and the simulator's (on by default; with a trace's block "
                   "hashes both use its block size)")
    p.add_argument("--json", action="store_true", help="print one JSON object with 'measured' and 'simulated'")
    return p


def _row(name: str, d: dict | None) -> str:
    if not d:
        return f"{name:<10} (none)"
    def ms(k):
        v = d.get(k)
        return "n/a" if v is None else f"{1000 * v:.1f}"
    return (f"{name:<10} {d['requests']:>8} {d['failed']:>7} {ms('ttft_mean_s'):>14} {ms('ttft_p99_s'):>13} "
            f"{ms('e2e_mean_s'):>13} {ms('e2e_p99_s'):>12}")


def run(args: argparse.Namespace) -> int:
    from fluidopt.commands.replay import check_common
    from fluidopt.serving.loop import run_loop

    check_common(args)
    out = run_loop(args.trace, engines=args.engines, router=args.router, speed=args.speed, requests=args.requests,
                   engine=args.engine, profile=args.profile, timeout=args.timeout, progress=not args.json,
                   simulate=not args.no_simulate, prefix_cache=args.enable_prefix_caching)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"loop: {args.engines} stand-in engine(s) ({out['engine']}, {out['profile']}), router {args.router}, "
          f"speed {args.speed:g}")
    print(f"{'':<10} {'requests':>8} {'failed':>7} {'TTFT mean ms':>14} {'TTFT p99 ms':>13} {'E2E mean ms':>13} "
          f"{'E2E p99 ms':>12}")
    print(_row("measured", out["measured"]))
    print(_row("simulated", out.get("simulated")))
    hits = (out["measured"].get("hit_ratio"), (out.get("simulated") or {}).get("hit_ratio"))
    if hits[0] is not None:
        sim = "n/a" if hits[1] is None else f"{hits[1]:.4f}"
        print(f"prefix-cache hit ratio: measured {hits[0]:.4f}, simulated {sim}")
    for err, n in out["measured"]["errors"].items():
        print(f"failed x{n}: {err}")
    return 0
