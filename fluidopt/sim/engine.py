"""The event-driven many-server simulator (docs/simulator.md).

One engine, two service semantics:

* ``markov``: the paper's stochastic model exactly. Prefill and decode durations are exponential
  (rates mu_p,i; mu_m,i on a mixed GPU, mu_s,i on a solo GPU), patience is Exp(theta_i). The whole
  state is a continuous-time Markov chain, simulated by a single exponential race (Gillespie):
  after every event the next "clock" event comes after Exp(Lambda) with Lambda = sum_i (mu_p,i X_i +
  mbar_i Y_i + theta_i W_i), mbar_i = max(mu_m,i, mu_s,i); the event is a prefill completion, a
  decode completion or an abandonment of a uniformly chosen request of the chosen kind and class. A
  decode's true rate depends on its GPU's current mode, so the decode candidate is accepted with
  probability rate/mbar_i (thinning: exact, and a mode switch costs nothing). Memorylessness makes
  redrawing the race after every event exact.
* ``tokens``: integer prompt and output lengths. A GPU runs iterations of tau_mix = alpha + beta*C
  while a prefill chunk runs on it, tau_solo otherwise (plus kv_time_per_token per token of resident
  KV cache, if set); a prefill of P tokens takes ceil(P/C) mixed iterations, a decode of D tokens
  takes D iterations of its GPU; new work joins at the GPU's next iteration boundary. Between two
  events a GPU's iteration law is fixed, so its next completion is a closed-form number of
  iterations away: each GPU has one pending event in an indexed heap (moved in place when the GPU changes)
  and the engine never steps iteration by iteration. Abandonment still uses the exponential race.

Arrivals come lazily from a :class:`fluidopt.sim.workload.Workload`. Controllers (see
:mod:`fluidopt.control.protocol`) receive events with this engine as their context and act through
its validated actions. Memory is proportional to the requests in flight: per-request state lives in
recycled slots, finished requests are folded into :mod:`fluidopt.sim.metrics` in chunks.

This file is also the source of the compiled core: setup.py compiles it with the static types of
engine.pxd (docs/simulator.md section 9). Declare new Engine attributes there, keep each local name
to one type, and keep no per-request array in a local across an arrival.
"""

from __future__ import annotations

import gc
import math
import random
import signal
import sys
import threading
import time
from array import array
from collections.abc import Callable, Sequence

import numpy as np

from fluidopt.control.protocol import (
    DECODE,
    DECODE_QUEUE,
    NO_REQUEST,
    PREFILL,
    PREFILL_QUEUE,
    WAIT_DECODE,
    WAIT_PREFILL,
    Controller,
)
from fluidopt.errors import ActionError, ScenarioError
from fluidopt.model import Scenario
from fluidopt.sim import metrics as M
from fluidopt.sim.action_errors import GONE as _GONE  # phase of a freed request slot
from fluidopt.sim.action_errors import PHASE_NAMES as _PHASE_NAMES
from fluidopt.sim.action_errors import decode_error, prefill_error
from fluidopt.sim.invariants import check_invariants
from fluidopt.sim.results import assemble_result, progress_line

__all__ = ["Engine", "GpuSet"]

INF = math.inf
NAN = math.nan
_NEVER = 1 << 62  # a boundary index beyond any run
_FLUSH = 8192  # finished requests buffered before folding into the metrics
_RNG_BLOCK = 65536
_ALLOC_BLOCK = 1024  # fewest request slots added at a time
_NREC = M.N_RECORD_FIELDS  # fields of a finished request's row (metrics.RECORD_FIELDS; see _record)

# The exponential race's request sets, one segment per (kind, class): see Engine._rs
RACE_WAIT, RACE_PREFILL, RACE_DECODE = 0, 1, 2

# The layouts of the time-integrated counts (NQ per class) and the event counters (NC per class), by
# name, from their one definition in fluidopt.sim.metrics (engine.pxd types these as C integers).
NQ = M.N_CLASS_QTY
Q_WP, Q_X, Q_WD, Q_YM, Q_YS = M.Q_PREFILL, M.X_PREFILL, M.Q_DECODE, M.Y_MIXED, M.Y_SOLO
NC = M.N_CTR
C_ARRIVED, C_PREFILLED, C_COMPLETED, C_PREEMPTED = M.C_ARRIVED, M.C_PREFILLED, M.C_COMPLETED, M.C_PREEMPTED
C_AB_PREFILL, C_AB_DECODE, C_DROPPED = M.C_AB_PREFILL, M.C_AB_DECODE, M.C_DROPPED
C_PREFILL_TOKENS, C_DONE_PROMPT, C_DONE_OUTPUT = M.C_PREFILL_TOKENS, M.C_DONE_PROMPT, M.C_DONE_OUTPUT


# Per-request state: one array per field, indexed by request id (slots are recycled). This table is
# each field's one definition (name, type, the value of a new slot, meaning); engine.pxd types each
# as long long[::1] (int) or double[::1] (float), and tests/sim/test_sim_backends.py checks that the
# two agree. Adding a field: a row here, a name in engine.pxd, then its uses.
REQUEST_FIELDS: tuple[tuple[str, type, int | float, str], ...] = (
    ("r_cls", int, 0, "class"),
    ("r_prompt", int, 0, "original prompt tokens"),
    ("r_output", int, 0, "output tokens"),
    ("r_arr", float, 0.0, "arrival time (s)"),
    ("r_phase", int, _GONE, "phase (action_errors.PHASE_NAMES); GONE for a free slot"),
    ("r_q", int, -1, "queue it waits in, -1"),
    ("r_gpu", int, -1, "GPU it runs on, -1"),
    ("r_next", int, -1, "next request in its queue"),
    ("r_prev", int, -1, "previous request in its queue"),
    ("r_seq", int, 0, "FCFS sequence number in its queue"),
    ("r_pos", int, -1, "index in the waiting / prefill / decode list of its class"),
    ("r_dpos", int, -1, "index in g_dec of its decode"),
    ("r_dkey", int, 0, "tokens: its GPU's decode clock when its decode ends"),
    ("r_tw", float, 0.0, "time the current wait began (s)"),
    ("r_wp", float, 0.0, "accumulated wait for a prefill (s)"),
    ("r_wd", float, 0.0, "accumulated wait for a decode (s)"),
    ("r_ttft", float, NAN, "time of the first prefill completion (NaN before)"),
    ("r_serial", int, 0, "arrival number (a record's id)"),
    ("r_gen", int, 0, "output tokens generated before the current decode stint"),
    ("r_dstart", int, 0, "its GPU's decode clock when the current decode stint joined"),
    ("r_npre", int, 0, "preemptions"),
    ("r_pg", int, -1, "GPU of the first prefill"),
    ("r_dg", int, -1, "GPU of the (last) decode"),
    ("r_host", int, 0, "1: evicted to host memory (its KV restores instead of a re-prefill)"),
)


# Fleet states of a GPU (g_state; docs/simulator.md section 11). A fixed fleet never leaves ONLINE.
G_ONLINE, G_STARTING, G_DRAINING, G_OFFLINE = 0, 1, 2, 3
_GSTATE_NAMES = ("online", "starting", "draining", "offline")
_STARTUP = -2  # t_pkb of a starting GPU: its pending heap event is its start-up completion


# True only in the compiled core: setup.py appends "_COMPILED = True" to the copy it compiles.
_COMPILED = False


def _ints(n: int, v: int) -> list[int] | array:
    """n integers equal to v: per-GPU and per-request state, counters. The compiled core needs typed
    arrays (signed 64-bit; engine.pxd reads them as C arrays); Python is faster with lists."""
    return array("q", [v]) * n if _COMPILED else [v] * n


def _floats(n: int, v: float) -> list[float] | array:
    """n floats (doubles) equal to v: times and time integrals; see :func:`_ints`."""
    return array("d", [v]) * n if _COMPILED else [v] * n


def _block(a: np.ndarray) -> list[float] | np.ndarray:
    """A block of random doubles: a list in Python (fast to index), the float64 array itself in the
    compiled core (read as a C array)."""
    return a if _COMPILED else a.tolist()


def _doubles(values) -> list[float] | array:
    """Per-class rates as doubles: see :func:`_ints`."""
    vals = [float(x) for x in values]
    return array("d", vals) if _COMPILED else vals


def _grown(old, k: int, v: int | float) -> list | array:
    """A copy of ``old`` (from _ints or _floats) with k more elements equal to v."""
    if not _COMPILED:
        return old + [v] * k
    a = old.base[:]  # the compiled core's view of an array has the array as its base
    a.extend(array("d" if isinstance(v, float) else "q", [v]) * k)
    return a


def _int_block(a: np.ndarray) -> list[int] | np.ndarray:
    """Integers of a workload batch: a list in Python, a C long long array in the compiled core."""
    a = np.ascontiguousarray(a, dtype=np.longlong)
    return a if _COMPILED else a.tolist()


def _token_counts(what: str, values) -> np.ndarray:
    """A workload batch's token counts as int64 (whole numbers >= 0 required)."""
    a = np.asarray(values)
    if a.dtype.kind not in "iu":
        if a.dtype.kind != "f" or not np.all(np.isfinite(a)) or np.any(a != np.floor(a)):
            bad = a[~(np.isfinite(a) & (a == np.floor(a)))][0] if a.dtype.kind == "f" else a.flat[0]
            raise ScenarioError(f"workload: {what} tokens: expected whole numbers, got {bad!r} ({a.dtype})")
    if a.size and a.min() < 0:
        raise ScenarioError(f"workload: {what} tokens: expected >= 0, got {a.min()!r}")
    return a.astype(np.int64)


class GpuSet:
    """A set of GPU indices with O(1) add, discard, membership and uniform random choice.

    Controllers see it read-only (``len``, ``in``, iteration, :meth:`choice`, :meth:`first`); the
    engine mutates it through the underscored methods. Members are ``_items[:_len]``; ``_pos[g]`` is
    g's index there, or -1.
    """

    __slots__ = ("_items", "_pos", "_rand", "_len")

    def __init__(self, n: int, rand: Callable[[], float]):
        self._items = _ints(n, -1)
        self._pos = _ints(n, -1)
        self._len = 0
        self._rand = rand

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __contains__(self, g: object) -> bool:
        try:
            k = g.__index__()  # GPU ids: Python or numpy integers
        except (AttributeError, TypeError):
            return False
        return 0 <= k < len(self._pos) and self._pos[k] >= 0

    def __iter__(self):
        return iter([self._items[k] for k in range(self._len)])  # a copy: safe while the controller acts

    def __repr__(self) -> str:
        return f"GpuSet({sorted(self)})"

    def choice(self) -> int:
        n = self._len
        if n == 0:
            return -1
        return self._items[int(self._rand() * n)]

    def first(self) -> int:
        return self._items[0] if self._len else -1

    def _add(self, g: int) -> None:
        if self._pos[g] < 0:
            n = self._len
            self._pos[g] = n
            self._items[n] = g
            self._len = n + 1

    def _discard(self, g: int) -> None:
        pos = self._pos
        p = pos[g]
        if p >= 0:
            items = self._items
            n = self._len - 1
            last = items[n]
            items[p] = last
            pos[last] = p
            pos[g] = -1
            self._len = n


class Engine:
    """One simulation run. Use :func:`fluidopt.sim.api.simulate` rather than this class directly.

    The engine is also the controllers' :class:`fluidopt.control.protocol.Context`: its public
    methods below (views and actions) are the protocol; everything underscored is internal.
    """

    def __init__(
        self,
        scenario: Scenario,
        controller: Controller,
        workload,
        *,
        service: str = "markov",
        horizon: float,
        warmup: float = 0.0,
        seed: int = 0,
        sample_interval: float | None = None,
        records=None,
        progress: bool = False,
        batches: int = 20,
        check: bool = False,
        arrival_chunk: int = 65536,
    ):
        if not isinstance(scenario, Scenario):
            raise ScenarioError(f"simulate: scenario: expected a Scenario, got {type(scenario).__name__}")
        if service not in ("markov", "tokens"):
            raise ScenarioError(f"simulate: service: expected 'markov' or 'tokens', got {service!r}")
        if not isinstance(controller, Controller):
            raise ScenarioError(
                f"simulate: controller: expected a fluidopt.control.protocol.Controller, got {type(controller).__name__}"
            )
        self.scenario = scenario
        self.controller = controller
        self.workload = workload
        self._service = service
        self.horizon = float(horizon)
        self.warmup = float(warmup)
        self.seed = int(seed)
        self.check = bool(check)
        gpu = scenario.gpu
        self.n = n = scenario.gpus
        self.B = gpu.batch
        self.I = I = scenario.n_classes
        self._class_names = scenario.class_names
        self.C = gpu.chunk
        self.alpha, self.beta = gpu.alpha, gpu.beta
        self.tau_mix = gpu.tau_mix
        self.tau_solo = gpu.tau_solo
        self.kap = float(gpu.kv_time_per_token)
        self.kvcap = -1 if gpu.kv_capacity is None else int(math.floor(gpu.kv_capacity))
        if service == "markov" and (gpu.kv_capacity is not None or gpu.kv_time_per_token):
            raise ScenarioError(
                "simulate: service='markov' has no KV-cache model (gpu.kv_capacity / gpu.kv_time_per_token are "
                "set); use service='tokens'"
            )
        self.markov = service == "markov"
        self.chunked = bool(getattr(controller, "chunked_prefill", True))

        # -- random streams: workload, engine, controller (independent children of one seed) ------
        ss = np.random.SeedSequence(self.seed)
        s_work, s_eng, s_ctrl = ss.spawn(3)
        self._work_rng = np.random.default_rng(s_work)
        self._np_rng = np.random.default_rng(s_eng)
        self._ctrl_rng = random.Random(int(s_ctrl.generate_state(1, dtype=np.uint64)[0]))
        self._exp_block = _floats(0, 0.0)
        self._exp_i = 0
        self._uni_block = _floats(0, 0.0)
        self._uni_i = 0

        # -- rates ---------------------------------------------------------------------------------
        rates = scenario.rates()
        P = np.array([c.prompt for c in scenario.classes], dtype=float)
        mu_p = [float(x) for x in rates.mu_p]
        mu_m = [float(x) for x in rates.mu_m]
        if not self.chunked:
            # vLLM prefill-first without chunking: one iteration of alpha + beta * P for the whole
            # prompt, decodes stalled meanwhile (see Controller.chunked_prefill).
            mu_p = [float(x) for x in 1.0 / (gpu.alpha + gpu.beta * P)]
            mu_m = [0.0] * I
        mu_s = [float(x) for x in rates.mu_s]
        self.theta = _doubles(rates.theta)
        self.mu_p = _doubles(mu_p)
        self.mu_m = _doubles(mu_m)
        self.mu_s = _doubles(mu_s)
        self.mbar = _doubles([max(a, b) for a, b in zip(mu_m, mu_s)])
        cp, cd = scenario.class_prices()
        self._cp = [float(x) for x in cp]
        self._cd = [float(x) for x in cd]
        self._mean_prompt = [float(c.prompt) for c in scenario.classes]
        self._mean_output = [float(c.decode) for c in scenario.classes]

        # -- per-request state (recycled slots) ----------------------------------------------------
        self._free: list[int] = []
        for name, kind, _, _ in REQUEST_FIELDS:
            setattr(self, name, _ints(0, 0) if kind is int else _floats(0, 0.0))
        self._serial = 0
        self._seq_back = 0
        self._seq_front = 0

        # -- the exponential race's request sets (swap-remove) ---------------------------------------
        # segment s = kind * I + class (kinds RACE_WAIT: queued, RACE_PREFILL / RACE_DECODE: markov in
        # service) holds its requests in _rs[s * _rscap : s * _rscap + _rsn[s]] (r_pos: r's index)
        self._rscap = 64
        self._rs = _ints(3 * I * self._rscap, -1)
        self._rsn = _ints(3 * I, 0)
        self._lam = 0.0  # total race rate

        # -- counts (time-integrated by the "sum of signed change times" trick) -------------------
        nq = NQ * I + M.N_GPU_QTY
        self._cnt = _ints(nq, 0)
        self._acc = _floats(nq, 0.0)
        self._gbase = NQ * I
        self._ctr = _ints(NC * I, 0)

        # -- GPUs -----------------------------------------------------------------------------------
        self.g_pre = _ints(n, NO_REQUEST)
        self.g_ndec = _ints(n, 0)
        self.g_cnt = _ints(n, 0)
        self.g_pool = _ints(n, 0)
        self.g_pok = _ints(n, 1)  # prefills allowed (1) or not (0)
        self.g_maxd = _ints(n, self.B)
        self.g_dcls = _ints(n * I, 0)  # decodes on g by class: g_dcls[g * I + c]
        # the requests decoding on g: g_dec[g*B : g*B + g_ndec[g]] (r_dpos: r's index in g_dec); in
        # tokens mode that segment is a binary min-heap keyed by (r_dkey[r], r): r_dkey[r] is the value
        # of g's decode clock at which r's decode ends
        self.g_dec = _ints(n * self.B, -1)
        self._n_pools = 1
        rand = self._ctrl_rng.random
        self._ip = [GpuSet(n, rand)]
        self._fd = [GpuSet(n, rand)]
        for g in range(n):
            self._ip[0]._add(g)
            self._fd[0]._add(g)
        # the fleet: GPU-seconds = _fleet_on * t - _fleet_acc (GPUs counted: online, starting, draining)
        self.g_state = _ints(n, G_ONLINE)
        self._fleet_on = n
        self._fleet_acc = 0.0
        self._fleet_log = [(0.0, n, n)]  # (time, GPUs counted, GPUs online) after each change
        self._saved = {}  # GPU -> (prefill allowed, max decodes) while it is not online
        fleet = scenario.fleet
        self._fleet_used = fleet is not None
        self._startup = 0.0 if fleet is None else float(fleet.startup_delay)
        self._swap = 0.0 if fleet is None else float(fleet.kv_swap_time_per_token)
        # tokens mode
        self.t_ka = _ints(n, 0)  # anchor boundary index
        self.t_ta = _floats(n, 0.0)  # anchor time
        self.t_dca = _ints(n, 0)  # decode clock at the anchor
        self.t_kv = _ints(n, 0)  # KV tokens at the anchor
        self.t_itl = _floats(n, self.tau_solo)  # base iteration length from the anchor on
        self.t_adv = _ints(n, 1)  # decode clock advance per iteration (0 while a whole prefill stalls decodes)
        self.t_pend = _ints(n, -1)  # boundary index where the running prefill ends
        self.t_pkb = _ints(n, -1)  # boundary of g's valid pending heap entry (-1: none)
        self.t_pte = _floats(n, 0.0)  # its time
        # pending GPU events: a binary min-heap of GPU ids (at most one entry per GPU) keyed by
        # (t_pte[g], g), with each GPU's position in _hpos (-1: none); the event's boundary is t_pkb[g]
        self._hq = _ints(n, -1)
        self._hpos = _ints(n, -1)
        self._hn = 0
        self._dirty: list[int] = []
        self._isdirty = _ints(n, 0)

        if fleet is not None and fleet.initial is not None:
            for g in range(fleet.initial, n):
                self._saved[g] = (1, self.B)
                self.g_state[g] = G_OFFLINE
                self.g_pok[g] = 0
                self.g_maxd[g] = 0
                self._refresh(g)
            self._fleet_on = fleet.initial
            self._fleet_log = [(0.0, fleet.initial, fleet.initial)]

        # -- queues ---------------------------------------------------------------------------------
        self._qnames: list[str] = ["prefill", "decode"] + [f"instance[{g}]" for g in range(n)]
        self._qindex = {nm: q for q, nm in enumerate(self._qnames)}
        nqueues = len(self._qnames)
        self.q_head = _ints(nqueues * I, -1)
        self.q_tail = _ints(nqueues * I, -1)
        self.q_cnt = _ints(nqueues * I, 0)
        self.q_tot = _ints(nqueues, 0)

        # -- time, arrivals, housekeeping -----------------------------------------------------------
        self._now = 0.0
        self._in_setup = False
        self._events = 0
        self._arr_t = _floats(0, 0.0)  # the current batch of arrivals: times, classes, prompt and output tokens
        self._arr_c = _ints(0, 0)
        self._arr_p = _ints(0, 0)
        self._arr_o = _ints(0, 0)
        self._ai = 0
        self._arr_iter = None
        self._arrival_chunk = int(arrival_chunk)
        self._t_race = INF  # the race clock: time of the next race event
        self._lam_race = 0.0  # the rate it was drawn with
        self._nd = 0
        self._started = False
        self._done = False  # the horizon was reached
        self._pause = False
        self._finished = False  # finish() returned the result
        # advance() turns the first Ctrl-C into a clean stop between events. A driver that calls
        # advance() thousands of times a second (a Gymnasium environment) sets this False: two
        # signal-handler swaps per call cost more than its steps, and Ctrl-C then raises at once.
        self.handle_sigint = True
        self._wall0 = 0.0
        self.engine_name = "compiled" if _COMPILED else "python"
        self.collector = M.MetricCollector(I, self.warmup, self.horizon, batches)
        self._bounds = [self.warmup + j * self.collector.L for j in range(batches)] + [self.horizon]
        if any(c.has_slo for c in scenario.classes):
            self._set_slo(scenario)
        self._bi = 0
        self.sample_interval = sample_interval
        self._t_sample = 0.0 if sample_interval else INF
        self._samples: list[list[float]] = []
        self.tick_interval = getattr(controller, "tick_interval", None)
        self._t_tick = float(self.tick_interval) if self.tick_interval else INF
        # finished requests' rows (_NREC fields each, as floats) waiting to be folded into the metrics
        self._rec = _floats(_FLUSH * _NREC, 0.0)
        self._nrec = 0
        self._records = records
        self.progress = progress
        self._interrupted = False
        self._stop = False  # set by the first Ctrl-C: stop between two events

        # callbacks (skip the ones a controller leaves as no-ops)
        base = Controller
        ct = type(controller)
        self._cb_arrival = controller.on_arrival if ct.on_arrival is not base.on_arrival else None
        self._cb_pdone = controller.on_prefill_done if ct.on_prefill_done is not base.on_prefill_done else None
        self._cb_ddone = controller.on_decode_done if ct.on_decode_done is not base.on_decode_done else None
        self._cb_abandon = controller.on_abandon if ct.on_abandon is not base.on_abandon else None
        self._cb_preempt = controller.on_preempt if ct.on_preempt is not base.on_preempt else None
        self._cb_drop = controller.on_drop if ct.on_drop is not base.on_drop else None
        self._cb_freed = controller.on_slot_freed if ct.on_slot_freed is not base.on_slot_freed else None

    # =============================================================================================
    # Controller view (read-only)
    # =============================================================================================
    @property
    def now(self) -> float:
        return self._now

    @property
    def n_gpus(self) -> int:
        return self.n

    @property
    def batch(self) -> int:
        return self.B

    @property
    def n_classes(self) -> int:
        return self.I

    @property
    def class_names(self) -> tuple[str, ...]:
        return self._class_names

    @property
    def service(self) -> str:
        return self._service

    @property
    def rng(self) -> random.Random:
        return self._ctrl_rng

    @property
    def n_pools(self) -> int:
        return self._n_pools

    def n_prefill(self, i: int) -> int:
        return self._cnt[NQ * i + Q_X]

    def n_decode_mixed(self, i: int) -> int:
        return self._cnt[NQ * i + Q_YM]

    def n_decode_solo(self, i: int) -> int:
        return self._cnt[NQ * i + Q_YS]

    def n_wait_prefill(self, i: int) -> int:
        return self._cnt[NQ * i + Q_WP]

    def n_wait_decode(self, i: int) -> int:
        return self._cnt[NQ * i + Q_WD]

    def gpu_prefill(self, g: int) -> int:
        return self.g_pre[g]

    def gpu_decodes(self, g: int) -> int:
        return self.g_ndec[g]

    def gpu_free(self, g: int) -> int:
        return self.B - self.g_cnt[g]

    def gpu_mixed(self, g: int) -> bool:
        return self.g_pre[g] >= 0

    def gpu_pool(self, g: int) -> int:
        return self.g_pool[g]

    def gpu_max_decodes(self, g: int) -> int:
        return self.g_maxd[g]

    def gpu_prefill_allowed(self, g: int) -> bool:
        return bool(self.g_pok[g])

    def gpu_decodes_by_class(self, g: int) -> tuple[int, ...]:
        return tuple(self.g_dcls[g * self.I:(g + 1) * self.I])

    def gpu_requests(self, g: int) -> list[int]:
        out = [self.g_pre[g]] if self.g_pre[g] >= 0 else []
        b = g * self.B
        return out + sorted(self.g_dec[b:b + self.g_ndec[g]])

    def gpu_kv_used(self, g: int) -> int:
        if self.markov or self.g_cnt[g] == 0:
            return 0
        t = self._now
        if t > self.t_ta[g]:
            m = self._boundary_after(g, t) - self.t_ka[g]
            return self.t_kv[g] + self.g_ndec[g] * self.t_adv[g] * m
        return self.t_kv[g]

    def gpu_kv_free(self, g: int) -> float:
        if self.kvcap < 0:
            return INF
        return float(self.kvcap - self.gpu_kv_used(g))

    def idle_prefill(self, pool: int = 0) -> GpuSet:
        return self._ip[pool]

    def free_decode(self, pool: int = 0) -> GpuSet:
        return self._fd[pool]

    def queue_id(self, name: str) -> int:
        try:
            return self._qindex[name]
        except KeyError:
            raise ActionError(f"queue_id: no queue named {name!r}; known: {', '.join(self._qnames[:2])}, "
                              f"instance[g], and {', '.join(self._qnames[2 + self.n:]) or 'no named queues'}") from None

    def instance_queue(self, g: int) -> int:
        if not 0 <= g < self.n:
            self._check_gpu("instance_queue", g)
        return 2 + g

    def qlen(self, q: int, cls: int = -1) -> int:
        if cls < 0:
            return self.q_tot[q]
        return self.q_cnt[q * self.I + cls]

    def head(self, q: int, cls: int = -1) -> int:
        I = self.I
        if cls >= 0:
            return self.q_head[q * I + cls]
        if I == 1:
            return self.q_head[q]
        if I == 2:  # the common case, unrolled (same tie rule as the loop: the lower class wins)
            k = 2 * q
            a = self.q_head[k]
            b = self.q_head[k + 1]
            if a < 0:
                return b
            if b < 0:
                return a
            return a if self.r_seq[a] <= self.r_seq[b] else b
        best = -1
        bs = 0
        qh = self.q_head
        seq = self.r_seq
        for k in range(q * I, q * I + I):
            r = qh[k]
            if r >= 0 and (best < 0 or seq[r] < bs):
                best = r
                bs = seq[r]
        return best

    def queue_requests(self, q: int) -> list[int]:
        I = self.I
        out = []
        for k in range(q * I, q * I + I):
            r = self.q_head[k]
            while r >= 0:
                out.append(r)
                r = self.r_next[r]
        out.sort(key=self.r_seq.__getitem__)
        return out

    def instance_requests(self, g: int) -> int:
        return self.q_tot[2 + g] + self.g_cnt[g]

    def instance_tokens(self, g: int) -> int:
        # computed on demand (O(B + queue length)): keeps the per-event cost free of it
        return sum(self._tokens(r) for r in self.queue_requests(2 + g)) + sum(
            self._tokens(r) for r in self.gpu_requests(g)
        )

    def req_class(self, r: int) -> int:
        return self.r_cls[r]

    def req_prompt(self, r: int) -> int:
        return self.r_prompt[r]

    def req_output(self, r: int) -> int:
        return self.r_output[r]

    def req_arrival(self, r: int) -> float:
        return self.r_arr[r]

    def req_phase(self, r: int) -> int:
        return self.r_phase[r]

    def req_gpu(self, r: int) -> int:
        return self.r_gpu[r]

    def req_queue(self, r: int) -> int:
        return self.r_q[r]

    def req_generated(self, r: int) -> int:
        """Output tokens r has produced by the GPU's last iteration boundary (tokens mode; markov: 0
        until completion). While new work is joining a GPU (its anchor lies at the next boundary) the
        count may run one token ahead."""
        if self.r_phase[r] == DECODE and not self.markov:
            g = self.r_gpu[r]
            now = self._now
            dc = self.t_dca[g]
            if now > self.t_ta[g]:
                k = self._boundary_after(g, now)
                if self._time_at(g, k) > now:
                    k -= 1  # the last boundary at or before now
                dc += (k - self.t_ka[g]) * self.t_adv[g]
            return self.r_gen[r] + max(0, dc - self.r_dstart[r])
        return self.r_gen[r]

    def req_preemptions(self, r: int) -> int:
        return self.r_npre[r]

    # =============================================================================================
    # Setup-only actions
    # =============================================================================================
    def set_pool(self, gpus: Sequence[int], pool: int, *, prefill: bool = True, max_decodes: int | None = None) -> None:
        """Put ``gpus`` in ``pool`` (0, 1, ...), allow or forbid prefills there, cap their decodes."""
        if not self._in_setup:
            raise ActionError("set_pool: pools can only be declared in Controller.setup")
        if isinstance(pool, bool) or not isinstance(pool, int) or pool < 0:
            raise ActionError(f"set_pool: pool: expected an integer >= 0, got {pool!r}")
        md = self.B if max_decodes is None else max_decodes
        if isinstance(md, bool) or not isinstance(md, int) or not 0 <= md <= self.B:
            raise ActionError(f"set_pool: max_decodes: expected an integer in 0..{self.B} (B), got {max_decodes!r}")
        while self._n_pools <= pool:
            self._ip.append(GpuSet(self.n, self._ctrl_rng.random))
            self._fd.append(GpuSet(self.n, self._ctrl_rng.random))
            self._n_pools += 1
        for g in gpus:
            self._check_gpu("set_pool", g)
            if self.g_state[g] != G_ONLINE:
                self._saved[g] = (1 if prefill else 0, md)
                self.g_pool[g] = pool
                continue
            self._ip[self.g_pool[g]]._discard(g)
            self._fd[self.g_pool[g]]._discard(g)
            self.g_pool[g] = pool
            self.g_pok[g] = bool(prefill)
            self.g_maxd[g] = md
            self._refresh(g)

    def add_queue(self, name: str) -> int:
        """Declare a named FCFS queue (setup only); returns its id."""
        if not self._in_setup:
            raise ActionError("add_queue: queues can only be declared in Controller.setup")
        if not isinstance(name, str) or not name:
            raise ActionError(f"add_queue: name: expected a non-empty string, got {name!r}")
        if name in self._qindex:
            raise ActionError(f"add_queue: a queue named {name!r} already exists")
        q = len(self._qnames)
        self._qnames.append(name)
        self._qindex[name] = q
        self.q_head = _grown(self.q_head, self.I, -1)
        self.q_tail = _grown(self.q_tail, self.I, -1)
        self.q_cnt = _grown(self.q_cnt, self.I, 0)
        self.q_tot = _grown(self.q_tot, 1, 0)
        return q

    # =============================================================================================
    # The fleet: GPUs added, drained and removed during a run; runtime batch limits; eviction
    # (docs/simulator.md section 11). Cold code: a fixed fleet never calls it.
    # =============================================================================================
    def gpu_state(self, g: int) -> str:
        """GPU g's fleet state: 'online', 'starting', 'draining' or 'offline'."""
        self._check_gpu("gpu_state", g)
        return _GSTATE_NAMES[self.g_state[g]]

    def gpu_online(self, g: int) -> bool:
        """Whether GPU g is online (takes new work)."""
        return self.g_state[g] == G_ONLINE

    def fleet_size(self) -> int:
        """GPUs counted in GPU-hours now: online, starting (added, not yet up) and draining."""
        return self._fleet_on

    def fleet_online(self) -> list[int]:
        """The online GPUs, in index order (O(n))."""
        st = self.g_state
        return [g for g in range(self.n) if st[g] == G_ONLINE]

    def gpu_hours(self) -> float:
        """GPU-hours used from time 0 to now (every GPU counted from being added to going offline)."""
        return (self._fleet_on * self._now - self._fleet_acc) / 3600.0

    def add_gpu(self, g: int | None = None) -> int:
        """Add an offline GPU to the fleet (g, or the lowest-numbered offline one); return its id.

        It counts towards GPU-hours at once and takes work after the fleet's ``startup_delay``
        seconds, when ``on_slot_freed(g)`` announces it (at once during ``setup`` or with no delay)."""
        st = self.g_state
        if g is None:
            g = -1
            for k in range(self.n):
                if st[k] == G_OFFLINE:
                    g = k
                    break
            if g < 0:
                raise ActionError(f"add_gpu at t={self._now:.9g}: all {self.n} GPUs (cluster.gpus, the fleet's maximum) "
                                  "are already in the fleet")
        else:
            self._check_gpu("add_gpu", g)
            if st[g] != G_OFFLINE:
                raise ActionError(f"add_gpu(g={g}) at t={self._now:.9g}: GPU {g} is {_GSTATE_NAMES[st[g]]}, not offline")
        self._fleet_used = True
        t = self._now
        st[g] = G_STARTING
        self._fleet_count(1, t)
        if self._startup > 0 and not self._in_setup:
            self.t_pkb[g] = _STARTUP
            self._hset(g, t + self._startup)
        else:
            self._online(g, t)
        return g

    def drain_gpu(self, g: int) -> None:
        """Take GPU g out of the fleet: it takes no new work (no prefill, no decode: its cap is 0),
        its running requests finish, and it goes offline when the last one leaves (at once if idle).
        A starting GPU is cancelled at once."""
        self._check_gpu("drain_gpu", g)
        st = self.g_state[g]
        if st == G_OFFLINE or st == G_DRAINING:
            raise ActionError(f"drain_gpu(g={g}) at t={self._now:.9g}: GPU {g} is already {_GSTATE_NAMES[st]} "
                              "(the fleet cannot shrink below its online GPUs)")
        self._fleet_used = True
        t = self._now
        if st == G_STARTING:
            self._hremove(g)
            self.t_pkb[g] = -1
            self.g_state[g] = G_OFFLINE
            self._fleet_count(-1, t)
            return
        self._saved[g] = (self.g_pok[g], self.g_maxd[g])
        self.g_state[g] = G_DRAINING
        self.g_pok[g] = 0
        self.g_maxd[g] = 0
        self._refresh(g)
        if self.g_cnt[g] == 0:
            self._offline(g, t)
        else:
            self._fleet_log.append((t, self._fleet_on, self._n_online()))

    def remove_gpu(self, g: int, host: bool = True) -> list[int]:
        """Drain GPU g and evict its running requests at once (see :meth:`evict`; markov: they wait
        again for the phase they were in). Returns the evicted requests; none is lost: each is placed
        by ``on_preempt`` (default: the front of the prefill queue, or of the decode queue for a
        markov decode)."""
        self.drain_gpu(g)
        out = []
        if self.g_state[g] == G_DRAINING:
            for r in self.gpu_requests(g):
                if self.evict(r, host):
                    out.append(r)
        return out

    def set_max_decodes(self, g: int, m: int) -> None:
        """Set GPU g's batch limit (most concurrent decodes, 1..B) while running. Lowering it below
        the decodes running there evicts none: it only stops new ones until they are fewer."""
        self._check_gpu("set_max_decodes", g)
        if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= self.B:
            raise ActionError(f"set_max_decodes(g={g}) at t={self._now:.9g}: batch limit: expected an integer in "
                              f"1..{self.B} (B), got {m!r}")
        self._fleet_used = True
        if self.g_state[g] != G_ONLINE:
            self._saved[g] = (self._saved.get(g, (1, self.B))[0], m)
            return
        self.g_maxd[g] = m
        self._refresh(g)

    def evict(self, r: int, host: bool = True) -> bool:
        """Take running request r off its GPU now; it waits again (``on_preempt``; default: the front
        of the prefill queue) and counts a preemption.

        tokens mode: the eviction takes effect at the GPU's next iteration boundary (the iteration in
        progress completes); it returns False and does nothing if r's prefill or decode ends at that
        boundary. A decode evicted with ``host=True`` keeps its KV cache in host memory: its restart is
        a restore taking ceil(kv_swap_time_per_token * (prompt + generated) / tau_mix) mixed
        iterations (at least one) in the prefill slot instead of a re-prefill; ``host=False`` (and an
        evicted prefill) recomputes. markov mode: a prefill waits for a new prefill, a decode for a new
        decode (memoryless: no restart cost)."""
        self._check_req("evict", r)
        ph = self.r_phase[r]
        if ph != PREFILL and ph != DECODE:
            raise ActionError(f"evict(r={r}) at t={self._now:.9g}: request {r} is {_PHASE_NAMES[ph]}, not running")
        g = self.r_gpu[r]
        t = self._now
        if not self.markov:
            self._join(g, t)  # anchor g at the boundary where the eviction takes effect
            if ph == PREFILL:
                if self.t_pend[g] <= self.t_ka[g]:
                    return False
            elif self.r_dkey[r] <= self.t_dca[g]:
                return False
        self._evict(r, g, t, bool(host))
        return True

    # -- internal ------------------------------------------------------------------------------
    def _n_online(self) -> int:
        st = self.g_state
        return sum(1 for g in range(self.n) if st[g] == G_ONLINE)

    def _fleet_count(self, d: int, t: float) -> None:
        self._fleet_on += d
        self._fleet_acc += d * t
        self._fleet_log.append((t, self._fleet_on, self._n_online()))

    def _online(self, g: int, t: float) -> None:
        """A starting GPU is up: it takes work from now (announced by on_slot_freed(g))."""
        pok, md = self._saved.pop(g, (1, self.B))
        self.g_state[g] = G_ONLINE
        self.t_pkb[g] = -1
        self.g_pok[g] = pok
        self.g_maxd[g] = md
        self._refresh(g)
        self._fleet_log.append((t, self._fleet_on, self._n_online()))
        cb = self._cb_freed
        if cb is not None and not self._in_setup:
            cb(self, g)

    def _offline(self, g: int, t: float) -> None:
        """A draining GPU has emptied: it leaves the fleet (and GPU-hours) now."""
        self.g_state[g] = G_OFFLINE
        self._fleet_count(-1, t)

    def _restore(self, r: int, g: int, ptok: int, ka: int) -> None:
        """Schedule the restore of r's KV from host memory on g (in place of a re-prefill)."""
        self.r_host[r] = 0
        T = self._swap * ptok
        if self.chunked:
            self.t_pend[g] = ka + max(1, int(math.ceil(T / self.tau_mix)))
            self.t_itl[g] = self.tau_mix
        else:
            self.t_pend[g] = ka + 1
            self.t_itl[g] = T if T > 0 else self.tau_solo
            self.t_adv[g] = 0

    def _evict(self, r: int, g: int, t: float, host: bool) -> None:
        """Take running request r off GPU g at time t (tokens: g anchored where it takes effect)."""
        c = self.r_cls[r]
        I = self.I
        cnt = self._cnt
        acc = self._acc
        markov = self.markov
        back = WAIT_PREFILL
        if self.r_phase[r] == PREFILL:
            k = NQ * c + Q_X
            self.g_pre[g] = NO_REQUEST
            cnt[k] -= 1
            acc[k] -= t
            if markov:
                self._race_remove(r, RACE_PREFILL * I + c)
                self._lam -= self.mu_p[c]
            else:
                self.t_kv[g] -= self.r_prompt[r] + self.r_gen[r]
                self.t_pend[g] = -1
                self.t_itl[g] = self.tau_solo
                self.t_adv[g] = 1
                self.r_host[r] = 1 if (host and self.r_gen[r] > 0) else 0
            if self.g_ndec[g]:
                self._switch_mode(g, False, t)
        else:
            nd = self.g_ndec[g] - 1
            self._dremove(g, r, nd)
            k = NQ * c + (Q_YM if self.g_pre[g] >= 0 else Q_YS)
            cnt[k] -= 1
            acc[k] -= t
            self.g_ndec[g] = nd
            self.g_dcls[g * I + c] -= 1
            if markov:
                self._race_remove(r, RACE_DECODE * I + c)
                self._lam -= self.mbar[c]
                back = WAIT_DECODE
            else:
                gen = self.t_dca[g] - self.r_dstart[r]
                self.t_kv[g] -= self.r_prompt[r] + self.r_gen[r] + gen
                self.r_gen[r] += gen
                self.r_host[r] = 1 if host else 0
        n1 = self.g_cnt[g] - 1
        self.g_cnt[g] = n1
        self.r_npre[r] += 1
        self.r_gpu[r] = -1
        self._ctr[NC * c + C_PREEMPTED] += 1
        self._refresh(g)
        if not markov and not self._isdirty[g]:
            self._isdirty[g] = True
            self._dirty.append(g)
        if n1 == 0:
            self._gpu_emptied(g, t)
        if not markov and not self.r_host[r] and self.kvcap >= 0 and self.r_prompt[r] + self.r_gen[r] + 1 > self.kvcap:
            self._ctr[NC * c + C_DROPPED] += 1
            cb = self._cb_drop
            if cb is not None:
                cb(self, r, g)
            self._resolve(r, M.DROPPED, t)
            return
        self.r_phase[r] = back
        self.r_q[r] = -1
        self.r_tw[r] = t
        k = NQ * c + (Q_WP if back == WAIT_PREFILL else Q_WD)
        cnt[k] += 1
        acc[k] += t
        cb = self._cb_preempt
        if cb is not None:
            cb(self, r, g)
        if self.r_phase[r] == back and self.r_q[r] < 0:
            self.enqueue(r, PREFILL_QUEUE if back == WAIT_PREFILL else DECODE_QUEUE, front=True)

    # =============================================================================================
    # Actions
    # =============================================================================================
    def _gpu_emptied(self, g: int, t: float) -> None:
        """g's last request left it: one busy GPU fewer (and a draining GPU goes offline)."""
        gb = self._gbase
        self._cnt[gb] -= 1
        self._acc[gb] -= t
        if self.g_state[g] == G_DRAINING:
            self._offline(g, t)

    def _check_gpu(self, what: str, g: object) -> None:
        if isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < self.n:
            raise ActionError(f"{what}: GPU {g!r} does not exist (expected an integer in 0..{self.n - 1})")

    def _check_req(self, what: str, r: object) -> None:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < len(self.r_phase) or self.r_phase[r] == _GONE:
            raise ActionError(f"{what}: request {r!r} is not in the system at t={self._now:.9g}")

    def start_prefill(self, r: int, g: int) -> None:
        """Start request r's prefill on GPU g (validated; see the protocol)."""
        # (the state is read through self: no local copies of the arrays, which cost a buffer
        # acquisition per call in the compiled core)
        try:
            ok = (self.r_phase[r] == WAIT_PREFILL and self.g_pre[g] < 0 and self.g_cnt[g] < self.B
                  and self.g_pok[g] and r >= 0 and g >= 0)
        except (IndexError, TypeError):
            ok = False
        if not ok:
            prefill_error(self, r, g)
        self._start_prefill(r, g)

    def _start_prefill(self, r: int, g: int) -> None:
        """start_prefill after validation."""
        g_pre = self.g_pre
        gc = self.g_cnt
        r_phase = self.r_phase
        t = self._now
        c = self.r_cls[r]
        markov = self.markov
        if not markov:
            ptok = self.r_prompt[r] + self.r_gen[r]  # recompute after a preemption
            self._join_with(g, t, ptok, r, True)
        self._leave_wait(r, c, t, Q_WP)
        cnt = self._cnt
        acc = self._acc
        k = NQ * c + Q_X
        cnt[k] += 1
        acc[k] += t
        g_pre[g] = r
        n0 = gc[g]
        n1 = n0 + 1
        gc[g] = n1
        if n0 == 0:
            gb = self._gbase
            cnt[gb] += 1
            acc[gb] += t
        else:
            self._switch_mode(g, True, t)
        self.r_gpu[r] = g
        r_phase[r] = PREFILL
        if self.r_pg[r] < 0:
            self.r_pg[r] = g
        # sets: g's prefill slot is now busy; a full GPU also takes no decode
        p = self.g_pool[g]
        s = self._ip[p]
        s._discard(g)
        if n1 >= self.B:
            s = self._fd[p]
            s._discard(g)
        if markov:
            self._race_add(r, RACE_PREFILL * self.I + c)
            self._lam += self.mu_p[c]
        else:
            ka = self.t_ka[g]
            if self.r_host[r]:
                self._restore(r, g, ptok, ka)
            elif self.chunked:
                self.t_pend[g] = ka + (ptok + self.C - 1) // self.C
                self.t_itl[g] = self.tau_mix
            else:
                self.t_pend[g] = ka + 1
                self.t_itl[g] = self.alpha + self.beta * ptok
                self.t_adv[g] = 0
            self.t_kv[g] += ptok
            if not self._isdirty[g]:
                self._isdirty[g] = True
                self._dirty.append(g)

    def start_decode(self, r: int, g: int) -> None:
        """Start request r's decode on GPU g (validated; see the protocol)."""
        try:
            ok = (self.r_phase[r] == WAIT_DECODE and self.g_cnt[g] < self.B and self.g_ndec[g] < self.g_maxd[g]
                  and r >= 0 and g >= 0)
        except (IndexError, TypeError):
            ok = False
        if not ok:
            decode_error(self, r, g)
        self._start_decode(r, g)

    def _start_decode(self, r: int, g: int) -> None:
        """start_decode after validation."""
        r_phase = self.r_phase
        gc = self.g_cnt
        g_ndec = self.g_ndec
        g_maxd = self.g_maxd
        t = self._now
        c = self.r_cls[r]
        markov = self.markov
        if not markov:
            self._join_with(g, t, self.r_prompt[r] + self.r_gen[r], r, False)
        self._leave_wait(r, c, t, Q_WD)
        cnt = self._cnt
        acc = self._acc
        k = NQ * c + (Q_YM if self.g_pre[g] >= 0 else Q_YS)
        cnt[k] += 1
        acc[k] += t
        n0 = gc[g]
        n1 = n0 + 1
        gc[g] = n1
        nd = g_ndec[g] + 1
        g_ndec[g] = nd
        self.g_dcls[g * self.I + c] += 1
        if n0 == 0:
            gb = self._gbase
            cnt[gb] += 1
            acc[gb] += t
        self.r_gpu[r] = g
        self.r_dg[r] = g
        r_phase[r] = DECODE
        # sets: a full GPU leaves both; a GPU at its decode cap leaves the free-decode set
        full = n1 >= self.B
        if full or nd >= g_maxd[g]:
            p = self.g_pool[g]
            s = self._fd[p]
            s._discard(g)
            if full:
                s = self._ip[p]
                s._discard(g)
        k = g * self.B + nd - 1  # g_ndec[g] is nd now
        self.g_dec[k] = r
        self.r_dpos[r] = k
        if markov:
            self._race_add(r, RACE_DECODE * self.I + c)
            self._lam += self.mbar[c]
        else:
            dca = self.t_dca[g]
            self.r_dstart[r] = dca
            gen = self.r_gen[r]
            self.r_dkey[r] = dca + self.r_output[r] - gen
            self._dsift(g * self.B, nd - 1, nd)
            self.t_kv[g] += self.r_prompt[r] + gen
            if not self._isdirty[g]:
                self._isdirty[g] = True
                self._dirty.append(g)

    def _dequeue(self, r: int, c: int) -> None:
        """Take queued request r (class c) out of its queue and out of the abandonment race."""
        r_q = self.r_q
        q = r_q[r]
        k = q * self.I + c
        rn = self.r_next
        rp = self.r_prev
        p = rp[r]
        nx = rn[r]
        if p >= 0:
            rn[p] = nx
        else:
            self.q_head[k] = nx
        if nx >= 0:
            rp[nx] = p
        else:
            self.q_tail[k] = p
        self.q_cnt[k] -= 1
        self.q_tot[q] -= 1
        r_q[r] = -1
        self._race_remove(r, RACE_WAIT * self.I + c)
        self._lam -= self.theta[c]

    def enqueue(self, r: int, q: int, front: bool = False) -> None:
        """Put waiting request r at the back (front=True: the front) of queue q."""
        q_tot = self.q_tot
        try:
            ph = self.r_phase[r]
            ok = (ph == WAIT_PREFILL or ph == WAIT_DECODE) and 0 <= q < len(q_tot) and r >= 0
        except (IndexError, TypeError):
            ok = False
        if not ok:
            w = f"enqueue(r={r!r}, q={q!r}) at t={self._now:.9g}"
            self._check_req(w, r)
            if isinstance(q, bool) or not isinstance(q, int) or not 0 <= q < len(q_tot):
                raise ActionError(f"{w}: queue {q!r} does not exist (expected 0..{len(q_tot) - 1})")
            raise ActionError(f"{w}: request {r} is {_PHASE_NAMES[self.r_phase[r]]}, not waiting")
        r_q = self.r_q
        old = r_q[r]
        if old == q and not front:
            return
        if old < 0 and not front:
            self._enqueue_new(r, q)
            return
        c = self.r_cls[r]
        if old >= 0:
            self._q_remove(r, old)
        else:
            # entering a waiting place: it can now abandon
            self._race_add(r, RACE_WAIT * self.I + c)
            self._lam += self.theta[c]
        if front:
            self._q_push(r, q, True)
            return
        # append at the back (inlined: the common case)
        k = q * self.I + c
        s = self._seq_back + 1
        self._seq_back = s
        self.r_seq[r] = s
        q_tail = self.q_tail
        tl = q_tail[k]
        self.r_next[r] = -1
        self.r_prev[r] = tl
        if tl >= 0:
            self.r_next[tl] = r
        else:
            self.q_head[k] = r
        q_tail[k] = r
        self.q_cnt[k] += 1
        q_tot[q] += 1
        r_q[r] = q

    def _enqueue_new(self, r: int, q: int) -> None:
        """Append waiting request r, in no queue yet, to the back of queue q (no validation: the
        engine's default placements and the common case of :meth:`enqueue`)."""
        c = self.r_cls[r]
        # entering a waiting place: it can now abandon
        self._race_add(r, RACE_WAIT * self.I + c)
        self._lam += self.theta[c]
        k = q * self.I + c
        s = self._seq_back + 1
        self._seq_back = s
        self.r_seq[r] = s
        q_tail = self.q_tail
        tl = q_tail[k]
        self.r_next[r] = -1
        self.r_prev[r] = tl
        if tl >= 0:
            self.r_next[tl] = r
        else:
            self.q_head[k] = r
        q_tail[k] = r
        self.q_cnt[k] += 1
        self.q_tot[q] += 1
        self.r_q[r] = q

    # =============================================================================================
    # Internal: queues and waiting
    # =============================================================================================
    def _q_push(self, r: int, q: int, front: bool) -> None:
        c = self.r_cls[r]
        k = q * self.I + c
        if front:
            self._seq_front -= 1
            self.r_seq[r] = self._seq_front
            h = self.q_head[k]
            self.r_prev[r] = -1
            self.r_next[r] = h
            if h >= 0:
                self.r_prev[h] = r
            else:
                self.q_tail[k] = r
            self.q_head[k] = r
        else:
            self._seq_back += 1
            self.r_seq[r] = self._seq_back
            tl = self.q_tail[k]
            self.r_next[r] = -1
            self.r_prev[r] = tl
            if tl >= 0:
                self.r_next[tl] = r
            else:
                self.q_head[k] = r
            self.q_tail[k] = r
        self.q_cnt[k] += 1
        self.q_tot[q] += 1
        self.r_q[r] = q

    def _q_remove(self, r: int, q: int) -> None:
        k = q * self.I + self.r_cls[r]
        p = self.r_prev[r]
        nx = self.r_next[r]
        if p >= 0:
            self.r_next[p] = nx
        else:
            self.q_head[k] = nx
        if nx >= 0:
            self.r_prev[nx] = p
        else:
            self.q_tail[k] = p
        self.q_cnt[k] -= 1
        self.q_tot[q] -= 1
        self.r_q[r] = -1

    def _tokens(self, r: int) -> int:
        """Outstanding work of r in tokens: its (re)prefill if still due, plus its remaining output."""
        ph = self.r_phase[r]
        rem = self.r_output[r] - self.r_gen[r]
        if ph == WAIT_PREFILL or ph == PREFILL:
            return self.r_prompt[r] + self.r_gen[r] + rem
        return rem

    def _leave_wait(self, r: int, c: int, t: float, qk: int) -> None:
        """r stops waiting (phase WAIT_PREFILL if qk == Q_WP, WAIT_DECODE if qk == Q_WD) at time t."""
        if self.r_q[r] >= 0:
            self._dequeue(r, c)
        k = NQ * c + qk
        self._cnt[k] -= 1
        self._acc[k] -= t
        if qk == Q_WP:
            self.r_wp[r] += t - self.r_tw[r]
        else:
            self.r_wd[r] += t - self.r_tw[r]

    def _race_add(self, r: int, s: int) -> None:
        """Add r to the race's segment s (kind * I + class)."""
        n = self._rsn[s]
        if n == self._rscap:
            self._race_grow()
        self._rs[s * self._rscap + n] = r
        self.r_pos[r] = n
        self._rsn[s] = n + 1

    def _race_remove(self, r: int, s: int) -> None:
        """Take r out of segment s (the segment's last request takes its place)."""
        rs = self._rs
        b = s * self._rscap
        n = self._rsn[s] - 1
        j = self.r_pos[r]
        last = rs[b + n]
        rs[b + j] = last
        self.r_pos[last] = j
        self._rsn[s] = n

    def _race_grow(self) -> None:
        """Double every segment's capacity (a new array: nothing keeps the old one in a local)."""
        cap = self._rscap
        new = _ints(2 * cap * len(self._rsn), -1)
        old = self._rs
        for s in range(len(self._rsn)):
            for k in range(self._rsn[s]):
                new[2 * cap * s + k] = old[cap * s + k]
        self._rs = new
        self._rscap = 2 * cap

    def _switch_mode(self, g: int, mixed: bool, t: float) -> None:
        """GPU g's decodes move between Y_s and Y_m (a prefill started or ended on g)."""
        cnt = self._cnt
        acc = self._acc
        dcl = self.g_dcls
        base = g * self.I
        for c in range(self.I):
            d = dcl[base + c]
            if d:
                a = NQ * c + (Q_YS if mixed else Q_YM)  # from (solo or mixed) ...
                b = NQ * c + (Q_YM if mixed else Q_YS)  # ... to (mixed or solo)
                dt = d * t
                cnt[a] -= d
                acc[a] -= dt
                cnt[b] += d
                acc[b] += dt

    def _refresh(self, g: int) -> None:
        """Update g's membership in its pool's idle-prefill and free-decode sets."""
        p = self.g_pool[g]
        n = self.g_cnt[g]
        if n < self.B:
            if self.g_pre[g] < 0 and self.g_pok[g]:
                self._ip[p]._add(g)
            else:
                self._ip[p]._discard(g)
            if self.g_ndec[g] < self.g_maxd[g]:
                self._fd[p]._add(g)
            else:
                self._fd[p]._discard(g)
        else:
            self._ip[p]._discard(g)
            self._fd[p]._discard(g)

    # =============================================================================================
    # Internal: request lifecycle
    # =============================================================================================
    def _alloc(self) -> int:
        if self._free:
            return self._free.pop()
        # Grow by a block of slots (doubling: amortised O(1) per request). The per-request arrays are
        # replaced, not extended in place (the compiled core holds their buffers), so no method keeps
        # one in a local across an arrival (in either engine: they are the same code). The new ids
        # go onto the free stack in reverse, so they are handed out in increasing order and only
        # after every id freed in the meantime: the same ids, in the same order, as growing one slot
        # at a time.
        r = len(self.r_phase)
        k = max(_ALLOC_BLOCK, r)
        for name, _, fill, _ in REQUEST_FIELDS:
            setattr(self, name, _grown(getattr(self, name), k, fill))
        self._free.extend(range(r + k - 1, r, -1))
        return r

    def _record(self, r: int, c: int, outcome: int, t: float) -> None:
        """Append r's row (the fields of metrics.RECORD_FIELDS, in order) to the buffer of finished
        requests; fold a full buffer."""
        rec = self._rec
        k = self._nrec * _NREC
        rec[k] = self.r_serial[r]
        rec[k + 1] = c
        rec[k + 2] = self.r_arr[r]
        rec[k + 3] = self.r_prompt[r]
        rec[k + 4] = self.r_output[r]
        rec[k + 5] = outcome
        rec[k + 6] = t
        rec[k + 7] = self.r_ttft[r]
        rec[k + 8] = self.r_wp[r]
        rec[k + 9] = self.r_wd[r]
        rec[k + 10] = self.r_npre[r]
        rec[k + 11] = self.r_pg[r]
        rec[k + 12] = self.r_dg[r]
        self._nrec += 1
        if self._nrec >= _FLUSH:
            self._flush()

    def _resolve(self, r: int, outcome: int, t: float) -> None:
        """Record r's outcome and free its slot."""
        self._record(r, self.r_cls[r], outcome, t)
        self.r_phase[r] = _GONE
        self.r_gpu[r] = -1
        self._free.append(r)

    def _arrive(self, t: float, c: int, prompt: int, output: int) -> None:
        free = self._free
        r = free.pop() if free else self._alloc()
        s = self._serial + 1
        self._serial = s
        self.r_serial[r] = s
        self.r_cls[r] = c
        self.r_prompt[r] = prompt
        self.r_output[r] = output
        self.r_arr[r] = t
        r_phase = self.r_phase
        r_phase[r] = WAIT_PREFILL
        self.r_tw[r] = t
        self.r_wp[r] = 0.0
        self.r_wd[r] = 0.0
        self.r_ttft[r] = NAN
        self.r_gen[r] = 0
        self.r_npre[r] = 0
        self.r_pg[r] = -1
        self.r_dg[r] = -1
        self.r_host[r] = 0
        self._ctr[NC * c + C_ARRIVED] += 1
        if self.kvcap >= 0 and prompt + 1 > self.kvcap:
            # can never fit on a GPU (vLLM rejects prompts beyond the KV capacity)
            self._ctr[NC * c + C_DROPPED] += 1
            self._resolve(r, M.DROPPED, t)
            return
        k = NQ * c + Q_WP
        self._cnt[k] += 1
        self._acc[k] += t
        cb = self._cb_arrival
        if cb is not None:
            cb(self, r)
        if r_phase[r] == WAIT_PREFILL and self.r_q[r] < 0:
            self._enqueue_new(r, PREFILL_QUEUE)

    def _prefill_done(self, r: int, g: int, t: float) -> None:
        c = self.r_cls[r]
        cnt = self._cnt
        acc = self._acc
        k = NQ * c
        cnt[k + Q_X] -= 1
        acc[k + Q_X] -= t
        cnt[k + Q_WD] += 1  # now waiting for a decode (placed by the controller, or the decode buffer)
        acc[k + Q_WD] += t
        self.g_pre[g] = NO_REQUEST
        gc = self.g_cnt
        n1 = gc[g] - 1
        gc[g] = n1
        if n1 == 0:
            self._gpu_emptied(g, t)
        else:
            self._switch_mode(g, False, t)
        if self.markov:
            self._race_remove(r, RACE_PREFILL * self.I + c)
            self._lam -= self.mu_p[c]
        else:
            self.t_pend[g] = -1
            self.t_itl[g] = self.tau_solo
            self.t_adv[g] = 1
            self.t_kv[g] -= self.r_prompt[r] + self.r_gen[r]
            if not self._isdirty[g]:
                self._isdirty[g] = True
                self._dirty.append(g)
        r_ttft = self.r_ttft
        ttft = r_ttft[r]
        if ttft != ttft:  # NaN: the first prefill of r
            r_ttft[r] = t - self.r_arr[r]
            ctr = self._ctr
            ctr[NC * c + C_PREFILLED] += 1
            ctr[NC * c + C_PREFILL_TOKENS] += self.r_prompt[r]
        r_phase = self.r_phase
        r_phase[r] = WAIT_DECODE
        self.r_gpu[r] = -1
        self.r_tw[r] = t
        # sets: g's prefill slot is free, and so is one slot
        p = self.g_pool[g]
        if self.g_pok[g]:
            s = self._ip[p]
            s._add(g)
        if self.g_ndec[g] < self.g_maxd[g]:
            s = self._fd[p]
            s._add(g)
        cb = self._cb_pdone
        if cb is not None:
            cb(self, r, g)
        if r_phase[r] == WAIT_DECODE and self.r_q[r] < 0:
            self._enqueue_new(r, DECODE_QUEUE)
        cb = self._cb_freed
        if cb is not None:
            cb(self, g)

    def _decode_done(self, r: int, g: int, t: float) -> None:
        c = self.r_cls[r]
        cnt = self._cnt
        acc = self._acc
        pre = self.g_pre[g]
        k = NQ * c + (Q_YM if pre >= 0 else Q_YS)
        cnt[k] -= 1
        acc[k] -= t
        g_ndec = self.g_ndec
        nd = g_ndec[g] - 1
        g_ndec[g] = nd
        gc = self.g_cnt
        n1 = gc[g] - 1
        gc[g] = n1
        self.g_dcls[g * self.I + c] -= 1
        if n1 == 0:
            self._gpu_emptied(g, t)
        out = self.r_output[r]
        prompt = self.r_prompt[r]
        self._dremove(g, r, nd)
        if self.markov:
            self._race_remove(r, RACE_DECODE * self.I + c)
            self._lam -= self.mbar[c]
        else:
            self.t_kv[g] -= prompt + out
            if not self._isdirty[g]:
                self._isdirty[g] = True
                self._dirty.append(g)
        self.r_gen[r] = out
        ctr = self._ctr
        k = NC * c
        ctr[k + C_COMPLETED] += 1
        ctr[k + C_DONE_PROMPT] += prompt
        ctr[k + C_DONE_OUTPUT] += out
        # sets: one slot freed
        p = self.g_pool[g]
        if pre < 0 and self.g_pok[g]:
            s = self._ip[p]
            s._add(g)
        if nd < self.g_maxd[g]:
            s = self._fd[p]
            s._add(g)
        cb = self._cb_ddone
        if cb is not None:
            cb(self, r, g)
        # record the outcome and free r's slot (_resolve(r, 0, t) with c known)
        self._record(r, c, 0, t)
        self.r_phase[r] = _GONE
        self.r_gpu[r] = -1
        self._free.append(r)
        cb = self._cb_freed
        if cb is not None:
            cb(self, g)

    def _abandon(self, r: int, t: float) -> None:
        c = self.r_cls[r]
        q = self.r_q[r]
        ph = self.r_phase[r]
        self._leave_wait(r, c, t, Q_WP if ph == WAIT_PREFILL else Q_WD)
        self._ctr[NC * c + (C_AB_PREFILL if ph == WAIT_PREFILL else C_AB_DECODE)] += 1
        cb = self._cb_abandon
        if cb is not None:
            cb(self, r, q)
        self._resolve(r, M.ABANDONED_PREFILL if ph == WAIT_PREFILL else M.ABANDONED_DECODE, t)

    # =============================================================================================
    # Internal: tokens-mode GPU clock
    # =============================================================================================
    def _time_at(self, g: int, k: int) -> float:
        """Time of boundary k (>= the anchor) of busy GPU g under its current iteration law."""
        m = k - self.t_ka[g]
        if self.kap == 0.0:
            return self.t_ta[g] + m * self.t_itl[g]
        d = self.g_ndec[g] * self.t_adv[g]
        return self.t_ta[g] + m * (self.t_itl[g] + self.kap * self.t_kv[g]) + self.kap * d * (m * (m - 1) // 2)

    def _boundary_after(self, g: int, t: float) -> int:
        """The first boundary of busy GPU g at or after time t (t > anchor time)."""
        ta = self.t_ta[g]
        if self.kap == 0.0:
            itl = self.t_itl[g]
            m = int((t - ta) / itl)
            if ta + m * itl < t:
                m += 1
            return self.t_ka[g] + m
        a = self.t_itl[g] + self.kap * self.t_kv[g]
        bq = 0.5 * self.kap * self.g_ndec[g] * self.t_adv[g]
        x = t - ta
        if bq > 0:
            m = int((-(a - bq) + math.sqrt((a - bq) ** 2 + 4 * bq * x)) / (2 * bq))
        else:
            m = int(x / a)
        ka = self.t_ka[g]
        while self._time_at(g, ka + m) < t:
            m += 1
        while m > 0 and self._time_at(g, ka + m - 1) >= t:
            m -= 1
        return ka + m

    def _anchor(self, g: int, k: int) -> None:
        """Move g's anchor to boundary k (>= current anchor); the iteration law is unchanged."""
        m = k - self.t_ka[g]
        if m <= 0:
            return
        if self.kap == 0.0:
            self.t_ta[g] += m * self.t_itl[g]
        else:
            self.t_ta[g] = self._time_at(g, k)
        adv = self.t_adv[g]
        if adv:
            self.t_dca[g] += m
            self.t_kv[g] += self.g_ndec[g] * m
        self.t_ka[g] = k

    def _join(self, g: int, t: float) -> None:
        """Prepare GPU g for new work at time t: anchor it at the boundary where the work joins."""
        if self.g_cnt[g] == 0:
            # idle GPU: iterations start now
            self.t_ta[g] = t
            self.t_itl[g] = self.tau_solo
            self.t_adv[g] = 1
            self.t_kv[g] = 0
        else:
            ta = self.t_ta[g]
            if t > ta:
                if self.kap == 0.0:
                    itl = self.t_itl[g]
                    m = int((t - ta) / itl)
                    if ta + m * itl < t:
                        m += 1
                    if m > 0:
                        self.t_ta[g] = ta + m * itl
                        if self.t_adv[g]:
                            self.t_dca[g] += m
                            self.t_kv[g] += self.g_ndec[g] * m
                        self.t_ka[g] += m
                else:
                    self._anchor(g, self._boundary_after(g, t))

    def _join_with(self, g: int, t: float, tokens: int, r: int, prefill: bool) -> None:
        """_join(g, t) for r's prefill (or decode), which needs ``tokens`` of g's KV cache: ActionError
        if they do not fit."""
        self._join(g, t)
        if self.kvcap >= 0 and self.t_kv[g] + tokens > self.kvcap:
            action, what = ("start_prefill", "the prompt") if prefill else ("start_decode", "the request's context")
            raise ActionError(f"{action}(r={r}, g={g}) at t={t:.9g}: GPU {g} has {self.kvcap - self.t_kv[g]} free KV "
                              f"tokens, {what} needs {tokens}")

    def _schedule(self, g: int) -> None:
        """(Re)compute GPU g's next event and put it in the event heap (an idle GPU has none).

        When the recomputed event (time and boundary, bit for bit) is the one already pending, the
        heap is left alone."""
        if self.g_cnt[g] == 0:
            if self.t_pkb[g] == _STARTUP:
                return  # a starting GPU: its pending event is its start-up completion
            self.t_pkb[g] = -1
            self._hremove(g)
            return
        ka = self.t_ka[g]
        kb = self.t_pend[g] if self.g_pre[g] >= 0 else _NEVER
        if self.g_ndec[g]:
            # decodes end where the decode clock reaches their target; while a whole-prompt prefill
            # stalls the clock (t_adv = 0) only those already due at the anchor end: the anchor is
            # the boundary where the prefill joins, and the decodes finishing there leave (and free
            # their KV) before the prefill iteration starts.
            kd = ka + self.r_dkey[self.g_dec[g * self.B]] - self.t_dca[g]
            if kd < kb and (self.t_adv[g] or kd <= ka):
                kb = kd
        if self.t_adv[g]:
            if self.kvcap >= 0:
                nd = self.g_ndec[g]
                if nd:
                    ko = ka + max(0, (self.kvcap - self.t_kv[g]) // nd)
                    if ko < kb:
                        kb = ko
        if kb < ka:
            kb = ka
        if self.kap == 0.0:
            te = self.t_ta[g] + (kb - ka) * self.t_itl[g]
        else:
            te = self._time_at(g, kb)
        if kb == self.t_pkb[g] and te == self.t_pte[g]:
            return  # the pending entry is this very event
        self.t_pkb[g] = kb
        self._hset(g, te)

    # -- the event heap: GPU ids ordered by (t_pte[g], g), so that GPUs with events at one instant
    # go in index order; sift operations on typed arrays (no tuples, no stale entries)
    def _hset(self, g: int, te: float) -> None:
        """Give g the pending event time te (insert g, or move it)."""
        old = self.t_pte[g]
        self.t_pte[g] = te
        i = self._hpos[g]
        if i < 0:
            i = self._hn
            self._hq[i] = g
            self._hpos[g] = i
            self._hn = i + 1
            self._hup(i)
        elif te < old:
            self._hup(i)
        elif te > old:
            self._hdown(i)

    def _hremove(self, g: int) -> None:
        """Take g out of the heap (nothing if it is not in)."""
        i = self._hpos[g]
        if i < 0:
            return
        hq = self._hq
        n = self._hn - 1
        self._hn = n
        self._hpos[g] = -1
        if i == n:
            return
        last = hq[n]
        hq[i] = last
        self._hpos[last] = i
        self._hup(i)
        if self._hpos[last] == i:
            self._hdown(i)

    def _hup(self, i: int) -> None:
        hq = self._hq
        pos = self._hpos
        pte = self.t_pte
        g = hq[i]
        t = pte[g]
        while i > 0:
            p = (i - 1) >> 1
            h = hq[p]
            th = pte[h]
            if th < t or (th == t and h < g):
                break
            hq[i] = h
            pos[h] = i
            i = p
        hq[i] = g
        pos[g] = i

    def _hdown(self, i: int) -> None:
        hq = self._hq
        pos = self._hpos
        pte = self.t_pte
        n = self._hn
        g = hq[i]
        t = pte[g]
        while True:
            c = 2 * i + 1
            if c >= n:
                break
            h = hq[c]
            th = pte[h]
            if c + 1 < n:
                h2 = hq[c + 1]
                t2 = pte[h2]
                if t2 < th or (t2 == th and h2 < h):
                    c += 1
                    h = h2
                    th = t2
            if t < th or (t == th and g < h):
                break
            hq[i] = h
            pos[h] = i
            i = c
        hq[i] = g
        pos[g] = i

    # -- the decodes on a GPU: a slot array per GPU (g_dec), a heap by end clock in tokens mode -------
    def _dremove(self, g: int, r: int, nd: int) -> None:
        """Take r out of g's decodes, which number nd once it is gone (the last one takes its place)."""
        dec = self.g_dec
        j = self.r_dpos[r]
        b = g * self.B
        last = dec[b + nd]
        dec[j] = last
        self.r_dpos[last] = j
        if not self.markov and j != b + nd:
            self._dsift(b, j - b, nd)

    def _dsift(self, b: int, i: int, n: int) -> None:
        """Restore the heap order of g_dec[b : b + n] (keys (r_dkey[r], r)) at index i."""
        dec = self.g_dec
        pos = self.r_dpos
        key = self.r_dkey
        r = dec[b + i]
        k = key[r]
        i0 = i
        while i > 0:
            p = (i - 1) >> 1
            h = dec[b + p]
            kh = key[h]
            if kh < k or (kh == k and h < r):
                break
            dec[b + i] = h
            pos[h] = b + i
            i = p
        if i == i0:
            while True:
                c = 2 * i + 1
                if c >= n:
                    break
                h = dec[b + c]
                kh = key[h]
                if c + 1 < n:
                    h2 = dec[b + c + 1]
                    k2 = key[h2]
                    if k2 < kh or (k2 == kh and h2 < h):
                        c += 1
                        h = h2
                        kh = k2
                if k < kh or (k == kh and r < h):
                    break
                dec[b + i] = h
                pos[h] = b + i
                i = c
        dec[b + i] = r
        pos[r] = b + i

    def _gpu_event(self, g: int, kb: int, t: float) -> None:
        """GPU g reached boundary kb at time t, its pending event: finish what ends there."""
        m = kb - self.t_ka[g]
        if m > 0:
            if self.t_adv[g]:
                self.t_dca[g] += m
                self.t_kv[g] += self.g_ndec[g] * m
            self.t_ka[g] = kb
        self.t_ta[g] = t  # = the anchor law's time of boundary kb (how the event was scheduled)
        dc = self.t_dca[g]
        b = g * self.B
        while self.g_ndec[g]:
            r = self.g_dec[b]  # the heap's top: the decode that ends first
            if self.r_dkey[r] > dc:
                break
            self._decode_done(r, g, t)
        if self.g_pre[g] >= 0 and self.t_pend[g] <= kb:
            self._prefill_done(self.g_pre[g], g, t)
        if self.kvcap >= 0:
            guard = 0
            while self.t_adv[g] and self.g_ndec[g] and self.t_kv[g] + self.g_ndec[g] > self.kvcap:
                self._preempt_youngest(g, t)
                guard += 1
                if guard > 2 * self.B + 2:
                    raise ActionError(
                        f"GPU {g} at t={t:.9g}: KV overflow persists after {guard} preemptions; the controller "
                        "re-admits work on the GPU it was evicted from (do not start work from on_preempt)"
                    )
            if guard and self.g_cnt[g] == 0 and self._cb_freed is not None:
                # the evictions emptied g: there is no next iteration to keep free of new work, and no
                # later completion on g would ever let its controller admit again
                self._cb_freed(self, g)
        if not self._isdirty[g]:
            self._isdirty[g] = True
            self._dirty.append(g)

    def _preempt_youngest(self, g: int, t: float) -> None:
        """vLLM recompute preemption: evict the most recently arrived request running on g."""
        b = g * self.B
        cands = [self.g_dec[b + k] for k in range(self.g_ndec[g])]
        if self.g_pre[g] >= 0:
            cands.append(self.g_pre[g])
        r = max(cands, key=lambda x: (self.r_arr[x], self.r_serial[x]))
        c = self.r_cls[r]
        cnt = self._cnt
        acc = self._acc
        if self.r_phase[r] == PREFILL:
            ptok = self.r_prompt[r] + self.r_gen[r]
            k = NQ * c + Q_X
            self.g_pre[g] = NO_REQUEST
            self.t_pend[g] = -1
            self.t_itl[g] = self.tau_solo
            self.t_adv[g] = 1
            self.t_kv[g] -= ptok
            cnt[k] -= 1
            acc[k] -= t
            if self.g_ndec[g]:
                self._switch_mode(g, False, t)
        else:
            self._dremove(g, r, self.g_ndec[g] - 1)
            gen = self.t_dca[g] - self.r_dstart[r]
            self.t_kv[g] -= self.r_prompt[r] + self.r_gen[r] + gen
            self.r_gen[r] += gen
            k = NQ * c + (Q_YM if self.g_pre[g] >= 0 else Q_YS)
            cnt[k] -= 1
            acc[k] -= t
            self.g_ndec[g] -= 1
            self.g_dcls[g * self.I + c] -= 1
        n1 = self.g_cnt[g] - 1
        self.g_cnt[g] = n1
        if n1 == 0:
            self._gpu_emptied(g, t)
        self.r_npre[r] += 1
        self.r_gpu[r] = -1
        self._ctr[NC * c + C_PREEMPTED] += 1
        self._refresh(g)
        if self.r_prompt[r] + self.r_gen[r] + 1 > self.kvcap:
            # its context alone no longer fits any GPU: drop it (vLLM aborts such requests)
            self._ctr[NC * c + C_DROPPED] += 1
            cb = self._cb_drop
            if cb is not None:
                cb(self, r, g)
            self._resolve(r, M.DROPPED, t)
        else:
            self.r_phase[r] = WAIT_PREFILL
            self.r_q[r] = -1
            self.r_tw[r] = t
            k = NQ * c + Q_WP
            cnt[k] += 1
            acc[k] += t
            cb = self._cb_preempt
            if cb is not None:
                cb(self, r, g)
            if self.r_phase[r] == WAIT_PREFILL and self.r_q[r] < 0:
                self.enqueue(r, PREFILL_QUEUE, front=True)
        # No on_slot_freed here: like vLLM, no new work is admitted in an iteration that had to preempt.

    # =============================================================================================
    # Internal: the exponential race
    # =============================================================================================
    def _refill_exp(self) -> None:
        self._exp_block = _block(self._np_rng.standard_exponential(_RNG_BLOCK))
        self._exp_i = 0

    def _draw_race(self) -> None:
        """Draw the race clock (the time of the next race event) from now at the current total rate,
        and remember that rate: exact whenever the rate changed, by memorylessness."""
        lam = self._lam
        self._lam_race = lam
        if lam > 1e-12:
            if self._exp_i >= _RNG_BLOCK:
                self._refill_exp()
            self._t_race = self._now + self._exp_block[self._exp_i] / lam
            self._exp_i += 1
        else:
            self._t_race = INF

    def _refill_uni(self) -> None:
        self._uni_block = _block(self._np_rng.random(_RNG_BLOCK))
        self._uni_i = 0

    def _exact_lam(self) -> float:
        lam = 0.0
        rsn = self._rsn
        for c in range(self.I):
            lam += self.theta[c] * rsn[RACE_WAIT * self.I + c]
            if self.markov:
                lam += self.mu_p[c] * rsn[RACE_PREFILL * self.I + c] + self.mbar[c] * rsn[RACE_DECODE * self.I + c]
        return lam

    # =============================================================================================
    # Internal: arrivals, housekeeping, metrics
    # =============================================================================================
    def _next_arrivals(self) -> bool:
        """Load the next arrival batch; False when the workload is exhausted."""
        if self._arr_iter is None:
            return False
        for b in self._arr_iter:
            if len(b.time) == 0:
                continue
            cls = np.asarray(b.cls)
            if cls.min() < 0 or cls.max() >= self.I:
                bad = int(cls[(cls < 0) | (cls >= self.I)][0])
                raise ScenarioError(f"workload: class index {bad} out of range 0..{self.I - 1}")
            self._arr_t = _block(np.ascontiguousarray(b.time, dtype=np.float64))
            self._arr_c = _int_block(cls)
            self._arr_p = _int_block(_token_counts("prompt", b.prompt))
            self._arr_o = _int_block(_token_counts("output", b.output))
            self._ai = 0
            return True
        self._arr_iter = None
        self._arr_t = _floats(0, 0.0)
        self._ai = 0
        return False

    def _areas(self, t: float) -> np.ndarray:
        return np.array(self._cnt, dtype=float) * t - np.array(self._acc, dtype=float)

    def _flush(self) -> None:
        """Fold the buffered finished requests into the metrics (and the records file)."""
        n = self._nrec
        if not n:
            return
        self._nrec = 0
        buf = self._rec.base if _COMPILED else self._rec  # (the compiled core's view has the array as base)
        self._fold(np.array(buf[: n * _NREC], dtype=float).reshape(n, _NREC))

    def _fold(self, A: np.ndarray) -> None:
        """Rows of finished requests (metrics.RECORD_FIELDS, as floats) into the metrics."""
        ints = M.RECORD_INT_FIELDS
        a = {nm: A[:, j].astype(np.int64) if nm in ints else A[:, j] for j, nm in enumerate(M.RECORD_FIELDS)}
        self.collector.add_requests(a)
        if self._records is not None:
            self._records.write(a)

    def _sample(self, t: float) -> None:
        row = [t] + [float(x) for x in self._cnt] + [float(x) for x in self._ctr]
        self._samples.append(row)

    def _housekeeping(self, t: float) -> tuple[bool, bool]:
        """Snapshots, samples and ticks due at time t: (horizon reached, controller ticked).

        Measurement (snapshots, samples) does not touch the dynamics, so runs that differ only in
        warm-up, batches or sample interval follow the same sample path.
        """
        done = False
        ticked = False
        while self._bi < len(self._bounds) and self._bounds[self._bi] <= t:
            self._flush()
            self.collector.snapshot(t, self._areas(t), np.array(self._ctr, dtype=float))
            self._bi += 1
            if self._bi == len(self._bounds):
                done = True
        if self._t_sample <= t:
            self._sample(t)
            self._t_sample += self.sample_interval
            if self._t_sample >= self.horizon:
                self._t_sample = INF
        if not done and self._t_tick <= t:
            self.controller.on_tick(self)
            self._t_tick += self.tick_interval
            ticked = True
        return done, ticked

    def _t_house(self) -> float:
        tb = self._bounds[self._bi] if self._bi < len(self._bounds) else INF
        return min(tb, self._t_sample, self._t_tick)

    # =============================================================================================
    # The run
    # =============================================================================================
    def run(self) -> M.SimResult:
        """The whole run: :meth:`start`, :meth:`advance` to the horizon, :meth:`finish`."""
        self.start()
        self.advance()
        return self.finish()

    # -- stepping: run the engine in place, a piece at a time (a Gymnasium environment, a real-time
    # driver). Any sequence of advance() calls follows the same sample path as one run, bit for bit,
    # as long as nothing acts between them; actions taken between calls are exact (the race clock is
    # redrawn only if they changed its rate, which memorylessness allows).
    def start(self) -> None:
        """Set the run up (the controller's ``setup``, the first arrivals); idempotent."""
        if self._started:
            return
        self._started = True
        self._wall0 = time.perf_counter()
        self._in_setup = True
        try:
            self.controller.setup(self)
        finally:
            self._in_setup = False
        self._arr_iter = iter(self.workload.batches(self._work_rng, self.horizon, self._arrival_chunk))
        self._next_arrivals()
        self._refill_exp()
        self._refill_uni()

    @property
    def done(self) -> bool:
        """True once the horizon is reached or the run was interrupted: :meth:`advance` does nothing more."""
        return self._done or self._interrupted

    def advance(self, until: float | None = None) -> float:
        """Process events until simulated time ``until`` (seconds; default: the horizon), a
        controller's :meth:`pause`, or Ctrl-C; return the simulated time reached.

        Events at times before ``until`` are processed, events at ``until`` are not: afterwards
        ``now == until`` and the state is the state just before that instant, so a caller may act
        (through this engine's actions) at time ``until`` before the events there happen. After a
        :meth:`pause`, ``now`` is the time of the event whose handler paused.
        """
        self.start()
        if self._finished:
            raise ActionError("advance: this run is already finished; make a new engine")
        if self.done:
            return self._now
        stop = self.horizon if until is None else float(until)
        if stop != stop:
            raise ScenarioError("advance: until: expected a time in seconds, got NaN")
        if stop <= self._now:
            return self._now
        # Ctrl-C: the first SIGINT asks the loop to stop between two events (so no state or records
        # chunk is left half-done); a second one interrupts at once.
        old_handler = None
        if self.handle_sigint and threading.current_thread() is threading.main_thread():
            cur = signal.getsignal(signal.SIGINT)
            if cur is not signal.SIG_IGN:
                old_handler = signal.signal(signal.SIGINT, self._on_sigint)
        # The loop allocates many short-lived tuples and no reference cycles: the cyclic garbage
        # collector would only rescan the live state (about 7% of the run); pause it, as timeit does.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            self._loop(stop)
        except KeyboardInterrupt:
            self._interrupted = True
        finally:
            if gc_was_enabled:
                gc.enable()
            if old_handler is not None:
                signal.signal(signal.SIGINT, old_handler)
            if self.progress:
                sys.stderr.write("\n")
                sys.stderr.flush()
        return self._now

    def pause(self) -> None:
        """Ask the engine to return from :meth:`advance` after the event being handled (for a
        controller that wants its driver to decide now, e.g. a learned router's decision epoch)."""
        self._pause = True

    def finish(self) -> M.SimResult:
        """Close the run at the time reached and return its result (a run stopped before the
        horizon is measured up to ``now``); call once."""
        self.start()
        if self._finished:
            raise ActionError("finish: this run is already finished (its result was returned); make a new engine")
        self._finished = True
        if not self._done:
            t = self._now
            self._flush()
            self.collector.snapshot(t, self._areas(t), np.array(self._ctr, dtype=float))
        result = self._finish(time.perf_counter() - self._wall0)
        result.meta["engine"] = self.engine_name
        return result

    def _set_slo(self, scenario: Scenario) -> None:
        """Have the collector count per-class SLO attainment (cold: only when some class has an SLO)."""
        import functools

        from fluidopt.sim.results import min_service_time

        def lim(v):
            return [INF if getattr(c, v) is None else float(getattr(c, v)) for c in scenario.classes]

        self.collector.set_slo(lim("ttft_slo"), lim("itl_slo"), lim("deadline"), lim("deadline_at"),
                               functools.partial(min_service_time, scenario.gpu, self.chunked))

    def _on_sigint(self, signum, frame) -> None:
        if self._stop:
            raise KeyboardInterrupt
        self._stop = True

    def _loop(self, stop: float) -> None:
        """The event loop, up to (not including) time ``stop`` or the horizon. The race selection is
        inlined here: it runs for most events. Its state lives in locals and is saved on return."""
        hq = self._hq
        pte = self.t_pte
        markov = self.markov
        dirty = self._dirty
        isdirty = self._isdirty
        check = self.check
        wall0 = self._wall0
        next_report = time.perf_counter() + 1.0
        partial = stop < self.horizon
        report_every = 1 << 14
        uni_block = self._uni_block
        ui = self._uni_i
        pkb = self.t_pkb
        rng_block = _RNG_BLOCK
        I = self.I
        mu_p, mbar, mu_m, mu_s, theta = self.mu_p, self.mbar, self.mu_m, self.mu_s, self.theta
        g_pre = self.g_pre
        arr_t, arr_c, arr_p, arr_o = self._arr_t, self._arr_c, self._arr_p, self._arr_o
        ai = self._ai
        na = len(arr_t)
        ev = self._events
        nd = self._nd  # events that can change the dynamics (not measurement)
        # actions taken between two advance() calls: reschedule their GPUs, and redraw the race
        # clock from now if they changed its rate (exact by memorylessness)
        if dirty:
            for g in dirty:
                isdirty[g] = False
                self._schedule(g)
            dirty.clear()
        if self._lam != self._lam_race:
            self._draw_race()
        tr = self._t_race
        t_house = self._t_house()
        while True:
            if ai < na:
                ta = arr_t[ai]
            elif self._next_arrivals():
                arr_t, arr_c, arr_p, arr_o = self._arr_t, self._arr_c, self._arr_p, self._arr_o
                ai = 0
                na = len(arr_t)
                ta = arr_t[0]
            else:
                ta = INF
                na = -1
            tg = pte[hq[0]] if self._hn else INF
            if partial and t_house >= stop and ta >= stop and tr >= stop and tg >= stop:
                self._now = stop
                break
            ev += 1
            if t_house <= ta and t_house <= tr and t_house <= tg:
                t = t_house
                self._now = t
                done, ticked = self._housekeeping(t)
                if done:
                    self._done = True
                    break
                t_house = self._t_house()
                if not ticked:
                    continue  # nothing changed: the race clock stays valid
            elif ta <= tr and ta <= tg:
                self._now = ta
                k = ai
                ai += 1
                self._arrive(ta, arr_c[k], arr_p[k], arr_o[k])
            elif tr <= tg:
                # --- the exponential race: pick the event kind, class and request ---------------
                t = tr
                self._now = t
                if ui >= rng_block:
                    self._refill_uni()
                    uni_block = self._uni_block
                    ui = 0
                u = uni_block[ui] * self._lam
                ui += 1
                done = False
                rs = self._rs  # (read here: a segment may grow in a handler)
                rsn = self._rsn
                cap = self._rscap
                if markov:
                    for c in range(I):
                        s = RACE_PREFILL * I + c
                        nl = rsn[s]
                        if nl:
                            a = mu_p[c] * nl
                            if u < a:
                                j = int(u / mu_p[c])
                                if j >= nl:
                                    j = nl - 1
                                r = rs[s * cap + j]
                                self._prefill_done(r, self.r_gpu[r], t)
                                done = True
                                break
                            u -= a
                    if not done:
                        for c in range(I):
                            s = RACE_DECODE * I + c
                            nl = rsn[s]
                            if nl:
                                m = mbar[c]
                                a = m * nl
                                if u < a:
                                    x = u / m
                                    j = int(x)
                                    if j >= nl:
                                        j = nl - 1
                                    r = rs[s * cap + j]
                                    g = self.r_gpu[r]
                                    # thinning; the fractional part of x is a fresh uniform
                                    if (x - j) * m < (mu_m[c] if g_pre[g] >= 0 else mu_s[c]):
                                        self._decode_done(r, g, t)
                                    done = True
                                    break
                                u -= a
                if not done:
                    for c in range(I):
                        s = RACE_WAIT * I + c
                        nl = rsn[s]
                        if nl and theta[c] > 0:
                            a = theta[c] * nl
                            if u < a:
                                j = int(u / theta[c])
                                if j >= nl:
                                    j = nl - 1
                                self._abandon(rs[s * cap + j], t)
                                break
                            u -= a
                    # else: u fell beyond the exact total (float drift of the incremental rate): null event
            else:
                g = hq[0]
                tt = pte[g]
                self._hremove(g)
                kb = pkb[g]
                pkb[g] = -1  # consumed: the next _schedule(g) must reschedule
                self._now = tt
                if kb == _STARTUP:
                    self._online(g, tt)
                else:
                    self._gpu_event(g, kb, tt)
            if dirty:
                for g in dirty:
                    isdirty[g] = False
                    self._schedule(g)
                dirty.clear()
            nd += 1
            if not nd & 0xFFFF:
                self._lam = self._exact_lam()  # drop the incremental rate's float drift
            self._draw_race()
            tr = self._t_race
            if check:
                self.check_invariants()
            if self._pause:
                break
            if not ev & 1023:
                if self._stop:
                    self._interrupted = True
                    break
                if not ev & (report_every - 1):
                    self._events = ev
                    if self.progress:
                        now = time.perf_counter()
                        if now >= next_report:
                            next_report = now + 1.0
                            self._report(now - wall0)
        self._events = ev
        self._nd = nd
        self._uni_i = ui
        self._ai = ai
        self._pause = False

    def _report(self, wall: float) -> None:
        progress_line(self, wall)

    def _in_system(self) -> list[int]:
        return [r for r in range(len(self.r_phase)) if self.r_phase[r] != _GONE]

    def _finish(self, wall: float) -> M.SimResult:
        return assemble_result(self, wall)

    def check_invariants(self) -> None:
        """Recount the whole state from scratch and compare with every incremental counter (tests;
        ``check=True`` runs this after every event): :func:`fluidopt.sim.invariants.check_invariants`."""
        check_invariants(self)
