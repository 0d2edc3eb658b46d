"""Orchestration for interactive and batch SLOs on an autoscaling fleet (docs/orchestration.md).

Three controllers for the setting of IBM/UIUC's Chiron and QLM: interactive request classes with
second-scale TTFT and inter-token-latency (ITL) SLOs, batch classes with completion deadlines of
minutes to hours, and (Chiron, the utilisation autoscaler) a fleet that grows and shrinks during the
run (the simulator's fleet actions: ``add_gpu``, ``drain_gpu``, ``set_max_decodes``, ``evict``).

* ``chiron``: instance pools typed interactive / mixed / batch; interactive-first routing with
  overflow to mixed instances, where batch work is evicted to host memory to make room; a local
  autoscaler that sets each instance's batch limit to the largest batch whose iteration time (from
  the GPU law) meets the ITL target of the work it serves (a mixed instance holding batch work only:
  the batch limit); a global autoscaler that adds batch instances when the batch queue's waiting
  time, Chiron's statistical bound, would miss the deadline and drains them when it would not, and
  scales the interactive side from the interactive load (:func:`interactive_step`: up when the last
  tick's rate or the TTFT/ITL headroom says it is short, down after a cooldown of over-provisioning,
  never below a minimum; while batch work waits, surplus mixed instances are lent to it instead);
* ``qlm-groups``: QLM as published (:class:`QLMGroups`): request groups, per-instance virtual queues,
  several models per fleet with a model-swap time, the waiting-time estimator, plan and reorder
  every tick, eviction only for a request about to miss its TTFT;
* ``qlm``: a fixed fleet; requests grouped by class (one SLO per class); the group served next is
  the one with the least predicted slack (the waiting-time estimate against its SLO), which
  maximises predicted attainment when some group must wait; an interactive request that arrives when
  no instance has room evicts batch work at once (not only when about to miss its TTFT);
* ``utilisation-autoscaler``: the baseline the Chiron paper compares against (Llumnix-like): every
  request is dispatched at once to the least-loaded instance (join the shortest queue; interactive
  first within an instance), a fixed batch size, instances added when utilisation is high (queued
  requests are migrated to a new instance) and drained when it is low.

Every instance runs one prefill at a time (chunked) and decodes its requests on the same GPU where
there is room (a decode may move to another GPU of the pool, KV transfer free as in the engine).
A prefill is admitted only on a GPU whose decodes are below its batch limit, so the decode that
follows has a slot.

The GPU law used for the estimates is the engine's: an iteration takes tau_mix (with a prefill
chunk) or tau_solo, plus ``kv_time_per_token`` per token of resident context. Batch limits use a
decode's mean resident context of prompt + output / 2 tokens (:func:`largest_batch`); the planning
rates of the roles (``calibrated=True``, the default) are the simulator's saturated throughputs
(:func:`fluidopt.fluid.multiperiod.role_rates`, :mod:`fluidopt.fluid.saturation`), else the fluid
estimates of :func:`batch_throughput`.
"""

from __future__ import annotations

import math

from fluidopt.control.protocol import DECODE_QUEUE, PREFILL_QUEUE, Context, Controller
from fluidopt.control.registry import register
from fluidopt.errors import ScenarioError
from fluidopt.fluid.multiperiod import (
    BacklogJob,
    FleetPlan,
    batch_throughput,
    largest_batch,
    mean_context,
    plan_fleet,
    role_rates,
)
from fluidopt.fluid.saturation import class_laws
from fluidopt.model import GPUProfile, Scenario

__all__ = [
    "Chiron",
    "FluidPlan",
    "QLM",
    "UtilisationAutoscaler",
    "FleetPlan",
    "batch_throughput",
    "interactive_step",
    "iteration_time",
    "largest_batch",
    "mean_context",
    "plan_fleet",
    "split_classes",
]

INTERACTIVE, MIXED, BATCH = 0, 1, 2  # Chiron's instance pools


# --------------------------------------------------------------------------------------------
# The GPU law (closed forms shared by the controllers, the LP and the docs)
# --------------------------------------------------------------------------------------------


def iteration_time(gpu: GPUProfile, b: float, context: float, *, mixed: bool = True) -> float:
    """Seconds per iteration of a GPU with ``b`` decodes of mean context ``context`` tokens: tau_mix
    (a prefill chunk in the iteration; tau_solo if ``mixed`` is False) + kv_time_per_token * b * context."""
    base = gpu.tau_mix if mixed else gpu.tau_solo
    return base + gpu.kv_time_per_token * b * context


def split_classes(scenario: Scenario, batch_classes: tuple[str, ...] | list[str] | None = None) -> tuple[list[int], list[int]]:
    """(interactive, batch) class indices: batch classes are named, or (default) those with a deadline."""
    names = scenario.class_names
    if batch_classes is None:
        bat = [i for i, c in enumerate(scenario.classes) if c.deadline is not None or c.deadline_at is not None]
    else:
        if isinstance(batch_classes, str):
            batch_classes = [batch_classes]
        for nm in batch_classes:
            if nm not in names:
                raise ScenarioError(f"batch_classes: {nm!r} is not a class of the scenario ({', '.join(names)})")
        bat = [names.index(nm) for nm in batch_classes]
    inter = [i for i in range(len(names)) if i not in bat]
    return inter, bat


def _mean_lengths(scenario: Scenario, classes: list[int]) -> tuple[float, float]:
    """Rate-weighted mean prompt and output tokens of the given classes."""
    cl = scenario.classes
    lam = sum(cl[i].rate for i in classes)
    if not lam:
        return 1.0, 1.0
    return (sum(cl[i].prompt * cl[i].rate for i in classes) / lam, sum(cl[i].decode * cl[i].rate for i in classes) / lam)


def _positive(who: str, name: str, v, *, zero: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (v == 0 and not zero):
        raise ScenarioError(f"{who}: {name}: expected a number {'>= 0' if zero else '> 0'}, got {v!r}")
    return float(v)



def _room_in(ctx: Context, gpus) -> int:
    """A GPU of the set ``gpus`` (idle prefill slot) whose running decodes are below its batch limit:
    a random one if it has room (the set's seeded choice), else the first that does; -1 if none."""
    if not gpus:
        return -1
    g = gpus.choice()
    if ctx.gpu_decodes(g) < ctx.gpu_max_decodes(g):
        return g
    for g in gpus:
        if ctx.gpu_decodes(g) < ctx.gpu_max_decodes(g):
            return g
    return -1

def interactive_step(rate: float, peak: float, capacity: int, mu: float, rho: float, short: bool, now: float,
                     over_since: float | None, cooldown: float, minimum: int) -> tuple[int, float | None]:
    """Chiron's interactive scaling rule: (instances to add (> 0) or drain (-1) or 0, the new
    over-provisioning start time).

    ``rate``: interactive arrivals/s over the last tick; ``peak``: the largest such rate over the
    recent window; ``capacity``: interactive-serving instances (interactive and mixed, online or
    starting); ``mu``: one instance's interactive completions/s at the ITL-safe batch; ``rho``: target
    utilisation; ``short``: the TTFT/ITL headroom is gone. Up at once: when rate / (rho mu) exceeds the
    capacity, the missing instances (at least one when ``short``). Down slowly (hysteresis): when the
    peak needs at least two instances fewer than the capacity, continuously for ``cooldown`` seconds,
    one instance, never below ``minimum``."""
    need = rate / (rho * mu)
    if short or need > capacity:
        return max(1, math.ceil(need - capacity - 1e-9)), None
    if math.ceil(peak / (rho * mu) - 1e-9) < capacity - 1 and capacity > minimum:
        if over_since is None:
            return 0, now
        return (-1 if now - over_since >= cooldown else 0), over_since
    return 0, None


class _Orchestrator(Controller):
    """Shared state: class split, ITL targets, GPU law, deadline of the batch classes."""

    name = "orchestrator"
    chunked_prefill = True

    def __init__(self, scenario: Scenario, *, tick: float, batch_classes=None, batch_itl: float | None = None,
                 calibrated: bool = True):
        who = self.name
        self.calibrated = bool(calibrated)
        self.tick_interval = _positive(who, "tick", tick)
        self.gpu = scenario.gpu
        self.inter, self.bat = split_classes(scenario, batch_classes)
        cl = scenario.classes
        self.is_batch = [i in self.bat for i in range(len(cl))]
        itls = [cl[i].itl_slo for i in self.inter if cl[i].itl_slo is not None]
        self.itl_int = min(itls) if itls else None
        bitl = [cl[i].itl_slo for i in self.bat if cl[i].itl_slo is not None]
        if batch_itl is not None:
            self.itl_bat = _positive(who, "batch_itl", batch_itl)
        else:
            self.itl_bat = min(bitl) if bitl else None
        ctx_i = max((mean_context(cl[i]) for i in self.inter), default=0.0)
        ctx_b = max((mean_context(cl[i]) for i in self.bat), default=0.0)
        self.ctx_int = max(ctx_i, ctx_b)  # mixed instances serve both
        self.b_int = largest_batch(self.gpu, self.itl_int, self.ctx_int)
        self.b_bat = largest_batch(self.gpu, self.itl_bat, ctx_b if ctx_b else ctx_i)
        self.ttft = [c.ttft_slo for c in cl]
        self.deadline_at = min((cl[i].deadline_at for i in self.bat if cl[i].deadline_at is not None), default=None)
        self.deadline_rel = min((cl[i].deadline for i in self.bat if cl[i].deadline is not None), default=None)
        if self.bat:
            P = sum(cl[i].prompt for i in self.bat) / len(self.bat)
            D = sum(cl[i].decode for i in self.bat) / len(self.bat)
        else:
            P, D = 1.0, 1.0
        self.bat_P, self.bat_D = P, D
        # planning rates (requests/s of one GPU): the simulator's saturated throughputs of the roles
        # (calibrated, issue 31) or the fluid estimates of batch_throughput
        self.rates = role_rates(scenario, self.inter, self.bat, self.itl_bat, calibrated=self.calibrated)
        self.mu_bat = self.rates.mu_bat  # a batch instance
        self.mu_mix = self.rates.mu_mix  # a mixed instance given to batch work

    # -- helpers ---------------------------------------------------------------------------------
    def try_prefill(self, ctx: Context, r: int, g: int) -> bool:
        """Start r's prefill on g if its prompt fits g's free KV cache (always without a KV capacity)."""
        if ctx.gpu_kv_free(g) < ctx.req_prompt(r) + ctx.req_generated(r):
            return False
        ctx.start_prefill(r, g)
        return True

    def try_decode(self, ctx: Context, r: int, g: int) -> bool:
        """Start r's decode on g if its context fits g's free KV cache."""
        if ctx.gpu_kv_free(g) < ctx.req_prompt(r) + ctx.req_generated(r):
            return False
        ctx.start_decode(r, g)
        return True

    def batch_in_system(self, ctx: Context) -> int:
        """Batch requests not yet completed (waiting or in service)."""
        return sum(ctx.n_wait_prefill(i) + ctx.n_prefill(i) + ctx.n_wait_decode(i) + ctx.n_decode_mixed(i)
                   + ctx.n_decode_solo(i) for i in self.bat)

    def batch_deadline(self, ctx: Context) -> float:
        """The time by which the batch work in the system must be done (absolute seconds; inf: none)."""
        t = math.inf
        if self.deadline_at is not None:
            t = self.deadline_at
        if self.deadline_rel is not None:
            oldest = [ctx.req_arrival(ctx.head(PREFILL_QUEUE, i)) for i in self.bat if ctx.head(PREFILL_QUEUE, i) >= 0]
            t = min(t, (min(oldest) if oldest else ctx.now) + self.deadline_rel)
        return t

    @staticmethod
    def has_room(ctx: Context, g: int) -> bool:
        """g can take a prefill now and its decode afterwards."""
        return ctx.gpu_prefill(g) < 0 and ctx.gpu_decodes(g) < ctx.gpu_max_decodes(g) and ctx.gpu_free(g) > 0

    def interactive_waiting(self, ctx: Context) -> int:
        return sum(ctx.qlen(PREFILL_QUEUE, i) for i in self.inter)

    def head_of(self, ctx: Context, q: int, classes: list[int]) -> int:
        """FCFS head of queue q over the given classes, or -1."""
        if len(classes) == 1:
            return ctx.head(q, classes[0])
        best, bt = -1, math.inf
        for i in classes:
            r = ctx.head(q, i)
            if r >= 0 and ctx.req_arrival(r) < bt:
                best, bt = r, ctx.req_arrival(r)
        return best


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
