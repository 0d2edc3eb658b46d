"""The ``fluidopt`` command line: a thin layer over the library.

Each subcommand lives in ``fluidopt/commands/<name>.py`` and exposes ``add_parser(subparsers)``
and ``run(args) -> int``. Errors that fluidopt raises on purpose print one line and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from fluidopt.errors import FluidoptError

# Order is the order of ``fluidopt --help``.
COMMANDS = ("run", "solve", "simulate", "calibrate")


def build_parser() -> argparse.ArgumentParser:
    from fluidopt import __version__

    parser = argparse.ArgumentParser(
        prog="fluidopt",
        description="Operations research for LLM-inference GPU fleets.",
    )
    parser.add_argument("--version", action="version", version=f"fluidopt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"fluidopt.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"fluidopt.commands.{name}":
                continue  # subcommand not built yet
            raise
        p = mod.add_parser(sub)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "_run"):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except FluidoptError as e:
        print(f"fluidopt {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fluidopt {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Output piped into `head` and the like: stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
