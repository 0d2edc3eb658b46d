"""What the orchestrators share: the GPU law's closed forms, class roles, the interactive autoscaling
step and the orchestrator base class (see :mod:`fluidopt.control.orchestration`).
"""

from __future__ import annotations

import math

from fluidopt.control.protocol import PREFILL_QUEUE, Context, Controller
from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import GPUProfile, Scenario
from fluidopt.fluid.multiperiod import (
    FleetPlan,
    batch_throughput,
    largest_batch,
    mean_context,
    plan_fleet,
    role_rates,
)

__all__ = ["interactive_step", "iteration_time", "split_classes", "FleetPlan", "batch_throughput", "largest_batch", "mean_context", "plan_fleet"]


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
