"""``fluidopt app``: the interactive what-if in a browser (a local web app; ``pip install -e ".[app]"``)."""

from __future__ import annotations

import argparse


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "app",
        help="interactive what-if in the browser: operating point, capacity, pricing, controllers",
        description="Serve a local web app (127.0.0.1, a free port; the URL is printed) over SCENARIO (default: the "
        "built-in paper instance): edit rates, lengths, prices and the fleet and see the fluid LP's operating "
        "point at once; the fleet against demand growth; revenue and served load against price; a short "
        "controller comparison on the harness, with progress and cancel. Needs the app extra: "
        "pip install -e '.[app]'. Ctrl-C stops the server.",
    )
    p.add_argument("scenario", nargs="?", default=None, metavar="SCENARIO", help="scenario TOML (default: built-in)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=0, help="port (default 0: a free one)")
    p.add_argument("--workers", type=int, default=2, help="local worker processes for simulations (default 2)")
    return p


def run(args: argparse.Namespace) -> int:
    from fluidopt.core.errors import UsageError

    try:
        import nicegui  # noqa: F401
        import tomli_w  # noqa: F401
    except ImportError:
        raise UsageError("app: the app extra is not installed; pip install -e '.[app]'") from None
    if not 0 <= args.port < 65536:
        raise UsageError(f"--port: expected 0 (a free port) or 1..65535, got {args.port}")
    if args.workers < 1:
        raise UsageError(f"--workers: expected an integer >= 1, got {args.workers}")
    from fluidopt.app import serve
    from fluidopt.scenario import load_scenario

    scenario = load_scenario(args.scenario)
    serve(scenario, host=args.host, port=args.port, workers=args.workers)
    return 0
