"""``fluidopt price``: revenue and who gets served across token prices, bundled against separate."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from fluidopt.commands._options import add_controller_arguments, import_user_modules, parse_options
from fluidopt.commands._scale import add_scale_arguments, add_seed_arguments, check_workers, progress_enabled, seed_list


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
                   help="grid points to simulate with --policy, e.g. '0.1,0.2;0.3,0.1'")
    p.add_argument("--policy", default="gate-and-route")
    p.add_argument("--horizon", type=float, default=600.0)
    p.add_argument("--warmup", type=float, default=150.0)
    p.add_argument("--out", default="", help="folder for grid.csv, shadow_prices.csv, pareto.csv, simulated.csv and "
                   "the figures (default: save nothing)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    add_controller_arguments(p)
    add_scale_arguments(p)
    add_seed_arguments(p, seeds=2)
    return p


def _points(text: str) -> list[tuple[float, float]]:
    from fluidopt.errors import UsageError

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
    from fluidopt._files import maybe_lock

    # --out is created, proved writable and held as ours alone before any work
    with maybe_lock(args.out or None, "--out", "fluidopt price"):
        return _run(args)


PRICE_FILES = ("grid.csv", "shadow_prices.csv", "grid.png", "pareto.csv", "pareto.png", "simulated.csv")


def _run(args: argparse.Namespace) -> int:
    from fluidopt.errors import UsageError
    from fluidopt.pricing import (
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
    options = parse_options(args.option)
    check_workers(args)
    cps = parse_range(args.prefill, "--prefill")
    cds = parse_range(args.decode, "--decode")
    pricings = ("bundled", "separate") if args.pricing == "both" else (args.pricing,)
    kinds = [k.strip() for k in args.pareto.split(",") if k.strip()]
    for k in kinds:
        if k not in ("fairness", "prefill_fairness", "decode_fairness", "tpot"):
            raise UsageError(f"--pareto: expected fairness, decode_fairness or tpot, got {k!r}")
    if args.points < 2:
        raise UsageError(f"--points: expected an integer >= 2, got {args.points}")
    points = _points(args.simulate)
    if options and not points:
        raise UsageError("--option: only used with --simulate")
    out = Path(args.out) if args.out else None
    scenario = load_scenario(args.scenario)
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
        from fluidopt._files import write_generation

        # one generation: the grid, its figures and the simulated points replace the last run's together
        writers = {"grid.csv": lambda p: grid.to_csv(p, index=False),
                   "shadow_prices.csv": lambda p: shadow.to_csv(p, index=False),
                   "grid.png": lambda p: grid_figure(grid).savefig(p, dpi=100, format="png")}
        if curves:
            writers["pareto.csv"] = lambda p: pd.concat(curves, ignore_index=True).to_csv(p, index=False)
            writers["pareto.png"] = lambda p: pareto_figure(*curves).savefig(p, dpi=100, format="png")
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
    print("\nhighest LP revenue per GPU per s on the grid:")
    served = [c for c in grid.columns if c.startswith("served[")]
    print(best[["pricing", "prefill_price", "decode_price", "revenue_per_gpu", *served]].to_string(index=False))
    print("\nshadow prices at the scenario's own prices:")
    print(shadow.to_string(index=False))
    for c in curves:
        print(f"\nprice of the {c['sli'].iloc[0]} SLI (LP revenue per GPU per s against its bound):")
        print(c[["pricing", "bound", "revenue_per_gpu", *served]].iloc[:: max(1, len(c) // 12)].to_string(index=False))
    if sim is not None:
        print(f"\n{args.policy} simulated at chosen points (LP promise against simulation):")
        print(sim.to_string(index=False))
    if files:
        print(f"\nsaved: {', '.join(files)}")
    return 0
