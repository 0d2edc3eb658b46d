"""Replay of a recorded trace: :class:`TraceWorkload` (the file readers are in :mod:`fluidopt.workloads.traces`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence

import numpy as np
import pandas as pd

from fluidopt.core.errors import TraceError
from fluidopt.workloads.base import ArrivalBatch, TraceWarning, _check_horizon, _check_size, _num

__all__ = ["TraceWorkload"]

# --------------------------------------------------------------------------------------------
# Trace replay
# --------------------------------------------------------------------------------------------


class TraceWorkload:
    """Replay of a recorded trace: the arrivals are the trace's rows, in order; ``rng`` is unused.

    ``frame`` has columns ``time`` (seconds, nondecreasing, >= 0), ``prompt`` and ``output`` (integer
    tokens >= 1) and ``cls`` (class index into ``class_names``). ``speedup`` divides every time (2.0
    replays twice as fast: double the rate); ``max_requests`` keeps the first rows only. Replay does
    not loop: when a finite horizon lies beyond the last arrival a :class:`TraceWarning` says so.
    Loaders: :func:`fluidopt.workloads.traces.load_azure_trace`, :func:`fluidopt.workloads.traces.load_trace_csv`.

    ``hashes`` (optional, one entry per row): each request's prompt KV blocks as int64 block ids, the
    ids chained (equal ids mean an equal prefix up to that block), ``block_size`` tokens each
    (:mod:`fluidopt.workloads.jsonl`; the cache model of :mod:`fluidopt.workloads.prefix` reads them). In
    tokens mode the simulator's prefix cache reads them (:mod:`fluidopt.sim.prefix_cache`; off with
    ``simulate(..., prefix_cache=False)``).
    """

    def __init__(
        self,
        frame: pd.DataFrame,
        class_names: Sequence[str],
        *,
        speedup: float = 1.0,
        max_requests: int | None = None,
        name: str = "trace",
        notes: Sequence[str] = (),
        hashes: Sequence[np.ndarray] | None = None,
        block_size: int | None = None,
    ):
        if not isinstance(frame, pd.DataFrame):
            raise TraceError(f"TraceWorkload: expected a pandas DataFrame, got {type(frame).__name__}")
        missing = [c for c in ("time", "prompt", "output", "cls") if c not in frame.columns]
        if missing:
            raise TraceError(
                f"TraceWorkload: missing column(s) {', '.join(missing)}; found {', '.join(map(str, frame.columns))}"
            )
        speedup = _num("TraceWorkload.speedup", speedup)
        names = tuple(str(n) for n in class_names)
        if max_requests is not None:
            if isinstance(max_requests, bool) or not isinstance(max_requests, (int, np.integer)) or max_requests < 1:
                raise TraceError(f"TraceWorkload.max_requests: expected an integer >= 1, got {max_requests!r}")
            frame = frame.iloc[: int(max_requests)]
            if hashes is not None:
                hashes = list(hashes)[: int(max_requests)]
        if len(frame) == 0:
            raise TraceError("TraceWorkload: the trace has no requests")
        t = frame["time"].to_numpy(dtype=float)
        arrays = {}
        for col in ("prompt", "output", "cls"):
            v = frame[col].to_numpy()
            if not np.issubdtype(v.dtype, np.integer):
                raise TraceError(f"TraceWorkload: column {col}: expected integers, got dtype {v.dtype}")
            arrays[col] = v.astype(np.int64)
        bad = np.flatnonzero(~np.isfinite(t) | (t < 0))
        if bad.size:
            raise TraceError(f"TraceWorkload: position {int(bad[0])}: time = {float(t[bad[0]])!r}: expected finite seconds >= 0")
        dec = np.flatnonzero(np.diff(t) < 0)
        if dec.size:
            raise TraceError(
                f"TraceWorkload: position {int(dec[0]) + 1}: time = {float(t[dec[0] + 1])!r} is before the previous row's "
                f"{float(t[dec[0]])!r}: expected nondecreasing times (the loaders sort them)"
            )
        for col in ("prompt", "output"):
            bad = np.flatnonzero(arrays[col] < 1)
            if bad.size:
                raise TraceError(
                    f"TraceWorkload: position {int(bad[0])}: {col} = {int(arrays[col][bad[0]])}: expected an integer >= 1"
                )
        c = arrays["cls"]
        bad = np.flatnonzero((c < 0) | (c >= len(names)))
        if bad.size:
            raise TraceError(
                f"TraceWorkload: position {int(bad[0])}: cls = {c[bad[0]]}: expected a class index in 0..{len(names) - 1}"
            )
        self.time = t / speedup
        self.prompt = arrays["prompt"]
        self.output = arrays["output"]
        self.cls = c
        self.class_names: tuple[str, ...] = names
        self.speedup = speedup
        self.name = name
        self.notes: tuple[str, ...] = tuple(notes)
        self.hashes: tuple[np.ndarray, ...] | None = None
        self.block_size: int | None = None
        if hashes is not None:
            hashes = tuple(np.asarray(h, dtype=np.int64) for h in hashes)
            if len(hashes) != len(frame):
                raise TraceError(f"TraceWorkload: hashes: {len(hashes)} entries for {len(frame)} requests: expected one per request")
            if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size < 1:
                raise TraceError(f"TraceWorkload: block_size = {block_size!r}: expected an integer >= 1 with hashes")
            self.hashes, self.block_size = hashes, int(block_size)
        for a in (self.time, self.prompt, self.output, self.cls):
            a.setflags(write=False)

    def __repr__(self) -> str:
        return (
            f"TraceWorkload({self.name!r}, {self.n_requests} requests over {self.duration:.6g} s, "
            f"classes {list(self.class_names)}, speedup {self.speedup:g})"
        )

    def __len__(self) -> int:
        return self.n_requests

    @property
    def n_requests(self) -> int:
        return int(self.time.size)

    @property
    def duration(self) -> float:
        """Time of the last arrival (seconds, after speedup)."""
        return float(self.time[-1])

    @property
    def frame(self) -> pd.DataFrame:
        """The replayed arrivals (after speedup) with a ``class`` name column."""
        return pd.DataFrame(
            {
                "time": self.time,
                "prompt": self.prompt,
                "output": self.output,
                "cls": self.cls,
                "class": pd.Categorical.from_codes(self.cls, categories=list(self.class_names)),
            }
        )

    def batches(self, rng: np.random.Generator | None, horizon: float, size: int = 65536) -> Iterator[ArrivalBatch]:
        """The trace's arrivals with time < ``horizon``, in chunks of at most ``size`` (``rng`` unused)."""
        horizon = _check_horizon(horizon)
        size = _check_size(size)
        n = int(np.searchsorted(self.time, horizon, side="left"))
        if n == self.n_requests and math.isfinite(horizon):
            warnings.warn(
                f"{self.name}: the trace ends at t = {self.duration:.6g} s, before the horizon {horizon:.6g} s; "
                "replay stops there (it does not loop)",
                TraceWarning,
                stacklevel=2,
            )
        for a in range(0, n, size):
            b = min(a + size, n)
            # copies: callers may modify their batch; the trace itself stays read-only
            yield ArrivalBatch(
                self.time[a:b].copy(), self.cls[a:b].copy(), self.prompt[a:b].copy(), self.output[a:b].copy()
            )
