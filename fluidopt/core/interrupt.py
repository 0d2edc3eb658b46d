"""The interruption contract of every long command and script.

Ctrl-C (SIGINT) or SIGTERM at any moment of a sweep, a search or a training run:

- stops within about a second (the simulator checks between events; pools are terminated, not
  drained);
- raises :class:`Interrupted` (a :class:`KeyboardInterrupt`) carrying the signal and one line that
  says what was kept ("7 of 12 runs kept in out/store.jsonl; rerun the same command to resume");
- never lets a cut-short result pass as a finished one: a simulation stopped by a signal inside a
  sweep is discarded, not stored, and no table of an incomplete sweep is written;
- the command line prints that one line and exits ``128 + signal`` (130 for SIGINT, 143 for
  SIGTERM), with no traceback.

:func:`note` records a signal that some layer handled gracefully (the simulator's Ctrl-C handler stops
its loop between two events and returns a partial result flagged ``interrupted``); a sweep checks
:func:`pending` after each run so that such a partial result is not mistaken for a whole one.
:func:`handle_sigterm` turns SIGTERM into the same exception as Ctrl-C for the time of a command (and
notes both), and
:func:`script_main` gives an example script the same contract as the CLI.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Interrupted", "raise_if_cut", "note", "pending", "clear", "exit_status", "handle_sigterm", "script_guard", "script_main"]

_pending: int | None = None  # the last signal noted and not yet acted on


class Interrupted(KeyboardInterrupt):
    """A run, sweep or search stopped by a signal. ``signum``: SIGINT or SIGTERM; ``kept``: one line on
    what was kept (empty when nothing long had started); ``partial``: what finished, where the caller
    can use it (e.g. a :class:`~fluidopt.harness.Comparison` of the finished runs), else None."""

    def __init__(self, signum: int = signal.SIGINT, kept: str = "", partial: Any = None) -> None:
        super().__init__(kept or signal.Signals(signum).name)
        self.signum = int(signum)
        self.kept = kept
        self.partial = partial


def note(signum: int) -> None:
    """Record that ``signum`` arrived and was handled gracefully somewhere below."""
    global _pending
    _pending = int(signum)


def pending() -> int | None:
    """The signal noted since the last :func:`clear`, or None."""
    return _pending


def clear() -> None:
    global _pending
    _pending = None


def signum_of(exc: BaseException) -> int:
    """The signal behind a KeyboardInterrupt (SIGINT unless it says otherwise)."""
    if isinstance(exc, Interrupted):
        return exc.signum
    return _pending if _pending is not None else int(signal.SIGINT)


def exit_status(exc: BaseException) -> int:
    """``128 + signal``: 130 for Ctrl-C, 143 for SIGTERM."""
    return 128 + signum_of(exc)


def interrupted_from(exc: BaseException, kept: str = "", partial: Any = None) -> Interrupted:
    """``exc`` (any KeyboardInterrupt) as an :class:`Interrupted` with what was kept."""
    return Interrupted(signum_of(exc), kept or getattr(exc, "kept", ""), partial)


def raise_if_cut(result: Any, kept: str = "") -> None:
    """Raise :class:`Interrupted` when ``result`` (a simulation's result) was cut short by a signal.

    The simulator stops at Ctrl-C or SIGTERM and returns what it has, flagged ``interrupted``, so that
    ``fluidopt simulate`` can keep a cut run's records. A caller that builds on whole runs (a search, a
    plan, a prediction) must stop there: going on would report a partial run as a whole one."""
    if getattr(result, "interrupted", False):
        raise Interrupted(_pending if _pending is not None else signal.SIGINT, kept)


def _quiet_threads() -> None:
    # Threads torn down by the interruption (a pool's manager, a solver's output reader, a Dask client)
    # may raise or log in turn; their tracebacks would bury the one line the user should read.
    threading.excepthook = lambda args: None
    import logging

    logging.disable(logging.CRITICAL)


def _on_signal(signum, frame) -> None:
    note(signum)
    _quiet_threads()
    raise Interrupted(signum)


@contextlib.contextmanager
def handle_sigterm() -> Iterator[None]:
    """While inside, SIGTERM raises :class:`Interrupted` as Ctrl-C raises KeyboardInterrupt, and both are
    noted (:func:`pending`), so that an error an interrupted import or thread raises later (a half-loaded
    module, a wrapped KeyboardInterrupt) is still reported as the interruption it is. Main thread only
    (elsewhere a no-op); the previous handlers are restored on exit. A Ctrl-C that the process inherited
    as ignored (a background job) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    clear()
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, _on_signal)}
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, _on_signal)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def report(prog: str, exc: BaseException) -> int:
    """Quiet the threads the interruption tears down, print :func:`message` on stderr and return the exit
    status (128 + signal): what the command line and :func:`script_main` do when interrupted."""
    _quiet_threads()
    print(message(prog, exc), file=sys.stderr, flush=True)
    sys.stdout.flush()
    return exit_status(exc)


def message(prog: str, exc: BaseException) -> str:
    """The one line a command prints when interrupted."""
    name = signal.Signals(signum_of(exc)).name
    kept = getattr(exc, "kept", "") or "nothing was written"
    return f"{prog}: interrupted ({name}): {kept}"


def script_guard() -> None:
    """Give a script the command line's contract from its first line on: call it right after the
    ``__future__`` import, before the heavy imports. Ctrl-C or SIGTERM then raise :class:`Interrupted`
    (noted), and one that escapes (during an import, before :func:`script_main` runs) prints one line and
    exits 130 / 143 instead of a traceback or a silent kill."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, _on_signal)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _on_signal)
    previous = sys.excepthook

    def hook(kind, value, tb):
        if isinstance(value, KeyboardInterrupt):
            prog = sys.argv[0].rsplit("/", 1)[-1] if sys.argv and sys.argv[0] else "script"
            import os

            os._exit(report(prog, value))
        previous(kind, value, tb)

    sys.excepthook = hook


def script_main(main: Callable[[], Any], prog: str | None = None) -> int:
    """Run an example script's ``main()`` under the command line's contract: one line and exit 130/143
    on Ctrl-C or SIGTERM, one line and exit 2 on fluidopt's own errors. Use as
    ``sys.exit(script_main(main))``."""
    from fluidopt.core.errors import FluidoptError

    prog = prog or (sys.argv[0].rsplit("/", 1)[-1] if sys.argv and sys.argv[0] else "script")
    try:
        with handle_sigterm():
            out = main()
        # the status is decided: a late signal is ignored rather than turned into a traceback at exit
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return int(out or 0)
    except KeyboardInterrupt as e:
        import os

        os._exit(report(prog, e))  # (as the command line: no thread left behind can hold the exit)
    except FluidoptError as e:
        print(f"{prog}: error: {' '.join(str(e).split())}", file=sys.stderr, flush=True)
        return getattr(e, "exit_status", 2)
    except Exception:
        if _pending is None:
            raise  # a bug: its traceback
        # the aftermath of a signal (an import it cut short): the interruption, in one line
        return report(prog, Interrupted(_pending))
