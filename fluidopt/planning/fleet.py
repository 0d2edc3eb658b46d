"""Capacity planning: how many GPUs of which type meet a demand and its SLIs, and at what cost.

For each GPU profile (and each demand growth factor):

1. the **fluid lower bound** n_fluid: the fewest GPUs for which the fluid LP has an operating point
   meeting the SLIs, from one LP with n as a variable (:func:`fluidopt.fluid.capacity.fluid_fleet_bound`),
   with the binding constraint named;
2. the **simulation-verified fleet** n_sim: the smallest n at which a controller (default:
   Gate-and-Route, planned from the LP at n with the SLIs) meets every SLI in simulation with 95%
   confidence over ``seeds`` seeds (one-sided t bound over the seeds), found by a search that starts
   at ceil(n_fluid), steps up until every SLI holds, then bisects; the finite-n correction is
   n_sim - ceil(n_fluid);
3. cost per hour (n times the profile's price per GPU-hour) and per million output tokens.

SLIs checked in simulation, per class: completed fraction (completed / arrived after the warm-up:
a request counts only when its last token is out), mean TTFT and p99 TTFT; for the fleet: TPOT as
decode seconds per output token over the completed requests (token-weighted, as the fluid TPOT).
The fluid bound uses the completed fraction, TPOT, the mean TTFT (as a mean prefill wait
TTFT - P_i tau / C, Little's law) and prefill fairness; p99 TTFT has no fluid counterpart and is
checked in simulation only.

Demand is the scenario's class arrival rates for the whole fleet (its ``gpus`` is ignored).

:func:`plan_day` (``fluidopt plan --day``, module :mod:`fluidopt.planning.day`) answers the other planning
question, GPU-hours for a day whose interactive rate changes per time slot and whose batch work has
deadlines, from the multi-period fluid LP.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

import fluidopt.core.interrupt as interrupt
from fluidopt.core.errors import ScenarioError, UsageError, did_you_mean
from fluidopt.core.model import GPUProfile, Scenario
from fluidopt.core.tquantile import t_quantile
from fluidopt.fluid.sli import SLI, TPOT, MaxPrefillWait, MinServedFraction, PrefillFairness, sli_spec
from fluidopt.planning.day import DayPlan, plan_day  # noqa: F401  (GPU-hours for a day: `fluidopt plan --day`)

__all__ = ["PlanSLIs", "PlanResult", "plan", "fluid_plan_slis", "batch_chunk_study", "simulation_window", "DayPlan",
           "plan_day"]

CONFIDENCE = 0.95
_STEPS = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)  # search: n0 (1 + f), until an SLI set holds


@dataclass(frozen=True)
class PlanSLIs:
    """What the fleet must deliver. ``served``: completed fraction per class (a number for every
    class, or {class: fraction}); ``tpot``: mean time per output token (s); ``ttft``: mean time to
    first token per class (s); ``ttft_p99``: 99th percentile TTFT per class (s, simulation only);
    ``fairness``: prefill fairness bound eta (max_i x_i - min_i x_i, occupancy per GPU; fluid only).
    """

    served: float | dict[str, float] | None = 0.99
    tpot: float | None = None
    ttft: float | None = None
    ttft_p99: float | None = None
    fairness: float | None = None

    def __post_init__(self) -> None:
        sv = self.served
        vals = sv.values() if isinstance(sv, dict) else ([] if sv is None else [sv])
        for v in vals:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < float(v) <= 1:
                raise UsageError(f"--served: expected a completed fraction in (0, 1], got {v!r}")
        for name in ("tpot", "ttft", "ttft_p99"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not math.isfinite(v) or v <= 0):
                raise UsageError(f"--{name.replace('_', '-')}: expected seconds > 0, got {v!r}")
        if self.fairness is not None and (not math.isfinite(self.fairness) or self.fairness < 0):
            raise UsageError(f"--fairness: expected an occupancy bound >= 0, got {self.fairness!r}")

    def served_of(self, names: Sequence[str]) -> dict[str, float]:
        if self.served is None:
            return {}
        if isinstance(self.served, dict):
            bad = sorted(set(self.served) - set(names))
            if bad:
                raise UsageError(f"--served: unknown class {bad[0]!r}; the classes are {', '.join(names)}")
            return {c: float(v) for c, v in self.served.items()}
        return {c: float(self.served) for c in names}

    def describe(self) -> str:
        parts = []
        if self.served is not None:
            parts.append(f"served >= {self.served}" if not isinstance(self.served, dict)
                         else ", ".join(f"served[{c}] >= {v}" for c, v in self.served.items()))
        for name, lab in (("tpot", "TPOT"), ("ttft", "mean TTFT"), ("ttft_p99", "p99 TTFT")):
            if getattr(self, name) is not None:
                parts.append(f"{lab} <= {getattr(self, name):g} s")
        if self.fairness is not None:
            parts.append(f"prefill fairness <= {self.fairness:g}")
        return ", ".join(parts)


def fluid_plan_slis(scenario: Scenario, slis: PlanSLIs) -> tuple[SLI, ...]:
    """The fluid-LP SLIs of a plan: served fractions, TPOT, mean TTFT as a mean prefill wait, fairness.

    A mean TTFT below a class's own prefill time (P_i / C iterations of tau seconds) cannot be met
    by any fleet: :class:`ScenarioError` says so.
    """
    out: list[SLI] = [MinServedFraction(c, f) for c, f in slis.served_of(scenario.class_names).items()]
    if slis.tpot is not None:
        out.append(TPOT(slis.tpot))
    if slis.ttft is not None:
        g = scenario.gpu
        for c in scenario.classes:
            prefill = c.prefill_tokens * g.tau_mix / g.chunk
            if slis.ttft <= prefill:
                raise ScenarioError(
                    f"no fleet size meets mean TTFT <= {slis.ttft:g} s for class {c.name!r} because its prefill "
                    f"alone takes {prefill:.4g} s (P / C = {c.prefill_tokens / g.chunk:.3g} iterations of tau = {g.tau_mix:.4g} s)")
            out.append(MaxPrefillWait(c.name, slis.ttft - prefill))
    if slis.fairness is not None:
        out.append(PrefillFairness(slis.fairness))
    return tuple(out)


def simulation_window(scenario: Scenario, scale: float = 1.0) -> tuple[float, float]:
    """(horizon, warm-up) in seconds for a verification run: warm-up 3 T (at least 60 s), then
    10 T (at least 300 s) measured, T the slowest mean decode (the largest D_i at the slower mode)."""
    g = scenario.gpu
    T = max(c.decode for c in scenario.classes) * max(g.tau_mix, g.tau_solo)
    warm = max(60.0, 3.0 * T) * scale
    return warm + max(300.0, 10.0 * T) * scale, warm


def _growth(scenario: Scenario, factor: float) -> Scenario:
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor <= 0:
        raise UsageError(f"--growth: expected demand growth factors > 0, got {factor!r}")
    if factor == 1:
        return scenario
    return replace(scenario, classes=tuple(replace(c, rate=c.rate * factor) for c in scenario.classes))


def _on_fleet(scenario: Scenario, n: int) -> Scenario:
    """The same cluster demand served by ``n`` GPUs."""
    return replace(scenario, gpus=int(n), name=f"{scenario.name}-n{n}")


def _sim_job(job: dict[str, Any]) -> dict[str, Any]:
    """One verification run: the policy planned from the LP at n with the plan's SLIs."""
    from fluidopt.control.registry import make_controller, uses_plan
    from fluidopt.fluid.lp import solve_fluid
    from fluidopt.sim.api import simulate

    sc = job["scenario"]
    plan = None
    if uses_plan(job["policy"]):
        plan = solve_fluid(sc, pricing="bundled", slis=job["lp_slis"])
    options = dict(job["options"] or {})
    share = job.get("mixed_share")
    if share is not None and "mixed_gpus" not in options:
        options["mixed_gpus"] = min(sc.gpus, max(1, math.ceil(sc.gpus * share - 1e-9)))
    ctrl = make_controller(job["policy"], sc, plan=plan, **options)
    res = simulate(sc, ctrl, window=job["window"], seed=job["seed"], progress=False)
    interrupt.raise_if_cut(res)  # (run in this process: never store a cut run as a whole one)
    pc = res.per_class
    arrived = pc["arrived"].to_numpy(dtype=float)
    completed = pc["completed"].to_numpy(dtype=float)
    D = np.array([c.decode for c in sc.classes], dtype=float)
    W = float(res.cluster["window_seconds"])
    return {
        "served": [float(v) for v in np.where(arrived > 0, completed / np.maximum(arrived, 1), np.nan)],
        "ttft_mean": [float(v) for v in pc["ttft_mean"]],
        "ttft_p99": [float(v) for v in pc["ttft_p99"]],
        # token-weighted TPOT: decode seconds over output tokens of the completed requests (the fluid
        # TPOT's meaning). The per-request mean of (e2e - TTFT) / tokens is not it: under markov service a
        # request's decode time and its token count are drawn apart, and that ratio's mean is dominated
        # by requests with few tokens and a long draw (0.12 s against a median of 0.02 s on the paper's).
        "tpot_mean": float((completed * (pc["e2e_mean"].to_numpy(float) - pc["ttft_mean"].to_numpy(float))).sum()
                           / (completed * D).sum()) if completed.sum() > 0 else math.nan,
        "revenue_per_gpu": float(res.cluster["revenue_per_gpu"]),
        "output_tokens_per_s": float((completed * D).sum() / W) if W > 0 else math.nan,
        "wall_seconds": float(res.wall_seconds),
    }


def _bound(values: np.ndarray, upper: bool) -> tuple[float, float]:
    """Mean and one-sided 95% confidence bound over seeds (upper or lower); one seed: the value."""
    v = values[np.isfinite(values)]
    if v.size == 0:
        return math.nan, math.nan
    m = float(v.mean())
    if v.size == 1:
        return m, m
    hw = float(t_quantile(v.size - 1, CONFIDENCE) * v.std(ddof=1) / math.sqrt(v.size))
    return m, (m + hw if upper else m - hw)


def _judge(scenario: Scenario, slis: PlanSLIs, runs: list[dict]) -> tuple[bool, list[dict]]:
    """Every SLI against its target with 95% confidence; one row per (metric, class)."""
    names = scenario.class_names
    rows = []
    targets = slis.served_of(names)
    for i, c in enumerate(names):
        if c in targets:
            m, b = _bound(np.array([r["served"][i] for r in runs]), upper=False)
            rows.append({"metric": "served", "class": c, "mean": m, "bound": b, "target": targets[c], "met": b >= targets[c]})
        for key, tgt in (("ttft_mean", slis.ttft), ("ttft_p99", slis.ttft_p99)):
            if tgt is not None:
                m, b = _bound(np.array([r[key][i] for r in runs]), upper=True)
                rows.append({"metric": key, "class": c, "mean": m, "bound": b, "target": tgt, "met": b <= tgt})
    if slis.tpot is not None:
        m, b = _bound(np.array([r["tpot_mean"] for r in runs]), upper=True)
        rows.append({"metric": "tpot_mean", "class": "all", "mean": m, "bound": b, "target": slis.tpot,
                     "met": b <= slis.tpot})
    return all(r["met"] for r in rows), rows


@dataclass
class PlanResult:
    """Outcome of :func:`plan`.

    ``table``: one row per (profile, growth): the fluid bound (``n_fluid``, ``n_fluid_int``,
    ``binding``), the verified fleet (``n_sim``, ``correction`` = n_sim - n_fluid_int, NaN with
    ``fluid_only``), ``price_per_gpu_hour``, ``cost_per_hour`` (of n_sim, or of n_fluid_int when
    fluid only), ``output_tokens_per_s`` and ``cost_per_million_output_tokens``, and ``cheapest``
    (True for the cheapest profile at each growth factor). ``curves``: every probe of the search,
    one row per (profile, growth, n, metric, class) with the mean over seeds, the one-sided 95%
    bound, the target and whether it is met.
    """

    table: pd.DataFrame
    curves: pd.DataFrame
    slis: PlanSLIs
    policy: str
    seeds: int
    meta: dict = field(default_factory=dict)

    def figure(self, growth: float | None = None):
        """SLI against n per profile (mean and one-sided 95% bound over seeds; dashed: target;
        dotted: the fluid bound)."""
        import matplotlib.pyplot as plt

        cv = self.curves
        if growth is None:
            growth = float(self.table["growth"].iloc[0])
        cv = cv[cv["growth"] == growth] if not cv.empty else cv
        metrics = list(dict.fromkeys(cv["metric"])) if not cv.empty else ["served"]
        profiles = list(dict.fromkeys(self.table["profile"]))
        fig, axes = plt.subplots(len(metrics), len(profiles), figsize=(4.2 * len(profiles), 3.2 * len(metrics)),
                                 squeeze=False)
        units = {"served": "completed fraction", "ttft_mean": "mean TTFT (s)", "ttft_p99": "p99 TTFT (s)",
                 "tpot_mean": "mean TPOT (s)"}
        for j, prof in enumerate(profiles):
            row = self.table[(self.table["profile"] == prof) & (self.table["growth"] == growth)]
            for i, met in enumerate(metrics):
                ax = axes[i][j]
                d = cv[(cv["profile"] == prof) & (cv["metric"] == met)] if not cv.empty else cv
                for k, (cls, g) in enumerate(d.groupby("class", sort=False)):
                    g = g.sort_values("n")
                    ax.plot(g["n"], g["mean"], marker="o", ms=4, color=f"C{k}", label=f"{cls} mean")
                    ax.fill_between(g["n"], g["mean"], g["bound"], color=f"C{k}", alpha=0.2)
                    ax.axhline(float(g["target"].iloc[0]), color=f"C{k}", ls="--", lw=0.8)
                if not row.empty:
                    ax.axvline(float(row["n_fluid"].iloc[0]), color="k", ls=":", lw=1, label="fluid bound")
                ax.set_xlabel("GPUs n")
                ax.set_ylabel(units.get(met, met))
                ax.set_title(f"{prof}, demand x{growth:g}", fontsize=9)
                ax.legend(fontsize=7)
        fig.tight_layout()
        return fig

    def to_dict(self) -> dict:
        from fluidopt.harness.executor import finite_or_none

        def rec(df: pd.DataFrame) -> list[dict]:
            return [{k: finite_or_none(v.item() if hasattr(v, "item") else v) for k, v in r.items()}
                    for r in df.to_dict(orient="records")]

        return {"slis": self.slis.describe(), "policy": self.policy, "seeds": self.seeds,
                "fleets": rec(self.table), "curves": rec(self.curves), **{k: v for k, v in self.meta.items()}}


def _profiles(scenario: Scenario, profiles: Sequence[str | GPUProfile] | None) -> list[GPUProfile]:
    if not profiles:
        return [scenario.gpu]
    out = []
    for p in profiles:
        if isinstance(p, GPUProfile):
            out.append(p)
        elif isinstance(p, str):
            from fluidopt.calibration.profiles import load_profile

            out.append(load_profile(p.strip()))
        else:
            raise UsageError(f"--profiles: expected profile names or GPUProfile objects, got {p!r}")
    return out


def plan(
    scenario: Scenario,
    slis: PlanSLIs | None = None,
    *,
    profiles: Sequence[str | GPUProfile] | None = None,
    growth: Sequence[float] = (1.0,),
    policy: str = "gate-and-route",
    options: dict | None = None,
    fluid_only: bool = False,
    seeds: int = 5,
    seed: int = 0,
    horizon: float | None = None,
    warmup: float | None = None,
    service: str = "markov",
    executor=None,
    out: str | os.PathLike | None = None,
    progress: bool | None = None,
    max_factor: float = 4.0,
    require_price: bool = True,
) -> PlanResult:
    """Plan the fleet for ``scenario``'s demand (cluster arrival rates) under ``slis``; see the module docs.

    ``profiles``: named profiles or :class:`GPUProfile` objects (default: the scenario's GPU); each
    needs ``price_per_hour`` unless ``require_price=False``. ``growth``: demand multipliers.
    ``horizon``/``warmup``: seconds per verification run (default :func:`simulation_window`).
    ``executor``: :mod:`fluidopt.harness.executor` backend for the runs (default: a local pool); ``out``: a
    folder whose results store makes a rerun skip the runs already done. ``max_factor``: give up
    (UsageError) when even max_factor * ceil(n_fluid) GPUs miss an SLI.
    """
    from fluidopt.control.registry import available, policy_options
    from fluidopt.fluid.capacity import fluid_fleet_bound
    from fluidopt.harness.executor import LocalExecutor, ResultStore

    if not isinstance(scenario, Scenario):
        raise ScenarioError(f"plan: scenario: expected a Scenario, got {type(scenario).__name__}")
    slis = slis or PlanSLIs()
    growth = list(growth) if growth else [1.0]
    for f in growth:
        _growth(scenario, f)
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise UsageError(f"--seeds: expected an integer >= 1, got {seeds!r}")
    key = policy.strip().lower().replace("_", "-")
    if key not in available():
        raise UsageError(f"--policy: unknown policy {policy!r}{did_you_mean(key, available())}; known: "
                         f"{', '.join(sorted(available()))}")
    profs = _profiles(scenario, profiles)
    if require_price:
        for g in profs:
            if g.price_per_hour is None:
                raise ScenarioError(
                    f"profile {g.name or '(scenario gpu)'!r}: no price per GPU-hour; add price_per_hour = DOLLARS "
                    "to its table (or to the scenario's [gpu], or fluidopt plan --price KEY=DOLLARS) to cost a fleet")
    if sum(c.rate for c in scenario.classes) <= 0:  # pragma: no cover - RequestClass forbids it
        raise ScenarioError("plan: demand: expected arrival rates > 0, got none")
    from fluidopt.sim.window import RunWindow

    store = ResultStore(out) if out is not None else None
    rows, curves = [], []
    own = executor is None and not fluid_only
    if own:
        executor = LocalExecutor(max(1, min(os.cpu_count() or 1, seeds)))
    try:
        for g in profs:
            for f in growth:
                sc = _growth(replace(scenario, gpu=g), f)
                lp_slis = fluid_plan_slis(sc, slis)
                fb = fluid_fleet_bound(sc, lp_slis)
                row: dict[str, Any] = {
                    "profile": g.name or "scenario", "growth": float(f), "n_fluid": fb.gpus, "n_fluid_int": fb.gpus_int,
                    "binding": fb.binding_sli or (fb.binding[0] if fb.binding else ""),
                    "binding_rows": ";".join(fb.binding), "n_sim": math.nan, "correction": math.nan,
                    "price_per_gpu_hour": g.price_per_hour if g.price_per_hour is not None else math.nan,
                }
                lam = np.array([c.rate for c in sc.classes])
                D = np.array([c.decode for c in sc.classes])
                mu_p = g.chunk / (np.array([c.prefill_tokens for c in sc.classes]) * g.tau_mix)
                served_fluid = mu_p * fb.x * fb.gpus / lam
                tokens = float((lam * served_fluid * D).sum())
                n_cost = fb.gpus_int
                if not fluid_only:
                    h, w = simulation_window(sc) if horizon is None else (horizon, warmup or 0.0)
                    if warmup is not None:
                        w = warmup
                    window = RunWindow(h, w, service, caller="plan")  # checked once for every probe's runs
                    # Gate-and-Route's static partition from the LP at n keeps M = ceil(n sum x*) mixed GPUs,
                    # the bound's prefill capacity and no more, so at small n its prefill queue alone
                    # breaks the SLIs however many solo GPUs are added. A plan keeps the bound's mixed
                    # share instead (M = ceil(n X*/n*)): the extra GPUs go to both pools in proportion.
                    share = float(np.sum(fb.x)) if "mixed_gpus" in policy_options(key) else None
                    n_sim, probes, tok = _search(sc, slis, lp_slis, fb.gpus_int, key, options, seeds, window,
                                                 executor, store, progress, max_factor, f, share, seed)
                    for n, judged in probes:
                        curves.extend({"profile": row["profile"], "growth": float(f), "n": n, **j} for j in judged)
                    row.update(n_sim=n_sim, correction=n_sim - fb.gpus_int, horizon=h, warmup=w)
                    n_cost, tokens = n_sim, tok
                row["output_tokens_per_s"] = tokens
                if g.price_per_hour is not None:
                    row["cost_per_hour"] = n_cost * g.price_per_hour
                    row["cost_per_million_output_tokens"] = row["cost_per_hour"] / (tokens * 3600 / 1e6)
                else:
                    row["cost_per_hour"] = row["cost_per_million_output_tokens"] = math.nan
                rows.append(row)
    finally:
        if own and executor is not None:
            executor.close()
    table = pd.DataFrame(rows)
    table["cheapest"] = False
    if table["cost_per_hour"].notna().any():
        for _f, grp in table.groupby("growth"):
            if grp["cost_per_hour"].notna().any():
                table.loc[grp["cost_per_hour"].idxmin(), "cheapest"] = True
    res = PlanResult(table=table, curves=pd.DataFrame(curves), slis=slis, policy=key, seeds=seeds,
                     meta={"scenario": scenario.name, "fluid_only": fluid_only, "service": service,
                           "executor": None if executor is None else executor.describe()})
    return res


def _search(sc: Scenario, slis: PlanSLIs, lp_slis, n0: int, policy: str, options, seeds: int, window,
            executor, store, progress, max_factor: float, growth: float,
            mixed_share: float | None = None, seed: int = 0):
    """Smallest n >= n0 meeting every SLI in simulation: step up from n0, then bisect."""
    from fluidopt.harness.executor import run_jobs

    probes: dict[int, tuple[bool, list[dict], float]] = {}

    def probe(n: int) -> bool:
        if n in probes:
            return probes[n][0]
        scn = _on_fleet(sc, n)
        jobs = [{"scenario": scn, "policy": policy, "options": options, "seed": s, "window": window,
                 "lp_slis": lp_slis, "mixed_share": mixed_share,
                 "extra": {"kind": "plan", "slis": [sli_spec(x) for x in lp_slis], "mixed_share": mixed_share}} for s in range(seed, seed + seeds)]
        done = run_jobs(_sim_job, jobs, executor=executor, store=store, progress=progress,
                        desc=f"{sc.gpu.name or 'gpu'} x{growth:g} n={n}")
        runs = [done[k] for k in sorted(done)]
        ok, judged = _judge(sc, slis, runs)
        probes[n] = (ok, judged, float(np.mean([r["output_tokens_per_s"] for r in runs])))
        return ok

    last_fail = n0 - 1
    first_pass = None
    if probe(n0):
        first_pass = n0
    else:
        for f in _STEPS:
            n = max(last_fail + 1, math.ceil(n0 * (1 + f)))
            if n > max_factor * n0:
                break
            if probe(n):
                first_pass = n
                break
            last_fail = n
    if first_pass is None:
        raise UsageError(f"plan: {policy} misses an SLI ({slis.describe()}) even on {last_fail} GPUs "
                         f"({max_factor:g} x the fluid bound {n0}); try another --policy or looser SLIs")
    while first_pass - last_fail > 1:
        mid = (first_pass + last_fail) // 2
        if probe(mid):
            first_pass = mid
        else:
            last_fail = mid
    out = [(n, j) for n, (_, j, _) in sorted(probes.items())]
    return first_pass, out, probes[first_pass][2]


def batch_chunk_study(scenario: Scenario, gpus: int | None = None, *, batches: Sequence[int] = (8, 16, 32, 64),
                      chunks: Sequence[int] = (128, 256, 512, 1024), slis: Sequence[SLI] | None = None,
                      pricing: str = "bundled") -> pd.DataFrame:
    """Revenue per GPU per second and TPOT of the fluid LP against batch size B and chunk size C.

    One row per (B, C) on ``gpus`` GPUs (default: the scenario's) at the scenario's demand, with the
    scenario's iteration-time law tau = alpha + beta C (the law is fitted over chunk sizes, so values
    of C far outside the fit extrapolate it). Infeasible points have ``status='infeasible'``.
    """
    from fluidopt.fluid.lp import FluidModel, scenario_slis

    sc = scenario if gpus is None else replace(scenario, gpus=int(gpus))
    slis = scenario_slis(sc) if slis is None else tuple(slis)
    rows = []
    fm = None
    for B in batches:
        for C in chunks:
            g = replace(sc.gpu, batch=int(B), chunk=int(C))
            s = replace(sc, gpu=g)
            if fm is None:
                fm = FluidModel(s, pricing, slis)
            else:
                fm.update(s)
            sol = fm.solve(raise_infeasible=False)
            rows.append({"batch": int(B), "chunk": int(C), "tau_mix": g.tau_mix, "status": sol.status,
                         "revenue_per_gpu": sol.revenue_per_gpu, "tpot": sol.tpot,
                         "prefill_occupancy": sol.prefill_occupancy,
                         **{f"served[{c}]": float(v) for c, v in zip(sol.class_names, sol.served_fraction)}})
    return pd.DataFrame(rows)
