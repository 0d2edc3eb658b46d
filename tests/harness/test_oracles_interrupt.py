"""The interruption contract (fluidopt/core/interrupt.py, its module docstring) checked function by function
in this process: exit statuses 128 + signal (130 for SIGINT, 143 for SIGTERM), the one line a command
prints, which signal a plain KeyboardInterrupt stands for, the handlers installed and restored. Signals
are raised in this process (``signal.raise_signal``) inside ``handle_sigterm``; ``os._exit`` is replaced by a stub
that raises, so nothing here ends the test process. Every test restores the signal handlers, the
excepthooks and logging (the ``restore`` fixture)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

import pytest

from fluidopt import interrupt
from fluidopt.core.errors import ExecutorLost, ScenarioError
from fluidopt.core.interrupt import Interrupted


class _Exit(Exception):
    def __init__(self, status):
        super().__init__(status)
        self.status = status


@pytest.fixture(autouse=True)
def restore(monkeypatch):
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    # a process started in the background inherits Ctrl-C ignored, which handle_sigterm keeps: start
    # from Python's own Ctrl-C handler
    signal.signal(signal.SIGINT, signal.default_int_handler)
    hook, thook = sys.excepthook, threading.excepthook
    interrupt.clear()

    def fake_exit(status):
        raise _Exit(status)

    monkeypatch.setattr(os, "_exit", fake_exit)
    yield
    for s, h in saved.items():
        signal.signal(s, h)
    sys.excepthook, threading.excepthook = hook, thook
    logging.disable(logging.NOTSET)
    interrupt.clear()


def test_interrupted_carries_its_signal_what_was_kept_and_the_partial_result():
    e = Interrupted()
    assert isinstance(e, KeyboardInterrupt)
    assert e.signum == signal.SIGINT == 2 and type(e.signum) is int
    assert e.kept == "" and e.partial is None
    assert e.args == ("SIGINT",)  # no line on what was kept: the signal's name
    t = Interrupted(signal.SIGTERM, "3 of 5 runs kept", partial=[1, 2, 3])
    assert t.signum == 15 and t.kept == "3 of 5 runs kept" and t.partial == [1, 2, 3]
    assert t.args == ("3 of 5 runs kept",)
    assert Interrupted(signal.SIGTERM).args == ("SIGTERM",)


def test_note_pending_clear():
    assert interrupt.pending() is None
    interrupt.note(signal.SIGTERM)
    assert interrupt.pending() == 15 and type(interrupt.pending()) is int
    interrupt.note(2)
    assert interrupt.pending() == 2  # the last signal noted
    interrupt.clear()
    assert interrupt.pending() is None


def test_exit_status_is_128_plus_the_signal():
    assert interrupt.exit_status(Interrupted(signal.SIGINT)) == 130
    assert interrupt.exit_status(Interrupted(signal.SIGTERM)) == 143
    # a plain KeyboardInterrupt is Ctrl-C unless a signal was noted; an Interrupted's own signal wins
    assert interrupt.signum_of(KeyboardInterrupt()) == 2
    assert interrupt.exit_status(KeyboardInterrupt()) == 130
    interrupt.note(signal.SIGTERM)
    assert interrupt.signum_of(KeyboardInterrupt()) == 15
    assert interrupt.exit_status(KeyboardInterrupt()) == 143
    assert interrupt.exit_status(Interrupted(signal.SIGINT)) == 130


def test_interrupted_from_keeps_the_signal_and_the_line():
    interrupt.note(signal.SIGTERM)
    e = interrupt.interrupted_from(KeyboardInterrupt(), "2 of 4 runs kept", partial="p")
    assert (e.signum, e.kept, e.partial) == (15, "2 of 4 runs kept", "p")
    interrupt.clear()
    inner = Interrupted(signal.SIGTERM, "inner line")
    e = interrupt.interrupted_from(inner)  # no new line: the exception's own
    assert (e.signum, e.kept, e.partial) == (15, "inner line", None)
    e = interrupt.interrupted_from(inner, "outer line", partial=7)
    assert (e.kept, e.partial) == ("outer line", 7)
    e = interrupt.interrupted_from(KeyboardInterrupt())
    assert (e.signum, e.kept) == (2, "")


def test_the_one_line():
    assert interrupt.message("fluidopt run", Interrupted(signal.SIGTERM, "7 of 12 runs kept in out/store.jsonl")) == (
        "fluidopt run: interrupted (SIGTERM): 7 of 12 runs kept in out/store.jsonl")
    assert interrupt.message("x.py", KeyboardInterrupt()) == "x.py: interrupted (SIGINT): nothing was written"


def test_report_prints_the_line_on_stderr_quiets_logging_and_returns_the_status(capsys):
    assert interrupt.report("fluidopt sweep", Interrupted(signal.SIGTERM, "1 of 2 kept")) == 143
    out, err = capsys.readouterr()
    assert out == "" and err == "fluidopt sweep: interrupted (SIGTERM): 1 of 2 kept\n"
    # the torn-down threads are quiet: logging off up to CRITICAL, thread exceptions swallowed
    assert logging.root.manager.disable == logging.CRITICAL
    t = threading.Thread(target=lambda: 1 / 0)
    t.start()
    t.join()
    assert capsys.readouterr().err == ""  # no traceback from the thread
    assert interrupt.report("p", KeyboardInterrupt()) == 130


def test_handle_sigterm_turns_sigterm_into_interrupted_and_restores_the_handlers():
    def before_term(signum, frame):  # a handler of the caller's, put back on exit
        raise AssertionError("not restored")

    signal.signal(signal.SIGTERM, before_term)
    before_int = signal.getsignal(signal.SIGINT)
    interrupt.note(signal.SIGINT)
    with pytest.raises(Interrupted) as info:
        with interrupt.handle_sigterm():
            assert interrupt.pending() is None  # a signal noted before the command is forgotten
            assert signal.getsignal(signal.SIGTERM) is interrupt._on_signal
            assert signal.getsignal(signal.SIGINT) is interrupt._on_signal
            # raise_signal runs the Python handler before it returns (os.kill would leave that to the
            # next bytecode check of the main thread, late on a loaded machine)
            signal.raise_signal(signal.SIGTERM)
    assert info.value.signum == 15 and info.value.args == ("SIGTERM",)
    assert interrupt.pending() == 15  # noted, for the layers that see only a wrapped error later
    assert signal.getsignal(signal.SIGTERM) is before_term
    assert signal.getsignal(signal.SIGINT) is before_int


def test_handle_sigterm_leaves_an_ignored_ctrl_c_ignored():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with interrupt.handle_sigterm():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is interrupt._on_signal
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_handle_sigterm_outside_the_main_thread_changes_nothing():
    seen = []
    interrupt.note(signal.SIGTERM)

    def body():
        with interrupt.handle_sigterm():
            seen.append((interrupt.pending(), signal.getsignal(signal.SIGTERM)))

    before = signal.getsignal(signal.SIGTERM)
    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == [(15, before)]  # not cleared, no handler


def test_the_signal_handler_notes_quiets_and_raises():
    with pytest.raises(Interrupted) as info:
        interrupt._on_signal(signal.SIGTERM, None)
    assert info.value.signum == 15 and interrupt.pending() == 15
    assert logging.root.manager.disable == logging.CRITICAL


def test_script_main_returns_mains_status_and_then_ignores_late_signals():
    assert interrupt.script_main(lambda: None, prog="s") == 0
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    assert interrupt.script_main(lambda: 4, prog="s") == 4


def test_script_main_one_line_and_128_plus_signal_on_an_interruption(capsys):
    def main():
        raise Interrupted(signal.SIGTERM, "half kept")

    with pytest.raises(_Exit) as info:
        interrupt.script_main(main, prog="ex.py")
    assert info.value.status == 143
    assert capsys.readouterr().err == "ex.py: interrupted (SIGTERM): half kept\n"


def test_script_main_names_the_script_from_argv(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["examples/scripts/sweep.py", "--x"])

    def main():
        raise KeyboardInterrupt

    with pytest.raises(_Exit) as info:
        interrupt.script_main(main)
    assert info.value.status == 130
    assert capsys.readouterr().err == "sweep.py: interrupted (SIGINT): nothing was written\n"
    monkeypatch.setattr(sys, "argv", [""])

    def bad():
        raise ScenarioError("no")

    assert interrupt.script_main(bad) == 2
    assert capsys.readouterr().err == "script: error: no\n"


def test_script_main_own_errors_one_line_and_their_status(capsys):
    def bad():
        raise ScenarioError("horizon:\n   must be   positive")

    assert interrupt.script_main(bad, prog="p") == 2
    assert capsys.readouterr().err == "p: error: horizon: must be positive\n"

    def lost():
        raise ExecutorLost("the scheduler went away")

    assert interrupt.script_main(lost, prog="p") == 3
    assert capsys.readouterr().err == "p: error: the scheduler went away\n"


def test_script_main_a_bug_keeps_its_traceback_unless_a_signal_caused_it(capsys):
    def bug():
        raise ZeroDivisionError("bug")

    with pytest.raises(ZeroDivisionError):
        interrupt.script_main(bug, prog="p")

    def cut_short():
        interrupt.note(signal.SIGTERM)  # an import cut short by SIGTERM fails with some other error
        raise ImportError("partially initialized module")

    assert interrupt.script_main(cut_short, prog="p") == 143
    assert capsys.readouterr().err == "p: interrupted (SIGTERM): nothing was written\n"


def test_script_guard_installs_the_handlers_and_a_one_line_hook(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda *a: seen.append(a))
    monkeypatch.setattr(sys, "argv", ["/a/b/train.py"])
    interrupt.script_guard()
    assert signal.getsignal(signal.SIGTERM) is interrupt._on_signal
    assert signal.getsignal(signal.SIGINT) is interrupt._on_signal
    with pytest.raises(_Exit) as info:
        sys.excepthook(Interrupted, Interrupted(signal.SIGTERM, "k"), None)
    assert info.value.status == 143
    assert capsys.readouterr().err == "train.py: interrupted (SIGTERM): k\n"
    v = ValueError("v")
    sys.excepthook(ValueError, v, None)  # anything else: the previous hook
    assert seen == [(ValueError, v, None)]
    monkeypatch.setattr(sys, "argv", [])
    with pytest.raises(_Exit) as info:
        sys.excepthook(KeyboardInterrupt, KeyboardInterrupt(), None)
    assert info.value.status == 130
    assert capsys.readouterr().err == "script: interrupted (SIGINT): nothing was written\n"


def test_script_guard_leaves_an_ignored_ctrl_c_ignored_and_does_nothing_off_the_main_thread():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    interrupt.script_guard()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is interrupt._on_signal
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    hook = sys.excepthook
    t = threading.Thread(target=interrupt.script_guard)
    t.start()
    t.join()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and sys.excepthook is hook
