# Static types for fluidopt/sim/prefix_cache.py compiled as fluidopt.sim._c_prefix_cache (an "augmenting" .pxd:
# the cache stays plain Python, and this file is its only Cython). setup.py copies both into the build tree
# under the compiled module's name; fluidopt.sim.prefix_cache.make_prefix_cache gives the compiled core the
# compiled class while its digest matches the two files on disk (the Python engine keeps the Python class:
# the differential tests compare the two). The kernel calls start / leave / decode_start / decode_leaves /
# trim with C integers; the block sets stay Python sets, dicts and OrderedDicts (C-level calls on them).
# Keep every attribute declared here and every local of a hot method typed (one type per name).

cimport cython


@cython.final
cdef class PrefixCache:
    cdef public list off, flat, blocks, free, cached, gpu_of, cls_of, prompt_of
    cdef public dict run
    cdef public Py_ssize_t bs, lim, C, n_classes, evictions, U
    cdef public bint chunked, dense, lru
    cdef public int[::1] holders, prv, nxt  # lru: per (GPU, block) slot; holders -1 when not cached
    cdef public long long[::1] head, tail, nfree  # lru: per GPU
    cdef public long long[::1] ids  # every request's block ids, renumbered 0 .. U - 1
    cdef public unsigned char[::1] present  # dense: [g * U + id] = 1 when present on g

    @cython.locals(lim=Py_ssize_t, k=Py_ssize_t, h=list, cached=Py_ssize_t, work=Py_ssize_t)
    cpdef Py_ssize_t start(self, Py_ssize_t s, Py_ssize_t g, Py_ssize_t ptok, Py_ssize_t prompt, Py_ssize_t kv) except? -1

    @cython.locals(st=tuple, o=Py_ssize_t, n_ids=Py_ssize_t, k=Py_ssize_t, cached=Py_ssize_t, prompt=Py_ssize_t,
                   done=Py_ssize_t, i=Py_ssize_t, chunks=Py_ssize_t, tok=Py_ssize_t, h=list, blocks=object, free=object,
                   j=Py_ssize_t, b=object, n=object, ids="long long[::1]", pres="unsigned char[::1]", base=Py_ssize_t,
                   hold="int[::1]", x=Py_ssize_t)
    cpdef leave(self, Py_ssize_t s, Py_ssize_t g, Py_ssize_t remaining, Py_ssize_t c)

    @cython.locals(h=list, k=Py_ssize_t)
    cpdef decode_start(self, Py_ssize_t s, Py_ssize_t g, Py_ssize_t kv, Py_ssize_t tokens)

    @cython.locals(st=tuple)
    cpdef decode_leaves(self, Py_ssize_t s, Py_ssize_t g)

    cpdef trim(self, Py_ssize_t g, Py_ssize_t kv)

    cpdef list _ids(self, Py_ssize_t s)

    @cython.locals(t=Py_ssize_t)
    cdef _link(self, Py_ssize_t g, Py_ssize_t x)

    @cython.locals(p=Py_ssize_t, q=Py_ssize_t)
    cdef _unlink(self, Py_ssize_t g, Py_ssize_t x)

    @cython.locals(ids="long long[::1]", hold="int[::1]", base=Py_ssize_t, o=Py_ssize_t, e=Py_ssize_t, j=Py_ssize_t)
    cpdef Py_ssize_t _lru_run(self, Py_ssize_t s, Py_ssize_t g) except? -1

    @cython.locals(ids="long long[::1]", hold="int[::1]", base=Py_ssize_t, o=Py_ssize_t, j=Py_ssize_t, x=Py_ssize_t)
    cpdef _lru_hold(self, Py_ssize_t s, Py_ssize_t g, Py_ssize_t k)

    @cython.locals(ids="long long[::1]", hold="int[::1]", base=Py_ssize_t, o=Py_ssize_t, j=Py_ssize_t, x=Py_ssize_t)
    cpdef _lru_release(self, Py_ssize_t s, Py_ssize_t g, Py_ssize_t k)

    @cython.locals(room=Py_ssize_t, x=Py_ssize_t)
    cpdef _lru_trim(self, Py_ssize_t g, Py_ssize_t used)

    @cython.locals(o=Py_ssize_t, lo=Py_ssize_t, hi=Py_ssize_t, mid=Py_ssize_t, ids="long long[::1]",
                   pres="unsigned char[::1]", base=Py_ssize_t, blocks=object)
    cpdef Py_ssize_t _closed_run(self, Py_ssize_t s, Py_ssize_t g) except? -1

    @cython.locals(k=Py_ssize_t, b=object)
    cpdef Py_ssize_t _run(self, object blocks, list h) except? -1

    @cython.locals(blocks=object, free=object, j=Py_ssize_t, b=object, n=object)
    cpdef _hold(self, Py_ssize_t g, list h, Py_ssize_t k)

    @cython.locals(blocks=object, free=object, j=Py_ssize_t, b=object, n=object)
    cpdef _release(self, Py_ssize_t g, list h, Py_ssize_t k)

    @cython.locals(free=object, room=Py_ssize_t, bs=Py_ssize_t, blocks=object)
    cpdef _trim(self, Py_ssize_t g, Py_ssize_t used)
