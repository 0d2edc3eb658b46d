"""Fixtures that start fluidopt's servers as child processes and always stop them, so that no test
leaves a process behind (an autouse fixture checks this process's children after every test)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

try:  # the serve extra (starlette, uvicorn, httpx); without it this folder is not collected
    import httpx  # noqa: F401
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError:
    collect_ignore_glob = ["test_*.py"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start_engine(*args: str, timeout: float = 30.0) -> tuple[subprocess.Popen, str]:
    """``fluidopt serve-engine --port 0 ARGS`` from this checkout; (process, base URL) once it listens."""
    proc = subprocess.Popen([sys.executable, "-m", "fluidopt", "serve-engine", "--port", "0", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if m:
            return proc, f"http://127.0.0.1:{m.group(1)}"
        if proc.poll() is not None:
            break
    stop(proc)
    raise RuntimeError(f"serve-engine did not start: {line!r} {proc.stderr.read()!r}")


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


@pytest.fixture(autouse=True)
def no_orphans():
    """After each test of this folder, this process has no child left."""
    from fluidopt.serving.loop import alive_children

    before = set(alive_children())
    yield
    left = set(alive_children()) - before
    assert not left, f"child processes left behind: {sorted(left)}"


@pytest.fixture
def engine_factory():
    procs: list[subprocess.Popen] = []

    def make(*args: str) -> str:
        proc, url = start_engine(*args)
        procs.append(proc)
        return url

    make.procs = procs
    yield make
    for p in procs:
        stop(p)
