"""The utilisation autoscaler: the Chiron paper's Llumnix-like baseline.
"""

from __future__ import annotations

import math

from fluidopt.control.orchestration.common import (
    _Orchestrator,
    _positive,
)
from fluidopt.control.protocol import DECODE_QUEUE, Context
from fluidopt.control.registration import register
from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import Scenario

__all__ = ["UtilisationAutoscaler"]


# --------------------------------------------------------------------------------------------
# The utilisation autoscaler (the Chiron paper's Llumnix-like baseline)
# --------------------------------------------------------------------------------------------


class UtilisationAutoscaler(_Orchestrator):
    """Dispatch at once (join the shortest queue), fixed batch size, scale on utilisation.

    Every arrival goes at once to the online instance with the fewest requests (queued + running);
    each instance admits from its own queue, interactive first, one prefill at a time, up to
    ``batch_size`` decodes (default: the interactive ITL-safe batch, the same on every instance).
    Every ``tick`` seconds: utilisation u = requests on the online instances / (online * batch_size);
    u > ``up`` adds ceil(``step`` * online) instances (up to the fleet's maximum), u < ``down`` drains
    the least-loaded one (its queue re-dispatched first). A new instance takes queued requests from
    the longest queues until the queues are even (Llumnix migrates requests between instances;
    ``migrate=False``: it takes only new arrivals, as the seed describes its baseline).
    """

    name = "utilisation-autoscaler"

    def __init__(self, scenario: Scenario, *, batch_size: int | None = None, up: float = 0.8, down: float = 0.3,
                 step: float = 0.25, min_gpus: int = 1, tick: float = 10.0, batch_classes=None, migrate: bool = True):
        super().__init__(scenario, batch_classes=batch_classes, tick=tick)
        who = self.name
        self.migrate = bool(migrate)
        if batch_size is None:
            batch_size = self.b_int
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= scenario.gpu.batch - 1:
            raise ScenarioError(f"{who}: batch_size: expected an integer in 1..{scenario.gpu.batch - 1} (B-1), "
                                f"got {batch_size!r}")
        self.bsize = batch_size
        self.up, self.down, self.step = _positive(who, "up", up), _positive(who, "down", down), _positive(who, "step", step)
        if self.down >= self.up:
            raise ScenarioError(f"{who}: down: expected less than up = {self.up}, got {self.down}")
        if isinstance(min_gpus, bool) or not isinstance(min_gpus, int) or min_gpus < 1:
            raise ScenarioError(f"{who}: min_gpus: expected an integer >= 1, got {min_gpus!r}")
        self.min_gpus = min_gpus
        self.fleet_fixed = scenario.fleet is None

    def setup(self, ctx: Context) -> None:
        n = ctx.n_gpus
        ctx.set_pool(range(n), 0, max_decodes=self.bsize)
        self.iq = [ctx.instance_queue(g) for g in range(n)]
        self.online = ctx.fleet_online()

    def _admit(self, ctx: Context, g: int) -> None:
        q = self.iq[g]
        while ctx.qlen(DECODE_QUEUE) and ctx.gpu_decodes(g) < ctx.gpu_max_decodes(g) and ctx.gpu_free(g) > 0:
            if not self.try_decode(ctx, ctx.head(DECODE_QUEUE), g):
                break
        if ctx.qlen(q) and self.has_room(ctx, g):
            r = self.head_of(ctx, q, self.inter)
            if r < 0:
                r = ctx.head(q)
            self.try_prefill(ctx, r, g)

    def _route(self, ctx: Context) -> int:
        best, bl = -1, math.inf
        for g in self.online:
            load = ctx.instance_requests(g)
            if load < bl:
                best, bl = g, load
        return best

    def on_arrival(self, ctx: Context, r: int) -> None:
        g = self._route(ctx)
        if g < 0:
            return  # no instance online: the global queue
        ctx.enqueue(r, self.iq[g])
        self._admit(ctx, g)

    def on_prefill_done(self, ctx: Context, r: int, g: int) -> None:
        if ctx.gpu_online(g) and ctx.gpu_decodes(g) < ctx.gpu_max_decodes(g) and ctx.gpu_free(g) > 0:
            self.try_decode(ctx, r, g)

    def on_preempt(self, ctx: Context, r: int, g: int) -> None:
        h = g if ctx.gpu_online(g) else self._route(ctx)
        if h >= 0:
            ctx.enqueue(r, self.iq[h], front=True)

    def on_slot_freed(self, ctx: Context, g: int) -> None:
        if ctx.gpu_online(g):
            if g not in self.online:  # came online: take queued work from the longest queues
                self.online.append(g)
                self.online.sort()
                if self.migrate:
                    self._rebalance(ctx, g)
            self._admit(ctx, g)

    def _rebalance(self, ctx: Context, new: int) -> None:
        total = sum(ctx.qlen(self.iq[g]) for g in self.online)
        target = total // len(self.online)
        for g in sorted(self.online, key=lambda h: -ctx.qlen(self.iq[h])):
            if g == new or ctx.qlen(self.iq[new]) >= target:
                break
            q = self.iq[g]
            extra = min(ctx.qlen(q) - target, target - ctx.qlen(self.iq[new]))
            if extra <= 0:
                continue
            for r in ctx.queue_requests(q)[-extra:]:
                ctx.enqueue(r, self.iq[new])

    def on_tick(self, ctx: Context) -> None:
        if self.fleet_fixed:
            return
        self.online = [g for g in self.online if ctx.gpu_online(g)]
        on = len(self.online)
        if on == 0:
            return
        load = sum(ctx.instance_requests(g) for g in self.online)
        u = load / (on * (self.bsize + 1))
        if u > self.up:
            k = math.ceil(self.step * on)
            for _ in range(k):
                try:
                    ctx.add_gpu()
                except Exception:  # the fleet is at its maximum
                    break
        elif u < self.down and on > self.min_gpus:
            g = min(self.online, key=ctx.instance_requests)
            self.online.remove(g)
            moved = ctx.queue_requests(self.iq[g])
            ctx.drain_gpu(g)
            for r in moved:
                h = self._route(ctx)
                ctx.enqueue(r, self.iq[h])
                self._admit(ctx, h)


@register("utilisation-autoscaler",
          description="baseline: dispatch at once (JSQ), fixed batch size, add instances when utilisation is high")
def make_utilisation_autoscaler(scenario: Scenario, *, batch_size: int | None = None, up: float = 0.8,
                                down: float = 0.3, step: float = 0.25, min_gpus: int = 1, tick: float = 10.0,
                                batch_classes: list[str] | None = None, migrate: bool = True) -> UtilisationAutoscaler:
    """The utilisation autoscaler (options as :class:`UtilisationAutoscaler`; ``migrate=False``: a new
    instance takes no queued requests, only new arrivals, the seed's description of its baseline)."""
    return UtilisationAutoscaler(scenario, batch_size=batch_size, up=up, down=down, step=step, min_gpus=min_gpus,
                                 tick=tick, batch_classes=batch_classes, migrate=migrate)
