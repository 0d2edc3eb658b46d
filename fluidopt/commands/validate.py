"""``fluidopt validate``: replay measured runs of a real engine on one simulated instance and compare."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fluidopt.core.errors import UsageError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "validate",
        help="replay measured runs of a real engine request by request and compare (docs/fidelity.md)",
        description=(
            "Replay each measured run's own arrivals and lengths on one engine instance driven by an "
            "iteration-time law, and print the median and p90 relative error per request of TTFT, TPOT and "
            "E2E and the measured and simulated SLO attainment; save a figure of measured against simulated "
            "CDFs. MEASURED: DistServe's .exp format or a CSV with columns prompt_len, output_len, issue_time "
            "(s), ttft_ms, tpot_ms, latency_ms."
        ),
    )
    p.add_argument("measured", nargs="+", metavar="MEASURED", help="measured run(s): .exp or CSV")
    p.add_argument("--profile", metavar="JSON", help="DistServe's profiler JSON (milliseconds) holding the law")
    p.add_argument("--model", help="model in the profile, e.g. facebook/opt-13b")
    p.add_argument("--tp", type=int, help="tensor-parallel degree in the profile")
    p.add_argument("--timemodel", metavar="TOML", help="instead of --profile: a TOML file with a [timemodel] table "
                   "(seconds) and optionally [engine] kv_tokens")
    p.add_argument("--engine", default=None, help="engine scheduler: vllm, chunked or paper (default vllm)")
    p.add_argument("--kv-tokens", type=int, metavar="N", help="KV cache of the instance in tokens (default: "
                   "max_num_tokens.csv beside the profile, or [engine] kv_tokens; otherwise unlimited)")
    p.add_argument("--slo-ttft-ms", type=float, default=200.0, help="TTFT objective, ms (default 200)")
    p.add_argument("--slo-tpot-ms", type=float, default=100.0, help="TPOT objective, ms (default 100)")
    p.add_argument("--out", metavar="DIR", help="folder for the CDF figures (default: the current folder)")
    p.add_argument("--no-figure", action="store_true", help="write no figure")
    p.add_argument("--fit", metavar="TOML", help="fit the law and the KV cache to the measured runs (starting from "
                   "--profile or --timemodel), write them to TOML ([timemodel], [engine]) and compare with the fit")
    p.add_argument("--fit-overheads", metavar="TOML", help="calibrate the --profile or --timemodel law with few "
                   "parameters instead: a per-request cost of a decode step (and with --per-iteration a cost per "
                   "iteration) fitted to the runs, the KV cache read off the runs (or --kv-tokens); write them to "
                   "TOML and compare with the result")
    p.add_argument("--per-iteration", action="store_true", help="with --fit-overheads: fit a cost per iteration too")
    p.add_argument("--leave-one-out", action="store_true", help="with --fit-overheads: also fit on all runs but one "
                   "and predict the one left out, for each run (the generalisation test)")
    p.add_argument("--many-server", action="store_true", help="replay on one GPU of the many-server simulator's "
                   "kernel (fluidopt.sim, the law as its timemodel; --engine vllm: whole prompts, paper: chunks) "
                   "instead of the per-instance engine (docs/fidelity.md, \"The many-server simulator on the same "
                   "runs\")")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    d = p.add_argument_group("disaggregated layout (docs/fidelity.md, \"Disaggregated replay\")")
    d.add_argument("--layout", choices=("colocated", "disaggregated"), default="colocated",
                   help="colocated: one instance (default); disaggregated: a prefill pool, a decode pool and the KV "
                        "transfer between them, scheduled as DistServe does (needs --profile and --model)")
    d.add_argument("--prefill-tp", type=int, metavar="N", help="TP degree of the prefill instances (in the profile)")
    d.add_argument("--decode-tp", type=int, metavar="N", help="TP degree of the decode instances (in the profile)")
    d.add_argument("--prefill-instances", type=int, default=1, metavar="N", help="prefill instances (default 1)")
    d.add_argument("--decode-instances", type=int, default=1, metavar="N", help="decode instances (default 1)")
    d.add_argument("--link-gbps", type=float, default=300.0, metavar="GB/s", help="KV transfer bandwidth per "
                   "(prefill, decode) link, GB/s (default 300: A100 NVLink, one direction)")
    d.add_argument("--link-latency-ms", type=float, default=0.0, metavar="MS", help="latency per transfer, ms "
                   "(default 0)")
    d.add_argument("--kv-dtype", default="fp16", help="KV cache data type: fp16, bf16, fp32, fp8 (default fp16)")
    d.add_argument("--prefill-max-tokens", type=int, default=2048, metavar="N",
                   help="prompt tokens per prefill batch (default 2048, OPT's context)")
    d.add_argument("--prefill-overhead-ms", type=float, default=0.0, metavar="MS",
                   help="engine time added to each prefill batch, ms (default 0: the profile as shipped)")
    d.add_argument("--decode-request-ms", type=float, default=0.0, metavar="MS",
                   help="engine time added per request of a decode step, ms (default 0: the profile as shipped)")
    d.add_argument("--prefill-entry-ms", type=float, default=0.0, metavar="MS",
                   help="time from a request's issue to its arrival at the prefill pool, ms, which occupies no "
                        "instance (the API server in front; default 0)")
    d.add_argument("--fit-costs", action="store_true", help="fit --decode-request-ms and the prefill-side cost "
                   "(--prefill-cost) to the medians of the measured runs, then compare with them; with "
                   "--leave-one-out also fit on all runs but one and predict the one left out, for each run")
    d.add_argument("--prefill-cost", choices=("entry", "batch", "prompt", "token"), default=None,
                   help="with --fit-costs: the form of the prefill-side cost fitted: entry (default: "
                        "--prefill-entry-ms), batch (--prefill-overhead-ms), prompt (ms per prompt of a batch) or "
                        "token (ms per prompt token); docs/fidelity.md compares them")
    return p


def _kv_beside(profile: Path, model: str, tp: int) -> int | None:
    """KV capacity (tokens) of ``model`` at TP ``tp``, pipeline 1, from DistServe's ``max_num_tokens.csv``
    beside the profile, if there is one."""
    import csv

    f = profile.parent / "max_num_tokens.csv"
    if not f.is_file():
        return None
    try:
        with f.open(encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                if row.get("model") == model and row.get("tp") == str(tp) and row.get("pp") == "1":
                    return int(row["max_num_tokens"])
    except (OSError, ValueError, KeyError, UnicodeDecodeError):
        return None
    return None


def _law(args: argparse.Namespace):
    """The law and the default KV capacity, from --profile or --timemodel."""
    from fluidopt.core.errors import CalibrationError

    try:
        if args.timemodel is not None:
            if args.profile is not None:
                raise UsageError("give --profile JSON or --timemodel TOML, not both")
            for flag in ("model", "tp"):
                if getattr(args, flag) is not None:
                    raise UsageError(f"--{flag}: only with --profile (a TOML time model names no model)")
            from fluidopt.calibration.timemodels import load_time_model_file

            return load_time_model_file(args.timemodel)
        if args.profile is None:
            raise UsageError("give --profile JSON --model NAME --tp N (DistServe's profiler JSON) or --timemodel TOML")
        if args.model is None or args.tp is None:
            raise UsageError(f"--profile {args.profile!r} needs --model NAME and --tp N (e.g. --model facebook/opt-13b "
                             "--tp 1)")
        from fluidopt.calibration.timemodels import load_distserve_profile

        law = load_distserve_profile(args.profile, args.model, args.tp)
        return law, _kv_beside(Path(args.profile), args.model, args.tp)
    except CalibrationError as e:
        raise UsageError(str(e)) from None


def _fit(args: argparse.Namespace, runs, law, kv):
    """Fit (docs/fidelity.md) and write the TOML; the KV capacity starts from 60,000 tokens when unknown."""
    from fluidopt.core.files import atomic_path
    from fluidopt.engines import engine_config
    from fluidopt.engines.validation import fit_to_runs

    fitted, kv_fit = fit_to_runs(runs, law, lambda k: engine_config(args.engine, kv_tokens=k), float(kv or 60_000),
                                 ttft_slo=args.slo_ttft_ms / 1e3, tpot_slo=args.slo_tpot_ms / 1e3)
    kv_fit = int(kv_fit)
    d = fitted.to_dict()
    lines = [f"# fitted by fluidopt validate --fit to {', '.join(r.name for r in runs)} (engine {args.engine}); seconds",
             "[timemodel]", f'name = "fitted to {len(runs)} measured run(s)"']
    lines += [f"{k} = {[float(x) for x in v]!r}" for k, v in d.items() if k != "decode_threshold"]
    lines += ["", "[engine]", f"kv_tokens = {kv_fit}", ""]
    with atomic_path(Path(args.fit)) as tmp:
        tmp.write_text("\n".join(lines), encoding="utf-8")
    return fitted, kv_fit


def _fit_overheads(args: argparse.Namespace, runs, law):
    """--fit-overheads (docs/fidelity.md): the KV cache from --kv-tokens or read off the runs, not from the
    profile's max_num_tokens.csv, which DistServe's vLLM runs did not have."""
    from fluidopt.core.files import atomic_path
    from fluidopt.engines import engine_config
    from fluidopt.engines.validation import fit_overheads, kv_ceiling

    kv = args.kv_tokens if args.kv_tokens is not None else kv_ceiling(runs)
    fit = fit_overheads(runs, law, lambda k: engine_config(args.engine, kv_tokens=k), kv,
                        ttft_slo=args.slo_ttft_ms / 1e3, tpot_slo=args.slo_tpot_ms / 1e3,
                        per_iteration=args.per_iteration)
    d = fit.law.to_dict()
    lines = [f"# fitted by fluidopt validate --fit-overheads to {', '.join(r.name for r in runs)} (engine "
             f"{args.engine}): {law.name or 'the law'} plus {fit.per_request * 1e3:g} ms per request per decode "
             f"step and {fit.per_iteration * 1e3:g} ms per iteration; KV cache "
             f"{'given' if args.kv_tokens is not None else 'read off the runs'}; seconds",
             "[timemodel]", f"name = {json.dumps((law.name or 'law') + f' + overheads fitted to {len(runs)} measured run(s)')}"]
    lines += [f"{k} = {[float(x) for x in v]!r}" for k, v in d.items() if k != "decode_threshold"]
    if "decode_threshold" in d:
        lines.append(f"decode_threshold = {int(d['decode_threshold'])}")
    lines += ["", "[engine]", f"kv_tokens = {kv}", ""]
    with atomic_path(Path(args.fit_overheads)) as tmp:
        tmp.write_text("\n".join(lines), encoding="utf-8")
    return fit


def _table(rows: list[dict]) -> str:
    head = (f"{'run':<24}{'n':>5}{'attain meas':>12}{'sim':>7}{'TTFT med ms':>13}{'sim':>8}{'TPOT med ms':>13}"
            f"{'sim':>7}   rel. error median/p90: TTFT, TPOT, E2E")
    lines = [head]
    for d in rows:
        errs = ", ".join(f"{d[k + '_relerr_median']:.2f}/{d[k + '_relerr_p90']:.2f}" for k in ("ttft", "tpot", "e2e"))
        lines.append(f"{d['run']:<24}{d['requests']:>5}{d['attainment_measured']:>12.3f}{d['attainment_simulated']:>7.3f}"
                     f"{d['ttft_median_ms_measured']:>13.1f}{d['ttft_median_ms_simulated']:>8.1f}"
                     f"{d['tpot_median_ms_measured']:>13.1f}{d['tpot_median_ms_simulated']:>7.1f}   {errs}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from fluidopt.commands._checks import check_output_dir, check_positive_int
    from fluidopt.engines import engine_config

    if args.layout == "disaggregated":
        return _run_disaggregated(args)
    if args.prefill_cost is not None:
        raise UsageError("--prefill-cost: only with --layout disaggregated --fit-costs")
    args.engine = args.engine or "vllm"
    cfg_probe = engine_config(args.engine)  # an unknown engine fails first, with "did you mean"
    del cfg_probe
    for flag, v in (("--slo-ttft-ms", args.slo_ttft_ms), ("--slo-tpot-ms", args.slo_tpot_ms)):
        if not (v > 0 and v < float("inf")):
            raise UsageError(f"{flag}: expected a time in ms > 0, got {v}")
    check_positive_int(args.kv_tokens, "--kv-tokens")
    if args.tp is not None and args.tp < 1:
        raise UsageError(f"--tp: expected an integer >= 1, got {args.tp}")
    law, kv_default = _law(args)
    from fluidopt.engines.validation import compare, read_measured

    runs = [read_measured(f) for f in args.measured]
    if not args.no_figure:
        check_output_dir(args.out or ".", "--out")
    if args.fit is not None and args.fit_overheads is not None:
        raise UsageError("give --fit TOML or --fit-overheads TOML, not both")
    if args.many_server and (args.fit is not None or args.fit_overheads is not None):
        raise UsageError("--many-server: not with --fit or --fit-overheads (the fits run the per-instance engines; "
                         "check their law on the kernel with --timemodel TOML --many-server)")
    for flag in ("per_iteration", "leave_one_out"):
        if getattr(args, flag) and args.fit_overheads is None:
            raise UsageError(f"--{flag.replace('_', '-')}: only with --fit-overheads TOML")
    if args.leave_one_out and len(runs) < 2:
        raise UsageError("--leave-one-out: needs at least two measured runs")
    for out_file, flag in ((args.fit, "--fit"), (args.fit_overheads, "--fit-overheads")):
        if out_file is not None:
            from fluidopt.commands._checks import check_output_file

            check_output_file(out_file, flag)
    kv = args.kv_tokens if args.kv_tokens is not None else kv_default
    loo = None
    if args.fit is not None:
        law, kv = _fit(args, runs, law, kv)
    elif args.fit_overheads is not None:
        profile = law
        fit = _fit_overheads(args, runs, profile)
        law, kv = fit.law, fit.kv_tokens
        if args.leave_one_out:
            from fluidopt.engines.validation import leave_one_out

            loo = [dict(c.to_dict(), kv_tokens=f.kv_tokens, per_request_ms=f.per_request * 1e3,
                        per_iteration_ms=f.per_iteration * 1e3)
                   for f, c in leave_one_out(runs, profile, lambda k: engine_config(args.engine, kv_tokens=k),
                                             args.kv_tokens, ttft_slo=args.slo_ttft_ms / 1e3,
                                             tpot_slo=args.slo_tpot_ms / 1e3, per_iteration=args.per_iteration,
                                             engine=args.engine)]
    cfg = engine_config(args.engine, kv_tokens=kv)
    if args.many_server:
        from fluidopt.engines.validation import Comparison
        from fluidopt.sim.measured import replay_on_kernel

        comps = [Comparison(r, replay_on_kernel(law, cfg, r.arrival, r.prompt, r.output), f"{args.engine}, many-server",
                            args.slo_ttft_ms / 1e3, args.slo_tpot_ms / 1e3) for r in runs]
        rows = [dict(c.to_dict(), engine=args.engine, simulator="many-server") for c in comps]
    else:
        comps = [compare(r, law, cfg, args.engine, args.slo_ttft_ms / 1e3, args.slo_tpot_ms / 1e3) for r in runs]
        rows = [c.to_dict() for c in comps]
    label = f"{args.engine}-many-server" if args.many_server else args.engine
    figures = [] if args.no_figure else _save_figures(comps, rows, args.out, label)
    mean_err = sum(abs(d["attainment_error"]) for d in rows) / len(rows)
    if args.json:
        obj = dict(rows[0]) if len(rows) == 1 else {"runs": rows}
        obj.update({"law": law.to_dict(), "kv_tokens": kv, "mean_abs_attainment_error": mean_err})
        if args.fit_overheads is not None:
            obj.update({"per_request_ms": fit.per_request * 1e3, "per_iteration_ms": fit.per_iteration * 1e3})
        if loo is not None:
            obj["leave_one_out"] = loo
            obj["leave_one_out_mean_abs_attainment_error"] = sum(abs(d["attainment_error"]) for d in loo) / len(loo)
        print(json.dumps(obj, indent=2))
        return 0
    print(f"engine {args.engine}{' on the many-server kernel' if args.many_server else ''}, law "
          f"{law.name or args.timemodel}, KV cache "
          f"{'unlimited' if kv is None else f'{kv} tokens'}; SLO TTFT < {args.slo_ttft_ms:g} ms and TPOT < "
          f"{args.slo_tpot_ms:g} ms")
    print(_table(rows))
    print(f"mean |attainment error| {mean_err:.3f}")
    for f in figures:
        print(f"figure written to {f}")
    if args.fit_overheads is not None:
        print(f"fitted: {fit.per_request * 1e3:g} ms per request per decode step, {fit.per_iteration * 1e3:g} ms per "
              f"iteration, KV cache {kv} tokens")
    if loo is not None:
        print("leave one out (fitted on the other runs, predicting this one):")
        print(_table(loo))
        print(f"mean |attainment error| left out {sum(abs(d['attainment_error']) for d in loo) / len(loo):.3f}")
    for out_file in (args.fit, args.fit_overheads):
        if out_file is not None:
            print(f"fitted law written to {out_file}")
    return 0


def _run_disaggregated(args: argparse.Namespace) -> int:
    """``--layout disaggregated``: both pools from DistServe's profile, the link from the model's shape."""
    import dataclasses
    import math

    import numpy as np

    from fluidopt.calibration.timemodels import load_distserve_profile
    from fluidopt.commands._checks import check_output_dir
    from fluidopt.core.errors import CalibrationError
    from fluidopt.engines.disaggregated import (
        PREFILL_COST_FORMS,
        Pool,
        check_fits,
        fit_costs,
        model_kv_bytes,
        replay_disaggregated,
    )
    from fluidopt.engines.validation import Comparison, read_measured

    for flag, v in (("--slo-ttft-ms", args.slo_ttft_ms), ("--slo-tpot-ms", args.slo_tpot_ms)):
        if not (v > 0 and v < float("inf")):
            raise UsageError(f"{flag}: expected a time in ms > 0, got {v}")
    if args.per_iteration:
        raise UsageError("--per-iteration: not with --layout disaggregated (only with --fit-overheads)")
    if args.many_server:
        raise UsageError("--many-server: not with --layout disaggregated (the kernel replays one colocated GPU)")
    if args.leave_one_out and not args.fit_costs:
        raise UsageError("--leave-one-out: with --layout disaggregated only with --fit-costs")
    if args.prefill_cost is not None and not args.fit_costs:
        raise UsageError("--prefill-cost: only with --fit-costs (the form of the prefill-side cost to fit)")
    for flag in ("timemodel", "tp", "kv_tokens", "fit", "fit_overheads", "engine"):
        if getattr(args, flag) is not None:
            raise UsageError(f"--{flag.replace('_', '-')}: not with --layout disaggregated (use --profile, "
                             "--prefill-tp and --decode-tp; KV capacities come from max_num_tokens.csv)")
    if args.decode_instances < 1:
        raise UsageError(f"--decode-instances {args.decode_instances}: a disaggregated layout needs a decode pool "
                         "(>= 1 instance); for one pool use --layout colocated")
    if args.prefill_instances < 1:
        raise UsageError(f"--prefill-instances {args.prefill_instances}: a disaggregated layout needs a prefill pool "
                         "(>= 1 instance)")
    if not (args.link_gbps > 0 and math.isfinite(args.link_gbps)):
        raise UsageError(f"--link-gbps: expected a bandwidth in GB/s > 0, got {args.link_gbps:g}")
    for flag, v in (("--link-latency-ms", args.link_latency_ms), ("--prefill-overhead-ms", args.prefill_overhead_ms),
                    ("--decode-request-ms", args.decode_request_ms), ("--prefill-entry-ms", args.prefill_entry_ms)):
        if not (v >= 0 and math.isfinite(v)):
            raise UsageError(f"{flag}: expected a time in ms >= 0, got {v:g}")
    if args.prefill_max_tokens < 1:
        raise UsageError(f"--prefill-max-tokens: expected an integer >= 1, got {args.prefill_max_tokens}")
    if args.profile is None or args.model is None or args.prefill_tp is None or args.decode_tp is None:
        raise UsageError("--layout disaggregated needs --profile JSON --model NAME --prefill-tp N --decode-tp N "
                         "(e.g. --model facebook/opt-13b --prefill-tp 2 --decode-tp 1)")
    for flag, tp in (("--prefill-tp", args.prefill_tp), ("--decode-tp", args.decode_tp)):
        if tp < 1:
            raise UsageError(f"{flag}: expected an integer >= 1, got {tp}")
    try:
        laws = {k: load_distserve_profile(args.profile, args.model, tp)
                for k, tp in (("prefill", args.prefill_tp), ("decode", args.decode_tp))}
    except CalibrationError as e:
        raise UsageError(str(e)) from None
    kv_bytes = model_kv_bytes(args.model, args.kv_dtype)
    check_fits(args.model, args.prefill_tp, dtype=args.kv_dtype, what="--prefill-tp")
    check_fits(args.model, args.decode_tp, dtype=args.kv_dtype, what="--decode-tp")
    kvs = {k: _kv_beside(Path(args.profile), args.model, tp)
           for k, tp in (("prefill", args.prefill_tp), ("decode", args.decode_tp))}
    runs = [read_measured(f) for f in args.measured]
    if args.leave_one_out and len(runs) < 2:
        raise UsageError("--leave-one-out: needs at least two measured runs")
    if not args.no_figure:
        check_output_dir(args.out or ".", "--out")
    pre = Pool(laws["prefill"], instances=args.prefill_instances, kv_tokens=kvs["prefill"],
               max_tokens=args.prefill_max_tokens, overhead=args.prefill_overhead_ms / 1e3,
               entry_latency=args.prefill_entry_ms / 1e3)
    dec = Pool(laws["decode"], instances=args.decode_instances, kv_tokens=kvs["decode"],
               request_overhead=args.decode_request_ms / 1e3)
    link = dict(kv_bytes_per_token=kv_bytes, link_bandwidth=args.link_gbps * 1e9, link_latency=args.link_latency_ms / 1e3)
    form = args.prefill_cost or "entry"
    engine = "distserve-disaggregated"
    slo = (args.slo_ttft_ms / 1e3, args.slo_tpot_ms / 1e3)

    def fitted(on):
        """The pools with both costs fitted to the runs ``on``."""
        dc, pc = fit_costs(on, pre, dec, prefill_form=form, **link)
        return (dataclasses.replace(pre, **{PREFILL_COST_FORMS[form][0]: pc}),
                dataclasses.replace(dec, request_overhead=dc))

    def row(r, p, q) -> tuple:
        sim = replay_disaggregated(p, q, r.arrival, r.prompt, r.output, **link)
        c = Comparison(r, sim, engine, *slo)
        d = c.to_dict()
        with np.errstate(invalid="ignore"):
            d["transfer_median_ms_simulated"] = float(np.nanmedian(sim.transfer) * 1e3) if np.isfinite(sim.transfer).any() else None
        return c, d

    loo = None
    if args.fit_costs:
        if args.leave_one_out:
            loo = []
            for i, r in enumerate(runs):
                p, q = fitted([x for j, x in enumerate(runs) if j != i])
                loo.append(dict(row(r, p, q)[1], **_costs(p, q)))
        pre, dec = fitted(runs)
    comps, rows = [], []
    for r in runs:
        c, d = row(r, pre, dec)
        comps.append(c)
        rows.append(d)
    if not args.no_figure:
        _save_figures(comps, rows, args.out, engine)
    mean_err = sum(abs(d["attainment_error"]) for d in rows) / len(rows)
    costs = _costs(pre, dec)
    if args.json:
        obj = dict(rows[0]) if len(rows) == 1 else {"runs": rows}
        obj.update({"law": {k: v.to_dict() for k, v in laws.items()}, "kv_tokens": kvs["decode"],
                    "prefill_kv_tokens": kvs["prefill"], "mean_abs_attainment_error": mean_err,
                    "layout": "disaggregated", "prefill_tp": args.prefill_tp, "decode_tp": args.decode_tp,
                    "prefill_instances": args.prefill_instances, "decode_instances": args.decode_instances,
                    "link_gbps": args.link_gbps, "link_latency_ms": args.link_latency_ms,
                    "kv_bytes_per_token": kv_bytes, **costs, "costs_fitted": bool(args.fit_costs)})
        if args.fit_costs:
            obj["prefill_cost_form"] = form
        if loo is not None:
            obj["leave_one_out"] = loo
            obj["leave_one_out_mean_abs_attainment_error"] = sum(abs(d["attainment_error"]) for d in loo) / len(loo)
        print(json.dumps(obj, indent=2))
        return 0
    print(f"disaggregated: {args.prefill_instances} prefill x TP {args.prefill_tp} (KV {kvs['prefill']} tokens), "
          f"{args.decode_instances} decode x TP {args.decode_tp} (KV {kvs['decode']} tokens); link {args.link_gbps:g} "
          f"GB/s + {args.link_latency_ms:g} ms, {kv_bytes} bytes/token; engine costs {'fitted' if args.fit_costs else 'given'}: "
          f"prefill {costs['prefill_entry_ms']:.3f} ms entry + {costs['prefill_overhead_ms']:.3f} ms/batch + "
          f"{costs['prefill_prompt_ms']:.3f} ms/prompt + {costs['prefill_token_ms'] * 1e3:.3f} us/token, "
          f"decode {costs['decode_request_ms']:.4f} ms/request; "
          f"SLO TTFT < {args.slo_ttft_ms:g} ms and TPOT < {args.slo_tpot_ms:g} ms")
    print(_table(rows))
    print(f"mean |attainment error| {mean_err:.3f}")
    if loo is not None:
        print("leave one out (costs fitted on the other runs, predicting this one):")
        print(_table(loo))
        print(f"mean |attainment error| left out {sum(abs(d['attainment_error']) for d in loo) / len(loo):.3f}")
    for d in rows:
        if "figure" in d:
            print(f"figure written to {d['figure']}")
    return 0


def _costs(pre, dec) -> dict:
    """The engine costs of a disaggregated layout's pools, in ms, by their JSON keys."""
    return {"prefill_entry_ms": pre.entry_latency * 1e3, "prefill_overhead_ms": pre.overhead * 1e3,
            "prefill_prompt_ms": pre.prompt_overhead * 1e3, "prefill_token_ms": pre.token_overhead * 1e3,
            "decode_request_ms": dec.request_overhead * 1e3}


def _save_figures(comps, rows, out_dir, engine: str) -> list[Path]:
    """Each run's measured-vs-simulated CDF figure, written whole (``RUN-ENGINE-cdf.png`` in ``out_dir``,
    default the current folder); its path goes into the run's row."""
    import matplotlib.pyplot as plt

    from fluidopt.core.files import atomic_path

    out = Path(out_dir or ".")
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for c, d in zip(comps, rows):
        fig = c.figure()
        path = out / f"{c.run.name}-{engine}-cdf.png"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110)
        plt.close(fig)
        d["figure"] = str(path)
        paths.append(path)
    return paths
