"""``fluidopt calibrate``: fit tau = alpha + beta * C to a raw measurement CSV, or list profiles."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from fluidopt.core.errors import CalibrationError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "calibrate",
        help="fit the iteration-time law tau = alpha + beta*C to measured iterations",
        description=(
            "Fit tau = alpha + beta*C by OLS to a raw iteration-time CSV (columns chunk_tokens, "
            "iteration_seconds, optional decodes and mode; see docs/calibration.md). Decode-only rows "
            "(chunk_tokens = 0) give tau_solo. With --vidur DIR --gpu G --model M --tp N, compose iterations "
            "from Vidur's published operator profiles instead and fit them. With --list, show the named GPU profiles."
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
    p.add_argument("--threshold", type=int, metavar="B", help="generalised profile (a CSV with a kind column): the "
                   "decode batch size where the coefficients switch (default: searched)")
    v = p.add_argument_group("published operator profiles (Vidur; docs/calibration.md)")
    v.add_argument("--vidur", metavar="DIR", help="Vidur profiling folder (compute/GPU/ORG/MODEL/mlp.csv)")
    v.add_argument("--gpu", help="GPU of the tables: a100, a40 or h100")
    v.add_argument("--model", help="model as in the folder, e.g. meta-llama/Llama-2-70b-hf")
    v.add_argument("--tp", type=int, help="tensor-parallel degree (GPUs per replica)")
    v.add_argument("--layers-from", metavar="MODEL", help="a model with the same layer shapes whose table on --gpu "
                   "stands in for a missing one (e.g. meta-llama/Llama-2-70b-hf for Meta-Llama-3-70B on h100)")
    return p


def _fmt(x: float) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.5g}"


def _list(args: argparse.Namespace) -> int:
    from fluidopt.calibration.profiles import list_profiles

    df = list_profiles()
    if args.json:
        records = {
            name: {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
            for name, row in df.to_dict(orient="index").items()
        }
        print(json.dumps(records, indent=2))
        return 0
    cols = ["alpha", "beta", "tau_solo", "gamma", "chunk", "batch", "tau_mix", "r2"]
    # every column as wide as its longest entry: a cut name ("CodeLlama-34b-I") cannot be looked up
    models = [str(m).split("/")[-1] for m in df["model"]]
    hardware = [str(h) for h in df["hardware"]]
    w = max(len("name"), *(len(str(n)) for n in df.index)) + 2
    wm = max(len("model"), *map(len, models)) + 2
    wh = max(len("hardware"), *map(len, hardware)) + 1
    header = f"{'name':<{w}}{'model':<{wm}}{'hardware':<{wh}}{'gpus':>5}" + "".join(f"{c:>11}" for c in cols)
    print(header)
    for (name, row), model, hw in zip(df.iterrows(), models, hardware):
        cells = "".join(f"{_fmt(row[c]):>11}" for c in cols)
        print(f"{name:<{w}}{model:<{wm}}{hw:<{wh}}{int(row['gpus']):>5}{cells}")
    print("\nunits: alpha, tau_solo, tau_mix in s; beta in s/token; gamma in tokens/s; chunk in tokens; gpus per replica.")
    print('Use one in a scenario with  gpu = "<name>"; sources: fluidopt calibrate --list --json')
    return 0


def _vidur(args: argparse.Namespace) -> int:
    from fluidopt.core.errors import UsageError

    if args.csv:
        raise UsageError(f"give either a measurement CSV ({args.csv!r}) or --vidur DIR, not both")
    for flag in ("gpu", "model", "tp"):
        if getattr(args, flag) is None:
            raise UsageError(f"--vidur needs --{flag} (e.g. --gpu h100 --model meta-llama/Llama-2-70b-hf --tp 4)")
    if args.robust:
        raise UsageError("--robust: not with --vidur (composed iterations carry no measurement noise)")
    if args.chunk is not None and args.chunk < 1:
        raise UsageError(f"--chunk: expected an integer >= 1 (tokens), got {args.chunk}")
    if args.batch is not None and args.batch < 1:
        raise UsageError(f"--batch: expected an integer >= 1 (requests per replica), got {args.batch}")
    from fluidopt.calibration.vidur import from_vidur
    from fluidopt.core.errors import CalibrationError as CE

    try:
        v = from_vidur(args.vidur, args.gpu, args.model, args.tp, chunk=args.chunk, batch=args.batch,
                       layers_from=args.layers_from)
    except CE as e:
        raise UsageError(str(e)) from None
    if args.plot:
        fig = v.fit.plot()
        fig.axes[0].set_title(f"{v.name}: composed from Vidur operator profiles")
        try:
            fig.savefig(args.plot, dpi=120)
        except (OSError, ValueError) as e:
            raise CalibrationError(f"--plot {args.plot!r}: cannot write the plot: {e}") from None
    if args.json:
        d = v.to_dict()
        if args.plot:
            d["plot"] = str(Path(args.plot))
        print(json.dumps(d, indent=2))
    elif args.toml:
        prof = v.to_profile()
        print(f"# composed from {v.table.path} (R^2 = {v.fit.r2:.4f}); one replica of {v.table.tp} GPU(s)")
        print("[gpu]")
        print(f'name = "{prof.name}"')
        for k in ("alpha", "beta", "tau_solo", "chunk", "batch", "kv_capacity", "kv_time_per_token"):
            print(f"{k} = {getattr(prof, k)!r}")
    else:
        print(v.summary())
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.list:
        return _list(args)
    if args.vidur is not None:
        return _vidur(args)
    for flag in ("gpu", "model", "tp", "layers_from"):
        if getattr(args, flag) is not None:
            raise CalibrationError(f"--{flag.replace('_', '-')}: only with --vidur DIR (Vidur's published operator "
                                   "profiles)")
    if not args.csv:
        raise CalibrationError("give a measurement CSV (fluidopt calibrate PROFILE.csv) or --list")
    if args.toml and (args.chunk is None or args.batch is None):
        raise CalibrationError("--toml needs --chunk C and --batch B (serving settings, not fitted)")

    if _is_generalised(args.csv):
        return _generalised(args)
    if args.threshold is not None:
        raise CalibrationError("--threshold: only with a generalised profile (a CSV with a kind column; "
                               "docs/calibration.md)")
    from fluidopt.calibration.fit import fit_iteration_time

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


def _is_generalised(path: str) -> bool:
    """A profile CSV of the generalised law (docs/calibration.md) has a ``kind`` column in its header."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            for line in f:
                if line.split("#", 1)[0].strip():
                    return "kind" in [c.strip() for c in line.split(",")]
    except (OSError, UnicodeDecodeError):
        pass  # the ordinary reader reports it
    return False


def _generalised(args: argparse.Namespace) -> int:
    """Fit the straight line and the generalised law to a profile CSV; say which predicts held-out
    iterations better."""
    for flag in ("plot", "chunk", "batch"):
        if getattr(args, flag) is not None:
            raise CalibrationError(f"--{flag}: not with a generalised profile (a CSV with a kind column)")
    if args.robust or args.toml:
        raise CalibrationError(f"--{'robust' if args.robust else 'toml'}: not with a generalised profile (a CSV with a "
                               "kind column)")
    if args.threshold is not None and args.threshold < 1:
        raise CalibrationError(f"--threshold: expected an integer >= 1 (requests), got {args.threshold}")
    from fluidopt.calibration.timemodels import fit_time_models, read_profile_csv

    fits = fit_time_models(read_profile_csv(args.csv), threshold=args.threshold)
    if args.json:
        print(json.dumps(fits.to_dict(), indent=2))
    else:
        print(fits.summary())
    return 0
