"""``fluidopt simulate``: run a policy on a scenario in the many-server simulator and print its metrics."""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Any

from fluidopt.commands._checks import check_output_file, check_positive_int
from fluidopt.commands._options import (
    add_controller_arguments,
    add_trace_arguments,
    format_policies,
    import_user_modules,
    parse_options,
    replay_from_args,
)

EPILOG = """\
examples:
  fluidopt simulate --policy fi-wsp --horizon 2000 --warmup 200
  fluidopt simulate scenario.toml --policy round-robin --service tokens --gpus 8 --horizon 600 --json
  fluidopt simulate --policy fi-wsp --horizon 100 --records requests.csv
  fluidopt simulate --list-policies
  fluidopt simulate --policy jsq --option predictor=oracle --gpus 8 --service tokens --horizon 300
  fluidopt simulate --import examples/custom_controller.py --policy class-affinity --horizon 300
  fluidopt simulate scenario.toml --trace requests.csv --service tokens --policy jsq --horizon 600

Metrics exclude the warm-up; rates, occupancies and queues are per GPU (docs/simulator.md). Ctrl-C
(or SIGTERM) stops the run between two events and prints the partial result, flagged as interrupted
(exit status 130, or 143 for SIGTERM); --records FILE is then written as FILE.interrupted.csv.
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "simulate",
        help="simulate a policy on a scenario (stochastic many-server simulator)",
        description=(
            "Run a controller (a registered policy) on a scenario in the event-driven many-server simulator "
            "and print revenue, throughput, abandonment, latency and occupancy metrics with 95% batch-means "
            "confidence intervals."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("scenario", nargs="?", default=None, metavar="SCENARIO",
                   help="scenario TOML file (default: the built-in paper two-class instance)")
    p.add_argument("--policy", default=None, metavar="NAME", help="registered policy name (see --list-policies)")
    p.add_argument("--gpus", type=int, default=None, metavar="N",
                   help="number of GPUs (arrival rates scale to keep the per-GPU load)")
    p.add_argument("--horizon", type=float, default=None, metavar="T", help="simulated seconds (default 1000, or "
                   "the scenario's [workflow] horizon)")
    p.add_argument("--warmup", type=float, default=None, metavar="W",
                   help="warm-up seconds excluded from the metrics (default: 10%% of the horizon; 0 with a workflow)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="random seed (default 0)")
    p.add_argument("--service", choices=("markov", "tokens"), default=None,
                   help="markov: the paper's exponential model; tokens: integer token lengths (default markov; "
                   "tokens for a scenario with a KV model, a timemodel or a workflow)")
    p.add_argument("--records", default=None, metavar="FILE", help="write one CSV row per request to FILE")
    p.add_argument("--sample-interval", type=float, default=None, metavar="S",
                   help="sample the state every S seconds (shown only with --json as 'timeseries_rows')")
    p.add_argument("--batches", type=int, default=20, metavar="K", help="batches for the confidence intervals (20)")
    p.add_argument("--drain", type=float, default=None, metavar="S",
                   help="go on up to S seconds past the horizon until the requests that arrived in the window "
                        "resolve, and report their (arrival-cohort) revenue too (fluidopt.sim.cohort)")
    prog = p.add_mutually_exclusive_group()
    prog.add_argument("--progress", dest="progress", action="store_true", default=None,
                      help="show progress on stderr (default: on, without --json; a line rewritten every second on a "
                           "terminal, else a plain line every 5 s)")
    prog.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--timemodel", default=None, metavar="FILE",
                   help="time the GPUs' iterations with the generalised law of FILE's [timemodel] table (seconds; "
                        "as `fluidopt validate --fit-overheads` writes it), and take FILE's [engine] kv_tokens, when "
                        "it has one, as their KV capacity (docs/simulator.md section 1.3); implies --service tokens")
    p.add_argument("--backend", choices=("auto", "compiled", "python"), default="auto",
                   help="event engine: the compiled core or pure Python (same numbers; default auto)")
    p.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false", default=None,
                   help="with --trace: no prefix (KV) cache; by default a trace whose requests carry block hashes "
                        "(JSON lines) runs with one cache per instance and only uncached prompt tokens are prefilled")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--list-policies", action="store_true", help="list the registered policies and exit")
    add_controller_arguments(p)
    add_trace_arguments(p)
    return p


def _fmt(v: Any, digits: int = 5) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.{digits}g}"
    return str(v)


def format_result(res: Any, priced: bool = True) -> str:
    """Plain-text report of a SimResult. ``priced=False`` (a scenario whose every request is worth 0, such as
    Chiron's workflow): the revenue line says the scenario is unpriced instead of reporting 0 +/- 0."""
    s = res.summary()
    cl = res.cluster
    if len(res.per_class.columns) == 0:  # interrupted before the warm-up ended: nothing measured
        return (f"simulate: policy {res.policy!r} on {res.scenario!r}: interrupted at t = {res.t_end:g} s, before the "
                f"warm-up ended ({res.warmup:g} s): no metrics; {s['requests']} requests simulated")
    lines = [
        (f"simulate: policy {res.policy!r} on {res.scenario!r}, {res.n_gpus} GPUs, service {res.service}, "
         f"seed {res.seed}" + ("  [INTERRUPTED]" if res.interrupted else "")),
        (f"  window {res.warmup:g} .. {res.t_end:g} s; {s['requests']} requests ({s['completed']} completed, "
         f"{s['abandoned']} abandoned, {s['dropped']} dropped, {s['in_system']} in system); "
         f"{res.wall_seconds:.2f} s wall, {s['requests'] / max(res.wall_seconds, 1e-9):,.0f} requests/s"
         + (f" ({res.meta['engine']} engine)" if "engine" in res.meta else "")),
        "",
        (f"  revenue per GPU per s   bundled {_fmt(cl['revenue_per_gpu'], 6)} +/- {_fmt(cl['revenue_per_gpu_ci'], 2)}"
         f"   separate {_fmt(cl['revenue_per_gpu_separate'], 6)} +/- {_fmt(cl['revenue_per_gpu_separate_ci'], 2)}"
         if priced else "  revenue: none, the scenario is unpriced (every token price is 0); throughput, latency and "
                        "SLO attainment below measure it"),
        (f"  throughput {_fmt(cl['throughput'])} per GPU per s; abandoned {_fmt(cl['abandoned_fraction'], 4)}; "
         f"TTFT mean {_fmt(cl['ttft_mean'], 4)} s; e2e mean {_fmt(cl['e2e_mean'], 4)} s "
         f"(p50 {_fmt(cl['e2e_p50'], 4)}, p90 {_fmt(cl['e2e_p90'], 4)}, p99 {_fmt(cl['e2e_p99'], 4)})"),
        (f"  GPUs busy {_fmt(cl['gpu_busy_fraction'], 4)}, mixed {_fmt(cl['mixed_gpu_fraction'], 4)}; "
         f"slot utilisation {_fmt(cl['slot_utilisation'], 4)}; preemptions {cl['preemptions']}"),
        "",
    ]
    import pandas as pd

    cols = ["throughput", "abandoned_fraction", "ttft_mean", "ttft_p99", "e2e_mean", "e2e_p99", "x_mean",
            "y_mixed_mean", "y_solo_mean", "q_prefill_mean", "q_decode_mean"]
    df = res.per_class[cols]
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.5g}".format):
        lines.append("  per class (rates, occupancies and queues per GPU; times in seconds):")
        lines += ["    " + ln for ln in df.to_string().splitlines()]
    lines += _slo_lines(res)
    if res.records_path:
        lines += ["", f"  records: {res.records_path}"]
    return "\n".join(lines)


def _slo_lines(res: Any) -> list[str]:
    """GPU-hours and each SLO class's attainment (classes with ttft_slo / itl_slo / deadline)."""
    pc = res.per_class
    if "slo_requests" not in pc.columns or not (pc["slo_requests"] > 0).any():
        return []
    parts = []
    for name, r in pc.iterrows():
        if r["slo_requests"] > 0:
            left = int(r["arrived"] - r["completed"] - r["abandoned"])
            parts.append(f"{name} {r['slo_attainment']:.4f} ({int(r['slo_met'])} of {int(r['slo_requests'])} met; "
                         f"{int(r['completed'])} completed" + (f", {left} not done at the end" if left > 0 else "") + ")")
    return ["", f"  GPU-hours {res.gpu_hours:.4g} (time 0 to {res.t_end:g} s); SLO attainment: " + "; ".join(parts)]


def run(args: argparse.Namespace) -> int:
    from fluidopt.core.errors import UsageError
    from fluidopt.scenario import load_scenario

    options = parse_options(args.option)
    # The values given are checked before what is missing: `--horizon -5` without --policy names the horizon.
    check_positive_int(args.gpus, "--gpus")
    check_positive_int(args.batches, "--batches", minimum=2, maximum=10_000)
    if not args.list_policies:
        _check_given_window(args)
    if not args.list_policies and not args.policy:
        raise UsageError("--policy: a policy name is required (see fluidopt simulate --list-policies)")
    check_output_file(args.records, "--records")
    # Input first, the simulator and controller stack (seconds to import) only once it is valid.
    scenario = load_scenario(args.scenario) if not args.list_policies else None
    if args.timemodel is not None and scenario is not None:
        from dataclasses import replace

        from fluidopt.calibration.timemodels import load_time_model_file

        law, kv = load_time_model_file(args.timemodel)
        kw = {} if kv is None else {"kv_capacity": float(kv)}
        scenario = replace(scenario, gpu=replace(scenario.gpu, timemodel=law, **kw))
    from fluidopt.control.registry import make_controller
    from fluidopt.sim.api import RunWindow, simulate
    from fluidopt.sim.limits import check_size

    import_user_modules(args.imports)
    if args.list_policies:
        print(format_policies())
        return 0
    if args.gpus is not None:
        scenario = scenario.with_gpus(args.gpus)
    # a workflow scenario (issue 31) carries its own horizon and runs in tokens mode from t = 0
    wf = scenario.workflow
    if args.horizon is None:
        args.horizon = wf.horizon if wf is not None and wf.horizon is not None else 1000.0
    if args.service is None:
        g = scenario.gpu
        tokens = wf is not None or g.kv_time_per_token or g.kv_capacity is not None or g.timemodel is not None
        args.service = "tokens" if tokens else "markov"
    warmup = (0.0 if wf is not None else 0.1 * args.horizon) if args.warmup is None else args.warmup
    window = RunWindow(args.horizon, warmup, args.service, args.sample_interval, args.drain)  # the one check
    if args.prefix_cache is False and args.trace is None:
        raise UsageError("--no-prefix-cache: only used with --trace (the cache reads a trace's block hashes)")
    scenario, workload = replay_from_args(args, scenario)
    if workload is None:
        check_size(scenario, args.horizon)
    else:
        _warn_trace_load(workload, scenario, args.gpus)
    cached = [c.name for c in scenario.classes if c.hit_ratio > 0]
    if cached:  # the fluid numbers count the cache; a run would silently not
        import warnings

        warnings.warn(f"classes {', '.join(cached)}: the simulator does not read hit_ratio; its prefix cache works "
                      "from a trace's block hashes (--trace), and without them every prompt token is prefilled "
                      "(docs/prefix-cache.md)", UserWarning, stacklevel=1)
    controller = make_controller(args.policy, scenario, **options)
    # progress by default, also when stderr is not a terminal (then a plain line every few seconds:
    # fluidopt.sim.bookkeeping.LOG_EVERY); --json alone keeps stderr quiet unless --progress is given
    progress = (not args.json) if args.progress is None else args.progress
    res = simulate(scenario, controller, window=window, seed=args.seed, records=args.records, progress=progress,
                   batches=args.batches, backend=args.backend, workload=workload, prefix_cache=args.prefix_cache)
    if res.interrupted and res.records_path:
        # the rows of a run cut short are kept, under a name that says so: never as a finished run's records
        from pathlib import Path

        p = Path(res.records_path)
        cut = p.with_name(f"{p.stem}.interrupted{p.suffix}")
        os.replace(p, cut)
        from dataclasses import replace

        res = replace(res, records_path=str(cut))
    if args.json:
        out = res.summary()
        if res.timeseries is not None:
            out["timeseries_rows"] = len(res.timeseries)
        if workload is not None:
            out.update(trace_totals(res, workload, scenario))
        print(json.dumps(out, indent=2, allow_nan=False))
    else:
        print(format_result(res, priced=bool((scenario.rates().w > 0).any())))
        if "cached_prompt_tokens" in res.totals:
            t = res.totals
            print(f"prefix cache: {t['cached_prompt_tokens']:,} of {t['prompt_tokens']:,} prompt tokens cached "
                  f"(hit ratio {res.cluster['hit_ratio']:.4f})")
        c = res.cluster
        if "cohort_revenue_per_gpu" in c:
            print(f"arrival cohort [{res.warmup:g}, {res.horizon:g}) s: revenue/GPU/s {c['cohort_revenue_per_gpu']:.6g} "
                  f"+/- {c['cohort_revenue_per_gpu_ci']:.3g}; {c['cohort_arrived']} arrived = {c['cohort_completed']} "
                  f"completed + {c['cohort_abandoned']} abandoned + {c['cohort_dropped']} dropped + "
                  f"{c['cohort_unresolved']} unresolved; last resolved {c['drain_seconds']:.4g} s after the horizon"
                  + ("" if c["cohort_drained"] else f" (NOT drained within {c['drain_cap']:g} s)"))
    if res.interrupted:
        import sys

        import fluidopt.core.interrupt as interrupt

        kept = f"the run to t = {res.t_end:g} s of {res.horizon:g} is reported above, flagged interrupted" + (
            f"; its records are in {res.records_path}" if res.records_path else "")
        print(interrupt.message("fluidopt simulate", interrupt.Interrupted(interrupt.pending() or 2, kept)),
              file=sys.stderr)
        return interrupt.exit_status(KeyboardInterrupt())  # 130, or 143 for SIGTERM
    return 0


def _check_given_window(args: argparse.Namespace) -> None:
    """The window flags given, checked by :class:`~fluidopt.sim.window.RunWindow` before the scenario is read
    (the default horizon comes from it; until then the largest finite one stands in, which no warm-up reaches:
    the real horizon is checked against the warm-up once known)."""
    import sys

    from fluidopt.sim.window import RunWindow

    h, w = args.horizon, args.warmup
    if h is None and w is None and args.sample_interval is None and args.drain is None:
        return
    RunWindow(sys.float_info.max if h is None else h, 0.0 if w is None else w, "markov", args.sample_interval,
              args.drain)


def trace_totals(res: Any, workload: Any, scenario: Any) -> dict:
    """The JSON totals of a --trace run that scripts rely on: ``prompt_tokens`` (of the requests whose first
    prefill completed), ``cached_prompt_tokens`` (0 without the prefix cache) and ``fluid_load`` (the
    trace's offered load over the fleet's fluid capacity, cache-blind; null when it cannot be estimated)."""
    from fluidopt.workloads.traces import fleet_load

    load = fleet_load(workload, scenario)
    return {"prompt_tokens": int(res.totals.get("prompt_tokens", res.meta["prompt_tokens"])),
            "cached_prompt_tokens": int(res.totals.get("cached_prompt_tokens", 0)),
            "fluid_load": None if load is None or not math.isfinite(load) else float(load)}


TRACE_LOAD_RANGE = (0.05, 1.0)  # a replayed trace loading the fleet outside this range gets a warning


def _warn_trace_load(workload, scenario, gpus_flag) -> None:
    """A trace replayed on a fleet it barely touches (or overloads) measures nothing useful: say so."""
    import warnings

    from fluidopt.workloads.traces import fleet_load

    load = fleet_load(workload, scenario)
    if load is None or TRACE_LOAD_RANGE[0] <= load <= TRACE_LOAD_RANGE[1]:
        return
    need = max(1, math.ceil(load * scenario.gpus))
    how = "below 5%: most GPUs stay idle" if load < TRACE_LOAD_RANGE[0] else "above 100%: requests will queue and abandon"
    warnings.warn(f"--trace: the trace loads the {scenario.gpus}-GPU fleet at {100 * load:.2g}% of its fluid "
                  f"capacity ({how}); about {need} GPUs serve it fully: try --gpus {need}", UserWarning, stacklevel=1)
