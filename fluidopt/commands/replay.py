"""``fluidopt replay``: send a trace's requests to an OpenAI-compatible endpoint and measure them."""

from __future__ import annotations

import argparse
import json
import math
import sys

from fluidopt.core.errors import UsageError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "replay",
        help="replay a trace against an OpenAI-compatible endpoint; TTFT, TPOT, E2E per request (docs/serving.md)",
        description=(
            "Send TRACE's requests (Mooncake JSON lines, Azure CSV or the generic CSV) at their timestamps / K to "
            "URL's /v1/completions with streaming, max_tokens = the trace's output length and ignore_eos; prompts "
            "from the trace's block hashes where it has them. Prints a summary in the shape of vLLM's serving "
            "benchmark (latencies on the trace's clock: wall x K) and writes requests.csv and summary.json to --out."
        ),
    )
    p.add_argument("trace", metavar="TRACE", help="trace file")
    p.add_argument("--url", required=True, help="the endpoint's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--speed", type=float, default=1.0, metavar="K", help="time speed-up: send at timestamp / K, "
                   "report latencies x K (default 1)")
    p.add_argument("--requests", type=int, metavar="N", help="the trace's first N requests (default all)")
    p.add_argument("--chat", action="store_true", help="use /v1/chat/completions instead of /v1/completions")
    p.add_argument("--model", default="fluidopt-standin", help="the model name sent (default fluidopt-standin)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S", help="wall seconds a request may take "
                   "(default 600); later it is recorded as failed")
    p.add_argument("--out", metavar="DIR", help="write requests.csv and summary.json there")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    return p


def check_common(args: argparse.Namespace) -> None:
    if not (args.speed > 0 and math.isfinite(args.speed)):
        raise UsageError(f"--speed {args.speed}: expected a positive number")
    if args.requests is not None and args.requests < 1:
        raise UsageError(f"--requests {args.requests}: expected a positive count")


def run(args: argparse.Namespace) -> int:
    import asyncio

    from fluidopt.serving.replayer import read_trace, replay_async, summarize, summary_text, write_outputs

    check_common(args)
    if not args.url.startswith(("http://", "https://")):
        raise UsageError(f"--url {args.url!r}: expected http://HOST:PORT")
    if not (args.timeout > 0 and math.isfinite(args.timeout)):
        raise UsageError(f"--timeout {args.timeout}: expected a positive number of seconds")
    frame = read_trace(args.trace, args.requests)
    recs, wall = asyncio.run(replay_async(frame, args.url, speed=args.speed, model=args.model, chat=args.chat,
                                          timeout=args.timeout, progress=not (args.no_progress or args.json)))
    s = summarize(recs, wall, args.speed)
    if args.out:
        write_outputs(args.out, recs, s)
    if args.json:
        print(json.dumps(s))
    else:
        print(summary_text(s))
    if s["failed"]:
        print(f"fluidopt replay: {s['failed']} of {s['requests']} request(s) failed", file=sys.stderr)
    return 0
