"""``fluidopt stability``: find where one engine instance stops being stable, beside Li-Dai-Peng's formula."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from fluidopt.core.errors import UsageError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "stability",
        help="simulated stability boundary of one engine against lam* = b / (t_b (m_p + m_d)) (docs/theory.md)",
        description=(
            "Replay Poisson arrivals at a grid of rates through one engine instance, test the number in system "
            "for growth (batch means, one-sided t test), bisect between the largest stable and the smallest "
            "unstable rate, and print the simulated boundary beside Li-Dai-Peng's closed form (requests/s). "
            "SCENARIO: short, long, mixed, counterexample, or a TOML file with a [scenario] table "
            "(a, beta in s and s/token; budget in tokens; prompt, output = [lo, hi] tokens, uniform)."
        ),
    )
    p.add_argument("scenario", metavar="SCENARIO", help="built-in scenario name or TOML file")
    p.add_argument("--engine", default="chunked", help="chunked (token budget, work-conserving) or vllm "
                   "(prefill-first, whole prompts); default chunked")
    p.add_argument("--budget", type=int, metavar="TOKENS", help="tokens per iteration b (default: the scenario's)")
    p.add_argument("--rates", metavar="R1,R2,...", help="rate grid, requests/s (default: 0.5 .. 1.2 x lam*)")
    p.add_argument("--requests", type=int, default=20000, help="requests per run (default 20000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the arrivals and lengths (default 0)")
    p.add_argument("--confidence", type=float, default=0.99, help="confidence of the growth test (default 0.99)")
    p.add_argument("--out", metavar="DIR", help="folder for the figure (default: the current folder)")
    p.add_argument("--no-figure", action="store_true", help="write no figure")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _rates(text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--rates {text!r}: expected comma-separated requests/s > 0") from None
    if not vals or any(not (math.isfinite(v) and v > 0) for v in vals):
        raise UsageError(f"--rates {text!r}: expected comma-separated requests/s > 0")
    return vals


def _scenario(name: str):
    from fluidopt.core.errors import ScenarioError
    from fluidopt.engines.stability import SCENARIOS, StabilityScenario, get_scenario

    if name in SCENARIOS or not name.endswith(".toml"):
        return get_scenario(name)
    import tomllib

    from fluidopt.core.files import read_text_file

    text = read_text_file(Path(name), "scenario", UsageError)
    try:
        t = tomllib.loads(text).get("scenario")
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"scenario file {name!r}: not valid TOML: {' '.join(str(e).split())}") from None
    if not isinstance(t, dict):
        raise UsageError(f"scenario file {name!r}: no [scenario] table")
    try:
        return StabilityScenario(Path(name).stem, t.get("a"), t.get("beta"), t.get("budget"),
                                 tuple(t.get("prompt", ())), tuple(t.get("output", ())))
    except (ScenarioError, TypeError, ValueError) as e:
        raise UsageError(f"scenario file {name!r}: {' '.join(str(e).split()) or 'expected a, beta, budget, prompt, output'}") from None


def run(args: argparse.Namespace) -> int:
    from fluidopt.commands._checks import check_output_dir, check_positive_int
    from fluidopt.engines.stability import check_engine

    check_positive_int(args.requests, "--requests", minimum=100, maximum=10_000_000)
    if args.budget is not None:
        check_positive_int(args.budget, "--budget")
    if not 0 < args.confidence < 1:
        raise UsageError(f"--confidence: expected a number in (0, 1), got {args.confidence}")
    rates = _rates(args.rates)
    s = _scenario(args.scenario)
    if args.budget is not None:
        s = s.with_budget(args.budget)
    check_engine(s, args.engine)
    if not args.no_figure:
        check_output_dir(args.out or ".", "--out")

    from fluidopt.engines.stability import plot_growth, stability_boundary

    rep = stability_boundary(s, args.engine, rates, requests=args.requests, seed=args.seed, confidence=args.confidence)
    fig = None
    if not args.no_figure:
        out = Path(args.out or ".")
        out.mkdir(parents=True, exist_ok=True)
        fig = out / f"stability-{s.name}-{args.engine}-b{s.budget}.png"
        plot_growth(rep, fig)
    if args.json:
        obj = rep.to_dict()
        obj["figure"] = None if fig is None else str(fig)
        print(json.dumps(obj, indent=2))
        return 0
    sim = rep.boundary_simulated
    print(f"scenario {s.name}, engine {args.engine}: b = {s.budget} tokens, t_b = {1e3 * s.t_b:.4g} ms, "
          f"m_p = {s.m_p:g}, m_d = {s.m_d:g} tokens")
    print(f"closed form lam* = b / (t_b (m_p + m_d)) = {rep.boundary_closed_form:.4g} requests/s")
    if sim is None:
        lo, hi = rep.bracket
        where = "above the grid" if hi is None else "below the grid"
        print(f"simulated boundary: {where} (largest stable {lo}, smallest unstable {hi} requests/s)")
    else:
        print(f"simulated boundary = {sim:.4g} requests/s ({100 * rep.relative_error:+.2f}% of lam*; bracket "
              f"{rep.bracket[0]:.4g} .. {rep.bracket[1]:.4g}, growth test at {100 * rep.confidence:g}% confidence)")
    if rep.throughput_saturated is not None:
        print(f"completion rate in overload = {rep.throughput_saturated:.4g} requests/s")
    print(f"{'rate':>9} {'load':>6} {'growth/s':>9} {'p':>7} {'N mean':>8}  verdict")
    for c in rep.checks:
        print(f"{c.rate:9.4g} {c.load:6.3f} {c.test.slope:9.3g} {c.test.p_value:7.3g} {c.test.mean_in_system:8.1f}  "
              f"{'unstable' if c.unstable else 'stable'}")
    if fig is not None:
        print(f"figure: {fig}")
    return 0
