"""Gate-and-route controllers built from a fluid-LP solution (paper Thms 4.1, 4.2, 5.1; docs/controllers.md).

All of them share one static plan: with ``n`` GPUs and per-GPU LP targets x_i*, the first
M = ceil(n sum_i x_i*) GPUs form the *mixed* pool (pool 0: prefills allowed, at most B-1 decodes, so
one slot per GPU stays reserved for a prefill) and the other n - M the *solo* pool (pool 1: no
prefill, B decodes). They differ in the gate (which waiting class a free prefill slot admits) and in
the router (where a finished prefill's decode goes):

* :class:`GateAndRoute` (bundled pricing, "GG-SP"): deviation-index gate
  argmin_i (X_i - n x_i*) / x_i* over waiting classes with x_i* > 0 (ties: the largest
  Q_p,i - n q_p,i*); greedy router: a random solo GPU with a free slot, else a random mixed GPU with
  a free decode slot, else the central FCFS decode buffer.
* :class:`PrioritizeAndRoute` (separate pricing): the gate admits the waiting class with the largest
  D_i / P_i (decode tokens bought per prompt token prefilled); greedy router.
* :class:`SLIGateAndRoute` (Thm 5.1): deviation gate; class i's decode goes to the solo pool with
  probability p_s,i = mu_s,i y_s,i* / (mu_m,i y_m,i* + mu_s,i y_s,i*), else to the mixed pool; one
  FCFS buffer per pool.
* :class:`WeightedSLIGateAndRoute` (paper EC 13, for q_d* > 0): deviation gate; decodes routed as in
  :class:`SLIGateAndRoute` when the chosen pool has room, else they wait in per-class buffers; a
  freed decode slot in pool k serves a waiting class drawn with probability proportional to
  mu_k,i y_k,i*, which makes pool k's class mix converge to y_k* when the pool is saturated.

The controllers only use the :mod:`fluidopt.control.protocol` view and actions, so a real router can
drive them from its own event loop. Every decision costs O(I) (I = number of classes): GPUs are
picked from the view's ``idle_prefill`` / ``free_decode`` sets, never by scanning the fleet. On the
compiled engine core the same handlers run compiled: they are written once, in
:mod:`fluidopt.control.gate_handlers` (a mixin of every controller here), which setup.py also compiles
(:mod:`fluidopt.control.fastpath`; same decisions bit for bit).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from fluidopt.control import fastpath
from fluidopt.control.gate_handlers import MIXED_POOL, ROUTE_SLI, SOLO_POOL, GateHandlers, doubles, ints, plain_state
from fluidopt.control.protocol import DECODE_QUEUE, Context, Controller
from fluidopt.control.registration import register
from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import Rates, Scenario
from fluidopt.fluid.solution import FluidSolution, mixed_gpus_of

__all__ = [
    "MIXED_POOL",
    "SOLO_POOL",
    "GateAndRoute",
    "PartitionedController",
    "PrioritizeAndRoute",
    "SLIGateAndRoute",
    "WeightedSLIGateAndRoute",
    "solo_probabilities",
]

_EPS = 1e-12  # LP targets below this (per GPU) count as zero
_LP_TOL = 1e-7  # negative inputs down to this are solver round-off, read as 0
_X_SUM_TOL = 1e-6  # sum x_i above 1 by up to this is the LP solver's feasibility tolerance (rescaled), beyond it an error


def _vector(name: str, value: Any, n_classes: int | None = None, *, allow_none: bool = False) -> np.ndarray | None:
    if value is None:
        if allow_none:
            return None
        raise ScenarioError(f"{name}: expected a per-class sequence of numbers, got None")
    a = np.array(value, dtype=float).reshape(-1)
    if n_classes is not None and a.size != n_classes:
        raise ScenarioError(f"{name}: expected {n_classes} values (one per class), got {a.size}")
    if a.size == 0:
        raise ScenarioError(f"{name}: expected at least one class, got an empty sequence")
    # -1e-7: HiGHS's primal feasibility tolerance; LP solutions carry round-off such as q_p = -1.4e-8
    if not np.all(np.isfinite(a)) or np.any(a < -_LP_TOL):
        raise ScenarioError(f"{name}: expected finite numbers >= 0, got {a.tolist()}")
    a = np.where(a < _EPS, 0.0, a)
    a.setflags(write=False)
    return a


def _rates_of(scenario: Scenario | Rates | None, who: str) -> Rates:
    if isinstance(scenario, Rates):
        return scenario
    if isinstance(scenario, Scenario):
        return scenario.rates()
    raise ScenarioError(f"{who}: expected the Scenario (or its Rates) the LP was solved for, got {scenario!r}")


def _check_solution(solution: FluidSolution, who: str) -> None:
    if not isinstance(solution, FluidSolution):
        raise ScenarioError(f"{who}: expected a FluidSolution, got {type(solution).__name__}")
    if solution.status != "optimal":
        raise ScenarioError(f"{who}: the LP solution has status {solution.status!r}; expected 'optimal'")


def solo_probabilities(solution: FluidSolution, rates: Rates) -> np.ndarray:
    """p_s,i = mu_s,i y_s,i* / (mu_m,i y_m,i* + mu_s,i y_s,i*): share of class i's decodes sent to solo GPUs.

    A class with no decode flow in the plan (both y* zero) gets p_s = 1 (solo first, like the greedy
    router); it is only reached if the class is prefilled at all.
    """
    fm = rates.mu_m * np.asarray(solution.y_mixed)
    fs = rates.mu_s * np.asarray(solution.y_solo)
    tot = fm + fs
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(tot > _EPS, fs / np.where(tot > _EPS, tot, 1.0), 1.0)
    return np.clip(p, 0.0, 1.0)


class PartitionedController(GateHandlers, Controller):
    """Shared machinery: the static mixed/solo partition, the deviation gate and the greedy router
    (the gate, the routers and the event handlers are :class:`~fluidopt.control.gate_handlers.GateHandlers`').

    ``x``: per-GPU prefill occupancy targets x_i* (prefill slots per GPU; sum <= 1). ``q_prefill``:
    per-GPU fluid prefill queues q_p,i* (tie-break of the gate; zeros if omitted). ``mixed_gpus``:
    override M (default ceil(n sum x*) for the fleet size ``n`` found at :meth:`setup`, so one
    controller object runs on any fleet size). ``class_names``: when given, :meth:`setup` checks that
    the fleet serves the same classes in the same order.
    """

    name = "partitioned"
    chunked_prefill = True
    _fast: Any = None  # the compiled fast path bound by setup (fluidopt.control.fastpath), or None

    def __init__(
        self,
        x: Sequence[float],
        q_prefill: Sequence[float] | None = None,
        *,
        mixed_gpus: int | None = None,
        class_names: Sequence[str] | None = None,
    ) -> None:
        self.x = _vector("x", x)
        n_classes = self.x.size
        total = float(self.x.sum())
        if total > 1.0 + _X_SUM_TOL:
            raise ScenarioError(f"x: prefill occupancy targets must sum to <= 1 per GPU, got {total!r}")
        if total > 1.0:  # an LP solution within the solver's feasibility tolerance: scaled onto the simplex
            self.x = self.x / total
        qp = np.zeros(n_classes) if q_prefill is None else _vector("q_prefill", q_prefill, n_classes)
        self.q_prefill = qp
        if mixed_gpus is not None and (isinstance(mixed_gpus, bool) or not isinstance(mixed_gpus, (int, np.integer))
                                       or mixed_gpus < 0):
            raise ScenarioError(f"mixed_gpus: expected an integer >= 0 (GPUs in the mixed pool), got {mixed_gpus!r}")
        self.mixed_override = None if mixed_gpus is None else int(mixed_gpus)
        if class_names is not None:
            class_names = tuple(class_names)
            if len(class_names) != n_classes:
                raise ScenarioError(f"class_names: expected {n_classes} names (one per class), got {len(class_names)}")
        self.class_names: tuple[str, ...] | None = class_names
        # Set by setup() for the fleet at hand.
        self.n_gpus = 0
        self.batch = 0
        self.mixed_gpus = 0
        self._nx = doubles([])
        self._inv_x = doubles([])
        self._nqp = doubles([])
        self._admissible: list[int] = [i for i in range(n_classes) if self.x[i] > 0]
        self._has_mixed = False
        self._has_solo = False
        self._kv = False
        # the handlers' state (gate_handlers.STATE): no caps, no backpressure, the greedy route; the gate
        # considers the admissible classes (_adm)
        vars(self).update(plain_state(n_classes))
        self._adm = ints(self._admissible)  # a subclass with its own _gate_order sets it again

    # -- planning ---------------------------------------------------------------------------------
    @property
    def n_classes(self) -> int:
        return int(self.x.size)

    def plan_mixed_gpus(self, n_gpus: int) -> int:
        """M for a fleet of ``n_gpus``: the override, else ceil(n sum x*) (at most n)."""
        m = self.mixed_override if self.mixed_override is not None else mixed_gpus_of(n_gpus, float(self.x.sum()))
        return min(int(m), int(n_gpus))

    def plan(self, n_gpus: int) -> pd.DataFrame:
        """The per-class targets scaled to a fleet of ``n_gpus`` (X_i*, Q_p,i* in requests); M in attrs."""
        idx = pd.Index(self.class_names or [str(i) for i in range(self.n_classes)], name="class")
        df = pd.DataFrame({"x": self.x, "X_target": n_gpus * self.x, "Q_prefill_target": n_gpus * self.q_prefill},
                          index=idx)
        df.attrs.update(n_gpus=int(n_gpus), mixed_gpus=self.plan_mixed_gpus(n_gpus), policy=self.name)
        return df

    def setup(self, ctx: Context) -> None:
        """Declare the two pools: GPUs 0..M-1 mixed (B-1 decodes, prefill allowed), M..n-1 solo (B decodes);
        then the named queues, the live reads, the plan's mechanisms and the compiled handlers."""
        self._bind(ctx)
        self._declare_pools(ctx)
        self._read_pools(ctx)
        self._setup_queues(ctx)
        self._read_counts(ctx)
        self._bind_mechanisms(ctx)
        self._fast = fastpath.bind(self, ctx)  # compiled handlers on the compiled engine (same decisions)

    def _sync_fast(self) -> None:
        """Tell the compiled fast path (if bound) that the plan changed (robust re-solves)."""
        if self._fast is not None:
            self._fast.sync()

    def _bind(self, ctx: Context) -> None:
        """Check the fleet's classes and scale the per-GPU targets to its size n."""
        self._fast = None  # a previous run's compiled handlers (setup binds this run's, at its end)
        if ctx.n_classes != self.n_classes:
            raise ScenarioError(
                f"{self.name}: the plan has {self.n_classes} classes, the fleet serves {ctx.n_classes}"
            )
        if self.class_names is not None and tuple(ctx.class_names) != self.class_names:
            raise ScenarioError(
                f"{self.name}: the plan's classes are {', '.join(self.class_names)}, "
                f"the fleet's are {', '.join(ctx.class_names)}"
            )
        n, B = int(ctx.n_gpus), int(ctx.batch)
        self.n_gpus, self.batch = n, B
        self._scale_targets()
        # tokens mode with a KV capacity: check that work fits before starting it (the paper's model has
        # no KV limit; there the checks cost nothing).
        self._kv = n > 0 and ctx.gpu_kv_free(0) != float("inf")

    def _scale_targets(self) -> None:
        """The gate's targets for the fleet of ``n_gpus``: n x_i*, 1 / x_i* (0 where x_i* = 0) and n q_p,i*,
        from the per-GPU plan ``x`` and ``q_prefill`` (at setup and after a re-solve changes the plan)."""
        n = self.n_gpus
        self._nx = doubles([n * float(v) for v in self.x])
        self._inv_x = doubles([1.0 / float(v) if v > 0 else 0.0 for v in self.x])
        self._nqp = doubles([n * float(v) for v in self.q_prefill])

    def _declare_pools(self, ctx: Context) -> None:
        n, B = self.n_gpus, self.batch
        M = self.plan_mixed_gpus(n)
        self.mixed_gpus = M
        self._has_mixed = M > 0
        self._has_solo = M < n
        if M > 0:
            # B = 1 leaves no decode slot on a mixed GPU; max_decodes = 0 is then the honest cap.
            ctx.set_pool(range(M), MIXED_POOL, prefill=True, max_decodes=B - 1)
        if M < n:
            ctx.set_pool(range(M, n), SOLO_POOL, prefill=False, max_decodes=B)

    def __getstate__(self) -> dict:
        """A copy or a pickle leaves the run behind: the pools' GPU sets (the engine's) are not copied."""
        state = dict(self.__dict__)
        state.update(_idle_mixed=None, _idle_solo=None, _free_mixed=None, _free_solo=None, _class_counts=None,
                     _queue_counts=None, _queue_totals=None)
        return state

    def _read_pools(self, ctx: Context) -> None:
        """The pools' GPU sets as the handlers read them (live sets; the solo pool's None where the fleet has
        none): read once, after the pools are declared."""
        self._idle_mixed, self._free_mixed = ctx.idle_prefill(MIXED_POOL), ctx.free_decode(MIXED_POOL)
        self._idle_solo = ctx.idle_prefill(SOLO_POOL) if self._has_solo else None
        self._free_solo = ctx.free_decode(SOLO_POOL) if self._has_solo else None

    def _read_counts(self, ctx: Context) -> None:
        """The live counts the handlers read instead of calling the view (ClusterView.class_counts,
        queue_counts, queue_totals): read once, after the last named queue is added."""
        self._class_counts, self._queue_counts = ctx.class_counts(), ctx.queue_counts()
        self._queue_totals, self._n_cls = ctx.queue_totals(), self.n_classes

    def _setup_queues(self, ctx: Context) -> None:
        """Hook for subclasses that need named queues."""

    def _bind_mechanisms(self, ctx: Context) -> None:
        """Hook for the robust variants (fluidopt.control.robust): their mechanisms' state for this run."""

    def _gate_order(self) -> list[int]:
        """The classes the gate considers (``_adm``), in the order it scans them: those with x_i* > 0."""
        return self._admissible

    @staticmethod
    def _decode_slot_free(ctx: Context, g: int) -> bool:
        return ctx.gpu_free(g) > 0 and ctx.gpu_decodes(g) < ctx.gpu_max_decodes(g)

    # -- construction helpers ---------------------------------------------------------------------
    @staticmethod
    def _solution_kwargs(solution: FluidSolution, mixed_gpus: int | None) -> dict[str, Any]:
        return {"q_prefill": solution.q_prefill, "mixed_gpus": mixed_gpus, "class_names": solution.class_names}


class GateAndRoute(PartitionedController):
    """Occupancy-based Gate-and-Route for bundled pricing (paper Thm 4.1, "GG-SP").

    Build it from a bundled LP solution: ``GateAndRoute.from_solution(solve_fluid(scenario))`` or
    ``GateAndRoute.from_scenario(scenario)``; it runs on a fleet of any size (M is recomputed from n).
    """

    name = "gate-and-route"

    @classmethod
    def from_solution(cls, solution: FluidSolution, *, mixed_gpus: int | None = None) -> GateAndRoute:
        """Targets x*, q_p* from an optimal LP solution (any pricing; bundled is the paper's case)."""
        _check_solution(solution, f"{cls.__name__}.from_solution")
        return cls(solution.x, **cls._solution_kwargs(solution, mixed_gpus))

    @classmethod
    def from_scenario(cls, scenario: Scenario, slis: Sequence[Any] = (), *, pricing: str = "bundled",
                      mixed_gpus: int | None = None) -> GateAndRoute:
        """Solve the LP of ``scenario`` (HiGHS) and build the controller from it."""
        from fluidopt.fluid.lp import solve_fluid

        return cls.from_solution(solve_fluid(scenario, pricing, slis), mixed_gpus=mixed_gpus)


class PrioritizeAndRoute(PartitionedController):
    """Prioritize-and-Route for separate pricing (paper Thm 4.2).

    The partition comes from the separate-pricing LP; the gate admits the waiting class with the
    largest D_i / P_i (ties: lowest index); classes with x_i* = 0 are never admitted. Greedy router.
    ``priority``: per-class D_i / P_i (or any score, larger first).
    """

    name = "prioritize-and-route"

    def __init__(self, x: Sequence[float], priority: Sequence[float], q_prefill: Sequence[float] | None = None,
                 **kw: Any) -> None:
        super().__init__(x, q_prefill, **kw)
        pr = np.array(priority, dtype=float).reshape(-1)
        if pr.size != self.n_classes or not np.all(np.isfinite(pr)):
            raise ScenarioError(f"priority: expected {self.n_classes} finite numbers (one per class), got {pr.tolist()}")
        self.priority = pr
        self._priority_gate = True
        self._adm = ints(self._gate_order())

    def _gate_order(self) -> list[int]:
        """The admissible classes in priority order (largest first, ties: the lowest index): the gate is a
        scan for the first waiting one."""
        pr = self.priority
        return sorted(self._admissible, key=lambda i: (-pr[i], i))

    @classmethod
    def from_solution(cls, solution: FluidSolution, scenario: Scenario, *,
                      mixed_gpus: int | None = None) -> PrioritizeAndRoute:
        """Partition from ``solution`` (the separate LP), priorities D_i / P_i from ``scenario``."""
        _check_solution(solution, f"{cls.__name__}.from_solution")
        if not isinstance(scenario, Scenario):
            raise ScenarioError(f"{cls.__name__}.from_solution: expected the Scenario for D_i/P_i, got {scenario!r}")
        pr = [c.decode / c.prompt for c in scenario.classes]
        return cls(solution.x, pr, **cls._solution_kwargs(solution, mixed_gpus))

    @classmethod
    def from_scenario(cls, scenario: Scenario, slis: Sequence[Any] = (), *, pricing: str = "separate",
                      mixed_gpus: int | None = None) -> PrioritizeAndRoute:
        from fluidopt.fluid.lp import solve_fluid

        return cls.from_solution(solve_fluid(scenario, pricing, slis), scenario, mixed_gpus=mixed_gpus)


class SLIGateAndRoute(PartitionedController):
    """SLI-aware Gate-and-Route (paper Thm 5.1): per-class solo probabilities, one FCFS buffer per pool.

    ``p_solo``: per-class probability that a finished prefill's decode goes to the solo pool
    (:func:`solo_probabilities` of the SLI LP). A decode sent to a pool starts on a random GPU of that
    pool with a free decode slot, else waits in that pool's buffer (named queues ``decode_mixed`` and
    ``decode_solo``); a freed decode slot pulls the FCFS head of its own pool's buffer. When the fleet
    has no solo (mixed) pool, every decode goes to the other pool.
    """

    name = "sli-gate-and-route"
    MIXED_BUFFER = "decode_mixed"
    SOLO_BUFFER = "decode_solo"

    def __init__(self, x: Sequence[float], p_solo: Sequence[float], q_prefill: Sequence[float] | None = None,
                 **kw: Any) -> None:
        super().__init__(x, q_prefill, **kw)
        p = _vector("p_solo", p_solo, self.n_classes)
        if np.any(p > 1):
            raise ScenarioError(f"p_solo: expected probabilities in [0, 1], got {p.tolist()}")
        self.p_solo = p
        self._route = ROUTE_SLI
        self._p = doubles(p)
        self._buf = ints([DECODE_QUEUE, DECODE_QUEUE])

    def _setup_queues(self, ctx: Context) -> None:
        self._buf = ints([ctx.add_queue(self.MIXED_BUFFER), ctx.add_queue(self.SOLO_BUFFER)])

    @classmethod
    def from_solution(cls, solution: FluidSolution, scenario: Scenario | Rates, *,
                      mixed_gpus: int | None = None) -> SLIGateAndRoute:
        """Targets from the (SLI) LP ``solution``; decode rates mu_m, mu_s from ``scenario`` for p_s,i."""
        _check_solution(solution, f"{cls.__name__}.from_solution")
        rates = _rates_of(scenario, f"{cls.__name__}.from_solution")
        return cls(solution.x, solo_probabilities(solution, rates), **cls._solution_kwargs(solution, mixed_gpus))

    @classmethod
    def from_scenario(cls, scenario: Scenario, slis: Sequence[Any] = (), *, pricing: str = "bundled",
                      mixed_gpus: int | None = None) -> SLIGateAndRoute:
        from fluidopt.fluid.lp import solve_fluid

        return cls.from_solution(solve_fluid(scenario, pricing, slis), scenario, mixed_gpus=mixed_gpus)


class WeightedSLIGateAndRoute(SLIGateAndRoute):
    """General SLI-aware Gate-and-Route for plans with a decode buffer (q_d* > 0; paper EC 13).

    Gate and first routing attempt as in :class:`SLIGateAndRoute` (pool drawn with p_s,i, a random GPU
    of that pool with a free decode slot). A decode that finds no room waits in the per-class FCFS
    buffer :data:`DECODE_QUEUE`, shared by both pools. A freed decode slot in pool k (mixed or solo)
    serves a waiting class i drawn with probability proportional to ``weights[k][i]`` = mu_k,i y_k,i*
    (classes with weight 0 are never served by pool k): when pool k is saturated its class-i decode
    completions then run at n mu_k,i y_k,i*, i.e. its class-i occupancy tracks n y_k,i*. A class with
    no planned decode flow at all (y_m,i* = y_s,i* = 0, possible when q_d* > 0) is prefilled if
    x_i* > 0 but never decoded: the plan prefills it only to keep mixed GPUs in their (faster) mixed
    mode, and it abandons from the buffer.
    """

    name = "sli-weighted-gate-and-route"

    def __init__(self, x: Sequence[float], p_solo: Sequence[float], weights_mixed: Sequence[float],
                 weights_solo: Sequence[float], q_prefill: Sequence[float] | None = None, **kw: Any) -> None:
        super().__init__(x, p_solo, q_prefill, **kw)
        wm = _vector("weights_mixed", weights_mixed, self.n_classes)
        ws = _vector("weights_solo", weights_solo, self.n_classes)
        self.weights_mixed, self.weights_solo = wm, ws
        self._w = [[float(v) for v in wm], [float(v) for v in ws]]

    def _setup_queues(self, ctx: Context) -> None:
        self._buf = ints([DECODE_QUEUE, DECODE_QUEUE])

    def on_prefill_done(self, ctx: Context, r: int, g: int) -> None:
        i = ctx.req_class(r)
        pool = self._pool_for(ctx, i)
        if self._w[pool][i] <= 0.0:
            return  # no planned decode flow for class i in that pool (or at all): r waits, and may abandon
        h = ctx.free_decode(pool).choice()
        if h >= 0 and self._fits(ctx, r, h):
            ctx.start_decode(r, h)
        # else: the engine appends r to DECODE_QUEUE (per-class FCFS)

    def pick_class(self, ctx: Context, pool: int) -> int:
        """A waiting class drawn with probability proportional to its weight in ``pool``, or -1. O(I)."""
        w = self._w[pool]
        total = 0.0
        for i, wi in enumerate(w):
            if wi > 0 and ctx.qlen(DECODE_QUEUE, i):
                total += wi
        if total <= 0.0:
            return -1
        u = ctx.rng.random() * total
        last = -1
        for i, wi in enumerate(w):
            if wi > 0 and ctx.qlen(DECODE_QUEUE, i):
                last = i
                u -= wi
                if u < 0.0:
                    return i
        return last  # round-off: u landed on the upper edge

    def on_slot_freed(self, ctx: Context, g: int) -> None:
        if self._prefill_slot_idle(ctx, g):
            self._admit_on(ctx, g)
        pool = ctx.gpu_pool(g)
        while self._decode_slot_free(ctx, g):
            i = self.pick_class(ctx, pool)
            if i < 0:
                return
            r = ctx.head(DECODE_QUEUE, i)
            if not self._fits(ctx, r, g):
                return
            ctx.start_decode(r, g)

    @classmethod
    def from_solution(cls, solution: FluidSolution, scenario: Scenario | Rates, *,
                      mixed_gpus: int | None = None) -> WeightedSLIGateAndRoute:
        _check_solution(solution, f"{cls.__name__}.from_solution")
        rates = _rates_of(scenario, f"{cls.__name__}.from_solution")
        wm = rates.mu_m * np.asarray(solution.y_mixed)
        ws = rates.mu_s * np.asarray(solution.y_solo)
        return cls(solution.x, solo_probabilities(solution, rates), wm, ws,
                   **cls._solution_kwargs(solution, mixed_gpus))


# -- registry: names usable as simulate(..., controller="gate-and-route") and by the CLI -------------
def _build(cls: type, scenario: Scenario, pricing: str, slis: Sequence[Any] | None, mixed_gpus: int | None,
           plan: FluidSolution | None) -> PartitionedController:
    """The controller from ``plan`` when given, else from the LP of the scenario (with its own SLIs
    unless ``slis`` is given)."""
    if isinstance(plan, dict):
        plan = plan.get(pricing)
    if plan is None:
        return cls.from_scenario(scenario, slis, pricing=pricing, mixed_gpus=mixed_gpus)
    if slis is not None:
        raise ScenarioError(f"{cls.name}: give either slis or a solved plan (whose LP already holds its SLIs), not both")
    if plan.pricing != pricing:
        raise ScenarioError(f"{cls.name}: the plan was solved with pricing={plan.pricing!r}, the policy runs {pricing!r}")
    # Gate-and-Route and its subclasses plan from x* alone; the SLI-aware and separate-pricing
    # controllers also need the scenario's rates.
    if "scenario" in inspect.signature(cls.from_solution).parameters:
        return cls.from_solution(plan, scenario, mixed_gpus=mixed_gpus)
    return cls.from_solution(plan, mixed_gpus=mixed_gpus)


@register("gate-and-route", aliases=("gg-sp",), description=(
    "paper's Gate-and-Route (GG-SP): static partition, deviation-index gate, solo-first greedy router"))
def make_gate_and_route(scenario: Scenario, *, pricing: str = "bundled", slis: Sequence[Any] | None = None,
                        mixed_gpus: int | None = None, plan: FluidSolution | None = None) -> PartitionedController:
    """Gate-and-Route from the scenario's LP (or the given ``plan``)."""
    return _build(GateAndRoute, scenario, pricing, slis, mixed_gpus, plan)


@register("prioritize-and-route", description=(
    "paper's Prioritize-and-Route for separate pricing: gate by largest D/P, greedy router"))
def make_prioritize_and_route(scenario: Scenario, *, pricing: str = "separate", slis: Sequence[Any] | None = None,
                              mixed_gpus: int | None = None, plan: FluidSolution | None = None) -> PartitionedController:
    """Prioritize-and-Route from the scenario's separate-pricing LP (or the given ``plan``)."""
    return _build(PrioritizeAndRoute, scenario, pricing, slis, mixed_gpus, plan)


@register("sli-gate-and-route", description=(
    "SLI-aware Gate-and-Route: LP-planned solo probability per class, one decode buffer per pool"))
def make_sli_gate_and_route(scenario: Scenario, *, pricing: str = "bundled", slis: Sequence[Any] | None = None,
                            mixed_gpus: int | None = None, plan: FluidSolution | None = None) -> PartitionedController:
    """SLI-aware Gate-and-Route from the scenario's LP with its SLIs (or the given ``plan``)."""
    return _build(SLIGateAndRoute, scenario, pricing, slis, mixed_gpus, plan)


@register("sli-weighted-gate-and-route", aliases=("sli-general",), description=(
    "general SLI-aware Gate-and-Route (q_d* > 0): per-class buffers, pools pick classes by mu y*"))
def make_sli_weighted_gate_and_route(scenario: Scenario, *, pricing: str = "bundled", slis: Sequence[Any] | None = None,
                                     mixed_gpus: int | None = None,
                                     plan: FluidSolution | None = None) -> PartitionedController:
    """General SLI-aware Gate-and-Route from the scenario's LP with its SLIs (or the given ``plan``)."""
    return _build(WeightedSLIGateAndRoute, scenario, pricing, slis, mixed_gpus, plan)
