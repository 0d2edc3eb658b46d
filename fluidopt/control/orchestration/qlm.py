"""QLM: request groups served in least-predicted-slack order (:class:`QLM`), and QLM as published with
virtual queues and several models (:class:`QLMGroups`).
"""

from __future__ import annotations

import math

from fluidopt.control.orchestration.common import (
    _Orchestrator,
    _positive,
    _room_in,
)
from fluidopt.control.protocol import DECODE_QUEUE, PREFILL_QUEUE, Context
from fluidopt.control.registration import register
from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import Scenario
from fluidopt.fluid.multiperiod import (
    batch_throughput,
    largest_batch,
)
from fluidopt.fluid.saturation import class_laws

__all__ = ["QLM", "QLMGroups"]


# --------------------------------------------------------------------------------------------
# QLM
# --------------------------------------------------------------------------------------------


class QLM(_Orchestrator):
    """QLM: a fixed fleet; request groups (one per class, its SLO) served in least-slack order.

    A group's slack is its SLO minus the predicted wait: an interactive group's head has
    ttft_slo - (its age + its prefill time); the batch groups have deadline - now - (their requests
    in the system / the fleet's batch rate). The group with the least slack goes next; groups already
    beyond saving (slack below -``give_up`` seconds) go last, since serving them first would only add
    misses elsewhere. An interactive request that arrives when no instance has room evicts batch work
    at once (to host memory; a batch prefill first, else a batch decode), whatever its slack: QLM as
    published evicts only for a request about to miss its TTFT (issue 31, item 5, left for later).
    Instances are identical, so the per-instance virtual queues of QLM collapse to this one global
    group order.
    """

    name = "qlm"

    def __init__(self, scenario: Scenario, *, batch_classes=None, batch_itl: float | None = None,
                 tick: float = 10.0, give_up: float = 60.0, host_eviction: bool = True, calibrated: bool = True):
        super().__init__(scenario, batch_classes=batch_classes, batch_itl=batch_itl, tick=tick, calibrated=calibrated)
        self.give_up = _positive(self.name, "give_up", give_up, zero=True)
        self.host = bool(host_eviction)
        self.ttft_pre = [math.ceil(c.prompt / self.gpu.chunk) * self.gpu.tau_mix for c in scenario.classes]

    def setup(self, ctx: Context) -> None:
        self.gpus = ctx.fleet_online()
        ctx.set_pool(self.gpus, 0, max_decodes=self.b_int)
        self.ip = ctx.idle_prefill(0)
        self.fd = ctx.free_decode(0)
        self._bslack = math.inf

    def on_tick(self, ctx: Context) -> None:
        nb = self.batch_in_system(ctx)
        rate = len(self.gpus) * self.mu_mix
        self._bslack = self.batch_deadline(ctx) - ctx.now - nb / rate if nb else math.inf

    def _order(self, ctx: Context) -> list[int]:
        """Classes with waiting requests, least slack first (hopeless groups last)."""
        now = ctx.now
        keyed = []
        for i in range(len(self.is_batch)):
            r = ctx.head(PREFILL_QUEUE, i)
            if r < 0:
                continue
            if self.is_batch[i]:
                s = self._bslack
            elif self.ttft[i] is not None:
                s = self.ttft[i] - (now - ctx.req_arrival(r)) - self.ttft_pre[i]
            else:
                s = math.inf
            keyed.append((s < -self.give_up, s, i))
        keyed.sort()
        return [i for _, _, i in keyed]

    def _admit(self, ctx: Context, g: int) -> None:
        for i in self._order(ctx):
            if not self.has_room(ctx, g):
                return
            if self.try_prefill(ctx, ctx.head(PREFILL_QUEUE, i), g):
                return

    def _pick(self, ctx: Context) -> int:
        return _room_in(ctx, self.ip)

    def on_arrival(self, ctx: Context, r: int) -> None:
        ctx.enqueue(r, PREFILL_QUEUE)
        g = self._pick(ctx)
        if g >= 0:
            self._admit(ctx, g)
        elif not self.is_batch[ctx.req_class(r)] and self.bat:
            self._rescue(ctx)

    def _rescue(self, ctx: Context) -> None:
        """An interactive request waits with no room anywhere: evict a batch prefill (or decode)."""
        for g in self.gpus:
            pr = ctx.gpu_prefill(g)
            if pr >= 0 and self.is_batch[ctx.req_class(pr)] and ctx.gpu_decodes(g) < ctx.gpu_max_decodes(g):
                if ctx.evict(pr, self.host):
                    self._admit_interactive(ctx, g)
                    return
        for g in self.gpus:
            if ctx.gpu_prefill(g) < 0 and sum(ctx.gpu_decodes_by_class(g)[i] for i in self.bat):
                for r in ctx.gpu_requests(g):
                    if self.is_batch[ctx.req_class(r)] and ctx.evict(r, self.host):
                        self._admit_interactive(ctx, g)
                        return

    def _admit_interactive(self, ctx: Context, g: int) -> None:
        r = self.head_of(ctx, PREFILL_QUEUE, self.inter)
        if r >= 0 and self.has_room(ctx, g):
            self.try_prefill(ctx, r, g)

    def on_prefill_done(self, ctx: Context, r: int, g: int) -> None:
        if ctx.gpu_decodes(g) < ctx.gpu_max_decodes(g) and ctx.gpu_free(g) > 0 and self.try_decode(ctx, r, g):
            return
        h = self.fd.choice()
        if h >= 0:
            self.try_decode(ctx, r, h)

    def on_slot_freed(self, ctx: Context, g: int) -> None:
        while ctx.qlen(DECODE_QUEUE) and ctx.gpu_decodes(g) < ctx.gpu_max_decodes(g) and ctx.gpu_free(g) > 0:
            r = self.head_of(ctx, DECODE_QUEUE, self.inter)
            if r < 0:
                r = self.head_of(ctx, DECODE_QUEUE, self.bat)
            if r < 0 or not self.try_decode(ctx, r, g):
                break
        if self.has_room(ctx, g):
            self._admit(ctx, g)


@register("qlm", description="QLM: fixed fleet, request groups by class/SLO served in least-predicted-slack order, "
                             "batch eviction to host memory")
def make_qlm(scenario: Scenario, *, batch_classes: list[str] | None = None, batch_itl: float | None = None,
             tick: float = 10.0, give_up: float = 60.0, host_eviction: bool = True, calibrated: bool = True) -> QLM:
    """QLM (options as :class:`QLM`; ``calibrated`` as for Chiron)."""
    return QLM(scenario, batch_classes=batch_classes, batch_itl=batch_itl, tick=tick, give_up=give_up,
               host_eviction=host_eviction, calibrated=calibrated)


# --------------------------------------------------------------------------------------------
# QLM with request groups, virtual queues and several models (issue 31, item 5)
# --------------------------------------------------------------------------------------------


class QLMGroups(_Orchestrator):
    """QLM as published, on a fixed fleet shared by several models.

    * **Request groups**: the requests of one class (one model, one SLO, one token law), FCFS inside.
    * **Models and swaps**: each class belongs to a model (``models``: class name -> model name;
      default one model). An instance holds one model; serving another takes ``swap_time`` seconds
      after its last request has left (it admits nothing of the old model meanwhile); swaps are
      counted (``swaps``).
    * **Virtual queues**: each instance's queue is the ordered list of the groups of the model it
      holds (or is swapping to); the order is least slack first (below), groups beyond saving (slack
      below -``give_up`` s) last.
    * **Waiting-time estimator**: a group's requests wait ahead / (instances of its model x mu), mu the
      calibrated saturated rate of one instance for the class at its batch limit; the slack of an
      interactive group is its head's TTFT SLO - its age - the estimated wait - its prefill time, of
      a batch group its deadline - now - its waiting requests / (instances x mu).
    * **Plan and reorder** (every ``tick`` s, and at an arrival whose model holds no instance): the
      instances each model needs for its groups to meet their SLOs (interactive: the measured arrival
      rate over the last 30 s / (rho mu); batch: waiting / (slack x mu)), the fleet split among the
      models (scaled down in proportion when the fleet is short; spare instances stay where they
      are), an instance moved from a model with a
      surplus of at least one instance to one short of more than one (or with work and no instance),
      the least busy first, and not within ``dwell`` seconds of its last move; then each virtual
      queue is reordered.
    * **Eviction** (as documented): an interactive request whose estimated wait would miss its TTFT
      SLO (wait + prefill > ``headroom`` x TTFT SLO) evicts batch work (to host memory) on an
      instance of its model; otherwise it waits.
    * Batch limits: an instance runs the ITL-safe limit (on the mean context it holds now, Chiron's
      local autoscaler) while it holds a model with interactive classes, else the batch limit.
    """

    name = "qlm-groups"

    def __init__(self, scenario: Scenario, *, models: dict[str, str] | None = None, swap_time: float = 0.0,
                 batch_classes=None, batch_itl: float | None = None, tick: float = 1.0, give_up: float = 60.0,
                 utilisation: float = 0.8, headroom: float = 0.5, dwell: float = 120.0, host_eviction: bool = True,
                 calibrated: bool = True):
        super().__init__(scenario, batch_classes=batch_classes, batch_itl=batch_itl, tick=tick, calibrated=calibrated)
        who = self.name
        names = scenario.class_names
        models = dict(models or {})
        for c in models:
            if c not in names:
                raise ScenarioError(f"{who}: models: {c!r} is not a class of the scenario ({', '.join(names)})")
        self.model_of = [str(models.get(c, "model")) for c in names]
        self.models = sorted(set(self.model_of))
        self.swap_time = _positive(who, "swap_time", swap_time, zero=True)
        self.give_up = _positive(who, "give_up", give_up, zero=True)
        self.rho = _positive(who, "utilisation", utilisation)
        self.headroom = _positive(who, "headroom", headroom)
        self.dwell = _positive(who, "dwell", dwell, zero=True)
        self.host = bool(host_eviction)
        cl = scenario.classes
        self.ttft_pre = [math.ceil(c.prompt / self.gpu.chunk) * self.gpu.tau_mix for c in cl]
        # per class: the calibrated rate of one instance serving it (interactive at the ITL-safe batch
        # limit, batch at the batch limit)
        from fluidopt.fluid.saturation import saturated_throughput

        self.mu = []
        for i, c in enumerate(cl):
            p, d = class_laws(c)
            b = self.b_bat if self.is_batch[i] else self.b_int
            self.mu.append(float(saturated_throughput(self.gpu, b, [p], [d]).rate) if calibrated
                           else batch_throughput(self.gpu, b, c.prompt, c.decode))
        self.classes_of = {m: [i for i in range(len(cl)) if self.model_of[i] == m] for m in self.models}
        self.has_int = {m: any(not self.is_batch[i] for i in self.classes_of[m]) for m in self.models}

    def setup(self, ctx: Context) -> None:
        self.gpus = ctx.fleet_online()
        ctx.set_pool(self.gpus, 0, max_decodes=self.b_int)
        n = ctx.n_gpus
        self.loaded: list[str | None] = [None] * n  # the model an instance holds
        self.target: list[str | None] = [None] * n  # the model the plan gives it
        self.ready = [0.0] * n  # when its swap is done
        self.moved = [-math.inf] * n  # when the plan last gave it another model
        self.swaps = 0
        self.arrived = [0] * len(self.model_of)
        self.rate_win: list[tuple[float, list[int]]] = [(0.0, [0] * len(self.model_of))]
        # the initial split: the models in turn (the first plan corrects it)
        for k, g in enumerate(self.gpus):
            m = self.models[k % len(self.models)]
            self.loaded[g] = self.target[g] = m
        self.order: dict[str, list[int]] = {m: list(self.classes_of[m]) for m in self.models}
        self.k_of = {m: sum(1 for g in self.gpus if self.target[g] == m) for m in self.models}

    # -- the estimator ---------------------------------------------------------------------------
    def _slack(self, ctx: Context, i: int) -> float:
        now = ctx.now
        k = max(1, self.k_of[self.model_of[i]])
        n = ctx.n_wait_prefill(i)
        if self.is_batch[i]:
            dl = self.batch_deadline(ctx)
            return dl - now - n / (k * self.mu[i]) if math.isfinite(dl) else math.inf
        r = ctx.head(PREFILL_QUEUE, i)
        if r < 0 or self.ttft[i] is None:
            return math.inf
        return self.ttft[i] - (now - ctx.req_arrival(r)) - n / (k * self.mu[i]) - self.ttft_pre[i]

    def _reorder(self, ctx: Context) -> None:
        for m in self.models:
            self._reorder_model(ctx, m)

    # -- plan ------------------------------------------------------------------------------------
    def _plan(self, ctx: Context) -> None:
        now = ctx.now
        w = self.rate_win
        w.append((now, list(self.arrived)))
        while len(w) > 2 and w[1][0] <= now - 30.0:
            w.pop(0)
        t0, a0 = w[0]
        span = max(now - t0, self.tick_interval)
        need: dict[str, float] = {}
        for m in self.models:
            d = 0.0
            for i in self.classes_of[m]:
                if self.is_batch[i]:
                    nb = ctx.n_wait_prefill(i)
                    if nb:
                        dl = self.batch_deadline(ctx)
                        slack = max(dl - now, self.tick_interval) if math.isfinite(dl) else 3600.0
                        d += nb / (slack * self.mu[i])
                else:
                    lam = (self.arrived[i] - a0[i]) / span
                    d += lam / (self.rho * self.mu[i]) + ctx.n_wait_prefill(i) / (self.mu[i] * 10.0)
            busy = any(ctx.n_wait_prefill(i) + ctx.n_prefill(i) + ctx.n_decode_mixed(i) + ctx.n_decode_solo(i)
                       for i in self.classes_of[m])
            need[m] = max(d, 1.0 if busy or d > 0 else 0.0)
        n = len(self.gpus)
        total = sum(need.values())
        if total <= 0:
            return
        # the instances each model needs (scaled down when the fleet is short); the spare ones stay
        # where they are: a model keeps what it has unless another is short
        share = {m: need[m] * min(1.0, n / total) for m in self.models}
        have = {m: sum(1 for g in self.gpus if self.target[g] == m) for m in self.models}
        # move an instance only for a deficit of more than a whole instance against a surplus of at
        # least one (hysteresis: a swap costs swap_time and the drain before it), or to give a model
        # with work its first instance
        while True:
            short = [m for m in self.models if share[m] - have[m] > 1.0 or (need[m] > 0 and have[m] == 0)]
            over = [m for m in self.models if have[m] - share[m] >= 1.0 and have[m] > 1
                    and (share[m] - have[m] <= 1.0)]
            if not short or not over:
                break
            m = max(short, key=lambda x: share[x] - have[x])
            cands = [g for g in self.gpus if self.target[g] in over and now >= self.moved[g] + self.dwell]
            if not cands:
                break
            g = min(cands, key=lambda h: ctx.gpu_decodes(h) + (ctx.gpu_prefill(h) >= 0))
            have[self.target[g]] -= 1
            self.target[g] = m
            self.moved[g] = now
            have[m] += 1
        self.k_of = have
        self._reorder(ctx)

    # -- serving ---------------------------------------------------------------------------------
    def _swap_if_empty(self, ctx: Context, g: int) -> None:
        if self.loaded[g] != self.target[g] and ctx.gpu_prefill(g) < 0 and ctx.gpu_decodes(g) == 0:
            self.loaded[g] = self.target[g]
            self.ready[g] = ctx.now + self.swap_time
            self.swaps += 1

    def _serving(self, ctx: Context, g: int) -> str | None:
        """The model g serves now (None: swapping or about to)."""
        if self.loaded[g] != self.target[g] or ctx.now < self.ready[g]:
            return None
        return self.loaded[g]

    def _limit(self, ctx: Context, g: int, m: str) -> None:
        """The ITL-safe limit on an instance of a model with interactive classes (on the context it holds
        now, as Chiron's local autoscaler), else the batch limit."""
        lim = self.b_int if self.has_int[m] else self.b_bat
        k = ctx.gpu_decodes(g) + (ctx.gpu_prefill(g) >= 0)
        if self.has_int[m] and k >= 4 and self.gpu.kv_time_per_token > 0:  # Chiron's local autoscaler
            lim = largest_batch(self.gpu, self.itl_int, ctx.gpu_kv_used(g) / k)
        if ctx.gpu_max_decodes(g) != lim:
            ctx.set_max_decodes(g, lim)

    def _admit(self, ctx: Context, g: int) -> None:
        m = self._serving(ctx, g)
        if m is None or not ctx.gpu_online(g):
            return
        while ctx.qlen(DECODE_QUEUE) and ctx.gpu_decodes(g) < ctx.gpu_max_decodes(g) and ctx.gpu_free(g) > 0:
            r = self.head_of(ctx, DECODE_QUEUE, self.classes_of[m])
            if r < 0 or not self.try_decode(ctx, r, g):
                break
        if not self.has_room(ctx, g):
            return
        for i in self.order[m]:
            r = ctx.head(PREFILL_QUEUE, i)
            if r >= 0:
                self.try_prefill(ctx, r, g)
                return

    def on_tick(self, ctx: Context) -> None:
        self._plan(ctx)
        for g in self.gpus:
            self._swap_if_empty(ctx, g)
            m = self._serving(ctx, g)
            if m is not None:
                self._limit(ctx, g, m)
                self._admit(ctx, g)

    def on_arrival(self, ctx: Context, r: int) -> None:
        i = ctx.req_class(r)
        self.arrived[i] += 1
        ctx.enqueue(r, PREFILL_QUEUE)
        m = self.model_of[i]
        if not any(self.target[g] == m for g in self.gpus):
            self._plan(ctx)
        elif i in self.order[m][:1] or not self.is_batch[i]:
            self._reorder_model(ctx, m)
        for g in self.gpus:
            if self._serving(ctx, g) == m and self.has_room(ctx, g):
                self._admit(ctx, g)
                if ctx.head(PREFILL_QUEUE, i) < 0:
                    return
        if not self.is_batch[i] and self.bat:
            self._maybe_evict(ctx, i, m)

    def _reorder_model(self, ctx: Context, m: str) -> None:
        keyed = []
        for i in self.classes_of[m]:
            s = self._slack(ctx, i)
            keyed.append((s < -self.give_up, s, i))
        keyed.sort()
        self.order[m] = [i for _, _, i in keyed]

    def _maybe_evict(self, ctx: Context, i: int, m: str) -> None:
        """The interactive group i waits: evict batch work on an instance of model m if its estimated
        wait would miss the TTFT SLO (wait + prefill > headroom x SLO)."""
        if self.ttft[i] is None:
            return
        k = max(1, self.k_of[m])
        r = ctx.head(PREFILL_QUEUE, i)
        if r < 0:
            return
        age = ctx.now - ctx.req_arrival(r)
        wait = ctx.n_wait_prefill(i) / (k * self.mu[i])
        if age + wait + self.ttft_pre[i] <= self.headroom * self.ttft[i]:
            return
        for g in self.gpus:
            if self._serving(ctx, g) != m:
                continue
            pr = ctx.gpu_prefill(g)
            if pr >= 0 and self.is_batch[ctx.req_class(pr)] and ctx.gpu_decodes(g) < ctx.gpu_max_decodes(g):
                if ctx.evict(pr, self.host):
                    self.try_prefill(ctx, r, g)
                    return
        for g in self.gpus:
            if self._serving(ctx, g) != m or ctx.gpu_prefill(g) >= 0:
                continue
            for q in reversed(ctx.gpu_requests(g)):
                if self.is_batch[ctx.req_class(q)] and ctx.evict(q, self.host):
                    if self.has_room(ctx, g):
                        self.try_prefill(ctx, r, g)
                        return

    def on_prefill_done(self, ctx: Context, r: int, g: int) -> None:
        if ctx.gpu_decodes(g) < ctx.gpu_max_decodes(g) and ctx.gpu_free(g) > 0 and self.try_decode(ctx, r, g):
            return
        m = self.model_of[ctx.req_class(r)]
        for h in self.gpus:
            if self._serving(ctx, h) == m and ctx.gpu_decodes(h) < ctx.gpu_max_decodes(h) and ctx.gpu_free(h) > 0:
                if self.try_decode(ctx, r, h):
                    return

    def on_slot_freed(self, ctx: Context, g: int) -> None:
        self._swap_if_empty(ctx, g)
        self._admit(ctx, g)


@register("qlm-groups", description="QLM as published: request groups, per-instance virtual queues, several models "
                                    "with a swap time, the waiting-time estimator, plan and reorder every tick")
def make_qlm_groups(scenario: Scenario, *, models: dict[str, str] | None = None, swap_time: float = 0.0,
                    batch_classes: list[str] | None = None, batch_itl: float | None = None, tick: float = 1.0,
                    give_up: float = 60.0, utilisation: float = 0.8, headroom: float = 0.5, dwell: float = 120.0,
                    host_eviction: bool = True, calibrated: bool = True) -> QLMGroups:
    """QLM with request groups and virtual queues (options as :class:`QLMGroups`): ``models`` maps class
    names to model names (default one model), ``swap_time`` (s to load another model on an instance)."""
    return QLMGroups(scenario, models=models, swap_time=swap_time, batch_classes=batch_classes, batch_itl=batch_itl,
                     tick=tick, give_up=give_up, utilisation=utilisation, headroom=headroom, dwell=dwell,
                     host_eviction=host_eviction, calibrated=calibrated)
