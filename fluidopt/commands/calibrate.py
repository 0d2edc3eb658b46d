"""``fluidopt calibrate``: fit tau = alpha + beta * C to a raw measurement CSV, or list profiles."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from fluidopt.errors import CalibrationError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "calibrate",
        help="fit the iteration-time law tau = alpha + beta*C to measured iterations",
        description=(
            "Fit tau = alpha + beta*C by OLS to a raw iteration-time CSV (columns chunk_tokens, "
            "iteration_seconds, optional decodes and mode; see docs/calibration.md). Decode-only rows "
            "(chunk_tokens = 0) give tau_solo. With --list, show the named GPU profiles instead."
        ),
    )
    p.add_argument("csv", nargs="?", metavar="PROFILE.csv", help="raw measurements to fit")
    p.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    p.add_argument("--plot", metavar="FILE", help="save a plot of data, fit and 95%% bands (PNG, PDF, SVG)")
    p.add_argument("--robust", action="store_true", help="HC3 heteroscedasticity-robust standard errors")
    p.add_argument("--chunk", type=int, metavar="C", help="prefill chunk C (tokens) for tau_mix and --toml")
    p.add_argument("--batch", type=int, metavar="B", help="batch size B (requests per GPU) for --toml")
    p.add_argument("--toml", action="store_true", help="print a [gpu] table for a scenario file (needs --chunk, --batch)")
    p.add_argument("--list", action="store_true", help="list the named GPU profiles and exit")
    return p


def _fmt(x: float) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.5g}"


def _list(args: argparse.Namespace) -> int:
    from fluidopt.calibrate import list_profiles

    df = list_profiles()
    if args.json:
        records = {
            name: {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
            for name, row in df.to_dict(orient="index").items()
        }
        print(json.dumps(records, indent=2))
        return 0
    cols = ["alpha", "beta", "tau_solo", "gamma", "chunk", "batch", "tau_mix", "r2"]
    header = f"{'name':<16}{'model':<12}{'hardware':<18}" + "".join(f"{c:>10}" for c in cols)
    print(header)
    for name, row in df.iterrows():
        cells = "".join(f"{_fmt(row[c]):>10}" for c in cols)
        print(f"{name:<16}{str(row['model'])[:11]:<12}{str(row['hardware'])[:17]:<18}{cells}")
    print("\nunits: alpha, tau_solo, tau_mix in s; beta in s/token; gamma in tokens/s; chunk in tokens.")
    print('Use one in a scenario with  gpu = "<name>"; sources: fluidopt calibrate --list --json')
    return 0


def run(args: argparse.Namespace) -> int:
    if args.list:
        return _list(args)
    if not args.csv:
        raise CalibrationError("give a measurement CSV (fluidopt calibrate PROFILE.csv) or --list")
    if args.toml and (args.chunk is None or args.batch is None):
        raise CalibrationError("--toml needs --chunk C and --batch B (serving settings, not fitted)")

    from fluidopt.calibrate import fit_iteration_time

    fit = fit_iteration_time(args.csv, robust=args.robust, chunk=args.chunk, batch=args.batch)
    if args.plot:
        fig = fit.plot()
        try:
            fig.savefig(args.plot, dpi=120)
        except (OSError, ValueError) as e:
            raise CalibrationError(f"--plot {args.plot!r}: cannot write the plot: {e}") from None
    if args.json:
        d = fit.to_dict()
        if args.plot:
            d["plot"] = str(Path(args.plot))
        print(json.dumps(d, indent=2))
    elif args.toml:
        prof = fit.to_profile(name=Path(args.csv).stem)
        print(f"# fitted by fluidopt calibrate from {args.csv} (R^2 = {fit.r2:.4f}, {fit.n_points} points)")
        print("[gpu]")
        print(f'name = "{prof.name}"')
        print(f"alpha = {prof.alpha!r}      # s")
        print(f"beta = {prof.beta!r}      # s per prefill token")
        print(f"tau_solo = {prof.tau_solo!r}      # s per decode-only iteration")
        print(f"chunk = {prof.chunk}")
        print(f"batch = {prof.batch}")
    else:
        print(fit.summary())
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0
