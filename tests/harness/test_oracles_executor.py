"""The executor layer's small promises (fluidopt.harness.executor; docs/scaling.md): runs without an executor,
the plain progress lines, the CLI flags and the scheduler address (mutation survivors of issue 35)."""

from __future__ import annotations

import argparse
import sys

import pytest

from fluidopt.core.errors import UsageError
from fluidopt.harness.executor import (
    LocalExecutor,
    Progress,
    add_executor_arguments,
    check_scheduler_address,
    make_executor,
    run_jobs,
)


def _square(job):
    return job["x"] ** 2


def test_run_jobs_without_an_executor_runs_here():
    assert run_jobs(_square, [{"x": 2}, {"x": 3}]) == {0: 4, 1: 9}


def test_plain_progress_lines_on_stderr_without_tqdm(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm fails: the plain-line fallback
    done = run_jobs(_square, [{"x": 1}, {"x": 2}], progress=True, note=lambda j, r: f"x={j['x']}")
    assert done == {0: 1, 1: 4}
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.splitlines() == ["[1/2] x=1 (ETA 0 s)", "[2/2] x=2 (ETA 0 s)"]


def test_progress_is_on_only_on_a_terminal_by_default(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)

    class Tty:
        def isatty(self):
            return True

        def write(self, s):
            return len(s)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stderr", Tty())
    assert Progress(3).enabled is True
    assert Progress(0).enabled is False and Progress(3, enabled=False).enabled is False
    monkeypatch.setattr(sys, "stderr", object())  # no isatty: off
    assert Progress(3).enabled is False


def test_cli_flags_and_their_defaults():
    p = argparse.ArgumentParser()
    add_executor_arguments(p, workers=3)
    a = p.parse_args([])
    assert (a.workers, a.dask, a.scheduler) == (3, False, None)
    assert "(default: 3)" in p.format_help()
    q = argparse.ArgumentParser()
    add_executor_arguments(q)
    text = " ".join(q.format_help().split())
    assert "(default: CPU count)" in text and "run on a Dask LocalCluster" in text
    assert q.parse_args(["--workers", "2", "--scheduler", "tcp://h:1"]).workers == 2


def test_scheduler_addresses():
    assert check_scheduler_address("tcp://10.0.0.1:8786") == "tcp://10.0.0.1:8786"
    assert check_scheduler_address(" 10.0.0.1:8786 ") == "tcp://10.0.0.1:8786"
    assert check_scheduler_address("tls://[::1]:443") == "tls://[::1]:443"
    for bad in ("tcp://host", "tcp://:8786", "tcp://host:0", "http://host:80", "host:port"):
        with pytest.raises(UsageError, match="--scheduler: expected an address tcp://HOST:PORT"):
            check_scheduler_address(bad)
    # a scheduler alone asks for Dask (its address is checked before anything starts)
    with pytest.raises(UsageError, match="scheduler"):
        make_executor(scheduler="nonsense")
    assert isinstance(make_executor(2), LocalExecutor) and make_executor(2).workers == 2
