"""``fluidopt serve-engine``: a stand-in engine server on 127.0.0.1 (docs/serving.md)."""

from __future__ import annotations

import argparse
import sys

from fluidopt.core.errors import UsageError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve-engine",
        help="emulate one engine instance in real time behind an OpenAI-compatible API (docs/serving.md)",
        description=(
            "Serve /v1/completions and /v1/chat/completions (SSE streaming), /health and /metrics (Prometheus "
            "text, vLLM's metric names) on 127.0.0.1, emulating one engine instance: the time model and the "
            "engine's scheduler, continuous batching, KV capacity, the prefix cache. The output length is the request's max_tokens; "
            "a prompt's length is its number of whitespace-separated words. Stops on Ctrl-C or SIGTERM."
        ),
    )
    p.add_argument("--port", type=int, required=True, help="TCP port on 127.0.0.1 (0: any free port, printed)")
    p.add_argument("--engine", default="paper", help="scheduler: vllm, chunked or paper (default paper, the "
                   "simulator's model)")
    p.add_argument("--profile", metavar="NAME", help="named GPU profile (default qwen-8b-a100; fluidopt solve "
                   "--list-profiles lists them)")
    p.add_argument("--timemodel", metavar="TOML", help="instead of --profile: a TOML file with a [timemodel] table (s)")
    p.add_argument("--kv-tokens", type=int, metavar="N", help="KV cache in tokens (default: the profile's, or unlimited)")
    p.add_argument("--speed", type=float, default=1.0, metavar="K", help="model seconds per wall second (default 1)")
    p.add_argument("--model-name", default="fluidopt-standin", help="model name it reports (default fluidopt-standin)")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="the prefix cache, the simulator's rules (on by default, as in vLLM v1; "
                   "--no-enable-prefix-caching turns it off, as vLLM's flag does)")
    p.add_argument("--prefix-block-size", type=int, default=16, metavar="N",
                   help="tokens (words) per prefix-cache block (default 16, vLLM's block size; give a trace's "
                   "own, 512 for Mooncake, to see its reuse block for block)")
    return p


def run(args: argparse.Namespace) -> int:
    import math

    from fluidopt.serving.engine_server import EngineServer, bind, law_and_config, serve

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: expected 0..65535")
    if not (args.speed > 0 and math.isfinite(args.speed)):
        raise UsageError(f"--speed {args.speed}: expected a positive number")
    if args.prefix_block_size < 1:
        raise UsageError(f"--prefix-block-size {args.prefix_block_size}: expected a positive number of tokens")
    law, cfg = law_and_config(args.engine, profile=args.profile, timemodel=args.timemodel, kv_tokens=args.kv_tokens)
    try:
        sock = bind(args.port)
    except OSError as e:
        raise UsageError(f"--port {args.port}: cannot listen on 127.0.0.1 ({e.strerror})") from None
    port = sock.getsockname()[1]
    server = EngineServer(law, cfg, speed=args.speed, model=args.model_name, engine_name=args.engine,
                          prefix_cache=args.enable_prefix_caching, prefix_block_size=args.prefix_block_size)

    def ready():
        cache = f"prefix cache of {args.prefix_block_size}-token blocks" if args.enable_prefix_caching else "no prefix cache"
        print(f"fluidopt serve-engine: listening on http://127.0.0.1:{port} ({args.engine}, speed {args.speed:g}, "
              f"{cache})", flush=True)

    serve(server, sock, on_ready=ready)
    print("fluidopt serve-engine: stopped", file=sys.stderr, flush=True)
    return 0
