"""One executor layer for every many-run workflow, and a resumable results store.

Backends (same numbers bit for bit on every one: each run is a pure function of its job, and its
result travels back pickled, floats exact):

- ``local`` (default): this process when ``workers=1``, else a process pool of ``workers``
  processes (default: CPU count). No service needed.
- ``dask``: a Dask ``LocalCluster`` of ``workers`` single-threaded worker processes (``--dask``).
- ``dask`` with ``scheduler="tcp://HOST:PORT"``: an existing Dask cluster (``--scheduler``). An
  address that does not answer is a :class:`~fluidopt.core.errors.UsageError` within about 10 s.

Dask is optional (``pip install "fluidopt[dask]"``); it is imported only when asked for.

:class:`ResultStore` keeps finished runs in ``<folder>/store.jsonl``, one JSON line per run keyed by
:func:`run_key` (a hash of the scenario, policy and options, seed, run window, service, sampling and
fluidopt's version). A line is appended with one ``write`` and an ``fsync``; a crash (even SIGKILL)
can at most leave a partial last line, which :meth:`ResultStore.load` drops and truncates away, so a
rerun loses nothing that was finished and redoes nothing that was stored.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from fluidopt.core.errors import ExecutorLost, UsageError
from fluidopt.core.files import holds

__all__ = ["Executor", "LocalExecutor", "DaskExecutor", "make_executor", "add_executor_arguments",
           "executor_from_args", "ResultStore", "run_key", "Progress", "SCHEDULER_TIMEOUT_S"]

SCHEDULER_TIMEOUT_S = 10.0  # seconds to wait for an existing Dask scheduler before giving up
WORKER_TIMEOUT_S = 60.0  # seconds a Dask sweep waits with no worker connected before giving up
POLL_S = 1.0  # how often a Dask sweep checks the scheduler and its workers


# -- workers -------------------------------------------------------------------------------------
PARENT_POLL_S = 0.5  # how often a pool worker checks that its parent is alive


def _watch_parent(parent: int) -> None:
    # A pool worker whose parent died (kill -9 included: no handler runs there) would wait on its
    # call queue for good; it exits instead, within PARENT_POLL_S.
    while True:
        time.sleep(PARENT_POLL_S)
        if os.getppid() != parent:
            os._exit(1)


def _init_worker(imports: tuple[str, ...]) -> None:
    # Workers leave Ctrl-C to the parent, which stops the pool and keeps what finished; SIGTERM (the
    # parent terminating the pool) ends them at once.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # the process that started this one (the caller, or a forkserver that dies with the caller)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True, name="fluidopt-parent-watch").start()
    _import(imports)


def _import(imports: Sequence[str]) -> None:
    # User modules that register policies must be imported wherever a run executes.
    if imports:
        from fluidopt.control.registry import import_user_modules

        import_user_modules(list(imports))


def _call(fn: Callable[[Any], Any], job: Any, imports: tuple[str, ...]) -> Any:
    _import(imports)
    return fn(job)


class Executor:
    """Runs ``fn(job)`` for many jobs; :meth:`imap` yields ``(index, result)`` as runs finish.

    Use as a context manager (or call :meth:`close`): pools and clusters live until then, so a
    search that submits several rounds pays their start-up once.
    """

    name = "executor"
    workers = 1

    def imap(self, fn: Callable[[Any], Any], jobs: Sequence[Any]) -> Iterator[tuple[int, Any]]:  # pragma: no cover
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def describe(self) -> str:
        return f"{self.name} ({self.workers} worker{'s' if self.workers != 1 else ''})"


class LocalExecutor(Executor):
    """This process (``workers=1``) or a local process pool.

    ``pool=True``: a process pool even for one worker (so the caller's thread stays free, e.g. a web
    app's). ``stop``: a :class:`threading.Event`; once set, a pool is terminated within 0.2 s and
    :meth:`imap` raises KeyboardInterrupt, which :func:`run_jobs` turns into
    :class:`~fluidopt.core.interrupt.Interrupted` (a cancel button from another thread). ``start_method``: the
    pool's multiprocessing start method (default: the platform's; ``"forkserver"`` for a caller with
    threads of its own, such as a web server)."""

    name = "local"

    def __init__(self, workers: int | None = None, imports: Sequence[str] = (), *, pool: bool = False,
                 stop: threading.Event | None = None, start_method: str | None = None) -> None:
        self.workers = _check_workers(workers)
        self.start_method = start_method
        self.imports = tuple(str(m) for m in imports)
        self._pool: ProcessPoolExecutor | None = None
        self.force_pool = bool(pool)
        self.stop = stop

    def imap(self, fn, jobs):
        jobs = list(jobs)
        if not self.force_pool and (self.workers == 1 or len(jobs) <= 1):
            _import(self.imports)
            for k, job in enumerate(jobs):
                yield k, fn(job)
            return
        if self._pool is None:
            # the standard pool, not loky: loky's fresh workers re-import fluidopt, print tracebacks on a
            # terminal's Ctrl-C and leave a warning after the one line (docs/scaling.md, "Libraries")
            self._pool = ProcessPoolExecutor(max_workers=self.workers, initializer=_init_worker,
                                             initargs=(self.imports,), mp_context=self._context())
        futures: dict[Future, int] = {self._pool.submit(fn, job): k for k, job in enumerate(jobs)}
        pending = set(futures)
        try:
            while pending:
                if self.stop is not None and self.stop.is_set():
                    raise KeyboardInterrupt
                finished, pending = wait(pending, timeout=0.2 if self.stop is not None else None,
                                         return_when=FIRST_COMPLETED)
                for f in sorted(finished, key=futures.__getitem__):
                    yield futures[f], f.result()
        except BaseException:
            # Ctrl-C (or a failed run, or the consumer stopping): stop the pool now, keep nothing running. The
            # pending futures are left to the pool's manager thread, which fails them once it sees the workers
            # gone: cancelling them here raced it into an InvalidStateError traceback on stderr (_kill).
            self._kill()
            raise

    def _context(self):
        import multiprocessing

        return multiprocessing.get_context(self.start_method) if self.start_method else None

    def _kill(self) -> None:
        # Terminate the workers, then let the pool's manager thread see them gone and fail the pending
        # futures itself (cancelling them first races that thread into an InvalidStateError traceback).
        pool, self._pool = self._pool, None
        if pool is None:
            return
        procs = list((getattr(pool, "_processes", None) or {}).values())
        for p in procs:
            with contextlib.suppress(Exception):
                p.terminate()
        for p in procs:
            with contextlib.suppress(Exception):
                p.join(2.0)
                if p.is_alive():
                    p.kill()
        # Wake the manager thread so that it sees the workers gone, and wait for it only a little: once
        # (in hundreds of interruptions) it was seen blocked on the result pipe for good, and a join
        # without a limit then hangs the whole command. The command line exits with os._exit after an
        # interruption, so a manager thread still waiting cannot hold the process either.
        with contextlib.suppress(Exception):
            pool._executor_manager_thread_wakeup.wakeup()
        with contextlib.suppress(Exception):
            pool.shutdown(wait=False)
        thread = getattr(pool, "_executor_manager_thread", None)
        if thread is not None:
            with contextlib.suppress(Exception):
                thread.join(2.0)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


class DaskExecutor(Executor):
    """A Dask ``LocalCluster`` (``scheduler=None``) or an existing cluster at ``scheduler``."""

    name = "dask"

    def __init__(self, workers: int | None = None, scheduler: str | None = None, imports: Sequence[str] = (),
                 timeout: float = SCHEDULER_TIMEOUT_S, worker_timeout: float = WORKER_TIMEOUT_S) -> None:
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise UsageError("--dask/--scheduler: Dask is not installed; pip install 'fluidopt[dask]' "
                             "(or 'distributed')") from None
        self.imports = tuple(str(m) for m in imports)
        self.worker_timeout = float(worker_timeout)
        self._cluster = None
        if scheduler is None:
            self.workers = _check_workers(workers)
            # The worker processes start with Ctrl-C blocked, so a Ctrl-C in the terminal reaches this
            # process alone and it stops them quietly instead of each printing a traceback.
            with _sigint_blocked():
                self._cluster = LocalCluster(n_workers=self.workers, threads_per_worker=1, processes=True,
                                             host="127.0.0.1", dashboard_address=None, silence_logs=50)
            self.client = Client(self._cluster, set_as_default=False)
            self.address = self._cluster.scheduler_address
        else:
            address = check_scheduler_address(scheduler)
            try:
                self.client = Client(address, timeout=timeout, set_as_default=False)
            except (OSError, TimeoutError) as e:
                raise UsageError(f"--scheduler: no Dask scheduler answered at {address} within {timeout:g} s "
                                 f"({type(e).__name__}); start one with 'dask scheduler' or check the address") from None
            self.address = address
            self.workers = max(1, len(self.client.scheduler_info().get("workers", {})))

    def imap(self, fn, jobs):
        from distributed import as_completed

        jobs = list(jobs)
        try:
            futures = [self.client.submit(_call, fn, job, self.imports, pure=False) for job in jobs]
        except Exception as e:  # the scheduler is already gone
            raise self._lost(e) from None
        index = {f.key: k for k, f in enumerate(futures)}
        pending = set(futures)
        alone_since: float | None = None  # since when no worker is connected
        warned = False
        # Poll rather than block: a blocking wait would hang for good on a dead scheduler or fleet.
        ready = as_completed(futures, loop=self.client.loop)  # this client's loop, not a global default
        next_check = time.monotonic() + POLL_S
        try:
            while pending:
                finished = ready.next_batch(block=False) if ready.has_ready() else []
                for f in sorted(finished, key=lambda f: index[f.key]):
                    pending.discard(f)
                    yield index[f.key], self._result(f)
                if not pending:
                    break
                if not finished:
                    time.sleep(0.02)
                if time.monotonic() < next_check:
                    continue
                next_check = time.monotonic() + POLL_S
                if self.client.status not in ("running", "newly-created"):
                    raise self._lost(None)
                workers = self.client.scheduler_info().get("workers", {})
                if workers:
                    alone_since, warned = None, False
                    continue
                now = time.monotonic()
                alone_since = alone_since if alone_since is not None else now
                if not warned:
                    warned = True
                    warnings.warn(f"Dask: no worker is connected to {self.address}; waiting up to "
                                  f"{self.worker_timeout:g} s for one", RuntimeWarning, stacklevel=2)
                if now - alone_since >= self.worker_timeout:
                    raise ExecutorLost(f"Dask: no worker connected to {self.address} for {self.worker_timeout:g} s; "
                                       "finished runs are kept, rerun to resume once workers are back")
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                self._kill_local_workers()  # a busy worker would hold a graceful close for seconds
            with contextlib.suppress(Exception):
                self.client.cancel(list(pending))
            raise

    def _kill_local_workers(self) -> None:
        """SIGKILL the LocalCluster's worker processes (ours to stop; never an existing cluster's)."""
        if self._cluster is None:
            return
        for nanny in list(getattr(self._cluster, "workers", {}).values()):
            with contextlib.suppress(Exception):
                os.kill(nanny.process.process.pid, signal.SIGKILL)

    def _result(self, f):
        from concurrent.futures import CancelledError

        try:
            return f.result()
        except CancelledError as e:  # distributed's FutureCancelledError too: a lost scheduler's futures
            raise self._lost(e) from None
        except OSError as e:  # CommClosedError and the like: the scheduler went away mid-result
            raise self._lost(e) from None

    def _lost(self, e: BaseException | None) -> ExecutorLost:
        why = f" ({type(e).__name__})" if e is not None else ""
        return ExecutorLost(f"Dask: lost the scheduler at {self.address}{why}; finished runs are kept, "
                            "rerun to resume once it is back")

    def close(self) -> None:
        try:
            self.client.close(timeout=5)
        finally:
            if self._cluster is not None:
                self._cluster.close(timeout=5)

    def describe(self) -> str:
        where = "LocalCluster" if self._cluster is not None else self.address
        return f"dask {where} ({self.workers} worker{'s' if self.workers != 1 else ''})"


@contextlib.contextmanager
def _sigint_blocked():
    # Ctrl-C is blocked, not ignored, while the cluster starts: the threads and processes started meanwhile
    # inherit the blocked mask (the workers never see a terminal's Ctrl-C), and a Ctrl-C that arrives now
    # stays pending and interrupts this process the moment the mask is restored, instead of being lost.
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _check_workers(workers: int | None) -> int:
    if workers is None:
        return max(1, os.cpu_count() or 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise UsageError(f"--workers: expected an integer >= 1, got {workers!r}")
    return workers


def check_scheduler_address(address: str) -> str:
    """``tcp://HOST:PORT`` (or ``HOST:PORT``, taken as tcp), checked for shape before any connection."""
    if not isinstance(address, str) or not address.strip():
        raise UsageError(f"--scheduler: expected an address tcp://HOST:PORT, got {address!r}")
    a = address.strip()
    proto, sep, rest = a.partition("://")
    if not sep:
        proto, rest = "tcp", a
    host, colon, port = rest.rpartition(":")
    if proto not in ("tcp", "tls", "ws", "wss", "inproc", "ucx") or not colon or not host or not port.isdigit() \
            or not 0 < int(port) < 65536:
        raise UsageError(f"--scheduler: expected an address tcp://HOST:PORT, got {address!r}")
    return f"{proto}://{host}:{port}"


def make_executor(workers: int | None = None, *, dask: bool = False, scheduler: str | None = None,
                  imports: Sequence[str] = ()) -> Executor:
    """The executor for ``--workers N``, ``--dask`` and ``--scheduler ADDRESS`` (see the module docs)."""
    if scheduler is not None or dask:
        return DaskExecutor(workers, scheduler, imports)
    return LocalExecutor(workers, imports)


def add_executor_arguments(parser: argparse.ArgumentParser, *, workers: int | None = None) -> None:
    """``--workers``, ``--dask`` and ``--scheduler`` on ``parser`` (the CLI's and the example scripts'
    flags for where runs execute); :func:`executor_from_args` turns them into an :class:`Executor`."""
    g = parser.add_argument_group("where runs execute (same numbers on every backend)")
    g.add_argument("--workers", type=int, default=workers,
                   help="local worker processes, or LocalCluster workers with --dask "
                        f"(default: {workers if workers is not None else 'CPU count'})")
    g.add_argument("--dask", action="store_true", help="run on a Dask LocalCluster (pip install 'fluidopt[dask]')")
    g.add_argument("--scheduler", default=None, metavar="tcp://HOST:PORT",
                   help="run on an existing Dask cluster (its scheduler's address)")


def executor_from_args(args: argparse.Namespace, runs: int | None = None, imports: Sequence[str] = ()) -> Executor:
    """The executor ``--workers``/``--dask``/``--scheduler`` ask for; local workers default to the CPU
    count, capped at ``runs`` when given."""
    workers = args.workers
    if workers is not None:
        _check_workers(workers)
    if workers is None and runs is not None and not (args.dask or args.scheduler):
        workers = max(1, min(os.cpu_count() or 1, runs))
    return make_executor(workers, dask=args.dask, scheduler=args.scheduler, imports=imports)


# -- progress -------------------------------------------------------------------------------------
class Progress:
    """Runs done / total with an ETA on stderr (tqdm when installed); off when not a terminal.

    ``enabled="log"`` (what the commands ask for when stderr is not a terminal, such as a CI log or a
    file): a plain line every :attr:`LOG_EVERY` seconds from a timer thread, ``[DESC] 3/10 done, 25 s
    elapsed, about 58 s left``, so that a long sweep whose runs each take a minute is not silent, and
    no line at all when the work ends sooner."""

    LOG_EVERY = 5.0
    """Seconds between the plain lines of ``enabled="log"``."""

    def __init__(self, total: int, *, enabled: bool | str | None = None, desc: str = "runs", initial: int = 0) -> None:
        if enabled is None:
            enabled = bool(getattr(sys.stderr, "isatty", lambda: False)())
        self.log = enabled == "log"
        self.enabled = bool(enabled) and total > 0
        self._bar = None
        self._ticker = None
        self.total, self.done, self.t0, self.desc = total, initial, time.perf_counter(), desc
        self.initial = initial
        if self.enabled and self.log:
            import threading

            self._stop = threading.Event()
            self._ticker = threading.Thread(target=self._tick, name="fluidopt-progress", daemon=True)
            self._ticker.start()
        elif self.enabled:
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, initial=initial, desc=desc, file=sys.stderr, unit="run",
                                 dynamic_ncols=True, leave=False)
            except ImportError:  # pragma: no cover - plain lines instead
                self._bar = None

    def line(self) -> str:
        """The plain progress line: runs done, seconds elapsed, and the time left at this pace."""
        el = time.perf_counter() - self.t0
        text = f"[{self.desc}] {self.done}/{self.total} done, {el:.0f} s elapsed"
        ran = self.done - self.initial
        if 0 < ran and self.done < self.total:
            text += f", about {el / ran * (self.total - self.done):.0f} s left"
        return text

    def _tick(self) -> None:
        while not self._stop.wait(self.LOG_EVERY):
            print(self.line(), file=sys.stderr, flush=True)

    def update(self, n: int = 1, note: str = "") -> None:
        self.done += n
        if not self.enabled or self.log:
            return
        if self._bar is not None:
            if note:
                self._bar.set_postfix_str(note, refresh=False)
            self._bar.update(n)
        else:  # pragma: no cover
            el = time.perf_counter() - self.t0
            eta = el / max(self.done, 1) * (self.total - self.done)
            print(f"[{self.done}/{self.total}] {note} (ETA {eta:.0f} s)", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._ticker is not None:
            self._stop.set()
            self._ticker.join()
            self._ticker = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None


# -- the results store ----------------------------------------------------------------------------
def _canonical(obj: Any) -> Any:
    """A JSON-ready, order-independent form of options and scenarios (for hashing)."""
    if isinstance(obj, dict):
        return {str(k): _canonical(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple)):
        return [_canonical(v) for v in obj]
    if isinstance(obj, float):
        return repr(obj)  # exact, and NaN / inf hash too
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    return repr(obj)  # SLI dataclasses and the like have a faithful repr


def scenario_fingerprint(scenario) -> dict[str, Any]:
    from fluidopt.scenario import scenario_to_dict

    d = scenario_to_dict(scenario)
    d["gpu"] = dict(d["gpu"], name=scenario.gpu.name)
    return d


def _version() -> str:
    """fluidopt's installed version (read from the distribution: the package's front door sits above
    this layer)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fluidopt")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree without installing
        return "unknown"


def run_key(job: dict[str, Any]) -> str:
    """The hash that names a run: scenario, policy, options, seed, window, service, sampling, version."""
    ident = {
        "scenario": scenario_fingerprint(job["scenario"]),
        "policy": job["policy"].strip().lower().replace("_", "-"),
        "options": job.get("options") or {},
        "seed": job["seed"],
        # the run's window (a fluidopt.sim.window.RunWindow; its drain is in "extra")
        "horizon": job["window"].horizon,
        "warmup": job["window"].warmup,
        "service": job["window"].service,
        "sample_interval": job["window"].sample_interval,
        "version": _version(),
        "extra": job.get("extra"),  # what else shapes the run (e.g. the SLIs a plan's LP was solved with)
    }
    text = json.dumps(_canonical(ident), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _jsonable(obj: Any) -> Any:
    import numpy as np
    import pandas as pd

    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, pd.DataFrame):
        return {"__frame__": True, "columns": [str(c) for c in obj.columns],
                "data": {str(c): _jsonable(obj[c].tolist()) for c in obj.columns}}
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def _from_json(obj: Any) -> Any:
    import pandas as pd

    if isinstance(obj, dict):
        if obj.get("__frame__"):
            return pd.DataFrame({c: obj["data"][c] for c in obj["columns"]}, columns=obj["columns"])
        return {k: _from_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_from_json(v) for v in obj]
    return obj


class ResultStore:
    """Finished runs, appended crash-safely to ``<folder>/store.jsonl`` (see the module docs).

    Floats are written with ``repr`` (JSON's default), which round-trips every double exactly, so a
    result read back is bit for bit the one computed.
    """

    FILE = "store.jsonl"

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.path = self.folder / self.FILE
        if self.folder.exists() and not self.folder.is_dir():
            raise UsageError(f"results store: {self.folder} exists and is not a folder")

    def load(self) -> dict[str, Any]:
        """Every complete stored run by key. A partial last line (a crash mid-append) is dropped, and cut
        off the file only while this process holds the folder's lock (:func:`fluidopt.core.files.lock_folder`):
        without it, that line may be one a live writer is appending."""
        if not self.path.exists():
            return {}
        # json per line, not pandas.read_json(lines=True): that one rounds floats (or fails on subnormals),
        # reads NaN as None and fails on a torn line (docs/scaling.md, "Libraries")
        raw = self.path.read_bytes()
        out: dict[str, Any] = {}
        good_end = 0
        pos = 0
        while pos < len(raw):
            nl = raw.find(b"\n", pos)
            if nl < 0:
                break  # no newline: a line cut by a crash
            line = raw[pos:nl]
            try:
                rec = json.loads(line)
                out[rec["key"]] = _from_json(rec["result"])
            except (ValueError, KeyError, TypeError):
                break  # a torn line; everything after it was never acknowledged
            pos = nl + 1
            good_end = pos
        if good_end < len(raw) and holds(self.folder):
            with open(self.path, "r+b") as fh:
                fh.truncate(good_end)
                fh.flush()
                os.fsync(fh.fileno())
        return out

    def append(self, key: str, result: Any) -> None:
        """Append one run: one ``write`` of one line, then ``fsync`` (durable when this returns)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"key": key, "result": _jsonable(result)}, separators=(",", ":"), allow_nan=True) + "\n"
        data = line.encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)


def run_jobs(fn: Callable[[dict], Any], jobs: Sequence[dict], *, executor: Executor | None = None,
             store: ResultStore | None = None, progress: bool | None = None, desc: str = "runs",
             note: Callable[[dict, Any], str] | None = None) -> dict[int, Any]:
    """Run ``fn`` on every job not already in ``store``; return ``{index: result}`` for all of them.

    Stored runs are taken as they are (not re-run); each new result is appended to the store as
    soon as it arrives. ``progress``: a bar on stderr (True / False / None: when a terminal), or a
    callable ``progress(done, total)`` called at the start and after each run. Ctrl-C or SIGTERM stops the executor within about a second and raises
    :class:`~fluidopt.core.interrupt.Interrupted` whose ``kept`` says how many runs finished and where they
    are, and whose ``partial`` is the ``{index: result}`` of those. A run cut short by the signal is
    never returned or stored (the simulator's partial result is dropped). A store that cannot be
    appended to (a full disk) is an :class:`~fluidopt.core.errors.OutputError` saying what is stored.
    """
    from fluidopt.core.files import maybe_lock

    # the store's folder has one writer (the lock is re-entrant: a caller may hold it already)
    with maybe_lock(store.folder if store is not None else None, "results store", "run_jobs"):
        return _run_jobs(fn, jobs, executor, store, progress, desc, note)


def _run_jobs(fn, jobs, executor, store, progress, desc, note) -> dict[int, Any]:
    import fluidopt.core.interrupt as interrupt

    done: dict[int, Any] = {}
    keys = [run_key(j) for j in jobs] if store is not None else []
    if store is not None:
        stored = store.load()
        for k, key in enumerate(keys):
            if key in stored:
                done[k] = stored[key]
    n_stored = len(done)
    todo = [k for k in range(len(jobs)) if k not in done]
    report = progress if callable(progress) else None
    bar = Progress(len(jobs), enabled=False if report else progress, desc=desc, initial=len(done))
    if report:
        report(len(done), len(jobs))
    own = executor is None
    ex = executor if executor is not None else LocalExecutor(1)

    def kept() -> str:
        where = f"kept in {store.path}; rerun the same command to resume" if store is not None else \
            "not stored (no results folder)"
        return f"{len(done)} of {len(jobs)} {desc} finished ({len(done) - n_stored} new), {where}"

    try:
        interrupt.clear()
        for i, res in ex.imap(fn, [jobs[k] for k in todo]):
            if interrupt.pending() is not None:
                # the simulator stopped gracefully on the signal: this result is cut short
                raise interrupt.Interrupted(interrupt.pending())
            k = todo[i]
            if store is not None:
                try:
                    store.append(keys[k], res)
                except OSError as e:
                    from fluidopt.core.errors import OutputError

                    raise OutputError(f"cannot append to the results store {str(store.path)!r}: "
                                      f"{e.strerror or type(e).__name__}; {kept()}") from None
            done[k] = res
            bar.update(1, note(jobs[k], res) if note else "")
            if report:
                report(len(done), len(jobs))
    except KeyboardInterrupt as e:
        raise interrupt.interrupted_from(e, kept(), dict(done)) from None
    finally:
        bar.close()
        if own:
            ex.close()
    return done


def finite_or_none(v: Any) -> Any:
    """NaN and inf as None (for ``--json``)."""
    return None if isinstance(v, float) and not math.isfinite(v) else v
