"""The Dask backends: a real `dask scheduler` and two `dask worker` processes on localhost."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

import fluidopt
from fluidopt.core.errors import UsageError
from fluidopt.harness import compare

distributed = pytest.importorskip("distributed")

from fluidopt.harness.executor import DaskExecutor, LocalExecutor  # noqa: E402

SMALL = fluidopt.default_scenario(gpus=6)
KW = dict(horizon=40.0, warmup=8.0)
pytestmark = pytest.mark.waits  # a local Dask cluster's processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dask_cmd(*args: str) -> list[str]:
    exe = Path(sys.executable).with_name("dask")
    if exe.exists():
        return [str(exe), *args]
    found = shutil.which("dask")
    if found:
        return [found, *args]
    return [sys.executable, "-m", "dask", *args]  # pragma: no cover


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    logs = tmp_path_factory.mktemp("dask")
    env = dict(os.environ, DASK_DISTRIBUTED__WORKER__DAEMON="False")
    procs = [subprocess.Popen(_dask_cmd("scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"),
                              stdout=open(logs / "scheduler.log", "w"), stderr=subprocess.STDOUT, env=env)]
    for k in range(2):
        procs.append(subprocess.Popen(
            _dask_cmd("worker", address, "--host", "127.0.0.1", "--nworkers", "1", "--nthreads", "1", "--no-dashboard",
                      "--name", f"w{k}"),
            stdout=open(logs / f"worker{k}.log", "w"), stderr=subprocess.STDOUT, env=env))
    try:
        client = None
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60:
            try:
                client = distributed.Client(address, timeout=2, set_as_default=False)
                client.wait_for_workers(2, timeout=30)
                break
            except (OSError, TimeoutError):
                time.sleep(0.3)
        assert client is not None, (logs / "scheduler.log").read_text()
        # each worker imports fluidopt once here, not inside the first test's timing
        client.run(lambda: __import__("fluidopt.harness") and None)
        client.close()
        yield address
    finally:
        for p in reversed(procs):
            p.kill()  # our own processes; a graceful Dask shutdown takes seconds and keeps nothing we need
        for p in procs:
            p.wait(timeout=10)


@pytest.mark.integration
def test_existing_cluster_gives_the_local_numbers_bit_for_bit(cluster):
    local = compare(SMALL, ["gate-and-route", "fi-wsp"], seeds=[0, 1], executor=LocalExecutor(1), **KW)
    with DaskExecutor(scheduler=cluster) as ex:
        assert ex.workers == 2
        remote = compare(SMALL, ["gate-and-route", "fi-wsp"], seeds=[0, 1], executor=ex, **KW)
    cols = [c for c in local.runs.columns if c != "wall_seconds"]
    pd.testing.assert_frame_equal(local.runs[cols], remote.runs[cols])
    pd.testing.assert_frame_equal(local.classes, remote.classes)
    assert remote.meta["executor"].startswith("dask tcp://127.0.0.1")


@pytest.mark.integration
def test_cli_run_on_the_cluster(cluster, tmp_path, capsys):
    from fluidopt.cli import main

    rc = main(["run", "--gpus", "6", "--policies", "fi-wsp", "--seeds", "2", "--horizon", "30", "--warmup", "5",
               "--scheduler", cluster, "--out", str(tmp_path), "--json", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0 and (tmp_path / "runs.csv").exists() and '"executor": "dask tcp://127.0.0.1' in out


@pytest.mark.integration
def test_unreachable_scheduler_is_a_clear_error_not_a_hang():
    port = _free_port()  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(UsageError, match=r"--scheduler: no Dask scheduler answered at tcp://127.0.0.1:\d+ within"):
        DaskExecutor(scheduler=f"tcp://127.0.0.1:{port}", timeout=3)
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("address", ["tcp://127.0.0.1", "http://h:1"])
def test_malformed_scheduler_cli_exit_2(address, capsys):
    from fluidopt.cli import main

    rc = main(["run", "--gpus", "4", "--policies", "fi-wsp", "--seeds", "1", "--horizon", "10", "--warmup", "1",
               "--scheduler", address, "--out", ""])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--scheduler: expected an address tcp://HOST:PORT" in err


@pytest.mark.integration
def test_an_example_grid_runs_on_the_cluster(cluster, tmp_path, capsys):
    """The example scripts take the CLI's --scheduler: baseline_grid on the cluster, same table as local."""
    from builders import load_example

    mod = load_example("baseline_grid")
    tables = []
    # --quick's sizes with one instance (--quick sets 3 instances whatever --instances says; the tables are
    # compared row for row, so one instance shows the same as three at a third of the runs)
    size = ["--instances", "1", "--gpus", "50", "--horizon-scale", "0.2"]
    for where in (["--workers", "1"], ["--scheduler", cluster]):
        out = tmp_path / where[0].strip("-")
        assert mod.main([*size, *where, "--out", str(out), "--fig-dir", str(tmp_path)]) == 0
        tables.append([ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| 0 |")])
        df = pd.read_csv(out / "runs.csv")
    assert tables[0] == tables[1] and len(tables[0]) == 2
    assert df["ratio"].notna().all()
