"""Backpressure Gate-and-Route: an LP-guided gate-and-route controller built for finite fleets and bursty traffic.

Gate-and-Route (:mod:`fluidopt.control.gate_and_route`) is asymptotically optimal, but at 50 to 2,000
GPUs it leaks revenue through a chain that docs/results.md decomposes: a class the LP serves in full
is planned exactly at its offered prefill load (a critically loaded many-server queue), the
work-conserving gate hands the slots it leaves to a class the LP rations, that class's extra decodes
overflow a decode pool the LP fills exactly, and prefilled requests abandon in the decode buffer. On
real traces a static partition sized for the mean rates also starves bursts of long prompts. This
controller keeps the LP plan (x*, q_p* and the partition from the same fluid solution) and adds nine
mechanisms, each an option of the factory so that every one can be switched off (the ablation of
docs/robust-control.md):

* ``backpressure`` (on): a class-i prefill is admitted only if a decode slot is free now, or if fewer
  decodes will want a slot within one mean class-i prefill (those waiting ahead of class i in the
  buffer, plus the prefills in flight expected to finish by then) than the plan frees in that time
  (n sum_k thr_k* / mu_p,i). A prefill then starts when its decode is expected to find a slot: the
  partitioned analogue of GI-WSP's coupled decode, which commits decode capacity at admission.
* ``caps`` (off): a class the LP rations (served fraction < 1, q_p,i* > 0) is admitted only while
  X_i < ceil(n x_i*); classes served in full have no cap. Backpressure removes the same
  over-admission without the rounding loss at small n.
* ``staffing`` (off): square-root safety staffing of the critically loaded stage. The classes served
  in full form an Erlang A queue (M/M/c+M) on the reserved slots the rationed classes cannot take;
  extra mixed GPUs are added one at a time while one more reserved slot saves more revenue
  (w * arrival rate * drop in abandonment probability, Erlang A) than the decode slot it costs (the
  LP's shadow price of a solo decode slot): the Halfin-Whitt regime. Off by default: overflow gives
  the critical class spare capacity only when it needs it, without giving up decode slots.
* ``decode_order="value"`` (default): the decode buffer serves the waiting class with the largest
  w_i mu_s,i / theta_i first (the c mu / theta rule for many-server queues with abandonment), FCFS
  within a class; ``"fcfs"`` is Gate-and-Route's buffer.
* ``overflow`` (on): a partition that moves capacity to the queue that builds. When every reserved
  slot is busy and the gate still has a class to admit, a prefill may start in a free slot of a solo
  GPU (which runs mixed for the length of that one prefill), at most ``max_overflow`` at once
  (default: the solo pool), for classes the LP serves in full, and for every class where a mixed
  iteration does not slow decodes (gamma tau <= 1). A free solo slot means the decode buffer is
  empty, so this never takes decode capacity a waiting decode could use.
* ``elastic`` (on): elastic prefill capacity where the plan rations every class it admits and
  mixing is costly (gamma tau > 1), so that no class may overflow: then one *floating* solo GPU may
  host a rationed prefill on a free slot (when the request is worth more than the LP prices the
  mixed iteration, w_i > (B - 1)(v_s - v_m) / mu_p,i), and in-flight prefills no longer than the new
  one count in full in its backpressure sum. Without it the M = ceil(n sum x*) reserved slots are
  the whole prefill capacity, barely above the decode pool's completion rate, and decode slots idle
  whenever a run of completions outpaces them. Inactive (decisions unchanged) on every other plan.
* ``elastic_slots`` (on; acts only where ``elastic`` does): the floating capacity follows the idle
  decode slots instead of being one GPU. A floating class-i prefill may start on a free solo slot
  while the decode slots free now (not held by an overflow prefill) plus the slots the plan frees
  during one class-i prefill, less one Poisson standard deviation of that count, exceed the decodes
  ahead of class i (the backpressure sum, in-flight prefills counted in full). One GPU adds 1/M to
  the prefill capacity (1.2% at n = 500 on random instance 11) while the runs of decode completions
  it must absorb grow like sqrt(M): too little at large n to refill the decode slots they leave idle.
* ``coupled`` (on; acts exactly where ``elastic`` would on the original plan, and then replaces the
  floating capacity of ``elastic`` and ``elastic_slots``): no partition. Every GPU keeps its B slots
  and may run one prefill in a free one, so a prefill holds the slot its decode will take from
  admission to completion (GI-WSP's commitment; the greedy router still places the decode in any free
  slot, and the GPU that finished takes its next prefill at once). On a plan that rations every class
  it admits, every prefill exists only to fill a decode slot, and a reserved prefill slot (one that
  cannot decode) makes each decode wait for a slot that frees elsewhere: admitted early, its decode may
  wait and abandon in the buffer after its prefill was paid; admitted late, the slot idles. Coupled,
  neither happens, and the number of GPUs prefilling follows the slots that free (n x* in the fluid
  limit). Decided at setup (the pools are declared once); a re-solve moves the gate's targets only.
* ``resolve`` (on): re-solving the LP on a rolling estimate of the arrival rates. Arrivals are counted
  per class over windows of W = max(2,000 / Lambda, 1 / theta_min) seconds (Lambda: the plan's
  cluster arrival rate; 2,000 arrivals make a 2% rate estimate, and queues react on the patience
  time scale). At the end of a window, if some class's count differs from the current plan's
  expectation by more than 3 Poisson standard deviations, the LP is re-solved at the window's rates
  and the gate's targets follow it; a window consistent with the original plan returns to it. The
  partition stays (overflow absorbs a larger prefill share).

Assumptions: bundled pricing (revenue per completed request), the fluid plan of
:func:`fluidopt.fluid.lp.solve_fluid`, exponential patience and service (used only by the staffing rule, the backpressure horizon and the
c mu / theta order). Where the LP keeps a decode buffer (q_d* > 0) its planned buffer is allowed and
classes it never decodes are left in the buffer, as in the plan. Nothing is tuned per instance: every
threshold above comes from the scenario, the LP and the observed state.

:class:`BackpressureSLIGateAndRoute` applies time-averaged ``caps`` (the long-run X_i equals n x_i*, not
ceil(n x_i*)) to the SLI-aware router (per-pool buffers, solo probabilities p_s,i), where the same
over-admission breaks the decode-fairness SLI; ``staffing`` is an option there.

:class:`StaffedPrioritizeAndRoute` applies them to Prioritize-and-Route (separate pricing), whose plan
prefills every arrival and loads the prefill stage critically: ``staffing`` (on) is priced by the
separate LP (a served arrival is worth the dual of its arrival row; a mixed GPU costs the solo decode
slot it reserves plus its slower decodes while its prefill slot works), with ``overflow`` and
``resolve`` on; backpressure, caps and the value order are options, off (a prefill is paid even if
its decode abandons, so holding prefills back for decode room only loses revenue there).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from fluidopt.control.gate_and_route import (
    _EPS,
    MIXED_POOL,
    SOLO_POOL,
    GateAndRoute,
    PartitionedController,
    PrioritizeAndRoute,
    SLIGateAndRoute,
    _check_solution,
)
from fluidopt.control.gate_handlers import ROUTE_ROBUST, doubles, ints
from fluidopt.control.protocol import PREFILL_QUEUE, Context
from fluidopt.control.registration import register
from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import Scenario
from fluidopt.fluid.solution import FluidSolution, mixed_gpus_of

__all__ = [
    "BackpressureGateAndRoute",
    "BackpressureSLIGateAndRoute",
    "StaffedPrioritizeAndRoute",
    "RESOLVE_ARRIVALS",
    "RESOLVE_SIGMAS",
    "safety_mixed_gpus",
]

RESOLVE_ARRIVALS = 2000  # arrivals per rate-estimation window: a 1/sqrt(2000) = 2% estimate
RESOLVE_SIGMAS = 3.0  # re-solve when a class's window count is this many Poisson sd off the plan
_RATIONED_TOL = 1e-6  # served fraction below 1 - this: the LP rations the class
DECODE_ORDERS = ("value", "fcfs")


def _lp_targets(v: Any) -> np.ndarray:
    """An LP vector as gate targets: entries below _EPS (per GPU) count as zero."""
    return np.where(np.asarray(v) < _EPS, 0.0, np.asarray(v, float))


def _rationed(solution_x: np.ndarray, lam: np.ndarray, mu_p: np.ndarray) -> list[bool]:
    """Per class: the LP admits less than its arrivals (x_i* > 0 and mu_p x_i* < lam_i (1 - tol))."""
    return [bool(x > 0 and m * x < l * (1.0 - _RATIONED_TOL)) for x, l, m in zip(solution_x, lam, mu_p)]


def safety_mixed_gpus(n_gpus: int, x: Sequence[float], lam: Sequence[float], mu_p: Sequence[float],
                      theta: Sequence[float], w: Sequence[float], slot_value: float, busy_cost: float = 0.0) -> int:
    """Extra mixed GPUs for the critically loaded classes (square-root safety staffing, Erlang A).

    The classes served in full (mu_p,i x_i* = lambda_i) share the reserved slots the rationed
    classes leave: c0 = ceil(n X*) - sum_rationed ceil(n x_r*) of them (at least 1). They are pooled
    into one M/M/c+M queue (arrivals n sum lambda_i per second, mean service the pooled mean, patience
    the arrival-weighted theta), and one server is added at a time while w * arrivals * (P_ab(c) -
    P_ab(c+1)) > ``slot_value`` (revenue per second of the decode slot an extra mixed GPU gives up;
    the LP's shadow price of solo decode capacity). ``busy_cost``: revenue per second an extra mixed
    GPU loses while its prefill slot is busy (its decodes run at the mixed rate); that slot is busy for
    the work it saves, L (P_ab(c) - P_ab(c+1)) / mu slot-seconds per second, so that much is added to
    the cost (0: the bundled variant's rule). Returns the number added (0 if no class is served in
    full), never more than the solo GPUs.
    """
    from fluidopt.queueing.closed_forms import erlang_a

    x, lam, mu_p, theta, w = (np.asarray(v, float) for v in (x, lam, mu_p, theta, w))
    rat = _rationed(x, lam, mu_p)
    crit = [i for i in range(x.size) if x[i] > 0 and not rat[i]]
    if not crit or n_gpus <= 0:
        return 0
    M = mixed_gpus_of(n_gpus, float(x.sum()))
    room = n_gpus - M
    if room <= 0:
        return 0
    L = float(n_gpus * lam[crit].sum())  # cluster arrivals per second
    a = float(n_gpus * x[crit].sum())  # offered load (busy slots)
    if L <= 0 or a <= 0:
        return 0
    mu = L / a
    th = float(lam[crit] @ theta[crit] / lam[crit].sum())
    val = float(lam[crit] @ w[crit] / lam[crit].sum())
    c0 = max(1, M - sum(math.ceil(n_gpus * x[i] - 1e-9) for i in range(x.size) if rat[i]))
    limit = min(room, int(math.ceil(3.0 * math.sqrt(a))) + 3)
    extra = 0
    prev = erlang_a(L, mu, c0, th).p_abandon
    while extra < limit:
        nxt = erlang_a(L, mu, c0 + extra + 1, th).p_abandon
        saved = L * (prev - nxt)  # arrivals per second that no longer abandon
        if val * saved <= slot_value + busy_cost * saved / mu:
            break
        extra += 1
        prev = nxt
    return extra


class _Mechanisms:
    """The mechanisms shared by the bundled and the SLI-aware variant (mixed into a PartitionedController)."""

    def _init_mechanisms(self, scenario: Scenario, solution: FluidSolution, *, backpressure: bool, caps: bool,
                         staffing: bool, decode_order: str, overflow: bool, max_overflow: int | None,
                         resolve: bool, elastic: bool = False, elastic_slots: bool = False,
                         coupled: bool = False) -> None:
        for name, v in (("backpressure", backpressure), ("caps", caps), ("staffing", staffing),
                        ("overflow", overflow), ("resolve", resolve), ("elastic", elastic),
                        ("elastic_slots", elastic_slots), ("coupled", coupled)):
            if not isinstance(v, (bool, np.bool_)):
                raise ScenarioError(f"{self.name}: {name}: expected true or false, got {v!r}")
        if decode_order not in DECODE_ORDERS:
            raise ScenarioError(f"{self.name}: decode_order: expected one of {', '.join(DECODE_ORDERS)}, "
                                f"got {decode_order!r}")
        if max_overflow is not None and (isinstance(max_overflow, bool) or not isinstance(max_overflow, (int, np.integer))
                                         or max_overflow < 0):
            raise ScenarioError(f"{self.name}: max_overflow: expected an integer >= 0 (GPUs), got {max_overflow!r}")
        self.scenario = scenario
        self.solution = solution
        self.backpressure = bool(backpressure)
        self.caps = bool(caps)
        self.staffing = bool(staffing)
        self.decode_order = decode_order
        self.overflow = bool(overflow)
        self.max_overflow_option = max_overflow
        self.resolve = bool(resolve)
        self.elastic = bool(elastic)
        self.elastic_slots = bool(elastic_slots)
        self.coupled = bool(coupled)
        self._coupled_on = False  # set by _declare_pools: no partition, the prefill's slot is its decode's
        self._elastic_on = False  # set by _targets: the plan rations every admitted class (see _elastic_plan)
        self._slots_on = False  # set by _targets: elastic_on and elastic_slots (see _elastic_plan)
        self._float_classes: list[bool] = []
        self._float_room: list[float] = []
        self._decode_slots = 0
        r = scenario.rates()
        self._rates = r
        self._w = np.asarray(r.w, float)
        # c mu / theta priority of the decode buffer (value per decode slot-second over patience rate)
        idx = self._w * r.mu_s / np.maximum(r.theta, 1e-12)
        self._decode_order = sorted(range(len(idx)), key=lambda i: (-idx[i], i))
        self._slot_value = max(float(solution.duals.get("solo_decode_capacity", 0.0) or 0.0), 0.0)
        # the staffing rule's economics: value of one more served arrival per class, cost per second of
        # one more mixed GPU (the bundled variant: w_i and the solo decode slot's shadow price)
        self._staff_value = self._w
        self._staff_cost = self._slot_value
        self._staff_busy_cost = 0.0
        self._lam_plan = np.asarray(r.lam, float)  # per GPU
        self._gamma_tau = float(scenario.gpu.gamma * scenario.gpu.tau_mix)
        self.resolves = 0  # LP re-solves performed (diagnostics)
        self.extra_mixed = 0
        self._over = ints([0])  # solo GPUs running an overflow prefill (shared with the compiled handlers)
        self._max_overflow = 0
        self._all_decodable = True
        if isinstance(self, _MechanismEvents):
            self._route = ROUTE_ROBUST  # the greedy route with re-solve counts, overflow and the value order
        self._buffer_allowed = 0.0
        self._plan_now = solution
        if resolve:
            lam_cluster = float(self._lam_plan.sum() * scenario.gpus)
            th_min = float(np.min(r.theta[r.theta > 0])) if np.any(r.theta > 0) else 0.0
            win = RESOLVE_ARRIVALS / lam_cluster if lam_cluster > 0 else math.inf
            if th_min > 0:
                win = max(win, 1.0 / th_min)
            self.tick_interval = float(win)
        self._counts = ints([0] * len(idx))  # arrivals per class in the re-solve window (the handlers count)
        self._I = len(idx)

    @property
    def overflowing(self) -> int:
        """Solo GPUs running an overflow prefill now (the handlers keep the count in ``_over``)."""
        return int(self._over[0])

    # -- planning -------------------------------------------------------------------------------
    def _targets(self) -> None:
        """Caps and rationed flags from the current x*, q_p* (per GPU) for the fleet size n."""
        n = self.n_gpus
        r = self._rates
        lam = self._lam_now
        rat = _rationed(self.x, lam, r.mu_p)
        self._rationed_flags = rat
        self._cap = [float(math.ceil(n * float(self.x[i]) - 1e-9)) if (self.caps and rat[i]) else math.inf
                     for i in range(self.n_classes)]
        self._uncapped = all(c == math.inf for c in self._cap)
        sol = self._plan_now
        flow = np.asarray(sol.y_mixed, float) + np.asarray(sol.y_solo, float)
        # A class the plan prefills but never decodes (possible only when q_d* > 0, gamma tau < (B-1)/B)
        # is left to wait in the buffer, as in the plan; backpressure allows the plan's own buffer.
        self._decodable = [bool(f > 1e-12) or float(self.x[i]) <= 0 for i, f in enumerate(flow)]
        self._all_decodable = all(self._decodable)
        self._buffer_allowed = n * float(np.sum(np.clip(np.asarray(sol.q_decode, float), 0.0, None)))
        # Backpressure room of class i: the decode slots the plan frees (n * planned completions per
        # second) during one mean class-i prefill (1 / mu_p,i seconds), plus the plan's own buffer. A
        # class-i prefill admitted with fewer decodes ahead of it in the buffer should find a slot free
        # when it completes; with more, it would only wait (and may abandon) after its prefill was paid.
        done = n * float(np.sum(np.asarray(sol.throughput, float)))
        self._room = [done / float(mu) + self._buffer_allowed for mu in np.asarray(r.mu_p, float)]
        mu_p = np.asarray(r.mu_p, float)
        # P[i][j]: probability that a class-j prefill in flight finishes within one mean class-i
        # prefill (exponential residual: 1 - exp(-mu_p,j / mu_p,i))
        self._finish_within = [[1.0 - math.exp(-mu_p[j] / mu_p[i]) for j in range(self.n_classes)]
                               for i in range(self.n_classes)]
        rank = [0] * self.n_classes
        for k, i in enumerate(self._decode_order):
            rank[i] = k
        self._fcfs_buffer = self.decode_order == "fcfs"
        P = self._finish_within
        self._ahead_terms = [[(j, P[i][j]) for j in range(self.n_classes) if self._fcfs_buffer or rank[j] <= rank[i]]
                             for i in range(self.n_classes)]
        # Overflow is for a class whose queue builds against the plan (served in full by the LP, so a
        # waiting request is a deviation) or for any class where a mixed iteration does not slow the
        # GPU's decodes (gamma tau <= 1): elsewhere turning a solo GPU mixed costs its decodes more than
        # the prefill is likely to earn, and the LP has already priced that trade-off into x*.
        cheap = self._gamma_tau <= 1.0
        self._may_overflow = [cheap or not rat[i] for i in range(self.n_classes)]
        self._overflow_caps = [math.inf if ok else -math.inf for ok in self._may_overflow]
        self._elastic_plan()
        self._pack()

    def _pack(self) -> None:
        """The plan as the handlers read it (gate_handlers.STATE): the per-class lists as typed arrays, the
        backpressure terms flattened (class i's: ``_t_j`` / ``_t_p`` from ``_t_off[i]`` to ``_t_off[i + 1]``)."""
        I = self.n_classes
        self._bp = self.backpressure
        self._cap = doubles(self._cap)
        self._room = doubles(self._room)
        off, js, ps = [0], [], []
        for i in range(I):
            for j, p in self._ahead_terms[i]:
                js.append(j)
                ps.append(p)
            off.append(len(js))
        self._t_off, self._t_j, self._t_p = ints(off), ints(js), doubles(ps)
        self._value_order = self._route == ROUTE_ROBUST and not (self.decode_order == "fcfs" and self._all_decodable)
        self._dorder = ints(self._decode_order if self._all_decodable
                            else [i for i in self._decode_order if self._decodable[i]])
        self._decodable = ints(self._decodable)
        self._may_overflow = ints(self._may_overflow)
        self._ovcap_el = doubles([math.inf if fl else c for fl, c in zip(self._float_classes, self._overflow_caps)]
                                 if self._elastic_on else self._overflow_caps)
        self._overflow_caps = doubles(self._overflow_caps)
        self._ovcap_now = doubles(self._overflow_caps)
        self._float_cls = ints(self._float_classes)
        self._float_room = doubles(self._float_room if self._slots_on else [0.0] * I)

    def _elastic_plan(self) -> None:
        """Elastic prefill capacity for a plan that rations every class it admits (``elastic``).

        Where some admitted class is served in full, overflow already gives the prefill stage elastic
        capacity (that class's waiting requests may start on free solo slots). Where every admitted
        class is rationed and a mixed iteration slows decodes (gamma tau > 1), none may overflow, so the
        M = ceil(n sum x*) reserved slots are the whole prefill capacity: they must produce prefills at
        the decode pool's completion rate with about 1/sqrt(M) to spare, and every decode slot that frees
        while they are busy stays idle (the decode stage is the one the LP fills exactly). Then:

        * one *floating* GPU: a rationed class may start a prefill on a free solo slot while no other
          solo GPU runs one (the partition's rounding unit, moved to where decode capacity idles), if
          the request is worth more than the mixed iteration costs at the LP's prices:
          w_i > (B - 1)(v_s - v_m) / mu_p,i (its B - 1 decodes slowed from solo to mixed for one prefill);
        * in-flight prefills that are no longer than a class-i prefill on average (mu_p,j >= mu_p,i)
          count in full in class i's backpressure sum (each is expected to want its decode slot before
          the new one), so the floating capacity refills idle decode slots instead of the buffer.
        * with ``elastic_slots``, the floating capacity is not one GPU but follows the idle decode slots:
          a floating class-i prefill may start while the free decode slots F plus the room
          (n sum thr* / mu_p,i) less its Poisson standard deviation sqrt(room) exceed the decodes ahead
          of class i (_elastic_caps). Every prefill in flight is expected to want a slot within one
          prefill, so F + room - sqrt(room) is the number of slots still idle then even when the frees
          come one standard deviation short.

        Elsewhere nothing changes (the plan has elastic capacity, or mixing is cheap and every class may
        overflow).
        """
        n_cls = self.n_classes
        self._float_classes = [False] * n_cls
        self._elastic_on = False
        self._slots_on = False
        if not (self.elastic and self.overflow) or self.n_gpus <= self.mixed_gpus:
            return
        self._float_classes = self._floating_classes(self._plan_now, self.x, self._rationed_flags)
        if not any(self._float_classes):
            return
        r = self._rates
        mu_p = [float(v) for v in r.mu_p]
        B = int(self.batch)
        self._elastic_on = True
        self._ahead_terms = [[(j, 1.0 if mu_p[j] >= mu_p[i] else p) for j, p in row]
                             for i, row in enumerate(self._ahead_terms)]
        self._may_overflow = [ok or fl for ok, fl in zip(self._may_overflow, self._float_classes)]
        if self.elastic_slots:
            # the floating capacity follows the idle decode slots (_elastic_caps): a floating class-i prefill
            # needs the slots free now plus the room (the slots the plan frees during one class-i prefill,
            # a Poisson count) to exceed the decodes ahead of it by one standard deviation of that count
            self._slots_on = True
            self._decode_slots = self.mixed_gpus * (B - 1) + (self.n_gpus - self.mixed_gpus) * B
            self._float_room = [room - math.sqrt(room) for room in self._room]

    def _floating_classes(self, sol: FluidSolution, x: Sequence[float], rat: Sequence[bool]) -> list[bool]:
        """Per class: the plan ``sol`` (gate targets ``x``, rationed flags ``rat``) rations every class it
        admits, a mixed iteration slows decodes (gamma tau > 1, so that no class may overflow), and a
        class-i request is worth more than the LP prices the mixed iteration of one class-i prefill on a
        solo GPU, w_i > (B - 1)(v_s - v_m) / mu_p,i. All False elsewhere (``elastic`` is then inactive)."""
        n_cls = self.n_classes
        admitted = [i for i in range(n_cls) if float(x[i]) > 0]
        if not admitted or any(self._gamma_tau <= 1.0 or not rat[i] for i in admitted):
            return [False] * n_cls
        d = sol.duals
        v_s = max(float(d.get("solo_decode_capacity", 0.0) or 0.0), 0.0)
        v_m = max(float(d.get("mixed_decode_capacity", 0.0) or 0.0), 0.0)
        mu_p = [float(v) for v in self._rates.mu_p]
        B = int(self.batch)
        return [bool(rat[i] and float(x[i]) > 0 and float(self._w[i]) > (B - 1) * max(v_s - v_m, 0.0) / mu_p[i])
                for i in range(n_cls)]

    def plan_mixed_gpus(self, n_gpus: int) -> int:
        base = PartitionedController.plan_mixed_gpus(self, n_gpus)
        if not self.staffing or self.mixed_override is not None:
            return base
        r = self._rates
        extra = safety_mixed_gpus(n_gpus, self.x, self._lam_plan, r.mu_p, r.theta, self._staff_value,
                                  self._staff_cost, self._staff_busy_cost)
        return min(int(n_gpus), base + extra)

    def _coupled_plan(self) -> bool:
        """``coupled``: the original plan is one where ``elastic`` acts (it rations every class it admits,
        gamma tau > 1, some class worth its mixed iteration) and the partition is the plan's own."""
        if not (self.coupled and self.elastic and self.overflow) or self.mixed_override is not None:
            return False
        sol = self.solution
        x = _lp_targets(sol.x)  # as _apply
        if self.n_gpus <= mixed_gpus_of(self.n_gpus, float(x.sum())):
            return False
        return any(self._floating_classes(sol, x, _rationed(x, self._lam_plan, self._rates.mu_p)))

    def _declare_pools(self, ctx: Context) -> None:
        n, B = self.n_gpus, self.batch
        self._coupled_on = self._coupled_plan()
        if self._coupled_on:
            # One pool, no reserved slot: every GPU may prefill into one of its B slots, so a prefill holds
            # the slot its decode will take (GI-WSP's commitment; the gate and the rest are unchanged).
            ctx.set_pool(range(n), MIXED_POOL, prefill=True, max_decodes=B)
            self.mixed_gpus = n
            self.extra_mixed = 0
            self._has_mixed, self._has_solo = True, False
            self._over = ints([0])
            self._max_overflow = 0
            return
        M = self.plan_mixed_gpus(n)
        self.mixed_gpus = M
        self.extra_mixed = M - PartitionedController.plan_mixed_gpus(self, n)
        self._has_mixed = M > 0
        self._has_solo = M < n
        if M > 0:
            ctx.set_pool(range(M), MIXED_POOL, prefill=True, max_decodes=B - 1)
        if M < n:
            # overflow: solo GPUs may host one prefill in a free slot (never a reserved one)
            ctx.set_pool(range(M, n), SOLO_POOL, prefill=self.overflow, max_decodes=B)
        self._over = ints([0])
        mo = self.max_overflow_option
        # never more than the solo GPUs (each hosts at most one prefill): with no solo pool, no overflow
        self._max_overflow = ((n - M) if mo is None else min(int(mo), n - M)) if self.overflow else 0

    def _bind_mechanisms(self, ctx: Context) -> None:
        self._apply(self.solution, self._lam_plan.copy())  # a reused controller starts from its plan
        self._counts = ints([0] * self.n_classes)
        self._window_start = float(ctx.now)

    def _decodes_ahead(self, ctx: Context) -> list[float]:
        """Per class i: the decodes that will want a slot within one mean class-i prefill before a
        class-i decode: those waiting ahead of it in the buffer (its own class and, in value order,
        higher ones; FCFS: all), plus the prefills in flight of those classes expected to finish within
        1 / mu_p,i (exponential: probability 1 - exp(-mu_p,j / mu_p,i)). 0 while a decode slot is free."""
        if self._decode_slot_free_now(ctx):
            return [0.0] * self._I
        return [self._ahead_of(i) for i in range(self._I)]

    # -- rolling re-solve -----------------------------------------------------------------------
    def on_tick(self, ctx: Context) -> None:
        if not self.resolve:
            return
        now = float(ctx.now)
        span = now - self._window_start
        counts = np.asarray(self._counts, float)
        self._counts[:] = ints([0] * len(self._counts))  # in place: the compiled handlers count into it
        self._window_start = now
        if span <= 0:
            return
        if self._consistent(counts, self._lam_plan, span):
            # the traffic is back at the original plan's rates: return to it (so a false alarm, a
            # 3-sigma event under the plan's Poisson arrivals, is undone at the next window)
            if self._plan_now is not self.solution:
                self._apply(self.solution, self._lam_plan)
            return
        if self._plan_now is not self.solution and self._consistent(counts, self._lam_now, span):
            return  # still at the rates of the last re-solve
        self._resolve_at(counts / span)

    def _consistent(self, counts: np.ndarray, lam_per_gpu: np.ndarray, span: float) -> bool:
        """Every class's window count within RESOLVE_SIGMAS Poisson sd of lam * n * span."""
        expected = lam_per_gpu * self.n_gpus * span
        dev = np.abs(counts - expected) / np.sqrt(np.maximum(expected, 1.0))
        return not bool(np.any(dev > RESOLVE_SIGMAS))

    def _resolve_at(self, cluster_rates: np.ndarray) -> None:
        from fluidopt.fluid.lp import solve_fluid

        classes = tuple(replace(c, rate=max(float(v), 1e-9)) for c, v in zip(self.scenario.classes, cluster_rates))
        sc = replace(self.scenario, gpus=self.n_gpus, classes=classes)
        sol = solve_fluid(sc, self.solution.pricing, self.solution.slis)
        if sol.status != "optimal":
            return
        self.resolves += 1
        self._apply(sol, np.asarray(sc.rates().lam, float))

    def _apply(self, sol: FluidSolution, lam_per_gpu: np.ndarray) -> None:
        """Make ``sol`` (solved at per-GPU arrival rates ``lam_per_gpu``) the gate's plan."""
        x, qp = _lp_targets(sol.x), _lp_targets(sol.q_prefill)
        self.x, self.q_prefill = x, qp
        self._scale_targets()
        self._admissible = [i for i in range(self.n_classes) if x[i] > 0]
        self._adm = ints(self._gate_order())  # a re-solve may move x_i* to or from 0
        self._lam_now = lam_per_gpu
        self._plan_now = sol
        self._targets()
        self._sync_fast()  # the compiled fast path reads the new plan


class _MechanismEvents:
    """The robust route (gate_handlers.ROUTE_ROBUST: re-solve counts, overflow prefills, the value-ordered
    buffer; the bundled and the separate-pricing variant, mixed in before :class:`_Mechanisms`): the
    re-solve's tick. The set-up is PartitionedController.setup's (with :meth:`_Mechanisms._bind_mechanisms`),
    the handlers are gate_handlers.GateHandlers'."""

    def on_tick(self, ctx: Context) -> None:
        before = self._plan_now
        _Mechanisms.on_tick(self, ctx)
        if self._plan_now is not before and self._has_mixed and ctx.qlen(PREFILL_QUEUE):
            self._admit_all(ctx)  # new targets: the gate may admit now


class BackpressureGateAndRoute(_MechanismEvents, _Mechanisms, GateAndRoute):
    """Gate-and-Route with decode-buffer backpressure, caps, safety staffing, a value-ordered buffer,
    overflow prefills on free solo slots, elastic prefill capacity or, by default, coupled decode slots
    (no partition) on a plan that rations every class it admits, and rolling LP re-solves (see the
    module docstring)."""

    name = "backpressure-gate-and-route"

    def __init__(self, scenario: Scenario, solution: FluidSolution, *, backpressure: bool = True, caps: bool = False,
                 staffing: bool = False, decode_order: str = "value", overflow: bool = True,
                 max_overflow: int | None = None, resolve: bool = True, elastic: bool = True,
                 elastic_slots: bool = True, coupled: bool = True, mixed_gpus: int | None = None) -> None:
        _check_solution(solution, type(self).__name__)
        GateAndRoute.__init__(self, solution.x, solution.q_prefill, mixed_gpus=mixed_gpus,
                              class_names=solution.class_names)
        self._init_mechanisms(scenario, solution, backpressure=backpressure, caps=caps, staffing=staffing,
                              decode_order=decode_order, overflow=overflow, max_overflow=max_overflow,
                              resolve=resolve, elastic=elastic, elastic_slots=elastic_slots, coupled=coupled)

class StaffedPrioritizeAndRoute(_MechanismEvents, _Mechanisms, PrioritizeAndRoute):
    """Prioritize-and-Route (separate pricing) with Erlang-A safety staffing priced by the separate LP,
    overflow prefills on free solo slots and rolling LP re-solves; backpressure, caps and the value
    order are options, off by default (see the module docstring)."""

    name = "staffed-prioritize-and-route"

    def __init__(self, scenario: Scenario, solution: FluidSolution, *, staffing: bool = True, overflow: bool = True,
                 max_overflow: int | None = None, resolve: bool = True, backpressure: bool = False,
                 caps: bool = False, decode_order: str = "fcfs", mixed_gpus: int | None = None) -> None:
        _check_solution(solution, type(self).__name__)
        if solution.pricing != "separate":
            raise ScenarioError(f"{type(self).__name__}: plan: expected a separate-pricing LP solution, "
                                f"got pricing={solution.pricing!r}")
        PrioritizeAndRoute.__init__(self, solution.x, [c.decode / c.prompt for c in scenario.classes],
                                    solution.q_prefill, mixed_gpus=mixed_gpus, class_names=solution.class_names)
        self._init_mechanisms(scenario, solution, backpressure=backpressure, caps=caps, staffing=staffing,
                              decode_order=decode_order, overflow=overflow, max_overflow=max_overflow,
                              resolve=resolve)
        r = self._rates
        # Separate pricing: a request's prefill revenue is earned when its prefill completes, so the decode
        # buffer is ordered by decode revenue per slot-second over the abandonment rate.
        idx = np.asarray(r.decode_reward, float) * r.mu_s / np.maximum(r.theta, 1e-12)
        self._decode_order = sorted(range(len(idx)), key=lambda i: (-idx[i], i))
        # Staffing: one more served arrival of class i is worth the separate LP's dual of its arrival row
        # (prefill balance); one more mixed GPU costs, at the LP's prices, the decode slot it reserves
        # (v_s) and, while its prefill slot is busy, the slower decodes of its other B - 1 slots
        # (v_s - v_m each).
        d = solution.duals
        self._staff_value = np.array([max(float(d.get(f"prefill_balance[{nm}]", 0.0) or 0.0), 0.0)
                                      for nm in scenario.class_names])
        v_m = max(float(d.get("mixed_decode_capacity", 0.0) or 0.0), 0.0)
        self._staff_busy_cost = (int(scenario.gpu.batch) - 1) * max(self._slot_value - v_m, 0.0)


class _AverageCaps:
    """Time-averaged caps (the SLI-aware variant's ``average_caps``): a rationed class's long-run
    prefill occupancy is held at n x_i*, not at the integer cap ceil(n x_i*).

    With caps at ceil(n x_i*) a rationed class whose target is fractional (n x_1* = 6.15 on the paper
    instance's SLI plan at n = 500: cap 7) runs up to 14% above its target whenever the class served
    in full leaves a reserved slot free, and the SLI's class shares move with it. Here the cap is
    floor(n x_i*) + 1 only while the running integral of X_i - n x_i* (slot-seconds since the start,
    bounded below by one mean class-i prefill of the planned occupancy so that an idle spell cannot
    bank unbounded credit) is negative, else floor(n x_i*): the fractional slot is used just enough
    for the time average of X_i to equal n x_i*. The integral is updated whenever X_i can change
    (the gate's admissions, prefill completions, preemptions), so it is exact between events.
    """

    def _init_average_caps(self, ctx: Context) -> None:
        """The averaged classes (``_avg``: those with a cap) and, per class (0 for the others), the integer
        part of n x_i* (``_avg_lo``), the integral's floor, the integral, X_i as last seen; then the
        caps now. The handlers (gate_handlers.GateHandlers._avg_cap) update them on every gate call,
        prefill completion, preemption and drop."""
        n = self.n_gpus
        mu_p = np.asarray(self._rates.mu_p, float)
        I = self.n_classes
        avg = [i for i in range(I) if self._cap[i] != math.inf]
        self._avg = ints(avg)
        self._avg_on = bool(avg)
        self._avg_is = ints([i in avg for i in range(I)])
        self._avg_lo = ints([math.floor(n * float(self.x[i]) + 1e-9) if i in avg else 0 for i in range(I)])
        self._avg_floor = doubles([-n * float(self.x[i]) / float(mu_p[i]) if i in avg else 0.0 for i in range(I)])
        self._avg_int = doubles([0.0] * I)
        self._avg_x = ints([ctx.n_prefill(i) if i in avg else 0 for i in range(I)])
        self._avg_t = doubles([ctx.now])
        if avg:
            self._avg_cap(ctx)

class BackpressureSLIGateAndRoute(_AverageCaps, _Mechanisms, SLIGateAndRoute):
    """SLI-aware Gate-and-Route (per-pool buffers, p_s,i) with time-averaged ``caps`` (``average_caps``);
    ``staffing`` is an option, off: extra mixed GPUs whose prefill slot is idle decode in solo mode,
    which moves the rationed class's solo-decode occupancy the decode-fairness SLI constrains (measured:
    the y_s gap 1.17 with staffing against 0.62 without at n = 500). Backpressure, the value order,
    overflow and re-solves are off: the SLI fixes which pool serves which class, and re-solving would
    move the SLI's plan."""

    name = "backpressure-sli-gate-and-route"

    def __init__(self, scenario: Scenario, solution: FluidSolution, *, caps: bool = True, staffing: bool = False,
                 average_caps: bool = True, mixed_gpus: int | None = None) -> None:
        _check_solution(solution, type(self).__name__)
        from fluidopt.control.gate_and_route import solo_probabilities

        if not isinstance(average_caps, (bool, np.bool_)):
            raise ScenarioError(f"{self.name}: average_caps: expected true or false, got {average_caps!r}")
        SLIGateAndRoute.__init__(self, solution.x, solo_probabilities(solution, scenario.rates()), solution.q_prefill,
                                 mixed_gpus=mixed_gpus, class_names=solution.class_names)
        self._init_mechanisms(scenario, solution, backpressure=False, caps=caps, staffing=staffing,
                              decode_order="fcfs", overflow=False, max_overflow=None, resolve=False)
        self.average_caps = bool(average_caps)

    def _bind_mechanisms(self, ctx: Context) -> None:
        super()._bind_mechanisms(ctx)
        self._avg_on = False
        if self.caps and self.average_caps:
            self._init_average_caps(ctx)
        self._uncapped = all(c == math.inf for c in self._cap)


# -- registry ---------------------------------------------------------------------------------------
def _plan(scenario: Scenario, plan: Any, slis: Any, who: str, pricing: str = "bundled") -> FluidSolution:
    if isinstance(plan, dict):
        plan = plan.get(pricing)
    if plan is None:
        from fluidopt.fluid.lp import solve_fluid

        return solve_fluid(scenario, pricing, slis)
    if slis is not None:
        raise ScenarioError(f"{who}: give either slis or a solved plan (whose LP already holds its SLIs), not both")
    if not isinstance(plan, FluidSolution):
        raise ScenarioError(f"{who}: plan: expected a FluidSolution, got {type(plan).__name__}")
    if plan.pricing != pricing:
        raise ScenarioError(f"{who}: plan: expected a {pricing}-pricing LP solution, got pricing={plan.pricing!r}")
    return plan


@register("backpressure-gate-and-route", aliases=("bp-gate-and-route",), description=(
    "Gate-and-Route for finite fleets and bursty traffic: decode-buffer backpressure, caps on rationed "
    "classes, Erlang-A safety staffing, c-mu/theta decode buffer, overflow prefills, rolling LP re-solve"))
def make_backpressure_gate_and_route(
    scenario: Scenario, *, backpressure: bool = True, caps: bool = False, staffing: bool = False,
    decode_order: str = "value", overflow: bool = True, max_overflow: int | None = None, resolve: bool = True,
    elastic: bool = True, elastic_slots: bool = True, coupled: bool = True, mixed_gpus: int | None = None,
    plan: FluidSolution | None = None,
) -> BackpressureGateAndRoute:
    """Backpressure Gate-and-Route from the scenario's bundled LP (or the given ``plan``)."""
    sol = _plan(scenario, plan, None, "backpressure-gate-and-route")
    return BackpressureGateAndRoute(scenario, sol, backpressure=backpressure, caps=caps, staffing=staffing,
                                    decode_order=decode_order, overflow=overflow, max_overflow=max_overflow,
                                    resolve=resolve, elastic=elastic, elastic_slots=elastic_slots,
                                    coupled=coupled, mixed_gpus=mixed_gpus)


@register("backpressure-sli-gate-and-route", description=(
    "SLI-aware Gate-and-Route with time-averaged caps on rationed classes (Erlang-A staffing optional)"))
def make_backpressure_sli_gate_and_route(
    scenario: Scenario, *, slis: Sequence[Any] | None = None, caps: bool = True, staffing: bool = False,
    average_caps: bool = True, mixed_gpus: int | None = None, plan: FluidSolution | None = None,
) -> BackpressureSLIGateAndRoute:
    """SLI-aware variant from the scenario's LP with its SLIs (or the given ``plan``)."""
    sol = _plan(scenario, plan, slis, "backpressure-sli-gate-and-route")
    return BackpressureSLIGateAndRoute(scenario, sol, caps=caps, staffing=staffing, average_caps=average_caps,
                                       mixed_gpus=mixed_gpus)


@register("staffed-prioritize-and-route", description=(
    "Prioritize-and-Route (separate pricing) for finite fleets: Erlang-A safety staffing priced by the "
    "separate LP, overflow prefills, rolling LP re-solve"))
def make_staffed_prioritize_and_route(
    scenario: Scenario, *, staffing: bool = True, overflow: bool = True, max_overflow: int | None = None,
    resolve: bool = True, backpressure: bool = False, caps: bool = False, decode_order: str = "fcfs",
    mixed_gpus: int | None = None, plan: FluidSolution | None = None,
) -> StaffedPrioritizeAndRoute:
    """Staffed Prioritize-and-Route from the scenario's separate-pricing LP (or the given ``plan``)."""
    sol = _plan(scenario, plan, None, "staffed-prioritize-and-route", pricing="separate")
    return StaffedPrioritizeAndRoute(scenario, sol, staffing=staffing, overflow=overflow, max_overflow=max_overflow,
                                     resolve=resolve, backpressure=backpressure, caps=caps,
                                     decode_order=decode_order, mixed_gpus=mixed_gpus)
