"""The reference FCFS policy whose prefill stage is a textbook multi-server queue.

:class:`ReservedPrefillFCFS` keeps one slot per prefill GPU for prefills and admits FCFS, so the
prefill stage is exactly M/M/m+M (markov service) or M/G/m (tokens service); the simulator's
exactness tests (:mod:`fluidopt.sim.textbook`) compare it with :mod:`fluidopt.queueing`.
"""

from __future__ import annotations

from typing import Any

from fluidopt.control import fastpath
from fluidopt.control.protocol import DECODE_QUEUE, PREFILL_QUEUE, Context, Controller
from fluidopt.control.registry import register
from fluidopt.errors import ScenarioError
from fluidopt.model import Scenario

__all__ = ["ReservedPrefillFCFS"]


class ReservedPrefillFCFS(Controller):
    """Reference policy: prefill GPUs keep one slot for prefills; FCFS admission; decodes anywhere.

    GPUs ``0..m-1`` (``m = prefill_gpus``, default all) take prefills and at most B-1 decodes
    (``decode_on_prefill_gpus=False``: none), so a prefill slot is free exactly when no prefill runs
    on the GPU; GPUs ``m..n-1`` only decode (B each). An arrival starts on a random idle prefill slot
    if no one waits (FCFS across classes); a finished prefill decodes on a random decode-only GPU
    with a free slot, else a random prefill GPU with a free decode slot, else waits in the FCFS
    decode buffer; freed slots pull from the two queues.

    Whatever the decodes do, the prefill stage is then a textbook FCFS multi-server queue with m
    servers: M/M/m+M (Erlang A; Erlang C without patience) under ``service="markov"``, M/G/m under
    ``service="tokens"`` with service time ceil(P/C) * tau_mix (see :mod:`fluidopt.sim.textbook`).
    """

    name = "reserved-prefill-fcfs"
    _fast: Any = None  # the compiled fast path bound by setup (fluidopt.control.fastpath), or None

    def __init__(self, *, prefill_gpus: int | None = None, decode_on_prefill_gpus: bool = True):
        self.prefill_gpus = prefill_gpus
        self.decode_on_prefill_gpus = bool(decode_on_prefill_gpus)

    def setup(self, ctx: Context) -> None:
        n, B = ctx.n_gpus, ctx.batch
        m = n if self.prefill_gpus is None else int(self.prefill_gpus)
        if not 1 <= m <= n:
            raise ScenarioError(f"{self.name}: prefill_gpus: expected 1..{n}, got {self.prefill_gpus!r}")
        if B < 2 and self.decode_on_prefill_gpus and m == n:
            raise ScenarioError(f"{self.name}: needs batch >= 2 (one slot for prefills, one for decodes), got {B}")
        ctx.set_pool(range(m), 0, prefill=True, max_decodes=B - 1 if self.decode_on_prefill_gpus else 0)
        if m < n:
            ctx.set_pool(range(m, n), 1, prefill=False, max_decodes=B)
        self._idle = ctx.idle_prefill(0)
        self._dec = [ctx.free_decode(1) if m < n else None, ctx.free_decode(0)]
        self._kv = ctx.gpu_kv_free(0) != float("inf")
        self._fast = fastpath.bind(self, ctx)  # compiled handlers on the compiled engine (same decisions)

    def _fits(self, ctx: Context, r: int, g: int) -> bool:
        """KV room on g for r's prompt (plus the tokens it already generated); always without a KV cap."""
        return not self._kv or ctx.gpu_kv_free(g) >= ctx.req_prompt(r) + ctx.req_generated(r)

    # The handlers below run once or twice per request (the textbook benchmarks' hot path): the KV
    # check is skipped without a KV cap, and pool membership is tested without a generator.
    def on_arrival(self, ctx: Context, r: int) -> None:
        if ctx.qlen(PREFILL_QUEUE) == 0:
            g = self._idle.choice()
            if g >= 0 and (not self._kv or self._fits(ctx, r, g)):
                ctx.start_prefill(r, g)

    def on_prefill_done(self, ctx: Context, r: int, g: int) -> None:
        kv = self._kv
        for s in self._dec:
            if s:
                h = s.choice()
                if not kv or self._fits(ctx, r, h):
                    ctx.start_decode(r, h)
                    return

    def on_slot_freed(self, ctx: Context, g: int) -> None:
        kv = self._kv
        if g in self._idle:
            r = ctx.head(PREFILL_QUEUE)
            if r >= 0 and (not kv or self._fits(ctx, r, g)):
                ctx.start_prefill(r, g)
        if ctx.qlen(DECODE_QUEUE):
            solo, mixed = self._dec
            if g in mixed or (solo is not None and g in solo):
                r = ctx.head(DECODE_QUEUE)
                if not kv or self._fits(ctx, r, g):
                    ctx.start_decode(r, g)


@register("reserved-prefill-fcfs",
          description="reference: a slot reserved for prefill on every GPU, FCFS, decode anywhere (exact M/M/c+M prefill stage)")
def make_reserved_prefill_fcfs(scenario: Scenario, *, prefill_gpus: int | None = None,
                               decode_on_prefill_gpus: bool = True) -> ReservedPrefillFCFS:
    """The reference FCFS policy (options as :class:`ReservedPrefillFCFS`)."""
    return ReservedPrefillFCFS(prefill_gpus=prefill_gpus, decode_on_prefill_gpus=decode_on_prefill_gpus)
