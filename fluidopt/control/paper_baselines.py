"""The paper's baselines (Fig. 7; docs/controllers.md), defined precisely where the paper is brief.

Names read admission - decode placement - partition: G = the deviation-index gate, F = FCFS;
I = in-place (coupled) decode, F = prefill-first free decode, G = greedy router; SP = static
partition, WSP = without static partition. Gate-and-Route itself is GG-SP
(:class:`~fluidopt.control.gate_and_route.GateAndRoute`).

* :class:`FIWSP` (FCFS, in place, no partition: vLLM/Sarathi's default): every GPU takes a prefill
  whenever its prefill slot is idle and it has a free slot, admitting the earliest-arrived waiting
  request of any class; a finished prefill decodes on the same GPU, in the slot it already holds
  (coupled decode), so the decode buffer stays empty.

* :class:`GIWSP` (gate, in place, no partition): every GPU may run a prefill (B slots, no slot
  reserved). A GPU with no running prefill and a free slot admits the gate's class (argmin
  (X_i - n x_i*)/x_i* over waiting classes with x_i* > 0, as in Gate-and-Route). A finished prefill
  decodes in the slot it held, on the same GPU, until it completes: there is never a decode buffer
  (tokens mode with a KV capacity only: a decode whose context no longer fits waits in the central
  buffer for the next freed slot anywhere).
* :class:`GFWSP` (gate, prefill-first free decode, no partition): every GPU may prefill; no slot is
  reserved. Whenever capacity frees on a GPU that runs no prefill, the gate's class starts a prefill
  there first (that includes the slot a finished prefill leaves); only then do free slots pull
  decodes from the central FCFS buffer. A finished prefill's decode goes to a uniformly random GPU with
  a free slot (after its own GPU has taken a new prefill), else to the buffer.
* :class:`FGSP` (FCFS, greedy, static partition): Gate-and-Route's partition (M = ceil(n sum x*)
  mixed GPUs with B-1 decode slots and a reserved prefill slot, the rest solo) and greedy router, but
  the reserved slots admit the FCFS head of the prefill queue across all classes (no gate: classes with
  x_i* = 0 are admitted too).

Targets x* come from the bundled LP; all three run on any fleet size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fluidopt.control import fastpath
from fluidopt.control.fiwsp_handlers import FIWSPHandlers
from fluidopt.control.gate_and_route import MIXED_POOL, GateAndRoute
from fluidopt.control.protocol import DECODE_QUEUE, PREFILL_QUEUE, Context, Controller
from fluidopt.control.registration import register
from fluidopt.core.model import Scenario

__all__ = ["FGSP", "FIWSP", "GFWSP", "GIWSP"]


class FIWSP(FIWSPHandlers, Controller):
    """FCFS admission to any GPU with an idle prefill slot; decode stays on its prefill's GPU.

    An arrival that finds idle prefill slots starts on one chosen uniformly at random (the
    controller's seeded stream). With a KV capacity (tokens mode) a prefill starts only where its
    prompt fits; otherwise it waits. The handlers are :class:`~fluidopt.control.fiwsp_handlers.FIWSPHandlers`'.
    """

    name = "fi-wsp"
    _fast: Any = None  # the compiled handlers bound by setup (fluidopt.control.fastpath), or None

    def __getstate__(self) -> dict:
        """A copy or a pickle leaves the run behind: the engine's idle-prefill set is not copied."""
        return {**self.__dict__, "_idle": None}

    def setup(self, ctx: Context) -> None:
        self._idle = ctx.idle_prefill(0)
        self._kv = ctx.gpu_kv_free(0) != float("inf")
        self._fast = fastpath.bind(self, ctx)  # compiled handlers on the compiled engine (same decisions)


@register("fi-wsp", description="paper baseline: FCFS admission, no gate, decode stays on its prefill's GPU",
          aliases=("fcfs",))
def _make_fiwsp(scenario: Scenario) -> FIWSP:
    return FIWSP()


class _NoPartition(GateAndRoute):
    """One pool of all n GPUs: prefill allowed everywhere, B decodes per GPU, no reserved slot."""

    def _declare_pools(self, ctx: Context) -> None:
        n, B = self.n_gpus, self.batch
        ctx.set_pool(range(n), MIXED_POOL, prefill=True, max_decodes=B)
        self.mixed_gpus = n
        self._has_mixed, self._has_solo = True, False

    def plan_mixed_gpus(self, n_gpus: int) -> int:
        return int(n_gpus)


class GIWSP(_NoPartition):
    """GI-WSP: deviation-index gate, decode coupled to its prefill's GPU slot, no partition."""

    name = "gi-wsp"

    def on_prefill_done(self, ctx: Context, r: int, g: int) -> None:
        if self._fits(ctx, r, g):
            ctx.start_decode(r, g)  # the slot r held for its prefill now holds its decode
        # else (KV capacity only): r waits in DECODE_QUEUE for the next freed slot anywhere

    def on_slot_freed(self, ctx: Context, g: int) -> None:
        if self._prefill_slot_idle(ctx, g):
            self._admit_on(ctx, g)
        if self._kv:
            self._pull_decodes(ctx, g, DECODE_QUEUE)


class GFWSP(_NoPartition):
    """GF-WSP: deviation-index gate, prefill-first on every freed slot, decode anywhere, no partition."""

    name = "gf-wsp"

    def on_prefill_done(self, ctx: Context, r: int, g: int) -> None:
        if self._prefill_slot_idle(ctx, g):
            self._admit_on(ctx, g)  # prefill first: the slot r leaves starts a waiting prefill
        h = ctx.free_decode(MIXED_POOL).choice()
        if h >= 0 and self._fits(ctx, r, h):
            ctx.start_decode(r, h)

    def on_slot_freed(self, ctx: Context, g: int) -> None:
        if self._prefill_slot_idle(ctx, g):
            self._admit_on(ctx, g)
        self._pull_decodes(ctx, g, DECODE_QUEUE)


class FGSP(GateAndRoute):
    """FG-SP: Gate-and-Route's static partition and greedy router with FCFS admission (no gate)."""

    name = "fg-sp"

    def gate_class(self, ctx: Context) -> int:
        r = ctx.head(PREFILL_QUEUE)
        return -1 if r < 0 else ctx.req_class(r)


def _make(cls: type, scenario: Scenario, pricing: str, slis: Sequence[Any] | None, plan: Any) -> GateAndRoute:
    from fluidopt.control.gate_and_route import _build

    return _build(cls, scenario, pricing, slis, None, plan)


@register("gi-wsp", description="paper baseline: gate, decode in place, no partition")
def make_gi_wsp(scenario: Scenario, *, pricing: str = "bundled", slis: Sequence[Any] | None = None,
                plan: Any = None) -> GateAndRoute:
    """GI-WSP with the gate's targets from the scenario's LP (or the given ``plan``)."""
    return _make(GIWSP, scenario, pricing, slis, plan)


@register("gf-wsp", description="paper baseline: gate, prefill-first on freed slots, decode anywhere, no partition")
def make_gf_wsp(scenario: Scenario, *, pricing: str = "bundled", slis: Sequence[Any] | None = None,
                plan: Any = None) -> GateAndRoute:
    """GF-WSP with the gate's targets from the scenario's LP (or the given ``plan``)."""
    return _make(GFWSP, scenario, pricing, slis, plan)


@register("fg-sp", description="paper baseline: static partition and greedy router, FCFS admission")
def make_fg_sp(scenario: Scenario, *, pricing: str = "bundled", slis: Sequence[Any] | None = None,
               plan: Any = None) -> GateAndRoute:
    """FG-SP with the partition from the scenario's LP (or the given ``plan``)."""
    return _make(FGSP, scenario, pricing, slis, plan)
