"""The event kernel's bookkeeping around the event loop (cold code: per call, per batch of arrivals,
per measurement instant, never per event): starting and finishing a run, the stepping API's
``advance`` (docs/simulator.md section 10), loading workload batches, snapshots, samples and ticks,
folding finished requests into the metrics. The kernel binds these functions as methods of
``Engine`` (``eng`` is the engine).
"""

from __future__ import annotations

import gc
import math
import signal
import sys
import threading
import time
import warnings

import numpy as np

import fluidopt.core.interrupt as interrupt
from fluidopt.core.errors import ActionError, ScenarioError
from fluidopt.sim import metrics as M
from fluidopt.sim import state as S
from fluidopt.sim.action_errors import GONE
from fluidopt.sim.results import assemble_result, progress_line
from fluidopt.sim.state import RACE_DECODE, RACE_PREFILL, RACE_WAIT

__all__ = ["advance", "finish", "run", "start"]

INF = math.inf
ALLOC_BLOCK = 1024  # fewest request slots added at a time


def run(eng) -> M.SimResult:
    """The whole run: ``start``, ``advance`` to the horizon, ``finish``."""
    start(eng)
    advance(eng)
    return finish(eng)


def done(eng) -> bool:
    """True once the horizon is reached or the run was interrupted: ``advance`` does nothing more."""
    return eng._done or eng._interrupted


def pause(eng) -> None:
    """Ask the engine to return from ``advance`` after the event being handled (for a controller
    that wants its driver to decide now, e.g. a learned router's decision epoch)."""
    eng._pause = True


def start(eng) -> None:
    """Set the run up (the controller's ``setup``, the first arrivals); idempotent."""
    if eng._started:
        return
    eng._started = True
    eng._wall0 = time.perf_counter()
    eng._in_setup = True
    try:
        eng.controller.setup(eng)
    finally:
        eng._in_setup = False
    coh = eng.collector.cohort
    if coh is None:
        eng._arr_iter = iter(eng.workload.batches(eng._work_rng, eng.horizon, eng._arrival_chunk))
        next_arrivals(eng)
    else:
        start_drained_arrivals(eng, coh)
    refill_exp(eng)
    refill_uni(eng)


def advance(eng, until: float | None = None) -> float:
    """Process events until simulated time ``until`` (seconds; default: the horizon), a
    controller's ``pause()``, or Ctrl-C; return the simulated time reached.

    Events at times before ``until`` are processed, events at ``until`` are not: afterwards
    ``now == until`` and the state is the state just before that instant, so a caller may act
    (through the engine's actions) at time ``until`` before the events there happen. After a
    ``pause()``, ``now`` is the time of the event whose handler paused.
    """
    if not eng._started:
        start(eng)
    if eng._finished:
        raise ActionError("advance: this run is already finished; make a new engine")
    if eng._done or eng._interrupted:
        return eng._now
    stop = eng.horizon if until is None else float(until)
    if stop != stop:
        raise ScenarioError("advance: until: expected a time in seconds, got NaN")
    if stop <= eng._now:
        return eng._now
    # Ctrl-C: the first SIGINT asks the loop to stop between two events (so no state or records
    # chunk is left half-done); a second one interrupts at once.
    old_handler = None
    if eng.handle_sigint and threading.current_thread() is threading.main_thread():
        cur = signal.getsignal(signal.SIGINT)
        if cur is not signal.SIG_IGN:
            old_handler = signal.signal(signal.SIGINT, eng._on_sigint)
    # The loop allocates many short-lived tuples and no reference cycles: the cyclic garbage
    # collector would only rescan the live state (about 7% of the run); pause it, as timeit does.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        eng._loop(stop)
        if eng._stop:  # a Ctrl-C the loop had no 1,024th event left to see: the run is still cut short
            eng._interrupted = True
    except KeyboardInterrupt as e:  # a second Ctrl-C, or SIGTERM under fluidopt.core.interrupt.handle_sigterm
        interrupt.note(interrupt.signum_of(e))
        eng._interrupted = True
    finally:
        if gc_was_enabled:
            gc.enable()
        if old_handler is not None:
            signal.signal(signal.SIGINT, old_handler)
        if eng.progress and _on_terminal():  # the rewritten line ends; a log's lines end themselves
            sys.stderr.write("\n")
            sys.stderr.flush()
    return eng._now


LOG_EVERY = 5.0
"""Seconds between the progress lines when stderr is not a terminal (a CI log, a file): plain lines,
the first after this long (a shorter run prints none), where a terminal gets one line rewritten every second."""


def _on_terminal() -> bool:
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def every_1024(eng, ev: int) -> bool:
    """Every 1,024 events of the loop: True to stop after a Ctrl-C; the progress line (once a second)."""
    if eng._stop:
        eng._interrupted = True
        return True
    if not ev & 0x3FFF:
        eng._events = ev
        if eng.progress:
            now = time.perf_counter()
            if now >= eng._next_report:
                if _on_terminal():
                    eng._next_report = now + 1.0
                    progress_line(eng, now - eng._wall0)
                elif now - eng._wall0 < LOG_EVERY:
                    eng._next_report = eng._wall0 + LOG_EVERY
                else:
                    eng._next_report = now + LOG_EVERY
                    progress_line(eng, now - eng._wall0, log=True)
    return False


def on_sigint(eng, signum, frame) -> None:
    interrupt.note(signum)  # so a sweep never takes the partial run for a finished one
    if eng._stop:
        raise KeyboardInterrupt
    eng._stop = True


def finish(eng) -> M.SimResult:
    """Close the run at the time reached and return its result (a run stopped before the
    horizon is measured up to ``now``); call once."""
    start(eng)
    if eng._finished:
        raise ActionError("finish: this run is already finished (its result was returned); make a new engine")
    eng._finished = True
    coh = eng.collector.cohort
    draining = coh is not None and coh.draining
    if not eng._done and not draining:
        t = eng._now
        flush(eng)
        eng.collector.snapshot(t, areas(eng, t), np.array(eng._ctr, dtype=float))
    wall = time.perf_counter() - eng._wall0
    result = assemble_result(eng, wall) if coh is None else finish_cohort(eng, coh, wall)
    result.meta["engine"] = eng.engine_name
    return result


def next_arrivals(eng) -> bool:
    """Load the next arrival batch; False when the workload is exhausted."""
    if eng._arr_iter is None:
        return False
    typed = eng.engine_name == "compiled"
    for b in eng._arr_iter:
        if len(b.time) == 0:
            continue
        cls = np.asarray(b.cls)
        if cls.min() < 0 or cls.max() >= eng.I:
            bad = int(cls[(cls < 0) | (cls >= eng.I)][0])
            raise ScenarioError(f"workload: class index {bad} out of range 0..{eng.I - 1}")
        eng._arr_t = S.block(np.ascontiguousarray(b.time, dtype=np.float64), typed)
        eng._arr_c = S.int_block(cls, typed)
        eng._arr_p = S.int_block(S.token_counts("prompt", b.prompt), typed)
        eng._arr_o = S.int_block(S.token_counts("output", b.output), typed)
        eng._ai = 0
        return True
    eng._arr_iter = None
    eng._arr_t = S.floats(0, 0.0, typed)
    eng._ai = 0
    return False


def areas(eng, t: float) -> np.ndarray:
    return np.array(eng._cnt, dtype=float) * t - np.array(eng._acc, dtype=float)


def flush(eng) -> None:
    """Fold the buffered finished requests into the metrics (and the records file)."""
    n = eng._nrec
    if not n:
        return
    eng._nrec = 0
    rec = eng._rec
    k = n * M.N_RECORD_FIELDS
    if eng.engine_name == "compiled":  # the core's view has the array as base: read in place (fold copies)
        rows = np.frombuffer(rec.base, dtype=float, count=k)
    else:
        rows = np.array(rec[:k], dtype=float)
    fold(eng, rows.reshape(n, M.N_RECORD_FIELDS))


def fold(eng, A: np.ndarray) -> None:
    """Rows of finished requests (metrics.RECORD_FIELDS, as floats) into the metrics. ``A`` may be the
    engine's own record buffer: the columns are one copy of it (contiguous, in one pass), so nothing
    keeps a view of the buffer that the engine goes on to fill."""
    ints = M.RECORD_INT_FIELDS
    cols = np.ascontiguousarray(A.T)
    a = {nm: cols[j].astype(np.int64) if nm in ints else cols[j] for j, nm in enumerate(M.RECORD_FIELDS)}
    coh = eng.collector.cohort
    if coh is None:
        eng.collector.add_requests(a)
    else:  # (a drain past the horizon feeds the cohort only: the window's metrics are taken)
        if not coh.draining:
            eng.collector.add_requests(a)
        coh.add(a)
    if eng._records is not None:
        if eng._pc is not None:  # the prefix cache's column: cached tokens of each request's first prefill
            a["cached_prompt"] = eng._pc.cached_of(a["id"])
        eng._records.write(a)


def housekeeping(eng, t: float) -> tuple[bool, bool]:
    """Snapshots, samples and ticks due at time t: (horizon reached, controller ticked).

    Measurement (snapshots, samples) does not touch the dynamics, so runs that differ only in
    warm-up, batches or sample interval follow the same sample path.
    """
    done = False
    ticked = False
    bounds = eng._bounds
    while eng._bi < len(bounds) and bounds[eng._bi] <= t:
        flush(eng)
        eng.collector.snapshot(t, areas(eng, t), np.array(eng._ctr, dtype=float))
        eng._bi += 1
        if eng._bi == len(bounds):
            done = True
    coh = eng.collector.cohort
    if coh is not None:
        done = drain_step(eng, coh, t, done)
    if eng._t_sample <= t:
        eng._samples.append([t] + [float(x) for x in eng._cnt] + [float(x) for x in eng._ctr])
        eng._t_sample += eng.sample_interval
        if eng._t_sample >= eng.horizon:
            eng._t_sample = INF
    if not done and eng._t_tick <= t:
        eng.controller.on_tick(eng)
        eng._t_tick += eng.tick_interval
        ticked = True
    return done, ticked


def t_house(eng) -> float:
    """The next instant of housekeeping: a batch boundary, a sample or a tick."""
    tb = eng._bounds[eng._bi] if eng._bi < len(eng._bounds) else INF
    coh = eng.collector.cohort
    if coh is not None and coh.draining:
        tb = coh.t_check
    return min(tb, eng._t_sample, eng._t_tick)


# -- the drain past the horizon (simulate(..., drain=cap); fluidopt.sim.cohort) ---------------------
def start_drained_arrivals(eng, coh) -> None:
    """The workload's arrivals up to ``horizon + cap``: the cohort's last requests meet the load
    that follows them. A trace that ends between the horizon and ``horizon + cap`` is no fault
    (its TraceWarning is kept only when the trace ends before the horizon itself)."""
    from fluidopt.workloads.base import TraceWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TraceWarning)
        eng._arr_iter = iter(eng.workload.batches(eng._work_rng, eng.horizon + coh.cap, eng._arrival_chunk))
        next_arrivals(eng)
    times = getattr(eng.workload, "time", None)
    ends_early = times is not None and len(times) and float(times[-1]) < eng.horizon
    for w in caught:
        if not issubclass(w.category, TraceWarning) or ends_early or "before the horizon" not in str(w.message):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def drain_step(eng, coh, t: float, done: bool) -> bool:
    """Housekeeping of a run with a drain: at the horizon (``done``), take the window's result and
    start draining; at each check, stop once the cohort has resolved or at ``horizon + cap``."""
    if done and not coh.draining:
        snaps = eng.collector.snapshots
        first = next(s for s in snaps if s[0] >= eng.warmup)
        nc, c_arr = M.N_CTR, M.C_ARRIVED
        coh.arrived = np.array([snaps[-1][2][nc * c + c_arr] - first[2][nc * c + c_arr] for c in range(eng.I)])
        # the window's result, as a run that stopped here would return it (records stay open)
        coh.window_result = assemble_result(eng, time.perf_counter() - eng._wall0, close_records=False)
        coh.draining = True
        coh.t_check = t
        done = False
    if coh.draining and coh.t_check <= t:
        flush(eng)
        end = eng.horizon + coh.cap
        if coh.pending() <= 0 or t >= end:
            coh.end_time = t
            coh.t_check = INF
            return True
        coh.t_check = min(t + coh.step, end)
    return done


def finish_cohort(eng, coh, wall: float) -> M.SimResult:
    """The result of a run with a drain: the window's metrics (taken at the horizon) plus the
    cohort's (:data:`fluidopt.sim.cohort.COHORT_KEYS` in ``cluster``, the per-class table in
    ``meta["cohort"]``); records hold every request's outcome up to the drain's end."""
    from dataclasses import replace

    from fluidopt.sim.cohort import COHORT_KEYS, cohort_summary, warn_undrained
    from fluidopt.sim.results import write_live_records

    if coh.window_result is None:  # stopped (Ctrl-C) before the horizon: no cohort to report
        res = assemble_result(eng, wall)
        nan = {k: math.nan for k in COHORT_KEYS}
        nan["cohort_drained"] = False
        return replace(res, cluster={**res.cluster, **nan})
    flush(eng)
    if math.isnan(coh.end_time):
        coh.end_time = eng._now
    records_path = write_live_records(eng, eng._now)
    m, pc = cohort_summary(coh, tuple(eng._class_names))
    res = coh.window_result
    warn_undrained(m)
    meta = {**res.meta, "cohort": pc, "drain_end": coh.end_time}
    return replace(res, cluster={**res.cluster, **m}, events=eng._events, wall_seconds=wall,
                   interrupted=res.interrupted or eng._interrupted, records_path=records_path, meta=meta)


def exact_lam(eng) -> float:
    """The race's total rate recounted from its sets (the kernel keeps it incrementally)."""
    lam = 0.0
    rsn = eng._rsn
    I = eng.I
    for c in range(I):
        lam += eng.theta[c] * rsn[RACE_WAIT * I + c]
        if eng.markov:
            lam += eng.mu_p[c] * rsn[RACE_PREFILL * I + c] + eng.mbar[c] * rsn[RACE_DECODE * I + c]
    return lam


def in_system(eng) -> list[int]:
    """The requests in the system (slots in use), by id."""
    # one vectorised pass: indexing the compiled core's memoryviews from Python, slot by slot, was most
    # of a check=True run's time (every slot of the table, after every event)
    return np.flatnonzero(np.asarray(eng.r_phase) != GONE).tolist()


def refill_exp(eng) -> None:
    """The next block of standard exponentials for the race clock."""
    eng._exp_block = S.block(eng._np_rng.standard_exponential(S.RNG_BLOCK), eng.engine_name == "compiled")
    eng._exp_i = 0


def refill_uni(eng) -> None:
    """The next block of uniforms for the race's selection."""
    eng._uni_block = S.block(eng._np_rng.random(S.RNG_BLOCK), eng.engine_name == "compiled")
    eng._uni_i = 0


def alloc(eng) -> int:
    """A new request slot when none is free. The per-request arrays grow by a block of slots
    (doubling: amortised O(1) per request); they are replaced, not extended in place (the compiled
    core holds their buffers), so no kernel method keeps one in a local across an arrival. The new
    ids go onto the free stack in reverse, so they are handed out in increasing order and only after
    every id freed in the meantime: the same ids, in the same order, as growing one slot at a time."""
    typed = eng.engine_name == "compiled"
    r = len(eng.r_phase)
    k = max(ALLOC_BLOCK, r)
    if typed:
        if r + k - 1 > S.MAX_ID:
            raise MemoryError(f"more than {S.MAX_ID:,} request slots: the compiled core's race holds 32-bit ids")
        S.set_typed_state(eng, "_rows", S.REQUEST_FIELDS, S.REQUEST_ROW, r + k, S.REQUEST_FILL)
    else:
        for name, _, fill, _ in S.REQUEST_FIELDS:
            setattr(eng, name, S.grown(getattr(eng, name), k, fill, False))
    eng._free.extend(range(r + k - 1, r, -1))
    return r


def race_grow(eng, s: int) -> None:
    """Double race segment s's capacity: a new block with every segment's pairs (request, GPU) copied
    to its new offset (a new array: nothing keeps the old one in a local). Each segment grows on its
    own, so a segment holds at most twice its largest count: at 50,000 GPUs the decode segments hold
    most of the ~800,000 requests in flight and the others a few thousand."""
    typed = eng.engine_name == "compiled"
    cap, off, rsn = eng._rscap, eng._rsoff, eng._rsn
    cap[s] *= 2
    new = S.pairs(2 * sum(cap), -1, typed)
    old = eng._rs.base if typed else eng._rs  # (the compiled core's view of an array: the array)
    at = 0
    for q in range(len(rsn)):
        k = 2 * rsn[q]
        new[at:at + k] = old[off[q]:off[q] + k]
        off[q] = at
        at += 2 * cap[q]
    eng._rs = new
