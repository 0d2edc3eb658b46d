"""The paper's baselines (Fig. 7; DESIGN.md 2.3), defined precisely where the paper is brief.

Names read admission - decode placement - partition: G = the deviation-index gate, F = FCFS;
I = in-place (coupled) decode, F = prefill-first free decode, G = greedy router; SP = static
partition, WSP = without static partition. Gate-and-Route itself is GG-SP
(:class:`~fluidopt.control.gate_and_route.GateAndRoute`); FI-WSP (FCFS, in place, no partition: the
vLLM/Sarathi default) lives in :mod:`fluidopt.control.baselines`.

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

from fluidopt.control.gate_and_route import MIXED_POOL, GateAndRoute
from fluidopt.control.protocol import DECODE_QUEUE, PREFILL_QUEUE, Context
from fluidopt.model import Scenario

__all__ = ["FGSP", "GFWSP", "GIWSP"]


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


def _register() -> None:
    from fluidopt.control.registry import register

    def factory(cls: type):
        def make(scenario: Scenario, *, pricing: str = "bundled", slis: Sequence[Any] = ()) -> GateAndRoute:
            return cls.from_scenario(scenario, slis, pricing=pricing)

        return make

    register("gi-wsp", factory(GIWSP), description="paper baseline: gate, decode in place, no partition")
    register("gf-wsp", factory(GFWSP),
             description="paper baseline: gate, prefill-first on freed slots, decode anywhere, no partition")
    register("fg-sp", factory(FGSP), description="paper baseline: static partition and greedy router, FCFS admission")


_register()
