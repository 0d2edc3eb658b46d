"""The event kernel's state layout (docs/simulator.md section 9): the per-request fields, the fleet
states, and the containers the state lives in.

The kernel (fluidopt/sim/engine.py) keeps its state in flat arrays: lists in the Python engine
(Python indexes them fastest), typed arrays (``array.array``, numpy buffers) in the compiled core,
where engine.pxd reads them as C arrays. The helpers below build either, by ``typed``.
"""

from __future__ import annotations

import math
from array import array

import numpy as np

from fluidopt.core.errors import ScenarioError
from fluidopt.sim.action_errors import GONE

__all__ = ["REQUEST_FIELDS", "REQUEST_FILL", "GPU_FIELDS", "rows", "set_typed_state", "GSTATE_NAMES", "ints", "floats",
           "doubles", "pairs", "MAX_ID", "grown", "block", "int_block", "token_counts"]

# Per-request state, indexed by request id (slots are recycled). This table is each field's one
# definition (name, type, the value of a new slot, meaning); engine.pxd types each as long long[:]
# (int) or double[:] (float), and tests/sim/test_sim_backends.py checks that the two agree. Adding a
# field: a row here, a name in engine.pxd, then its uses (the row grows by whole cache lines by itself:
# REQUEST_ROW = row_slots(REQUEST_FIELDS)). The Python engine keeps one list per field;
# the compiled core one row of REQUEST_ROW 8-byte slots per request (set_typed_state), fields in
# this table's order, each field a strided view of that block:
# a request touched at random (an exponential race pick among ~800,000 in flight at 50,000 GPUs)
# then costs two or three cache lines instead of one per field (docs/benchmarks-sim.md, "Scaling").
REQUEST_FIELDS: tuple[tuple[str, type, int | float, str], ...] = (
    # row line 0 (bytes 0-63): what a decode completion reads first
    ("r_phase", int, GONE, "phase (action_errors.PHASE_NAMES); GONE for a free slot"),
    ("r_gpu", int, -1, "GPU it runs on, -1"),
    ("r_cls", int, 0, "class"),
    ("r_pos", int, -1, "index in the waiting / prefill / decode list of its class"),
    ("r_dpos", int, -1, "tokens: index in g_dec of its decode"),
    ("r_output", int, 0, "output tokens"),
    ("r_prompt", int, 0, "original prompt tokens"),
    ("r_gen", int, 0, "output tokens generated before the current decode stint"),
    # line 1 (64-127): the rest of a finished request's record
    ("r_serial", int, 0, "arrival number (a record's id)"),
    ("r_arr", float, 0.0, "arrival time (s)"),
    ("r_ttft", float, math.nan, "time of the first prefill completion (NaN before)"),
    ("r_wp", float, 0.0, "accumulated wait for a prefill (s)"),
    ("r_wd", float, 0.0, "accumulated wait for a decode (s)"),
    ("r_npre", int, 0, "preemptions"),
    ("r_pg", int, -1, "GPU of the first prefill"),
    ("r_dg", int, -1, "GPU of the (last) decode"),
    # line 2 (128-191): queues, the tokens-mode decode clock, the fleet
    ("r_q", int, -1, "queue it waits in, -1"),
    ("r_tw", float, 0.0, "time the current wait began (s)"),
    ("r_next", int, -1, "next request in its queue"),
    ("r_prev", int, -1, "previous request in its queue"),
    ("r_seq", int, 0, "FCFS sequence number in its queue"),
    ("r_dkey", int, 0, "tokens: its GPU's decode clock when its decode ends"),
    ("r_dstart", int, 0, "its GPU's decode clock when the current decode stint joined"),
    ("r_host", int, 0, "1: evicted to host memory (its KV restores instead of a re-prefill)"),
)
REQUEST_FILL = {f[0]: f[2] for f in REQUEST_FIELDS}  # each field's value in a new slot

# Fleet states of a GPU (g_state; docs/simulator.md section 11). A fixed fleet never leaves ONLINE.
G_ONLINE, G_STARTING, G_DRAINING, G_OFFLINE = 0, 1, 2, 3
GSTATE_NAMES = ("online", "starting", "draining", "offline")
STARTUP = -2  # t_pkb of a starting GPU: its pending heap event is its start-up completion

# The exponential race's request sets, one segment per (kind, class): segment s = kind * I + class
RACE_WAIT, RACE_PREFILL, RACE_DECODE = 0, 1, 2

FLUSH = 8192  # finished requests buffered before folding into the metrics
RNG_BLOCK = 65536  # random numbers drawn at a time


# Per-GPU state, indexed by GPU id (name, type, meaning); engine_setup gives each its initial value.
# The Python engine keeps one list per field; the compiled core keeps one row of GPU_ROW 8-byte slots
# per GPU, in this order, each field a strided view (as the request rows): what a markov completion
# reads of its GPU is one cache line, tokens mode's iteration clock the next.
GPU_FIELDS: tuple[tuple[str, type, str], ...] = (
    ("g_pre", int, "the request prefilling on it, NO_REQUEST"),
    ("g_ndec", int, "decodes on it"),
    ("g_cnt", int, "requests on it (prefill and decodes)"),
    ("g_pool", int, "its pool"),
    ("g_pok", int, "prefills allowed (1) or not (0)"),
    ("g_maxd", int, "its decode cap"),
    ("g_state", int, "fleet state (GSTATE_NAMES)"),
    ("_isdirty", int, "tokens: its pending event must be recomputed"),
    ("t_ka", int, "tokens: anchor boundary index"),
    ("t_dca", int, "tokens: decode clock at the anchor"),
    ("t_kv", int, "tokens: KV tokens at the anchor"),
    ("t_adv", int, "tokens: decode clock advance per iteration (0 while a whole prefill stalls decodes)"),
    ("t_pend", int, "tokens: boundary index where the running prefill ends"),
    ("t_pkb", int, "tokens: boundary of its valid pending heap entry (-1: none)"),
    ("t_ta", float, "tokens: anchor time (s)"),
    ("t_itl", float, "tokens: base iteration length from the anchor on (s)"),
)
ROW_ALIGN = 64  # rows start on a cache line


def row_slots(fields) -> int:
    """8-byte slots of a row holding ``fields``: their number rounded up to whole cache lines (ROW_ALIGN
    bytes), so that a row never straddles more lines than it must and a new field needs no other edit."""
    per_line = ROW_ALIGN // 8
    return -(-len(fields) // per_line) * per_line


GPU_ROW = row_slots(GPU_FIELDS)  # 8-byte slots per GPU row (16: 128 bytes)
REQUEST_ROW = row_slots(REQUEST_FIELDS)  # 8-byte slots per request row (24: 192 bytes, the 24 fields)


def row_dtype(fields, slots: int) -> np.dtype:
    """A row of ``slots`` 8-byte slots holding ``fields`` ((name, type, ...) rows) in order."""
    return np.dtype({"names": [f[0] for f in fields], "formats": ["<i8" if f[1] is int else "<f8" for f in fields],
                     "offsets": [8 * k for k in range(len(fields))], "itemsize": 8 * slots})


def rows(fields, slots: int, n: int, fill: dict, old: np.ndarray | None = None) -> np.ndarray:
    """n rows (the compiled core's state), aligned to ROW_ALIGN bytes: old's rows first, then new
    rows holding fill[name] in each field."""
    dt = row_dtype(fields, slots)
    raw = np.zeros(n * dt.itemsize + ROW_ALIGN, dtype=np.uint8)
    k = -raw.ctypes.data % ROW_ALIGN
    out = raw[k:k + n * dt.itemsize].view(dt)
    m = 0 if old is None else len(old)
    if m:
        out[:m] = old
    for f in fields:
        out[f[0]][m:] = fill[f[0]]
    return out


def set_typed_state(eng, block_attr: str, fields, slots: int, n: int, fill: dict) -> None:
    """Give the compiled-core engine ``eng`` the per-id ``fields`` ((name, type, ...) rows) for ids
    0..n-1, one row of ``slots`` 8-byte slots per id in ``eng.<block_attr>``, each field a strided
    view of it: ids it already has keep their values, new ids get fill[name]."""
    block = rows(fields, slots, n, fill, getattr(eng, block_attr, None))
    setattr(eng, block_attr, block)
    for f in fields:
        setattr(eng, f[0], block[f[0]])


def ints(n: int, v: int, typed: bool) -> list[int] | array:
    """n integers equal to v: per-GPU and per-request state, counters (signed 64-bit when typed)."""
    return array("q", [v]) * n if typed else [v] * n


# the largest id the compiled core's race pairs hold (pairs): bookkeeping.alloc refuses request slots
# beyond it; GPU ids stay below the scenario's fleet size, whose GPU rows would need 275 GB at 2**31
MAX_ID = 2**31 - 1


def pairs(n: int, v: int, typed: bool) -> list[int] | np.ndarray:
    """n integers equal to v for the exponential race's (request, GPU) pairs: 32-bit when typed (ids
    up to MAX_ID; bookkeeping.alloc refuses more request slots), a numpy array so that a large one
    sits on huge pages (numpy advises them from 4 MB): a race pick lands anywhere in it, and the
    pairs of ~800,000 requests in flight then take 6.4 MB instead of 12.8, half as many cache lines
    and page walks."""
    return np.full(n, v, dtype=np.int32) if typed else [v] * n


def floats(n: int, v: float, typed: bool) -> list[float] | array:
    """n doubles equal to v: times and time integrals."""
    return array("d", [v]) * n if typed else [v] * n


def doubles(values, typed: bool) -> list[float] | array:
    """Per-class rates as doubles."""
    vals = [float(x) for x in values]
    return array("d", vals) if typed else vals


def grown(old, k: int, v: int | float, typed: bool) -> list | array:
    """A copy of ``old`` (from :func:`ints` or :func:`floats`) with k more elements equal to v."""
    if not typed:
        return old + [v] * k
    a = old.base[:]  # the compiled core's view of an array has the array as its base
    a.extend(array("d" if isinstance(v, float) else "q", [v]) * k)
    return a


def block(a: np.ndarray, typed: bool) -> list[float] | np.ndarray:
    """A block of doubles (random numbers, arrival times): the float64 array itself when typed."""
    return a if typed else a.tolist()


def int_block(a: np.ndarray, typed: bool) -> list[int] | np.ndarray:
    """Integers of a workload batch: a C long long array when typed."""
    a = np.ascontiguousarray(a, dtype=np.longlong)
    return a if typed else a.tolist()


def token_counts(what: str, values) -> np.ndarray:
    """A workload batch's token counts as int64 (whole numbers >= 0 required)."""
    a = np.asarray(values)
    if a.dtype.kind not in "iu":
        if a.dtype.kind != "f" or not np.all(np.isfinite(a)) or np.any(a != np.floor(a)):
            bad = a[~(np.isfinite(a) & (a == np.floor(a)))][0] if a.dtype.kind == "f" else a.flat[0]
            raise ScenarioError(f"workload: {what} tokens: expected whole numbers, got {bad!r} ({a.dtype})")
    if a.size and a.min() < 0:
        raise ScenarioError(f"workload: {what} tokens: expected >= 0, got {a.min()!r}")
    return a.astype(np.int64)
