"""Optimal prices under the fleet's capacity: the fluid pricing program (docs/planning.md, section 4).

With demand that responds to price (:mod:`fluidopt.core.demand`), :func:`optimize_prices` finds the prices
that maximise revenue per second when the served rates must fit the fluid capacity of the fleet: the
fluid LP's own prefill/decode capacity rows and SLIs (:func:`fluidopt.fluid.convex._formulate`, the
rows of docs/lp.md in cvxpy, with the arrival rates as variables).

``tiers='per-class'`` (a price per request for each class) is a convex program in the rates
Lambda_i (Gallego & van Ryzin 1994): the price is the inverse demand P_i(Lambda_i), so revenue
sum_i P_i(Lambda_i) Lambda_i is concave for linear demand (Lambda (a - Lambda) / b), constant
elasticity > 1 (c Lambda^(1 - 1/e)) and the multinomial logit in the market shares
((M/b) [u.s + sum entr(s_i) + log s_0 + entr(s_0)]). Serving less than the demand at a price is never
better than raising the price until demand equals what is served, so the program serves every induced
request (no fluid queue, no abandonment for the priced classes), and bundled and separate pricing earn
the same there. Constant elasticity <= 1 (revenue rises with the price without bound), a logit market
without the outside option (every price up by the same amount leaves the shares unchanged) and constant
elasticity > 1 without a capacity limit (revenue grows as the price falls to 0) have no finite optimum:
reported as ``status='unbounded'``, not as a number. Classes without a demand model keep their price and
rate; the program may serve part of them (their revenue is linear in what is served).

``tiers='tokens'`` (one c_p and one c_d for every class, P_i = c_p prompt_i + c_d decode_i) is not
jointly concave: the rates are a two-parameter family, and at a token price the fleet may ration.
It is solved as the fluid LP at the induced rates over a grid of (c_p, c_d), then polished from the
best grid point with Nelder-Mead: ``status='local'``.

:func:`optimize_fleet` adds the fleet size: profit = revenue - GPUs x price per GPU-hour / 3600. The
optimal revenue is concave in the fleet size (the perspective of a concave function), so the
integer optimum is found by a scan and a ternary search.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from fluidopt.core.demand import demand_rates, has_demand, markets, price_per_request
from fluidopt.core.errors import ScenarioError, SolverError, UsageError
from fluidopt.core.model import Scenario
from fluidopt.fluid.scipy_import import import_scipy
from fluidopt.fluid.sli import SLI
from fluidopt.pricing.demand_fit import FIT_COLUMNS, demand_toml, fit_demand, read_observations  # noqa: F401, E402  (re-exported)

__all__ = ["PriceResult", "FleetResult", "optimize_prices", "optimize_fleet", "priced_scenario", "demand_grid",
           "reference_prices", "evaluate_prices", "simulate_prices", "fit_demand", "read_observations",
           "price_response", "price_response_figure", "fleet_figure", "sli_pareto", "sli_pareto_figure"]

TIERS = ("per-class", "tokens")
_RATE_FLOOR = 1e-9  # requests/s: a class priced out of its market keeps this much (the LP needs a rate > 0)


def reference_prices(scenario: Scenario) -> np.ndarray:
    """Price per request of each class at the scenario's own token prices (today's prices)."""
    return price_per_request(scenario.classes, scenario.prefill_price, scenario.decode_price)


def priced_scenario(scenario: Scenario, prices: Sequence[float]) -> Scenario:
    """``scenario`` at per-class prices per request: each class's token prices scaled to ``prices`` (a free
    class gets it all on its output tokens) and its rate = its demand at that price (floored at 1e-9/s)."""
    p = np.asarray(prices, dtype=float)
    ref = reference_prices(scenario)
    cps, cds = scenario.class_prices()
    rates = demand_rates(scenario.classes, p)
    classes = []
    for i, c in enumerate(scenario.classes):
        if ref[i] > 0:
            f = p[i] / ref[i]
            cp_i, cd_i = float(cps[i] * f), float(cds[i] * f)
        else:
            cp_i, cd_i = 0.0, float(p[i] / c.decode)
        classes.append(replace(c, prefill_price=cp_i, decode_price=cd_i, rate=float(max(rates[i], _RATE_FLOOR))))
    return replace(scenario, classes=tuple(classes))


def _token_scenario(scenario: Scenario, cp: float, cd: float) -> Scenario:
    """``scenario`` at token prices (c_p, c_d) with every rate at its demand there."""
    s = scenario.with_prices(cp, cd)
    rates = demand_rates(s.classes, reference_prices(s))
    return replace(s, classes=tuple(replace(c, rate=float(max(r, _RATE_FLOOR))) for c, r in zip(s.classes, rates)))


def _pin_fixed(scenario: Scenario) -> Scenario:
    """Classes without a demand model at today's token prices, whatever the scenario's c_p, c_d become (the
    program keeps their prices; a grid that moved them would earn without bound on their fixed rates)."""
    cps, cds = scenario.class_prices()
    return replace(scenario, classes=tuple(
        c if c.demand is not None else replace(c, prefill_price=float(cps[i]), decode_price=float(cds[i]))
        for i, c in enumerate(scenario.classes)))


def evaluate_prices(scenario: Scenario, prices: Sequence[float], *, pricing: str = "bundled",
                    slis: Sequence[SLI] | None = None) -> dict:
    """The fluid LP at per-class prices with the rates they induce: revenue per s (cluster) and per class."""
    from fluidopt.fluid.lp import solve_fluid

    s = priced_scenario(scenario, prices)
    sol = solve_fluid(s, pricing=pricing, slis=slis)
    lam = np.array([c.rate for c in s.classes])
    served = lam * np.asarray(sol.served_fraction, dtype=float)
    return {"revenue_per_s": float(sol.revenue_per_gpu) * s.gpus, "rate": lam, "served": served,
            "status": sol.status}


def demand_grid(scenario: Scenario, prefill_prices: Sequence[float], decode_prices: Sequence[float], *,
                pricing: str = "bundled", slis: Sequence[SLI] | None = None) -> pd.DataFrame:
    """The fluid LP over a grid of token prices with the rates the demand models induce at each point.

    One row per (c_p, c_d): revenue per s (cluster) and per GPU, each class's rate and served fraction.
    One Pyomo model is built and updated in place per point.
    """
    from fluidopt.fluid.lp import FluidModel, scenario_slis

    slis = scenario_slis(scenario) if slis is None else tuple(slis)
    t0 = time.perf_counter()
    fm = FluidModel(_token_scenario(scenario, float(prefill_prices[0]), float(decode_prices[0])), pricing, slis)
    fm.watch_structure = False
    names = scenario.class_names
    rows = []
    for cp in prefill_prices:
        for cd in decode_prices:
            s = _token_scenario(scenario, float(cp), float(cd))
            fm.update(s)
            sol = fm.solve(raise_infeasible=False)
            lam = np.array([c.rate for c in s.classes])
            rows.append({"pricing": pricing, "prefill_price": float(cp), "decode_price": float(cd),
                         "status": sol.status, "revenue_per_gpu": sol.revenue_per_gpu,
                         "objective_per_gpu": sol.objective_per_gpu, "revenue_per_s": sol.revenue_per_gpu * s.gpus,
                         **{f"served[{c}]": v for c, v in zip(names, sol.served_fraction)},
                         **{f"rate[{c}]": v for c, v in zip(names, lam)}})
    out = pd.DataFrame(rows)
    out.attrs.update(seconds=time.perf_counter() - t0, points=len(out))
    return out


@dataclass(frozen=True)
class PriceResult:
    """Optimal prices (scipy.optimize style: check ``success`` / ``status``; ``message`` says why).

    Per class (arrays in class order): ``price`` per request, ``rate`` it induces and ``served`` (requests/s,
    whole cluster), ``revenue`` per s, ``shadow_price``: the capacity's cost per request of the class (for a
    priced class its marginal revenue at the optimum, what one more request/s of capacity for it would
    earn; 0 where capacity does not bind; for a class without a demand model its revenue per request less
    what one more arrival adds). Cluster:
    ``revenue_per_s``, ``gpu_shadow_price`` (revenue per s one more GPU earns, prices re-optimised).
    ``prefill_price``/``decode_price``: the token prices (tiers='tokens'). ``today`` and ``grid_best``:
    the comparisons (dicts with ``revenue_per_s`` and the prices), ``concave``: whether the program solved
    is a concave maximisation (a global optimum).
    """

    status: str
    message: str
    tiers: str
    pricing: str
    gpus: int
    class_names: tuple[str, ...]
    price: np.ndarray
    rate: np.ndarray
    served: np.ndarray
    revenue: np.ndarray
    shadow_price: np.ndarray
    revenue_per_s: float
    gpu_shadow_price: float
    concave: bool
    prefill_price: float | None = None
    decode_price: float | None = None
    today: dict = field(default_factory=dict)
    grid_best: dict = field(default_factory=dict)
    solve_seconds: float = 0.0
    capacity: bool = True

    @property
    def success(self) -> bool:
        return self.status in ("optimal", "local")

    @property
    def revenue_per_gpu(self) -> float:
        return self.revenue_per_s / self.gpus

    def to_frame(self) -> pd.DataFrame:
        """One row per class: price, rate, served, revenue per s, shadow price, and today's price and rate."""
        d = pd.DataFrame({"class": list(self.class_names), "price": self.price, "rate": self.rate,
                          "served": self.served, "revenue_per_s": self.revenue, "shadow_price": self.shadow_price})
        if self.today:
            d["today_price"] = self.today["price"]
            d["today_rate"] = self.today["rate"]
        return d

    def to_dict(self) -> dict:
        def f(v):
            if isinstance(v, np.ndarray):
                return [None if not np.isfinite(x) else float(x) for x in v]
            if isinstance(v, float) and not math.isfinite(v):
                return None
            if isinstance(v, dict):
                return {k: f(x) for k, x in v.items()}
            return v

        return {k: f(getattr(self, k)) for k in ("status", "message", "tiers", "pricing", "gpus", "concave",
                                                 "revenue_per_s", "gpu_shadow_price", "prefill_price",
                                                 "decode_price", "solve_seconds", "today", "grid_best")} | {
            "classes": json_records(self.to_frame())}

    def scenario(self, scenario: Scenario) -> Scenario:
        """``scenario`` at the optimal prices with the induced rates (to simulate or solve)."""
        return priced_scenario(replace(scenario, gpus=self.gpus), self.price)


def json_records(df: pd.DataFrame) -> list[dict]:
    import json

    return json.loads(df.to_json(orient="records"))


def _nan_result(status: str, message: str, scenario: Scenario, tiers: str, pricing: str, capacity: bool,
                t0: float) -> PriceResult:
    k = scenario.n_classes
    nan = np.full(k, np.nan)
    return PriceResult(status=status, message=message, tiers=tiers, pricing=pricing, gpus=scenario.gpus,
                       class_names=scenario.class_names, price=nan, rate=nan, served=nan, revenue=nan,
                       shadow_price=nan, revenue_per_s=math.nan if status != "unbounded" else math.inf,
                       gpu_shadow_price=math.nan, concave=status != "local", solve_seconds=time.perf_counter() - t0,
                       capacity=capacity)


def _unbounded_reason(scenario: Scenario, capacity: bool) -> str | None:
    for c in scenario.classes:
        d = c.demand
        if d is None:
            continue
        if d.model == "constant-elasticity" and d.elasticity <= 1:
            return (f"revenue unbounded: class {c.name!r} has constant elasticity {d.elasticity:g} <= 1, so price x rate "
                    f"does not fall as the price rises (price -> infinity); no finite optimal price")
        if d.model == "constant-elasticity" and not capacity:
            return (f"revenue unbounded: class {c.name!r} has constant elasticity {d.elasticity:g} > 1 and no capacity "
                    f"limit, so revenue grows without bound as its price falls to 0 (rate -> infinity)")
    for name, idx in markets(scenario.classes).items():
        if not scenario.classes[idx[0]].demand.outside_option:
            return (f"revenue unbounded: logit market {name!r} has no outside option, so raising every price in it by "
                    f"the same amount leaves the shares and the rates unchanged")
    return None


def _per_class_program(scenario: Scenario, pricing: str, slis: Sequence[SLI], capacity: bool,
                       solver: str) -> tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Solve the concave program; returns (status, rate, served, revenue per class, fixed-class duals)."""
    import cvxpy as cp

    from fluidopt.fluid.convex import CLARABEL_TIGHT, _formulate

    n = float(scenario.gpus)
    cls = scenario.classes
    I = len(cls)
    dem = [i for i, c in enumerate(cls) if c.demand is not None]
    L = cp.Variable(len(dem), nonneg=True, name="rate") if dem else None
    pos = {i: j for j, i in enumerate(dem)}
    ref = reference_prices(scenario)
    rev_terms = []
    cons = []
    for i in dem:
        d = cls[i].demand
        Li = L[pos[i]]
        if d.model == "linear":
            rev_terms.append((d.max_rate * Li - cp.square(Li)) / d.slope)
            cons.append(Li <= d.max_rate)
        elif d.model == "constant-elasticity":
            c0 = d.price_ref * d.rate_ref ** (1.0 / d.elasticity)
            rev_terms.append(c0 * cp.power(Li, 1.0 - 1.0 / d.elasticity))
    for idx in markets(cls).values():
        d0 = cls[idx[0]].demand
        M, b = d0.market_size, d0.price_sensitivity
        s = cp.hstack([L[pos[i]] for i in idx]) / M
        s0 = 1 - cp.sum(s)
        u = np.array([cls[i].demand.utility for i in idx])
        rev_terms.append((M / b) * (u @ s + cp.sum(cp.entr(s)) + cp.log(s0) + cp.entr(s0)))
    fixed = [i for i in range(I) if cls[i].demand is None]
    fixed_rev: dict = {}  # cluster revenue per s of each class without a demand model (linear in what is served)
    duals = np.full(I, np.nan)
    if capacity:
        lam = cp.hstack([L[pos[i]] / n if i in pos else cp.Constant(cls[i].rate / n) for i in range(I)])
        f = _formulate(scenario, pricing, slis, lam=lam)
        x, ym, ys, qp, qd = f["vars"]
        r = f["r"]
        if dem:
            cons += [qp[dem] == 0, qd[dem] == 0]
        for i in fixed:
            if pricing == "bundled":
                fixed_rev[i] = n * r.w[i] * f["served"][i]
            else:
                fixed_rev[i] = n * (r.prefill_reward[i] * r.mu_p[i] * x[i] + r.decode_reward[i] * f["served"][i])
            rev_terms.append(fixed_rev[i])
        cons += list(f["rows"].values()) + f["extra"]
    else:
        for i in fixed:
            fixed_rev[i] = cp.Constant(ref[i] * cls[i].rate)
            rev_terms.append(fixed_rev[i])
    # soft SLIs (a penalty weight) subtract their penalty per GPU per s, as in the fluid LP's objective
    obj = cp.Maximize(cp.sum(cp.hstack(rev_terms)) / n - (f["penalty"] if capacity else 0))
    prob = cp.Problem(obj, cons)
    import warnings

    opts = dict(CLARABEL_TIGHT) if solver.upper() == "CLARABEL" else {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "may be inaccurate": asked again below
            prob.solve(solver=solver, **opts)
        if prob.status == cp.OPTIMAL_INACCURATE and opts:
            # the tight tolerances can stall on exponential cones (logit); the solver's defaults (1e-8) then finish
            prob.solve(solver=solver)
    except cp.error.SolverError as e:
        raise SolverError(f"pricing program of {scenario.name!r}: cvxpy solver {solver} failed: {e}") from None
    if prob.status in (cp.UNBOUNDED, cp.UNBOUNDED_INACCURATE):
        return "unbounded", *(np.full(I, np.nan),) * 4
    if prob.status in (cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE):
        return "infeasible", *(np.full(I, np.nan),) * 4
    if prob.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        raise SolverError(f"pricing program of {scenario.name!r}: cvxpy/{solver} ended with status {prob.status!r}")
    rate = np.array([float(L.value[pos[i]]) if i in pos else cls[i].rate for i in range(I)])
    rate = np.maximum(rate, 0.0)
    served = rate.copy()
    revenue = np.full(I, np.nan)
    for i in fixed:
        revenue[i] = float(fixed_rev[i].value)
    if capacity:
        sv = np.asarray(f["served"].value, dtype=float) * n
        d = f["rows"]["prefill_balance"].dual_value
        for i in fixed:
            served[i] = max(0.0, float(sv[i]))
            # d revenue / d Lambda_i: what one more arrival of the class earns, capacity cost deducted
            duals[i] = float(np.atleast_1d(d)[i]) if d is not None else np.nan
    else:
        duals[fixed] = ref[fixed]
    return "optimal", rate, served, revenue, duals


def _inverse_prices(scenario: Scenario, rate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Prices that induce ``rate`` (inverse demand) and each class's marginal revenue d(P Lambda)/d Lambda there."""
    cls = scenario.classes
    ref = reference_prices(scenario)
    price = ref.copy()
    mr = np.full(len(cls), np.nan)
    for i, c in enumerate(cls):
        d = c.demand
        if d is None:
            continue
        if d.model == "linear":
            price[i] = (d.max_rate - rate[i]) / d.slope
            mr[i] = (d.max_rate - 2 * rate[i]) / d.slope
        elif d.model == "constant-elasticity":
            price[i] = d.price_ref * (max(rate[i], 1e-300) / d.rate_ref) ** (-1.0 / d.elasticity)
            mr[i] = (1 - 1 / d.elasticity) * price[i]
    for idx in markets(cls).values():
        d0 = cls[idx[0]].demand
        s = rate[idx] / d0.market_size
        s0 = 1 - s.sum()
        u = np.array([cls[i].demand.utility for i in idx])
        price[idx] = (u - np.log(np.maximum(s, 1e-300) / s0)) / d0.price_sensitivity
        mr[idx] = price[idx] - 1.0 / (d0.price_sensitivity * s0)
    return price, mr


NO_DEMAND_WHY = ("without one every rate is fixed whatever the price, revenue is linear in price and the best price is "
                 "the top of any range")
"""Why no price is optimal without a demand model (the app and ``fluidopt price`` say it in these words)."""


def optimize_prices(scenario: Scenario, *, tiers: str = "per-class", pricing: str = "bundled",
                    slis: Sequence[SLI] | None = None, gpus: int | None = None, capacity: bool = True,
                    grid: tuple[Sequence[float], Sequence[float]] | None = None, compare: bool = True,
                    solver: str = "CLARABEL") -> PriceResult:
    """Revenue-maximising prices within the fleet's fluid capacity (module docstring for the program).

    ``gpus``: fleet size (default the scenario's; demand does not scale with it). ``capacity=False``:
    no fleet limit (every induced request served). ``grid``: (c_p values, c_d values) for the grid
    comparison and the token-tier search (default 0..0.5 in 21 steps each). ``compare``: also evaluate
    today's prices and the best grid point (the fluid LP at the induced rates).
    """
    from fluidopt.fluid.lp import check_pricing, scenario_slis

    t0 = time.perf_counter()
    if tiers not in TIERS:
        raise UsageError(f"--tiers: expected one of {', '.join(TIERS)}, got {tiers!r}")
    check_pricing(pricing)
    if not has_demand(scenario.classes):
        raise ScenarioError(
            f"scenario {scenario.name!r}: no class has a demand model ([classes.demand]); {NO_DEMAND_WHY}")
    if gpus is not None:
        if isinstance(gpus, bool) or not isinstance(gpus, (int, np.integer)) or gpus < 1:
            raise UsageError(f"--gpus: expected an integer >= 1, got {gpus!r}")
        scenario = replace(scenario, gpus=int(gpus))
    slis = scenario_slis(scenario) if slis is None else tuple(slis)
    cps, cds = (np.linspace(0.0, 0.5, 21), np.linspace(0.0, 0.5, 21)) if grid is None else \
        (np.asarray(grid[0], float), np.asarray(grid[1], float))
    reason = _unbounded_reason(scenario, capacity)
    if reason is not None:
        return _nan_result("unbounded", reason, scenario, tiers, pricing, capacity, t0)
    today_p = reference_prices(scenario)
    cmp: dict = {}
    g = None
    if compare or tiers == "tokens":
        today = evaluate_prices(scenario, today_p, pricing=pricing, slis=slis)
        cmp["today"] = {"revenue_per_s": today["revenue_per_s"], "price": today_p, "rate": today["rate"],
                        "served": today["served"], "prefill_price": scenario.prefill_price,
                        "decode_price": scenario.decode_price}
        g = demand_grid(_pin_fixed(scenario), cps, cds, pricing=pricing, slis=slis)
        best = g.loc[g["revenue_per_s"].idxmax()]
        cmp["grid_best"] = {"revenue_per_s": float(best["revenue_per_s"]), "prefill_price": float(best["prefill_price"]),
                            "decode_price": float(best["decode_price"]), "points": len(g),
                            "interior": bool(cps.min() < best["prefill_price"] < cps.max()
                                             and cds.min() < best["decode_price"] < cds.max())}
    if tiers == "tokens":
        return _token_program(_pin_fixed(scenario), pricing, slis, g, cmp, t0)
    status, rate, served, fixed_revenue, duals = _per_class_program(scenario, pricing, slis, capacity, solver)
    if status != "optimal":
        msg = ("revenue unbounded: the solver found no finite optimum" if status == "unbounded" else
               "infeasible: no rates meet the fleet's capacity and SLIs (a class without a demand model may need "
               "more than the fleet)")
        return _nan_result(status, msg, scenario, tiers, pricing, capacity, t0)
    price, mr = _inverse_prices(scenario, rate)
    fixed = np.isnan(mr)
    revenue = np.where(fixed, fixed_revenue, price * served)
    # capacity cost per request: a priced class's marginal revenue (KKT); for a class without a demand model,
    # what it earns per request less what one more arrival adds (its balance row's dual)
    with np.errstate(invalid="ignore", divide="ignore"):
        cost_fixed = np.where(served > 0, (revenue - duals * rate) / served, price)
    shadow = np.where(fixed, cost_fixed, mr)
    n = scenario.gpus
    # d revenue / d n = sum_i (capacity cost_i x served_i) / n: the capacity rows are homogeneous in n
    gpu_shadow = float(np.sum(shadow * served) / n) if capacity else 0.0
    binding = capacity and np.any(np.abs(shadow) > 1e-5 * np.maximum(price, 1.0))  # the solver's precision
    msg = ("the fleet's capacity binds (each class's marginal revenue = its capacity shadow price > 0)" if binding else
           "capacity is slack (each price where its marginal revenue is 0)")
    return PriceResult(status="optimal", message=msg, tiers=tiers, pricing=pricing, gpus=n,
                       class_names=scenario.class_names, price=price, rate=rate, served=served, revenue=revenue,
                       shadow_price=shadow, revenue_per_s=float(revenue.sum()), gpu_shadow_price=gpu_shadow,
                       concave=True, today=cmp.get("today", {}), grid_best=cmp.get("grid_best", {}),
                       solve_seconds=time.perf_counter() - t0, capacity=capacity)


def _token_program(scenario: Scenario, pricing: str, slis: Sequence[SLI], g: pd.DataFrame, cmp: dict,
                   t0: float) -> PriceResult:
    """Token tiers: the grid's best point polished by Nelder-Mead on the LP value (not jointly concave)."""
    # without the scipy.stats, integrate and spatial that Pyomo's hook adds (fluidopt.fluid.scipy_import)
    minimize = import_scipy("scipy.optimize").minimize

    from fluidopt.fluid.lp import FluidModel

    best = g.loc[g["revenue_per_s"].idxmax()]
    x0 = np.array([best["prefill_price"], best["decode_price"]], dtype=float)
    fm = FluidModel(_token_scenario(scenario, *x0), pricing, slis)
    fm.watch_structure = False

    def value(c):
        c = np.maximum(np.asarray(c, float), 0.0)
        s = _token_scenario(scenario, float(c[0]), float(c[1]))
        fm.update(s)
        sol = fm.solve(raise_infeasible=False)
        return sol, s

    def neg(c):
        sol, s = value(c)
        v = sol.revenue_per_gpu * s.gpus
        return -v if math.isfinite(v) else 1e30

    step = np.array([max(np.ptp(g["prefill_price"]), 1e-3), max(np.ptp(g["decode_price"]), 1e-3)]) / 20
    res = minimize(neg, x0, method="Nelder-Mead",
                   options={"xatol": 1e-7, "fatol": 1e-9, "initial_simplex": [x0, x0 + [step[0], 0], x0 + [0, step[1]]],
                            "maxiter": 400})
    c = np.maximum(res.x, 0.0) if -res.fun >= best["revenue_per_s"] else x0
    sol, s = value(c)
    lam = np.array([cl.rate for cl in s.classes])
    served = lam * np.asarray(sol.served_fraction, float)
    price = reference_prices(s)
    shadow = np.full(scenario.n_classes, np.nan)  # the concave per-class program prices capacity; here none
    return PriceResult(status="local", message="a local optimum: token tiers are not jointly concave (grid search, then "
                       "Nelder-Mead on the fluid LP's value at the induced rates)", tiers="tokens", pricing=pricing,
                       gpus=scenario.gpus, class_names=scenario.class_names, price=price, rate=lam, served=served,
                       revenue=price * served if pricing == "bundled" else price * served,
                       shadow_price=shadow, revenue_per_s=float(sol.revenue_per_gpu * s.gpus),
                       gpu_shadow_price=math.nan, concave=False, prefill_price=float(c[0]),
                       decode_price=float(c[1]), today=cmp.get("today", {}), grid_best=cmp.get("grid_best", {}),
                       solve_seconds=time.perf_counter() - t0)


@dataclass(frozen=True)
class FleetResult:
    """Profit-maximising fleet size and prices: ``best`` (a :class:`PriceResult` at ``gpus``), ``profit_per_s``,
    ``gpu_price_per_hour``, and ``curve``: one row per fleet size (revenue, cost, profit per s; prices)."""

    gpus: int
    profit_per_s: float
    gpu_price_per_hour: float
    best: PriceResult
    curve: pd.DataFrame

    def to_frame(self) -> pd.DataFrame:
        return self.curve


def optimize_fleet(scenario: Scenario, *, gpu_price_per_hour: float | None = None, sizes: Sequence[int] | None = None,
                   tiers: str = "per-class", pricing: str = "bundled", slis: Sequence[SLI] | None = None) -> FleetResult:
    """Prices and fleet size that maximise profit per s = revenue - gpus x price per GPU-hour / 3600.

    ``gpu_price_per_hour``: default the scenario GPU's ``price_per_hour``. ``sizes``: fleet sizes of the
    curve (default 12 sizes from 5% to 200% of the scenario's). The integer optimum comes from a ternary
    search around the curve's best (the optimal revenue is concave in the fleet size).
    """
    price = scenario.gpu.price_per_hour if gpu_price_per_hour is None else gpu_price_per_hour
    if price is None:
        raise ScenarioError(f"scenario {scenario.name!r}: --fleet needs a price per GPU-hour: price_per_hour in [gpu] "
                            f"or --gpu-price")
    if isinstance(price, bool) or not isinstance(price, (int, float)) or not math.isfinite(price) or price <= 0:
        raise UsageError(f"--gpu-price: expected a price per GPU-hour > 0, got {price!r}")
    if sizes is None:
        sizes = sorted({max(1, int(round(scenario.gpus * f))) for f in np.linspace(0.05, 2.0, 12)})
    sizes = sorted({int(s) for s in sizes})
    if not sizes or sizes[0] < 1:
        raise UsageError(f"--sizes: expected fleet sizes >= 1, got {sizes!r}")
    cache: dict[int, PriceResult] = {}

    def solve(n: int) -> PriceResult:
        if n not in cache:
            cache[n] = optimize_prices(scenario, tiers=tiers, pricing=pricing, slis=slis, gpus=n, compare=False)
        return cache[n]

    def profit(n: int) -> float:
        r = solve(n)
        return r.revenue_per_s - n * price / 3600.0 if r.success else -math.inf

    vals = [profit(n) for n in sizes]
    k = int(np.argmax(vals))
    lo, hi = sizes[max(k - 1, 0)], sizes[min(k + 1, len(sizes) - 1)]
    if k == len(sizes) - 1:
        hi = sizes[-1] * 2
    while hi - lo > 2:
        m1, m2 = lo + (hi - lo) // 3, hi - (hi - lo) // 3
        if profit(m1) < profit(m2):
            lo = m1
        else:
            hi = m2
    best_n = max(range(lo, hi + 1), key=profit)
    rows = []
    for n in sorted(cache):
        r = cache[n]
        rows.append({"gpus": n, "revenue_per_s": r.revenue_per_s, "cost_per_s": n * price / 3600.0,
                     "profit_per_s": r.revenue_per_s - n * price / 3600.0, "gpu_shadow_price": r.gpu_shadow_price,
                     **{f"price[{c}]": v for c, v in zip(r.class_names, r.price)},
                     **{f"rate[{c}]": v for c, v in zip(r.class_names, r.rate)}})
    return FleetResult(gpus=best_n, profit_per_s=profit(best_n), gpu_price_per_hour=float(price), best=solve(best_n),
                       curve=pd.DataFrame(rows))


def simulate_prices(scenario: Scenario, result: PriceResult, *,
                    policies: Sequence[str] = ("gate-and-route", "backpressure-gate-and-route"),
                    seeds: Sequence[int] = (0,), horizon: float = 600.0, warmup: float = 150.0,
                    service: str = "markov", executor=None, out=None, progress: bool | None = None) -> pd.DataFrame:
    """Simulate ``policies`` at the optimal prices (the scenario at ``result``'s prices and induced rates,
    through :func:`fluidopt.harness.compare`, so on any executor): simulated revenue per GPU per second
    against the program's value. One row per policy."""
    from fluidopt.harness.comparison import compare

    if not result.success:
        raise UsageError(f"simulate: the pricing result has status {result.status!r}; nothing to simulate")
    sc = replace(result.scenario(scenario), name=f"{scenario.name}@optimal-prices")
    c = compare([sc], list(policies), seeds=list(seeds), horizon=horizon, warmup=warmup, service=service,
                pricing=result.pricing, executor=executor, out=out, progress=progress)
    s = c.summary()
    program = result.revenue_per_s / result.gpus
    lp = float(c.bounds[f"lp_{result.pricing}"].iloc[0])
    rows = []
    for _, r in s.iterrows():
        rows.append({"policy": r["policy"], "gpus": result.gpus, "seeds": int(r["seeds"]),
                     "program_revenue_per_gpu": program, "lp_revenue_per_gpu": lp,
                     "sim_revenue_per_gpu": r["revenue"], "sim_revenue_ci": r["revenue_ci"],
                     "ratio_to_program": r["revenue"] / program, "abandoned_fraction": r["abandoned_fraction"]})
    return pd.DataFrame(rows)


# -- figures ---------------------------------------------------------------------------------------------
def price_response(scenario: Scenario, result: PriceResult, *, points: int = 41, span: float = 0.5,
                   pricing: str | None = None) -> pd.DataFrame:
    """Each class's price swept over (1 -/+ span) x its optimum, the others at theirs: the fluid LP's revenue
    per s and the class's induced and served rate at every point (the fleet rations what does not fit)."""
    from fluidopt.fluid.lp import FluidModel, scenario_slis

    if not result.success:
        raise UsageError(f"price response: the pricing result has status {result.status!r}")
    sc = replace(scenario, gpus=result.gpus)
    fm = FluidModel(priced_scenario(sc, result.price), pricing or result.pricing, scenario_slis(sc))
    fm.watch_structure = False
    rows = []
    for i, name in enumerate(sc.class_names):
        for p in np.linspace((1 - span) * result.price[i], (1 + span) * result.price[i], points):
            prices = result.price.copy()
            prices[i] = p
            s = priced_scenario(sc, prices)
            fm.update(s)
            sol = fm.solve(raise_infeasible=False)
            lam = s.classes[i].rate
            rows.append({"class": name, "price": float(p), "revenue_per_s": sol.revenue_per_gpu * s.gpus,
                         "rate": lam, "served": lam * float(sol.served_fraction[i]), "optimal_price": result.price[i]})
    return pd.DataFrame(rows)


def price_response_figure(response: pd.DataFrame):
    """Revenue (top) and the class's induced and served load (bottom) against its price, one column per class."""
    from matplotlib.figure import Figure

    names = list(dict.fromkeys(response["class"]))
    fig = Figure(figsize=(4.6 * len(names), 6.4), layout="constrained")  # no pyplot state (plots.py's style)
    axes = fig.subplots(2, len(names), squeeze=False)
    for j, n in enumerate(names):
        d = response[response["class"] == n]
        opt = float(d["optimal_price"].iloc[0])
        ax = axes[0][j]
        ax.plot(d["price"], d["revenue_per_s"], lw=1.5)
        ax.axvline(opt, color="k", ls=":", lw=1)
        ax.set_title(f"{n}: revenue against its price (others optimal)", fontsize=9)
        ax.set_ylabel("fluid revenue per s (cluster)")
        ax = axes[1][j]
        ax.plot(d["price"], d["rate"], label="induced rate", lw=1.5)
        ax.plot(d["price"], d["served"], label="served rate", lw=1.5, ls="--")
        ax.axvline(opt, color="k", ls=":", lw=1)
        ax.set_xlabel("price per request")
        ax.set_ylabel("requests per s (cluster)")
        ax.legend(fontsize=8)
    return fig


def fleet_figure(fleet: FleetResult):
    """Optimal price per class (left) and optimal profit (right) against the fleet size."""
    from matplotlib.figure import Figure

    c = fleet.curve
    fig = Figure(figsize=(9.6, 3.8), layout="constrained")
    axes = fig.subplots(1, 2)
    for col in [k for k in c.columns if k.startswith("price[")]:
        axes[0].plot(c["gpus"], c[col], marker="o", ms=3, label=col[6:-1])
    axes[0].set_xlabel("GPUs")
    axes[0].set_ylabel("optimal price per request")
    axes[0].legend(fontsize=8)
    axes[1].plot(c["gpus"], c["profit_per_s"], marker="o", ms=3)
    axes[1].axvline(fleet.gpus, color="k", ls=":", lw=1)
    axes[1].set_xlabel("GPUs")
    axes[1].set_ylabel(f"optimal profit per s (GPU at {fleet.gpu_price_per_hour:g}/h)")
    return fig


def sli_pareto(scenario: Scenario, kind: str, bounds: Sequence[float], *, gpus: int | None = None,
               pricing: str = "bundled") -> pd.DataFrame:
    """Revenue against an SLI bound (``kind`` 'tpot', 'fairness' or 'decode_fairness'), at the optimal prices of
    each bound (re-optimised) and at today's prices (the fluid LP at today's rates). One row per bound."""
    from fluidopt.fluid.sli import TPOT, DecodeFairness, PrefillFairness

    make = {"tpot": TPOT, "fairness": PrefillFairness, "prefill_fairness": PrefillFairness,
            "decode_fairness": DecodeFairness}.get(kind)
    if make is None:
        raise UsageError(f"--pareto: expected fairness, decode_fairness or tpot, got {kind!r}")
    sc = scenario if gpus is None else replace(scenario, gpus=int(gpus))
    rows = []
    for b in bounds:
        sli = (make(float(b)),)
        r = optimize_prices(sc, pricing=pricing, slis=sli, compare=False)
        today = evaluate_prices(sc, reference_prices(sc), pricing=pricing, slis=sli)
        rows.append({"sli": sli[0].key, "bound": float(b), "status": r.status, "revenue_per_s": r.revenue_per_s,
                     "today_revenue_per_s": today["revenue_per_s"],
                     **{f"price[{c}]": v for c, v in zip(sc.class_names, r.price)}})
    return pd.DataFrame(rows)


def sli_pareto_figure(curve: pd.DataFrame):
    """Revenue against the SLI bound at optimal prices and at today's prices."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.0, 3.8), layout="constrained")
    ax = fig.subplots()
    ax.plot(curve["bound"], curve["revenue_per_s"], marker="o", ms=3, label="optimal prices")
    ax.plot(curve["bound"], curve["today_revenue_per_s"], marker="s", ms=3, label="today's prices")
    ax.set_xlabel(f"{curve['sli'].iloc[0]} bound")
    ax.set_ylabel("fluid revenue per s (cluster)")
    ax.set_title("revenue against the SLI at optimal prices", fontsize=9)
    ax.legend(fontsize=8)
    return fig
