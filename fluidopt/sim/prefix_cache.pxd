# Static types for fluidopt/sim/prefix_cache.py compiled as fluidopt.sim._c_prefix_cache (an "augmenting" .pxd:
# the cache stays plain Python, and this file is its only Cython). setup.py copies both into the build tree
# under the compiled module's name; fluidopt.sim.prefix_cache.make_prefix_cache gives the compiled core the
# compiled class, which fluidopt.sim.backend requires to match the two files on disk (the Python engine keeps
# the Python class: the differential tests compare the two). engine.pxd cimports this class: the kernel calls start / leave /
# decode_start / decode_leaves / trim at C level, with C integers (so this file is part of the core's build
# key, and editing it means rebuilding both). The dict paths stay Python sets, dicts and OrderedDicts.
# Keep every attribute declared here and every local of a hot method typed (one type per name). setup.py
# compiles this module without bounds checks: every index is computed from the cache's own state (the
# kernel passes valid requests and GPUs, query checks a controller's GPU), and the Python engine runs the
# same source with checked arrays in every test.

cimport cython

cdef Py_ssize_t _HASH, _LOW  # the index's hash constants, C integers (a Python global or a literal beyond 32
# bits would make the hash Python arithmetic)

@cython.final
cdef class PrefixCache:
    cdef public list flat, blocks, free
    cdef public Py_ssize_t bs, lim, C, n_classes, evictions, U, fnode, mask
    cdef public bint chunked, dense, lru
    cdef public long long[::1] off, ids  # every request's block ids, renumbered 0 .. U - 1, and where each starts
    cdef public long long[::1] rg, rk, rc, rw  # per request while it runs
    cdef public long long[::1] cached, gpu_of, cls_of, prompt_of  # per request, of its first prefill
    cdef public int[::1] nd, hnode  # lru: four ints per node (slot, holders, links); per block of a request
    cdef public long long[::1] tab  # lru: the index, (node, key) per slot
    cdef public long long[::1] head, tail, nfree  # lru: per GPU
    cdef public unsigned char[::1] present  # dense: [g * U + id] = 1 when present on g

    @cython.locals(lim=Py_ssize_t, k=Py_ssize_t, h=list, cached=Py_ssize_t, work=Py_ssize_t, i=Py_ssize_t)
    cpdef Py_ssize_t start(self, Py_ssize_t s, Py_ssize_t g, Py_ssize_t ptok, Py_ssize_t prompt, Py_ssize_t kv) except? -1

    @cython.locals(i=Py_ssize_t, o=Py_ssize_t, n_ids=Py_ssize_t, k=Py_ssize_t, cached=Py_ssize_t, prompt=Py_ssize_t,
                   done=Py_ssize_t, chunks=Py_ssize_t, tok=Py_ssize_t, h=list, blocks=object, free=object,
                   j=Py_ssize_t, b=object, n=object, ids="long long[::1]", pres="unsigned char[::1]", base=Py_ssize_t,
                   x=Py_ssize_t)
    cpdef leave(self, Py_ssize_t s, Py_ssize_t g, Py_ssize_t remaining, Py_ssize_t c)

    @cython.locals(h=list, k=Py_ssize_t, i=Py_ssize_t)
    cpdef decode_start(self, Py_ssize_t s, Py_ssize_t g, Py_ssize_t kv, Py_ssize_t tokens)

    @cython.locals(i=Py_ssize_t, k=Py_ssize_t)
    cpdef decode_leaves(self, Py_ssize_t s, Py_ssize_t g)

    cpdef trim(self, Py_ssize_t g, Py_ssize_t kv)

    cpdef list _ids(self, Py_ssize_t s)

    @cython.locals(mask=Py_ssize_t, i=Py_ssize_t, x=Py_ssize_t)
    cdef inline Py_ssize_t _find(self, Py_ssize_t key) except -2

    @cython.locals(x=Py_ssize_t, mask=Py_ssize_t, i=Py_ssize_t)
    cdef Py_ssize_t _insert(self, Py_ssize_t key) except -2

    @cython.locals(mask=Py_ssize_t, i=Py_ssize_t, j=Py_ssize_t, y=Py_ssize_t, h=Py_ssize_t)
    cdef _delete(self, Py_ssize_t x)

    @cython.locals(old=Py_ssize_t, nd="int[::1]", was="long long[::1]", tab="long long[::1]", mask=Py_ssize_t,
                   j=Py_ssize_t, x=Py_ssize_t, key=Py_ssize_t, i=Py_ssize_t)
    cdef _grow_pool(self)

    @cython.locals(t=Py_ssize_t)
    cdef inline _link(self, Py_ssize_t g, Py_ssize_t x)

    @cython.locals(p=Py_ssize_t, q=Py_ssize_t)
    cdef inline _unlink(self, Py_ssize_t g, Py_ssize_t x)

    @cython.locals(ids="long long[::1]", base=Py_ssize_t, o=Py_ssize_t, e=Py_ssize_t, j=Py_ssize_t)
    cpdef Py_ssize_t _lru_run(self, Py_ssize_t s, Py_ssize_t g) except? -1

    @cython.locals(base=Py_ssize_t, o=Py_ssize_t, e=Py_ssize_t, j=Py_ssize_t, x=Py_ssize_t)
    cdef Py_ssize_t _lru_take(self, Py_ssize_t s, Py_ssize_t g) except -1

    @cython.locals(o=Py_ssize_t, j=Py_ssize_t, x=Py_ssize_t)
    cdef _lru_release(self, Py_ssize_t s, Py_ssize_t g, Py_ssize_t k)

    @cython.locals(room=Py_ssize_t, x=Py_ssize_t)
    cdef _lru_trim(self, Py_ssize_t g, Py_ssize_t used)

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
