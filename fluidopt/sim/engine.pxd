# Static types for the compiled simulator core (an "augmenting" .pxd: engine.py stays plain Python).
#
# setup.py compiles a copy of engine.py with these declarations into fluidopt.sim._cengine; see
# fluidopt/sim/backend.py and docs/simulator.md section 9. Keep every attribute that engine.py sets on
# Engine or GpuSet, or that its cold modules (engine_setup, view, fleet, bookkeeping) set on an engine,
# declared here and public (a cdef class has no __dict__; tests/sim/test_sim_backends.py checks). Types
# are chosen so that the compiled core computes exactly what the Python engine computes: the state that
# engine.py keeps in lists (state.ints, state.floats) is typed arrays in the core (64-bit integers,
# doubles), declared here as C arrays;
# typed locals are Py_ssize_t or double (what a Python int in range and a Python float are); all
# else stays a Python object.
#
# setup.py compiles with wraparound=False (the engine never indexes from the end) and bounds checks
# on: GPU, request and queue ids that a controller passes in are checked as in Python.

cimport cython
# the prefix cache's compiled class (fluidopt/sim/prefix_cache.py with prefix_cache.pxd): typed, so that the
# kernel's calls into it are C calls with C integers (no attribute lookup, no boxing); setup.py builds the
# cache beside the core, and fluidopt.sim.backend runs the core only with a cache built from the sources on disk
from fluidopt.sim._c_prefix_cache cimport PrefixCache

# the counter layouts (engine.py binds them from fluidopt.sim.metrics) and state.py's constants: C integers
cdef Py_ssize_t NQ, Q_WP, Q_X, Q_WD, Q_YM, Q_YS, NC, C_ARRIVED, C_PREFILLED, C_COMPLETED, C_PREEMPTED
cdef Py_ssize_t C_AB_PREFILL, C_AB_DECODE, C_DROPPED, C_PREFILL_TOKENS, C_DONE_PROMPT, C_DONE_OUTPUT, _NREC
cdef Py_ssize_t REC_ID, REC_CLS, REC_ARRIVAL, REC_PROMPT, REC_OUTPUT, REC_OUTCOME, REC_END, REC_TTFT, REC_WAIT_PREFILL
cdef Py_ssize_t REC_WAIT_DECODE, REC_PREEMPTIONS, REC_PREFILL_GPU, REC_DECODE_GPU
cdef Py_ssize_t RACE_WAIT, RACE_PREFILL, RACE_DECODE
cdef Py_ssize_t G_ONLINE, G_STARTING, G_DRAINING, G_OFFLINE, _STARTUP
cdef bint _COMPILED

# A completion's handler reads the request's row (three cache lines), its GPU's row (two), decode
# slots and per-class decode counts: at large fleets each is a miss to DRAM, and prefetching them all
# as soon as the race has picked (request, GPU), or the GPU heap has given its GPU (r = -1: its
# request is not known yet), makes them one latency instead of several in a row. A race pick also
# prefetches the pair that the next race pick would take if nothing changed (its uniform is already
# drawn): the current event moves that pick, by a few pairs or (a prefill completion) by many, so the
# guess is the right cache line about half the time, and then a whole event early. Prefetches are
# hints: no result depends on them (the Python engine skips the calls).
cdef extern from *:
    """
    #define _FO_PF(a, i, o) __builtin_prefetch((a).data + (i) * (a).strides[0] + (o))
    #define _prefetch_completion(rp, gp, gd, gc, r, g, b, ni) do { \
        if ((r) >= 0) { _FO_PF(rp, r, 0); _FO_PF(rp, r, 64); _FO_PF(rp, r, 128); } \
        _FO_PF(gp, g, 0); _FO_PF(gp, g, 64); \
        _FO_PF(gd, (g) * (b), 0); _FO_PF(gd, (g) * (b), 64); _FO_PF(gc, (g) * (ni), 0); } while (0)
    #define _FO_AT(a, T, i) (*(T *)((a).data + (i) * (a).strides[0]))
    #define _prefetch_next_pick(rs, rsn, off, rate, u0, o0, ni) do { \
        double _u = (u0); Py_ssize_t _o, _s, _j; long long _nl; double _m; \
        for (_o = (o0); _o < 3 * (ni); _o++) { \
            _s = _o < 2 * (ni) ? _o + (ni) : _o - 2 * (ni); _nl = _FO_AT(rsn, long long, _s); \
            if (_nl) { _m = _FO_AT(rate, double, _s); \
                if (_u < _m * _nl) { _j = (Py_ssize_t)(_u / _m); if (_j >= _nl) _j = _nl - 1; \
                    _FO_PF(rs, _FO_AT(off, long long, _s) + 2 * _j, 0); break; } \
                _u -= _m * _nl; } } } while (0)
    #define _prefetch_race(rp, gp, gd, gc, r, g, b, ni, rs, rsn, off, rate, ub, ui, lam, o0) do { \
        if ((g) >= 0) _prefetch_completion(rp, gp, gd, gc, r, g, b, ni); \
        if ((ui) < (ub).shape[0]) _prefetch_next_pick(rs, rsn, off, rate, _FO_AT(ub, double, ui) * (lam), o0, ni); } while (0)
    """
    void _prefetch_completion(long long[:] rp, long long[:] gp, long long[::1] gd, long long[::1] gc,
                              Py_ssize_t r, Py_ssize_t g, Py_ssize_t b, Py_ssize_t ni)
    void _prefetch_race(long long[:] rp, long long[:] gp, long long[::1] gd, long long[::1] gc, Py_ssize_t r,
                        Py_ssize_t g, Py_ssize_t b, Py_ssize_t ni, int[::1] rs, long long[::1] rsn, long long[::1] off,
                        double[::1] rate, double[::1] ub, Py_ssize_t ui, double lam, Py_ssize_t o0)
# the protocol's phases and queues (a Python global would cost a dict lookup and a boxed compare)
cdef Py_ssize_t DECODE, PREFILL, WAIT_DECODE, WAIT_PREFILL, NO_REQUEST, DECODE_QUEUE, PREFILL_QUEUE, _GONE


@cython.final
cdef class GpuSet:
    cdef public long long[::1] _items, _pos
    cdef public Py_ssize_t _len
    cdef public object _rand

    @cython.locals(n=Py_ssize_t)
    cpdef Py_ssize_t choice(self) except? -2

    cpdef bint has(self, Py_ssize_t g)  # the protocol's GpuSet.has: a C-level membership test

    @cython.locals(n=Py_ssize_t)
    cpdef _add(self, Py_ssize_t g)

    @cython.locals(pos="long long[::1]", p=Py_ssize_t, last=Py_ssize_t, n=Py_ssize_t)
    cpdef _discard(self, Py_ssize_t g)


@cython.final
cdef class Engine:
    cdef public object scenario, controller, workload, _service, seed, _class_names, engine_name
    cdef public double horizon, warmup, alpha, beta, tau_mix, tau_solo, kap, _now, _lam, _t_race, _lam_race, _t_sample, _t_tick, _wall0
    cdef public double _next_report
    cdef public Py_ssize_t n, B, I, C, kvcap, _gbase, _n_pools, _serial, _seq_back, _seq_front, _ai, _arrival_chunk, _bi
    cdef public Py_ssize_t _exp_i, _uni_i, _events, _nd
    cdef public bint check, markov, chunked, progress, _in_setup, _interrupted, _stop, _started, _done, _pause, _finished
    cdef public bint handle_sigint, _law, _lin  # _law: gpu.timemodel (timelaw.py); _lin: the clock is linear
    cdef public object _lawc
    cdef public double[::1] l_q, l_last
    cdef public long long[::1] l_w
    cdef public object _work_rng, _np_rng, _ctrl_rng, _arr_iter, collector, sample_interval, tick_interval, _records
    cdef public object _qindex
    cdef public PrefixCache _pc, _pch  # the prefix cache (fluidopt.sim.prefix_cache), None when off; _pch: with a KV capacity
    cdef public object _cb_arrival, _cb_pdone, _cb_ddone, _cb_abandon, _cb_preempt, _cb_drop, _cb_freed
    cdef public double[::1] _exp_block, _uni_block, theta, mu_p, mu_m, mu_s, mbar, _rrate  # state.doubles, block
    cdef public list _cp, _cd, _mean_prompt, _mean_output
    cdef public list _free
    # per-request state (recycled slots): typed arrays in the core, replaced when they grow
    # (strided views of one row block, _rows: state.set_typed_state)
    cdef public long long[:] r_cls, r_prompt, r_output, r_phase, r_q, r_gpu, r_next, r_prev, r_seq, r_pos, r_dpos, r_dkey
    cdef public long long[:] r_serial, r_gen, r_dstart, r_npre, r_pg, r_dg
    cdef public double[:] r_arr, r_tw, r_wp, r_wd, r_ttft
    cdef public object _rows
    cdef public int[::1] _rs  # the exponential race's request sets: (request, GPU) pairs, 32-bit (state.pairs)
    cdef public long long[::1] _rsn, _rsoff, _rscap
    cdef public list _ip, _fd, _dirty
    cdef public long long[::1] _hq, _hpos  # the GPU event heap
    cdef public Py_ssize_t _hn
    cdef public long long[::1] g_dcls, q_head, q_tail, q_cnt, q_tot
    # per-GPU state (state.GPU_FIELDS: strided views of one row block, _gpu_rows: state.set_typed_state),
    # then counters and the GPUs' decode slots
    cdef public long long[:] g_pre, g_ndec, g_cnt, g_pool, g_pok, g_maxd, g_state, _isdirty
    cdef public long long[:] t_ka, t_dca, t_kv, t_adv, t_pend, t_pkb
    cdef public double[:] t_ta, t_itl
    cdef public object _gpu_rows
    cdef public long long[::1] _cnt, _ctr, g_dec
    cdef public double[::1] t_pte, _acc, _rec
    cdef public Py_ssize_t _nrec
    cdef public list _qnames, _bounds, _samples
    cdef public double[::1] _arr_t
    cdef public long long[::1] _arr_c, _arr_p, _arr_o
    # the fleet (cold: a fixed fleet only reads g_state, above, where a GPU empties, and t_pkb's start-up
    # mark); r_host: a request evicted to host memory
    cdef public long long[:] r_host
    cdef public Py_ssize_t _fleet_on
    cdef public double _fleet_acc, _startup, _swap
    cdef public bint _fleet_used
    cdef public list _fleet_log
    cdef public dict _saved

    # -- actions called by controllers (Python-visible; arguments stay objects: they are validated) --
    cpdef start_prefill(self, r, g)

    cpdef start_decode(self, r, g)

    @cython.locals(old=Py_ssize_t, c=Py_ssize_t)
    cpdef enqueue(self, r, q, front=*)

    @cython.locals(I=Py_ssize_t, qh="long long[::1]", a=Py_ssize_t, b=Py_ssize_t, seq="long long[:]", best=Py_ssize_t,
                   bs=Py_ssize_t, k=Py_ssize_t, r=Py_ssize_t)
    cpdef Py_ssize_t head(self, Py_ssize_t q, Py_ssize_t cls=*) except? -2

    # -- the view's O(1) reads, called by controllers on every event: typed arguments; the ones a
    # compiled handler (gate_handlers.pxd, fcfs_handlers.pxd) calls per event return C integers (no boxing;
    # -2 is never a value, so that it can flag an exception) --------------------------------------
    cpdef Py_ssize_t qlen(self, Py_ssize_t q, Py_ssize_t cls=*) except? -2
    cpdef Py_ssize_t n_prefill(self, Py_ssize_t i) except? -2
    cpdef Py_ssize_t n_decode_mixed(self, Py_ssize_t i) except? -2
    cpdef Py_ssize_t n_decode_solo(self, Py_ssize_t i) except? -2
    cpdef n_wait_prefill(self, Py_ssize_t i)
    cpdef n_wait_decode(self, Py_ssize_t i)
    cpdef Py_ssize_t gpu_prefill(self, Py_ssize_t g) except? -2
    cpdef gpu_decodes(self, Py_ssize_t g)
    cpdef Py_ssize_t gpu_free(self, Py_ssize_t g) except? -2
    cpdef Py_ssize_t gpu_pool(self, Py_ssize_t g) except? -2
    cpdef bint gpu_prefill_allowed(self, Py_ssize_t g) except -1
    cpdef gpu_max_decodes(self, Py_ssize_t g)
    cpdef GpuSet idle_prefill(self, Py_ssize_t pool=*)
    cpdef GpuSet free_decode(self, Py_ssize_t pool=*)
    cpdef Py_ssize_t req_class(self, Py_ssize_t r) except? -2
    cpdef Py_ssize_t req_prompt(self, Py_ssize_t r) except? -2
    cpdef req_output(self, Py_ssize_t r)
    cpdef req_arrival(self, Py_ssize_t r)
    cpdef req_phase(self, Py_ssize_t r)
    cpdef req_gpu(self, Py_ssize_t r)
    cpdef instance_requests(self, Py_ssize_t g)
    # tokens mode: the KV and output-token reads (load balancers and the RL state call them per event)
    @cython.locals(t=double, m=Py_ssize_t)
    cpdef gpu_kv_used(self, Py_ssize_t g)
    @cython.locals(g=Py_ssize_t, now=double, dc=Py_ssize_t, k=Py_ssize_t)
    cpdef req_generated(self, Py_ssize_t r)

    # -- internal ---------------------------------------------------------------------------------
    @cython.locals(t=double, c=Py_ssize_t, markov=bint, n0=Py_ssize_t, ptok=Py_ssize_t, w=Py_ssize_t, ka=Py_ssize_t, s=GpuSet)
    cdef _start_prefill(self, Py_ssize_t r, Py_ssize_t g)

    @cython.locals(t=double, c=Py_ssize_t, markov=bint, n0=Py_ssize_t, nd=Py_ssize_t, k=Py_ssize_t)
    cdef _start_decode(self, Py_ssize_t r, Py_ssize_t g)

    # (cpdef: also called from the cold modules, fleet.py and view.py)
    @cython.locals(c=Py_ssize_t, markov=bint, back=Py_ssize_t, gen=Py_ssize_t)
    cpdef _evict(self, Py_ssize_t r, Py_ssize_t g, double t, bint host)

    cdef _bump(self, Py_ssize_t k, Py_ssize_t d, double t)
    cdef _touch(self, Py_ssize_t g)

    @cython.locals(g=Py_ssize_t)
    cdef _reschedule(self)

    cdef _prefill_leaves(self, Py_ssize_t r, Py_ssize_t g, Py_ssize_t c, double t)

    @cython.locals(nd=Py_ssize_t)
    cdef _decode_leaves(self, Py_ssize_t r, Py_ssize_t g, Py_ssize_t c, double t)

    @cython.locals(n1=Py_ssize_t)
    cdef _slot_left(self, Py_ssize_t g, double t)

    @cython.locals(base=Py_ssize_t, c=Py_ssize_t, d=Py_ssize_t)
    cdef _switch_mode(self, Py_ssize_t g, bint mixed, double t)

    @cython.locals(p=Py_ssize_t, room=bint, s=GpuSet)
    cpdef _refresh(self, Py_ssize_t g)

    @cython.locals(k=Py_ssize_t, h=Py_ssize_t, tl=Py_ssize_t)
    cdef _q_push(self, Py_ssize_t r, Py_ssize_t q, bint front)

    @cython.locals(k=Py_ssize_t, p=Py_ssize_t, nx=Py_ssize_t)
    cdef _q_remove(self, Py_ssize_t r, Py_ssize_t q)

    @cython.locals(c=Py_ssize_t)
    cdef _enqueue_new(self, Py_ssize_t r, Py_ssize_t q)

    cdef _dequeue(self, Py_ssize_t r, Py_ssize_t c)

    cdef _leave_wait(self, Py_ssize_t r, Py_ssize_t c, double t, Py_ssize_t qk)

    @cython.locals(n=Py_ssize_t, k=Py_ssize_t)
    cdef _race_add(self, Py_ssize_t r, Py_ssize_t s, Py_ssize_t g)

    @cython.locals(rs="int[::1]", b=Py_ssize_t, n=Py_ssize_t, j=Py_ssize_t, last=Py_ssize_t)
    cdef _race_remove(self, Py_ssize_t r, Py_ssize_t s)

    # (cpdef: results.py writes the rows of the requests still in the system with it)
    cpdef _write_record(self, Py_ssize_t k, Py_ssize_t r, Py_ssize_t c, Py_ssize_t outcome, double t)

    cdef _resolve(self, Py_ssize_t r, Py_ssize_t outcome, double t)

    @cython.locals(free=list, r=Py_ssize_t, s=Py_ssize_t, r_phase="long long[:]")
    cdef _arrive(self, double t, Py_ssize_t c, Py_ssize_t prompt, Py_ssize_t output)

    @cython.locals(c=Py_ssize_t, r_phase="long long[:]")
    cdef _prefill_done(self, Py_ssize_t r, Py_ssize_t g, double t)

    @cython.locals(c=Py_ssize_t, out=Py_ssize_t, prompt=Py_ssize_t, ctr="long long[::1]", k=Py_ssize_t)
    cdef _decode_done(self, Py_ssize_t r, Py_ssize_t g, double t)

    @cython.locals(c=Py_ssize_t, q=Py_ssize_t, ph=Py_ssize_t)
    cdef _abandon(self, Py_ssize_t r, double t)

    # tokens mode: a GPU's clock
    @cython.locals(m=Py_ssize_t, te=double)
    cpdef double _time_at(self, Py_ssize_t g, Py_ssize_t k)

    @cython.locals(ta=double, itl=double, m=Py_ssize_t, a=double, bq=double, x=double, ka=Py_ssize_t)
    cpdef Py_ssize_t _boundary_after(self, Py_ssize_t g, double t)

    @cython.locals(m=Py_ssize_t)
    cdef _anchor(self, Py_ssize_t g, Py_ssize_t k)

    cpdef _join(self, Py_ssize_t g, double t)

    cdef _join_with(self, Py_ssize_t g, double t, Py_ssize_t tokens, Py_ssize_t r, bint prefill)

    @cython.locals(ka=Py_ssize_t, kb=Py_ssize_t, kd=Py_ssize_t, nd=Py_ssize_t, ko=Py_ssize_t, te=double)
    cdef _schedule(self, Py_ssize_t g)

    @cython.locals(r=Py_ssize_t, ptok=Py_ssize_t)
    cdef _law_set(self, Py_ssize_t g)

    @cython.locals(lam=double)
    cdef _draw_race(self)

    @cython.locals(i=Py_ssize_t)
    cpdef _hset(self, Py_ssize_t g, double te)

    @cython.locals(i=Py_ssize_t, n=Py_ssize_t, last=Py_ssize_t)
    cpdef _hremove(self, Py_ssize_t g)

    @cython.locals(hq="long long[::1]", pos="long long[::1]", pte="double[::1]", n=Py_ssize_t, g=Py_ssize_t, t=double,
                   i0=Py_ssize_t, p=Py_ssize_t, c=Py_ssize_t, h=Py_ssize_t, th=double, h2=Py_ssize_t, t2=double)
    cdef _hsift(self, Py_ssize_t i)

    @cython.locals(dec="long long[::1]", j=Py_ssize_t, b=Py_ssize_t, last=Py_ssize_t)
    cdef _dremove(self, Py_ssize_t g, Py_ssize_t r, Py_ssize_t nd)

    @cython.locals(dec="long long[::1]", pos="long long[:]", key="long long[:]", r=Py_ssize_t, k=Py_ssize_t,
                   i0=Py_ssize_t, p=Py_ssize_t, h=Py_ssize_t, kh=Py_ssize_t, c=Py_ssize_t, h2=Py_ssize_t, k2=Py_ssize_t)
    cdef _dsift(self, Py_ssize_t b, Py_ssize_t i, Py_ssize_t n)

    @cython.locals(dc=Py_ssize_t, b=Py_ssize_t, r=Py_ssize_t, guard=Py_ssize_t)
    cdef _gpu_event(self, Py_ssize_t g, Py_ssize_t kb, double t)

    # (cpdef: bookkeeping.advance calls it)
    @cython.locals(hq="long long[::1]", pte="double[::1]", t_house=double, check=bint, uni_block="double[::1]", ui=Py_ssize_t,
                   ev=Py_ssize_t, pkb="long long[:]", rng_block=Py_ssize_t, I=Py_ssize_t, rs="int[::1]", rsn="long long[::1]",
                   off="long long[::1]", s=Py_ssize_t, rate="double[::1]", mu_m="double[::1]", mu_s="double[::1]", o0=Py_ssize_t, o=Py_ssize_t,
                   g_pre="long long[:]",
                   arr_t="double[::1]", arr_c="long long[::1]", arr_p="long long[::1]", arr_o="long long[::1]", ai=Py_ssize_t, na=Py_ssize_t, tr=double,
                   nd=Py_ssize_t, ta=double, tg=double, t=double, done=bint, ticked=bint, k=Py_ssize_t, u=double,
                   c=Py_ssize_t, nl=Py_ssize_t, a=double, j=Py_ssize_t, r=Py_ssize_t, m=double, x=double,
                   g=Py_ssize_t, tt=double, kb=Py_ssize_t, partial=bint)
    cpdef _loop(self, double stop)
