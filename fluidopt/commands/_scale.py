"""Shared CLI pieces for many-run commands: where runs execute and whether progress is shown."""

from __future__ import annotations

import argparse
import contextlib
import sys


def add_scale_arguments(p: argparse.ArgumentParser) -> None:
    from fluidopt.harness.executor import add_executor_arguments

    add_executor_arguments(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it is off anyway when stderr "
                   "is not a terminal)")


def check_workers(args: argparse.Namespace) -> None:
    from fluidopt.core.errors import UsageError

    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers: expected an integer >= 1, got {args.workers}")


def make_executor(args: argparse.Namespace, runs: int | None = None):
    """The executor the flags ask for; local workers are capped at the number of runs."""
    from fluidopt.harness.executor import executor_from_args

    return executor_from_args(args, runs, imports=getattr(args, "imports", ()) or ())


def progress_enabled(args: argparse.Namespace) -> bool | str:
    """A progress bar on a terminal; ``"log"`` (a plain line every few seconds,
    :class:`fluidopt.harness.executor.Progress`) when stderr is not one, so a long command in a CI log or a file is
    not silent; off with ``--no-progress`` or ``--json``."""
    if getattr(args, "no_progress", False) or getattr(args, "json", False):
        return False
    return True if getattr(sys.stderr, "isatty", lambda: False)() else "log"


def add_seed_arguments(p: argparse.ArgumentParser, *, seeds: int) -> None:
    """``--seeds N`` (how many) and ``--seed S`` (the first): the runs use seeds S, S+1, ..., S+N-1. The same
    two words mean the same in every command (``simulate`` and ``rl`` take one ``--seed``)."""
    p.add_argument("--seeds", type=int, default=seeds, metavar="N", help=f"independent seeds per point (default {seeds})")
    p.add_argument("--seed", type=int, default=None, metavar="S",
                   help="the first seed: the runs use S, S+1, ..., S+N-1 (default 0)")


def seed_list(args: argparse.Namespace) -> list[int]:
    """The seeds ``--seed``/``--seeds`` ask for, checked; a note when ``--seed`` comes alone, since it once
    abbreviated ``--seeds`` (a count) in ``fluidopt run``."""
    from fluidopt.core.errors import UsageError

    if args.seeds is None or args.seeds < 1:
        raise UsageError(f"--seeds: expected an integer >= 1, got {args.seeds}")
    first = 0 if args.seed is None else args.seed
    if first < 0:
        raise UsageError(f"--seed: expected an integer >= 0, got {first}")
    if args.seed is not None and "--seeds" not in sys.argv and not getattr(args, "json", False):
        print(f"note: --seed {first} is the first seed (seeds {first}..{first + args.seeds - 1}); for a number of "
              "seeds use --seeds N (--seed no longer abbreviates --seeds)", file=sys.stderr)
    return list(range(first, first + args.seeds))


@contextlib.contextmanager
def say_what_is_stored(out):
    """An interruption outside the sweep itself (the LP solve, the pool's start, a probe between two sweeps)
    still says in its one line what the results folder holds."""
    try:
        yield
    except KeyboardInterrupt as e:
        if getattr(e, "kept", ""):
            raise
        import fluidopt.core.interrupt as interrupt
        from fluidopt.harness.comparison import stored_line

        raise interrupt.interrupted_from(e, stored_line(out)) from None
