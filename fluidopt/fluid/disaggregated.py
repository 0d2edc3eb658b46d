"""The fluid LP of the disaggregated steady state (issue 44, point 2; docs/lp.md, "Disaggregated layout").

A fleet holds ``N_p`` prefill instances of TP degree ``tp_p`` and ``N_d`` decode instances of TP degree
``tp_d``, each pool with its own :class:`~fluidopt.calibration.timemodels.IterationLaw`. Class ``i`` has
prompts of ``l_i`` tokens and outputs of ``o_i`` tokens (means); its first token comes from the prefill,
the other ``o_i - 1`` from decode steps, each holding a mean context ``ctx_i = l_i + o_i / 2`` tokens (the
closed form of :mod:`fluidopt.fluid.split_bound` uses the same fluid view).

Variables, all cluster totals per second (real, fluid): ``r_i`` requests/s served; ``P_i`` prefill
instances busy with class i and ``pi_i`` its prefill batches/s; per decode regime ``k`` of the decode law
(small / large batch) ``D_ik`` decode instances, ``sigma_ik`` decode steps/s and ``w_ik`` output tokens/s.
Mean batch sizes are ratios (``r_i / pi_i`` prompts, ``w_ik / sigma_ik`` requests), and every row below
is one of "busy time", "mean batch time" or "mean batch content" multiplied through by the batch rate,
which is what keeps it linear::

    prefill_time[i]    a_p pi_i + (b_p l_i + c_p l_i^2) r_i - P_i              <= 0
    ttft[i]            (a_p - TTFT_i) pi_i + (b_p l_i + c_p l_i^2) r_i          <= 0   (batch time <= TTFT_i)
    prefill_tokens[i]  l_i r_i - max_tokens pi_i                               <= 0
    decode_time[i,k]   a_k sigma_ik + (b_k ctx_i + c_k) w_ik - D_ik            <= 0
    tpot[i,k]          D_ik - TPOT_i sigma_ik                                  <= 0   (step time <= TPOT_i)
    kv[i,k]            ctx_i w_ik - kv_tokens sigma_ik                         <= 0   (mean KV held <= capacity)
    decode_batch[i,k]  w_ik - max_batch sigma_ik                               <= 0
    regime[i,k]        w_ik - thr sigma_ik <= 0 (small law) / thr sigma_ik - w_ik <= 0 (large law)
    decode_flow[i]     sum_k w_ik - (o_i - 1) r_i                              == 0
    prefill_pool       sum_i P_i - N_p                                         <= 0
    decode_pool        sum_ik D_ik - N_d                                       <= 0

Objectives: ``min_gpus`` minimises ``tp_p N_p + tp_d N_d`` with ``demand[i]: r_i == lambda_i``;
``max_revenue`` maximises ``sum_i w_i r_i`` (``w_i`` the scenario's bundled reward per request) with
``demand[i]: r_i <= lambda_i`` and either ``fleet: tp_p N_p + tp_d N_d <= G`` (the LP chooses the split)
or ``N_p``, ``N_d`` fixed. Duals are d objective / d rhs of each row as written (revenue per second, or
GPUs); ``gpu_shadow_price`` is ``dual(pool) / tp`` per pool: revenue per second of one more GPU in it.

Batches are single-class (a class's TTFT and TPOT bounds then hold for its own batches); with equal
bounds mixing classes would not help, since every row is linear and homogeneous in the batch rate.
Not modelled: queueing delay inside TTFT (the fluid steady state has none), the prompt's KV on the
prefill instance and the transfer link (neither limits a fluid throughput at NVLink speed; the
simulator checks both). Times in seconds, lengths and KV in tokens, rates in requests/s.

Solved with scipy's HiGHS interface (``linprog(method="highs")``): the LP has a dozen columns per class,
is built once per call and needs no warm re-solve, so Pyomo's model layer (:mod:`fluidopt.fluid.lp`)
would only add build time; scipy returns the row duals directly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fluidopt.calibration.timemodels import IterationLaw
from fluidopt.core.errors import InfeasibleError, ScenarioError, SolverError
from fluidopt.fluid.scipy_import import import_scipy

__all__ = ["OBJECTIVES", "colocated_capacity", "compare_layouts", "DisaggClass", "DisaggPools", "DisaggSolution", "classes_of", "pools_of_scenario",
           "solve_disaggregated"]

OBJECTIVES = ("min_gpus", "max_revenue")
# A prefill batch holds at least this many tokens unless a prompt is longer (OPT's context; split_bound's default)
DEFAULT_MAX_TOKENS = 2048


@dataclass(frozen=True)
class DisaggClass:
    """One class: ``rate`` requests/s (cluster), ``prompt`` and ``output`` tokens (means), ``reward`` per
    served request, and optional ``ttft`` / ``tpot`` bounds (s; None: none)."""

    name: str
    rate: float
    prompt: float
    output: float
    reward: float = 0.0
    ttft: float | None = None
    tpot: float | None = None

    def __post_init__(self) -> None:
        if not (self.rate >= 0 and math.isfinite(self.rate)):
            raise ScenarioError(f"class {self.name}: rate = {self.rate!r}: expected requests/s >= 0")
        if not (self.prompt >= 1 and self.output >= 1):
            raise ScenarioError(f"class {self.name}: expected prompt >= 1 and output >= 1 tokens, "
                                f"got {self.prompt!r} and {self.output!r}")
        for k in ("ttft", "tpot"):
            v = getattr(self, k)
            if v is not None and not v > 0:
                raise ScenarioError(f"class {self.name}: {k} = {v!r}: expected seconds > 0")


@dataclass(frozen=True)
class DisaggPools:
    """The two pools: laws, TP degrees (GPUs per instance), the decode instance's KV capacity
    (tokens; inf: unlimited), requests per decode step (``max_batch``) and prompt tokens per prefill
    batch (``max_tokens``)."""

    prefill: IterationLaw
    decode: IterationLaw
    prefill_tp: int = 1
    decode_tp: int = 1
    kv_tokens: float = math.inf
    max_batch: float = math.inf
    max_tokens: float = DEFAULT_MAX_TOKENS

    def __post_init__(self) -> None:
        for k in ("prefill_tp", "decode_tp"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ScenarioError(f"{k.replace('_', ' ')}: expected an integer >= 1, got {v!r}")
        for k in ("kv_tokens", "max_batch", "max_tokens"):
            if not getattr(self, k) > 0:
                raise ScenarioError(f"{k}: expected > 0, got {getattr(self, k)!r}")


@dataclass(frozen=True)
class DisaggSolution:
    """Optimum of the disaggregated LP. Per class (arrays indexed like ``class_names``): ``served``
    requests/s, ``prefill_instances``, ``decode_instances``, ``prefill_batch`` (mean prompts per batch),
    ``decode_batch`` (mean requests per step, instance-weighted) and ``step`` (mean decode step, s).
    ``prefill_instances_total`` / ``decode_instances_total``: N_p, N_d; ``gpus``: tp_p N_p + tp_d N_d;
    ``revenue``: per second; ``served_per_gpu``: served requests/s per GPU. ``duals``: d objective /
    d rhs per row; ``gpu_shadow_price`` (``max_revenue`` only): {"prefill", "decode"}: revenue per
    second per extra GPU in the pool."""

    status: str
    objective: str
    class_names: tuple[str, ...]
    served: np.ndarray
    prefill_instances: np.ndarray
    decode_instances: np.ndarray
    prefill_batch: np.ndarray
    decode_batch: np.ndarray
    step: np.ndarray
    prefill_instances_total: float
    decode_instances_total: float
    gpus: float
    revenue: float
    duals: Mapping[str, float] = field(default_factory=dict)
    gpu_shadow_price: Mapping[str, float] = field(default_factory=dict)

    @property
    def served_per_gpu(self) -> float:
        return float(self.served.sum() / self.gpus) if self.gpus > 0 else math.nan

    @property
    def revenue_per_gpu(self) -> float:
        return self.revenue / self.gpus if self.gpus > 0 else math.nan

    def to_dict(self) -> dict:
        per = {n: dict(served=float(self.served[i]), prefill_instances=float(self.prefill_instances[i]),
                       decode_instances=float(self.decode_instances[i]), prefill_batch=float(self.prefill_batch[i]),
                       decode_batch=float(self.decode_batch[i]), step_s=float(self.step[i]))
               for i, n in enumerate(self.class_names)}
        return dict(layout="disaggregated", status=self.status, objective=self.objective,
                    prefill_instances=self.prefill_instances_total, decode_instances=self.decode_instances_total,
                    gpus=self.gpus, revenue=self.revenue, revenue_per_gpu=self.revenue_per_gpu,
                    served_per_gpu=self.served_per_gpu, classes=per, duals=dict(self.duals),
                    gpu_shadow_price=dict(self.gpu_shadow_price))


def _regimes(law: IterationLaw) -> list[tuple[str, tuple[float, float, float], float, float]]:
    """(name, (a, b, c), lowest batch, highest batch) of each regime of the decode law."""
    d = law.decode
    if d.large is None or d.threshold == 0:
        return [("", d.small, 0.0, math.inf)]
    return [("small", d.small, 0.0, float(d.threshold)), ("large", d.large, float(d.threshold), math.inf)]


def solve_disaggregated(classes: Sequence[DisaggClass], pools: DisaggPools, objective: str = "min_gpus", *,
                        fleet_gpus: float | None = None, prefill_instances: float | None = None,
                        decode_instances: float | None = None) -> DisaggSolution:
    """Solve the LP of the module docstring. ``min_gpus``: serve every class in full with the fewest GPUs.
    ``max_revenue``: on ``fleet_gpus`` GPUs (split chosen by the LP), or on ``prefill_instances`` and
    ``decode_instances`` fixed. Raises :class:`InfeasibleError` naming the class when its bounds admit
    no batch."""
    # without the scipy.stats, integrate and spatial that Pyomo's hook adds (fluidopt.fluid.scipy_import)
    linprog = import_scipy("scipy.optimize").linprog

    if objective not in OBJECTIVES:
        raise ScenarioError(f"objective: expected one of {', '.join(OBJECTIVES)}, got {objective!r}")
    classes = tuple(classes)
    if not classes:
        raise ScenarioError("classes: expected at least one class")
    fixed = prefill_instances is not None or decode_instances is not None
    if objective == "max_revenue":
        if fixed and (prefill_instances is None or decode_instances is None):
            raise ScenarioError("max_revenue: give both prefill_instances and decode_instances, or fleet_gpus")
        if fixed and not (prefill_instances >= 0 and decode_instances >= 0):  # type: ignore[operator]
            raise ScenarioError("max_revenue: instance counts must be >= 0")
        if not fixed and not (fleet_gpus is not None and fleet_gpus > 0):
            raise ScenarioError(f"max_revenue: fleet_gpus = {fleet_gpus!r}: expected GPUs > 0")
    regimes = _regimes(pools.decode)
    pf = pools.prefill.prefill
    cols: dict[str, int] = {}

    def col(name: str) -> int:
        cols[name] = len(cols)
        return cols[name]

    for c in classes:
        for v in ("r", "P", "pi"):
            col(f"{v}[{c.name}]")
        for k, *_ in regimes:
            for v in ("D", "sigma", "w"):
                col(f"{v}[{c.name}{',' + k if k else ''}]")
    NP, ND = col("N_p"), col("N_d")
    n = len(cols)
    ub_rows: list[tuple[str, dict[int, float], float]] = []
    eq_rows: list[tuple[str, dict[int, float], float]] = []
    for c in classes:
        r, P, pi = cols[f"r[{c.name}]"], cols[f"P[{c.name}]"], cols[f"pi[{c.name}]"]
        per = pf.b * c.prompt + pf.c * c.prompt ** 2
        if c.ttft is not None and pf.a + per > c.ttft:
            raise InfeasibleError(f"class {c.name}: a prefill batch of one {c.prompt:g}-token prompt takes "
                                  f"{pf.a + per:.4g} s, over its TTFT bound {c.ttft:g} s")
        ub_rows.append((f"prefill_time[{c.name}]", {pi: pf.a, r: per, P: -1.0}, 0.0))
        if c.ttft is not None:
            ub_rows.append((f"ttft[{c.name}]", {pi: pf.a - c.ttft, r: per}, 0.0))
        ub_rows.append((f"prefill_tokens[{c.name}]", {r: c.prompt, pi: -max(pools.max_tokens, c.prompt)}, 0.0))
        ctx = c.prompt + c.output / 2
        flow = {r: -(c.output - 1.0)}
        for k, (a, b, cc), lo, hi in regimes:
            tag = f"{c.name}{',' + k if k else ''}"
            D, sg, w = cols[f"D[{tag}]"], cols[f"sigma[{tag}]"], cols[f"w[{tag}]"]
            flow[w] = 1.0
            ub_rows.append((f"decode_time[{tag}]", {sg: a, w: b * ctx + cc, D: -1.0}, 0.0))
            if c.tpot is not None:
                ub_rows.append((f"tpot[{tag}]", {D: 1.0, sg: -c.tpot}, 0.0))
            if math.isfinite(pools.kv_tokens):
                ub_rows.append((f"kv[{tag}]", {w: ctx, sg: -pools.kv_tokens}, 0.0))
            if math.isfinite(pools.max_batch):
                ub_rows.append((f"decode_batch[{tag}]", {w: 1.0, sg: -pools.max_batch}, 0.0))
            if math.isfinite(hi):
                ub_rows.append((f"regime[{tag}]", {w: 1.0, sg: -hi}, 0.0))
            if lo > 0:
                ub_rows.append((f"regime[{tag}]", {sg: lo, w: -1.0}, 0.0))
        eq_rows.append((f"decode_flow[{c.name}]", flow, 0.0))
        if objective == "min_gpus":
            eq_rows.append((f"demand[{c.name}]", {r: 1.0}, c.rate))
        else:
            ub_rows.append((f"demand[{c.name}]", {r: 1.0}, c.rate))
    ub_rows.append(("prefill_pool", {**{cols[f"P[{c.name}]"]: 1.0 for c in classes}, NP: -1.0}, 0.0))
    ub_rows.append(("decode_pool", {**{j: 1.0 for name, j in cols.items() if name.startswith("D[")}, ND: -1.0}, 0.0))
    bounds = [(0.0, None)] * n
    cost = np.zeros(n)
    if objective == "min_gpus":
        cost[NP], cost[ND] = pools.prefill_tp, pools.decode_tp
    else:
        for c in classes:
            cost[cols[f"r[{c.name}]"]] = -c.reward
        if fixed:
            bounds[NP] = (float(prefill_instances), float(prefill_instances))  # type: ignore[arg-type]
            bounds[ND] = (float(decode_instances), float(decode_instances))  # type: ignore[arg-type]
        else:
            ub_rows.append(("fleet", {NP: float(pools.prefill_tp), ND: float(pools.decode_tp)}, float(fleet_gpus)))

    def matrix(rows):
        # sparse: a dozen nonzeros per row, and thousands of rows when every request length is a class
        from scipy.sparse import coo_matrix

        ij = [(k, j, v) for k, (_, coef, _) in enumerate(rows) for j, v in coef.items()]
        r, c, v = (np.array(t) for t in zip(*ij)) if ij else (np.zeros(0, int), np.zeros(0, int), np.zeros(0))
        return coo_matrix((v, (r, c)), shape=(len(rows), n)).tocsr(), np.array([rhs for *_, rhs in rows])

    A_ub, b_ub = matrix(ub_rows)
    A_eq, b_eq = matrix(eq_rows)
    res = linprog(cost, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=bounds, method="highs")
    if res.status == 2:
        raise InfeasibleError("the disaggregated fluid LP is infeasible: no decode batch meets a class's TPOT bound "
                              "with the decode law, the KV capacity and the batch limit")
    if res.status != 0:
        raise SolverError(f"the disaggregated fluid LP: HiGHS stopped with {res.message}")
    x = res.x
    # linprog minimises; d objective / d rhs of the objective as stated (revenue maximised) flips the sign
    sign = 1.0 if objective == "min_gpus" else -1.0
    duals = {name: sign * float(d) for (name, *_), d in zip(ub_rows, res.ineqlin.marginals)}
    duals.update({name: sign * float(d) for (name, *_), d in zip(eq_rows, res.eqlin.marginals)})

    def v(name: str) -> float:
        return float(x[cols[name]])

    m = len(classes)
    served, Pn, Dn, pb, db, st = (np.zeros(m) for _ in range(6))
    for i, c in enumerate(classes):
        served[i], Pn[i] = v(f"r[{c.name}]"), v(f"P[{c.name}]")
        pi = v(f"pi[{c.name}]")
        pb[i] = served[i] / pi if pi > 0 else math.nan
        D = sg = w = 0.0
        for k, *_ in regimes:
            tag = f"{c.name}{',' + k if k else ''}"
            D, sg, w = D + v(f"D[{tag}]"), sg + v(f"sigma[{tag}]"), w + v(f"w[{tag}]")
        Dn[i] = D
        db[i] = w / sg if sg > 0 else math.nan
        st[i] = D / sg if sg > 0 else math.nan
    Np, Nd = v("N_p"), v("N_d")
    gpus = pools.prefill_tp * Np + pools.decode_tp * Nd
    revenue = float(sum(c.reward * served[i] for i, c in enumerate(classes)))
    # d revenue / d(rhs of "sum D - N_d <= 0") is the value of one more instance in the pool: a larger rhs
    # lets the pool hold one more busy instance than N_d. Minimising GPUs it would only read -1 (a GPU
    # saved is a GPU saved), so it is reported for revenue only.
    shadow = ({"prefill": duals["prefill_pool"] / pools.prefill_tp, "decode": duals["decode_pool"] / pools.decode_tp}
              if objective == "max_revenue" else {})
    return DisaggSolution("optimal", objective, tuple(c.name for c in classes), served, Pn, Dn, pb, db, st,
                          Np, Nd, gpus, revenue, duals, shadow)


def classes_of(scenario, *, ttft: float | None = None, tpot: float | None = None) -> tuple[DisaggClass, ...]:
    """The scenario's classes: cluster rates, mean lengths, bundled reward ``c_p P_i + c_d D_i`` and the
    class's ``ttft_slo`` / ``itl_slo`` (``ttft`` / ``tpot`` given here override them for every class)."""
    cp, cd = scenario.class_prices()
    return tuple(DisaggClass(c.name, c.rate, c.prompt, c.decode, float(cp[i] * c.prompt + cd[i] * c.decode),
                             c.ttft_slo if ttft is None else ttft, c.itl_slo if tpot is None else tpot)
                 for i, c in enumerate(scenario.classes))


def pools_of_scenario(scenario, *, max_tokens: float = DEFAULT_MAX_TOKENS) -> DisaggPools:
    """Both pools from the scenario's own GPU (TP 1 only): prefill ``alpha + beta * tokens`` per batch,
    decode ``tau_solo + kv_time_per_token * context`` per step, ``batch`` requests per step and the
    GPU's ``kv_capacity``."""
    g = scenario.gpu
    law = IterationLaw.from_gpu_profile(g)
    if g.kv_time_per_token:
        from fluidopt.calibration.timemodels import DecodeLaw

        law = IterationLaw(law.prefill, DecodeLaw((g.tau_solo, g.kv_time_per_token, 0.0)), name=law.name)
    return DisaggPools(law, law, 1, 1, kv_tokens=math.inf if g.kv_capacity is None else float(g.kv_capacity),
                       max_batch=float(g.batch), max_tokens=max_tokens)


def colocated_capacity(scenario, slis: Sequence = (), *, rtol: float = 1e-7) -> float:
    """The largest load per GPU (requests/s, the scenario's class mix) that the colocated fluid LP serves
    in full, by bisection on a scale of every class's rate (one :class:`~fluidopt.fluid.lp.FluidModel`,
    re-solved); 0 when the SLIs admit no load. The disaggregated layout's counterpart is load / fewest
    GPUs, since its rows are homogeneous in the load."""
    from dataclasses import replace

    from fluidopt.fluid.lp import build_fluid_model

    base = replace(scenario, workflow=None)
    lam = sum(c.rate for c in base.classes) / base.gpus
    if lam <= 0:
        return math.nan

    def scaled(f: float):
        return replace(base, classes=tuple(replace(c, rate=c.rate * f) for c in base.classes))

    fm = build_fluid_model(scaled(1.0), "bundled", slis)

    def serves_all(f: float) -> bool:
        fm.update(scaled(f))
        try:
            sol = fm.solve()
        except InfeasibleError:
            return False
        return float(np.sum(sol.throughput)) >= (1 - 1e-7) * lam * f

    lo, hi = 0.0, 1.0
    while serves_all(hi):
        lo, hi = hi, hi * 2
        if hi > 1e9:
            return math.inf
    while hi - lo > rtol * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if serves_all(mid) else (lo, mid)
    return lo * lam


def compare_layouts(scenario, pools: DisaggPools, *, ttft: float | None = None, tpot: float | None = None,
                    slis: Sequence = (), split: tuple[float, float] | None = None) -> dict:
    """The disaggregated LP beside the colocated one (:func:`fluidopt.fluid.lp.solve_fluid`, bundled
    pricing) on the same scenario. ``goodput_per_gpu`` of each layout: the largest load per GPU (requests/s,
    the scenario's class mix) it serves in full within the bounds, DistServe's per-GPU goodput in the fluid
    limit; ``winner`` is the layout with more ("neither" when no load meets the bounds), ``goodput_gain`` disaggregated over colocated, minus one.
    Also both layouts' revenue on the scenario's ``gpus`` GPUs at its load (the disaggregated split chosen
    by the LP) with the GPU shadow prices, and the disaggregated layout's fewest GPUs for the load. A
    ``tpot`` bound also goes to the colocated LP as its ``tpot`` SLI (mean time per output token);
    ``ttft`` has no colocated row. ``split``: (prefill, decode) instances; the revenue LP on that split is
    added as ``disaggregated_fixed_split``, whose shadow prices then differ by pool."""
    from fluidopt.fluid.lp import scenario_slis, solve_fluid
    from fluidopt.fluid.sli import parse_sli

    cls = classes_of(scenario, ttft=ttft, tpot=tpot)
    colo_slis = (*scenario_slis(scenario), *slis)
    if tpot is not None and not any(s.kind == "tpot" for s in colo_slis):
        colo_slis = (*colo_slis, parse_sli(f"tpot={tpot!r}"))
    try:
        colo = solve_fluid(scenario, "bundled", colo_slis)
        colo_d = dict(status=colo.status, revenue_per_gpu=colo.revenue_per_gpu,
                      served_per_gpu=float(np.sum(colo.throughput)), gpu_shadow_price=colo.gpu_shadow_price)
        colo_cap = colocated_capacity(scenario, colo_slis)
    except InfeasibleError as e:  # a bound the colocated layout cannot meet at any load: the other may
        colo_d = dict(status="infeasible", message=str(e), revenue_per_gpu=0.0, served_per_gpu=0.0,
                      gpu_shadow_price=math.nan)
        colo_cap = 0.0
    rev = solve_disaggregated(cls, pools, "max_revenue", fleet_gpus=scenario.gpus)
    load = sum(c.rate for c in cls)
    try:
        least_sol = solve_disaggregated(cls, pools, "min_gpus")
        least = least_sol.to_dict()
        dis_cap = load / least_sol.gpus if least_sol.gpus > 0 else math.inf
    except InfeasibleError as e:
        least, dis_cap = {"status": "infeasible", "message": str(e)}, 0.0
    gain = dis_cap / colo_cap - 1.0 if colo_cap > 0 else (math.inf if dis_cap > 0 else math.nan)
    winner = "neither" if math.isnan(gain) else ("disaggregated" if gain > 0 else "colocated")
    fixed = {}
    if split is not None:
        fixed = {"disaggregated_fixed_split": solve_disaggregated(
            cls, pools, "max_revenue", prefill_instances=split[0], decode_instances=split[1]).to_dict()}
    return dict(
        **fixed,
        scenario=scenario.name, gpus=scenario.gpus, prefill_tp=pools.prefill_tp, decode_tp=pools.decode_tp,
        colocated=dict(colo_d, goodput_per_gpu=colo_cap),
        disaggregated=dict(rev.to_dict(), goodput_per_gpu=dis_cap),
        disaggregated_min_gpus=least, winner=winner, goodput_gain=gain,
        revenue_gain=rev.revenue_per_gpu / colo_d["revenue_per_gpu"] - 1.0 if colo_d["revenue_per_gpu"] > 0 else math.nan,
    )
