"""``fluidopt solve``: solve the steady-state fluid LP of a scenario and print the operating point.

Pyomo and HiGHS are imported inside :func:`run`, so that ``fluidopt --help`` and other subcommands
do not pay for them.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

PRICINGS = ("bundled", "separate")  # = fluidopt.fluid.lp.PRICINGS, repeated to keep this import light

EPILOG = """\
SLIs (repeat --sli; docs/lp.md):
  tpot=SECONDS              average time per output token <= SECONDS
  prefill_fairness=ETA      max_i x_i - min_i x_i <= ETA (prefill occupancy per GPU)
  decode_fairness=ETA       max_i y_solo,i - min_i y_solo,i <= ETA (solo decode slots per GPU)
  served:CLASS=FRACTION     served fraction of CLASS >= FRACTION (0..1)
  wait:CLASS=SECONDS        mean prefill wait of CLASS <= SECONDS
  append :penalty=WEIGHT    make it soft: pay WEIGHT per unit of violation (revenue per GPU per s)
With any SLI the decode buffer is forced empty (q_decode = 0).

examples:
  fluidopt solve
  fluidopt solve scenario.toml --pricing separate --json
  fluidopt solve --sli tpot=0.0242 --sli served:short-prompt=0.95
  fluidopt solve --sli tpot=0.023:penalty=1e5 --sli wait:long-prompt=2.0
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "solve",
        help="solve the steady-state fluid LP (revenue-optimal prefill occupancy and decode placement)",
        description=(
            "Solve the per-GPU fluid LP of a scenario (bundled: paper Eq. 40; separate: Eq. 42) with HiGHS "
            "and print the optimal operating point: per-class prefill occupancy x, decode slots on mixed and "
            "solo GPUs, queues, throughput, the number of mixed GPUs M = ceil(n sum x), and shadow prices."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("scenario", nargs="?", default=None, metavar="SCENARIO",
                   help="scenario TOML file (default: the built-in paper two-class instance)")
    p.add_argument("--pricing", choices=PRICINGS, default="bundled",
                   help="bundled (w_i per completed request) or separate (per prefill and per decode); default bundled")
    p.add_argument("--sli", action="append", default=[], metavar="SPEC",
                   help="add an SLI, e.g. tpot=0.03, served:CLASS=0.9, wait:CLASS=2.0, prefill_fairness=0.05, "
                        "tpot=0.03:penalty=100 (repeatable; see below)")
    p.add_argument("--gpus", type=int, default=None, metavar="N",
                   help="fleet size for the cluster totals and M (arrival rates scale to keep the per-GPU load, "
                        "so the per-GPU answer is the same; default: the scenario's)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    from fluidopt.commands._cache import add_cache_arguments

    add_cache_arguments(p)
    p.add_argument("--no-lexicographic", action="store_true",
                   help="return HiGHS's first optimal vertex (skip the second stage that empties the decode buffer)")
    return p


def _fmt(v: float, digits: int = 6) -> str:
    return "nan" if math.isnan(v) else f"{v:.{digits}g}"


def format_solution(sol: Any) -> str:
    """Human-readable report of a FluidSolution (tables in plain text)."""
    import pandas as pd

    lines = [
        (f"fluid LP: scenario {sol.scenario_name!r}, {sol.pricing} pricing, {sol.gpus} GPUs: {sol.status} "
         f"(HiGHS, {sol.solve_seconds * 1e3:.1f} ms)"),
        "",
        (f"  objective           {_fmt(sol.objective_per_gpu, 8)} per GPU per s   "
         f"{_fmt(sol.objective, 8)} per s (cluster)"),
    ]
    if sol.penalty_per_gpu:
        lines.append(f"  revenue / penalty   {_fmt(sol.revenue_per_gpu, 8)} / {_fmt(sol.penalty_per_gpu, 6)} per GPU per s")
    lines += [
        (f"  prefill occupancy   {_fmt(sol.prefill_occupancy)} (sum x)   mixed GPUs M = {sol.mixed_gpus}, "
         f"solo GPUs = {sol.solo_gpus}"),
        f"  TPOT                {_fmt(sol.tpot)} s per output token",
        f"  GPU shadow price    {_fmt(sol.gpu_shadow_price)} per s for one more GPU",
        "",
    ]
    df = sol.to_frame()[["lam", "x", "y_mixed", "y_solo", "q_prefill", "q_decode", "throughput",
                         "served_fraction", "prefill_wait"]]
    df = df.rename(columns={"served_fraction": "served", "prefill_wait": "wait_s"})
    lines.append("per class (per GPU; rates per second):")
    lines.append(df.to_string(float_format=lambda v: f"{v:.6g}"))
    lines.append("")
    lines.append("duals (d objective / d rhs, per GPU per s):")
    duals = pd.Series(sol.duals, dtype=float, name="dual")
    lines.append(duals.to_string(float_format=lambda v: f"{v:.6g}"))
    if sol.slis:
        from fluidopt.fluid.sli import sli_spec

        lines.append("")
        lines.append("SLIs (shadow price = d objective / d bound):")
        for s in sol.slis:
            extra = f", violation {_fmt(sol.violations[s.key])}" if s.key in sol.violations else ""
            lines.append(f"  {sli_spec(s):<40} shadow price {_fmt(sol.sli_shadow_prices.get(s.key, float('nan')))}{extra}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from fluidopt.commands._checks import check_positive_int
    from fluidopt.fluid.sli import parse_slis, slis_of
    from fluidopt.scenario import load_scenario

    # Input first, the solver stack (pyomo, pandas: seconds to import) only once it is valid.
    check_positive_int(args.gpus, "--gpus")
    scenario = load_scenario(args.scenario)
    if args.gpus is not None:
        scenario = scenario.with_gpus(args.gpus)
    from fluidopt.commands._cache import apply_cache

    scenario = apply_cache(args, scenario)
    slis = (*slis_of(scenario.meta.get("slis")), *parse_slis(args.sli, where="--sli"))
    from fluidopt.fluid.lp import solve_fluid

    sol = solve_fluid(scenario, args.pricing, slis, lexicographic=not args.no_lexicographic)
    if args.json:
        print(json.dumps(sol.to_dict(), indent=2))
    else:
        print(format_solution(sol))
    return 0
