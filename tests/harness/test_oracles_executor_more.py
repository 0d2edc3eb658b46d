"""More of the executor layer's promises (fluidopt.harness.executor; docs/scaling.md): the local worker count
from ``--workers``/``runs``, the ``--scheduler`` flag's help, and ``LocalExecutor.close`` leaving no
worker process behind (mutation survivors of issue 35's rerun after the interruption contract)."""

from __future__ import annotations

import argparse
import multiprocessing
import os

import pytest

from fluidopt.core.errors import UsageError
from fluidopt.harness.executor import (
    LocalExecutor,
    Progress,
    add_executor_arguments,
    executor_from_args,
    finite_or_none,
)


def _square(x):
    return x * x


def _args(**kw):
    base = dict(workers=None, dask=False, scheduler=None)
    base.update(kw)
    return argparse.Namespace(**base)


def test_local_workers_default_to_the_cpu_count_capped_at_the_runs():
    cpus = os.cpu_count() or 1
    for runs in (1, 2, 3, 1000):
        ex = executor_from_args(_args(), runs=runs)
        assert isinstance(ex, LocalExecutor)
        assert ex.workers == max(1, min(cpus, runs))
    assert executor_from_args(_args(workers=2), runs=1).workers == 2  # an explicit count is kept


def test_the_scheduler_flag_shows_its_address_form():
    p = argparse.ArgumentParser()
    add_executor_arguments(p)
    text = " ".join(p.format_help().split())
    assert "--scheduler tcp://HOST:PORT" in text
    assert "run on an existing Dask cluster (its scheduler's address)" in text


def test_close_returns_only_when_the_worker_processes_have_exited():
    # The interruption contract (docs/scaling.md): after close() nothing the executor started is
    # running. shutdown(wait=False) would return before the workers exit.
    ex = LocalExecutor(2, pool=True, start_method="fork" if "fork" in multiprocessing.get_all_start_methods()
                       else None)
    try:
        assert dict(ex.imap(_square, [1, 2, 3, 4])) == {0: 1, 1: 4, 2: 9, 3: 16}
        procs = list(ex._pool._processes.values())
        assert procs and all(p.is_alive() for p in procs)
    finally:
        ex.close()
    assert ex._pool is None
    assert [p.exitcode for p in procs] == [0] * len(procs)  # exited (and joined), each cleanly
    ex.close()  # a second close is a no-op


def test_a_bad_worker_count_is_refused_first_whatever_the_backend():
    # --workers is checked before a scheduler address or Dask's presence (one line, exit 2)
    for kw in (dict(scheduler="nonsense"), dict(dask=True), dict()):
        for bad in (0, -1):
            with pytest.raises(UsageError, match=rf"^--workers: expected an integer >= 1, got {bad}$"):
                executor_from_args(_args(workers=bad, **kw), runs=4)


def test_finite_or_none_maps_only_non_finite_floats_to_none():
    import numpy as np

    for v in (float("nan"), float("inf"), -float("inf"), np.float64("nan")):
        assert finite_or_none(v) is None
    for v in (0.0, 1.5, -2.0, 3, "nan", None, np.float64(2.5)):
        assert finite_or_none(v) == v if v is not None else finite_or_none(v) is None


def _pid(_job):
    return os.getpid()


def test_dask_runs_in_worker_processes_and_a_scheduler_client_is_not_the_global_default():
    distributed = pytest.importorskip("distributed")
    from fluidopt.harness.executor import DaskExecutor

    local = DaskExecutor(1)
    try:
        pids = dict(local.imap(_pid, [0, 1]))
        assert sorted(pids) == [0, 1] and os.getpid() not in pids.values()  # processes, not threads
        # many quick runs: batches of several finished futures, each yielded with its own index
        assert dict(local.imap(_square, list(range(40)))) == {k: k * k for k in range(40)}
        # a second executor on the same cluster, by its scheduler's address
        remote = DaskExecutor(scheduler=local.address)
        try:
            assert remote.workers == 1 and remote.address == local.address
            assert dict(remote.imap(_square, [5, 6])) == {0: 25, 1: 36}
            with pytest.raises(ValueError):  # neither client was made Dask's global default
                distributed.default_client()
        finally:
            remote.close()
    finally:
        local.close()


def _imported(name):
    import sys

    return name in sys.modules


def test_local_pool_workers_import_the_named_modules_first():
    # the worker initializer imports ``imports`` (e.g. a user's controller module) before any run
    with LocalExecutor(2, imports=("colorsys",), pool=True) as ex:
        assert dict(ex.imap(_imported, ["colorsys", "colorsys"])) == {0: True, 1: True}


def _fail_or_mark(job):
    import time

    if job.get("fail"):
        time.sleep(0.3)  # the other run has started by now
        raise ValueError("run 0 failed")
    time.sleep(2.0)
    with open(job["marker"], "w") as fh:
        fh.write("finished")
    return 1


def test_a_failed_run_stops_the_runs_still_going(tmp_path):
    # the interruption contract: a failed run (like Ctrl-C) terminates the pool's workers at once; a
    # run still going never finishes (its marker file is never written)
    marker = tmp_path / "marker"
    ex = LocalExecutor(2, pool=True)
    with pytest.raises(ValueError, match="run 0 failed"):
        dict(ex.imap(_fail_or_mark, [{"fail": True}, {"marker": str(marker)}]))
    assert ex._pool is None
    assert not marker.exists()
    ex.close()


def test_the_progress_bar_carries_its_label(capsys):
    pytest.importorskip("tqdm")
    p = Progress(3, enabled=True, desc="points")
    try:
        assert p._bar is not None and p._bar.desc.startswith("points")
    finally:
        p.close()


def test_a_dask_sweep_with_no_worker_warns_then_gives_up_keeping_the_finished_runs():
    distributed = pytest.importorskip("distributed")
    from fluidopt.core.errors import ExecutorLost
    from fluidopt.harness.executor import DaskExecutor

    cluster = distributed.LocalCluster(n_workers=0, processes=True, host="127.0.0.1",
                                       dashboard_address=":0", silence_logs=50)
    try:
        ex = DaskExecutor(scheduler=cluster.scheduler_address, worker_timeout=0.5)
        try:
            with pytest.warns(RuntimeWarning, match=r"^Dask: no worker is connected to .*; waiting up to 0.5 s for one$"):
                with pytest.raises(ExecutorLost, match=r"no worker connected to .* for 0.5 s; finished runs are kept, "
                                                    r"rerun to resume once workers are back$"):
                    dict(ex.imap(_square, [1, 2]))
        finally:
            ex.close()
    finally:
        cluster.close()


def _mark_then_wait(job):
    import time

    with open(job["marker"], "w") as fh:
        fh.write("started")
    time.sleep(job["sleep"])
    return job["k"]


def test_closing_a_pool_with_a_half_read_sweep_cancels_the_runs_not_yet_started(tmp_path):
    # A caller that stops reading a sweep and closes the executor (the app's Stop, a notebook's break
    # out of the loop) must not pay for the runs still queued: close() cancels them instead of running
    # them to results no one reads. Of 8 runs on one worker, the first is read, then close(); only the
    # one running and those already handed to the pool's call queue may still start.
    jobs = [{"k": k, "marker": str(tmp_path / f"started-{k}"), "sleep": 0.3} for k in range(8)]
    ex = LocalExecutor(1, pool=True)
    sweep = ex.imap(_mark_then_wait, jobs)
    assert next(sweep) == (0, 0)
    ex.close()
    started = sorted(p.name for p in tmp_path.iterdir())
    sweep.close()
    assert "started-0" in started
    assert len(started) <= 5, started  # the running run and those already in the call queue
    assert not (tmp_path / "started-7").exists()


def test_a_scheduler_address_is_tried_for_the_scheduler_flags_timeout_only(monkeypatch):
    # --scheduler's connect timeout is passed to Dask's Client (not Dask's own default of 30 s), and a
    # scheduler that does not answer in it is refused with the timeout in the message
    distributed = pytest.importorskip("distributed")
    from fluidopt.harness.executor import DaskExecutor

    seen = {}

    class _Silent:
        def __init__(self, address, **kw):
            seen["address"] = address
            seen.update(kw)
            raise OSError("timed out")

    monkeypatch.setattr(distributed, "Client", _Silent)
    with pytest.raises(UsageError, match=r"no Dask scheduler answered at tcp://127\.0\.0\.1:1 within 0\.75 s"):
        DaskExecutor(scheduler="tcp://127.0.0.1:1", timeout=0.75)
    assert seen["address"] == "tcp://127.0.0.1:1"
    assert seen["timeout"] == 0.75
    assert seen["set_as_default"] is False
