"""Chiron (interactive / mixed / batch pools, local and global autoscalers) and the orchestrator that
follows the multi-period fluid plan (:class:`FluidPlan`, Chiron's pools sized by the LP).
"""

from __future__ import annotations

import math

from fluidopt.control.orchestration.common import (
    BATCH,
    INTERACTIVE,
    MIXED,
    _Orchestrator,
    _positive,
    _room_in,
    interactive_step,
)
from fluidopt.control.protocol import DECODE_QUEUE, PREFILL_QUEUE, Context
from fluidopt.control.registration import register
from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import Scenario
from fluidopt.fluid.multiperiod import (
    BacklogJob,
    largest_batch,
    plan_fleet,
)
from fluidopt.fluid.saturation import class_laws

__all__ = ["Chiron", "FluidPlan"]


# --------------------------------------------------------------------------------------------
# Chiron
# --------------------------------------------------------------------------------------------


class Chiron(_Orchestrator):
    """Chiron: typed instance pools, local and global autoscalers (see the module docstring)."""

    name = "chiron"

    def __init__(self, scenario: Scenario, *, interactive_gpus: int | None = None, batch_classes=None,
                 batch_itl: float | None = None, tick: float = 10.0, safety: float = 1.1, margin: float | None = None,
                 host_eviction: bool = True, interactive_scaling: bool = True, interactive_spares: int | None = None,
                 min_interactive: int = 1, interactive_utilisation: float = 0.8, cooldown: float = 600.0,
                 window: float = 300.0, headroom: float = 0.5, calibrated: bool = True, shed_mixed: bool = False,
                 mixed_batch_limit: bool = True, overflow_wait: float | None = None, lend_mixed: bool = True,
                 estimator: str = "statistical", z: float = 1.645, lend_cooldown: float = 60.0,
                 startup_cv: float = 0.0, warm_pool: int = 0, warm_startup: float = 5.0):
        super().__init__(scenario, batch_classes=batch_classes, batch_itl=batch_itl, tick=tick, calibrated=calibrated)
        who = self.name
        self.shed_mixed = bool(shed_mixed)
        # the local autoscaler sets a mixed instance's batch limit from the ITL target of the requests
        # it serves: the batch instances' limit while it holds batch work only, the ITL-safe one as soon
        # as an interactive request is placed there (batch decodes beyond it evicted to host memory)
        self.mixed_batch_limit = bool(mixed_batch_limit)
        # the interactive autoscaler lends over-provisioned mixed instances to the batch work (no
        # interactive work placed there) instead of keeping them, and takes them back at once
        self.lend = bool(lend_mixed) and self.mixed_batch_limit
        self.lend_cooldown = _positive(who, "lend_cooldown", lend_cooldown, zero=True)
        # start-up times (issue 31, item 6): Gamma-distributed with the fleet's start-up delay as mean
        # and this CV (0: fixed), and a warm pool of instances that start in warm_startup seconds
        self.startup_cv = _positive(who, "startup_cv", startup_cv, zero=True)
        if isinstance(warm_pool, bool) or not isinstance(warm_pool, int) or warm_pool < 0:
            raise ScenarioError(f"{who}: warm_pool: expected an integer >= 0, got {warm_pool!r}")
        self.warm_pool = warm_pool
        self.warm_startup = _positive(who, "warm_startup", warm_startup)
        ttfts = [c.ttft_slo for c in scenario.classes if c.ttft_slo is not None]
        if overflow_wait is None:
            overflow_wait = 0.1 * min(ttfts) if ttfts and self.mixed_batch_limit else 0.0
        self.overflow_wait = _positive(who, "overflow_wait", overflow_wait, zero=True)
        self.safety = _positive(who, "safety", safety)
        self.int_scaling = bool(interactive_scaling)
        for nm, v in (("interactive_spares", interactive_spares), ("min_interactive", min_interactive)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ScenarioError(f"{who}: {nm}: expected an integer >= 0, got {v!r}")
        self.int_spares_opt = interactive_spares
        self.min_int = min_interactive
        self.rho_int = _positive(who, "interactive_utilisation", interactive_utilisation)
        if self.rho_int > 1:
            raise ScenarioError(f"{who}: interactive_utilisation: expected a fraction in (0, 1], got {interactive_utilisation!r}")
        self.cooldown = _positive(who, "cooldown", cooldown, zero=True)
        self.window_s = _positive(who, "window", window)
        self.headroom = _positive(who, "headroom", headroom)
        startup = 0.0 if scenario.fleet is None else scenario.fleet.startup_delay
        # finish the batch work this long before its deadline: the last requests' own service time
        # and the start-up of instances added late are not in the fluid rate estimate
        if estimator not in ("statistical", "safety"):
            raise ScenarioError(f"{who}: estimator: expected 'statistical' or 'safety', got {estimator!r}")
        self.estimator = estimator
        self.z = _positive(who, "z", z, zero=True)
        # the output-length CV of the batch classes (the statistical bound's spread per request)
        cvs = []
        for i in self.bat:
            law = class_laws(scenario.classes[i])[1]
            m = law.mean
            cvs.append(math.sqrt(max(0.0, law.expect(lambda v, m=m: (v - m) ** 2))) / m)
        self.cv_bat = max(cvs, default=1.0)
        if margin is None:
            # statistical: the last request admitted needs its own time in a batch instance (Little's
            # law at the batch limit: b_bat / mu_bat) plus one tick; safety: the start-up + 2 minutes
            margin = self.rates.b_bat / self.mu_bat + tick if estimator == "statistical" else startup + 120.0
        self.margin = _positive(self.name, "margin", margin, zero=True)
        self.host = bool(host_eviction)
        cl = scenario.classes
        if interactive_gpus is None:
            # enough interactive instances for the mean interactive load at the ITL-safe batch
            lam = sum(cl[i].rate for i in self.inter)
            interactive_gpus = max(1, math.ceil(lam / self.rates.mu_int)) if lam else 0
        if isinstance(interactive_gpus, bool) or not isinstance(interactive_gpus, int) or interactive_gpus < 0:
            raise ScenarioError(f"chiron: interactive_gpus: expected an integer >= 0, got {interactive_gpus!r}")
        self.n_int = interactive_gpus
        self.fleet_fixed = scenario.fleet is None
        # one GPU's interactive completions/s at the ITL-safe batch: the interactive autoscaler's unit
        self.mu_int_gpu = self.rates.mu_int
        self.lam_int = sum(cl[i].rate for i in self.inter)

    def setup(self, ctx: Context) -> None:
        online = ctx.fleet_online()
        n = ctx.n_gpus
        a = min(self.n_int, len(online))
        self.pool_of = [BATCH] * n
        inter, mixed = online[:a], online[a:]
        rest = [g for g in range(n) if g not in online]
        if not rest and not mixed:  # a fixed fleet without spare GPUs: keep the last one for batch work
            mixed = inter[-1:]
            inter = inter[:-1]
        for g in inter:
            self.pool_of[g] = INTERACTIVE
        for g in mixed:
            self.pool_of[g] = MIXED
        spares = self._spares(len(rest), len(inter) + len(mixed)) if not self.fleet_fixed else 0
        if spares:  # offline GPUs typed interactive (the last ones): the interactive autoscaler adds them
            rest, extra = rest[: len(rest) - spares], rest[len(rest) - spares:]
            for g in extra:
                self.pool_of[g] = INTERACTIVE
            inter = inter + extra
        if inter:
            ctx.set_pool(inter, INTERACTIVE, max_decodes=self.b_int)
        if mixed:
            ctx.set_pool(mixed, MIXED, max_decodes=self.b_int)
        if rest:
            ctx.set_pool(rest, BATCH, max_decodes=self.b_bat)
        while ctx.n_pools < 3:  # make sure all three pools exist
            ctx.set_pool([], ctx.n_pools)
        self.ip = [ctx.idle_prefill(p) for p in range(3)]
        self.fd = [ctx.free_decode(p) for p in range(3)]
        self.batch_gpus = rest  # the GPUs the global autoscaler adds and drains
        self.mixed_done = 0  # batch completions on mixed instances (the measured part of the estimate)
        self.batch_done = 0  # batch completions on batch instances
        self.batch_gpu_s = 0.0  # online batch-instance seconds, for their measured rate
        self.window: list[tuple[float, int]] = [(0.0, 0)]
        self.win4: list[tuple[float, int, int, float]] = [(0.0, 0, 0, 0.0)]
        self.startup = ctx.startup_delay() if hasattr(ctx, "startup_delay") else 0.0
        self.warm_back: list[float] = [-math.inf] * getattr(self, "warm_pool", 0)  # when each warm slot is ready
        self.startups: list[float] = []  # the start-up time of every instance added
        # the interactive autoscaler's state: arrivals counted per tick, recent per-tick rates, since
        # when the interactive capacity has been above the need, the GPUs it added
        self.int_arrived = 0
        self.int_seen = 0
        self.int_rates: list[tuple[float, float]] = []
        self.over_since: float | None = None
        self.int_added: list[int] = []
        self.base_gpus = [g for g in range(n) if self.pool_of[g] != BATCH]
        self.mixed_gpus = [g for g in range(n) if self.pool_of[g] == MIXED]
        self.bmode = [False] * n  # a mixed instance at the batch limit (no interactive work on it)
        self.lent = [False] * n  # a mixed instance the interactive autoscaler lent to the batch work
        self.mode_switches = 0  # mixed instances switched back to the ITL-safe limit (evicting batch work)

    def _spares(self, offline: int, base: int) -> int:
        """Offline GPUs reserved for the interactive pool: the option, or (default) enough for twice the
        scenario's interactive rate at the target utilisation beyond the base fleet; all of them when
        there are no batch classes; none without interactive scaling."""
        if not self.int_scaling or offline == 0:
            return 0
        if self.int_spares_opt is not None:
            return min(offline, self.int_spares_opt)
        if not self.bat:
            return offline
        need = math.ceil(2.0 * self.lam_int / (self.rho_int * self.mu_int_gpu) - 1e-9)
        return max(0, min(offline, need - base))

    # -- placement -------------------------------------------------------------------------------
    def _pick(self, ctx: Context, p: int) -> int:
        return _room_in(ctx, self.ip[p])

    def _interactive_on(self, ctx: Context, g: int) -> bool:
        """An interactive request runs on g (its prefill or a decode)."""
        pr = ctx.gpu_prefill(g)
        if pr >= 0 and not self.is_batch[ctx.req_class(pr)]:
            return True
        by = ctx.gpu_decodes_by_class(g)
        return any(by[i] for i in self.inter)

    def _to_batch_limit(self, ctx: Context, g: int) -> None:
        """A mixed instance with no interactive work on it takes the batch instances' limit."""
        if self.mixed_batch_limit and not self.bmode[g] and ctx.gpu_online(g) and not self._interactive_on(ctx, g):
            self.bmode[g] = True
            if ctx.gpu_max_decodes(g) < self.b_bat:
                ctx.set_max_decodes(g, self.b_bat)

    def _to_interactive_limit(self, ctx: Context, g: int) -> bool:
        """Before an interactive request starts on mixed instance g at the batch limit: back to the
        ITL-safe limit, evicting (to host memory) the batch decodes beyond it, the latest first, so that
        a slot stays for the interactive decode. False if the decodes could not be brought below it."""
        if not self.bmode[g]:
            return True
        self.bmode[g] = False
        self.mode_switches += 1
        lim = self.b_int
        ctx.set_max_decodes(g, lim)
        if ctx.gpu_decodes(g) >= lim:
            pr = ctx.gpu_prefill(g)
            for r in reversed(ctx.gpu_requests(g)):
                if ctx.gpu_decodes(g) < lim:
                    break
                if r != pr and self.is_batch[ctx.req_class(r)]:
                    ctx.evict(r, self.host)
        return ctx.gpu_decodes(g) < lim

    def _pick_mixed(self, ctx: Context, prefill: bool) -> int:
        """A mixed instance for an interactive prefill (idle prefill slot) or decode, keeping interactive
        work on as few mixed instances as it can: one at the ITL-safe limit with room; for a prefill,
        else one at the ITL-safe limit whose batch prefill is evicted; else the one at the batch limit
        with the fewest decodes, switched to the ITL-safe limit (:meth:`_to_interactive_limit`); -1."""
        if not self.mixed_batch_limit:
            return self._pick(ctx, MIXED) if prefill else self.fd[MIXED].choice()
        best, bd = -1, math.inf
        busy = -1
        for g in self.mixed_gpus:
            if self.lent[g] or not ctx.gpu_online(g) or ctx.gpu_free(g) <= 0:
                continue
            d = ctx.gpu_decodes(g)
            pr = ctx.gpu_prefill(g)
            if not self.bmode[g]:
                if d < ctx.gpu_max_decodes(g):
                    if not prefill or pr < 0:
                        return g
                    if busy < 0 and self.is_batch[ctx.req_class(pr)]:
                        busy = g
            elif d < bd and (not prefill or pr < 0):
                best, bd = g, d
        if busy >= 0 and ctx.evict(ctx.gpu_prefill(busy), self.host):
            return busy
        if best >= 0 and self._to_interactive_limit(ctx, best):
            return best
        return -1

    def _evict_batch_on_mixed(self, ctx: Context, prefill: bool) -> int:
        """Make room on a mixed instance by evicting batch work; the GPU freed, or -1."""
        bat = self.is_batch
        for g in range(len(self.pool_of)):
            if self.pool_of[g] != MIXED or self.lent[g] or not ctx.gpu_online(g):
                continue
            pr = ctx.gpu_prefill(g)
            if prefill:
                if pr >= 0 and bat[ctx.req_class(pr)]:
                    if ctx.gpu_decodes(g) >= ctx.gpu_max_decodes(g):
                        continue
                    if ctx.evict(pr, self.host):
                        return g
                    continue
                if pr >= 0:
                    continue
                if ctx.gpu_decodes(g) < ctx.gpu_max_decodes(g):
                    return g
            # a batch decode to evict (prefill: the decode slot the new request will need)
            if sum(ctx.gpu_decodes_by_class(g)[i] for i in self.bat) == 0:
                continue
            for r in ctx.gpu_requests(g):
                if r != pr and bat[ctx.req_class(r)] and ctx.evict(r, self.host):
                    if not prefill or ctx.gpu_prefill(g) < 0:
                        return g
                    break
        return -1

    def _place_interactive_prefill(self, ctx: Context, r: int, overflow: bool = True) -> bool:
        """Start interactive r's prefill: on an interactive instance, else a mixed one serving
        interactive work; with ``overflow``, else by switching or evicting batch work on a mixed one."""
        g = self._pick(ctx, INTERACTIVE)
        if g < 0 and not overflow:
            return False
        if g < 0:
            g = self._pick_mixed(ctx, True)
        if g < 0:
            g = self._evict_batch_on_mixed(ctx, True)
        if g >= 0 and self.bmode[g] and not self._to_interactive_limit(ctx, g):
            return False
        return g >= 0 and self.has_room(ctx, g) and self.try_prefill(ctx, r, g)

    def _place_decode(self, ctx: Context, r: int, g: int) -> bool:
        if ctx.gpu_online(g) and ctx.gpu_decodes(g) < ctx.gpu_max_decodes(g) and ctx.gpu_free(g) > 0:
            if self.try_decode(ctx, r, g):
                return True
        inter = not self.is_batch[ctx.req_class(r)]
        pools = (INTERACTIVE, MIXED) if inter else (BATCH, MIXED)
        for p in pools:
            h = self._pick_mixed(ctx, False) if p == MIXED and inter else self.fd[p].choice()
            if h >= 0 and self.try_decode(ctx, r, h):
                return True
        if inter:
            h = self._evict_batch_on_mixed(ctx, False)
            if h >= 0 and self.bmode[h] and not self._to_interactive_limit(ctx, h):
                return False
            if h >= 0 and ctx.gpu_decodes(h) < ctx.gpu_max_decodes(h) and ctx.gpu_free(h) > 0:
                return self.try_decode(ctx, r, h)
        return False

    # -- events ------------------------------------------------------------------------------------
    def on_arrival(self, ctx: Context, r: int) -> None:
        if self.is_batch[ctx.req_class(r)]:
            ctx.enqueue(r, PREFILL_QUEUE)
            self._fill_batch(ctx)
            return
        self.int_arrived += 1
        if self.interactive_waiting(ctx) == 0:
            self._place_interactive_prefill(ctx, r, self.overflow_wait <= 0)
        self._overflow(ctx)

    def _overflow(self, ctx: Context) -> None:
        """Interactive requests that have waited ``overflow_wait`` seconds for an interactive instance
        go to a mixed instance at the batch limit (switched to the ITL-safe one) or evict batch work."""
        w = self.overflow_wait
        if w <= 0:
            return
        now = ctx.now
        while True:
            r = self.head_of(ctx, PREFILL_QUEUE, self.inter)
            if r < 0 or now - ctx.req_arrival(r) < w or not self._place_interactive_prefill(ctx, r):
                return

    def _fill_batch(self, ctx: Context) -> None:
        mixed_ok = self.interactive_waiting(ctx) == 0
        for p in (BATCH, MIXED):
            if p == MIXED and not mixed_ok:
                return
            while True:
                r = self.head_of(ctx, PREFILL_QUEUE, self.bat)
                if r < 0:
                    return
                g = self._pick(ctx, p)
                if g < 0 or not self.try_prefill(ctx, r, g):
                    break

    def on_prefill_done(self, ctx: Context, r: int, g: int) -> None:
        self._place_decode(ctx, r, g)

    def on_decode_done(self, ctx: Context, r: int, g: int) -> None:
        if self.is_batch[ctx.req_class(r)]:
            if self.pool_of[g] == MIXED:
                self.mixed_done += 1
            elif self.pool_of[g] == BATCH:
                self.batch_done += 1
        elif self.pool_of[g] == MIXED and self.mixed_batch_limit:
            self._to_batch_limit(ctx, g)  # (only once no interactive request is left on g)

    def on_slot_freed(self, ctx: Context, g: int) -> None:
        if not ctx.gpu_online(g):
            return
        self._overflow(ctx)
        p = self.pool_of[g]
        if self.lent[g]:
            p = BATCH  # lent to the batch work: no interactive work placed here
        # decodes waiting for a slot first (their prefill is done), interactive before batch
        while ctx.qlen(DECODE_QUEUE) and ctx.gpu_decodes(g) < ctx.gpu_max_decodes(g) and ctx.gpu_free(g) > 0:
            r = self.head_of(ctx, DECODE_QUEUE, self.inter) if p != BATCH else -1
            if r >= 0 and self.bmode[g] and not self._to_interactive_limit(ctx, g):
                r = -1
            if r < 0 and p != INTERACTIVE:
                r = self.head_of(ctx, DECODE_QUEUE, self.bat)
            if r < 0 or not self.try_decode(ctx, r, g):
                break
        if not self.has_room(ctx, g):
            return
        if p != BATCH:
            r = self.head_of(ctx, PREFILL_QUEUE, self.inter)
            if r >= 0 and self.bmode[g] and ctx.now - ctx.req_arrival(r) < self.overflow_wait:
                r = -1  # (it waits a little longer for an interactive instance)
            if r >= 0:
                if self.bmode[g] and (not self._to_interactive_limit(ctx, g) or not self.has_room(ctx, g)):
                    return
                self.try_prefill(ctx, r, g)
                return
        if p != INTERACTIVE and (p == BATCH or self.interactive_waiting(ctx) == 0):
            r = self.head_of(ctx, PREFILL_QUEUE, self.bat)
            if r >= 0:
                if p == MIXED and self.mixed_batch_limit:
                    self._to_batch_limit(ctx, g)
                self.try_prefill(ctx, r, g)

    def on_tick(self, ctx: Context) -> None:
        self._local_autoscaler(ctx)
        if not self.fleet_fixed:
            self._global_autoscaler(ctx)
            if self.int_scaling:
                self._interactive_autoscaler(ctx)

    def _interactive_short(self, ctx: Context) -> bool:
        """TTFT or ITL headroom is gone: the oldest waiting interactive request has used ``headroom``
        of its TTFT SLO, or an interactive decode waits for a slot at the ITL-safe batch limit."""
        now = ctx.now
        for i in self.inter:
            if ctx.n_wait_decode(i):
                return True
            slo = self.ttft[i]
            r = ctx.head(PREFILL_QUEUE, i)
            if slo is not None and r >= 0 and now - ctx.req_arrival(r) >= self.headroom * slo:
                return True
        return False

    def _interactive_autoscaler(self, ctx: Context) -> None:
        """The interactive pool from the interactive load (see :func:`interactive_step`): add
        interactive-serving instances (reserved interactive spares first, then drained mixed ones) when
        the load of the last tick or the TTFT/ITL headroom says the pool is short; drain one per tick
        once it has been over-provisioned against the peak rate of the last ``window`` seconds for
        ``cooldown`` seconds: while batch work is in the system only the instances it added (the mixed
        ones lend their capacity to the batch work), otherwise any of them, never below
        ``min_interactive``."""
        now = ctx.now
        if self.lend and any(self.lent) and not self.batch_in_system(ctx):
            # no batch work left: the lent instances were judged surplus for the interactive load
            # (over-provisioned for ``cooldown`` seconds): drained now
            for g in self.mixed_gpus:
                if self.lent[g]:
                    self.lent[g] = False
                    if ctx.gpu_state(g) in ("online", "starting"):
                        ctx.drain_gpu(g)
        rate = (self.int_arrived - self.int_seen) / self.tick_interval
        self.int_seen = self.int_arrived
        w = self.int_rates
        w.append((now, rate))
        while w and w[0][0] <= now - self.window_s:
            w.pop(0)
        peak = max(r for _, r in w)
        up = [g for g in self.base_gpus if ctx.gpu_state(g) in ("online", "starting") and not self.lent[g]]
        lending = self.lend and not self.shed_mixed and self.batch_in_system(ctx) > 0 and not self.int_added
        step, self.over_since = interactive_step(
            rate, peak, len(up), self.mu_int_gpu, self.rho_int, self._interactive_short(ctx), now, self.over_since,
            self.lend_cooldown if lending else self.cooldown, self.min_int)
        if step > 0:
            for g in self.mixed_gpus:  # lent mixed instances first: back at once, no start-up
                if step > 0 and self.lent[g] and ctx.gpu_online(g):
                    self.lent[g] = False
                    step -= 1
            idle = [g for g in self.base_gpus if ctx.gpu_state(g) == "offline"]
            idle.sort(key=lambda g: self.pool_of[g] != INTERACTIVE)  # interactive spares first
            for g in idle[:step]:
                self._add(ctx, g)
                self.int_added.append(g)
        elif step < 0:
            self.int_added = [g for g in self.int_added if ctx.gpu_state(g) in ("online", "starting")]
            if self.batch_in_system(ctx) and not self.shed_mixed:
                cands = list(self.int_added)
                if not cands and self.lend:  # lend a mixed instance to the batch work instead
                    mix = [g for g in up if self.pool_of[g] == MIXED and ctx.gpu_online(g)]
                    if mix:
                        g = min(mix, key=lambda h: sum(ctx.gpu_decodes_by_class(h)[i] for i in self.inter))
                        self.lent[g] = True
                        self._to_batch_limit(ctx, g)
                        return
            else:  # the GPUs it added, then mixed, then interactive ones
                cands = self.int_added + sorted((g for g in up if g not in self.int_added),
                                                key=lambda g: self.pool_of[g] != MIXED)
            if cands:
                # a starting one first (cancelled at no cost), else the one with the least work
                g = min(cands, key=lambda h: (ctx.gpu_state(h) == "online", ctx.gpu_decodes(h)
                                              + (ctx.gpu_prefill(h) >= 0)))
                ctx.drain_gpu(g)
                if g in self.int_added:
                    self.int_added.remove(g)

    def _expected_startup(self, ctx: Context) -> float:
        """The start-up time of the next instance added: a warm one's if a warm slot is ready, else the
        mean."""
        if any(t <= ctx.now for t in self.warm_back):
            return min(self.warm_startup, self.startup)
        return self.startup

    def _add(self, ctx: Context, g: int) -> None:
        """Add GPU g with its start-up time: from the warm pool (``warm_startup`` s; the slot is ready
        again a cold start-up later) if a slot is ready, else Gamma with mean the fleet's start-up delay
        and CV ``startup_cv`` (drawn from the controller's stream), else the fleet's delay."""
        now = ctx.now
        delay = self.startup
        for k, t in enumerate(self.warm_back):
            if t <= now:
                delay = min(self.warm_startup, self.startup)
                self.warm_back[k] = now + self.startup
                break
        else:
            if self.startup_cv > 0 and self.startup > 0:
                shape = 1.0 / self.startup_cv ** 2
                delay = ctx.rng.gammavariate(shape, self.startup / shape)
        self.startups.append(delay)
        if delay == self.startup:
            ctx.add_gpu(g)
        else:
            ctx.add_gpu(g, startup_delay=max(delay, 1e-6))  # (0 would bring it online inside this call)

    def _local_autoscaler(self, ctx: Context) -> None:
        """Each online instance's batch limit from its ITL target and the context it holds now."""
        kap = self.gpu.kv_time_per_token
        if kap <= 0:
            return
        for g in range(len(self.pool_of)):
            if not ctx.gpu_online(g):
                continue
            if self.mixed_batch_limit and self.pool_of[g] == MIXED and not self.bmode[g]:
                self._to_batch_limit(ctx, g)
            k = ctx.gpu_decodes(g) + (ctx.gpu_prefill(g) >= 0)
            if k < 4:
                continue  # too few requests for a context estimate: keep the planned limit
            itl = self.itl_bat if self.pool_of[g] == BATCH or self.bmode[g] else self.itl_int
            b = largest_batch(self.gpu, itl, ctx.gpu_kv_used(g) / k)
            if b != ctx.gpu_max_decodes(g):
                ctx.set_max_decodes(g, b)

    def _batch_work(self, ctx: Context) -> tuple[int, list[int]] | None:
        """(batch requests in the system, batch instances online or starting); with no batch work left,
        every batch instance is drained and None comes back."""
        nb = self.batch_in_system(ctx)
        active = [g for g in self.batch_gpus if ctx.gpu_state(g) in ("online", "starting")]
        if nb == 0:
            for g in active:
                ctx.drain_gpu(g)
            return None
        return nb, active

    def _global_autoscaler(self, ctx: Context) -> None:
        """Batch instances from the waiting-time estimate of the batch work against its deadline."""
        work = self._batch_work(ctx)
        if work is None:
            return
        nb, active = work
        left = self.batch_deadline(ctx) - ctx.now - self.margin
        if not math.isfinite(left):
            return
        # requests/s to start in time: those already running are served where they are
        waiting = sum(ctx.n_wait_prefill(i) + ctx.n_wait_decode(i) for i in self.bat)
        if self.estimator == "statistical":
            # Chiron's statistical bound: N requests' work is N E[D] + z sqrt(N) sd(D) tokens, so
            # the bound on their waiting time tightens as the queue grows (1 + z cv / sqrt(N))
            need = waiting * (1.0 + self.z * self.cv_bat / math.sqrt(max(waiting, 1))) / max(left, self.tick_interval)
        else:
            need = self.safety * waiting / max(left, self.tick_interval)
        # the waiting-time estimate: batch instances at their planned rate (from the GPU law at the
        # batch limit), mixed instances at the rate they were measured to lend over the last minute
        now = ctx.now
        self.window.append((now, self.mixed_done))
        while len(self.window) > 2 and self.window[1][0] <= now - 60.0:
            self.window.pop(0)
        t0, d0 = self.window[0]
        lent = (self.mixed_done - d0) / (now - t0) if now > t0 else 0.0
        cap = len(active) * self.mu_bat + lent
        if need > cap:
            # an instance added now serves only after its start-up delay (none: too late to help)
            share = 1.0 - self._expected_startup(ctx) / (left + self.margin) if left + self.margin > 0 else 0.0
            k = math.ceil((need - cap) / (self.mu_bat * share)) if share > 0.05 else 0
            for g in self.batch_gpus:
                if k <= 0:
                    break
                if ctx.gpu_state(g) == "offline":
                    self._add(ctx, g)
                    k -= 1
        elif active and need < cap - 1.5 * self.mu_bat:
            g = min(active, key=lambda h: (ctx.gpu_state(h) == "online", ctx.gpu_decodes(h) + ctx.gpu_free(h) * 0))
            ctx.drain_gpu(g)


@register("chiron", description="Chiron: interactive/mixed/batch pools, batch eviction to host memory, local (ITL) and "
                                "global (batch deadline) autoscalers")
def make_chiron(scenario: Scenario, *, interactive_gpus: int | None = None, batch_classes: list[str] | None = None,
                batch_itl: float | None = None, tick: float = 10.0, safety: float = 1.1, margin: float | None = None,
                host_eviction: bool = True, interactive_scaling: bool = True, interactive_spares: int | None = None,
                min_interactive: int = 1, interactive_utilisation: float = 0.8, cooldown: float = 600.0,
                window: float = 300.0, headroom: float = 0.5, calibrated: bool = True,
                shed_mixed: bool = False, mixed_batch_limit: bool = True, overflow_wait: float | None = None,
                lend_mixed: bool = True, estimator: str = "statistical", z: float = 1.645,
                lend_cooldown: float = 60.0, startup_cv: float = 0.0, warm_pool: int = 0,
                warm_startup: float = 5.0) -> Chiron:
    """Chiron (options as :class:`Chiron`): ``interactive_gpus`` (default: sized from the interactive
    load), ``batch_itl`` (the batch instances' ITL target, s; default the batch class's ``itl_slo``),
    ``safety`` (the global autoscaler's factor on the needed batch rate), ``margin`` (s: plan to finish
    this long before the deadline; default the start-up delay + 120 s), ``tick`` (s). The interactive
    autoscaler (:func:`interactive_step`): ``interactive_scaling`` (on/off), ``interactive_spares``
    (offline GPUs typed interactive; default: enough for twice the scenario's interactive rate beyond
    the initial fleet, all offline GPUs without batch classes), ``min_interactive`` (the fewest
    interactive-serving instances), ``interactive_utilisation`` (rho), ``cooldown`` (s over-provisioned
    before a drain), ``window`` (s of per-tick rates whose peak guards a drain), ``headroom`` (share of
    the TTFT SLO a waiting interactive request may use before the pool counts as short).
    ``calibrated``: plan with the simulator's saturated throughputs of the roles (default; False: the
    fluid estimates of :func:`batch_throughput`, optimistic by 5-25% here). ``shed_mixed`` (an
    ablation, default off): the interactive autoscaler may drain over-provisioned mixed instances
    while batch work is in the system (on the 100k workflow: 24.51 instead of 26.49 GPU-hours, but an
    interactive SLO of 0.98; docs/orchestration.md section 5). Issue 31, round 2 (all default on; off
    together they give round 1's Chiron bit for bit): ``mixed_batch_limit`` (a mixed instance holding
    batch work only runs the batch limit; an interactive request placed there switches it back,
    evicting batch decodes beyond the ITL-safe limit), ``overflow_wait`` (s an interactive request
    waits for an interactive instance before it goes to a mixed one at the batch limit; default a
    tenth of the tightest TTFT SLO), ``lend_mixed`` / ``lend_cooldown`` (s over-provisioned before a
    surplus mixed instance is lent to the backlog; back at once when short, drained with the
    backlog), ``estimator`` (``"statistical"``: Chiron's bound N (1 + z cv / sqrt N) with margin
    b_bat / mu_bat + a tick; ``"safety"``: ``safety`` N with margin start-up + 120 s) and ``z``;
    ``startup_cv`` (Gamma start-up times, mean the fleet's delay), ``warm_pool`` / ``warm_startup``
    (instances that start in ``warm_startup`` s). 100k workflow: 23.75 +/- 0.23 GPU-hours, 1.232x the
    calibrated bound (docs/orchestration.md section 5)."""
    return Chiron(scenario, interactive_gpus=interactive_gpus, batch_classes=batch_classes, batch_itl=batch_itl,
                  tick=tick, safety=safety, margin=margin, host_eviction=host_eviction,
                  interactive_scaling=interactive_scaling, interactive_spares=interactive_spares,
                  min_interactive=min_interactive, interactive_utilisation=interactive_utilisation,
                  cooldown=cooldown, window=window, headroom=headroom, calibrated=calibrated, shed_mixed=shed_mixed,
                  mixed_batch_limit=mixed_batch_limit, overflow_wait=overflow_wait, lend_mixed=lend_mixed,
                  estimator=estimator, z=z, lend_cooldown=lend_cooldown, startup_cv=startup_cv,
                  warm_pool=warm_pool, warm_startup=warm_startup)


# --------------------------------------------------------------------------------------------
# Following the multi-period fluid plan
# --------------------------------------------------------------------------------------------


class FluidPlan(Chiron):
    """Chiron's pools, routing and local autoscaler, with the fleet size taken from the multi-period
    fluid LP (:func:`fluidopt.fluid.multiperiod.plan_fleet`) instead of the waiting-time rule.

    Every ``tick`` seconds while batch work is in the system the plan is re-solved from now to the
    batch deadline minus ``margin`` (slots of ``slot`` seconds) for the batch requests still in the
    system, with the base fleet (interactive and mixed instances) kept and only the batch instances
    already up usable before a start-up delay has passed; the batch instances are then set to
    ceil(the plan's mean batch GPUs over the slots left): the LP is indifferent to when the batch work
    runs, and an even rate wastes least on start-ups and end-game rushes. Re-solving every tick is
    model-predictive control: it corrects the plan's fluid estimates with what really happened.
    """

    name = "fluid-plan"

    def __init__(self, scenario: Scenario, *, slot: float = 60.0, utilisation: float = 0.8, **kw):
        kw.setdefault("estimator", "safety")  # (its own plan; Chiron's rule of before for the last slot)
        kw.setdefault("interactive_scaling", False)  # its LP keeps the base fleet; the plan sets the rest
        super().__init__(scenario, **kw)
        self.slot = _positive(self.name, "slot", slot)
        self.rho = _positive(self.name, "utilisation", utilisation)
        self.scenario = scenario
        self.plans: list[tuple[float, float]] = []  # (time, planned GPU-hours from then on)
        self.mu_int = self.rates.mu_int

    def _global_autoscaler(self, ctx: Context) -> None:
        work = self._batch_work(ctx)
        if work is None:
            return
        nb, active = work
        now = ctx.now
        # measured rates over the last five minutes (the interactive bursts make a minute noisy): what
        # the base fleet lends, what a batch instance does
        online_b = sum(1 for g in self.batch_gpus if ctx.gpu_online(g))
        w = self.win4
        w.append((now, self.mixed_done, self.batch_done, self.batch_gpu_s))
        while len(w) > 2 and w[1][0] <= now - 300.0:
            w.pop(0)
        self.batch_gpu_s += online_b * self.tick_interval
        t0, m0, b0, s0 = w[0]
        base = sum(1 for p in self.pool_of if p != BATCH)
        mu_mix = mu_bat = None
        if now - t0 >= 60.0:
            lam = sum(self.scenario.classes[i].rate for i in self.inter)
            spare = max(1e-9, base - lam / (self.rho * self.mu_int))
            mu_mix = (self.mixed_done - m0) / (now - t0) / spare
            if self.batch_gpu_s - s0 > 30.0 * max(1, online_b) and self.batch_done > b0:
                mu_bat = (self.batch_done - b0) / (self.batch_gpu_s - s0)
        dl = self.batch_deadline(ctx) - self.margin
        if not math.isfinite(dl) or dl <= now + self.slot:
            super()._global_autoscaler(ctx)  # too late to plan: Chiron's rule
            return
        else:
            job = BacklogJob(self.scenario.class_names[self.bat[0]], float(nb), now, dl)
            try:
                plan = plan_fleet(self.scenario, [job], start=now, slot=self.slot, utilisation=self.rho, min_gpus=base,
                                  batch_now=len(active), startup_delay=self.startup,
                                  interactive=self.inter, mu_mix=mu_mix, mu_bat=mu_bat, calibrated=self.calibrated)
            except Exception:  # infeasible: as many batch instances as there are
                target = len(self.batch_gpus)
            else:
                self.plans.append((now, plan.gpu_hours))
                # the plan's batch instances, spread evenly over the time left (the LP's optimum is
                # degenerate in when the batch work runs: any schedule with the same GPU-seconds)
                target = math.ceil(float(plan.batch.mean()) - 1e-6)
        if target > len(active):
            for g in self.batch_gpus:
                if len(active) >= target:
                    break
                if ctx.gpu_state(g) == "offline":
                    ctx.add_gpu(g)
                    active.append(g)
        elif target < len(active) - 1:  # (hysteresis: one instance of slack before draining)
            for g in sorted(active, key=lambda h: (ctx.gpu_state(h) == "online", ctx.gpu_decodes(h)))[: len(active) - target]:
                ctx.drain_gpu(g)


@register("fluid-plan", description="the multi-period fluid LP's fleet size per slot (re-solved every tick), Chiron's "
                                    "routing and local autoscaler inside")
def make_fluid_plan(scenario: Scenario, *, slot: float = 60.0, utilisation: float = 0.8,
                    interactive_gpus: int | None = None, batch_classes: list[str] | None = None,
                    batch_itl: float | None = None, tick: float = 10.0, margin: float | None = None,
                    host_eviction: bool = True, calibrated: bool = True) -> FluidPlan:
    """The fluid-plan follower (options as :class:`FluidPlan` and :class:`Chiron`)."""
    return FluidPlan(scenario, slot=slot, utilisation=utilisation, interactive_gpus=interactive_gpus,
                     batch_classes=batch_classes, batch_itl=batch_itl, tick=tick, margin=margin,
                     host_eviction=host_eviction, calibrated=calibrated)
