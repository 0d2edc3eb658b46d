"""The results folder's lock (fluidopt.core.files.lock_folder, on filelock) against real processes: a live
holder in another process, a holder killed with -9 (and its forked child still alive), a holder stopped
with Ctrl-C, and re-entry within one process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fluidopt.core.errors import FolderInUseError
from fluidopt.core.files import LOCK_FILE, holds, lock_folder

REPO = Path(__file__).resolve().parents[2]

# A holder in its own process: takes the folder, optionally forks a child that keeps running (as a pool
# worker would), says "held" and waits to be signalled.
HOLDER = """
import os, sys, time
from fluidopt.core.files import lock_folder
with lock_folder(sys.argv[1], command="holder run"):
    if sys.argv[2] == "fork" and os.fork() == 0:
        time.sleep(60)
        os._exit(0)
    print("held", flush=True)
    time.sleep(60)
print("released", flush=True)
"""


def _holder(folder: Path, fork: bool = False) -> subprocess.Popen:
    # this checkout's fluidopt, whatever is installed (and the rest of the caller's path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), "fork" if fork else "-"], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.stdout.readline().strip() == "held", p.stderr.read()
    return p


def _refused(folder: Path, pid: int) -> None:
    with pytest.raises(FolderInUseError, match=rf"^--out '.*': in use by process {pid} \(holder run\); wait"):
        with lock_folder(folder):
            pass


def test_a_live_holder_in_another_process_is_refused_and_keeps_its_record(tmp_path):
    holder = _holder(tmp_path)
    try:
        _refused(tmp_path, holder.pid)
        _refused(tmp_path, holder.pid)  # the refused try did not wipe the holder's PID from the file
        assert (tmp_path / LOCK_FILE).read_text() == f"{holder.pid} holder run\n"
        assert not holds(tmp_path)
    finally:
        holder.kill()
        holder.wait()


def test_a_holder_killed_with_9_is_taken_over_even_while_its_forked_child_lives(tmp_path):
    # The kernel drops an flock only when every descriptor of its open file is closed; a forked child
    # (a pool worker) shares the holder's. filelock closes it in the child at fork, so the folder is
    # free the moment the holder dies, not when its last worker notices and exits.
    holder = _holder(tmp_path, fork=True)
    child = None
    try:
        _refused(tmp_path, holder.pid)
        child = int(subprocess.run(["pgrep", "-P", str(holder.pid)], capture_output=True, text=True).stdout.split()[0])
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        os.kill(child, 0)  # the child is still alive
        assert (tmp_path / LOCK_FILE).read_text().split()[0] == str(holder.pid)  # a stale record
        with lock_folder(tmp_path, command="next") as p:
            assert (p / LOCK_FILE).read_text() == f"{os.getpid()} next\n"
            assert holds(tmp_path)
        assert not (tmp_path / LOCK_FILE).exists() and not holds(tmp_path)
    finally:
        if child is not None:
            os.kill(child, signal.SIGKILL)
        holder.kill()
        holder.wait()


def test_ctrl_c_releases_the_folder_and_removes_the_lock_file(tmp_path):
    holder = _holder(tmp_path)
    t0 = time.monotonic()
    holder.send_signal(signal.SIGINT)
    _, err = holder.communicate(timeout=30)
    assert holder.returncode != 0 and "KeyboardInterrupt" in err
    assert time.monotonic() - t0 < 5
    assert not (tmp_path / LOCK_FILE).exists()
    with lock_folder(tmp_path):
        pass


def test_re_entry_in_one_process_holds_until_the_outer_exit(tmp_path):
    with lock_folder(tmp_path, command="outer") as p:
        with lock_folder(tmp_path / ".." / tmp_path.name, command="inner"):  # the same folder, spelled otherwise
            assert holds(tmp_path)
        assert holds(tmp_path) and (p / LOCK_FILE).read_text() == f"{os.getpid()} outer\n"
    assert not holds(tmp_path) and not (tmp_path / LOCK_FILE).exists()
