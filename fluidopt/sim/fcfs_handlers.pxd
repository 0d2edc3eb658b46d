# Static types for fluidopt/control/fcfs_handlers.py compiled as fluidopt.sim._c_fcfs_handlers (an "augmenting" .pxd:
# the handlers stay plain Python, and this file is their only Cython). setup.py copies both into the build
# tree under the compiled module's name and compiles them against the engine core's declarations
# (engine.pxd), so the context is the compiled Engine and its reads and actions are C-level calls.
# Keep every local of a handler typed here (one type per name) and every attribute in STATE declared.

cimport cython
from fluidopt.sim._cengine cimport Engine, GpuSet

cdef Py_ssize_t PREFILL_QUEUE, DECODE_QUEUE


@cython.final
cdef class FCFSHandlers:
    cdef public bint _kv
    cdef public GpuSet _idle, _solo, _mixed  # _solo: None without decode-only GPUs

    cpdef bint _fits(self, Engine ctx, Py_ssize_t r, Py_ssize_t g) except -1

    @cython.locals(g=Py_ssize_t)
    cpdef on_arrival(self, Engine ctx, Py_ssize_t r)

    @cython.locals(kv=bint, s=GpuSet, h=Py_ssize_t)
    cpdef on_prefill_done(self, Engine ctx, Py_ssize_t r, Py_ssize_t g)

    @cython.locals(kv=bint, solo=GpuSet, r=Py_ssize_t)
    cpdef on_slot_freed(self, Engine ctx, Py_ssize_t g)
