"""Shared CLI pieces for many-run commands: where runs execute and whether progress is shown."""

from __future__ import annotations

import argparse
import sys


def add_scale_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("where runs execute (same numbers on every backend)")
    g.add_argument("--workers", type=int, default=None,
                   help="local worker processes, or LocalCluster workers with --dask (default: CPU count)")
    g.add_argument("--dask", action="store_true", help="run on a Dask LocalCluster (pip install 'fluidopt[dask]')")
    g.add_argument("--scheduler", default=None, metavar="tcp://HOST:PORT",
                   help="run on an existing Dask cluster (its scheduler's address)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it is off anyway when stderr "
                   "is not a terminal)")


def check_workers(args: argparse.Namespace) -> None:
    from fluidopt.errors import UsageError

    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers: expected an integer >= 1, got {args.workers}")


def make_executor(args: argparse.Namespace, runs: int | None = None):
    """The executor the flags ask for; local workers are capped at the number of runs."""
    from fluidopt.executor import make_executor as mk

    check_workers(args)
    workers = args.workers
    if workers is None and runs is not None and not (args.dask or args.scheduler):
        import os

        workers = max(1, min(os.cpu_count() or 1, runs))
    return mk(workers, dask=args.dask, scheduler=args.scheduler, imports=getattr(args, "imports", ()) or ())


def progress_enabled(args: argparse.Namespace) -> bool:
    return not getattr(args, "no_progress", False) and not getattr(args, "json", False) and \
        bool(getattr(sys.stderr, "isatty", lambda: False)())
