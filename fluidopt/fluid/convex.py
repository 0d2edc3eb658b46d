"""An independent cvxpy formulation of the fluid LPs, and a proportional-fairness variant.

:func:`solve_fluid_cvxpy` writes the LP of docs/lp.md again, from the equations, in vector form:
fairness as ``max(x) - min(x) <= eta``, penalties as ``weight * pos(excess)`` instead of slack
variables, and solves it with an interior-point conic solver (Clarabel, tight tolerances) by default.
The tests use it as a differential check of the Pyomo/HiGHS model (:mod:`fluidopt.fluid.lp`). To keep the
check independent it also derives its own coefficients (:func:`_coefficients`) from the GPU profile's and
the classes' raw fields, not through :meth:`fluidopt.core.model.Scenario.rates`.

:func:`solve_proportional_fair` maximises sum_i w_i log(throughput_i) over the same feasible set; the
logarithm makes it a conic (exponential-cone) program that an LP solver cannot do.

cvxpy is imported inside the functions so that ``import fluidopt`` stays fast.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from fluidopt.core.errors import InfeasibleError, ScenarioError, SolverError
from fluidopt.core.model import Scenario
from fluidopt.fluid.lp import check_pricing
from fluidopt.fluid.sli import (
    SLI,
    TPOT,
    DecodeFairness,
    MaxPrefillWait,
    MinServedFraction,
    PrefillFairness,
    validate_slis,
)
from fluidopt.fluid.solution import FluidSolution

__all__ = ["CLARABEL_TIGHT", "solve_fluid_cvxpy", "solve_proportional_fair"]

# Clarabel's defaults stop at 1e-8 relative gap; the differential test asks for 1e-6 agreement of the
# objective on badly scaled instances, so ask for more.
CLARABEL_TIGHT = {"tol_gap_abs": 1e-11, "tol_gap_rel": 1e-11, "tol_feas": 1e-11, "tol_ktratio": 1e-9,
                  "max_iter": 500}


class _Coefficients(NamedTuple):
    """Per-class numbers of the LP, per GPU (numpy arrays indexed by class)."""

    lam: np.ndarray  # arrivals per GPU per second
    theta: np.ndarray  # abandonment rate while waiting, 1/s
    mu_p: np.ndarray  # prefill completions per second of one prefill slot
    mu_m: np.ndarray  # decode completions per second of one decode slot on a mixed GPU
    mu_s: np.ndarray  # ... on a solo GPU
    prefill_reward: np.ndarray  # c_p P per prefilled request
    decode_reward: np.ndarray  # c_d D per decoded request
    tau_mix: float  # seconds per mixed iteration
    gamma: float  # tokens per second of a solo decode stream

    @property
    def w(self) -> np.ndarray:
        """Bundled reward per completed request: c_p P + c_d D."""
        return self.prefill_reward + self.decode_reward


def _coefficients(scenario: Scenario) -> _Coefficients:
    """The LP's coefficients from the model's equations (docs/model.md), written out here once more.

    A mixed iteration takes tau_mix = alpha + beta C and advances a prefill by C tokens and every decode
    by one token; a solo iteration takes tau_solo = 1 / gamma. So a prefill slot completes
    C / (P tau_mix) prompts per second, a decode slot 1 / (D tau_mix) requests on a mixed GPU and
    gamma / D on a solo one. Cluster arrival rates are divided by the number of GPUs; a class's own
    token prices override the scenario's.
    """
    g = scenario.gpu
    tau_mix = float(g.alpha) + float(g.beta) * int(g.chunk)
    gamma = 1.0 / float(g.tau_solo)
    cls = scenario.classes
    P = np.array([float(c.prompt) for c in cls])
    D = np.array([float(c.decode) for c in cls])
    cp = np.array([float(scenario.prefill_price if c.prefill_price is None else c.prefill_price) for c in cls])
    cd = np.array([float(scenario.decode_price if c.decode_price is None else c.decode_price) for c in cls])
    return _Coefficients(
        lam=np.array([float(c.rate) for c in cls]) / int(scenario.gpus),
        theta=np.array([float(c.patience) for c in cls]),
        mu_p=int(g.chunk) / (np.array([1.0 - float(c.hit_ratio) for c in cls]) * P * tau_mix),
        mu_m=1.0 / (D * tau_mix),
        mu_s=gamma / D,
        prefill_reward=cp * P,
        decode_reward=cd * D,
        tau_mix=tau_mix,
        gamma=gamma,
    )


def _formulate(scenario: Scenario, pricing: str, slis: Sequence[SLI], lam: Any = None) -> dict[str, Any]:
    """The fluid LP's rows in cvxpy. ``lam``: arrivals per GPU per second as a cvxpy expression (the
    pricing program of :mod:`fluidopt.pricing.optimize` makes them variables); None: the scenario's rates."""
    import cvxpy as cp

    if not isinstance(scenario, Scenario):
        raise ScenarioError(f"scenario: expected a fluidopt Scenario, got {type(scenario).__name__}")
    check_pricing(pricing)
    slis = validate_slis(slis, scenario.class_names)
    r = _coefficients(scenario)
    g = scenario.gpu
    B, tau, gamma = int(g.batch), r.tau_mix, r.gamma
    n = scenario.n_classes
    x, ym, ys, qp, qd = (cp.Variable(n, nonneg=True, name=nm) for nm in ("x", "y_mixed", "y_solo", "q_prefill", "q_decode"))
    X = cp.sum(x)
    served_decodes = cp.multiply(r.mu_m, ym) + cp.multiply(r.mu_s, ys)  # completions per GPU per second
    rows: dict[str, Any] = {
        "prefill_capacity": X <= 1,
        "mixed_decode_capacity": cp.sum(ym) - (B - 1) * X <= 0,
        "solo_decode_capacity": cp.sum(ys) + B * X <= B,
        "prefill_balance": cp.multiply(r.mu_p, x) + cp.multiply(r.theta, qp) == (r.lam if lam is None else lam),
        "decode_balance": cp.multiply(r.mu_p, x) - cp.multiply(r.theta, qd) - served_decodes == 0,
    }
    extra = []
    patient = np.flatnonzero(r.theta == 0)
    if patient.size:  # no abandonment: the fluid queues are pinned to 0 (as in the Pyomo model)
        extra += [qp[patient] == 0, qd[patient] == 0]
    if slis:
        extra.append(qd == 0)
    if pricing == "bundled":
        revenue = r.w @ served_decodes
    else:
        revenue = (r.prefill_reward * r.mu_p) @ x + r.decode_reward @ served_decodes
    penalty = 0
    excess: dict[str, Any] = {}
    names = list(scenario.class_names)
    for s in slis:
        if isinstance(s, PrefillFairness):
            e = cp.max(x) - cp.min(x) - s.eta
        elif isinstance(s, DecodeFairness):
            e = cp.max(ys) - cp.min(ys) - s.eta
        elif isinstance(s, TPOT):
            # (TPOT - eta) * (slots) / B with slots = (B-1) X + B (1-X), linear in X.
            num = tau * (B - 1) * X + (B / gamma) * (1 - X)
            slots = (B - 1) * X + B * (1 - X)
            e = (num - s.max_seconds * slots) / B
        elif isinstance(s, MinServedFraction):
            k = names.index(s.cls)
            if lam is None or lam[k].is_constant():
                lk = r.lam[k] if lam is None else float(lam[k].value)
                e = s.fraction - r.mu_p[k] * x[k] / lk
            else:  # variable arrivals: the row multiplied through by them (same sign; a penalty then weighs rates)
                e = s.fraction * lam[k] - r.mu_p[k] * x[k]
        elif isinstance(s, MaxPrefillWait):
            k = names.index(s.cls)
            if lam is None or lam[k].is_constant():
                e = qp[k] / (r.lam[k] if lam is None else float(lam[k].value)) - s.seconds
            else:
                e = qp[k] - s.seconds * lam[k]
        else:  # pragma: no cover - validate_slis rejects anything else
            raise ScenarioError(f"unknown SLI {s!r}")
        excess[s.key] = e
        if s.penalty is None:
            rows[s.key] = e <= 0
        else:
            penalty = penalty + s.penalty * cp.pos(e)
    return {"cp": cp, "r": r, "g": g, "slis": slis, "vars": (x, ym, ys, qp, qd), "rows": rows, "extra": extra,
            "revenue": revenue, "penalty": penalty, "excess": excess, "served": served_decodes}


def _solve(f: dict[str, Any], objective, solver: str, solver_options: dict[str, Any] | None, what: str) -> float:
    cp = f["cp"]
    prob = cp.Problem(cp.Maximize(objective), list(f["rows"].values()) + f["extra"])
    opts = dict(CLARABEL_TIGHT) if solver.upper() == "CLARABEL" else {}
    opts.update(solver_options or {})
    t0 = time.perf_counter()
    try:
        prob.solve(solver=solver, **opts)
    except cp.error.SolverError as e:
        raise SolverError(f"{what}: cvxpy solver {solver} failed: {e}") from None
    seconds = time.perf_counter() - t0
    if prob.status in (cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE):
        raise InfeasibleError(f"{what}: cvxpy/{solver} reports the problem infeasible", conflicting=())
    if prob.status != cp.OPTIMAL:
        raise SolverError(f"{what}: cvxpy/{solver} ended with status {prob.status!r}")
    return seconds


def _to_solution(f: dict[str, Any], scenario: Scenario, pricing: str, seconds: float, solver: str,
                 utility: float | None = None) -> FluidSolution:
    x, ym, ys, qp, qd = (np.maximum(np.asarray(v.value, dtype=float), 0.0) for v in f["vars"])
    duals: dict[str, float] = {}
    names = scenario.class_names
    for key, con in f["rows"].items():
        d = con.dual_value
        if d is None:
            continue
        d = np.atleast_1d(np.asarray(d, dtype=float))
        if key in ("prefill_balance", "decode_balance"):
            for i, name in enumerate(names):
                duals[f"{key}[{name}]"] = float(d[i])
        else:
            duals[key] = float(d[0])
    for s in f["slis"]:
        if isinstance(s, MinServedFraction) and s.key in duals:
            # written here as (fraction - served) <= 0, in the Pyomo model as served >= fraction:
            # report d objective / d fraction like the Pyomo model does.
            duals[s.key] = -duals[s.key]
    viol = {s.key: max(0.0, float(f["excess"][s.key].value)) for s in f["slis"] if s.penalty is not None}
    penalty = float(sum(s.penalty * viol[s.key] for s in f["slis"] if s.penalty is not None))
    revenue = float(f["revenue"].value)
    return FluidSolution.from_primal(
        scenario, pricing=pricing, x=x, y_mixed=ym, y_solo=ys, q_prefill=qp, q_decode=qd,
        revenue_per_gpu=revenue,
        penalty_per_gpu=penalty if utility is None else 0.0,
        objective_per_gpu=revenue - penalty if utility is None else revenue,
        duals=duals, slis=f["slis"], violations=viol, solve_seconds=seconds,
        solver=f"cvxpy-{solver.lower()}", utility=utility,
    )


def solve_fluid_cvxpy(scenario: Scenario, pricing: str = "bundled", slis: Sequence[SLI] = (), *,
                      solver: str = "CLARABEL", solver_options: dict[str, Any] | None = None) -> FluidSolution:
    """Solve the fluid LP with cvxpy (an independent formulation; same answer as :func:`solve_fluid`).

    Duals are reported for the capacity and balance rows and for hard SLIs, with the same convention
    as the Pyomo model (d objective / d rhs). The primal point is an interior-point solution: where
    the optimum is not unique it need not be a vertex (and q_decode need not be 0).
    """
    f = _formulate(scenario, pricing, slis)
    seconds = _solve(f, f["revenue"] - f["penalty"], solver, solver_options, f"fluid LP of {scenario.name!r}")
    return _to_solution(f, scenario, pricing, seconds, solver)


def solve_proportional_fair(scenario: Scenario, weights: Sequence[float] | None = None, slis: Sequence[SLI] = (), *,
                            pricing: str = "bundled", solver: str = "CLARABEL",
                            solver_options: dict[str, Any] | None = None) -> FluidSolution:
    """Proportionally fair operating point: maximise sum_i w_i log(throughput_i) on the fluid LP's set.

    ``throughput_i`` = mu_m,i y_mixed,i + mu_s,i y_solo,i (completions per GPU per second);
    ``weights`` default to 1 for every class. Soft SLIs subtract ``penalty * violation`` from the
    utility. The returned solution's ``utility`` is the optimal utility; ``objective_per_gpu`` and
    ``revenue_per_gpu`` are the revenue this point earns under ``pricing``.
    """
    f = _formulate(scenario, pricing, slis)
    cp = f["cp"]
    n = scenario.n_classes
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=float)
    if w.shape != (n,) or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ScenarioError(f"weights: expected {n} finite numbers >= 0 (one per class), got {weights!r}")
    utility = w @ cp.log(f["served"]) - f["penalty"]
    seconds = _solve(f, utility, solver, solver_options, f"proportional-fair program of {scenario.name!r}")
    return _to_solution(f, scenario, pricing, seconds, solver, utility=float(utility.value))
