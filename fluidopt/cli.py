"""The ``fluidopt`` command line: a thin layer over the library.

Each subcommand lives in ``fluidopt/commands/<name>.py`` and exposes ``add_parser(subparsers)``
and ``run(args) -> int``. Errors that fluidopt raises on purpose print one line and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import warnings
from collections.abc import Sequence

from fluidopt.core.errors import FluidoptError

# Order is the order of ``fluidopt --help``.
COMMANDS = ("run", "plan", "price", "solve", "simulate", "calibrate", "validate", "stability", "rl", "app", "serve-engine",
            "replay", "loop")


class _ArgumentError(Exception):
    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """argparse whose errors come back to :func:`main`, which prints them like every other error.

    No abbreviated options: with them ``--seed`` silently meant ``--seeds`` in ``fluidopt run``."""

    def __init__(self, *a, **kw) -> None:
        kw.setdefault("allow_abbrev", False)
        super().__init__(*a, **kw)

    def error(self, message: str):  # type: ignore[override]
        raise _ArgumentError(self.prog, " ".join(message.split()))


def build_parser() -> argparse.ArgumentParser:
    from fluidopt import __version__

    parser = _Parser(
        prog="fluidopt",
        description="Operations research for LLM-inference GPU fleets.",
    )
    parser.add_argument("--version", action="version", version=f"fluidopt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        mod = importlib.import_module(f"fluidopt.commands.{name.replace('-', '_')}")
        p = mod.add_parser(sub)
        p.set_defaults(_run=mod.run)
    return parser


def _error(args: argparse.Namespace, message: str, status: int) -> int:
    """One line on stderr; under ``--json`` one JSON object on stdout as well, so pipelines can parse it."""
    line = " ".join(str(message).split())  # one line, whatever the message held
    print(f"fluidopt {args.command}: error: {line}", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"error": line, "command": args.command, "status": status}))
    return status


def main(argv: Sequence[str] | None = None) -> int:
    import fluidopt.core.interrupt as interrupt

    # The handlers go in first: a Ctrl-C or SIGTERM while the commands and their libraries load is one
    # line and exit 130 / 143 too.
    with interrupt.handle_sigterm():
        try:
            return _main(argv)
        except KeyboardInterrupt as e:
            return interrupt.report("fluidopt", e)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except _ArgumentError as e:
        line = f"{e} (see {e.prog} --help)"
        print(f"{e.prog}: error: {line}", file=sys.stderr)
        if "--json" in argv:
            print(json.dumps({"error": line, "command": e.prog.removeprefix("fluidopt").strip() or None, "status": 2}))
        return 2
    if not hasattr(args, "_run"):
        parser.print_help()
        return 2

    def one_line_warning(message, category, filename, lineno, file=None, line=None):
        print(f"fluidopt {args.command}: warning: {' '.join(str(message).split())}", file=sys.stderr)

    previous, warnings.showwarning = warnings.showwarning, one_line_warning  # one line, not a source listing
    try:
        return _dispatch(args)
    finally:
        warnings.showwarning = previous


def _dispatch(args: argparse.Namespace) -> int:
    import fluidopt.core.interrupt as interrupt

    try:
        return int(args._run(args) or 0)
    except FluidoptError as e:
        return _error(args, str(e), e.exit_status)
    except MemoryError:
        return _error(args, "out of memory: the problem is too large for this machine (a smaller fleet, "
                            "horizon or grid will fit)", 2)
    except KeyboardInterrupt as e:
        # One line on what was kept (Interrupted.kept), exit 128 + the signal; never a traceback.
        return interrupt.report(f"fluidopt {args.command}", e)
    except BrokenPipeError:
        # Output piped into `head` and the like: stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as e:
        if interrupt.pending() is not None:
            # the aftermath of a signal (an import it cut short, a library wrapping the KeyboardInterrupt):
            # the interruption, not an internal error
            return interrupt.report(f"fluidopt {args.command}", interrupt.Interrupted(interrupt.pending()))
        # A bug, not bad input: say so in one line; FLUIDOPT_DEBUG=1 shows the traceback.
        if os.environ.get("FLUIDOPT_DEBUG"):
            raise
        return _error(args, f"internal error ({type(e).__name__}: {e}); please report it with the command "
                            f"line (FLUIDOPT_DEBUG=1 shows the traceback)", 1)


def entry() -> None:
    """The ``fluidopt`` program: :func:`main`, then exit with its status. Once the status is decided, a late
    Ctrl-C or SIGTERM (the work is done, the output written) is ignored rather than turned into a
    traceback during the interpreter's shutdown."""
    import signal

    code = main()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.stdout.flush()
    sys.stderr.flush()
    if code > 128:
        # Interrupted: what is kept is already durable (the store is synced line by line; no table of
        # the sweep was written). Exit now, so that no thread a pool or a cluster left behind can hold
        # the process in the interpreter's shutdown.
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
