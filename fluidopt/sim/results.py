"""Assembling a run's result from an engine's counters, and the progress line: cold code, kept out
of the event kernel."""

from __future__ import annotations

import os
import sys
import warnings
from array import array

import numpy as np
import pandas as pd

from fluidopt.sim import metrics as M
from fluidopt.sim.metrics import (
    C_AB_DECODE,
    C_AB_PREFILL,
    C_ARRIVED,
    C_COMPLETED,
    C_DROPPED,
    C_PREEMPTED,
)

__all__ = ["SLOWarning", "assemble_result", "min_service_time", "progress_line", "write_live_records"]


def write_live_records(eng, t_end: float, live: list[int] | None = None) -> str | None:
    """Write the requests still in the system (outcome ``in_system``, end ``t_end``) to the records
    and close them; the records file's path (None without records)."""
    if eng._records is None:
        return None
    _NREC = M.N_RECORD_FIELDS
    if live is None:
        live = eng._in_system()
    if live:
        # the engine's own row writer fills them (one format), into a buffer of their own lent as its _rec
        saved, eng._rec = eng._rec, array("d", [0.0]) * (len(live) * _NREC)
        try:
            for j, r in enumerate(sorted(live, key=eng.r_serial.__getitem__)):
                eng._write_record(j * _NREC, r, eng.r_cls[r], M.IN_SYSTEM, t_end)
            rows = np.frombuffer(eng._rec, dtype=float).reshape(-1, _NREC)
        finally:
            saved, eng._rec = eng._rec, saved
        eng._fold(rows)
    return eng._records.close()


def assemble_result(eng, wall: float, *, close_records: bool = True) -> M.SimResult:
    """The :class:`~fluidopt.sim.metrics.SimResult` of engine ``eng`` at its current time (the end of
    the run): flush the finished requests, write the requests still in the system to the records
    (``close_records=False``: neither, the run goes on to drain its cohort), total the counters,
    build the time series and the revenue functions. ``wall``: seconds the run took."""
    NC = M.N_CTR
    t_end = eng._now
    eng._flush()
    live = eng._in_system()
    if close_records:
        records_path = write_live_records(eng, t_end, live)
    else:  # a run that drains past the horizon (fluidopt.sim.cohort): the records go on
        records_path = eng._records.path if eng._records is not None else None
    ctr = eng._ctr
    I = eng.I
    arrived = sum(ctr[NC * c + C_ARRIVED] for c in range(I))
    totals = {
        "requests": arrived,
        "completed": sum(ctr[NC * c + C_COMPLETED] for c in range(I)),
        "abandoned": sum(ctr[NC * c + C_AB_PREFILL] + ctr[NC * c + C_AB_DECODE] for c in range(I)),
        "abandoned_prefill": sum(ctr[NC * c + C_AB_PREFILL] for c in range(I)),
        "abandoned_decode": sum(ctr[NC * c + C_AB_DECODE] for c in range(I)),
        "dropped": sum(ctr[NC * c + C_DROPPED] for c in range(I)),
        "in_system": len(live),
        "preemptions": sum(ctr[NC * c + C_PREEMPTED] for c in range(I)),
    }
    ts = None
    if eng._samples:
        cols = ["time"]
        for nm in eng._class_names:
            cols += [f"q_prefill[{nm}]", f"x[{nm}]", f"q_decode[{nm}]", f"y_mixed[{nm}]", f"y_solo[{nm}]"]
        cols += ["busy_gpus"]
        for nm in eng._class_names:
            cols += [f"{k}[{nm}]" for k in ("arrived", "prefilled", "completed", "abandoned_prefill",
                                             "abandoned_decode", "dropped", "preempted", "prefill_tokens",
                                             "done_prompt_tokens", "done_output_tokens")]
        ts = pd.DataFrame(eng._samples, columns=cols)
    markov = eng.markov
    cp, cd, Pm, Dm = eng._cp, eng._cd, eng._mean_prompt, eng._mean_output

    def bundled(cls_ctr):
        if markov:  # the paper's model: class-mean rewards w_i per completion
            return cls_ctr(M.C_COMPLETED) * (np.array(cp) * Pm + np.array(cd) * Dm)
        return cls_ctr(M.C_DONE_PROMPT) * np.array(cp) + cls_ctr(M.C_DONE_OUTPUT) * np.array(cd)

    def separate(cls_ctr):
        if markov:
            return cls_ctr(M.C_PREFILLED) * (np.array(cp) * Pm) + cls_ctr(M.C_COMPLETED) * (np.array(cd) * Dm)
        return cls_ctr(M.C_PREFILL_TOKENS) * np.array(cp) + cls_ctr(M.C_DONE_OUTPUT) * np.array(cd)

    col = eng.collector
    if col.slo_on and live:
        # the window's requests still in the system at the end miss their SLO
        lv = [r for r in live if eng.r_arr[r] >= eng.warmup]
        if lv:
            col.slo_fold(np.array([eng.r_cls[r] for r in lv], dtype=np.int64), np.full(len(lv), M.IN_SYSTEM),
                         np.array([eng.r_arr[r] for r in lv]), np.full(len(lv), np.nan), np.full(len(lv), np.nan),
                         np.array([eng.r_prompt[r] for r in lv]), np.array([eng.r_output[r] for r in lv]))
    res = M.build_result(
        eng.collector, scenario=eng.scenario, policy=getattr(eng.controller, "name", type(eng.controller).__name__),
        service=eng._service, seed=eng.seed, t_end=t_end, wall=wall, interrupted=eng._interrupted,
        events=eng._events, totals=totals, rewards={"bundled": bundled, "separate": separate}, timeseries=ts,
        records_path=records_path,
    )
    res.meta["gpu_hours"] = eng.gpu_hours()
    res.meta["prompt_tokens"] = sum(ctr[NC * c + M.C_PREFILL_TOKENS] for c in range(I))  # first prefills
    if eng._pc is not None:  # the prefix cache: totals, per class (beside the other columns), per instance
        by_class, by_gpu = eng._pc.tables(eng._class_names, eng.n)
        res.totals["prompt_tokens"] = int(by_class.prompt_tokens.sum())
        res.totals["cached_prompt_tokens"] = int(by_class.cached_prompt_tokens.sum())
        res.cluster["hit_ratio"] = res.totals["cached_prompt_tokens"] / max(res.totals["prompt_tokens"], 1)
        for k in ("prompt_tokens", "cached_prompt_tokens", "hit_ratio"):
            res.per_class[k] = by_class[k].to_numpy()
        res.meta["prefix_cache"] = by_gpu
        res.meta["prefix_cache_evictions"] = eng._pc.evictions
    if eng._fleet_used:
        res.meta["fleet"] = True
        res.meta["fleet_log"] = pd.DataFrame(eng._fleet_log, columns=["time", "gpus", "online"])
    if col.slo_on and len(res.per_class.columns):
        pc = res.per_class
        pc["slo_requests"] = col.slo_n
        pc["slo_met"] = col.slo_met
        pc["slo_attainment"] = np.where(col.slo_n > 0, col.slo_met / np.maximum(col.slo_n, 1), np.nan)
        pc["deadline_infeasible"] = col.slo_infeasible
        bad = [(nm, int(k)) for nm, k in zip(eng._class_names, col.slo_infeasible) if k]
        if bad:
            level, f, here = 1, sys._getframe(0), os.path.dirname(__file__)
            while f.f_back is not None and os.path.dirname(f.f_code.co_filename) == here:
                f, level = f.f_back, level + 1  # point the warning at the caller of fluidopt.sim
            warnings.warn(
                "deadline shorter than the request's own service time (counted as missed): "
                + ", ".join(f"{k} requests of class {nm!r}" for nm, k in bad), SLOWarning, stacklevel=level)
    return res


class SLOWarning(UserWarning):
    """Some requests had a deadline shorter than their own service time (counted as missed SLOs)."""


def min_service_time(gpu, chunked: bool, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
    """Seconds a request needs alone on a GPU: its prefill (ceil(P/C) mixed iterations, or one
    whole-prompt iteration) plus ``output`` solo decode iterations (no KV time term: a lower bound); with
    the GPU's ``timemodel``, that law's time alone (:func:`fluidopt.sim.timelaw.min_service_time`)."""
    if gpu.timemodel is not None:
        from fluidopt.sim.timelaw import min_service_time as law_time

        return law_time(gpu.timemodel, gpu.chunk, chunked, prompt, output)
    prompt = np.asarray(prompt, dtype=float)
    pre = np.ceil(prompt / gpu.chunk) * gpu.tau_mix if chunked else gpu.alpha + gpu.beta * prompt
    return pre + np.asarray(output, dtype=float) * gpu.tau_solo


def progress_line(eng, wall: float, log: bool = False) -> None:
    """Rewrite the progress line on stderr: simulated time, requests so far, requests per wall second.
    ``log``: a plain line with the wall seconds elapsed instead (stderr is not a terminal)."""
    NC = M.N_CTR
    t = eng._now
    arrived = sum(eng._ctr[NC * c + C_ARRIVED] for c in range(eng.I))
    what = (f"t = {t:.6g} / {eng.horizon:g} s ({100 * t / eng.horizon:5.1f}%), "
            f"{arrived} requests, {arrived / wall if wall > 0 else 0:,.0f} req/s")
    if log:
        sys.stderr.write(f"[fluidopt simulate] {wall:.0f} s elapsed: {' '.join(what.split())}\n")
    else:
        sys.stderr.write(f"\r[fluidopt simulate] {what}  ")
    sys.stderr.flush()
