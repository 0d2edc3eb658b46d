"""Shared CLI pieces for many-run commands: where runs execute and whether progress is shown."""

from __future__ import annotations

import argparse
import sys


def add_scale_arguments(p: argparse.ArgumentParser) -> None:
    from fluidopt.executor import add_executor_arguments

    add_executor_arguments(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it is off anyway when stderr "
                   "is not a terminal)")


def check_workers(args: argparse.Namespace) -> None:
    from fluidopt.errors import UsageError

    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers: expected an integer >= 1, got {args.workers}")


def make_executor(args: argparse.Namespace, runs: int | None = None):
    """The executor the flags ask for; local workers are capped at the number of runs."""
    from fluidopt.executor import executor_from_args

    return executor_from_args(args, runs, imports=getattr(args, "imports", ()) or ())


def progress_enabled(args: argparse.Namespace) -> bool:
    return not getattr(args, "no_progress", False) and not getattr(args, "json", False) and \
        bool(getattr(sys.stderr, "isatty", lambda: False)())
