"""``fluidopt plan``: how many GPUs of which profile meet the demand and the SLIs, and what they cost."""

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
        "plan",
        help="capacity plan: fewest GPUs per profile meeting the SLIs (fluid bound + simulation check), cost",
        description="For the class arrival rates of SCENARIO (whole fleet; default: the built-in paper instance) "
        "and the SLIs given, find per GPU profile the fluid lower bound on the fleet size (one LP, binding "
        "constraint named) and the smallest fleet on which the policy meets every SLI in simulation with 95%% "
        "confidence, with cost per hour and per million output tokens. With --from-trace TRACE and no --fluid-only: "
        "the fleet for TRACE's own demand with and without a prefix cache, each verified by replaying TRACE.",
    )
    p.add_argument("scenario", nargs="?", default=None, metavar="SCENARIO", help="scenario TOML (default: built-in)")
    p.add_argument("--served", type=float, default=0.99,
                   help="completed fraction every class must reach (a request counts when its last token is out; "
                        "default 0.99)")
    p.add_argument("--tpot", type=float, default=None, help="mean time per output token bound (s)")
    p.add_argument("--ttft", type=float, default=None, help="mean time to first token bound per class (s)")
    p.add_argument("--ttft-p99", type=float, default=None, help="p99 time to first token bound per class (s; "
                   "checked in simulation)")
    p.add_argument("--fairness", type=float, default=None, help="prefill fairness bound eta (fluid bound only)")
    p.add_argument("--profiles", default=None, help="comma-separated named GPU profiles (default: the scenario's "
                   "GPU); each needs a price_per_hour or a --price")
    p.add_argument("--price", action="append", default=[], metavar="KEY=DOLLARS",
                   help="price per GPU-hour for the --profiles whose name is KEY or starts with 'KEY-' (e.g. "
                        "h100=2.5); a profile of a multi-GPU replica costs gpus x DOLLARS per hour (repeatable)")
    p.add_argument("--growth", default="1", help="comma-separated demand growth factors (default 1)")
    p.add_argument("--policy", default=None, help="controller verified in simulation (default gate-and-route; "
                   "with --from-trace and no --fluid-only: the --cache-rule's router with chunked prefill)")
    p.add_argument("--fluid-only", action="store_true", help="the fluid bound only, no simulation")
    p.add_argument("--horizon", type=float, default=None, help="simulated seconds per run (default: 3 T warm-up "
                   "+ 10 T, T the slowest mean decode)")
    p.add_argument("--warmup", type=float, default=None, help="seconds excluded from metrics")
    p.add_argument("--service", choices=("markov", "tokens"), default=None,
                   help="the simulation check's service (default markov; tokens for a scenario whose own GPU, planned "
                        "without --profiles, has a KV model or a generalised iteration-time law, [gpu.timemodel])")
    p.add_argument("--study", action="store_true", help="also the batch-size / chunk-size study (LP revenue and "
                   "TPOT against B and C) for the first profile at its planned fleet")
    p.add_argument("--out", default="", help="folder for plan.csv, curves.csv, sli_vs_n.png and the results "
                   "store (a rerun skips finished runs); default: save nothing")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    d = p.add_argument_group("GPU-hours for a day (--day: the multi-period fluid LP, docs/planning.md section 2)")
    d.add_argument("--day", action="store_true", help="plan the fleet per time slot for a day whose interactive rate "
                   "is given per slot, with the batch work done by its deadlines; report GPU-hours and cost")
    d.add_argument("--rates", default=None, metavar="FILE.csv", help="the interactive rate per slot (requests/s): a "
                   "'rate' column, one row per slot")
    d.add_argument("--trace", default=None, metavar="FILE", help="a trace (Azure LLM inference or generic CSV) whose "
                   "arrivals, binned per slot, give the interactive rates")
    d.add_argument("--slot", type=float, default=3600.0, help="slot length in seconds (default 3600)")
    d.add_argument("--backlog", action="append", default=[], metavar="CLASS=N@AT", help="N requests of batch class "
                   "CLASS arriving at AT seconds, due by the class's deadline (repeatable)")
    d.add_argument("--utilisation", type=float, default=1.0, help="target utilisation of the interactive GPUs "
                   "(default 1: the lower bound; below 1 keeps headroom)")
    d.add_argument("--min-gpus", type=float, default=0.0, help="GPUs kept in every slot (default 0)")
    d.add_argument("--max-gpus", type=int, default=None, help="the fleet's maximum (default the scenario's gpus)")
    d.add_argument("--fluid-throughputs", action="store_true", help="plan with the GPU law's fluid throughputs "
                   "(context prompt + output/2: optimistic) instead of the simulator's saturated ones")
    from fluidopt.commands.placement import add_placement_arguments

    add_placement_arguments(p)
    add_controller_arguments(p)
    from fluidopt.commands._cache import add_cache_arguments

    add_cache_arguments(p)
    add_scale_arguments(p)
    add_seed_arguments(p, seeds=5)
    return p


def _growth(text: str) -> list[float]:
    from fluidopt.core.errors import UsageError

    out = []
    for t in str(text).split(","):
        if not t.strip():
            continue
        try:
            v = float(t)
        except ValueError:
            raise UsageError(f"--growth: expected comma-separated numbers > 0, got {t.strip()!r}") from None
        if not math.isfinite(v) or v <= 0:
            raise UsageError(f"--growth: expected demand growth factors > 0, got {t.strip()!r}")
        out.append(v)
    if not out:
        raise UsageError("--growth: expected at least one factor")
    return out


def _priced(names: list[str], prices: list[str]) -> list:
    """The named profiles with ``--price KEY=DOLLARS`` (per GPU-hour) applied; a profile of a replica of
    ``gpus`` GPUs costs ``gpus * DOLLARS`` per hour. Every KEY must match one of ``names``."""
    from dataclasses import replace

    from fluidopt.calibration.profiles import load_profile, profile_info
    from fluidopt.core.errors import UsageError

    table: dict[str, float] = {}
    for text in prices:
        key, sep, val = str(text).partition("=")
        key = key.strip()
        try:
            dollars = float(val) if sep and key else math.nan
        except ValueError:
            dollars = math.nan
        if not math.isfinite(dollars) or dollars < 0:
            raise UsageError(f"--price: expected KEY=DOLLARS per GPU-hour with DOLLARS >= 0 (e.g. h100=2.5), got {text!r}")
        if not any(n == key or n.startswith(f"{key}-") for n in names):
            raise UsageError(f"--price {text!r}: {key!r} matches none of the --profiles ({', '.join(names)}); "
                             "give a profile name or its GPU prefix")
        table[key] = dollars
    out = []
    for n in names:
        g = load_profile(n)
        hits = [k for k in table if n == k or n.startswith(f"{k}-")]
        if hits:
            key = max(hits, key=len)  # an exact name wins over a GPU prefix
            g = replace(g, price_per_hour=table[key] * int(profile_info(n).get("gpus", 1)))
        out.append(g)
    return out


def run(args: argparse.Namespace) -> int:
    from fluidopt.commands._cache import apply_cache, cache_given, check_cache_simulated
    from fluidopt.core.errors import UsageError
    from fluidopt.planning.fleet import PlanSLIs
    from fluidopt.scenario import load_scenario

    import_user_modules(args.imports)
    from fluidopt.commands.placement import (
        placement_requested,
        refuse_placement_flags,
        run_placement,
        scenario_layout,
    )

    if args.layout is None and not (args.day or cache_given(args)):
        # a scenario that asks for a disaggregated layout or the best of both is planned by the placement
        # search, as with --layout (a colocated one, and every mode without layouts, plans as before)
        layout, _ = scenario_layout(args.scenario)
        if layout is not None and layout.kind != "colocated":
            args.layout = layout.kind
    if placement_requested(args):
        if args.day or cache_given(args):
            raise UsageError("--layout: not with --day, --hit-ratio or --from-trace")
        if args.workers is not None or args.dask or args.scheduler is not None:
            raise UsageError("--workers, --dask, --scheduler: not with --layout (the placement search replays in one "
                             "process)")
        return run_placement(args)
    refuse_placement_flags(args)
    if args.day and cache_given(args):
        raise UsageError("--hit-ratio, --from-trace: not with --day (the day plan's GPU law is cache-blind yet)")
    if args.day:
        return _run_day(args)
    for flag in ("rates", "trace", "backlog", "fluid_throughputs"):
        if getattr(args, flag):
            raise UsageError(f"--{flag.replace('_', '-')}: only with --day (GPU-hours for a day)")
    if args.from_trace is not None and not args.fluid_only:
        return _run_trace_plan(args)
    args.policy = args.policy or "gate-and-route"
    options = parse_options(args.option)
    check_workers(args)
    slis = PlanSLIs(served=args.served, tpot=args.tpot, ttft=args.ttft, ttft_p99=args.ttft_p99,
                    fairness=args.fairness)
    growth = _growth(args.growth)
    args.first_seed = seed_list(args)[0]
    scenario = apply_cache(args, load_scenario(args.scenario))
    if not args.fluid_only:
        check_cache_simulated(scenario, "plan")
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()] if args.profiles else None
    if args.service is None:
        g = scenario.gpu
        tokens = not profiles and (g.timemodel is not None or g.kv_capacity is not None or g.kv_time_per_token)
        args.service = "tokens" if tokens else "markov"
    if args.price:
        if not profiles:
            raise UsageError("--price: only with --profiles NAME,... (the named profiles to price)")
        profiles = _priced(profiles, args.price)
    out = Path(args.out) if args.out else None
    from fluidopt.core.files import maybe_lock

    with maybe_lock(out, "--out", "fluidopt plan"):  # created, writable, ours alone: before any work
        with say_what_is_stored(out):
            return _run_plan(args, scenario, slis, growth, profiles, options, out)


def _run_plan(args, scenario, slis, growth, profiles, options, out) -> int:
    from fluidopt.planning.fleet import batch_chunk_study, plan

    executor = None
    if not args.fluid_only:
        from fluidopt.commands._scale import make_executor

        executor = make_executor(args, runs=args.seeds)
    try:
        res = plan(scenario, slis, profiles=profiles, growth=growth, policy=args.policy, options=options or None,
                   fluid_only=args.fluid_only, seeds=args.seeds, seed=args.first_seed, horizon=args.horizon, warmup=args.warmup,
                   service=args.service, executor=executor, out=out, progress=progress_enabled(args),
                   require_price=False)  # a fleet size needs no price: the cost columns are then empty
    finally:
        if executor is not None:
            executor.close()
    study = None
    if args.study:
        first = res.table.iloc[0]
        n = int(first["n_sim"]) if math.isfinite(first["n_sim"]) else int(first["n_fluid_int"])
        from dataclasses import replace

        from fluidopt.calibration.profiles import load_profile
        from fluidopt.planning.fleet import fluid_plan_slis

        g = load_profile(profiles[0]) if profiles else scenario.gpu
        sc = replace(scenario, gpu=g, gpus=n)
        study = batch_chunk_study(sc, slis=fluid_plan_slis(sc, slis))
    files: list[str] = []
    if out is not None:
        from fluidopt.core.files import write_generation

        writers = {"plan.csv": lambda p: res.table.to_csv(p, index=False)}
        if not res.curves.empty:
            import matplotlib

            matplotlib.use("Agg")
            from fluidopt.harness.plots import save_png

            writers["curves.csv"] = lambda p: res.curves.to_csv(p, index=False)
            writers["sli_vs_n.png"] = lambda p: save_png(res.figure(), p, dpi=110)  # a pyplot figure: closed
        if study is not None:
            writers["batch_chunk.csv"] = lambda p: study.to_csv(p, index=False)
        files += [str(f) for f in write_generation(out, writers, owned=PLAN_FILES)]
    if args.json:
        d = res.to_dict()
        if study is not None:
            d["batch_chunk_study"] = json.loads(study.to_json(orient="records"))
        d["files"] = files
        print(json.dumps(d, indent=2, default=str))
        return 0
    print(f"fluidopt plan: {scenario.name}, demand {', '.join(f'{c.name} {c.rate:g}/s' for c in scenario.classes)} "
          f"(whole fleet), SLIs: {slis.describe()}")
    print()
    units: dict[str, int] = {}
    if args.profiles:
        from fluidopt.calibration.profiles import profile_info, profile_names

        units = {p: int(profile_info(p).get("gpus", 1)) if p in profile_names() else 1
                 for p in dict.fromkeys(res.table["profile"])}
    print(_report(res.table, args.fluid_only, units))
    for p, k in units.items():
        if k > 1:
            print(f"note: {p} is one replica of {k} GPUs: its fleet sizes count replicas and its price is per "
                  f"replica-hour ({k} GPUs)")
    ch = res.table[res.table["cheapest"]]
    for _, r in ch.iterrows():
        print(f"cheapest at demand x{r['growth']:g}: {r['profile']} "
              f"({r['cost_per_hour']:.2f} per hour, {r['cost_per_million_output_tokens']:.4f} per million output tokens)")
    if study is not None:
        print()
        print("batch size / chunk size study (LP at the planned fleet):")
        print(study[["batch", "chunk", "status", "revenue_per_gpu", "tpot"]].to_string(index=False))
    if files:
        print(f"\nsaved: {', '.join(files)}")
    return 0


def _run_trace_plan(args: argparse.Namespace) -> int:
    """``plan --from-trace TRACE`` without ``--fluid-only``: the fluid fleet for the trace's own demand with
    h = 0 and with the hit ratio ``--cache-rule`` keeps over the planned fleet, each verified by replaying
    the trace (fluidopt.planning.prefix; docs/prefix-cache.md, "The capacity plan")."""
    from fluidopt.commands._cache import check_cache_args
    from fluidopt.core.errors import UsageError

    check_cache_args(args)
    for flag, given in (("--hit-ratio", args.hit_ratio is not None), ("--profiles", args.profiles),
                        ("--price", args.price), ("--growth", str(args.growth).strip() != "1"),
                        ("--tpot", args.tpot is not None), ("--fairness", args.fairness is not None),
                        ("--study", args.study), ("--out", args.out), ("--horizon", args.horizon is not None),
                        ("--warmup", args.warmup is not None), ("--workers", args.workers is not None),
                        ("--dask", args.dask), ("--scheduler", args.scheduler is not None)):
        if given:
            raise UsageError(f"{flag}: not with --from-trace without --fluid-only (the plan replays the trace: its "
                             "own demand, the scenario's GPU, tokens mode)")
    served = args.served
    if isinstance(served, bool) or not (0.0 < float(served) <= 1.0):
        raise UsageError(f"--served: expected a completed fraction in (0, 1], got {served!r}")
    options = parse_options(args.option)
    from fluidopt.control.registry import available

    if args.policy is not None and args.policy.strip().lower().replace("_", "-") not in available():
        raise UsageError(f"--policy: unknown policy {args.policy!r}; see fluidopt simulate --list-policies")
    from fluidopt.planning.prefix import RULE_POLICY, TraceSLO, fluid_cache_plan, smallest_fleet
    from fluidopt.scenario import load_scenario
    from fluidopt.workloads.traces import replay

    slo = TraceSLO(served=float(served), ttft_mean=args.ttft, ttft_p99=args.ttft_p99)
    scenario, wl = replay(args.from_trace, load_scenario(args.scenario))
    if wl.hashes is None:
        raise UsageError(f"--from-trace: {args.from_trace!r} has no block hashes (expected JSON lines with hash_ids)")
    rule = args.cache_rule or "round-robin"
    kv = scenario.gpu.kv_capacity
    # the estimate's cache is the replay's: the GPU's KV in blocks unless --cache-blocks says otherwise
    blocks = args.cache_blocks or (None if kv is None else max(1, int(kv // wl.block_size)))
    seed = seed_list(args)[0]
    rows, out = [], {"trace": str(args.from_trace), "requests": int(wl.n_requests), "slo": slo.describe(),
                     "cache_rule": rule, "cache_blocks": blocks, "plans": []}
    for cached in (False, True):
        p = fluid_cache_plan(scenario, wl, rule if cached else None, capacity_blocks=blocks, served=float(served),
                             instances=args.cache_instances)
        policy = args.policy or (f"{RULE_POLICY[rule]}-chunked" if cached else "least-requests-chunked")
        n_sim, checks = smallest_fleet(scenario, wl, p.gpus, policy, slo, prefix_cache=cached,
                                       options=options or None, seed=seed)
        out["plans"].append({"cache": cached, "hit_ratio": p.hit_ratio, "ideal": p.ideal, "n_fluid": p.n_fluid,
                             "n_fluid_int": p.gpus, "binding": p.binding, "policy": policy, "n_sim": n_sim,
                             "replays": [{"gpus": c.gpus, "met": c.met, **c.metrics} for c in checks]})
        for c in checks:
            m = c.metrics
            rows.append({"plan": "cache" if cached else "no cache", "h": f"{p.hit_ratio:.4f}",
                         "n fluid": f"{p.n_fluid:.2f}", "ceil": p.gpus, "router": policy,
                         "cache": "on" if cached else "off", "GPUs": c.gpus, "hit ratio": f"{m['hit_ratio']:.3f}",
                         "served": f"{m['served']:.4f}", "mean TTFT": f"{m['ttft_mean']:.2f}",
                         "p99 TTFT": f"{m['ttft_p99']:.2f}", "SLO": "meets" if c.met else "misses"})
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    import pandas as pd

    no, yes = out["plans"]
    print(f"fluidopt plan --from-trace: {Path(args.from_trace).name} ({wl.n_requests:,} requests over "
          f"{float(wl.frame['time'].max()):,.0f} s) on {scenario.name}'s GPU; SLO: {slo.describe()}; cache rule "
          f"{rule}, {'unlimited' if blocks is None else f'{blocks:,}'} blocks per instance")
    print()
    print(pd.DataFrame(rows).to_string(index=False))
    print(f"\nplanned and verified: {no['n_sim']} GPUs without the cache, {yes['n_sim']} with it ({rule}, h "
          f"{yes['hit_ratio']:.4f}; one global cache {yes['ideal']:.4f})")
    return 0


PLAN_FILES = ("plan.csv", "curves.csv", "sli_vs_n.png", "batch_chunk.csv")


def _report(table, fluid_only: bool, units: dict[str, int] | None = None) -> str:
    """The plan's table. ``units``: GPUs per replica of each profile; with a replica of several GPUs the
    fleet sizes count replicas, so the price column is per replica-hour and says so ("$/unit-h")."""
    import pandas as pd

    units = units or {}
    replicas = any(k > 1 for k in units.values())
    rows = []
    for _, r in table.iterrows():
        row = {"profile": r["profile"]}
        if replicas:
            row["GPUs/unit"] = units.get(r["profile"], 1)
        row.update({"demand": f"x{r['growth']:g}", "n fluid": f"{r['n_fluid']:.2f}",
                    "ceil": int(r["n_fluid_int"]), "binding": r["binding"]})
        if not fluid_only:
            row["n sim"] = int(r["n_sim"])
            row["n sim - n fluid"] = int(r["correction"])
        price = "-" if not math.isfinite(r["price_per_gpu_hour"]) else f"{r['price_per_gpu_hour']:g}"
        row["$/unit-h" if replicas else "$/GPU-h"] = price
        row["cost/h"] = "-" if not math.isfinite(r["cost_per_hour"]) else f"{r['cost_per_hour']:.2f}"
        row["cost/M out tok"] = ("-" if not math.isfinite(r["cost_per_million_output_tokens"])
                                 else f"{r['cost_per_million_output_tokens']:.4f}")
        rows.append(row)
    return pd.DataFrame(rows).to_string(index=False)


def _run_day(args: argparse.Namespace) -> int:
    """``fluidopt plan --day``: the fleet per slot for the day, GPU-hours and cost."""
    from fluidopt.core.errors import UsageError
    from fluidopt.planning.day import parse_backlog, plan_day, read_rates_csv
    from fluidopt.scenario import load_scenario

    if args.rates and args.trace:
        raise UsageError("plan --day: expected one of --rates FILE and --trace FILE, got both")
    if not math.isfinite(args.slot) or args.slot <= 0:
        raise UsageError(f"--slot: expected seconds > 0, got {args.slot:g}")
    scenario = load_scenario(args.scenario)
    if not args.rates and not args.trace and scenario.workflow is None:  # a workflow gives its own rates
        raise UsageError("plan --day: expected the day's interactive rate per slot: --rates FILE.csv or --trace FILE")
    rates = read_rates_csv(args.rates) if args.rates else None
    backlogs = [parse_backlog(b) for b in args.backlog]
    if args.out:
        from fluidopt.core.files import check_writable_folder

        check_writable_folder(args.out, "--out")  # before the work, not after it
    d = plan_day(scenario, rates, trace=args.trace or None, slot=args.slot, backlogs=backlogs,
                 utilisation=args.utilisation, min_gpus=args.min_gpus, max_gpus=args.max_gpus,
                 calibrated=not args.fluid_throughputs)
    mix = None
    if scenario.fleet is not None and scenario.fleet.types:  # instance types: the LP chooses the mix per slot
        from fluidopt.core.errors import InfeasibleError
        from fluidopt.fluid.multiperiod import plan_fleet_mix

        kw = dict(start=float(d.times[0]), end=float(d.times[-1] + d.slot), slot=d.slot, interactive_rate=d.rates,
                  utilisation=d.utilisation, max_gpus=args.max_gpus, calibrated=not args.fluid_throughputs)
        mix = plan_fleet_mix(scenario, list(d.backlogs), **kw)
        single = {}  # each type alone, for comparison (None: infeasible alone)
        for ty in scenario.fleet.types:
            try:
                single[ty.name] = plan_fleet_mix(scenario, list(d.backlogs), [ty], **kw).cost
            except InfeasibleError:
                single[ty.name] = None
    files: list[str] = []
    if args.out:
        from fluidopt.core.files import lock_folder, write_generation

        with lock_folder(args.out, "--out", "fluidopt plan --day") as out:
            frame = d.to_frame()
            files += [str(f) for f in write_generation(out, {"day.csv": lambda p: frame.to_csv(p, index=False)})]
    if args.json:
        extra = {}
        if mix is not None:
            extra["mix"] = {"cost": mix.cost, "by_type": mix.by_type().reset_index().to_dict(orient="records"),
                            "single_type_cost": single}
        print(json.dumps({"scenario": scenario.name, **d.to_dict(), **extra, "files": files}, indent=2, default=str))
        return 0
    price = d.price_per_gpu_hour
    kind = "lower bound" if d.utilisation == 1.0 else f"plan at utilisation {d.utilisation:g}"
    print(f"fluidopt plan --day: {scenario.name}, {d.slots} slots of {d.slot:g} s ({d.slots * d.slot / 3600:g} h), "
          f"interactive {d.rates.min():.3g}-{d.rates.max():.3g} requests/s, "
          f"{sum(j.n for j in d.backlogs):,.0f} batch requests")
    print(f"GPU-hours: {d.gpu_hours:.2f} ({kind}); {d.gpu_hours_int:.2f} with whole GPUs in every slot; peak {d.peak_gpus} GPUs")
    if price is not None:
        print(f"cost at {price:g} per GPU-hour: {d.cost:.2f} (whole GPUs: {d.cost_int:.2f})")
    else:
        print("cost: - (no price_per_hour in the scenario's [gpu])")
    print()
    f = d.to_frame()
    show = f[["t_start", "rate", "gpus", "gpus_int", "batch_gpus", "binding"]].copy()
    show.columns = ["start (s)", "rate (1/s)", "GPUs", "whole", "batch GPUs", "binding"]
    print(show.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    for n in d.notes:
        print(f"note: {n}")
    if mix is not None:
        print(f"\ninstance types (fleet.types): the cheapest mix costs {mix.cost:.2f}"
              f"{'' if d.utilisation < 1 else ' (a lower bound)'}")
        t = mix.by_type()[["price_per_hour", "gpu_hours", "cost", "cost_per_hour", "cost_per_million_tokens", "peak"]]
        t.columns = ["price/h", "GPU-hours", "cost", "cost/h", "cost/M tokens", "peak"]
        print(t.to_string(float_format=lambda x: f"{x:.3f}"))
        print("each type alone: " + ", ".join(f"{n} {'infeasible' if c is None else f'{c:.2f}'}"
                                              for n, c in single.items()))
    if files:
        print(f"\nsaved: {', '.join(files)}")
    return 0
