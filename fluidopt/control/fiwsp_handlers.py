"""The event handlers of the FI-WSP baseline (:class:`~fluidopt.control.paper_baselines.FIWSP`: FCFS
admission to any idle prefill slot, decode in place), written once for both paths (docs/simulator.md
section 9, "One source for a controller's handlers"; the rules are those of fcfs_handlers.py).

As Python, :class:`FIWSPHandlers` is a mixin of the controller: its methods are the controller's
handlers on any context. setup.py also compiles this file, with the static types of
``fluidopt/sim/fiwsp_handlers.pxd``, into ``fluidopt.sim._c_fiwsp_handlers``, whose handlers
:mod:`fluidopt.sim.controller_fastpath` installs on the compiled engine core, with :data:`STATE` copied.
"""

from __future__ import annotations

from fluidopt.control import protocol as _P

__all__ = ["STATE", "FIWSPHandlers"]

PREFILL_QUEUE = _P.PREFILL_QUEUE

# set by FIWSP.setup: the KV check is on, the idle prefill set of the one pool
STATE = ("_kv", "_idle")


class FIWSPHandlers:
    """FI-WSP's handlers: an arrival starts on a random idle prefill slot (where its prompt fits), else
    waits in the FCFS prefill queue; a finished prefill decodes in the slot it held; a freed slot takes
    the FCFS head."""

    def _fits(self, ctx, r, g):
        """KV room on g for r's prompt (plus the tokens it already generated); always without a KV cap."""
        return not self._kv or ctx.gpu_kv_free(g) >= ctx.req_prompt(r) + ctx.req_generated(r)

    def on_arrival(self, ctx, r):
        idle = self._idle
        if ctx.qlen(PREFILL_QUEUE) == 0:
            g = idle.choice()
            if g >= 0 and (not self._kv or self._fits(ctx, r, g)):
                ctx.start_prefill(r, g)
            return
        # Others wait (possible only when KV space held them back): FCFS, r joins the back.
        ctx.enqueue(r, PREFILL_QUEUE)
        while len(idle):
            h = ctx.head(PREFILL_QUEUE)
            g = idle.choice()
            if not self._fits(ctx, h, g):
                break
            ctx.start_prefill(h, g)
            if ctx.qlen(PREFILL_QUEUE) == 0:
                break

    def on_prefill_done(self, ctx, r, g):
        ctx.start_decode(r, g)  # the slot it held for the prefill: always free

    def on_slot_freed(self, ctx, g):
        if self._idle.has(g):
            r = ctx.head(PREFILL_QUEUE)
            if r >= 0 and (not self._kv or self._fits(ctx, r, g)):
                ctx.start_prefill(r, g)
