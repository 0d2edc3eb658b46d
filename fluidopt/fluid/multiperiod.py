"""A time-varying fluid plan: the fleet size per time slot that minimises GPU-hours (docs/orchestration.md).

Time is cut into slots of ``slot`` seconds. In slot k the interactive classes arrive at ``d_k``
requests/s; serving them within their ITL SLO takes ``d_k / mu_int`` GPUs (each at the ITL-safe
batch limit, ``mu_int`` completions/s per GPU from the GPU law) divided by a target utilisation
``rho`` (headroom for bursts and the TTFT SLO). Batch backlogs (N requests available from time
``at``, due by ``deadline``) are served either on the base GPUs' leftover capacity (at the
interactive batch limit: ``mu_mix`` per GPU) or on batch instances at their larger batch limit
(``mu_bat`` per GPU). The LP (HiGHS through scipy) per slot k:

    min  sum_k slot * (b_k + m_k) / 3600                        GPU-hours
    s.t. b_k >= n_min,  b_k >= d_k / (rho mu_int)                 base GPUs (interactive + mixed)
         x_mix_jk <= ...: sum_j x_mix_jk <= slot mu_mix (b_k - d_k / (rho mu_int))
         sum_j x_bat_jk <= slot mu_bat m_k                         batch instances
         sum_k (x_mix_jk + x_bat_jk) = N_j                         backlog j done ...
         x_jk = 0 outside [at_j, deadline_j)                       ... after it arrives, by its deadline
         b_k + m_k <= n_max;  m_k <= m_now in slots before now + startup_delay
         all variables >= 0

Relaxations (so that its optimum bounds a controller's GPU-hours from below under the same GPU law):
GPUs are fractional, start instantly after the start-up window, and are perfectly packed. The
throughputs (by default) are the calibrated ones of :func:`role_rates`: each role's saturated
throughput under the simulator's iteration law (:mod:`fluidopt.fluid.saturation`, checked against
the simulator within 2%); ``calibrated=False`` gives the older fluid estimates of
:func:`batch_throughput`, which assume a resident context of prompt + output / 2 and overstate a
saturated GPU's rate by 5-30%. A tiny cost on late service picks,
among the equally cheap schedules, the one that serves batch work as early as possible.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fluidopt.core.errors import InfeasibleError, ScenarioError, SolverError, UsageError
from fluidopt.core.model import Scenario
from fluidopt.fluid.batch import batch_throughput, largest_batch, mean_context
from fluidopt.fluid.scipy_import import import_scipy

__all__ = ["BacklogJob", "FleetPlan", "MixPlan", "RoleRates", "TypeRates", "batch_throughput", "largest_batch",
           "mean_context", "plan_fleet", "plan_fleet_mix", "role_rates", "type_rates"]


@dataclass(frozen=True)
class BacklogJob:
    """``n`` batch requests of class ``cls`` available from ``at`` and due by ``deadline`` (seconds)."""

    cls: str
    n: float
    at: float
    deadline: float

    def __post_init__(self) -> None:
        if not (isinstance(self.n, (int, float)) and self.n >= 0):
            raise ScenarioError(f"BacklogJob({self.cls!r}).n: expected a number of requests >= 0, got {self.n!r}")
        if not (0 <= self.at < self.deadline):
            raise ScenarioError(f"BacklogJob({self.cls!r}): expected 0 <= at < deadline, got at={self.at!r}, "
                                f"deadline={self.deadline!r}")


@dataclass(frozen=True)
class FleetPlan:
    """The optimal fleet over time: per slot (starting at ``times``, ``slot`` seconds long) the base
    GPUs ``base`` (interactive and mixed), the batch instances ``batch``, the batch requests served
    on each (``served_mixed``, ``served_batch``); ``gpu_hours`` the optimum (a lower bound)."""

    slot: float
    times: np.ndarray
    base: np.ndarray
    batch: np.ndarray
    served_mixed: np.ndarray
    served_batch: np.ndarray
    interactive_demand: np.ndarray  # GPUs the interactive traffic needs per slot
    gpu_hours: float
    mu_int: float
    mu_mix: float
    mu_bat: float
    calibrated: bool = True  # the rates are the simulator's saturated throughputs (False: fluid estimates)

    @property
    def gpus(self) -> np.ndarray:
        return self.base + self.batch

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame({"t_start": self.times, "base_gpus": self.base, "batch_gpus": self.batch,
                             "gpus": self.gpus, "interactive_gpus": self.interactive_demand,
                             "served_mixed": self.served_mixed, "served_batch": self.served_batch})


@dataclass(frozen=True)
class RoleRates:
    """The planning rates of the instance roles (completions/s of one GPU) and their batch limits:
    ``mu_int`` an interactive instance serving the interactive classes at ``b_int`` decodes,
    ``mu_mix`` a mixed (base) instance given to batch work at ``b_int``, ``mu_bat`` a batch instance at
    ``b_bat``. ``calibrated``: from :func:`fluidopt.fluid.saturation.saturated_throughput` (the
    simulator's iteration law, exact resident context); else the fluid estimates of
    :func:`batch_throughput`."""

    b_int: int
    b_bat: int
    mu_int: float
    mu_mix: float
    mu_bat: float
    calibrated: bool


def role_rates(scenario: Scenario, interactive: Sequence[int], batch: Sequence[int], batch_itl: float | None = None,
               *, calibrated: bool = True) -> RoleRates:
    """The three roles' rates (:class:`RoleRates`) for the given interactive and batch class indices.
    Batch limits from :func:`largest_batch` (the ITL target of the interactive classes, on the larger
    of the two mean contexts, for interactive and mixed instances; ``batch_itl`` or the batch classes'
    ``itl_slo`` for batch instances). The interactive classes are weighted by rate, the batch classes
    equally (a backlog's class rates are placeholders)."""
    return _role_rates(scenario, tuple(interactive), tuple(batch), batch_itl, bool(calibrated))


@functools.lru_cache(maxsize=64)
def _role_rates(scenario: Scenario, interactive: tuple[int, ...], batch: tuple[int, ...], batch_itl: float | None,
                calibrated: bool) -> RoleRates:
    # (cached: a controller re-plans every tick)
    cl = scenario.classes
    gpu = scenario.gpu
    itls = [cl[i].itl_slo for i in interactive if cl[i].itl_slo is not None]
    itl_int = min(itls) if itls else None
    ctx_i = max((mean_context(cl[i]) for i in interactive), default=0.0)
    ctx_b = max((mean_context(cl[i]) for i in batch), default=0.0)
    b_int = largest_batch(gpu, itl_int, max(ctx_i, ctx_b))
    if batch_itl is None:
        bitl = [cl[i].itl_slo for i in batch if cl[i].itl_slo is not None]
        batch_itl = min(bitl) if bitl else None
    b_bat = largest_batch(gpu, batch_itl, ctx_b or ctx_i)
    lam = sum(cl[i].rate for i in interactive)
    if calibrated:
        from fluidopt.fluid.saturation import class_laws, saturated_throughput

        def mu(b, classes, weights):
            if not classes:
                return float(saturated_throughput(gpu, b, *(_unit_law(),) * 2).rate)
            laws = [class_laws(cl[i]) for i in classes]
            return float(saturated_throughput(gpu, b, [p for p, _ in laws], [d for _, d in laws], weights=weights).rate)

        wi = [cl[i].rate for i in interactive] if lam else None
        return RoleRates(b_int, b_bat, mu(b_int, list(interactive), wi), mu(b_int, list(batch), None),
                         mu(b_bat, list(batch), None), True)
    Pi = sum(cl[i].prompt * cl[i].rate for i in interactive) / lam if lam else 1.0
    Di = sum(cl[i].decode * cl[i].rate for i in interactive) / lam if lam else 1.0
    Pb = float(np.mean([cl[i].prompt for i in batch])) if batch else 1.0
    Db = float(np.mean([cl[i].decode for i in batch])) if batch else 1.0
    return RoleRates(b_int, b_bat, batch_throughput(gpu, b_int, Pi, Di), batch_throughput(gpu, b_int, Pb, Db),
                     batch_throughput(gpu, b_bat, Pb, Db), False)


def _unit_law():
    from fluidopt.fluid.saturation import length_law

    return length_law("fixed", 1.0)


def _rates(scenario: Scenario, interactive: Sequence[int], batch: Sequence[int], batch_itl: float | None,
           calibrated: bool = True):
    r = role_rates(scenario, interactive, batch, batch_itl, calibrated=calibrated)
    return r.mu_int, r.mu_mix, r.mu_bat


def _check_plan_inputs(who: str, scenario: Scenario, slot: float, utilisation: float, backlogs) -> None:
    if slot <= 0 or not math.isfinite(slot):
        raise ScenarioError(f"{who}: slot: expected seconds > 0, got {slot!r}")
    if not 0 < utilisation <= 1:
        raise ScenarioError(f"{who}: utilisation: expected a fraction in (0, 1], got {utilisation!r}")
    for j in backlogs:
        if j.cls not in scenario.class_names:
            raise ScenarioError(f"{who}: backlog class {j.cls!r} is not a class of the scenario")


def plan_fleet(
    scenario: Scenario,
    backlogs: Sequence[BacklogJob],
    *,
    start: float = 0.0,
    end: float | None = None,
    slot: float = 60.0,
    interactive_rate: float | Sequence[float] | Callable[[float], float] | None = None,
    utilisation: float = 0.8,
    min_gpus: float | Sequence[float] = 0.0,
    max_gpus: int | None = None,
    batch_now: float | None = None,
    startup_delay: float = 0.0,
    batch_itl: float | None = None,
    interactive: Sequence[int] | None = None,
    mu_mix: float | None = None,
    mu_bat: float | None = None,
    level: bool = False,
    calibrated: bool = True,
) -> FleetPlan:
    """Solve the multi-period fleet LP (module docstring) over ``[start, end)`` (default: to the last
    deadline) in slots of ``slot`` seconds. ``interactive_rate``: requests/s of the interactive
    classes, a constant, one value per slot or a function of the slot's start time (default: the
    scenario's interactive rates); ``utilisation``: rho; ``min_gpus``: the base fleet kept in every
    slot (one number, or one per slot); ``max_gpus``: the fleet's maximum (default ``scenario.gpus``); ``batch_now`` /
    ``startup_delay``: batch instances already up, the only ones usable before ``start +
    startup_delay``. Interactive classes default to those without a deadline. ``mu_mix`` / ``mu_bat``
    replace the GPU law's batch rates (requests/s per leftover base GPU / per batch instance), e.g.
    by measured ones when a controller re-plans. ``level``: a second stage that, among the schedules
    with the optimal GPU-hours, picks one with the smallest peak fleet (the optimum is degenerate in
    when batch work runs; the first stage alone may serve it in scattered bursts at the maximum).
    ``calibrated``: the GPU law's rates are the simulator's saturated throughputs
    (:func:`role_rates`, :mod:`fluidopt.fluid.saturation`); False: the fluid estimates of
    :func:`batch_throughput` (optimistic: a resident context of prompt + output / 2)."""

    _check_plan_inputs("plan_fleet", scenario, slot, utilisation, backlogs)
    cl = scenario.classes
    names = scenario.class_names
    if interactive is None:
        interactive = [i for i, c in enumerate(cl) if c.deadline is None and c.deadline_at is None]
    batch = sorted({names.index(j.cls) for j in backlogs}) or [i for i in range(len(cl)) if i not in interactive]
    mu_int, mu_mix0, mu_bat0 = _rates(scenario, interactive, batch, batch_itl, calibrated)
    mu_mix = mu_mix0 if mu_mix is None else float(mu_mix)
    mu_bat = mu_bat0 if mu_bat is None else float(mu_bat)
    if mu_mix < 0 or mu_bat <= 0:
        raise ScenarioError(f"plan_fleet: mu_mix, mu_bat: expected rates >= 0 and > 0, got {mu_mix!r}, {mu_bat!r}")
    if end is None:
        end = max([j.deadline for j in backlogs], default=start + slot)
    K = max(1, math.ceil((end - start) / slot - 1e-9))
    floor = np.broadcast_to(np.asarray(min_gpus, dtype=float), (K,)) if np.ndim(min_gpus) == 0 else \
        np.asarray(min_gpus, dtype=float)
    if floor.shape != (K,):
        raise UsageError(f"plan_fleet: min_gpus: expected one number or {K} (one per slot), got {len(floor)}")
    times = start + slot * np.arange(K)
    if interactive_rate is None:
        interactive_rate = sum(cl[i].rate for i in interactive)
    if callable(interactive_rate):
        lam = np.array([float(interactive_rate(t)) for t in times])
    else:
        lam = np.broadcast_to(np.asarray(interactive_rate, dtype=float), (K,)).copy()
    demand = lam / (utilisation * mu_int)
    nmax = scenario.gpus if max_gpus is None else max_gpus
    J = len(backlogs)
    # variables: b (K), m (K), x_mix (J*K), x_bat (J*K)
    nv = 2 * K + 2 * J * K
    ib = np.arange(K)
    im = K + np.arange(K)

    def ixm(j, k):
        return 2 * K + j * K + k

    def ixb(j, k):
        return 2 * K + J * K + j * K + k

    c = np.zeros(nv)
    c[ib] = slot / 3600.0
    c[im] = slot / 3600.0
    for j in range(J):
        for k in range(K):  # earliest service among the equally cheap schedules
            c[ixm(j, k)] = c[ixb(j, k)] = 1e-9 * (k + 1) / max(1.0, backlogs[j].n)
    # the constraint matrices are built sparse (COO triplets): a day in minute slots has thousands of
    # columns per row, and HiGHS takes the same compressed-column matrix either way
    ai: list[int] = []
    aj: list[int] = []
    av: list[float] = []
    bub: list[float] = []
    for k in range(K):
        r0 = 3 * k  # sum_j x_mix_jk <= slot mu_mix (b_k - demand_k)
        ai.append(r0)
        aj.append(ib[k])
        av.append(-slot * mu_mix)
        for j in range(J):
            ai.append(r0)
            aj.append(ixm(j, k))
            av.append(1.0)
        bub.append(-slot * mu_mix * demand[k])
        ai.append(r0 + 1)  # sum_j x_bat_jk <= slot mu_bat m_k
        aj.append(im[k])
        av.append(-slot * mu_bat)
        for j in range(J):
            ai.append(r0 + 1)
            aj.append(ixb(j, k))
            av.append(1.0)
        bub.append(0.0)
        ai += [r0 + 2, r0 + 2]  # b_k + m_k <= n_max
        aj += [ib[k], im[k]]
        av += [1.0, 1.0]
        bub.append(float(nmax))
    ei: list[int] = []
    ej: list[int] = []
    beq: list[float] = []
    bounds = [(0.0, None)] * nv
    for k in range(K):
        bounds[ib[k]] = (max(floor[k], demand[k]), None)
        if batch_now is not None and times[k] < start + startup_delay:
            bounds[im[k]] = (0.0, float(batch_now))
    for j, job in enumerate(backlogs):
        for k in range(K):
            t0, t1 = times[k], times[k] + slot
            if t0 + 1e-9 < job.at or t1 > job.deadline + 1e-9:
                bounds[ixm(j, k)] = bounds[ixb(j, k)] = (0.0, 0.0)
            ei += [j, j]
            ej += [ixm(j, k), ixb(j, k)]
        beq.append(float(job.n))
    res, A, Aeq = _solve_highs(
        "plan_fleet", c, (av, ai, aj), bub, (ei, ej), beq, nv, bounds,
        f"no fleet of at most {nmax} GPUs serves the interactive load and finishes the backlog "
        f"({', '.join(f'{j.n:g} {j.cls} by t={j.deadline:g}' for j in backlogs)}) in time")
    if level:
        res = _level(res, c, A, np.array(bub), Aeq, beq, bounds, ib, im, slot)
    x = res.x
    xm = np.array([sum(x[ixm(j, k)] for j in range(J)) for k in range(K)])
    xb = np.array([sum(x[ixb(j, k)] for j in range(J)) for k in range(K)])
    gh = float(slot * (x[ib].sum() + x[im].sum()) / 3600.0)
    return FleetPlan(slot=float(slot), times=times, base=x[ib].copy(), batch=x[im].copy(), served_mixed=xm,
                     served_batch=xb, interactive_demand=demand, gpu_hours=gh, mu_int=mu_int, mu_mix=mu_mix,
                     mu_bat=mu_bat, calibrated=bool(calibrated))


def _solve_highs(who: str, c, a_ub, bub, a_eq, beq, nv: int, bounds, infeasible: str):
    """HiGHS (scipy's linprog) on the plans' LP: ``a_ub`` the (values, rows, columns) of A_ub x <= bub,
    ``a_eq`` the (rows, columns) of the unit coefficients of A_eq x = beq (one row per backlog group).
    Returns (result, A_ub, A_eq); infeasible: InfeasibleError ``who: infeasible`` (the fleet cap and the
    deadlines conflict), any other failure: SolverError."""
    # without the scipy.stats, integrate and spatial that Pyomo's hook adds (fluidopt.fluid.scipy_import)
    linprog = import_scipy("scipy.optimize").linprog
    from scipy.sparse import coo_array

    av, ai, aj = a_ub
    ei, ej = a_eq
    A = coo_array((av, (ai, aj)), shape=(len(bub), nv)).tocsc()
    Aeq = coo_array((np.ones(len(ei)), (ei, ej)), shape=(len(beq), nv)).tocsc() if beq else None
    res = linprog(c, A_ub=A, b_ub=np.array(bub), A_eq=Aeq, b_eq=np.array(beq) if beq else None, bounds=bounds,
                  method="highs")
    if res.status == 2:
        raise InfeasibleError(f"{who}: {infeasible}", conflicting=("max_gpus", "deadline"))
    if res.status != 0:
        raise SolverError(f"{who}: HiGHS failed: {res.message}")
    return res, A, Aeq


def _level(res, c, A, bub, Aeq, beq, bounds, ib, im, slot):
    """Second stage of :func:`plan_fleet`: minimise the peak fleet P subject to the first stage's
    GPU-hours (to a relative 1e-9) and every first-stage constraint; the early-service costs stay as a
    tie-break."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_array, hstack, vstack

    nv = len(c)
    K = len(ib)
    gh = np.zeros(nv + 1)
    gh[ib] = gh[im] = slot / 3600.0
    opt = float(gh[:nv] @ res.x)
    rows = np.concatenate([np.repeat(np.arange(K), 2), np.arange(K)])
    cols = np.concatenate([np.column_stack([ib, im]).ravel(), np.full(K, nv)])
    vals = np.concatenate([np.ones(2 * K), -np.ones(K)])
    peak = coo_array((vals, (rows, cols)), shape=(K, nv + 1))
    A2 = vstack([hstack([A, coo_array((A.shape[0], 1))]), peak, coo_array(gh.reshape(1, -1))]).tocsc()
    b2 = np.concatenate([bub, np.zeros(K), [opt * (1 + 1e-9) + 1e-12]])
    c2 = np.append(c - gh[:nv], 1.0)  # the peak, plus the early-service tie-break of the first stage
    Aeq2 = hstack([Aeq, coo_array((Aeq.shape[0], 1))]).tocsc() if Aeq is not None else None
    r2 = linprog(c2, A_ub=A2, b_ub=b2, A_eq=Aeq2, b_eq=np.array(beq) if Aeq is not None else None,
                 bounds=list(bounds) + [(0.0, None)], method="highs")
    if r2.status != 0:  # pragma: no cover - the first stage's point is feasible here
        return res
    r2.x = r2.x[:nv]
    return r2


# --------------------------------------------------------------------------------------------
# Mixed instance types (issue 31, item 4)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TypeRates:
    """One instance type's planning rates (:class:`RoleRates` on its GPU profile) and price."""

    name: str
    price_per_hour: float
    startup_delay: float
    max: int | None
    rates: RoleRates


@dataclass(frozen=True)
class MixPlan:
    """The cheapest fleet over time with several instance types: per type (``types``, in order) and slot
    (``times``) the base instances ``base[t, k]`` of which ``interactive[t, k]`` serve the interactive
    classes, the batch instances ``batch[t, k]``, the batch requests they serve (``served_mixed``,
    ``served_batch``) and the interactive requests (``served_interactive``); ``cost`` the optimum (a lower
    bound on any controller's cost at utilisation 1), ``gpu_hours`` per type. ``by_type()`` tabulates
    GPU-hours, cost, cost per hour and per million tokens by type."""

    slot: float
    times: np.ndarray
    types: tuple[TypeRates, ...]
    base: np.ndarray
    interactive: np.ndarray
    batch: np.ndarray
    served_mixed: np.ndarray
    served_batch: np.ndarray
    served_interactive: np.ndarray
    cost: float
    tokens_interactive: float  # tokens (prompt + output) of one interactive request (rate-weighted mean)
    tokens_batch: np.ndarray  # tokens of one batch request, per backlog

    @property
    def gpu_hours(self) -> np.ndarray:
        return self.slot * (self.base + self.batch).sum(axis=1) / 3600.0

    def by_type(self) -> pd.DataFrame:
        """Per type: GPU-hours, cost, cost per hour of the plan (cost / its duration in hours), the
        interactive and batch requests served, the tokens (prompt + output) served and the cost per
        million tokens."""
        hours = self.slot * len(self.times) / 3600.0
        rows = []
        for t, ty in enumerate(self.types):
            gh = float(self.gpu_hours[t])
            cost = gh * ty.price_per_hour
            ni = float(self.served_interactive[t].sum())
            nb = float(self.served_mixed[t].sum() + self.served_batch[t].sum())
            tok = ni * self.tokens_interactive + float((self.served_mixed[t] + self.served_batch[t]).sum(axis=0)
                                                       @ self.tokens_batch) if self.tokens_batch.size else \
                ni * self.tokens_interactive
            rows.append({"type": ty.name, "price_per_hour": ty.price_per_hour, "gpu_hours": gh, "cost": cost,
                         "cost_per_hour": cost / hours, "interactive_served": ni, "batch_served": nb,
                         "tokens": tok, "cost_per_million_tokens": cost / tok * 1e6 if tok > 0 else math.nan,
                         "peak": float((self.base[t] + self.batch[t]).max())})
        return pd.DataFrame(rows).set_index("type")


def type_rates(scenario: Scenario, types=None, *, interactive: Sequence[int] | None = None,
               batch: Sequence[int] | None = None, batch_itl: float | None = None,
               calibrated: bool = True) -> tuple[TypeRates, ...]:
    """Each instance type's role rates (:func:`role_rates` with the type's GPU profile) and price.
    ``types``: :class:`fluidopt.core.model.InstanceType` items (default the scenario's ``fleet.types``)."""
    from dataclasses import replace

    if types is None:
        types = scenario.fleet.types if scenario.fleet is not None else ()
    if not types:
        raise ScenarioError("plan_fleet_mix: expected instance types (fleet.types in the scenario, or types=...), "
                            "got none")
    cl = scenario.classes
    if interactive is None:
        interactive = [i for i, c in enumerate(cl) if c.deadline is None and c.deadline_at is None]
    if batch is None:
        batch = [i for i in range(len(cl)) if i not in interactive]
    return tuple(TypeRates(t.name, float(t.price_per_hour), float(t.startup_delay), t.max,
                           role_rates(replace(scenario, gpu=t.gpu), interactive, batch, batch_itl,
                                      calibrated=calibrated)) for t in types)


def plan_fleet_mix(
    scenario: Scenario,
    backlogs: Sequence[BacklogJob],
    types=None,
    *,
    start: float = 0.0,
    end: float | None = None,
    slot: float = 60.0,
    interactive_rate: float | Sequence[float] | None = None,
    utilisation: float = 1.0,
    max_gpus: int | None = None,
    batch_itl: float | None = None,
    calibrated: bool = True,
) -> MixPlan:
    """The multi-period LP of :func:`plan_fleet` with several instance types: in slot k, type t keeps
    b_tk base instances, i_tk of them for the interactive classes (sum_t rho mu_int^t i_tk >= lambda_k)
    and the rest lending to batch work at mu_mix^t, and m_tk batch instances at mu_bat^t; at most
    ``max`` instances of a type and ``max_gpus`` (default ``scenario.gpus``) in all; minimise the cost
    sum_tk slot price_t (b_tk + m_tk) / 3600. The LP chooses the mix per slot; with one type it is
    :func:`plan_fleet` with ``min_gpus`` = 0 (the same optimum times the price). A type's rates are the
    calibrated ones of its GPU profile (:func:`type_rates`); start-up delays are free, as in
    :func:`plan_fleet` (a relaxation: the optimum bounds any controller's cost from below at
    utilisation 1)."""

    _check_plan_inputs("plan_fleet_mix", scenario, slot, utilisation, backlogs)
    cl = scenario.classes
    names = scenario.class_names
    inter = [i for i, c in enumerate(cl) if c.deadline is None and c.deadline_at is None]
    bat = sorted({names.index(j.cls) for j in backlogs}) or [i for i in range(len(cl)) if i not in inter]
    tr = type_rates(scenario, types, interactive=inter, batch=bat, batch_itl=batch_itl, calibrated=calibrated)
    T = len(tr)
    if end is None:
        end = max([j.deadline for j in backlogs], default=start + slot)
    K = max(1, math.ceil((end - start) / slot - 1e-9))
    times = start + slot * np.arange(K)
    if interactive_rate is None:
        interactive_rate = sum(cl[i].rate for i in inter)
    lam = np.broadcast_to(np.asarray(interactive_rate, dtype=float), (K,)).copy()
    nmax = scenario.gpus if max_gpus is None else max_gpus
    J = len(backlogs)
    # variables per (t, k): b, i, m; then x_mix (J, T, K), x_bat (J, T, K)
    TK = T * K

    def vb(t, k):
        return t * K + k

    def vi(t, k):
        return TK + t * K + k

    def vm(t, k):
        return 2 * TK + t * K + k

    def vxm(j, t, k):
        return 3 * TK + (j * T + t) * K + k

    def vxb(j, t, k):
        return 3 * TK + J * TK + (j * T + t) * K + k

    nv = 3 * TK + 2 * J * TK
    c = np.zeros(nv)
    for t, ty in enumerate(tr):
        for k in range(K):
            c[vb(t, k)] = c[vm(t, k)] = slot * ty.price_per_hour / 3600.0
            for j in range(J):
                c[vxm(j, t, k)] = c[vxb(j, t, k)] = 1e-9 * (k + 1) / max(1.0, backlogs[j].n)
    ai: list[int] = []
    aj: list[int] = []
    av: list[float] = []
    bub: list[float] = []

    def row(entries, rhs):
        r = len(bub)
        for col, val in entries:
            ai.append(r)
            aj.append(col)
            av.append(val)
        bub.append(rhs)

    for k in range(K):
        row([(vi(t, k), -utilisation * ty.rates.mu_int) for t, ty in enumerate(tr)], -lam[k])  # interactive load
        row([(vb(t, k), 1.0) for t in range(T)] + [(vm(t, k), 1.0) for t in range(T)], float(nmax))
        for t, ty in enumerate(tr):
            row([(vi(t, k), 1.0), (vb(t, k), -1.0)], 0.0)  # i <= b
            row([(vxm(j, t, k), 1.0) for j in range(J)] + [(vb(t, k), -slot * ty.rates.mu_mix),
                                                           (vi(t, k), slot * ty.rates.mu_mix)], 0.0)
            row([(vxb(j, t, k), 1.0) for j in range(J)] + [(vm(t, k), -slot * ty.rates.mu_bat)], 0.0)
            if ty.max is not None:
                row([(vb(t, k), 1.0), (vm(t, k), 1.0)], float(ty.max))
    bounds = [(0.0, None)] * nv
    ei: list[int] = []
    ej: list[int] = []
    beq: list[float] = []
    for j, job in enumerate(backlogs):
        for k in range(K):
            t0, t1 = times[k], times[k] + slot
            closed = t0 + 1e-9 < job.at or t1 > job.deadline + 1e-9
            for t in range(T):
                if closed:
                    bounds[vxm(j, t, k)] = bounds[vxb(j, t, k)] = (0.0, 0.0)
                ei += [j, j]
                ej += [vxm(j, t, k), vxb(j, t, k)]
        beq.append(float(job.n))
    res, _, _ = _solve_highs(
        "plan_fleet_mix", c, (av, ai, aj), bub, (ei, ej), beq, nv, bounds,
        f"no fleet of at most {nmax} instances of types {', '.join(t.name for t in tr)} serves the "
        f"interactive load and finishes the backlog in time")
    x = res.x
    shape = (T, K)
    base = x[:TK].reshape(shape)
    inte = x[TK:2 * TK].reshape(shape)
    m = x[2 * TK:3 * TK].reshape(shape)
    xm = x[3 * TK:3 * TK + J * TK].reshape((J, T, K)) if J else np.zeros((0, T, K))
    xb = x[3 * TK + J * TK:].reshape((J, T, K)) if J else np.zeros((0, T, K))
    cap = np.array([[utilisation * ty.rates.mu_int * inte[t, k] for k in range(K)] for t, ty in enumerate(tr)])
    share = np.divide(cap, cap.sum(axis=0), out=np.zeros_like(cap), where=cap.sum(axis=0) > 0)
    served_i = share * lam * slot
    li = sum(cl[i].rate for i in inter)
    tok_i = sum((cl[i].prompt + cl[i].decode) * cl[i].rate for i in inter) / li if li else 0.0
    tok_b = np.array([cl[names.index(j.cls)].prompt + cl[names.index(j.cls)].decode for j in backlogs])
    cost = float(slot * sum(tr[t].price_per_hour * (base[t].sum() + m[t].sum()) for t in range(T)) / 3600.0)
    return MixPlan(slot=float(slot), times=times, types=tr, base=base.copy(), interactive=inte.copy(), batch=m.copy(),
                   served_mixed=xm.transpose(1, 2, 0).copy(), served_batch=xb.transpose(1, 2, 0).copy(),
                   served_interactive=served_i, cost=cost, tokens_interactive=tok_i, tokens_batch=tok_b)
