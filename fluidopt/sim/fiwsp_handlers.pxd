# Static types for fluidopt/control/fiwsp_handlers.py compiled as fluidopt.sim._c_fiwsp_handlers (an augmenting
# .pxd, as fcfs_handlers.pxd). Keep every local of a handler typed here and every attribute in STATE declared.

cimport cython
from fluidopt.sim._cengine cimport Engine, GpuSet

cdef Py_ssize_t PREFILL_QUEUE


@cython.final
cdef class FIWSPHandlers:
    cdef public bint _kv
    cdef public GpuSet _idle

    cpdef bint _fits(self, Engine ctx, Py_ssize_t r, Py_ssize_t g) except -1

    @cython.locals(idle=GpuSet, g=Py_ssize_t, h=Py_ssize_t)
    cpdef on_arrival(self, Engine ctx, Py_ssize_t r)

    cpdef on_prefill_done(self, Engine ctx, Py_ssize_t r, Py_ssize_t g)

    @cython.locals(r=Py_ssize_t)
    cpdef on_slot_freed(self, Engine ctx, Py_ssize_t g)
