"""The reference FCFS policy whose prefill stage is a textbook multi-server queue.

:class:`ReservedPrefillFCFS` keeps one slot per prefill GPU for prefills and admits FCFS, so the
prefill stage is exactly M/M/m+M (markov service) or M/G/m (tokens service); the simulator's
exactness tests (:mod:`fluidopt.sim.textbook`) compare it with :mod:`fluidopt.queueing`. Its event
handlers are written once, in :mod:`fluidopt.control.fcfs_handlers`, which the compiled engine core
also runs compiled (same source, same decisions).
"""

from __future__ import annotations

from typing import Any

from fluidopt.control import fastpath
from fluidopt.control.fcfs_handlers import FCFSHandlers
from fluidopt.control.protocol import Context, Controller
from fluidopt.control.registration import register
from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import Scenario

__all__ = ["ReservedPrefillFCFS"]


class ReservedPrefillFCFS(FCFSHandlers, Controller):
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

    def __getstate__(self) -> dict:
        """A copy or a pickle leaves the run behind: the engine's GPU sets are not copied."""
        return {**self.__dict__, "_idle": None, "_solo": None, "_mixed": None}

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
        # the handlers' state (fcfs_handlers.STATE)
        self._idle = ctx.idle_prefill(0)
        self._solo = ctx.free_decode(1) if m < n else None
        self._mixed = ctx.free_decode(0)
        self._kv = ctx.gpu_kv_free(0) != float("inf")
        self._fast = fastpath.bind(self, ctx)  # the compiled handlers on the compiled engine (same source)

    # on_arrival, on_prefill_done, on_slot_freed and _fits: FCFSHandlers (fluidopt.control.fcfs_handlers)


@register("reserved-prefill-fcfs",
          description="reference: a slot reserved for prefill on every GPU, FCFS, decode anywhere (exact M/M/c+M prefill stage)")
def make_reserved_prefill_fcfs(scenario: Scenario, *, prefill_gpus: int | None = None,
                               decode_on_prefill_gpus: bool = True) -> ReservedPrefillFCFS:
    """The reference FCFS policy (options as :class:`ReservedPrefillFCFS`)."""
    return ReservedPrefillFCFS(prefill_gpus=prefill_gpus, decode_on_prefill_gpus=decode_on_prefill_gpus)
