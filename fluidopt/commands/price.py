"""``fluidopt price``: revenue and who gets served across token prices, bundled against separate."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from fluidopt.commands._options import add_controller_arguments, import_user_modules, parse_options
from fluidopt.commands._scale import (
    add_scale_arguments,
    add_seed_arguments,
    check_workers,
    progress_enabled,
    say_what_is_stored,
    seed_list,
)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "price",
        help="pricing what-if: LP revenue and served fractions over a price grid, shadow prices, SLI Pareto curves",
        description="Solve the fluid LP of SCENARIO (default: the built-in paper instance) over a grid of prefill and "
        "decode token prices, bundled and separate; report revenue per GPU per second and each class's served "
        "fraction (heatmaps), the GPU and SLI shadow prices, the price of an SLI as a Pareto curve, and "
        "optionally simulate chosen points with a controller.",
    )
    p.add_argument("scenario", nargs="?", default=None, metavar="SCENARIO", help="scenario TOML (default: built-in)")
    p.add_argument("--prefill", default="0:0.5:21", metavar="START:STOP:COUNT",
                   help="prefill prices c_p per prompt token: START:STOP:COUNT or a comma list (default 0:0.5:21)")
    p.add_argument("--decode", default="0:0.5:21", metavar="START:STOP:COUNT",
                   help="decode prices c_d per output token (default 0:0.5:21)")
    p.add_argument("--pricing", choices=("both", "bundled", "separate"), default="both")
    p.add_argument("--pareto", default="fairness,tpot",
                   help="SLIs whose price to trace: comma list of fairness, decode_fairness, tpot ('' for none)")
    p.add_argument("--points", type=int, default=25, help="bounds per Pareto curve (default 25)")
    p.add_argument("--simulate", default="", metavar="CP,CD;CP,CD",
                   help="grid points to simulate with --policy, e.g. '0.1,0.2;0.3,0.1'; with --optimize: 'optimal' "
                   "simulates the optimal prices")
    p.add_argument("--policy", default="gate-and-route",
                   help="controller for --simulate (with --optimize --simulate optimal: a comma list)")
    p.add_argument("--horizon", type=float, default=600.0)
    p.add_argument("--warmup", type=float, default=150.0)
    p.add_argument("--out", default="", help="folder for grid.csv, shadow_prices.csv, pareto.csv, simulated.csv and "
                   "the figures (default: save nothing)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    g = p.add_argument_group("optimal prices (classes with a [classes.demand] model; docs/planning.md section 4)")
    g.add_argument("--optimize", action="store_true",
                   help="the revenue-maximising prices within the fleet's fluid capacity (a convex program), "
                   "against today's prices and the best point of the --prefill/--decode grid")
    g.add_argument("--tiers", choices=("per-class", "tokens"), default="per-class",
                   help="per-class: a price per request for each class (concave program); tokens: one c_p and c_d "
                   "for all (grid + local search; not jointly concave)")
    g.add_argument("--gpus", type=int, default=None, help="fleet size for --optimize (default: the scenario's)")
    g.add_argument("--fleet", action="store_true",
                   help="with --optimize: the profit-maximising fleet size and prices, and profit against fleet size")
    g.add_argument("--gpu-price", type=float, default=None,
                   help="price per GPU-hour for --fleet (default: price_per_hour in the scenario's [gpu])")
    g.add_argument("--fit-demand", default="", metavar="CSV",
                   help="fit the demand models to observations (columns class, price, rate) and print the "
                   "[classes.demand] tables to paste")
    g.add_argument("--market-size", type=float, default=None, metavar="RATE",
                   help="with --fit-demand: also fit the logit over all classes as one market of RATE requests/s "
                   "(needs a 'period' column grouping simultaneous observations)")
    add_controller_arguments(p)
    from fluidopt.commands._cache import add_cache_arguments

    add_cache_arguments(p)
    add_scale_arguments(p)
    add_seed_arguments(p, seeds=2)
    return p


def _points(text: str) -> list[tuple[float, float]]:
    from fluidopt.core.errors import UsageError

    out = []
    for part in text.split(";"):
        if not part.strip():
            continue
        try:
            cp, cd = (float(v) for v in part.split(","))
        except ValueError:
            raise UsageError(f"--simulate: expected CP,CD pairs separated by ';', got {part.strip()!r}") from None
        if not (math.isfinite(cp) and math.isfinite(cd)) or cp < 0 or cd < 0:
            raise UsageError(f"--simulate: expected prices >= 0, got {part.strip()!r}")
        out.append((cp, cd))
    return out


def _pareto_bounds(scenario, kind: str, k: int):
    import numpy as np

    from fluidopt.fluid.lp import solve_fluid

    if kind == "tpot":
        g = scenario.gpu
        hi = solve_fluid(scenario, slis=()).tpot
        lo = g.tau_solo * 1.0001
        return np.linspace(lo, max(hi, lo * 1.5), k)
    return np.linspace(0.0, 0.5 if kind in ("fairness", "prefill_fairness") else float(scenario.gpu.batch), k)


def run(args: argparse.Namespace) -> int:
    from fluidopt.core.files import maybe_lock

    # --out is created, proved writable and held as ours alone before any work
    with maybe_lock(args.out or None, "--out", "fluidopt price"):
        with say_what_is_stored(Path(args.out) / "runs" if args.out else None):
            return _run(args)


PRICE_FILES = ("grid.csv", "shadow_prices.csv", "grid.png", "pareto.csv", "pareto.png", "simulated.csv")


def _run(args: argparse.Namespace) -> int:
    from fluidopt.commands._cache import apply_cache, cache_given, check_cache_simulated
    from fluidopt.core.errors import UsageError
    from fluidopt.pricing.grids import (
        grid_figure,
        pareto,
        pareto_figure,
        parse_range,
        price_grid,
        shadow_prices,
        simulate_points,
    )
    from fluidopt.scenario import load_scenario

    import_user_modules(args.imports)
    if args.fit_demand and cache_given(args):
        raise UsageError("--hit-ratio, --from-trace: not with --fit-demand (a demand fit uses no fluid model)")
    if args.fit_demand:
        return _fit(args)
    if args.optimize or args.fleet:
        return _optimize(args)
    if args.market_size is not None:
        raise UsageError("--market-size: only used with --fit-demand")
    for flag, given in (("--gpus", args.gpus is not None), ("--tiers", args.tiers != "per-class"),
                        ("--gpu-price", args.gpu_price is not None)):
        if given:
            raise UsageError(f"{flag}: only used with --optimize")
    options = parse_options(args.option)
    check_workers(args)
    cps = parse_range(args.prefill, "--prefill")
    cds = parse_range(args.decode, "--decode")
    pricings = ("bundled", "separate") if args.pricing == "both" else (args.pricing,)
    kinds = _pareto_kinds(args)
    points = _points(args.simulate)
    if options and not points:
        raise UsageError("--option: only used with --simulate")
    out = Path(args.out) if args.out else None
    scenario = apply_cache(args, load_scenario(args.scenario))
    if points:
        check_cache_simulated(scenario, "--simulate")
    grid = price_grid(scenario, cps, cds, pricings=pricings)
    shadow = shadow_prices(scenario, pricings=pricings)
    curves = [pareto(scenario, k, _pareto_bounds(scenario, k, args.points), pricings=pricings) for k in kinds]
    sim = None
    if points:
        from fluidopt.commands._scale import make_executor

        ex = make_executor(args, runs=len(points) * args.seeds)
        try:
            sim = simulate_points(scenario, points, policy=args.policy, pricing=pricings[0],
                                  seeds=seed_list(args), horizon=args.horizon, warmup=args.warmup,
                                  executor=ex, out=out / "runs" if out is not None else None,
                                  progress=progress_enabled(args))
        finally:
            ex.close()
    files: list[str] = []
    if out is not None:
        import matplotlib
        import pandas as pd

        matplotlib.use("Agg")
        from fluidopt.core.files import write_generation
        from fluidopt.harness.plots import save_png  # saved and closed: pyplot figures

        # one generation: the grid, its figures and the simulated points replace the last run's together
        writers = {"grid.csv": lambda p: grid.to_csv(p, index=False),
                   "shadow_prices.csv": lambda p: shadow.to_csv(p, index=False),
                   "grid.png": lambda p: save_png(grid_figure(grid), p, dpi=100)}
        if curves:
            writers["pareto.csv"] = lambda p: pd.concat(curves, ignore_index=True).to_csv(p, index=False)
            writers["pareto.png"] = lambda p: save_png(pareto_figure(*curves), p, dpi=100)
        if sim is not None:
            writers["simulated.csv"] = lambda p: sim.to_csv(p, index=False)
        files += [str(f) for f in write_generation(out, writers, owned=PRICE_FILES)]
    best = grid.loc[grid.groupby("pricing")["revenue_per_gpu"].idxmax()]
    if args.json:
        def rec(df):
            return json.loads(df.to_json(orient="records"))

        print(json.dumps({"scenario": scenario.name, "points": len(grid), "seconds": grid.attrs.get("seconds"),
                          "best": rec(best), "shadow_prices": rec(shadow),
                          "pareto": [rec(c) for c in curves], "simulated": rec(sim) if sim is not None else None,
                          "files": files}, indent=2))
        return 0
    print(f"fluidopt price: {scenario.name}, {len(cps)} x {len(cds)} prices, {', '.join(pricings)}: "
          f"{len(grid)} LPs in {grid.attrs['seconds']:.2f} s")
    from fluidopt.core.demand import has_demand
    from fluidopt.pricing.optimize import NO_DEMAND_WHY

    if has_demand(scenario.classes):
        print("\nhighest LP revenue per GPU per s on the grid:")
    else:
        # the top corner of whatever grid was asked for: no optimum, and the headline must not read as one
        print(f"\nhighest LP revenue per GPU per s on the grid: the grid's top corner, not an optimal price (no class "
              f"has a demand model ([classes.demand]); {NO_DEMAND_WHY}; --optimize finds optimal prices "
              f"with demand models, docs/planning.md section 4):")
    served = [c for c in grid.columns if c.startswith("served[")]
    print(best[["pricing", "prefill_price", "decode_price", "revenue_per_gpu", *served]].to_string(index=False))
    print("\nshadow prices at the scenario's own prices:")
    print(shadow.to_string(index=False))
    for c in curves:
        print(f"\nprice of the {c['sli'].iloc[0]} SLI (LP revenue per GPU per s against its bound):")
        print(c[["pricing", "bound", "revenue_per_gpu", *served]].iloc[:: max(1, len(c) // 12)].to_string(index=False))
    if curves and "separate" in pricings:
        print(f"note: {separate_with_sli_note(scenario)}")
    if sim is not None:
        print(f"\n{args.policy} simulated at chosen points (LP promise against simulation):")
        print(sim.to_string(index=False))
    if files:
        print(f"\nsaved: {', '.join(files)}")
    return 0


def separate_with_sli_note(scenario) -> str:
    """Why the SLI tables' separate rows carry the bundled revenue even where the SLI does not bind."""
    from fluidopt.fluid.lp import scenario_slis, solve_fluid

    line = ("under an SLI row the LP keeps no decode buffer, so every prefilled request completes and separate "
            "pricing earns what bundled pricing earns at the same prices, even where the SLI does not bind")
    if scenario_slis(scenario):
        return line
    free = solve_fluid(scenario, "separate").objective_per_gpu
    return f"{line} (separate pricing without an SLI row: {free:.6g} per GPU per s at the scenario's own prices)"


def _pareto_kinds(args: argparse.Namespace) -> list[str]:
    """The SLIs of --pareto, checked, and --points checked with them."""
    from fluidopt.core.errors import UsageError

    kinds = [k.strip() for k in args.pareto.split(",") if k.strip()]
    for k in kinds:
        if k not in ("fairness", "prefill_fairness", "decode_fairness", "tpot"):
            raise UsageError(f"--pareto: expected fairness, decode_fairness or tpot, got {k!r}")
    if args.points < 2:
        raise UsageError(f"--points: expected an integer >= 2, got {args.points}")
    return kinds


def _fit(args: argparse.Namespace) -> int:
    from fluidopt.pricing.optimize import fit_demand, json_records, read_observations

    obs = read_observations(args.fit_demand)
    fit = fit_demand(obs, market_size=args.market_size)
    if args.json:
        print(json.dumps({"observations": len(obs), "fits": json_records(fit), "toml": fit.attrs["toml"]}, indent=2))
        return 0
    print(f"fluidopt price --fit-demand: {len(obs)} observations of {obs['class'].nunique()} classes "
          f"(OLS; 95% confidence intervals; AIC on the rate scale, lower is better)\n")
    cols = ["class", "model", "n", "param", "estimate", "ci_low", "ci_high", "param2", "estimate2", "aic", "best"]
    print(fit[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print("\n[classes.demand] tables to paste (the class's rate anchors the curve at its price):\n")
    print(fit.attrs["toml"])
    return 0


def _optimize(args: argparse.Namespace) -> int:
    from fluidopt.core.errors import UsageError
    from fluidopt.pricing.grids import parse_range
    from fluidopt.pricing.optimize import json_records, optimize_fleet, optimize_prices
    from fluidopt.scenario import load_scenario

    if args.fleet and not args.optimize:
        raise UsageError("--fleet: only used with --optimize")
    if args.gpus is not None and args.gpus < 1:
        raise UsageError(f"--gpus: expected an integer >= 1, got {args.gpus}")
    if args.gpu_price is not None and not (math.isfinite(args.gpu_price) and args.gpu_price > 0):
        raise UsageError(f"--gpu-price: expected a price per GPU-hour > 0, got {args.gpu_price}")
    if args.gpu_price is not None and not args.fleet:
        raise UsageError("--gpu-price: only used with --fleet")
    cps = parse_range(args.prefill, "--prefill")
    cds = parse_range(args.decode, "--decode")
    pricing = "bundled" if args.pricing == "both" else args.pricing
    kinds = _pareto_kinds(args)
    out = Path(args.out) if args.out else None
    if args.simulate and args.simulate.strip() != "optimal":
        raise UsageError(f"--simulate: with --optimize, expected 'optimal', got {args.simulate!r}")
    policies = [q.strip() for q in args.policy.split(",") if q.strip()]
    if args.simulate:
        from fluidopt.control.registry import available

        known = set(available())
        for q in policies:
            if q not in known:
                raise UsageError(f"--policy: unknown policy {q!r}; `fluidopt simulate --list-policies` lists them")
        check_workers(args)
        seeds = seed_list(args)
    from fluidopt.commands._cache import apply_cache, check_cache_simulated

    scenario = apply_cache(args, load_scenario(args.scenario))
    if args.simulate:
        check_cache_simulated(scenario, "--simulate")
    res = optimize_prices(scenario, tiers=args.tiers, pricing=pricing, gpus=args.gpus, grid=(cps, cds))
    fleet = None
    if args.fleet and res.success:
        fleet = optimize_fleet(scenario, gpu_price_per_hour=args.gpu_price,
                               tiers=args.tiers, pricing=pricing)
    sim = None
    if args.simulate and res.success:
        from fluidopt.commands._scale import make_executor
        from fluidopt.pricing.optimize import simulate_prices

        ex = make_executor(args, runs=len(policies) * args.seeds)
        try:
            sim = simulate_prices(scenario, res, policies=policies, seeds=seeds,
                                  horizon=args.horizon, warmup=args.warmup, executor=ex,
                                  out=out / "runs" if out is not None else None, progress=progress_enabled(args))
        finally:
            ex.close()
    files = _save_optimum(args, out, scenario, res, fleet, kinds, sim) if out is not None and res.success else []
    if args.json:
        d = {"scenario": scenario.name, **res.to_dict(), "files": files,
             "simulated": json_records(sim) if sim is not None else None}
        if fleet is not None:
            d["fleet"] = {"gpus": fleet.gpus, "profit_per_s": fleet.profit_per_s,
                          "gpu_price_per_hour": fleet.gpu_price_per_hour, "best": fleet.best.to_dict(),
                          "curve": json_records(fleet.curve)}
        print(json.dumps(d, indent=2))
        return 0
    print(f"fluidopt price --optimize: {scenario.name}, {res.gpus} GPUs, tiers {res.tiers}, {res.pricing} pricing")
    print(f"status: {res.status} ({res.message})")
    if not res.success:
        return 0
    if res.tiers == "tokens":
        print(f"token prices: c_p = {res.prefill_price:.6g} per prompt token, c_d = {res.decode_price:.6g} per output token")
    print("\nper class (price per request; rates in requests/s, whole cluster; shadow price: revenue per s of one "
          "more request/s of capacity):")
    print(_clean(res.to_frame()).to_string(index=False, float_format=lambda v: f"{v:.6g}"))
    t, gb = res.today, res.grid_best
    print(f"\nrevenue per s: optimal {res.revenue_per_s:,.2f} ({res.revenue_per_gpu:.2f} per GPU)")
    if t:
        print(f"  today's prices (c_p {t['prefill_price']:g}, c_d {t['decode_price']:g}): {t['revenue_per_s']:,.2f} "
              f"({res.revenue_per_s / t['revenue_per_s'] - 1:+.2%} by optimising)")
    if gb:
        print(f"  best of the {gb['points']}-point token grid (c_p {gb['prefill_price']:.4g}, c_d {gb['decode_price']:.4g}, "
              f"{'interior' if gb['interior'] else 'on the edge of the grid'}): {gb['revenue_per_s']:,.2f}")
    if math.isfinite(res.gpu_shadow_price):
        print(f"one more GPU is worth {res.gpu_shadow_price:.2f} per s at re-optimised prices")
    if fleet is not None:
        print(f"\nfleet at {fleet.gpu_price_per_hour:g} per GPU-hour: the most profit is {fleet.profit_per_s:,.2f} per s at "
              f"{fleet.gpus} GPUs")
        print(_clean(fleet.curve).to_string(index=False, float_format=lambda v: f"{v:.6g}"))
    if sim is not None:
        print(f"\nthe optimal prices simulated ({args.seeds} seeds, {args.horizon:g} s after {args.warmup:g} s warm-up) "
              f"against the program's {res.revenue_per_gpu:.2f} per GPU per s:")
        print(sim.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if files:
        print(f"\nsaved: {', '.join(files)}")
    return 0


ROUND_OFF = 1e-6
"""Relative size below which a printed number of --optimize is the conic solver's round-off (Clarabel
solves to about 1e-8 relative): shown as 0, as the answer is, not as 1.8e-08."""


def _clean(df):
    """``df`` with every float entry below :data:`ROUND_OFF` times its column's largest magnitude set to 0."""
    import numpy as np

    out = df.copy()
    for c in out.columns:
        if out[c].dtype.kind == "f":
            v = out[c].to_numpy(dtype=float)
            scale = np.nanmax(np.abs(v)) if np.isfinite(v).any() else 0.0
            out[c] = np.where(np.abs(v) <= ROUND_OFF * scale, 0.0, v)
    return out


OPTIMUM_FILES = ("optimal.csv", "price_response.csv", "price_response.png", "fleet.csv", "fleet.png", "sli_pareto.csv",
                 "simulated.csv")


def _save_optimum(args, out: Path, scenario, res, fleet, kinds, sim=None) -> list[str]:
    """optimal.csv, price_response.csv/.png, fleet.csv/.png (--fleet), sli_pareto.csv/.png (--pareto) and
    simulated.csv, written as one generation (all replace the last run's, or none does)."""
    import matplotlib
    import pandas as pd

    matplotlib.use("Agg")
    from fluidopt.core.files import write_generation
    from fluidopt.pricing.optimize import (
        fleet_figure,
        price_response,
        price_response_figure,
        sli_pareto,
        sli_pareto_figure,
    )

    writers = {"optimal.csv": lambda p: res.to_frame().to_csv(p, index=False)}
    resp = price_response(scenario, res, points=args.points)
    writers["price_response.csv"] = lambda p: resp.to_csv(p, index=False)
    writers["price_response.png"] = lambda p: price_response_figure(resp).savefig(p, dpi=100, format="png")
    if fleet is not None:
        writers["fleet.csv"] = lambda p: fleet.curve.to_csv(p, index=False)
        writers["fleet.png"] = lambda p: fleet_figure(fleet).savefig(p, dpi=100, format="png")
    owned = list(OPTIMUM_FILES)
    if kinds and res.tiers == "per-class":
        from dataclasses import replace

        sc = scenario if args.gpus is None else replace(scenario, gpus=args.gpus)
        curves = [sli_pareto(sc, k, _pareto_bounds(sc, k, args.points), pricing=res.pricing) for k in kinds]
        writers["sli_pareto.csv"] = lambda p: pd.concat(curves, ignore_index=True).to_csv(p, index=False)
        for c in curves:
            name = f"sli_pareto_{c['sli'].iloc[0]}.png"
            writers[name] = lambda p, c=c: sli_pareto_figure(c).savefig(p, dpi=100, format="png")
            owned.append(name)
    if sim is not None:
        writers["simulated.csv"] = lambda p: sim.to_csv(p, index=False)
    return [str(f) for f in write_generation(out, writers, owned=owned)]
