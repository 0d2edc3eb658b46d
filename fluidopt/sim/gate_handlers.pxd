# Static types for fluidopt/control/gate_handlers.py compiled as fluidopt.sim._c_gate_handlers (an "augmenting"
# .pxd, as fcfs_handlers.pxd: the handlers stay plain Python, and this file is their only Cython). The context
# is the compiled Engine (its reads and actions are C-level calls), the per-class plan is C arrays (the
# controller's array('d') / array('q') objects, shared), the locals are C numbers. setup.py compiles the
# module without fused multiply-adds, so every sum and product rounds as in Python.
# Keep every local of a handler typed here (one type per name) and every attribute in STATE declared.

cimport cython
from fluidopt.sim._cengine cimport Engine, GpuSet

cdef Py_ssize_t PREFILL_QUEUE, DECODE_QUEUE, MIXED_POOL, SOLO_POOL, ROUTE_GREEDY, ROUTE_SLI, ROUTE_ROBUST
cdef Py_ssize_t COUNTS_PER_CLASS, COUNT_PREFILL, COUNT_DECODE_MIXED, COUNT_DECODE_SOLO
cdef Py_ssize_t NO_CAPS, OWN_CAPS, OVERFLOW_CAPS
cdef double INF


@cython.final
cdef class GateHandlers:
    # the fleet and the route
    cdef public bint _kv, _has_mixed, _has_solo
    cdef public Py_ssize_t mixed_gpus, n_gpus, _route
    cdef public GpuSet _idle_mixed, _idle_solo, _free_mixed, _free_solo  # None: a pool not declared
    # the live counts (the engine's own arrays: Engine._cnt, q_cnt, q_tot) and the number of classes
    cdef public long long[::1] _class_counts, _queue_counts, _queue_totals
    cdef public Py_ssize_t _n_cls
    # the gate
    cdef public bint _priority_gate, _bp, _uncapped, _fcfs_buffer
    cdef public long long[::1] _adm, _t_off, _t_j
    cdef public double[::1] _nx, _inv_x, _nqp, _cap, _room, _t_p
    # the robust events
    cdef public bint resolve, _all_decodable, _value_order, _elastic_on, _slots_on
    cdef public Py_ssize_t _max_overflow, _decode_slots
    cdef public long long[::1] _counts, _decodable, _dorder, _may_overflow, _over, _float_cls
    cdef public double[::1] _overflow_caps, _ovcap_el, _float_room, _ovcap_now
    # the SLI route and its time-averaged caps
    cdef public bint _avg_on
    cdef public long long[::1] _buf, _avg, _avg_is, _avg_lo, _avg_x
    cdef public double[::1] _p, _avg_floor, _avg_int, _avg_t
    # scratch of one decision
    cdef public Py_ssize_t _free_now

    # -- the live counts: C array reads (the state check has checked their sizes)
    cdef inline Py_ssize_t _qlen(self, Py_ssize_t q, Py_ssize_t i) noexcept

    cdef inline Py_ssize_t _qtot(self, Py_ssize_t q) noexcept

    cdef inline Py_ssize_t _class_count(self, Py_ssize_t i, Py_ssize_t k) noexcept

    # -- the gate
    @cython.locals(i=Py_ssize_t, caps=Py_ssize_t)
    cpdef Py_ssize_t gate_class(self, Engine ctx, bint capped=*) except? -2

    cdef inline Py_ssize_t _gate(self, Engine ctx, Py_ssize_t caps) except? -2

    cdef inline bint _over_cap(self, Py_ssize_t caps, Py_ssize_t i, Py_ssize_t X) except -1

    @cython.locals(best=Py_ssize_t, best_dev=double, best_tie=double, k=Py_ssize_t, i=Py_ssize_t, q=Py_ssize_t,
                   X=Py_ssize_t, dev=double, tie=double)
    cdef Py_ssize_t _gate_deviation(self, Engine ctx, Py_ssize_t caps) except? -2

    @cython.locals(k=Py_ssize_t, i=Py_ssize_t)
    cdef Py_ssize_t _gate_priority(self, Engine ctx, Py_ssize_t caps) except? -2

    cdef inline bint _held_back(self, Engine ctx, Py_ssize_t i) except -1

    cdef inline bint _decode_slot_free_now(self, Engine ctx) except -1

    cdef inline bint _free_decode_slot(self, Engine ctx) except -1

    @cython.locals(tot=double, k=Py_ssize_t, j=Py_ssize_t)
    cdef inline double _ahead_of(self, Py_ssize_t i) noexcept

    @cython.locals(now=double, dt=double, k=Py_ssize_t, i=Py_ssize_t, v=double, lo=Py_ssize_t)
    cpdef _avg_cap(self, Engine ctx)

    # -- admission
    cpdef bint _fits(self, Engine ctx, Py_ssize_t r, Py_ssize_t g) except -1

    @cython.locals(i=Py_ssize_t, r=Py_ssize_t)
    cpdef bint _admit_on(self, Engine ctx, Py_ssize_t g) except -1

    @cython.locals(idle=GpuSet)
    cpdef _admit_all(self, Engine ctx)

    cpdef bint _prefill_slot_idle(self, Engine ctx, Py_ssize_t g) except -1

    @cython.locals(idle=GpuSet, h=Py_ssize_t, i=Py_ssize_t, r=Py_ssize_t, elastic=bint, j=Py_ssize_t)
    cpdef _try_overflow(self, Engine ctx, Py_ssize_t g=*)

    @cython.locals(used=Py_ssize_t, j=Py_ssize_t, free=Py_ssize_t, i=Py_ssize_t)
    cpdef _slots_caps(self, Engine ctx)

    # -- routing
    @cython.locals(kv=bint, g=Py_ssize_t)
    cpdef bint _greedy_place(self, Engine ctx, Py_ssize_t r) except -1

    @cython.locals(p=double)
    cpdef Py_ssize_t _pool_for(self, Engine ctx, Py_ssize_t i) except? -2

    @cython.locals(free=GpuSet, kv=bint, r=Py_ssize_t, k=Py_ssize_t)
    cpdef _pull_decodes(self, Engine ctx, Py_ssize_t g, Py_ssize_t queue)

    # -- events
    @cython.locals(i=Py_ssize_t)
    cpdef on_arrival(self, Engine ctx, Py_ssize_t r)

    @cython.locals(route=Py_ssize_t, pool=Py_ssize_t, h=Py_ssize_t)
    cpdef on_prefill_done(self, Engine ctx, Py_ssize_t r, Py_ssize_t g)

    @cython.locals(route=Py_ssize_t, mixed=bint, judged=bint, pending=bint)
    cpdef on_slot_freed(self, Engine ctx, Py_ssize_t g)

    cpdef on_abandon(self, Engine ctx, Py_ssize_t r, Py_ssize_t q)

    cpdef bint _holding(self, Engine ctx) except -1

    @cython.locals(k=Py_ssize_t, h=Py_ssize_t)
    cpdef on_preempt(self, Engine ctx, Py_ssize_t r, Py_ssize_t g)

    cpdef on_drop(self, Engine ctx, Py_ssize_t r, Py_ssize_t g)
