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
  fluidopt solve --layout disaggregated --tpot 0.03
  fluidopt solve s.toml --layout disaggregated --profile profiler.json --model facebook/opt-13b \\
      --prefill-tp 2 --decode-tp 1 --ttft 0.2 --tpot 0.1
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
    d = p.add_argument_group("disaggregated layout (docs/lp.md, \"Disaggregated layout\")")
    d.add_argument("--layout", choices=("colocated", "disaggregated"), default=None,
                   help="colocated: the per-GPU fluid LP; disaggregated: the LP of a prefill pool and a decode pool, "
                        "reported beside the colocated LP (default: the scenario's layout, where \"best\" is "
                        "disaggregated; colocated if it names none). The scenario's [pools] table fills the flags "
                        "below that are not given")
    d.add_argument("--prefill-tp", type=int, default=None, metavar="N", help="TP degree of a prefill instance (default 1)")
    d.add_argument("--decode-tp", type=int, default=None, metavar="N", help="TP degree of a decode instance (default 1)")
    d.add_argument("--profile", default=None, metavar="JSON",
                   help="DistServe's profiler JSON: both pools' time models at their TP degrees (default: the "
                        "scenario's GPU, TP 1 only)")
    d.add_argument("--model", default=None, metavar="NAME", help="the model in --profile (e.g. facebook/opt-13b)")
    d.add_argument("--ttft", type=float, default=None, metavar="S",
                   help="TTFT bound for every class, s (default: each class's ttft_slo)")
    d.add_argument("--tpot", type=float, default=None, metavar="S",
                   help="TPOT bound for every class, s (default: each class's itl_slo); also the colocated LP's tpot SLI")
    d.add_argument("--prefill-instances", type=int, default=None, metavar="N",
                   help="with --decode-instances: also maximise revenue on this split (shadow prices per pool)")
    d.add_argument("--decode-instances", type=int, default=None, metavar="N", help="see --prefill-instances")
    d.add_argument("--prefill-max-tokens", type=int, default=None, metavar="N",
                   help="prompt tokens per prefill batch (default 2048; a longer prompt runs alone)")
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
    layout = getattr(args, "layout", None)
    if layout is None:  # the flag overrides the scenario's layout; "best" is the comparison of both
        layout = "colocated" if scenario.layout is None or scenario.layout.kind == "colocated" else "disaggregated"
    if layout == "disaggregated":
        return _run_disaggregated(args, scenario)
    _refuse_disaggregated_flags(args)
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


_DISAGG_FLAGS = ("prefill_tp", "decode_tp", "profile", "model", "ttft", "tpot", "prefill_max_tokens",
                 "prefill_instances", "decode_instances")


def _refuse_disaggregated_flags(args: argparse.Namespace) -> None:
    from fluidopt.core.errors import UsageError

    for flag in _DISAGG_FLAGS:
        if getattr(args, flag, None) is not None:
            raise UsageError(f"--{flag.replace('_', '-')}: only with --layout disaggregated")


def _disagg_pools(args: argparse.Namespace, scenario: Any):
    """The two pools: from --profile at the TP degrees asked for, or from the scenario's GPU (TP 1)."""
    from fluidopt.core.errors import CalibrationError, UsageError
    from fluidopt.fluid.disaggregated import DEFAULT_MAX_TOKENS, DisaggPools, pools_of_scenario

    ptp = 1 if args.prefill_tp is None else args.prefill_tp
    dtp = 1 if args.decode_tp is None else args.decode_tp
    if dtp < 1:
        raise UsageError(f"--decode-tp {dtp}: a disaggregated layout needs a decode pool (instances of TP >= 1)")
    if ptp < 1:
        raise UsageError(f"--prefill-tp {ptp}: a disaggregated layout needs a prefill pool (instances of TP >= 1)")
    max_tokens = DEFAULT_MAX_TOKENS if args.prefill_max_tokens is None else args.prefill_max_tokens
    if max_tokens < 1:
        raise UsageError(f"--prefill-max-tokens: expected an integer >= 1, got {max_tokens}")
    if args.profile is None:
        if args.model is not None:
            raise UsageError("--model: only with --profile JSON")
        for flag, tp in (("--prefill-tp", ptp), ("--decode-tp", dtp)):
            if tp != 1:
                raise UsageError(f"{flag} {tp}: the scenario's GPU profile has TP degree 1 only; give --profile JSON "
                                 "--model NAME for other degrees")
        return pools_of_scenario(scenario, max_tokens=max_tokens)
    if args.model is None:
        raise UsageError("--profile: needs --model NAME (e.g. facebook/opt-13b)")
    from pathlib import Path

    from fluidopt.calibration.timemodels import load_distserve_profile
    from fluidopt.commands.validate import _kv_beside
    from fluidopt.engines.disaggregated import MODEL_SHAPES, check_fits, model_kv_bytes

    try:
        pre = load_distserve_profile(args.profile, args.model, ptp)
        dec = load_distserve_profile(args.profile, args.model, dtp)
    except CalibrationError as e:
        raise UsageError(str(e)) from None
    check_fits(args.model, ptp, what="--prefill-tp")
    check_fits(args.model, dtp, what="--decode-tp")
    kv = _kv_beside(Path(args.profile), args.model, dtp)
    if kv is None and args.model in MODEL_SHAPES:
        # no measured capacity: what 90% of an 80 GB GPU leaves after the weights (check_fits's assumption)
        kv = (0.9 * 80e9 * dtp - MODEL_SHAPES[args.model]["params"] * 2) / model_kv_bytes(args.model)
    return DisaggPools(pre, dec, ptp, dtp, kv_tokens=math.inf if kv is None else float(kv), max_tokens=max_tokens)


def format_comparison(cmp: dict) -> str:
    """Plain-text report of :func:`fluidopt.fluid.disaggregated.compare_layouts`."""
    co, di, mg = cmp["colocated"], cmp["disaggregated"], cmp["disaggregated_min_gpus"]
    lines = [
        f"fluid LP, layouts compared: scenario {cmp['scenario']!r}, {cmp['gpus']} GPUs, bundled prices, "
        f"prefill TP {cmp['prefill_tp']}, decode TP {cmp['decode_tp']}",
        "",
        f"  {'layout':<15} {'goodput/GPU':>12} {'served/GPU':>11} {'revenue/GPU/s':>14}  GPU shadow price (revenue/s)",
        f"  {'colocated':<15} {_fmt(co['goodput_per_gpu']):>12} {_fmt(co['served_per_gpu']):>11} "
        f"{_fmt(co['revenue_per_gpu']):>14}  {_fmt(co['gpu_shadow_price'])}",
        f"  {'disaggregated':<15} {_fmt(di['goodput_per_gpu']):>12} {_fmt(di['served_per_gpu']):>11} "
        f"{_fmt(di['revenue_per_gpu']):>14}  prefill {_fmt(di['gpu_shadow_price']['prefill'])}, "
        f"decode {_fmt(di['gpu_shadow_price']['decode'])}",
        "  (goodput: the most requests/s per GPU served in full at the scenario's class mix; served and revenue:",
        "   on the scenario's GPUs at its load)",
        "",
        f"  winner: {cmp['winner']} (disaggregated goodput per GPU {cmp['goodput_gain']:+.2%}, "
        f"revenue per GPU {cmp['revenue_gain']:+.2%})",
        f"  split on {cmp['gpus']} GPUs: {_fmt(di['prefill_instances'])} prefill + "
        f"{_fmt(di['decode_instances'])} decode instances",
    ]
    if mg.get("status") == "optimal":
        lines.append(f"  fewest GPUs for the whole load: {_fmt(mg['gpus'])} ({_fmt(mg['prefill_instances'])} prefill + "
                     f"{_fmt(mg['decode_instances'])} decode instances)")
    else:
        lines.append(f"  fewest GPUs for the whole load: none ({mg.get('message', '')})")
    fx = cmp.get("disaggregated_fixed_split")
    if fx is not None:
        lines.append(f"  on {_fmt(fx['prefill_instances'])} prefill + {_fmt(fx['decode_instances'])} decode instances "
                     f"({_fmt(fx['gpus'])} GPUs): revenue/GPU/s {_fmt(fx['revenue_per_gpu'])}, GPU shadow price "
                     f"prefill {_fmt(fx['gpu_shadow_price']['prefill'])}, decode {_fmt(fx['gpu_shadow_price']['decode'])}")
    lines += ["", "per class (disaggregated, revenue on the fleet; rates per second, cluster):",
              f"  {'class':<16} {'served':>10} {'prefill inst':>12} {'decode inst':>12} {'prompts/batch':>13} "
              f"{'decode batch':>12} {'step s':>10}"]
    for name, c in di["classes"].items():
        lines.append(f"  {name:<16} {_fmt(c['served']):>10} {_fmt(c['prefill_instances']):>12} "
                     f"{_fmt(c['decode_instances']):>12} {_fmt(c['prefill_batch']):>13} {_fmt(c['decode_batch']):>12} "
                     f"{_fmt(c['step_s']):>10}")
    return "\n".join(lines)


# the [pools] fields of a scenario that solve --layout disaggregated reads, by its flags' dests
SOLVE_FIELDS = ("prefill_tp", "decode_tp", "profile", "model", "prefill_instances", "decode_instances",
                "prefill_max_tokens")


def _run_disaggregated(args: argparse.Namespace, scenario: Any) -> int:
    from fluidopt.commands.placement import take_from_layout
    from fluidopt.core.errors import UsageError
    from fluidopt.fluid.sli import parse_slis

    take_from_layout(args, scenario.layout, SOLVE_FIELDS, str(args.scenario))

    if args.pricing != "bundled":
        raise UsageError("--pricing separate: the disaggregated layout is priced bundled (per served request) only")
    if args.no_lexicographic:
        raise UsageError("--no-lexicographic: only with --layout colocated")
    for flag in ("ttft", "tpot"):
        v = getattr(args, flag)
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise UsageError(f"--{flag}: expected seconds > 0, got {v:g}")
    split = None
    if args.prefill_instances is not None or args.decode_instances is not None:
        if args.decode_instances is None or args.prefill_instances is None:
            raise UsageError("--prefill-instances and --decode-instances: give both (a disaggregated layout has a "
                             "prefill pool and a decode pool)")
        if args.decode_instances < 1:
            raise UsageError(f"--decode-instances {args.decode_instances}: a disaggregated layout needs a decode pool "
                             "(N >= 1)")
        if args.prefill_instances < 1:
            raise UsageError(f"--prefill-instances {args.prefill_instances}: a disaggregated layout needs a prefill "
                             "pool (N >= 1)")
        split = (args.prefill_instances, args.decode_instances)
    if args.gpus is not None:
        scenario = scenario.with_gpus(args.gpus)
    pools = _disagg_pools(args, scenario)
    slis = parse_slis(args.sli, where="--sli")  # compare_layouts adds the scenario's own
    from fluidopt.fluid.disaggregated import compare_layouts

    cmp = compare_layouts(scenario, pools, ttft=args.ttft, tpot=args.tpot, slis=slis, split=split)
    print(json.dumps(cmp, indent=2) if args.json else format_comparison(cmp))
    return 0
