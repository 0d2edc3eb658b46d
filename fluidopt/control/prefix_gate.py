"""Cache-aware Gate-and-Route and backpressure Gate-and-Route (issue 42; docs/prefix-cache.md,
"Cache-aware gate-and-route").

The gate is the parent's, unchanged: which waiting class a free prefill slot admits, with the same
targets, caps and backpressure. What changes is which request of that class starts, and where:

* when several mixed GPUs have an idle prefill slot (the arrival that finds the pool partly idle, a
  re-solve that opens slots), the parent starts the class's FCFS head on a random one; here it starts on
  the idle one with the longest cached prefix of that request (``ctx.cached_prefix_tokens(r, g)``), the
  parent's random pick (drawn as the parent draws it) being the tie-break;
* when a prefill slot frees on GPU g (the only idle one then), the parent starts the class's FCFS head
  on g; here, with ``lookahead`` L > 1, the request among the first L waiting ones of the class with the
  longest cached prefix on g (ties: the earliest). L = 1 keeps FCFS.

With no match anywhere (or no block ids), every decision and the random stream are the parent's. Overflow
prefills on free solo slots are the parent's, and decodes are routed as before (a decode reads the KV
its prefill wrote, not the cache).

The LP targets use the hit ratio h: the controller solves the fluid LP of the scenario with every
class's ``hit_ratio`` set to h (prefill work (1 - h) x prompt, KV footprint unchanged; docs/prefix-cache.md,
"The fluid model with reuse"), h given as the option ``hit_ratio`` or estimated by
:func:`fluidopt.workloads.prefix.hit_ratio` from the trace named by ``from_trace`` (rule ``cache_rule``,
the fleet's size, unlimited caches, the scenario GPU's timing law, as ``--from-trace`` does). With
neither, the scenario's own hit ratios stand and a harness's solved ``plan`` is used as given.

Both read the cache only through the protocol (the view's ``cached_prefix_tokens``), so a real router runs
them over :class:`~fluidopt.control.snapshot.ClusterSnapshot`. They override a handler of
:class:`~fluidopt.control.gate_handlers.GateHandlers`, so they run the Python handlers on every engine
(``fluidopt.sim.controller_fastpath``: a subclass that overrides one is not given the compiled ones);
the parents' compiled handlers are untouched.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from fluidopt.control.gate_and_route import GateAndRoute
from fluidopt.control.gate_handlers import PREFILL_QUEUE
from fluidopt.control.protocol import Context
from fluidopt.control.registration import register
from fluidopt.control.robust import BackpressureGateAndRoute
from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import Scenario
from fluidopt.fluid.solution import FluidSolution

__all__ = ["PrefixBackpressureGateAndRoute", "PrefixGateAndRoute", "longest_match_gpu", "scenario_with_hit_ratio"]

LOOKAHEAD = 8  # waiting requests compared on a freed slot (docs/prefix-cache.md: 8 and 32 keep 0.25 of tokens, 1 keeps 0.16)


def _lookahead(who: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ScenarioError(f"{who}: lookahead = {v!r}: expected an integer >= 1 (waiting requests compared)")
    return v


def longest_match_gpu(ctx: Context, r: int, gpus: Any, default: int) -> int:
    """The GPU of the set ``gpus`` (a :class:`~fluidopt.control.protocol.GpuSet` holding ``default``) on which
    request ``r`` has the longest cached prefix (tokens, ``ctx.cached_prefix_tokens``); ties go to
    ``default`` (the cache-blind rule's random pick), then to the first in iteration order. O(size of the set)."""
    best = default
    best_len = ctx.cached_prefix_tokens(r, best)
    for g in gpus:
        m = ctx.cached_prefix_tokens(r, g)
        if m > best_len:
            best, best_len = g, m
    return best


class _LongestMatchAdmission:
    """Mixed in before a Gate-and-Route class: the idle mixed GPU with the longest match takes the gate's
    request, and a freed prefill slot takes, among the first ``lookahead`` waiting requests of the gate's
    class, the one with the longest match (module docstring)."""

    lookahead = 1  # set by the factories; 1: FCFS within the class, the parent's order

    def _admit_all(self, ctx: Context) -> None:
        """Fill the mixed pool's idle prefill slots while the gate admits a class: each admitted request on the
        idle mixed GPU with its longest cached prefix."""
        idle = self._idle_mixed
        while len(idle):
            # the parent's random pick, drawn first as the parent draws it (also when the gate then refuses), so
            # that with no match anywhere the random stream and every decision are the parent's
            g0 = idle.choice()
            # the gate of these controllers has no side effects (no time-averaged caps), so asking it here
            # and starting its head is the parent's _admit_on with the GPU chosen after the class
            i = self.gate_class(ctx)
            if i < 0:
                return
            r = ctx.head(PREFILL_QUEUE, i)
            g = longest_match_gpu(ctx, r, idle, g0)
            if self._kv and not self._fits(ctx, r, g):
                return  # KV full: the slot waits for the next freed capacity (as the parent)
            ctx.start_prefill(r, g)

    def _admit_on(self, ctx: Context, g: int) -> bool:
        """Start the gate's class on GPU g (which has an idle prefill slot): among the first ``lookahead``
        waiting requests of that class, the one with the longest cached prefix on g (ties: the earliest);
        ``lookahead`` 1 is the parent's FCFS head. False if none starts."""
        i = self.gate_class(ctx)
        if i < 0:
            return False
        r = ctx.head(PREFILL_QUEUE, i)
        if self.lookahead > 1 and ctx.qlen(PREFILL_QUEUE, i) > 1:
            r = self._best_waiting(ctx, i, g, r)
        if self._kv and not self._fits(ctx, r, g):
            return False  # KV full: the slot waits for the next freed capacity (as the parent)
        ctx.start_prefill(r, g)
        return True

    def _best_waiting(self, ctx: Context, i: int, g: int, head: int) -> int:
        """Among the first ``lookahead`` waiting class-i requests (FCFS), the longest match on g; ties: the
        earliest. O(queue length) for the protocol's queue listing."""
        best, best_len, seen = head, ctx.cached_prefix_tokens(head, g), 0
        for r in ctx.queue_requests(PREFILL_QUEUE):
            if ctx.req_class(r) != i:
                continue
            seen += 1
            if seen > self.lookahead:
                break
            m = ctx.cached_prefix_tokens(r, g)
            if m > best_len:
                best, best_len = r, m
        return best


class PrefixGateAndRoute(_LongestMatchAdmission, GateAndRoute):
    """Gate-and-Route whose admitted prefills start on the idle mixed GPU with the longest cached prefix."""

    name = "gate-and-route-prefix"


class PrefixBackpressureGateAndRoute(_LongestMatchAdmission, BackpressureGateAndRoute):
    """Backpressure Gate-and-Route whose admitted prefills start on the idle mixed GPU with the longest cached
    prefix."""

    name = "backpressure-gate-and-route-prefix"


def scenario_with_hit_ratio(scenario: Scenario, h: float) -> Scenario:
    """``scenario`` with every class's hit ratio set to ``h`` (in [0, 1))."""
    return replace(scenario, classes=tuple(replace(c, hit_ratio=float(h)) for c in scenario.classes))


def _hit_ratio_of(who: str, scenario: Scenario, hit_ratio: float | None, from_trace: str | None,
                  cache_rule: str) -> float | None:
    """The h the LP uses: ``hit_ratio`` as given, or estimated from ``from_trace``; None with neither."""
    if hit_ratio is not None and from_trace is not None:
        raise ScenarioError(f"{who}: hit_ratio, from_trace: expected one of them, got both")
    if hit_ratio is not None:
        if isinstance(hit_ratio, bool) or not isinstance(hit_ratio, (int, float)) or not (
                math.isfinite(hit_ratio) and 0.0 <= hit_ratio < 1.0):
            raise ScenarioError(f"{who}: hit_ratio = {hit_ratio!r}: expected a number in [0, 1) (the share of prompt "
                                "tokens cached)")
        return float(hit_ratio)
    if from_trace is None:
        return None
    from fluidopt.workloads.jsonl import read_jsonl_trace
    from fluidopt.workloads.prefix import H_MAX, hit_ratio_on_gpu

    # the estimate of --from-trace (fluidopt/commands/_cache.py)
    est = hit_ratio_on_gpu(read_jsonl_trace(from_trace), scenario.gpu, cache_rule, int(scenario.gpus), None)
    return min(est.hit_ratio, H_MAX)


def _solution(who: str, scenario: Scenario, plan: Any, h: float | None) -> FluidSolution:
    """The bundled LP solution the controller plans from: ``plan`` when no h is set, else the LP with h."""
    from fluidopt.fluid.lp import solve_fluid

    if isinstance(plan, dict):
        plan = plan.get("bundled")
    if h is None:
        if plan is None:
            return solve_fluid(scenario, "bundled")
        if not isinstance(plan, FluidSolution) or plan.pricing != "bundled":
            raise ScenarioError(f"{who}: plan: expected a bundled-pricing FluidSolution, got {plan!r}")
        return plan
    # a harness's plan was solved without h: the targets come from the LP with h
    return solve_fluid(scenario_with_hit_ratio(scenario, h), "bundled")


@register("gate-and-route-prefix", description=(
    "cache-aware Gate-and-Route: the gate's request starts on the idle mixed GPU with the longest cached prefix; "
    "LP targets with hit ratio h (options lookahead=8, hit_ratio, or from_trace with cache_rule=sglang; mixed_gpus)"))
def make_gate_and_route_prefix(scenario: Scenario, *, lookahead: int = LOOKAHEAD, hit_ratio: float | None = None,
                               from_trace: str | None = None, cache_rule: str = "sglang", mixed_gpus: int | None = None,
                               plan: FluidSolution | None = None) -> PrefixGateAndRoute:
    """Cache-aware Gate-and-Route from the bundled LP with hit ratio h (module docstring)."""
    who = "gate-and-route-prefix"
    h = _hit_ratio_of(who, scenario, hit_ratio, from_trace, cache_rule)
    ctrl = PrefixGateAndRoute.from_solution(_solution(who, scenario, plan, h), mixed_gpus=mixed_gpus)
    ctrl.lookahead = _lookahead(who, lookahead)
    return ctrl


@register("backpressure-gate-and-route-prefix", description=(
    "cache-aware backpressure Gate-and-Route: the gate's request starts on the idle mixed GPU with the longest "
    "cached prefix; LP targets (and re-solves) with hit ratio h (options lookahead=8, hit_ratio, or from_trace "
    "with cache_rule=sglang; the options of backpressure-gate-and-route)"))
def make_backpressure_gate_and_route_prefix(
    scenario: Scenario, *, lookahead: int = LOOKAHEAD, hit_ratio: float | None = None, from_trace: str | None = None,
    cache_rule: str = "sglang", backpressure: bool = True, caps: bool = False, staffing: bool = False, decode_order: str = "value",
    overflow: bool = True, max_overflow: int | None = None, resolve: bool = True, elastic: bool = True,
    elastic_slots: bool = True, coupled: bool = True, mixed_gpus: int | None = None,
    plan: FluidSolution | None = None,
) -> PrefixBackpressureGateAndRoute:
    """Cache-aware backpressure Gate-and-Route from the bundled LP with hit ratio h (module docstring); its
    rolling re-solves use the scenario with h too."""
    who = "backpressure-gate-and-route-prefix"
    h = _hit_ratio_of(who, scenario, hit_ratio, from_trace, cache_rule)
    sol = _solution(who, scenario, plan, h)
    sc = scenario if h is None else scenario_with_hit_ratio(scenario, h)
    ctrl = PrefixBackpressureGateAndRoute(sc, sol, backpressure=backpressure, caps=caps, staffing=staffing,
                                          decode_order=decode_order, overflow=overflow, max_overflow=max_overflow,
                                          resolve=resolve, elastic=elastic, elastic_slots=elastic_slots,
                                          coupled=coupled, mixed_gpus=mixed_gpus)
    ctrl.lookahead = _lookahead(who, lookahead)
    return ctrl
