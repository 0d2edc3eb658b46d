"""More of the executor layer's promises (fluidopt.executor; docs/scaling.md): the local worker count
from ``--workers``/``runs``, the ``--scheduler`` flag's help, and ``LocalExecutor.close`` leaving no
worker process behind (mutation survivors of issue 35's rerun after the interruption contract)."""

from __future__ import annotations

import argparse
import multiprocessing
import os

from fluidopt.executor import LocalExecutor, add_executor_arguments, executor_from_args


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
