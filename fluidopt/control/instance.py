"""Request-to-instance routing over instance-local continuous batching (docs/routing.md).

Each GPU is an independent serving instance (vLLM-like) with its own FCFS waiting queue
(``ctx.instance_queue(g)``); a router sends every arrival to one instance, or holds it in the
central ``"router"`` queue to decide later (the RL router's "wait" action, decided on ticks).

Instance scheduling (:class:`InstanceScheduler`), run whenever capacity frees on an instance or work
reaches its queue:

* prefill first: if the instance runs no prefill, has a free slot and its queue is non-empty, the
  head of its queue (FCFS, preempted requests first) starts its prefill, provided the prompt fits in
  the free KV cache minus a watermark (vLLM keeps 1% of the blocks free);
* a finished prefill decodes on its own instance, in the slot it already holds;
* ``service="tokens"`` with a KV capacity: when the cache overflows the engine evicts the youngest
  running request (vLLM's recompute preemption); it returns to the front of its instance's queue.

Two variants of the GPU's batching: ``chunked=False`` (vLLM's classic prefill-first scheduler: the
whole prompt runs in one iteration of alpha + beta * P seconds during which the instance's decodes
stall) and ``chunked=True`` (chunked prefill, Sarathi/vLLM's newer default: chunks of C tokens run in
mixed iterations alongside the decodes). Our GPU physics runs at most one prefill at a time per GPU;
vLLM may batch several prompts into one prefill iteration.
"""

from __future__ import annotations

from fluidopt.control.protocol import Context, Controller
from fluidopt.control.registration import register
from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import Scenario

__all__ = ["InstanceScheduler", "RoundRobin"]

ROUTER_QUEUE = "router"


class InstanceScheduler(Controller):
    """Base class: instance-local continuous batching; subclasses implement :meth:`route`.

    ``route(ctx, r)`` returns the instance (GPU index) for arrival r, or None to hold r in the
    router queue (``self.router_queue``); a subclass holding requests must dispatch them later with
    :meth:`dispatch` (e.g. from ``on_tick``).
    """

    name = "instance"

    def __init__(self, *, chunked: bool = False, kv_watermark: float = 0.01):
        if not 0.0 <= kv_watermark < 1.0:
            raise ScenarioError(f"{type(self).__name__}: kv_watermark: expected a fraction in [0, 1), got {kv_watermark!r}")
        self.chunked_prefill = bool(chunked)
        self.kv_watermark = float(kv_watermark)

    def setup(self, ctx: Context) -> None:
        self.n = ctx.n_gpus
        self.iq = [ctx.instance_queue(g) for g in range(self.n)]
        self.router_queue = ctx.add_queue(ROUTER_QUEUE)
        cap = ctx.gpu_kv_free(0)
        self._kv_reserve = None if cap == float("inf") else self.kv_watermark * cap

    # -- routing ---------------------------------------------------------------------------------
    def route(self, ctx: Context, r: int) -> int | None:
        raise NotImplementedError

    def dispatch(self, ctx: Context, r: int, g: int) -> None:
        """Send waiting request r to instance g's queue and let g admit work."""
        ctx.enqueue(r, self.iq[g])
        self.admit(ctx, g)

    def on_arrival(self, ctx: Context, r: int) -> None:
        g = self.route(ctx, r)
        if g is None:
            ctx.enqueue(r, self.router_queue)
        else:
            self.dispatch(ctx, r, g)

    # -- instance-local scheduling ---------------------------------------------------------------
    def admit(self, ctx: Context, g: int) -> None:
        """Prefill first: start the head of g's queue if g's prefill slot is idle and it fits."""
        if ctx.gpu_prefill(g) >= 0 or ctx.gpu_free(g) <= 0:
            return
        r = ctx.head(self.iq[g])
        if r < 0:
            return
        if self._kv_reserve is not None:
            need = ctx.req_prompt(r) + ctx.req_generated(r)
            if ctx.gpu_kv_free(g) - self._kv_reserve < need and ctx.gpu_requests(g):
                return  # wait for room (an empty instance admits anything that fits at all)
            if ctx.gpu_kv_free(g) < need:
                return
        ctx.start_prefill(r, g)

    def on_prefill_done(self, ctx: Context, r: int, g: int) -> None:
        ctx.start_decode(r, g)

    def on_slot_freed(self, ctx: Context, g: int) -> None:
        self.admit(ctx, g)

    def on_preempt(self, ctx: Context, r: int, g: int) -> None:
        ctx.enqueue(r, self.iq[g], front=True)


class RoundRobin(InstanceScheduler):
    """Route arrivals to instances 0, 1, ..., n-1, 0, ... in turn."""

    name = "round-robin"

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        self._next = 0

    def route(self, ctx: Context, r: int) -> int:
        g = self._next
        self._next = g + 1 if g + 1 < self.n else 0
        return g


@register("round-robin", description="round-robin routing to vLLM-style instances (prefill first, no chunking)",
          aliases=("rr",))
def make_round_robin(scenario: Scenario, *, kv_watermark: float = 0.01) -> RoundRobin:
    """Round robin over prefill-first instances."""
    return RoundRobin(chunked=False, kv_watermark=kv_watermark)


@register("round-robin-chunked", description="round-robin routing to instances with chunked prefill (Sarathi)",
          aliases=("rr-chunked",))
def make_round_robin_chunked(scenario: Scenario, *, kv_watermark: float = 0.01) -> RoundRobin:
    """Round robin over chunked-prefill instances."""
    rr = RoundRobin(chunked=True, kv_watermark=kv_watermark)
    rr.name = "round-robin-chunked"
    return rr
