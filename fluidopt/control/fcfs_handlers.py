"""The event handlers of the reference FCFS policy (:class:`~fluidopt.control.fcfs.ReservedPrefillFCFS`),
written once for both paths (docs/simulator.md section 9, "One source for a controller's handlers").

As Python, :class:`FCFSHandlers` is a mixin of the controller: its methods *are* the controller's
handlers, on any :class:`~fluidopt.control.protocol.Context` (the Python engine, the compiled engine
with ``FLUIDOPT_FAST_CONTROLLERS=0``, a router's snapshot). setup.py also compiles this very file,
with the static types of ``fluidopt/sim/fcfs_handlers.pxd`` (an augmenting declaration file: the
context typed as the compiled engine core, the GPU sets as its ``GpuSet``, the locals as C integers),
into ``fluidopt.sim._c_fcfs_handlers``; on the compiled core, :mod:`fluidopt.sim.controller_fastpath` installs
that class's handlers as the engine's callbacks, with the controller's state (:data:`STATE`) copied
over at setup. There is no second copy to keep in step: the compiled module carries the SHA-256 of
this file and of its .pxd, and a stale build never runs.

Rules for a handler module compiled this way: only the protocol's reads and actions on ``ctx`` (the
compiled engine implements each as a C-level method), and ``s.has(g)`` rather than ``g in s`` for a GPU
set (``in`` boxes the id and goes through Python's slot: about 600 instructions a test); every local keeps one type, declared in the
.pxd; no closures, generators or comprehensions in a handler; module constants bound by assignment
(the .pxd types them as C integers); the state a handler reads is listed in :data:`STATE` and set by
the controller's ``setup``.
"""

from __future__ import annotations

from fluidopt.control import protocol as _P

__all__ = ["STATE", "FCFSHandlers"]

# the protocol's queues, bound by assignment (fcfs_handlers.pxd types them as C integers)
PREFILL_QUEUE = _P.PREFILL_QUEUE
DECODE_QUEUE = _P.DECODE_QUEUE

# the controller's attributes the handlers read (set by ReservedPrefillFCFS.setup; copied to the compiled
# handlers when they are bound): the KV check is on, the idle prefill set of the prefill GPUs, and the free
# decode sets (decode-only GPUs' or None, prefill GPUs')
STATE = ("_kv", "_idle", "_solo", "_mixed")


class FCFSHandlers:
    """ReservedPrefillFCFS's handlers: FCFS admission to a random idle prefill slot; a finished prefill
    decodes on a random decode-only GPU with a free slot, else a random prefill GPU with one, else waits
    in the FCFS decode buffer; a freed slot pulls from the two queues. Run once or twice per request (the
    textbook benchmarks' hot path): the KV check is skipped without a KV cap."""

    def _fits(self, ctx, r, g):
        """KV room on g for r's prompt (plus the tokens it already generated); always without a KV cap."""
        return not self._kv or ctx.gpu_kv_free(g) >= ctx.req_prompt(r) + ctx.req_generated(r)

    def on_arrival(self, ctx, r):
        if ctx.qlen(PREFILL_QUEUE) == 0:
            g = self._idle.choice()
            if g >= 0 and (not self._kv or self._fits(ctx, r, g)):
                ctx.start_prefill(r, g)

    def on_prefill_done(self, ctx, r, g):
        kv = self._kv
        s = self._solo
        if s is not None and len(s):
            h = s.choice()
            if not kv or self._fits(ctx, r, h):
                ctx.start_decode(r, h)
                return
        s = self._mixed
        if len(s):
            h = s.choice()
            if not kv or self._fits(ctx, r, h):
                ctx.start_decode(r, h)

    def on_slot_freed(self, ctx, g):
        kv = self._kv
        if self._idle.has(g):
            r = ctx.head(PREFILL_QUEUE)
            if r >= 0 and (not kv or self._fits(ctx, r, g)):
                ctx.start_prefill(r, g)
        if ctx.qlen(DECODE_QUEUE):
            solo = self._solo
            if self._mixed.has(g) or (solo is not None and solo.has(g)):
                r = ctx.head(DECODE_QUEUE)
                if not kv or self._fits(ctx, r, g):
                    ctx.start_decode(r, g)
