"""Faults under real signals and real processes: the interruption contract of the long commands.

Each test starts ``fluidopt`` (or a Dask cluster) as a subprocess and hits it the way a user or an
operating system does: Ctrl-C (SIGINT) and SIGTERM at seeded random moments, kill -9, two processes
on one results folder, read-only and full output folders. Each asserts the contract: exit 130 / 143 /
2 / 3, one line on stderr and no traceback, no orphan worker, no temporary file left, nothing partial
written as if whole, and after a rerun the same tables as an uninterrupted run (wall-clock columns
aside). The signals always go to a real process; the uninterrupted references and the reruns after a
signal, whose subject is the folder, run in the test's process (``_here``).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from builders import command_process, process_state, state_changes

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.waits  # signal drills: processes started, waited on and stopped


def _compiled() -> bool:
    from fluidopt.sim.backend import compiled_status

    return compiled_status()[0]


# Long enough to be interrupted mid-way (about 1 s of simulation per run on one core), short enough
# for the suite: 2 policies x 3 seeds on 60 GPUs (a fifth of the horizon on the 4x slower pure-Python engine).
HORIZON = "1500" if _compiled() else "300"
RUN = ["run", "--gpus", "60", "--horizon", HORIZON, "--warmup", "20", "--seeds", "3", "--policies",
       "gate-and-route,fi-wsp", "--no-progress"]
# A stop is a second or less on an idle machine (tools/fault_drill.py records it); the test only catches a
# hang, so that a loaded CI machine does not fail it.
STOP_LIMIT_S = 10.0
WALL = {"wall_seconds"}


def _start(args, workers: int, out: Path) -> subprocess.Popen:
    # A process started in the background inherits Ctrl-C ignored; a user's terminal does not.
    return subprocess.Popen([sys.executable, "-m", "fluidopt", *args, "--workers", str(workers), "--out", str(out)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))


def _here(args, workers: int, out: Path) -> None:
    """``fluidopt ARGS`` run to the end in this process (``fluidopt.cli.main``), its output swallowed.

    For the uninterrupted references and the reruns, whose subject is what a command reads from and writes
    to the folder, not the process: each saves a ``python -m fluidopt`` start (imports, about 3 CPU-s). The
    signals themselves always go to a real process (:func:`_start`). Fails if the command left this
    process changed (``builders.process_state``), as ``run_cli_here`` does."""
    import contextlib
    import io

    from fluidopt.cli import main

    argv = [*args, "--workers", str(workers), "--out", str(out)]
    # where _start runs it, with the figures' backend run_cli_here gives (both restored before the check)
    with command_process(REPO):
        before = process_state()
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = main(argv)
        after = process_state()
    changed = state_changes(before, after)
    assert code == 0, f"fluidopt {' '.join(argv)}: exit {code}: {err.getvalue()}"
    assert not changed, f"fluidopt {' '.join(argv)} left the process changed: " + "; ".join(changed)


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(d.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_for_store(out: Path, proc: subprocess.Popen, lines: int, limit: float = 120.0) -> None:
    store = out / "store.jsonl"
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit and proc.poll() is None:
        if store.exists() and store.read_bytes().count(b"\n") >= lines:
            return
        time.sleep(0.02)


def _tables(out: Path) -> dict[str, pd.DataFrame]:
    got = {}
    for name in ("runs", "classes", "bounds", "summary"):
        df = pd.read_csv(out / f"{name}.csv")
        got[name] = df[[c for c in df.columns if c not in WALL]]
    return got


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The tables of an uninterrupted run (in this process: the tables do not depend on the process or the
    number of workers, which the 1- and 2-worker reruns against it check)."""
    out = tmp_path_factory.mktemp("faults") / "reference"
    _here(RUN, 1, out)
    return _tables(out)


CASES = [("SIGINT", 1), ("SIGINT", 2), ("SIGTERM", 1), ("SIGTERM", 2), ("SIGKILL", 2)]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("sig, workers", CASES, ids=[f"{s}-{w}w" for s, w in CASES])
def test_signal_mid_sweep_keeps_what_finished_and_the_rerun_matches(sig, workers, reference, tmp_path):
    rng = random.Random(f"{sig}-{workers}")
    out = tmp_path / "out"
    proc = _start(RUN, workers, out)
    _wait_for_lock(out, proc)
    _wait_for_store(out, proc, rng.choice([0, 1, 2]))
    time.sleep(rng.uniform(0.0, 0.8))  # a random moment: the LP solve, the pool's start or inside a run
    assert proc.poll() is None, "the sweep finished before the signal; make it longer"
    kids = _children(proc.pid)
    t0 = time.monotonic()
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=30)
    stopped = time.monotonic() - t0
    if sig != "SIGKILL":
        assert stopped < STOP_LIMIT_S, f"took {stopped:.2f} s to stop"
        assert proc.returncode == 128 + getattr(signal, sig)
        assert "Traceback" not in err
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"fluidopt run: interrupted ({sig})"), err
        # what was kept, and where, whatever the moment (the LP solve, the pool's start, a run, the tables)
        assert str(out / "store.jsonl") in lines[0] and ("finished" in lines[0] or "kept" in lines[0]), lines[0]
    time.sleep(PARENT_GRACE)
    assert not [k for k in kids if _alive(k)], "pool workers outlived their parent"
    # nothing partial written as if whole: no table of the incomplete sweep, no temporary file
    names = {p.name for p in out.iterdir()}
    stored = (out / "store.jsonl").read_bytes().count(b"\n") if (out / "store.jsonl").exists() else 0
    if stored < 6:  # (a signal after the last run and its tables finds a whole sweep: that is fine too)
        assert not names & {"runs.csv", "classes.csv", "summary.csv", "meta.json", "comparison.png"}, names
    if sig != "SIGKILL":
        assert not [n for n in names if ".tmp-" in n or n.startswith(".fluidopt")], names
    # the rerun resumes from the store and ends with the uninterrupted run's tables (in this process: the
    # subject is what the rerun finds in the folder, the signal went to a real one)
    _here(RUN, workers, out)
    got = _tables(out)
    for name, df in reference.items():
        pd.testing.assert_frame_equal(got[name], df, check_exact=True, obj=name)
    assert (out / "store.jsonl").read_bytes().count(b"\n") == 6  # nothing duplicated
    assert not [p.name for p in out.iterdir() if ".tmp-" in p.name or p.name.startswith(".fluidopt")]


PARENT_GRACE = 1.5  # seconds: a pool worker notices its parent died within executor.PARENT_POLL_S


@pytest.mark.integration
def test_two_processes_on_one_folder_one_works_one_exits_2_naming_the_holder(tmp_path):
    out = tmp_path / "shared"
    args = ["run", "--gpus", "30", "--horizon", "300", "--warmup", "20", "--seeds", "2", "--policies", "fi-wsp",
            "--no-progress"]
    a = _start(args, 1, out)
    _wait_for_lock(out, a)
    b = _start(args, 1, out)
    _, err_b = b.communicate(timeout=120)
    _, err_a = a.communicate(timeout=240)
    assert a.returncode == 0, err_a
    assert b.returncode == 2, err_b
    assert f"in use by process {a.pid}" in err_b and "Traceback" not in err_b
    lines = (out / "store.jsonl").read_text().splitlines()
    assert len(lines) == 2 and len({ln.split(",")[0] for ln in lines}) == 2  # no line lost, none twice


def _wait_for_lock(out: Path, proc: subprocess.Popen) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60 and proc.poll() is None:
        if (out / ".fluidopt.lock").exists() and (out / ".fluidopt.lock").read_text().strip():
            return
        time.sleep(0.01)


def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    from fluidopt.core.files import LOCK_FILE, lock_folder

    (tmp_path / LOCK_FILE).write_text("999999 fluidopt run\n")  # left by a process killed with -9
    (tmp_path / ".runs.tmp-999999.csv").write_text("half a ta")  # and its half-written table
    with lock_folder(tmp_path) as p:
        assert (p / LOCK_FILE).read_text().split()[0] == str(os.getpid())
        assert not (tmp_path / ".runs.tmp-999999.csv").exists()
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_live_holder_is_refused_with_its_pid(tmp_path):
    from fluidopt.core.errors import FolderInUseError
    from fluidopt.core.files import lock_folder

    code = ("import sys, time; from fluidopt.core.files import lock_folder\n"
            "with lock_folder(sys.argv[1], command='holder'):\n    print('held', flush=True); time.sleep(30)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUseError, match=rf"in use by process {holder.pid} \(holder\)"):
            with lock_folder(tmp_path):
                pass
    finally:
        holder.kill()
        holder.wait()
    with lock_folder(tmp_path):  # the holder died: its lock went with it
        pass


def test_a_generation_cut_after_its_journal_is_finished_by_the_next_writer(tmp_path):
    from fluidopt.core.files import lock_folder, write_generation

    write_generation(tmp_path, {"a.csv": lambda p: p.write_text("old a"), "b.csv": lambda p: p.write_text("old b"),
                                "c.csv": lambda p: p.write_text("old c")})
    # a process killed between its journal and its renames: a.csv renamed, b.csv not yet, c.csv to go
    (tmp_path / ".b.tmp-999999.csv").write_text("new b")
    (tmp_path / "a.csv").write_text("new a")
    (tmp_path / ".999999.generation.json").write_text(
        '{"rename": {"a.csv": ".a.tmp-999999.csv", "b.csv": ".b.tmp-999999.csv"}, "remove": ["c.csv"]}')
    with lock_folder(tmp_path):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "b.csv"]
    assert (tmp_path / "a.csv").read_text() == "new a" and (tmp_path / "b.csv").read_text() == "new b"


def test_a_failed_generation_leaves_the_old_one_whole(tmp_path):
    from fluidopt.core.errors import OutputError
    from fluidopt.core.files import write_generation

    write_generation(tmp_path, {"a.csv": lambda p: p.write_text("old a"), "b.csv": lambda p: p.write_text("old b")})

    def full(p):
        p.write_text("new b, cut")
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputError, match=r"cannot write '.*b\.csv': No space left on device"):
        write_generation(tmp_path, {"a.csv": lambda p: p.write_text("new a"), "b.csv": full})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "b.csv"]
    assert (tmp_path / "a.csv").read_text() == "old a"


def test_a_new_sweep_removes_the_older_sweeps_tables_it_does_not_write(tmp_path):
    from fluidopt.core.files import write_generation

    write_generation(tmp_path, {"runs.csv": lambda p: p.write_text("10 seeds"),
                                "timeseries.csv": lambda p: p.write_text("10 seeds")})
    write_generation(tmp_path, {"runs.csv": lambda p: p.write_text("12 seeds")}, owned=["runs.csv", "timeseries.csv"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.csv"]


# -- output folders: missing, read-only, full -----------------------------------------------------
def _mount_tmpfs(where: Path, options: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
    return r.returncode == 0


@pytest.fixture
def mounted(tmp_path):
    made = []

    def mount(name: str, options: str) -> Path:
        where = tmp_path / name
        if not _mount_tmpfs(where, options):
            pytest.skip("cannot mount a tmpfs here (needs root in a namespace that allows it)")
        made.append(where)
        return where

    yield mount
    for where in made:
        subprocess.run(["umount", str(where)], capture_output=True)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fluidopt", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


FAST = {"run": ["run", "--gpus", "6", "--horizon", "30", "--warmup", "5", "--seeds", "1", "--policies", "fi-wsp"],
        "plan": ["plan", "--fluid-only"], "price": ["price", "--points", "3"]}


@pytest.mark.integration
@pytest.mark.parametrize("command", list(FAST))
def test_read_only_output_is_refused_before_the_work(command, mounted):
    ro = mounted("ro", "ro,size=64k")
    r = _cli(*FAST[command], "--out", str(ro / "out"))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "Read-only file system" in r.stderr and str(ro / "out") in r.stderr
    assert "simulating" not in r.stdout  # before any work


@pytest.mark.integration
@pytest.mark.parametrize("command", list(FAST))
def test_full_output_is_refused_before_the_work(command, mounted):
    full = mounted("full", "size=8k")
    (full / "filler").write_bytes(b"\0" * 8192)
    r = _cli(*FAST[command], "--out", str(full / "out"))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "No space left on device" in r.stderr and str(full) in r.stderr


@pytest.mark.integration
@pytest.mark.parametrize("command", list(FAST))
def test_a_missing_output_folder_is_created(command, tmp_path):
    out = tmp_path / "new" / "deeper"
    r = _cli(*FAST[command], "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert out.is_dir() and any(out.iterdir())


def test_a_disk_filling_mid_sweep_stops_with_the_path_and_a_resumable_store(tmp_path, monkeypatch):
    import fluidopt
    from fluidopt.core.errors import OutputError
    from fluidopt.harness import compare
    from fluidopt.harness.executor import ResultStore

    real = ResultStore.append
    calls = []

    def append(self, key, result):
        calls.append(key)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(self, key, result)

    monkeypatch.setattr(ResultStore, "append", append)
    with pytest.raises(OutputError, match=r"store\.jsonl'.*No space left on device; 1 of 3 simulations finished"):
        compare(fluidopt.default_scenario(gpus=6), ["fi-wsp"], seeds=[0, 1, 2], horizon=30.0, warmup=5.0, workers=1,
                out=tmp_path, progress=False)
    assert len(ResultStore(tmp_path).load()) == 1 and not (tmp_path / "runs.csv").exists()
    monkeypatch.setattr(ResultStore, "append", real)
    c = compare(fluidopt.default_scenario(gpus=6), ["fi-wsp"], seeds=[0, 1, 2], horizon=30.0, warmup=5.0, workers=1,
                out=tmp_path, progress=False)
    assert len(c.runs) == 3 and len(ResultStore(tmp_path).load()) == 3


# -- Dask: a lost scheduler, a fleet with no worker, Ctrl-C ----------------------------------------
def _dask(*args: str) -> list[str]:
    exe = Path(sys.executable).with_name("dask")
    return [str(exe), *args] if exe.exists() else [sys.executable, "-m", "distributed.cli.dask_spec", *args]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def small_cluster(tmp_path):
    """A scheduler and one worker on 127.0.0.1 only (no dashboard), killed at the end whatever happened."""
    pytest.importorskip("distributed")
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    log = open(tmp_path / "dask.log", "w")
    sched = subprocess.Popen(_dask("scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"),
                             stdout=log, stderr=subprocess.STDOUT)
    worker = subprocess.Popen(_dask("worker", address, "--host", "127.0.0.1", "--nworkers", "1", "--nthreads", "1",
                                    "--no-dashboard", "--no-nanny"), stdout=log, stderr=subprocess.STDOUT)
    procs = {"scheduler": sched, "worker": worker, "address": address}
    from distributed import Client

    t0 = time.monotonic()
    while time.monotonic() - t0 < 60:
        try:
            with Client(address, timeout=2) as c:
                if c.scheduler_info()["workers"]:
                    break
        except OSError:
            pass
        time.sleep(0.3)
    yield procs
    for p in (sched, worker):
        p.kill()
        p.wait()


@pytest.mark.integration
@pytest.mark.parametrize("lose", ["scheduler", "worker"])
def test_dask_losing_the_scheduler_or_every_worker_is_one_error_exit_3(small_cluster, lose, recwarn):
    from fluidopt.core.errors import ExecutorLost
    from fluidopt.harness.executor import DaskExecutor

    ex = DaskExecutor(scheduler=small_cluster["address"], worker_timeout=3.0)
    got = []
    t0 = time.monotonic()
    with pytest.raises(ExecutorLost) as e:
        for k, _ in ex.imap(time.sleep, [0.3] * 40):
            got.append(k)
            if len(got) == 2:
                small_cluster[lose].kill()
    waited = time.monotonic() - t0
    with __import__("contextlib").suppress(Exception):
        ex.close()
    assert e.value.exit_status == 3 and len(got) >= 2
    assert waited < 60, f"hung {waited:.0f} s"
    if lose == "worker":
        assert "no worker connected" in str(e.value)
        assert any("no worker is connected" in str(w.message) for w in recwarn.list)  # warned first
    else:
        assert "lost the scheduler" in str(e.value)


# 2 price points x 2 seeds. The signal comes within 0.5 s of the first run's store line, so each run needs only
# to outlast that: at 600 s a run is about 1.1 CPU-s on the compiled core, and 3 runs (3.3 CPU-s) are still to
# go (1,200 s until the fourth round: 12.6 CPU-s a sweep against 8.0; the pure-Python engine keeps 240 s).
PRICE = ["price", "--points", "3", "--simulate", "0.001,0.002;0.002,0.001", "--seeds", "2", "--horizon",
         "600" if _compiled() else "240",
         "--warmup", "30", "--no-progress"]


@pytest.fixture(scope="module")
def price_reference(tmp_path_factory):
    """simulated.csv of an uninterrupted ``price --simulate`` (one for both signals: the run is deterministic)."""
    ref = tmp_path_factory.mktemp("faults") / "price-reference"
    _here(PRICE, 1, ref)  # (in this process, as the reruns: see _here)
    return pd.read_csv(ref / "simulated.csv")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_price_simulate_interrupted_writes_no_partial_point_and_resumes(sig, price_reference, tmp_path):
    out = tmp_path / "out"
    proc = _start(PRICE, 1, out)
    _wait_for_store(out / "runs", proc, 1)
    time.sleep(random.Random(sig).uniform(0.0, 0.5))
    assert proc.poll() is None, "finished before the signal; make it longer"
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + getattr(signal, sig), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (out / "simulated.csv").exists()  # not 2 of 4 points, nor a point over 1 of 2 seeds
    _here(PRICE, 1, out)
    pd.testing.assert_frame_equal(pd.read_csv(out / "simulated.csv"), price_reference, check_exact=True)
