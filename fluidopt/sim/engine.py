"""The event kernel of the many-server simulator: the state, the actions and the event loop.

docs/simulator.md describes the model (sections 1-3) and, in section 9, this file and the plain modules that
hold its cold code (bound below as methods). This file is also the source of the compiled core: setup.py
compiles it with the static types of engine.pxd. Declare new Engine attributes there, keep each local name
to one type, and keep no per-request array in a local across an arrival (they are replaced when they grow).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable

from fluidopt.control import protocol as P
from fluidopt.sim import bookkeeping as BK
from fluidopt.sim import fleet as FL
from fluidopt.sim import metrics as M
from fluidopt.sim import state as S
from fluidopt.sim import timelaw as TL
from fluidopt.sim import view as V
from fluidopt.sim.action_errors import GONE as _GONE  # phase of a freed request slot
from fluidopt.sim.action_errors import decode_error, enqueue_error, kv_error, kv_overflow_error, prefill_error
from fluidopt.sim.engine_setup import init_engine
from fluidopt.sim.invariants import check_invariants as _check_invariants

__all__ = ["Engine", "GpuSet", "REQUEST_FIELDS"]

DECODE, PREFILL, WAIT_DECODE, WAIT_PREFILL, NO_REQUEST = P.DECODE, P.PREFILL, P.WAIT_DECODE, P.WAIT_PREFILL, P.NO_REQUEST
DECODE_QUEUE, PREFILL_QUEUE = P.DECODE_QUEUE, P.PREFILL_QUEUE

INF, NAN = math.inf, math.nan
_NEVER = 1 << 62  # a boundary index beyond any run
_FLUSH = S.FLUSH  # finished requests buffered before folding into the metrics
_RNG_BLOCK = S.RNG_BLOCK
_NREC = M.N_RECORD_FIELDS  # fields of a finished request's row (metrics.RECORD_FIELDS; see _write_record)
REQUEST_FIELDS = S.REQUEST_FIELDS  # each per-request field's one definition (fluidopt.sim.state)

RACE_WAIT, RACE_PREFILL, RACE_DECODE = S.RACE_WAIT, S.RACE_PREFILL, S.RACE_DECODE  # the race's request sets: Engine._rs

# The layouts of the time-integrated counts (NQ per class), the event counters (NC per class) and a finished
# request's row (_write_record), by name, from their one definition in fluidopt.sim.metrics (engine.pxd: C integers).
NQ = M.N_CLASS_QTY
Q_WP, Q_X, Q_WD, Q_YM, Q_YS = M.Q_PREFILL, M.X_PREFILL, M.Q_DECODE, M.Y_MIXED, M.Y_SOLO
NC = M.N_CTR
C_ARRIVED, C_PREFILLED, C_COMPLETED, C_PREEMPTED = M.C_ARRIVED, M.C_PREFILLED, M.C_COMPLETED, M.C_PREEMPTED
C_AB_PREFILL, C_AB_DECODE, C_DROPPED = M.C_AB_PREFILL, M.C_AB_DECODE, M.C_DROPPED
C_PREFILL_TOKENS, C_DONE_PROMPT, C_DONE_OUTPUT = M.C_PREFILL_TOKENS, M.C_DONE_PROMPT, M.C_DONE_OUTPUT
REC_ID, REC_CLS, REC_ARRIVAL, REC_PROMPT, REC_OUTPUT = M.REC_ID, M.REC_CLS, M.REC_ARRIVAL, M.REC_PROMPT, M.REC_OUTPUT
REC_OUTCOME, REC_END, REC_TTFT, REC_WAIT_PREFILL = M.REC_OUTCOME, M.REC_END, M.REC_TTFT, M.REC_WAIT_PREFILL
REC_WAIT_DECODE, REC_PREEMPTIONS, REC_PREFILL_GPU, REC_DECODE_GPU = M.REC_WAIT_DECODE, M.REC_PREEMPTIONS, M.REC_PREFILL_GPU, M.REC_DECODE_GPU

# Fleet states of a GPU (g_state; docs/simulator.md section 11). A fixed fleet never leaves ONLINE.
G_ONLINE, G_STARTING, G_DRAINING, G_OFFLINE = S.G_ONLINE, S.G_STARTING, S.G_DRAINING, S.G_OFFLINE
_STARTUP = S.STARTUP  # t_pkb of a starting GPU: its pending heap event is its start-up completion

_COMPILED = False  # True only in the compiled core: setup.py appends "_COMPILED = True" to the copy it compiles


class GpuSet:
    """A set of GPU ids with O(1) add, discard, membership and uniform random choice; controllers read it,
    the engine mutates it. Members are ``_items[:_len]``; ``_pos[g]`` is g's index, or -1."""
    __slots__ = ("_items", "_pos", "_rand", "_len")

    def __init__(self, n: int, rand: Callable[[], float]):
        self._items, self._pos = S.ints(n, -1, _COMPILED), S.ints(n, -1, _COMPILED)
        self._len, self._rand = 0, rand

    def __len__(self) -> int: return self._len
    def __bool__(self) -> bool: return self._len > 0
    def __repr__(self) -> str: return f"GpuSet({sorted(self)})"
    def first(self) -> int: return self._items[0] if self._len else -1

    def __contains__(self, g: object) -> bool:
        try:  # a GPU id: an int as controllers pass it (no method call per event), or a numpy integer
            k = g if type(g) is int else g.__index__()
        except (AttributeError, TypeError):
            return False
        return 0 <= k < len(self._pos) and self._pos[k] >= 0
    def has(self, g: int) -> bool: return 0 <= g < len(self._pos) and self._pos[g] >= 0  # g in self: C in the core

    def __iter__(self):
        return iter([self._items[k] for k in range(self._len)])  # a copy: safe while the controller acts

    def choice(self) -> int:
        return self._items[int(float(self._rand()) * self._len)] if self._len else -1  # (float: C in the core)

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
            n = self._len - 1
            last = self._items[n]
            self._items[p] = last
            pos[last] = p
            pos[g] = -1
            self._len = n


class Engine:
    """One simulation run (see fluidopt.sim.api); also the controllers' Context (the protocol is its
    public methods: views and actions; everything underscored is internal)."""

    def __init__(self, scenario, controller, workload, **options):
        init_engine(self, _COMPILED, GpuSet, scenario, controller, workload, **options)

    # -- cold code in plain modules, bound here as methods (docs/simulator.md section 9) ----------
    n_gpus, batch, n_classes = property(V.n_gpus), property(V.batch), property(V.n_classes)
    class_names, service, n_pools = property(V.class_names), property(V.service), property(V.n_pools)
    gpu_mixed, gpu_decodes_by_class, gpu_requests, cached_prefix_tokens, req_blocks = V.gpu_mixed, V.gpu_decodes_by_class, \
        V.gpu_requests, V.cached_prefix_tokens, V.req_blocks
    queue_id, instance_queue, queue_requests, set_pool = V.queue_id, V.instance_queue, V.queue_requests, V.set_pool
    instance_tokens, req_queue, req_preemptions, add_queue = V.instance_tokens, V.req_queue, V.req_preemptions, V.add_queue
    class_counts, queue_counts, queue_totals = V.class_counts, V.queue_counts, V.queue_totals  # live vectors
    gpu_state, fleet_size, fleet_online, gpu_hours = FL.gpu_state, FL.fleet_size, FL.fleet_online, FL.gpu_hours
    add_gpu, drain_gpu, remove_gpu, set_max_decodes, evict, startup_delay = FL.add_gpu, FL.drain_gpu, \
        FL.remove_gpu, FL.set_max_decodes, FL.evict, FL.startup_delay
    _online, _offline, _restore, _preempt_youngest = FL.online, FL.offline, FL.restore, FL.preempt_youngest
    run, start, advance, finish, pause, done = BK.run, BK.start, BK.advance, BK.finish, BK.pause, property(BK.done)
    _on_sigint, _every_1024, _alloc, _race_grow = BK.on_sigint, BK.every_1024, BK.alloc, BK.race_grow
    _refill_exp, _refill_uni, _next_arrivals = BK.refill_exp, BK.refill_uni, BK.next_arrivals
    _housekeeping, _t_house, _flush, _fold = BK.housekeeping, BK.t_house, BK.flush, BK.fold
    _exact_lam, _in_system, check_invariants = BK.exact_lam, BK.in_system, _check_invariants

    # -- the view: O(1) reads that controllers call on every event (typed in engine.pxd) --------
    @property
    def now(self) -> float:
        return self._now

    @property
    def rng(self) -> random.Random:
        return self._ctrl_rng

    def n_prefill(self, i: int) -> int: return self._cnt[NQ * i + Q_X]
    def n_decode_mixed(self, i: int) -> int: return self._cnt[NQ * i + Q_YM]
    def n_decode_solo(self, i: int) -> int: return self._cnt[NQ * i + Q_YS]
    def n_wait_prefill(self, i: int) -> int: return self._cnt[NQ * i + Q_WP]
    def n_wait_decode(self, i: int) -> int: return self._cnt[NQ * i + Q_WD]
    def gpu_prefill(self, g: int) -> int: return self.g_pre[g]
    def gpu_decodes(self, g: int) -> int: return self.g_ndec[g]
    def gpu_free(self, g: int) -> int: return self.B - self.g_cnt[g]
    def gpu_pool(self, g: int) -> int: return self.g_pool[g]
    def gpu_max_decodes(self, g: int) -> int: return self.g_maxd[g]
    def gpu_prefill_allowed(self, g: int) -> bool: return bool(self.g_pok[g])
    def gpu_online(self, g: int) -> bool: return self.g_state[g] == G_ONLINE
    def idle_prefill(self, pool: int = 0) -> GpuSet: return self._ip[pool]
    def free_decode(self, pool: int = 0) -> GpuSet: return self._fd[pool]
    def instance_requests(self, g: int) -> int: return self.q_tot[2 + g] + self.g_cnt[g]
    def req_class(self, r: int) -> int: return self.r_cls[r]
    def req_prompt(self, r: int) -> int: return self.r_prompt[r]
    def req_output(self, r: int) -> int: return self.r_output[r]
    def req_arrival(self, r: int) -> float: return self.r_arr[r]
    def req_phase(self, r: int) -> int: return self.r_phase[r]
    def req_gpu(self, r: int) -> int: return self.r_gpu[r]

    def qlen(self, q: int, cls: int = -1) -> int: return self.q_tot[q] if cls < 0 else self.q_cnt[q * self.I + cls]

    def head(self, q: int, cls: int = -1) -> int:
        I = self.I
        if cls >= 0:
            return self.q_head[q * I + cls]
        if I == 1:
            return self.q_head[q]
        if I == 2:  # the common case, unrolled (same tie rule as the loop: the lower class wins)
            a = self.q_head[2 * q]
            b = self.q_head[2 * q + 1]
            return b if a < 0 or (b >= 0 and self.r_seq[b] < self.r_seq[a]) else a
        best, bs, qh, seq = -1, 0, self.q_head, self.r_seq
        for k in range(q * I, q * I + I):
            r = qh[k]
            if r >= 0 and (best < 0 or seq[r] < bs):
                best = r
                bs = seq[r]
        return best

    def gpu_kv_used(self, g: int) -> int:
        if self.markov or self.g_cnt[g] == 0:
            return 0
        t = self._now
        if t > self.t_ta[g]:
            m = self._boundary_after(g, t) - self.t_ka[g]
            return self.t_kv[g] + self.g_ndec[g] * self.t_adv[g] * m
        return self.t_kv[g]

    def gpu_kv_free(self, g: int) -> float: return INF if self.kvcap < 0 else float(self.kvcap - self.gpu_kv_used(g))

    def req_generated(self, r: int) -> int:
        """Output tokens r has produced by its GPU's last iteration boundary (markov: 0 until done)."""
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

    # -- Actions (validated) and the state changes they make -------------------------------------
    def start_prefill(self, r: int, g: int) -> None:
        """Start request r's prefill on GPU g (validated; see the protocol)."""
        # (the state is read through self: a local copy of an array costs a buffer acquisition)
        try:
            ok = (self.r_phase[r] == WAIT_PREFILL and self.g_pre[g] < 0 and self.g_cnt[g] < self.B
                  and self.g_pok[g] and r >= 0 and g >= 0)
        except (IndexError, TypeError):
            ok = False
        if not ok:
            prefill_error(self, r, g)
        self._start_prefill(r, g)

    def _start_prefill(self, r: int, g: int) -> None:
        t = self._now
        c = self.r_cls[r]
        markov = self.markov
        if not markov:
            ptok = self.r_prompt[r] + self.r_gen[r]  # recompute after a preemption
            self._join_with(g, t, ptok, r, True)
            w = ptok if self._pc is None else self._pc.start(self.r_serial[r], g, ptok, self.r_prompt[r], self.t_kv[g])
            self.l_w[g] = w
        self._leave_wait(r, c, t, Q_WP)
        self._bump(NQ * c + Q_X, 1, t)
        self.g_pre[g] = r
        n0 = self.g_cnt[g]
        self.g_cnt[g] = n0 + 1
        if n0 == 0:
            self._bump(self._gbase, 1, t)  # one busy GPU more
        else:
            self._switch_mode(g, True, t)
        self.r_gpu[r] = g
        self.r_phase[r] = PREFILL
        if self.r_pg[r] < 0:
            self.r_pg[r] = g
        s = self._ip[self.g_pool[g]]
        s._discard(g)  # the idle-prefill set; the free-decode set changes only if g is now full
        if n0 + 1 >= self.B:
            self._refresh(g)
        if markov:
            self._race_add(r, RACE_PREFILL * self.I + c, g)
            self._lam += self.mu_p[c]
        else:
            ka = self.t_ka[g]
            if self.r_host[r]:
                self._restore(r, g, ptok, ka)
            elif self.chunked:
                self.t_pend[g], self.t_itl[g] = ka + (w + self.C - 1) // self.C, self.tau_mix
            else:
                self.t_pend[g], self.t_itl[g], self.t_adv[g] = ka + 1, self.alpha + self.beta * w, 0
            self.t_kv[g] += ptok
            self._touch(g)

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
        t = self._now
        c = self.r_cls[r]
        markov = self.markov
        if not markov:
            self._join_with(g, t, self.r_prompt[r] + self.r_gen[r], r, False)
            if self._pch is not None:
                self._pch.decode_start(self.r_serial[r], g, self.t_kv[g], self.r_prompt[r] + self.r_gen[r])
        self._leave_wait(r, c, t, Q_WD)
        self._bump(NQ * c + (Q_YM if self.g_pre[g] >= 0 else Q_YS), 1, t)
        n0 = self.g_cnt[g]
        self.g_cnt[g] = n0 + 1
        nd = self.g_ndec[g] + 1
        self.g_ndec[g] = nd
        self.g_dcls[g * self.I + c] += 1
        if n0 == 0:
            self._bump(self._gbase, 1, t)
        self.r_gpu[r] = g
        self.r_dg[r] = g
        self.r_phase[r] = DECODE
        if nd >= self.g_maxd[g] or n0 + 1 >= self.B:  # (only then does a set change: fewer cache misses)
            self._refresh(g)
        k = g * self.B + nd - 1  # r's place in g's decode segment
        self.g_dec[k] = r
        if markov:
            self._race_add(r, RACE_DECODE * self.I + c, g)
            self._lam += self.mbar[c]
        else:
            self.r_dpos[r] = k
            self.r_dstart[r] = self.t_dca[g]
            self.r_dkey[r] = self.t_dca[g] + self.r_output[r] - self.r_gen[r]
            self._dsift(g * self.B, nd - 1, nd)
            self.t_kv[g] += self.r_prompt[r] + self.r_gen[r]
            self._touch(g)

    def enqueue(self, r: int, q: int, front: bool = False) -> None:
        """Put waiting request r at the back (front=True: the front) of queue q."""
        try:
            ph = self.r_phase[r]
            ok = (ph == WAIT_PREFILL or ph == WAIT_DECODE) and 0 <= q < len(self.q_tot) and r >= 0
        except (IndexError, TypeError):
            ok = False
        if not ok:
            enqueue_error(self, r, q)
        old = self.r_q[r]
        if old == q and not front:
            return
        if old >= 0:
            self._q_remove(r, old)
        else:  # entering a waiting place: it can now abandon
            c = self.r_cls[r]
            self._race_add(r, RACE_WAIT * self.I + c, -1)
            self._lam += self.theta[c]
        self._q_push(r, q, front)

    def _evict(self, r: int, g: int, t: float, host: bool) -> None:
        """Take running request r off GPU g at time t (tokens: g anchored there); it waits again or drops."""
        c = self.r_cls[r]
        markov = self.markov
        back = WAIT_PREFILL
        if self.r_phase[r] == PREFILL:
            if not markov:
                self.r_host[r] = 1 if (host and self.r_gen[r] > 0) else 0
            self._prefill_leaves(r, g, c, t)
        else:
            if markov:
                back = WAIT_DECODE
            else:
                gen = self.t_dca[g] - self.r_dstart[r]
                self.t_kv[g] -= self.r_prompt[r] + self.r_gen[r] + gen
                self.r_gen[r] += gen
                self.r_host[r] = 1 if host else 0
            self._decode_leaves(r, g, c, t)
        self.r_npre[r] += 1
        self.r_gpu[r] = -1
        self._ctr[NC * c + C_PREEMPTED] += 1
        self._refresh(g)
        if not markov and not self.r_host[r] and self.kvcap >= 0 and self.r_prompt[r] + self.r_gen[r] + 1 > self.kvcap:
            # its context alone no longer fits any GPU: drop it (vLLM aborts such requests)
            self._ctr[NC * c + C_DROPPED] += 1
            if self._cb_drop is not None:
                self._cb_drop(self, r, g)
            self._resolve(r, M.DROPPED, t)
            return
        self.r_phase[r] = back
        self.r_q[r] = -1
        self.r_tw[r] = t
        self._bump(NQ * c + (Q_WP if back == WAIT_PREFILL else Q_WD), 1, t)
        if self._cb_preempt is not None:
            self._cb_preempt(self, r, g)
        if self.r_phase[r] == back and self.r_q[r] < 0:
            self.enqueue(r, PREFILL_QUEUE if back == WAIT_PREFILL else DECODE_QUEUE, front=True)

    def _prefill_leaves(self, r: int, g: int, c: int, t: float) -> None:
        """r's prefill (class c) leaves GPU g at time t: it completed, or r was evicted."""
        self._bump(NQ * c + Q_X, -1, t)
        self.g_pre[g] = NO_REQUEST
        if self.markov:
            self._race_remove(r, RACE_PREFILL * self.I + c)
            self._lam -= self.mu_p[c]
        else:
            if self._pc is not None:  # (before t_pend is reset: it tells a completion from an eviction)
                self._pc.leave(self.r_serial[r], g, self.t_pend[g] - self.t_ka[g], c)
            self.t_pend[g], self.t_itl[g], self.t_adv[g] = -1, self.tau_solo, 1
            self.t_kv[g] -= self.r_prompt[r] + self.r_gen[r]
            self._touch(g)
        if self.g_ndec[g]:
            self._switch_mode(g, False, t)
        self._slot_left(g, t)

    def _decode_leaves(self, r: int, g: int, c: int, t: float) -> None:
        """r's decode (class c) leaves GPU g at time t (the caller updates g's KV tokens)."""
        self._bump(NQ * c + (Q_YM if self.g_pre[g] >= 0 else Q_YS), -1, t)
        nd = self.g_ndec[g] - 1
        self.g_ndec[g] = nd
        self.g_dcls[g * self.I + c] -= 1
        self._dremove(g, r, nd)
        if self.markov:
            self._race_remove(r, RACE_DECODE * self.I + c)
            self._lam -= self.mbar[c]
        else:
            if self._pch is not None:
                self._pch.decode_leaves(self.r_serial[r], g)
            self._touch(g)
        self._slot_left(g, t)

    def _slot_left(self, g: int, t: float) -> None:
        """A request left GPU g; if it was the last, one busy GPU fewer (a draining GPU goes offline)."""
        n1 = self.g_cnt[g] - 1
        self.g_cnt[g] = n1
        if n1 == 0:
            self._bump(self._gbase, -1, t)
            if self.g_state[g] == G_DRAINING:
                self._offline(g, t)

    # -- Internal: counts, sets, queues, the race's request sets ---------------------------------
    def _bump(self, k: int, d: int, t: float) -> None:
        """Count k changes by d at time t (its time integral is cnt * t - acc)."""
        self._cnt[k] += d
        self._acc[k] += d * t

    def _touch(self, g: int) -> None:
        """GPU g's state changed: recompute its pending event before the next one (tokens)."""
        if not self._isdirty[g]:
            self._isdirty[g] = True
            self._dirty.append(g)

    def _reschedule(self) -> None:
        for g in self._dirty:
            self._isdirty[g] = False
            self._schedule(g)
        self._dirty.clear()

    def _switch_mode(self, g: int, mixed: bool, t: float) -> None:
        """GPU g's decodes move between Y_s and Y_m (a prefill started or ended on g)."""
        base = g * self.I
        for c in range(self.I):
            d = self.g_dcls[base + c]
            if d:
                self._bump(NQ * c + (Q_YS if mixed else Q_YM), -d, t)  # from (solo or mixed) ...
                self._bump(NQ * c + (Q_YM if mixed else Q_YS), d, t)  # ... to (mixed or solo)

    def _refresh(self, g: int) -> None:
        """Update g's membership in its pool's idle-prefill and free-decode sets."""
        p = self.g_pool[g]
        room = self.g_cnt[g] < self.B
        s = self._ip[p]
        if room and self.g_pre[g] < 0 and self.g_pok[g]:
            s._add(g)
        else:
            s._discard(g)
        s = self._fd[p]
        if room and self.g_ndec[g] < self.g_maxd[g]:
            s._add(g)
        else:
            s._discard(g)

    def _q_push(self, r: int, q: int, front: bool) -> None:
        """Put r (in no queue) at the front or the back of queue q."""
        k = q * self.I + self.r_cls[r]
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

    def _enqueue_new(self, r: int, q: int) -> None:
        """Append waiting request r, in no queue yet, to queue q (the engine's default placements)."""
        c = self.r_cls[r]
        self._race_add(r, RACE_WAIT * self.I + c, -1)  # entering a waiting place: it can now abandon
        self._lam += self.theta[c]
        self._q_push(r, q, False)

    def _dequeue(self, r: int, c: int) -> None:
        """Take queued request r (class c) out of its queue and out of the abandonment race."""
        self._q_remove(r, self.r_q[r])
        self._race_remove(r, RACE_WAIT * self.I + c)
        self._lam -= self.theta[c]

    def _leave_wait(self, r: int, c: int, t: float, qk: int) -> None:
        """r stops waiting (phase WAIT_PREFILL if qk == Q_WP, WAIT_DECODE if qk == Q_WD) at time t."""
        if self.r_q[r] >= 0:
            self._dequeue(r, c)
        self._bump(NQ * c + qk, -1, t)
        if qk == Q_WP:
            self.r_wp[r] += t - self.r_tw[r]
        else:
            self.r_wd[r] += t - self.r_tw[r]

    # segment s = kind * I + class (kinds RACE_WAIT: queued, RACE_PREFILL / RACE_DECODE: markov in
    # service) holds pairs (request, its GPU or -1), the k-th at _rs[_rsoff[s] + 2 * k] (r_pos: r's k;
    # room for _rscap[s]): a race pick then loads the request's and its GPU's state in parallel
    def _race_add(self, r: int, s: int, g: int) -> None:
        n = self._rsn[s]
        if n == self._rscap[s]:
            self._race_grow(s)
        k = self._rsoff[s] + 2 * n
        self._rs[k], self._rs[k + 1] = r, g
        self.r_pos[r] = n
        self._rsn[s] = n + 1

    def _race_remove(self, r: int, s: int) -> None:
        """Take r out of segment s (the segment's last request takes its place)."""
        rs = self._rs
        b = self._rsoff[s]
        n = self._rsn[s] - 1
        j = self.r_pos[r]
        last = rs[b + 2 * n]
        rs[b + 2 * j], rs[b + 2 * j + 1] = last, rs[b + 2 * n + 1]
        self.r_pos[last] = j
        self._rsn[s] = n

    # -- Internal: request lifecycle -------------------------------------------------------------
    def _write_record(self, k: int, r: int, c: int, outcome: int, t: float) -> None:
        """r's row (metrics.RECORD_FIELDS, by name) at _rec[k:k + _NREC]: class c, ``outcome`` at time t
        (self._rec, not a local alias: in the core an alias of an array costs a reference count per call)."""
        self._rec[k + REC_ID], self._rec[k + REC_CLS], self._rec[k + REC_ARRIVAL] = self.r_serial[r], c, self.r_arr[r]
        self._rec[k + REC_PROMPT], self._rec[k + REC_OUTPUT], self._rec[k + REC_OUTCOME] = self.r_prompt[r], self.r_output[r], outcome
        self._rec[k + REC_END], self._rec[k + REC_TTFT], self._rec[k + REC_PREEMPTIONS] = t, self.r_ttft[r], self.r_npre[r]
        self._rec[k + REC_WAIT_PREFILL], self._rec[k + REC_WAIT_DECODE] = self.r_wp[r], self.r_wd[r]
        self._rec[k + REC_PREFILL_GPU], self._rec[k + REC_DECODE_GPU] = self.r_pg[r], self.r_dg[r]

    def _resolve(self, r: int, outcome: int, t: float) -> None:
        """Record r's outcome (its row to the buffer of finished requests; a full one is folded) and free its slot."""
        self._write_record(self._nrec * _NREC, r, self.r_cls[r], outcome, t)
        self._nrec += 1
        if self._nrec >= _FLUSH:
            self._flush()
        self.r_phase[r] = _GONE
        self.r_gpu[r] = -1
        self._free.append(r)

    def _arrive(self, t: float, c: int, prompt: int, output: int) -> None:
        free = self._free
        r = free.pop() if free else self._alloc()
        s = self._serial + 1
        self._serial = s
        r_phase = self.r_phase
        r_phase[r] = WAIT_PREFILL
        self.r_serial[r], self.r_cls[r], self.r_prompt[r], self.r_output[r], self.r_arr[r] = s, c, prompt, output, t
        self.r_tw[r], self.r_wp[r], self.r_wd[r], self.r_ttft[r] = t, 0.0, 0.0, NAN
        self.r_gen[r], self.r_npre[r], self.r_pg[r], self.r_dg[r], self.r_host[r] = 0, 0, -1, -1, 0
        self._ctr[NC * c + C_ARRIVED] += 1
        if self.kvcap >= 0 and prompt + 1 > self.kvcap:
            # can never fit on a GPU (vLLM rejects prompts beyond the KV capacity)
            self._ctr[NC * c + C_DROPPED] += 1
            self._resolve(r, M.DROPPED, t)
            return
        self._bump(NQ * c + Q_WP, 1, t)
        if self._cb_arrival is not None:
            self._cb_arrival(self, r)
        if r_phase[r] == WAIT_PREFILL and self.r_q[r] < 0:
            self._enqueue_new(r, PREFILL_QUEUE)

    def _prefill_done(self, r: int, g: int, t: float) -> None:
        c = self.r_cls[r]
        self._prefill_leaves(r, g, c, t)
        self._bump(NQ * c + Q_WD, 1, t)  # now waiting for a decode (placed by the controller, or the decode queue)
        if self.r_ttft[r] != self.r_ttft[r]:  # NaN: the first prefill of r
            self.r_ttft[r] = t - self.r_arr[r]
            self._ctr[NC * c + C_PREFILLED] += 1
            self._ctr[NC * c + C_PREFILL_TOKENS] += self.r_prompt[r]
        r_phase = self.r_phase
        r_phase[r] = WAIT_DECODE
        self.r_gpu[r] = -1
        self.r_tw[r] = t
        self._refresh(g)
        if self._cb_pdone is not None:
            self._cb_pdone(self, r, g)
        if r_phase[r] == WAIT_DECODE and self.r_q[r] < 0:
            self._enqueue_new(r, DECODE_QUEUE)
        if self._cb_freed is not None:
            self._cb_freed(self, g)

    def _decode_done(self, r: int, g: int, t: float) -> None:
        c = self.r_cls[r]
        out = self.r_output[r]
        prompt = self.r_prompt[r]
        self._decode_leaves(r, g, c, t)
        if not self.markov:
            self.t_kv[g] -= prompt + out
        self.r_gen[r] = out
        ctr = self._ctr
        k = NC * c
        ctr[k + C_COMPLETED] += 1
        ctr[k + C_DONE_PROMPT] += prompt
        ctr[k + C_DONE_OUTPUT] += out
        self._refresh(g)
        if self._cb_ddone is not None:
            self._cb_ddone(self, r, g)
        self._resolve(r, 0, t)
        if self._cb_freed is not None:
            self._cb_freed(self, g)

    def _abandon(self, r: int, t: float) -> None:
        c = self.r_cls[r]
        q = self.r_q[r]
        ph = self.r_phase[r]
        self._leave_wait(r, c, t, Q_WP if ph == WAIT_PREFILL else Q_WD)
        self._ctr[NC * c + (C_AB_PREFILL if ph == WAIT_PREFILL else C_AB_DECODE)] += 1
        if self._cb_abandon is not None:
            self._cb_abandon(self, r, q)
        self._resolve(r, M.ABANDONED_PREFILL if ph == WAIT_PREFILL else M.ABANDONED_DECODE, t)

    # -- Internal: tokens-mode GPU clock (docs/simulator.md section 1.1) -------------------------
    def _time_at(self, g: int, k: int) -> float:
        """Time of boundary k (>= the anchor) of busy GPU g under its current iteration law."""
        m = k - self.t_ka[g]
        if self._lin:
            return self.t_ta[g] + m * self.t_itl[g]
        if self._law:  # (timelaw.iteration: the m-th iteration takes t_itl + l_q m; a partial last chunk l_last less)
            te = self.t_ta[g] + m * self.t_itl[g] + self.l_q[g] * (m * (m - 1) // 2)
            return te - self.l_last[g] if k == self.t_pend[g] and m > 0 else te
        return (self.t_ta[g] + m * (self.t_itl[g] + self.kap * self.t_kv[g])
                + self.kap * (self.g_ndec[g] * self.t_adv[g]) * (m * (m - 1) // 2))

    def _boundary_after(self, g: int, t: float) -> int:
        """The first boundary of busy GPU g at or after time t (t > anchor time)."""
        ta = self.t_ta[g]
        if self._lin:
            itl = self.t_itl[g]
            m = int((t - ta) / itl)
            if ta + m * itl < t:
                m += 1
            return self.t_ka[g] + m
        a = self.t_itl[g] + self.kap * self.t_kv[g]  # (with a law kap is 0: l_q holds the growth)
        bq = 0.5 * self.l_q[g] if self._law else 0.5 * self.kap * self.g_ndec[g] * self.t_adv[g]
        x = t - ta
        m = int((-(a - bq) + math.sqrt((a - bq) ** 2 + 4 * bq * x)) / (2 * bq)) if bq > 0 else int(x / a)
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
        self.t_ta[g] = self.t_ta[g] + m * self.t_itl[g] if self._lin else self._time_at(g, k)
        if self.t_adv[g]:
            self.t_dca[g] += m
            self.t_kv[g] += self.g_ndec[g] * m
        self.t_ka[g] = k
        if self._law:  # the m-th iteration from the anchor takes t_itl + l_q m (timelaw.iteration)
            self.t_itl[g] += m * self.l_q[g]

    def _join(self, g: int, t: float) -> None:
        """Prepare GPU g for new work at time t: anchor it at the boundary where the work joins."""
        if self.g_cnt[g] == 0:  # idle GPU: iterations start now
            self.t_ta[g], self.t_itl[g], self.t_adv[g], self.t_kv[g] = t, self.tau_solo, 1, 0
        elif t > self.t_ta[g]:
            self._anchor(g, self._boundary_after(g, t))

    def _join_with(self, g: int, t: float, tokens: int, r: int, prefill: bool) -> None:
        """_join(g, t) for r's prefill (or decode), which needs ``tokens`` of g's KV cache (or an error)."""
        self._join(g, t)
        if self.kvcap >= 0 and self.t_kv[g] + tokens > self.kvcap:
            kv_error(self, g, t, tokens, r, prefill)

    def _schedule(self, g: int) -> None:
        """(Re)compute GPU g's next event and put it in the event heap (an idle GPU has none); the heap
        is left alone when the recomputed event (time and boundary, bit for bit) is already pending."""
        if self.g_cnt[g] == 0:
            if self.t_pkb[g] == _STARTUP:
                return  # a starting GPU: its pending event is its start-up completion
            self.t_pkb[g] = -1
            self._hremove(g)
            return
        if self._law:
            self._law_set(g)
        ka = self.t_ka[g]
        kb = self.t_pend[g] if self.g_pre[g] >= 0 else _NEVER
        if self.g_ndec[g]:
            # decodes end where the decode clock reaches their target; while a whole-prompt prefill
            # stalls the clock (t_adv = 0), only those due at the anchor (where the prefill joins)
            kd = ka + self.r_dkey[self.g_dec[g * self.B]] - self.t_dca[g]
            if kd < kb and (self.t_adv[g] or kd <= ka):
                kb = kd
        nd = self.g_ndec[g]
        if self.t_adv[g] and self.kvcap >= 0 and nd:
            ko = ka + max(0, (self.kvcap - self.t_kv[g]) // nd)  # the KV cache overflows there
            if ko < kb:
                kb = ko
        if kb < ka:
            kb = ka
        te = self.t_ta[g] + (kb - ka) * self.t_itl[g] if self._lin else self._time_at(g, kb)
        if kb == self.t_pkb[g] and te == self.t_pte[g]:
            return  # the pending entry is this very event
        self.t_pkb[g] = kb
        self._hset(g, te)

    def _law_set(self, g: int) -> None:
        """Set g's iteration law (t_itl, l_q, l_last) from its state at its anchor (gpu.timemodel)."""
        r = self.g_pre[g]
        ptok = -1 if r < 0 else self.r_prompt[r] + self.r_gen[r]
        self.t_itl[g], self.l_q[g], self.l_last[g] = TL.iteration(self._lawc, self.g_ndec[g], self.t_kv[g], ptok,
                                                                  self.l_w[g], self.t_adv[g], self.t_pend[g] - self.t_ka[g], self._swap)

    # -- the event heap: GPU ids by (t_pte[g], g), equal instants in GPU order; typed-array sifts, no stale entries
    def _hset(self, g: int, te: float) -> None:
        """Give g the pending event time te (insert g, or move it)."""
        self.t_pte[g] = te
        i = self._hpos[g]
        if i < 0:
            i = self._hn
            self._hq[i] = g
            self._hpos[g] = i
            self._hn = i + 1
        self._hsift(i)

    def _hremove(self, g: int) -> None:
        """Take g out of the heap (nothing if it is not in)."""
        i = self._hpos[g]
        if i < 0:
            return
        n = self._hn - 1
        self._hn = n
        self._hpos[g] = -1
        if i < n:
            last = self._hq[n]
            self._hq[i] = last
            self._hpos[last] = i
            self._hsift(i)

    def _hsift(self, i: int) -> None:
        """Restore the heap order at index i: up if its key is below its parent's, else down."""
        hq, pos, pte, n = self._hq, self._hpos, self.t_pte, self._hn
        g = hq[i]
        t = pte[g]
        i0 = i
        while i > 0:
            p = (i - 1) >> 1
            h = hq[p]
            th = pte[h]
            if th < t or (th == t and h < g):
                break
            hq[i] = h
            pos[h] = i
            i = p
        if i == i0:
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

    # -- the decodes on a GPU: g_dec[g*B : g*B + g_ndec[g]]; tokens: a min-heap by (r_dkey[r], r) (r_dpos: r's index)
    def _dremove(self, g: int, r: int, nd: int) -> None:
        """Take r out of g's decodes, which number nd once it is gone (the last one takes its place)."""
        dec = self.g_dec
        b = g * self.B
        last = dec[b + nd]
        j = b + nd
        if self.markov:  # no r_dpos: scanning g's slots is cheaper than a miss on the moved request's row
            while dec[j] != r:
                j -= 1
        else:
            j = self.r_dpos[r]
            self.r_dpos[last] = j
        dec[j] = last
        if not self.markov and j != b + nd:
            self._dsift(b, j - b, nd)

    def _dsift(self, b: int, i: int, n: int) -> None:
        """Restore the heap order of g_dec[b : b + n] (keys (r_dkey[r], r)) at index i."""
        dec, pos, key = self.g_dec, self.r_dpos, self.r_dkey
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
        self._anchor(g, kb)
        self.t_ta[g] = t  # = the anchor law's time of boundary kb (how the event was scheduled), exactly
        if self._pch is not None:  # KV peaks at a boundary: cached blocks give way
            self._pch.trim(g, self.t_kv[g])
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
                    kv_overflow_error(g, t, guard)
            if guard and self.g_cnt[g] == 0 and self._cb_freed is not None:
                # the evictions emptied g: no later completion there would let its controller admit again
                self._cb_freed(self, g)
        self._touch(g)

    # -- The exponential race and the event loop -------------------------------------------------
    def _draw_race(self) -> None:
        """Draw the race clock from now at the current total rate (exact by memorylessness)."""
        lam = self._lam
        self._lam_race = lam
        if lam > 1e-12:
            if self._exp_i >= _RNG_BLOCK:
                self._refill_exp()
            self._t_race = self._now + self._exp_block[self._exp_i] / lam
            self._exp_i += 1
        else:
            self._t_race = INF

    def _loop(self, stop: float) -> None:
        """The event loop, up to (not including) time ``stop`` or the horizon; locals saved on return."""
        hq, pte, pkb, g_pre = self._hq, self.t_pte, self.t_pkb, self.g_pre
        check, partial = self.check, stop < self.horizon
        uni_block, ui, rng_block = self._uni_block, self._uni_i, _RNG_BLOCK
        I, rate, mu_m, mu_s = self.I, self._rrate, self.mu_m, self.mu_s
        o0 = 0 if self.markov else 2 * I  # the race's order: prefills, decodes (markov only), waits; by class
        arr_t, arr_c, arr_p, arr_o = self._arr_t, self._arr_c, self._arr_p, self._arr_o
        na = len(arr_t)
        ai, ev, nd = self._ai, self._events, self._nd  # nd: events that can change the dynamics
        self._next_report = time.perf_counter() + 1.0
        # actions taken between two advance() calls: reschedule their GPUs; redraw the race clock
        # from now if they changed its rate (exact by memorylessness)
        if self._dirty:
            self._reschedule()
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
                self._arrive(ta, arr_c[ai], arr_p[ai], arr_o[ai])
                ai += 1
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
                rs, rsn, off = self._rs, self._rsn, self._rsoff  # (read here: a segment may grow in a handler)
                for o in range(o0, 3 * I):
                    s = o + I if o < 2 * I else o - 2 * I  # segments RACE_PREFILL, RACE_DECODE, RACE_WAIT
                    nl = rsn[s]
                    if nl:
                        m = rate[s]
                        a = m * nl
                        if u < a:
                            x = u / m
                            j = int(x)
                            j = j if j < nl else nl - 1  # (rounding: x can reach nl)
                            k = off[s] + 2 * j
                            r, g = rs[k], rs[k + 1]
                            if _COMPILED:  # the handler's and the next pick's cache misses, started now (engine.pxd)
                                _prefetch_race(self.r_phase, self.g_pre, self.g_dec, self.g_dcls, r, g, self.B, I, rs, rsn, off, rate, uni_block, ui, self._lam, o0)  # noqa: F821
                            if o >= 2 * I:
                                self._abandon(r, t)
                            elif o < I:
                                self._prefill_done(r, g, t)
                            else:
                                c = o - I
                                # thinning; the fractional part of x is a fresh uniform
                                if (x - j) * m < (mu_m[c] if g_pre[g] >= 0 else mu_s[c]):
                                    self._decode_done(r, g, t)
                            break
                        u -= a
                # (u beyond every segment: float drift of the incremental total rate, a null event)
            else:
                g = hq[0]
                if _COMPILED:  # (engine.pxd; no request yet: r = -1)
                    _prefetch_completion(self.r_phase, self.g_pre, self.g_dec, self.g_dcls, -1, g, self.B, I)  # noqa: F821
                tt = pte[g]
                self._hremove(g)
                kb = pkb[g]
                pkb[g] = -1  # consumed: the next _schedule(g) must reschedule
                self._now = tt
                if kb == _STARTUP:
                    self._online(g, tt)
                else:
                    self._gpu_event(g, kb, tt)
            if self._dirty:
                self._reschedule()
            nd += 1
            if not nd & 0xFFFF:
                self._lam = self._exact_lam()  # drop the incremental rate's float drift
            self._draw_race()
            tr = self._t_race
            if check:
                self.check_invariants()
            if self._pause:
                break
            if not ev & 1023 and self._every_1024(ev):  # Ctrl-C: stop; the progress line
                break
        self._events, self._nd, self._uni_i, self._ai = ev, nd, ui, ai
        self._pause = False
