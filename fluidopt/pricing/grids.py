"""Pricing what-if: revenue and who gets served across token prices, bundled against separate.

- :func:`price_grid`: the fluid LP over a grid of prefill and decode token prices (c_p per prompt
  token, c_d per output token), for bundled and separate pricing, through the direct highspy path
  (:class:`~fluidopt.fluid.direct.DirectFluidLP`): revenue per GPU per second and each class's
  served fraction at every point. :func:`grid_figure` draws them as heatmaps.
- :func:`shadow_prices`: what one more GPU and a looser SLI are worth (LP duals, per GPU per second).
- :func:`pareto`: the price of an SLI: the LP's revenue against the fairness bound or the TPOT bound
  (the paper's Figs. 8-10 analogues).
- :func:`simulate_points`: chosen grid points simulated with a controller (through
  :func:`fluidopt.harness.compare`, so on any executor), against the LP's promise.

Prices are in the scenario's currency per token; revenue per GPU per second.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import pandas as pd

from fluidopt.core.errors import UsageError
from fluidopt.core.model import Scenario
from fluidopt.fluid.sli import SLI, TPOT, DecodeFairness, PrefillFairness

__all__ = ["price_grid", "grid_figure", "shadow_prices", "pareto", "pareto_figure", "simulate_points",
           "parse_range"]


def parse_range(text: str, what: str) -> np.ndarray:
    """``START:STOP:COUNT`` (inclusive, COUNT points), or a comma list of values, as an array >= 0."""
    t = str(text).strip()
    try:
        if ":" in t:
            a, b, k = t.split(":")
            k = int(k)
            if k < 1:
                raise ValueError
            vals = np.linspace(float(a), float(b), k)
        else:
            vals = np.array([float(v) for v in t.split(",") if v.strip()])
    except ValueError:
        raise UsageError(f"{what}: expected START:STOP:COUNT or a comma list of numbers, got {text!r}") from None
    if vals.size == 0 or not np.all(np.isfinite(vals)) or np.any(vals < 0):
        raise UsageError(f"{what}: expected finite values >= 0, got {text!r}")
    return vals


def price_grid(scenario: Scenario, prefill_prices: Sequence[float], decode_prices: Sequence[float], *,
               pricings: Sequence[str] = ("bundled", "separate"), slis: Sequence[SLI] | None = None) -> pd.DataFrame:
    """Every (pricing, c_p, c_d) of the grid: one row with revenue and per-class served fractions.

    ``slis``: the LP's SLI rows (default: the scenario's own). ``df.attrs['seconds']``: wall time of
    the grid (LP builds included); ``points``.

    Without a demand model the rates are fixed, so revenue is linear in the prices at any fixed
    operating point and the grid's best point is its top corner. With one (``[classes.demand]``),
    each point's rates are the demand at its prices (:func:`fluidopt.pricing.optimize.demand_grid`, through
    Pyomo, a few ms per point) and the best point can be interior.
    """
    from fluidopt.core.demand import has_demand

    if has_demand(scenario.classes):
        from fluidopt.pricing.optimize import demand_grid

        if len(prefill_prices) == 0 or len(decode_prices) == 0:
            raise UsageError("price grid: expected at least one prefill and one decode price")
        t0 = time.perf_counter()
        out = pd.concat([demand_grid(scenario, prefill_prices, decode_prices, pricing=p, slis=slis)
                         for p in pricings], ignore_index=True)
        out.attrs.update(seconds=time.perf_counter() - t0, points=len(out))
        return out
    from fluidopt.fluid.direct import DirectFluidLP
    from fluidopt.fluid.lp import check_pricing, scenario_slis

    cps = np.asarray(prefill_prices, dtype=float)
    cds = np.asarray(decode_prices, dtype=float)
    if cps.size == 0 or cds.size == 0:
        raise UsageError("price grid: expected at least one prefill and one decode price")
    slis = scenario_slis(scenario) if slis is None else tuple(slis)
    t0 = time.perf_counter()
    names = scenario.class_names
    frames = []
    for pricing in pricings:
        check_pricing(pricing)
        lp = DirectFluidLP(scenario, pricing, slis)
        n = cps.size * cds.size
        rev = np.empty(n)
        obj = np.empty(n)
        served = np.empty((n, len(names)))
        status = np.empty(n, dtype=object)
        k = 0
        for cp in cps:
            # snake through c_d so that each point starts from a neighbour's basis
            order = cds if (k // max(cds.size, 1)) % 2 == 0 else cds[::-1]
            for cd in order:
                lp.set_prices(float(cp), float(cd))
                r = lp.solve()
                rev[k], obj[k], served[k], status[k] = r["revenue_per_gpu"], r["objective_per_gpu"], \
                    r["served_fraction"], r["status"]
                k += 1
        cp_col = np.repeat(cps, cds.size)
        cd_col = np.concatenate([cds if j % 2 == 0 else cds[::-1] for j in range(cps.size)])
        df = pd.DataFrame({"pricing": pricing, "prefill_price": cp_col, "decode_price": cd_col, "status": status,
                           "revenue_per_gpu": rev, "objective_per_gpu": obj,
                           **{f"served[{c}]": served[:, i] for i, c in enumerate(names)}})
        frames.append(df.sort_values(["prefill_price", "decode_price"], kind="stable"))
    out = pd.concat(frames, ignore_index=True)
    out.attrs.update(seconds=time.perf_counter() - t0, points=len(out))
    return out


def grid_figure(grid: pd.DataFrame):
    """Heatmaps: revenue per GPU per second and each class's served fraction, one row per pricing."""
    import matplotlib.pyplot as plt

    pricings = list(dict.fromkeys(grid["pricing"]))
    served = [c for c in grid.columns if c.startswith("served[")]
    cols = ["revenue_per_gpu", *served]
    fig, axes = plt.subplots(len(pricings), len(cols), figsize=(4.0 * len(cols), 3.4 * len(pricings)), squeeze=False)
    for i, p in enumerate(pricings):
        d = grid[grid["pricing"] == p]
        cps = np.sort(d["prefill_price"].unique())
        cds = np.sort(d["decode_price"].unique())
        for j, c in enumerate(cols):
            z = d.pivot(index="decode_price", columns="prefill_price", values=c).reindex(index=cds, columns=cps)
            ax = axes[i][j]
            im = ax.imshow(z.to_numpy(dtype=float), origin="lower", aspect="auto",
                           extent=(cps[0], cps[-1], cds[0], cds[-1]),
                           vmin=0.0 if c != "revenue_per_gpu" else None, vmax=1.0 if c != "revenue_per_gpu" else None)
            fig.colorbar(im, ax=ax, shrink=0.85)
            ax.set_xlabel("prefill price c_p (per prompt token)")
            ax.set_ylabel("decode price c_d (per output token)")
            ax.set_title(f"{p}: {'revenue per GPU per s' if c == 'revenue_per_gpu' else c.replace('served', 'served fraction ')}",
                         fontsize=9)
    fig.tight_layout()
    return fig


def shadow_prices(scenario: Scenario, *, pricings: Sequence[str] = ("bundled", "separate"),
                  slis: Sequence[SLI] | None = None) -> pd.DataFrame:
    """GPU and SLI shadow prices: one row per (pricing, item); value per GPU per second per unit.

    ``gpu``: cluster revenue per second gained by one more GPU at fixed demand; ``sli:KEY``:
    d objective / d bound of each SLI in the SLI's own units (a looser bound is worth this much).
    """
    from fluidopt.fluid.lp import solve_fluid

    rows = []
    for p in pricings:
        sol = solve_fluid(scenario, pricing=p, slis=slis)
        rows.append({"pricing": p, "item": "gpu", "shadow_price": sol.gpu_shadow_price,
                     "unit": "revenue per s per extra GPU"})
        for k, v in sol.sli_shadow_prices.items():
            rows.append({"pricing": p, "item": f"sli:{k}", "shadow_price": v,
                         "unit": "revenue per GPU per s per unit of the bound"})
        for k in ("prefill_capacity", "mixed_decode_capacity", "solo_decode_capacity"):
            rows.append({"pricing": p, "item": f"row:{k}", "shadow_price": sol.duals.get(k, np.nan),
                         "unit": "revenue per GPU per s per unit of rhs"})
    return pd.DataFrame(rows)


def pareto(scenario: Scenario, kind: str, bounds: Sequence[float], *, pricings: Sequence[str] = ("bundled", "separate"),
           slis: Sequence[SLI] | None = None) -> pd.DataFrame:
    """Revenue per GPU per second against an SLI bound: ``kind`` 'fairness' (prefill fairness eta),
    'decode_fairness' or 'tpot' (seconds). The scenario's other SLIs stay. One row per (pricing, bound)."""
    from fluidopt.fluid.direct import DirectFluidLP
    from fluidopt.fluid.lp import scenario_slis

    make = {"fairness": PrefillFairness, "prefill_fairness": PrefillFairness, "decode_fairness": DecodeFairness,
            "tpot": TPOT}.get(kind)
    if make is None:
        raise UsageError(f"--pareto: expected fairness, decode_fairness or tpot, got {kind!r}")
    bounds = [float(b) for b in bounds]
    if not bounds:
        raise UsageError(f"--pareto {kind}: expected at least one bound")
    base = scenario_slis(scenario) if slis is None else tuple(slis)
    sli = make(bounds[0])
    others = tuple(s for s in base if s.key != sli.key)
    names = scenario.class_names
    rows = []
    for p in pricings:
        lp = DirectFluidLP(scenario, p, (*others, sli))
        for b in bounds:
            lp.set_sli_bound(sli.key, b)
            r = lp.solve()
            rows.append({"pricing": p, "sli": sli.key, "bound": b, "status": r["status"],
                         "revenue_per_gpu": r["revenue_per_gpu"],
                         **{f"served[{c}]": v for c, v in zip(names, r["served_fraction"])}})
    return pd.DataFrame(rows)


def pareto_figure(*curves: pd.DataFrame):
    """Revenue against each SLI bound (one panel per curve, one line per pricing)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(4.6 * len(curves), 3.6), squeeze=False)
    units = {"tpot": "TPOT bound (s per output token)", "prefill_fairness": "prefill fairness bound eta (occupancy)",
             "decode_fairness": "decode fairness bound eta (slots per GPU)"}
    for ax, df in zip(axes[0], curves):
        key = str(df["sli"].iloc[0])
        for p, g in df.groupby("pricing", sort=False):
            ax.plot(g["bound"], g["revenue_per_gpu"], marker="o", ms=3, label=p)
        ax.set_xlabel(units.get(key, key))
        ax.set_ylabel("LP revenue per GPU per s")
        ax.set_title(f"price of the {key.replace('_', ' ')} SLI", fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def simulate_points(scenario: Scenario, points: Sequence[tuple[float, float]], *, policy: str = "gate-and-route",
                    pricing: str = "bundled", seeds: Sequence[int] = (0,), horizon: float = 600.0,
                    warmup: float = 150.0, service: str = "markov", executor=None, out=None,
                    progress: bool | None = None) -> pd.DataFrame:
    """Simulate ``policy`` at chosen (c_p, c_d) points; LP promise against simulated revenue per point."""
    from dataclasses import replace

    from fluidopt.harness.comparison import compare

    if not points:
        raise UsageError("--simulate: expected at least one CP,CD point")
    from fluidopt.core.demand import has_demand

    if has_demand(scenario.classes):  # the rates follow the demand at each point's prices
        from fluidopt.pricing.optimize import _token_scenario

        scens = [replace(_token_scenario(scenario, cp, cd), name=f"cp={cp:g},cd={cd:g}") for cp, cd in points]
    else:
        scens = [replace(scenario.with_prices(cp, cd), name=f"cp={cp:g},cd={cd:g}") for cp, cd in points]
    c = compare(scens, [policy], seeds=list(seeds), horizon=horizon, warmup=warmup, service=service, pricing=pricing,
                executor=executor, out=out, progress=progress)
    s = c.summary()
    rows = []
    for (cp, cd), sc in zip(points, scens):
        r = s[s["scenario"] == sc.name]
        if r.empty:
            continue
        r = r.iloc[0]
        lp = float(c.bounds.loc[c.bounds["scenario"] == sc.name, f"lp_{pricing}"].iloc[0])
        rows.append({"prefill_price": cp, "decode_price": cd, "pricing": pricing, "policy": policy,
                     "lp_revenue_per_gpu": lp, "sim_revenue_per_gpu": r["revenue"], "sim_revenue_ci": r["revenue_ci"],
                     "ratio": r["ratio"], "gap_per_gpu": lp - r["revenue"]})
    return pd.DataFrame(rows)
