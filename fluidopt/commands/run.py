"""``fluidopt run``: the main job. Solve the scenario's fluid LP, simulate gate-and-route and the
paper's baselines on it, print a compact report and save tables and figures."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from fluidopt.commands._options import (
    add_controller_arguments,
    add_trace_arguments,
    import_user_modules,
    parse_options,
    replay_from_args,
)
from fluidopt.commands._scale import (
    add_scale_arguments,
    add_seed_arguments,
    check_workers,
    progress_enabled,
    say_what_is_stored,
    seed_list,
)

DEFAULT_POLICIES = ("gate-and-route", "fi-wsp", "gi-wsp", "gf-wsp", "fg-sp")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "run",
        help="solve, simulate gate-and-route and the baselines, report (the main job)",
        description="Solve the fluid LP of SCENARIO (default: the built-in paper instance), simulate "
        "gate-and-route and the paper's baselines on it, print revenue against the LP bound, "
        "throughput, abandonment and latency, and save tables and figures under --out.",
    )
    p.add_argument("scenario", nargs="?", default=None, metavar="SCENARIO", help="scenario TOML (default: built-in)")
    p.add_argument("--gpus", type=int, default=None, help="fleet size (same per-GPU load; default: the scenario's)")
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES),
                   help=f"comma-separated policy names (default: {','.join(DEFAULT_POLICIES)})")
    p.add_argument("--horizon", type=float, default=600.0, help="simulated seconds per run (default 600)")
    p.add_argument("--warmup", type=float, default=150.0, help="seconds excluded from metrics (default 150)")
    p.add_argument("--service", choices=("markov", "tokens"), default=None,
                   help="markov: the paper's exponential model; tokens: integer token lengths (default markov; tokens "
                        "for a scenario with a KV model or a generalised iteration-time law, [gpu.timemodel])")
    p.add_argument("--pricing", choices=("bundled", "separate"), default="bundled")
    p.add_argument("--out", default="fluidopt-run", help="directory for CSV tables and PNG figures, and the "
                   "results store that lets a rerun skip finished runs (default ./fluidopt-run; '' to save nothing)")
    p.add_argument("--fresh", action="store_true", help="ignore runs stored in --out by an earlier run")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    add_controller_arguments(p)
    add_trace_arguments(p)
    add_scale_arguments(p)
    add_seed_arguments(p, seeds=2)
    return p


def run(args: argparse.Namespace) -> int:
    from fluidopt.core.errors import ScenarioError
    from fluidopt.core.files import maybe_lock
    from fluidopt.scenario import load_scenario

    import_user_modules(args.imports)  # so the policy names below validate; workers import them again
    options = parse_options(args.option)
    check_workers(args)
    scenario = load_scenario(args.scenario)
    if args.service is None:
        g = scenario.gpu
        tokens = g.timemodel is not None or g.kv_capacity is not None or g.kv_time_per_token
        args.service = "tokens" if tokens else "markov"
    if args.gpus is not None:
        if args.gpus < 1:
            raise ScenarioError(f"--gpus: expected an integer >= 1, got {args.gpus}")
        scenario = scenario.with_gpus(args.gpus)
    args.seed_list = seed_list(args)
    scenario, wl = replay_from_args(args, scenario)
    workloads = None if wl is None else {scenario.name: wl}
    if wl is None:
        from fluidopt.sim.limits import check_size

        check_size(scenario, args.horizon, caller="run")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    out = Path(args.out) if args.out else None
    with maybe_lock(out, "--out", "fluidopt run"):  # created, writable, ours alone: before any work
        with say_what_is_stored(out):
            return _run(args, scenario, policies, options, out, workloads)


def _run(args, scenario, policies, options, out, workloads) -> int:
    from fluidopt.fluid.lp import scenario_slis, solve_fluid
    from fluidopt.fluid.sli import sli_spec
    from fluidopt.harness.comparison import compare

    # The scenario's own SLIs (its file's slis list) shape R* and the plan: an infeasible set is an
    # InfeasibleError naming the conflicting rows (one line, exit 2), before any simulation.
    sol = solve_fluid(scenario, pricing=args.pricing)
    slis = scenario_slis(scenario)
    progress = progress_enabled(args)
    if not args.json:
        print(f"fluidopt run: {scenario.name}, {scenario.gpus} GPUs, {args.pricing} pricing, "
              f"{len(policies)} policies x {args.seeds} seeds, {args.service} service, "
              f"horizon {args.horizon:g} s (warm-up {args.warmup:g} s)", flush=True)
        with_slis = f" with SLIs {', '.join(sli_spec(s) for s in slis)}" if slis else ""
        print(f"LP optimum R* = {sol.objective_per_gpu:.2f} per GPU per s{with_slis}; M = {sol.mixed_gpus} mixed GPUs "
              f"(sum x* = {sol.prefill_occupancy:.4f}); simulating...", flush=True)
    from fluidopt.commands._scale import make_executor

    executor = make_executor(args, runs=len(policies) * args.seeds)
    try:
        comp = compare(
            scenario, policies, seeds=args.seed_list, horizon=args.horizon, warmup=args.warmup,
            service=args.service, pricing=args.pricing, progress=progress,
            options={p: options for p in policies} if options else None, imports=args.imports,
            sample_interval=max(args.horizon / 300, 0.5) if out is not None else None,
            executor=executor, out=out, resume=not args.fresh, workloads=workloads, save=False,
        )
    finally:
        executor.close()
    summ = comp.summary()
    files: list[str] = []
    if out is not None:
        # the figures belong to the sweep's generation: replaced with its tables, or not at all
        try:
            files += [str(p) for p in comp.save(out, extra=_figures(comp, sol), owned=FIGURES)]
        except KeyboardInterrupt as e:
            import fluidopt.core.interrupt as interrupt

            raise interrupt.interrupted_from(
                e, f"all {len(comp.runs)} simulations finished and are kept in {out / 'store.jsonl'}, but the "
                   "tables were not written; rerun the same command to write them") from None
    if args.json:
        print(json.dumps({
            "scenario": scenario.name,
            "gpus": scenario.gpus,
            "pricing": args.pricing,
            "slis": [sli_spec(s) for s in slis],
            "lp_objective_per_gpu": sol.objective_per_gpu,
            "mixed_gpus": sol.mixed_gpus,
            "wall_seconds": comp.wall_seconds,
            "executor": comp.meta.get("executor"),
            "policies": [{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                          for k, v in row.items()} for row in summ.to_dict(orient="records")],
            "files": files,
        }, indent=2))
        return 0
    # rows in the order asked for (gate-and-route, the paper's policy, first by default), whatever order
    # the runs came back in
    order = {p: i for i, p in enumerate(policies)}
    summ = summ.sort_values("policy", key=lambda c: c.map(lambda p: order.get(p, len(order))), kind="stable")
    print()
    print(_report(summ))
    print()
    print("\n".join(_legend(summ, args.seeds, scenario.gpus)))
    if out is not None and (out / "store.jsonl").exists():
        files.append(f"{out / 'store.jsonl'} (every run, for a rerun to skip; --fresh ignores it)")
    if files:
        print(f"\nsaved: {', '.join(files)}")
    print(f"({comp.wall_seconds:.1f} s wall, {comp.meta.get('executor')})")
    return 0


PAPER_BASELINES = ("fi-wsp", "gi-wsp", "gf-wsp", "fg-sp")


def _legend(summ, seeds: int, gpus: int) -> list[str]:
    """What the report's header and columns mean, and why gate-and-route need not top the table."""
    from fluidopt.harness.comparison import _MIN_SEEDS_FOR_T

    ci = (f"t interval over the {seeds} seeds" if seeds >= _MIN_SEEDS_FOR_T else
          f"with fewer than {_MIN_SEEDS_FOR_T} seeds, the runs' batch-means intervals pooled")
    lines = [
        "R*: the fluid LP's revenue per GPU per s, a bound no policy beats in the long run; sum x*: the share of "
        "GPUs prefilling in the LP's plan; M = ceil(n sum x*): the GPUs gate-and-route runs mixed (prefill and "
        "decode), the others decode only.",
        f"vs LP: simulated revenue / R*; ±: 95% confidence half-width ({ci}).",
    ]
    if "ratio_realised" in summ.columns and summ["ratio_realised"].notna().any():
        lines.append("vs LP(window): revenue / the R* of the arrivals in the measured window (a replayed trace).")
    pols = list(summ["policy"])
    base = [p for p in pols if p in PAPER_BASELINES]
    if "gate-and-route" in pols:
        lines.append(
            "gate-and-route is the paper's policy, on the LP's plan" + (f"; {', '.join(base)}: the paper's baselines"
                                                                     if base else "")
            + f". It is optimal as the fleet grows (its gap to R* shrinks like 1/sqrt(n)); at {gpus} GPUs a "
            "baseline can earn more: GI-WSP commits a decode slot when it admits a prefill, so no prefilled "
            "request waits to decode (docs/results.md sections 1 and 4).")
    return lines


def _report(summ) -> str:
    import pandas as pd

    def pm(m, ci, digits):
        return "" if not math.isfinite(m) else (f"{m:.{digits}f}" + (f" ± {ci:.{digits}f}" if math.isfinite(ci) else ""))

    rows = []
    for _, r in summ.iterrows():
        rows.append({
            "policy": r["policy"],
            "revenue/GPU/s": pm(r["revenue"], r["revenue_ci"], 2),
            "vs LP": pm(r["ratio"], r["ratio_ci"], 4),
            # a trace run: R* of the arrivals in the measured window (the plain R* is only a benchmark)
            **({"vs LP(window)": pm(r["ratio_realised"], r["ratio_realised_ci"], 4)}
               if math.isfinite(r.get("ratio_realised", math.nan)) else {}),
            "throughput/GPU/s": f"{r['throughput']:.4f}",
            "abandoned": f"{100 * r['abandoned_fraction']:.2f}%",
            "TTFT mean s": f"{r['ttft_mean']:.3f}",
            "e2e mean s": f"{r['e2e_mean']:.2f}",
            "e2e p99 s": f"{r['e2e_p99']:.1f}",
        })
    return pd.DataFrame(rows).to_string(index=False)


FIGURES = ("comparison.png", "occupancy.png")


def _figures(comp, sol) -> dict:
    """Writers of the comparison chart and the first policy's occupancy paths (file name -> write(path))."""
    import matplotlib

    matplotlib.use("Agg")
    from fluidopt.harness.plots import plot_comparison, plot_occupancy

    files: dict = {}
    if comp.runs.empty:
        return files
    files["comparison.png"] = lambda p: _save(plot_comparison(comp), p)
    ts = comp.timeseries
    if ts is not None and not ts.empty:
        first = comp.runs.iloc[0]
        paths = ts[(ts["policy"] == first["policy"]) & (ts["seed"] == first["seed"])]
        run = _Sampled(paths, int(first["gpus"]), sol.class_names, float(comp.meta["warmup"]), first["policy"],
                       first["scenario"])
        files["occupancy.png"] = lambda p: _save(plot_occupancy(run, sol), p)
    return files


class _Sampled:
    """What :func:`fluidopt.harness.plots.plot_occupancy` reads from a run: its samples and fleet size."""

    def __init__(self, timeseries, n_gpus: int, classes, warmup: float, policy: str, scenario: str) -> None:
        self.timeseries = timeseries.drop(columns=["scenario", "policy", "seed"]).reset_index(drop=True)
        self.n_gpus, self.classes, self.warmup, self.policy, self.scenario = n_gpus, classes, warmup, policy, scenario


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
