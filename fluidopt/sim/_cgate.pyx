# cython: language_level=3, boundscheck=True, wraparound=False, initializedcheck=True, binding=False
"""Compiled fast path of the built-in gate-and-route controllers (docs/simulator.md section 9).

Built by setup.py next to the compiled engine core (``fluidopt.sim._cengine``) and against its
declarations (engine.pxd): the handlers below read the engine's state as typed C arrays and call its
actions at C level, instead of crossing the controller protocol in Python on every event. They are
line-for-line transcriptions of the Python handlers named in each comment (gate_and_route.py and
robust.py): the same decisions in the same order, the same GPU draws from the controller's stream, the
same floating-point arithmetic in the same order (compiled without fused multiply-adds), so a run gives
the same numbers bit for bit with or without them (tests/control/test_fast_path.py).

(The reference FCFS policy has no transcription: its handlers are written once, in
fluidopt/control/fcfs_handlers.py, and compiled from that file; docs/simulator.md section 9.)

fluidopt.sim.controller_fastpath decides when they run: only on the compiled engine, only for the exact
built-in classes listed in ``MIRRORS``, and only while the source of the Python methods they
transcribe hashes to the digest recorded there (an edited Python handler switches the fast path off
until this file is updated). Everything else (the pure-Python engine, a router's snapshot, a user's
subclass) runs the Python controller, which stays the reference.

The controller object stays the owner of its mutable state: the arrival counts of the rolling re-solve
(``_counts``, a 64-bit integer array that the fast handlers increment in place and ``on_tick`` resets in
place) and the overflow count (``_overflowing``, mirrored in the fast object, which alone changes it
during a run, and written through on every change) are kept on it, so Python handlers (``on_tick``) and
the fast ones share them. One exception: the SLI variant's time-averaged caps
(robust._AverageCaps: the caps, the integrals of X_i - n x_i*, the last counts and time) are read from
the controller once, at bind, and then live in the fast object, whose handlers stand in for every
Python method that updates them (gate_class, on_prefill_done, on_preempt, on_drop); the controller's
copy keeps its values from setup.
"""

cimport cython
from fluidopt.sim._cengine cimport Engine, GpuSet
from libc.math cimport INFINITY

# the protocol's constants (fluidopt.control.protocol, fluidopt.control.gate_and_route)
cdef Py_ssize_t PREFILL_QUEUE = 0
cdef Py_ssize_t DECODE_QUEUE = 1
cdef Py_ssize_t MIXED_POOL = 0
cdef Py_ssize_t SOLO_POOL = 1

# which Python handlers a FastGate stands in for
cdef enum:
    R_GREEDY = 0  # PartitionedController's on_arrival / on_prefill_done / on_slot_freed
    R_SLI = 1  # SLIGateAndRoute's on_prefill_done / on_slot_freed, PartitionedController's on_arrival
    R_ROBUST = 2  # robust._MechanismEvents
    R_FIWSP = 3  # paper_baselines.FIWSP (FCFS, decode in place; no gate)
    G_DEVIATION = 0  # PartitionedController.gate_class / robust._Mechanisms.gate_class
    G_PRIORITY = 1  # PrioritizeAndRoute.gate_class / robust.StaffedPrioritizeAndRoute.gate_class
ROUTE_GREEDY, ROUTE_SLI, ROUTE_ROBUST, ROUTE_FIWSP = R_GREEDY, R_SLI, R_ROBUST, R_FIWSP
GATE_DEVIATION, GATE_PRIORITY = G_DEVIATION, G_PRIORITY

# The Python methods each fast path transcribes, and the SHA-256 of their source
# (controller_fastpath.mirror_digest).
# Edit a listed method and its digest changes: the fast path then stays off for that class (the
# Python controller runs, same numbers, slower) and tests/control/test_fast_path.py fails until this
# file transcribes the new code and records the new digest.
_GREEDY_METHODS = ("on_arrival", "on_prefill_done", "on_slot_freed", "gate_class", "_admit_on", "_admit_all",
                   "_fits", "_greedy_place", "_pull_decodes")
_SLI_METHODS = _GREEDY_METHODS + ("_pool_for", "_prefill_slot_idle")
_ROBUST_METHODS = _GREEDY_METHODS + ("on_abandon", "on_preempt", "on_drop", "_holding", "_try_overflow",
                                     "_free_decode_slot", "_decode_slot_free_now", "_ahead", "_elastic_caps",
                                     "_bind_mechanisms", "_Mechanisms.on_tick")  # these two reset _counts
# robust.BackpressureSLIGateAndRoute: _AverageCaps wraps gate_class and on_prefill_done ("Owner.method":
# the wrapped method, found on the class's MRO) and handles on_preempt / on_drop
_SLI_AVG_METHODS = _SLI_METHODS + ("_Mechanisms.gate_class", "SLIGateAndRoute.on_prefill_done", "on_preempt",
                                   "on_drop", "setup", "_init_average_caps", "_avg_cap")
_FIWSP_METHODS = ("setup", "on_arrival", "on_prefill_done", "on_slot_freed", "_fits")
MIRRORS = {
    # class name: (routing, gate, methods, digest)
    "GateAndRoute": (ROUTE_GREEDY, GATE_DEVIATION, _GREEDY_METHODS, "de9825318d7c23adba9cf03d01ee5b98823c3c748dfa5d7e9ad267121188b12a"),
    "PrioritizeAndRoute": (ROUTE_GREEDY, GATE_PRIORITY, _GREEDY_METHODS, "d2ebdc43887ca48b34cb47a52bce6cbe25c15a74cc26d85ab8acd5e135530648"),
    "SLIGateAndRoute": (ROUTE_SLI, GATE_DEVIATION, _SLI_METHODS, "64abd9046b099cfb8ed52b6482a342a0db3bf8588b7ddf4a3f748196d950c3ee"),
    "BackpressureGateAndRoute": (ROUTE_ROBUST, GATE_DEVIATION, _ROBUST_METHODS, "db3d89d45f61d0dc50cf389b019d58eea5227dd8c969e901d3afef5504bf3af5"),
    "StaffedPrioritizeAndRoute": (ROUTE_ROBUST, GATE_PRIORITY, _ROBUST_METHODS, "50eff1eaef5f906fcec94b9bb3bf5fe0e0e2791b679957df0f83edb5a08b178e"),
    "FIWSP": (ROUTE_FIWSP, GATE_DEVIATION, _FIWSP_METHODS, "5c8feded22496a6c709640830819ee64dee0e76ad5d01bf70a2ed9e6cf8f8be4"),
    "BackpressureSLIGateAndRoute": (ROUTE_SLI, GATE_DEVIATION, _SLI_AVG_METHODS, "fc6b61167b7aaafac716a0357c9af3504dd0dbbeb29f92c07f882c1afc7ede99"),
}


def _gone():
    return None


cdef double[::1] _dbl(values):
    cdef double[::1] out = _array_d(len(values))
    cdef Py_ssize_t k
    for k in range(len(values)):
        out[k] = float(values[k])
    return out


cdef long long[::1] _lng(values):
    cdef long long[::1] out = _array_q(max(len(values), 1))
    cdef Py_ssize_t k
    for k in range(len(values)):
        out[k] = int(values[k])
    return out


def _array_d(n):
    from array import array
    return array("d", [0.0]) * max(int(n), 1)


def _array_q(n):
    from array import array
    return array("q", [0]) * max(int(n), 1)


cdef inline Py_ssize_t _r_choice(GpuSet s) except? -2:
    # GpuSet.choice (engine.py: self._items[int(self._rand() * self._len)] if self._len else -1) without
    # boxing the GPU id: the same call of the controller's stream, the same product, truncated alike
    cdef Py_ssize_t n = s._len
    if not n:
        return -1
    return s._items[<Py_ssize_t>(<double>s._rand() * <double>n)]


cdef class FastGate:
    """The fast handlers of one controller for runs on the compiled engine (see the module docstring)."""

    cdef readonly object ctrl
    cdef readonly int route, gate
    cdef Py_ssize_t I, NQ, QX, QYM, QYS, n, M
    cdef bint has_mixed, has_solo, kv
    # gate plan
    cdef Py_ssize_t nadm
    cdef long long[::1] adm  # deviation gate: the admissible classes; priority gate: its order
    cdef double[::1] nx, inv, nqp
    # robust options and plan
    cdef bint mech, bp, uncapped, fcfs, all_decodable, value_order, resolve
    cdef bint bp_events  # robust._MechanismEvents' self.backpressure (bp: the gate's)
    cdef Py_ssize_t max_overflow
    cdef double[::1] cap, ovcap, room
    cdef long long[::1] t_off, t_j  # the backpressure terms of class i: t_j/t_p[t_off[i]:t_off[i+1]]
    cdef double[::1] t_p
    cdef long long[::1] may_ovf, decodable, dorder
    cdef Py_ssize_t ndorder
    # robust._Mechanisms._elastic_plan / _elastic_caps: the overflow caps with the floating GPU
    cdef bint elastic_on
    cdef double[::1] ovcap_el
    # ... and with the floating capacity that follows the idle decode slots (elastic_slots)
    cdef bint slots_on
    cdef Py_ssize_t decode_slots
    cdef double[::1] float_room, ovcap_slots
    cdef long long[::1] float_cls
    # the robust section's run state (_attach, sync): the engine's pool sets, the controller's arrival counts
    # (an array incremented in place; counts_c: it is one) and its overflow count (mirrored, written through)
    cdef void* eng_id  # the engine the sets were read from (not a reference: no cycle through its callbacks)
    cdef GpuSet ip_mixed, ip_solo, fd_mixed, fd_solo
    cdef long long[::1] counts
    cdef bint counts_c
    cdef Py_ssize_t over
    # robust._AverageCaps (the SLI variant's time-averaged caps): its state lives here during a run
    cdef readonly bint avg
    cdef Py_ssize_t navg
    cdef long long[::1] avg_cls, avg_is, avg_lo, avg_x
    cdef double[::1] avg_floor, avg_int
    cdef double avg_t
    # SLI routing
    cdef double[::1] p_solo
    cdef long long[::1] buf

    def __init__(self, ctrl, int route, int gate, metrics_layout):
        self.ctrl = ctrl
        self.route = route
        self.gate = gate
        self.NQ, self.QX, self.QYM, self.QYS = metrics_layout
        self.sync()

    def __reduce__(self):
        return _gone, ()  # a copy or a pickle of the controller leaves the run's fast path behind

    def __deepcopy__(self, memo):
        return None

    def sync(self):
        """Read the controller's plan (after setup, and after every change of plan: robust re-solves)."""
        c = self.ctrl
        self.kv = bool(c._kv)
        if self.route == R_FIWSP:
            return
        self.I = int(c.n_classes)
        self.n = int(c.n_gpus)
        self.M = int(c.mixed_gpus)
        self.has_mixed = bool(c._has_mixed)
        self.has_solo = bool(c._has_solo)
        self.mech = self.route == R_ROBUST or hasattr(c, "_gate_plan")
        if self.mech:
            admissible, nx, inv, nqp, room, terms, fcfs, bp, uncapped = c._gate_plan
            if self.gate == G_PRIORITY:  # StaffedPrioritizeAndRoute.gate_class and _ahead read these
                room, terms, fcfs, bp, uncapped = (c._room, c._ahead_terms, c._fcfs_buffer, c.backpressure,
                                                   c._uncapped)
            self.room = _dbl(room)
            self.fcfs = bool(fcfs)
            self.bp = bool(bp)
            self.uncapped = bool(uncapped)
            self.cap = _dbl(c._cap)
            self.ovcap = _dbl(c._overflow_caps)
            off, js, ps = [0], [], []
            for i in range(self.I):
                for j, p in terms[i]:
                    js.append(j)
                    ps.append(p)
                off.append(len(js))
            self.t_off, self.t_j, self.t_p = _lng(off), _lng(js), _dbl(ps)
        else:
            admissible, nx, inv, nqp = c._admissible, c._nx, c._inv_x, c._nqp
            self.bp = False
            self.uncapped = True
            self.fcfs = True
            self.room = _dbl([0.0] * self.I)
            self.cap = self.ovcap = _dbl([float("inf")] * self.I)
            self.t_off, self.t_j, self.t_p = _lng([0] * (self.I + 1)), _lng([]), _dbl([])
        if self.gate == G_PRIORITY:
            admissible = c._order
        self.nadm = len(admissible)
        self.adm = _lng(admissible)
        self.nx, self.inv, self.nqp = _dbl(nx), _dbl(inv), _dbl(nqp)
        if self.route == R_ROBUST:
            self.all_decodable = bool(c._all_decodable)
            self.decodable = _lng([1 if d else 0 for d in c._decodable])
            self.value_order = not (c.decode_order == "fcfs" and c._all_decodable)
            order = c._decode_order if c._all_decodable else [i for i in c._decode_order if c._decodable[i]]
            self.ndorder = len(order)
            self.dorder = _lng(order)
            self.may_ovf = _lng([1 if v else 0 for v in c._may_overflow])
            self.max_overflow = int(c._max_overflow)
            self.resolve = bool(c.resolve)
            self.bp_events = bool(c.backpressure)
            self.over = int(c._overflowing)
            try:
                self.counts = c._counts  # robust._zero_counts: 64-bit integers, reset in place by on_tick
                self.counts_c = True
            except (TypeError, ValueError):
                self.counts_c = False
            # _elastic_caps: while no solo GPU runs a prefill, the floating classes' overflow cap is inf
            self.elastic_on = bool(getattr(c, "_elastic_on", False))
            if self.elastic_on:
                self.ovcap_el = _dbl([float("inf") if fl else cp for fl, cp in zip(c._float_classes, c._overflow_caps)])
            else:
                self.ovcap_el = self.ovcap
            self.slots_on = self.elastic_on and bool(getattr(c, "_slots_on", False))
            if self.slots_on:
                self.decode_slots = int(c._decode_slots)
                self.float_room = _dbl(c._float_room)
                self.float_cls = _lng([1 if fl else 0 for fl in c._float_classes])
                self.ovcap_slots = _dbl(c._overflow_caps)
        self.avg = False
        if self.route == R_SLI and self.mech and getattr(c, "_avg", None):
            # robust._AverageCaps (set up by _init_average_caps before fastpath.bind)
            avg = list(c._avg)
            self.avg = True
            self.navg = len(avg)
            self.avg_cls = _lng(avg)
            self.avg_is = _lng([1 if i in c._avg_x else 0 for i in range(self.I)])
            self.avg_lo = _lng([c._avg_lo.get(i, 0) for i in range(self.I)])
            self.avg_x = _lng([c._avg_x.get(i, 0) for i in range(self.I)])
            self.avg_floor = _dbl([c._avg_floor.get(i, 0.0) for i in range(self.I)])
            self.avg_int = _dbl([c._avg_int.get(i, 0.0) for i in range(self.I)])
            self.avg_t = float(c._avg_t)
        if self.route == R_SLI:
            self.p_solo = _dbl(c._p)
            self.buf = _lng(c._buf)

    # -- the view, typed ------------------------------------------------------------------------
    cdef inline Py_ssize_t _n_prefill(self, Engine e, Py_ssize_t i):
        return e._cnt[self.NQ * i + self.QX]

    cdef bint _fits(self, Engine e, Py_ssize_t r, Py_ssize_t g):
        # PartitionedController._fits: not kv or gpu_kv_free(g) >= req_prompt(r) + req_generated(r)
        if not self.kv:
            return True
        return e.gpu_kv_free(g) >= e.r_prompt[r] + e.req_generated(r)

    # -- gates ------------------------------------------------------------------------------------
    cdef _avg_cap(self, Engine e):
        # robust._AverageCaps._avg_cap
        cdef double now = e._now, dt, v
        cdef Py_ssize_t k, i, lo
        dt = now - self.avg_t
        self.avg_t = now
        for k in range(self.navg):
            i = self.avg_cls[k]
            v = self.avg_int[i] + (<double>self.avg_x[i] - self.nx[i]) * dt
            if self.avg_floor[i] > v:  # max(v, floor): v unless floor is larger
                v = self.avg_floor[i]
            self.avg_int[i] = v
            self.avg_x[i] = self._n_prefill(e, i)
            lo = self.avg_lo[i]
            self.cap[i] = <double>(lo + 1 if (v < 0 and <double>lo < self.nx[i]) else lo)

    cdef inline Py_ssize_t _gate(self, Engine e) except? -2:
        # the controller's gate_class with its own caps (self.cap unless uncapped); the SLI variant's
        # time-averaged caps: robust._AverageCaps.gate_class around it
        cdef Py_ssize_t i
        if self.avg:
            self._avg_cap(e)
            i = self._gate_with(e, &self.cap[0], not self.uncapped)
            if i >= 0 and self.avg_is[i]:
                self.avg_x[i] += 1  # the caller starts it now: X_i is one higher from here on
            return i
        return self._gate_with(e, &self.cap[0], not self.uncapped)

    cdef _pull_decodes_fcfs(self, Engine e, Py_ssize_t g, Py_ssize_t queue):
        # PartitionedController._pull_decodes
        cdef GpuSet free
        cdef Py_ssize_t r
        cdef Py_ssize_t pool = e.g_pool[g]
        while (<GpuSet>e._fd[pool])._pos[g] >= 0:
            r = e.head(queue, -1)
            if r < 0 or (self.kv and not self._fits(e, r, g)):
                return
            e.start_decode(r, g)

    # -- the typed helpers of every route (the plain controllers use them with their plan's constants) --------
    # The engine's pool sets are cached at the first event (_attach; pools are declared at setup only, so they
    # stay the same objects for the run); queue lengths, queue heads (Engine.head(q, i) for a class i >= 0 is
    # q_head[q I + i]) and X_i are read as C arrays; a GPU is drawn as GpuSet.choice draws it (_r_choice: the
    # same call of the controller's stream, without boxing the GPU id); the caps are passed as pointers (no
    # memoryview swapped per overflow attempt); the arrival counts of the re-solve are incremented in the
    # controller's array (robust._zero_counts) in place, and the overflow count is mirrored in C and written
    # through to the controller. Index checks are off where every index comes from the plan or the engine (a
    # class < I, a GPU of the fleet, a queue id). Same decisions, same draws, same arithmetic in the same order
    # as the Python handlers. One gate serves every route: a plain controller's plan has no backpressure and
    # infinite caps, so _gate_dev / _gate_pri reduce to PartitionedController.gate_class /
    # PrioritizeAndRoute.gate_class.

    cdef _attach(self, Engine e):
        # the engine's idle-prefill and free-decode sets of the two pools (_ip, _fd)
        self.eng_id = <void*>e
        self.ip_mixed = <GpuSet>e._ip[MIXED_POOL]
        self.fd_mixed = <GpuSet>e._fd[MIXED_POOL]
        if len(e._ip) > SOLO_POOL:
            self.ip_solo = <GpuSet>e._ip[SOLO_POOL]
            self.fd_solo = <GpuSet>e._fd[SOLO_POOL]
        else:  # a fleet too small for a solo pool declares only the mixed one (has_solo and max_overflow: 0)
            self.ip_solo = self.fd_solo = None

    @cython.boundscheck(False)
    @cython.initializedcheck(False)
    cdef inline bint _free_slot(self) noexcept:
        # robust._Mechanisms._free_decode_slot
        return (self.has_solo and self.fd_solo._len > 0) or (self.has_mixed and self.fd_mixed._len > 0)

    @cython.boundscheck(False)
    @cython.initializedcheck(False)
    cdef double _ahead(self, Engine e, Py_ssize_t i) noexcept:
        # robust._Mechanisms._ahead
        cdef double tot
        cdef Py_ssize_t k, j, NQ = self.NQ, QX = self.QX, I = e.I
        if self.fcfs:
            tot = <double>e.q_tot[DECODE_QUEUE]
            for k in range(self.t_off[i], self.t_off[i + 1]):
                tot += <double>e._cnt[NQ * self.t_j[k] + QX] * self.t_p[k]
        else:
            tot = 0.0
            for k in range(self.t_off[i], self.t_off[i + 1]):
                j = self.t_j[k]
                tot += <double>e.q_cnt[DECODE_QUEUE * I + j] + <double>e._cnt[NQ * j + QX] * self.t_p[k]
        return tot

    @cython.boundscheck(False)
    @cython.initializedcheck(False)
    cdef Py_ssize_t _gate_dev(self, Engine e, const double* cap, bint use_cap) noexcept:
        # robust._Mechanisms.gate_class (cap: the caps in use, consulted if use_cap)
        cdef Py_ssize_t best = -1, i, k, q, X, j, kk, waiting = 0
        cdef Py_ssize_t NQ = self.NQ, QX = self.QX, I = e.I
        cdef double best_dev = 0.0, best_tie = 0.0, dev, tie, tot
        cdef int free = -1  # -1: not asked yet
        for k in range(self.nadm):
            i = self.adm[k]
            q = e.q_cnt[PREFILL_QUEUE * I + i]
            if q == 0:
                continue
            X = e._cnt[NQ * i + QX]
            if use_cap and <double>X >= cap[i]:
                continue
            if self.bp:
                if free < 0:
                    waiting = e.q_tot[DECODE_QUEUE]
                    free = 1 if (waiting == 0 and self._free_slot()) else 0
                if not free:
                    if self.fcfs or not waiting:
                        tot = <double>waiting
                        for kk in range(self.t_off[i], self.t_off[i + 1]):
                            tot += <double>e._cnt[NQ * self.t_j[kk] + QX] * self.t_p[kk]
                    else:
                        tot = 0.0
                        for kk in range(self.t_off[i], self.t_off[i + 1]):
                            j = self.t_j[kk]
                            tot += <double>e.q_cnt[DECODE_QUEUE * I + j] + <double>e._cnt[NQ * j + QX] * self.t_p[kk]
                    if tot >= self.room[i]:
                        continue
            dev = (<double>X - self.nx[i]) * self.inv[i]
            tie = <double>q - self.nqp[i]
            if best < 0 or dev < best_dev or (dev == best_dev and tie > best_tie):
                best = i
                best_dev = dev
                best_tie = tie
        return best

    @cython.boundscheck(False)
    @cython.initializedcheck(False)
    cdef Py_ssize_t _gate_pri(self, Engine e, const double* cap, bint use_cap) noexcept:
        # robust.StaffedPrioritizeAndRoute.gate_class (cap: the caps in use, consulted if use_cap)
        cdef Py_ssize_t i, k, NQ = self.NQ, QX = self.QX, I = e.I
        cdef int free = -1
        for k in range(self.nadm):
            i = self.adm[k]
            if not e.q_cnt[PREFILL_QUEUE * I + i] or (use_cap and <double>e._cnt[NQ * i + QX] >= cap[i]):
                continue
            if self.bp:
                if free < 0:
                    free = 1 if (not e.q_tot[DECODE_QUEUE] and self._free_slot()) else 0
                if not free and self._ahead(e, i) >= self.room[i]:
                    continue
            return i
        return -1

    @cython.boundscheck(False)
    @cython.initializedcheck(False)
    cdef inline Py_ssize_t _gate_with(self, Engine e, const double* cap, bint use_cap) noexcept:
        # the subclass's gate_class: capped (the caps: self.cap unless uncapped) or not (the overflow caps)
        if self.gate == G_DEVIATION:
            return self._gate_dev(e, cap, use_cap)
        return self._gate_pri(e, cap, use_cap)

    @cython.boundscheck(False)
    @cython.initializedcheck(False)
    cdef bint _admit_on(self, Engine e, Py_ssize_t g) except -1:
        # PartitionedController._admit_on
        cdef Py_ssize_t i = self._gate(e), r
        if i < 0:
            return False
        r = e.q_head[PREFILL_QUEUE * e.I + i]
        if self.kv and not self._fits(e, r, g):
            return False
        e.start_prefill(r, g)
        return True

    cdef _admit_all(self, Engine e):
        # PartitionedController._admit_all and robust._MechanismEvents._admit_all (the same draws)
        cdef GpuSet idle = self.ip_mixed
        while idle._len:
            if not self._admit_on(e, _r_choice(idle)):
                return

    cdef bint _greedy_place(self, Engine e, Py_ssize_t r) except -1:
        # PartitionedController._greedy_place
        cdef Py_ssize_t g
        if self.has_solo:
            g = _r_choice(self.fd_solo)
            if g >= 0 and (not self.kv or self._fits(e, r, g)):
                e.start_decode(r, g)
                return True
        if self.has_mixed:
            g = _r_choice(self.fd_mixed)
            if g >= 0 and (not self.kv or self._fits(e, r, g)):
                e.start_decode(r, g)
                return True
        return False

    @cython.boundscheck(False)
    @cython.initializedcheck(False)
    cdef _r_pull_decodes(self, Engine e, Py_ssize_t g, Py_ssize_t queue):
        # robust._MechanismEvents._pull_decodes
        cdef GpuSet free
        cdef Py_ssize_t r, k, base = queue * e.I
        if not self.value_order:
            self._pull_decodes_fcfs(e, g, queue)
            return
        free = self.fd_mixed if g < self.M else self.fd_solo
        while g < free._pos.shape[0] and free._pos[g] >= 0:
            r = -1
            for k in range(self.ndorder):
                r = e.q_head[base + self.dorder[k]]
                if r >= 0:
                    break
            if r < 0 or (self.kv and not self._fits(e, r, g)):
                return
            e.start_decode(r, g)

    @cython.boundscheck(False)
    @cython.initializedcheck(False)
    cdef void _r_slots_caps(self, Engine e, Py_ssize_t over) noexcept:
        # robust._Mechanisms._elastic_caps with elastic_slots (into ovcap_slots)
        cdef Py_ssize_t used = over, j, i, NQ = self.NQ, QYM = self.QYM, QYS = self.QYS
        cdef double free
        for j in range(self.I):
            used += e._cnt[NQ * j + QYM] + e._cnt[NQ * j + QYS]
        free = <double>(self.decode_slots - used)
        for i in range(self.I):
            if self.float_cls[i] and self._ahead(e, i) < self.float_room[i] + free:
                self.ovcap_slots[i] = INFINITY
            else:
                self.ovcap_slots[i] = self.ovcap[i]

    @cython.boundscheck(False)
    @cython.initializedcheck(False)
    cdef _r_try_overflow(self, Engine e, Py_ssize_t g):
        # robust._Mechanisms._try_overflow (with _elastic_caps: the overflow caps in use)
        cdef GpuSet idle
        cdef Py_ssize_t h, i, r, over = self.over
        cdef const double* cap
        if over >= self.max_overflow:
            return
        idle = self.ip_solo
        while over < self.max_overflow:
            h = g if g >= 0 else _r_choice(idle)
            if h < 0 or not (h < idle._pos.shape[0] and idle._pos[h] >= 0):
                return
            if self.slots_on:
                # the floating capacity (robust._Mechanisms._elastic_caps with elastic_slots)
                self._r_slots_caps(e, over)
                cap = &self.ovcap_slots[0]
            elif self.elastic_on and over < 1:
                # the floating GPU (robust._Mechanisms._elastic_caps: no solo GPU runs a prefill)
                cap = &self.ovcap_el[0]
            else:
                cap = &self.ovcap[0]
            i = self._gate_with(e, cap, True)
            if i < 0:
                return
            r = e.q_head[PREFILL_QUEUE * e.I + i]
            if self.kv and not self._fits(e, r, h):
                return
            e.start_prefill(r, h)
            over += 1
            self.over = over
            self.ctrl._overflowing = over
            if g >= 0:
                return

    @cython.boundscheck(False)
    @cython.initializedcheck(False)
    cdef _r_arrival(self, Engine e, Py_ssize_t r):
        # robust._MechanismEvents.on_arrival
        cdef Py_ssize_t i = e.r_cls[r]
        cdef Py_ssize_t k = PREFILL_QUEUE * e.I + i  # class i's prefill queue
        if self.eng_id != <void*>e:
            self._attach(e)
        if self.resolve:
            if self.counts_c:
                self.counts[i] += 1
            else:  # a controller whose _counts is not robust._zero_counts' array (set by hand)
                counts = self.ctrl._counts
                counts[i] += 1
        e.enqueue(r, PREFILL_QUEUE)
        if e.q_cnt[k] > 1:
            return
        if self.has_mixed:
            self._admit_all(e)
        if self.max_overflow and self.may_ovf[i] and e.q_cnt[k]:
            self._r_try_overflow(e, -1)

    @cython.boundscheck(False)
    @cython.initializedcheck(False)
    cdef _r_prefill_done(self, Engine e, Py_ssize_t r, Py_ssize_t g):
        # robust._MechanismEvents.on_prefill_done
        if self.eng_id != <void*>e:
            self._attach(e)
        if g >= self.M:
            self.over -= 1  # the overflow GPU is solo again
            self.ctrl._overflowing = self.over
        if self.all_decodable or self.decodable[e.r_cls[r]]:
            self._greedy_place(e, r)

    @cython.boundscheck(False)
    @cython.initializedcheck(False)
    cdef _r_slot_freed(self, Engine e, Py_ssize_t g):
        # robust._MechanismEvents.on_slot_freed
        cdef bint mixed, judged, pending
        if self.eng_id != <void*>e:
            self._attach(e)
        if e.q_tot[DECODE_QUEUE]:
            self._r_pull_decodes(e, g, DECODE_QUEUE)
        if not e.q_tot[PREFILL_QUEUE]:
            return
        mixed = g < self.M
        judged = False
        pending = True
        if mixed and self.ip_mixed._pos[g] >= 0:
            judged = not self._admit_on(e, g)
            pending = judged or e.q_tot[PREFILL_QUEUE] != 0
        if not judged and pending and self.bp_events and self.has_mixed and self.ip_mixed._len:
            self._admit_all(e)
            pending = e.q_tot[PREFILL_QUEUE] != 0
        if self.max_overflow and not mixed and pending and self.ip_solo._pos[g] >= 0:
            self._r_try_overflow(e, g)

    # -- the handlers the engine calls (fastpath.bind installs them in place of the bound methods) -----
    def on_arrival(self, Engine e, Py_ssize_t r):
        cdef Py_ssize_t i, g, h
        cdef GpuSet idle
        if self.route == R_FIWSP:
            # paper_baselines.FIWSP.on_arrival
            idle = <GpuSet>e._ip[0]
            if e.q_tot[PREFILL_QUEUE] == 0:
                g = idle.choice()
                if g >= 0 and (not self.kv or self._fits(e, r, g)):
                    e.start_prefill(r, g)
                return
            e.enqueue(r, PREFILL_QUEUE)
            while idle._len:
                h = e.head(PREFILL_QUEUE, -1)
                g = idle.choice()
                if not self._fits(e, h, g):
                    break
                e.start_prefill(h, g)
                if e.q_tot[PREFILL_QUEUE] == 0:
                    break
            return
        if self.route != R_ROBUST:
            # PartitionedController.on_arrival
            if self.eng_id != <void*>e:
                self._attach(e)
            e.enqueue(r, PREFILL_QUEUE)
            if self.has_mixed:
                self._admit_all(e)
            return
        self._r_arrival(e, r)  # robust._MechanismEvents.on_arrival

    def on_prefill_done(self, Engine e, Py_ssize_t r, Py_ssize_t g):
        cdef Py_ssize_t pool, h
        cdef double p
        if self.route == R_GREEDY:
            # PartitionedController.on_prefill_done
            if self.eng_id != <void*>e:
                self._attach(e)
            self._greedy_place(e, r)
        elif self.route == R_FIWSP:
            # paper_baselines.FIWSP.on_prefill_done
            e.start_decode(r, g)
        elif self.route == R_ROBUST:
            self._r_prefill_done(e, r, g)  # robust._MechanismEvents.on_prefill_done
        else:
            # SLIGateAndRoute.on_prefill_done with SLIGateAndRoute._pool_for (after
            # robust._AverageCaps.on_prefill_done's _avg_cap)
            if self.avg:
                self._avg_cap(e)
            if not self.has_solo:
                pool = MIXED_POOL
            elif not self.has_mixed:
                pool = SOLO_POOL
            else:
                p = self.p_solo[e.r_cls[r]]
                if p >= 1.0:
                    pool = SOLO_POOL
                elif p <= 0.0:
                    pool = MIXED_POOL
                else:
                    pool = SOLO_POOL if e._ctrl_rng.random() < p else MIXED_POOL
            h = (<GpuSet>e._fd[pool]).choice()
            if h >= 0 and self._fits(e, r, h):
                e.start_decode(r, h)
            else:
                e.enqueue(r, self.buf[pool])

    def on_slot_freed(self, Engine e, Py_ssize_t g):
        cdef bint mixed, judged, pending
        cdef Py_ssize_t r
        if self.route == R_FIWSP:
            # paper_baselines.FIWSP.on_slot_freed
            if (<GpuSet>e._ip[0])._pos[g] >= 0:
                r = e.head(PREFILL_QUEUE, -1)
                if r >= 0 and (not self.kv or self._fits(e, r, g)):
                    e.start_prefill(r, g)
            return
        if self.eng_id != <void*>e:
            self._attach(e)
        if self.route == R_GREEDY:
            # PartitionedController.on_slot_freed
            if (<GpuSet>e._ip[e.g_pool[g]])._pos[g] >= 0:
                self._admit_on(e, g)
            if e.q_tot[DECODE_QUEUE]:
                self._pull_decodes_fcfs(e, g, DECODE_QUEUE)
            return
        if self.route == R_SLI:
            # SLIGateAndRoute.on_slot_freed with PartitionedController._prefill_slot_idle
            if e.g_pok[g] and e.g_pre[g] < 0 and e.B - e.g_cnt[g] > 0:
                self._admit_on(e, g)
            self._pull_decodes_fcfs(e, g, self.buf[e.g_pool[g]])
            return
        self._r_slot_freed(e, g)  # robust._MechanismEvents.on_slot_freed

    def on_abandon(self, Engine e, Py_ssize_t r, Py_ssize_t q):
        # robust._MechanismEvents.on_abandon with _holding
        if self.eng_id != <void*>e:
            self._attach(e)
        if q == DECODE_QUEUE and self.bp_events and self.has_mixed and e.q_tot[PREFILL_QUEUE] and self.ip_mixed._len:
            self._admit_all(e)

    def on_preempt(self, Engine e, Py_ssize_t r, Py_ssize_t g):
        # robust._MechanismEvents.on_preempt (= on_drop); the SLI variant: robust._AverageCaps.on_preempt
        cdef Py_ssize_t h, k = 0
        if self.route == R_SLI:
            if self.avg:
                self._avg_cap(e)
            return
        for h in range(self.M, self.n):
            if e.g_pre[h] >= 0:
                k += 1
        self.over = k
        self.ctrl._overflowing = k

    def on_drop(self, Engine e, Py_ssize_t r, Py_ssize_t g):
        # robust._MechanismEvents.on_drop and robust._AverageCaps.on_drop: both are on_preempt
        self.on_preempt(e, r, g)
