"""``fluidopt plan --layout colocated|disaggregated|best``: the placement search of
:mod:`fluidopt.planning.placement` on a DistServe-format profile (docs/planning.md, "Placement")."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

LAYOUT_CHOICES = ("colocated", "disaggregated", "best")


def add_placement_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("placement: split a fleet into prefill and decode instances (--layout; docs/planning.md, "
                             "'Placement')")
    g.add_argument("--layout", choices=LAYOUT_CHOICES, default=None,
                   help="search the splits of --gpus GPUs for the best goodput per GPU at an SLO attainment: "
                   "prefill and decode instances apart (disaggregated), together (colocated) or both (best)")
    g.add_argument("--profile", default=None, metavar="JSON", help="DistServe's profiler JSON: the iteration-time "
                   "law per model and TP degree (KV capacities from max_num_tokens.csv beside it)")
    g.add_argument("--model", default=None, help="model of --profile, e.g. facebook/opt-13b")
    g.add_argument("--gpus", type=int, default=None, help="GPUs to split (every split of at most this many is tried)")
    g.add_argument("--tp", default=None, metavar="N,N", help="TP degrees to try (default: every degree --profile has "
                   "for --model)")
    g.add_argument("--lengths", nargs="+", default=None, metavar="MEASURED", help="measured runs (DistServe .exp or "
                   "CSV) whose (prompt, output) pairs the simulated requests draw from (default: the scenario's "
                   "classes at their mean lengths, mixed by rate)")
    g.add_argument("--slo-ttft-ms", type=float, default=200.0, help="a request attains when TTFT is below this "
                   "(default 200)")
    g.add_argument("--slo-tpot-ms", type=float, default=100.0, help="... and TPOT below this (default 100)")
    g.add_argument("--attainment", type=float, default=0.9, help="share of requests that must attain (default 0.9)")
    g.add_argument("--prefill-overhead-ms", type=float, default=None, help="engine time per prefill batch a kernel "
                   "profile leaves out (validate --layout disaggregated --fit-costs --prefill-cost batch reports it; "
                   "default 0)")
    g.add_argument("--decode-request-ms", type=float, default=None, help="engine time per request of a decode step "
                   "a kernel profile leaves out (default 0)")
    g.add_argument("--colocated-profile", default=None, metavar="JSON", help="profile of the colocated engine "
                   "(default --profile; DistServe ships vLLM's as profiler-*.vllm.json)")
    g.add_argument("--colocated-request-ms", type=float, default=None, help="colocated engine time per request of a "
                   "decode step (default 0; 0.34 fits vLLM's measured runs, docs/fidelity.md)")
    g.add_argument("--link-gbps", type=float, default=None, help="KV transfer bandwidth per link, GB/s (default "
                   "300: NVLink 3 one way)")
    g.add_argument("--link-latency-ms", type=float, default=None, help="latency per KV transfer, ms (default 0)")
    g.add_argument("--prefill-max-tokens", type=int, default=None, help="prompt tokens per prefill batch (default "
                   "2048)")
    g.add_argument("--requests", type=int, default=2000, help="simulated requests per rate tried (default 2000)")


# The [pools] fields of a scenario (fluidopt.core.model.Layout) that the placement search reads, by its flags'
# dests, and the defaults of the flags that have one.
PLACEMENT_FIELDS = ("profile", "model", "tp", "lengths", "link_gbps", "link_latency_ms", "prefill_max_tokens",
                    "prefill_overhead_ms", "decode_request_ms", "colocated_profile", "colocated_request_ms")
PLACEMENT_DEFAULTS = {"link_gbps": 300.0, "link_latency_ms": 0.0, "prefill_max_tokens": 2048,
                      "prefill_overhead_ms": 0.0, "decode_request_ms": 0.0, "colocated_request_ms": 0.0}


def placement_requested(args: argparse.Namespace) -> bool:
    return getattr(args, "layout", None) is not None


def scenario_layout(path: str | None):
    """The scenario file's :class:`~fluidopt.core.model.Layout` and its cluster size: ``(None, None)`` for
    the built-in scenario or a file with no ``layout`` / ``[pools]``."""
    if path is None:
        return None, None
    from fluidopt.scenario import load_scenario

    sc = load_scenario(path)
    return (sc.layout, sc.gpus) if sc.layout is not None else (None, None)


def take_from_layout(args: argparse.Namespace, layout, fields, source: str, defaults: dict | None = None) -> set[str]:
    """Fill each flag of ``fields`` (dests) the command line left unset from the scenario's ``[pools]`` table
    (a flag given overrides its field), then from ``defaults``; then check the fields taken against the
    profile they name (:func:`check_pools`). Returns the fields taken from the file."""
    taken = set()
    for f in fields:
        v = None if layout is None else getattr(layout, f)
        if getattr(args, f, None) is None and v is not None:
            setattr(args, f, ",".join(map(str, v)) if f == "tp" else list(v) if f == "lengths" else v)
            taken.add(f)
    for f, v in (defaults or {}).items():
        if getattr(args, f, None) is None:
            setattr(args, f, v)
    if taken:
        check_pools(args, layout, taken, source)
    return taken


def check_pools(args: argparse.Namespace, layout, taken: set[str], source: str) -> None:
    """The ``[pools]`` fields a command took from the scenario file (``taken``), checked as their flags would
    be but named as fields, in one line: the profile and the measured runs exist, the model is in the
    profile, each TP degree is one of the profile's and the model's weights fit it."""
    from fluidopt.core.errors import UsageError
    from fluidopt.core.files import read_text_file

    where = f"{source}: pools"
    for f in ("profile", "colocated_profile"):
        if f in taken:
            read_text_file(Path(getattr(layout, f)), f"{where}.{f}: the profile", UsageError)
    for i, f in enumerate(layout.lengths or ()) if "lengths" in taken else ():
        read_text_file(Path(f), f"{where}.lengths[{i}]: the measured", UsageError)
    tp_fields = [f for f in ("prefill_tp", "decode_tp", "tp") if f in taken]
    if args.profile is None or args.model is None or not (tp_fields or taken & {"profile", "model"}):
        return
    try:
        degrees = _profile_tps(args.profile, args.model)
    except UsageError as e:
        field = "model" if "model" in taken else "profile" if "profile" in taken else tp_fields[0]
        raise UsageError(f"{where}.{field}: {e}") from None
    from fluidopt.engines.disaggregated import check_fits

    for f in tp_fields:
        v = getattr(layout, f)
        for k, tp in enumerate(v if isinstance(v, tuple) else (v,)):
            name = f"{where}.{f}" + (f"[{k}]" if f == "tp" else "")
            if tp not in degrees:
                raise UsageError(f"{name} = {tp}: the profile {args.profile!r} has TP degrees "
                                 f"{', '.join(map(str, degrees))} for {args.model}")
            check_fits(args.model, tp, what=f"{name} = {tp}")


def refuse_placement_flags(args: argparse.Namespace) -> None:
    """The placement flags without --layout: refused by name."""
    from fluidopt.core.errors import UsageError

    for flag in ("profile", "model", "gpus", "tp", "lengths", "colocated_profile"):
        if getattr(args, flag, None) is not None:
            raise UsageError(f"--{flag.replace('_', '-')}: only with --layout colocated|disaggregated|best")


def _tps(text: str | None, available: list[int]) -> list[int]:
    from fluidopt.core.errors import UsageError

    if text is None:
        return available
    out = []
    for part in text.split(","):
        try:
            v = int(part)
        except ValueError:
            raise UsageError(f"--tp {text!r}: expected comma-separated integers, got {part.strip()!r}") from None
        if v not in available:
            raise UsageError(f"--tp {v}: the profile has TP degrees {', '.join(map(str, available))} for this model")
        out.append(v)
    return out


def _profile_tps(path: str, model: str) -> list[int]:
    from fluidopt.core.errors import UsageError
    from fluidopt.core.files import read_text_file

    text = read_text_file(Path(path), "--profile", UsageError)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"--profile {path!r}: not JSON ({e.msg}, line {e.lineno}); expected DistServe's profiler "
                         "JSON") from None
    if not isinstance(data, dict) or model not in data or not isinstance(data[model], dict):
        have = ", ".join(sorted(data)) if isinstance(data, dict) else "nothing"
        raise UsageError(f"--model {model!r}: not in --profile {path!r} (it has {have})")
    try:
        return sorted(int(k) for k in data[model])
    except ValueError:
        raise UsageError(f"--profile {path!r}: {model}: expected TP degrees as keys, got {sorted(data[model])}") from None


def run_placement(args: argparse.Namespace) -> int:
    import numpy as np

    from fluidopt.calibration.timemodels import load_distserve_profile
    from fluidopt.commands.validate import _kv_beside
    from fluidopt.core.errors import CalibrationError, UsageError
    from fluidopt.engines.disaggregated import check_fits, model_kv_bytes
    from fluidopt.planning.placement import checked_splits, search_placement

    layout, cluster = scenario_layout(args.scenario)
    if args.gpus is None and cluster is not None:
        args.gpus = cluster  # a scenario that states its layout: its GPUs are the fleet to split
    take_from_layout(args, layout, PLACEMENT_FIELDS, str(args.scenario), PLACEMENT_DEFAULTS)
    if args.profile is None or args.model is None or args.gpus is None:
        raise UsageError("--layout needs --profile JSON --model NAME --gpus N (e.g. --profile "
                         "profiler-a100-80g.distserve.json --model facebook/opt-13b --gpus 4), or a scenario whose "
                         "[pools] table names profile and model")
    if args.gpus < 1 or args.gpus > 64:
        raise UsageError(f"--gpus {args.gpus}: expected an integer from 1 to 64 (every split is simulated)")
    for flag in ("--slo-ttft-ms", "--slo-tpot-ms"):
        v = getattr(args, flag[2:].replace("-", "_"))
        if not (v > 0 and math.isfinite(v)):
            raise UsageError(f"{flag}: expected a time in ms > 0, got {v:g}")
    for flag in ("--prefill-overhead-ms", "--decode-request-ms", "--colocated-request-ms", "--link-latency-ms"):
        v = getattr(args, flag[2:].replace("-", "_"))
        if not (v >= 0 and math.isfinite(v)):
            raise UsageError(f"{flag}: expected a time in ms >= 0, got {v:g}")
    if args.prefill_max_tokens < 1:
        raise UsageError(f"--prefill-max-tokens: expected an integer >= 1, got {args.prefill_max_tokens}")
    if not 0 < args.attainment < 1:
        raise UsageError(f"--attainment {args.attainment:g}: expected a share strictly between 0 and 1")
    if not (args.link_gbps > 0 and math.isfinite(args.link_gbps)):
        raise UsageError(f"--link-gbps: expected a bandwidth in GB/s > 0, got {args.link_gbps:g}")
    tps = _tps(args.tp, _profile_tps(args.profile, args.model))
    fits = []
    for tp in tps:
        try:
            check_fits(args.model, tp, what="--tp")
            fits.append(tp)
        except UsageError:
            if args.tp is not None:
                raise
    if not fits:
        raise UsageError(f"--model {args.model}: its weights fit at none of the TP degrees {tps}")
    colo_profile = args.colocated_profile or args.profile
    if args.colocated_profile is not None:
        _profile_tps(colo_profile, args.model)
    extra = args.colocated_request_ms / 1e3

    def law(path: str, tp: int, per_request: float = 0.0):
        try:
            lw = load_distserve_profile(path, args.model, tp)
        except CalibrationError as e:
            raise UsageError(str(e)) from None
        if per_request:
            from fluidopt.engines.validation import with_overheads

            lw = with_overheads(lw, per_request=per_request)
        return lw

    layouts = ("colocated", "disaggregated") if args.layout == "best" else (args.layout,)
    checked_splits(args.gpus, fits, layouts)  # a fleet with room for no split (no decode pool): before any output
    prompt, output, source = _lengths(args, np)
    out = Path(args.out) if args.out else None
    if out is not None:
        from fluidopt.commands._checks import check_output_dir

        check_output_dir(out, "--out")
    show = not args.json

    def progress(split, row) -> None:
        if show:
            print(f"  {split.label():<44} goodput {row['goodput']:7.3f} req/s = {row['goodput_per_gpu']:.3f} per GPU "
                  f"(fluid bound {row['fluid_rate']:.3f})", flush=True)

    if show:
        print(f"fluidopt plan --layout {args.layout}: {args.model} on at most {args.gpus} GPUs, TP {fits}, "
              f"attainment >= {args.attainment:g} of TTFT < {args.slo_ttft_ms:g} ms and TPOT < {args.slo_tpot_ms:g} ms; "
              f"{args.requests} requests per rate from {source}", flush=True)
    seed = 0 if args.seed is None else args.seed
    res = search_placement(
        lambda tp: law(args.profile, tp), lambda tp: _kv_beside(Path(args.profile), args.model, tp), prompt, output,
        gpus=args.gpus, tps=fits, ttft=args.slo_ttft_ms / 1e3, tpot=args.slo_tpot_ms / 1e3, attainment=args.attainment,
        layouts=layouts, kv_bytes_per_token=model_kv_bytes(args.model), link_bandwidth=args.link_gbps * 1e9,
        link_latency=args.link_latency_ms / 1e3, prefill_max_tokens=args.prefill_max_tokens,
        prefill_overhead=args.prefill_overhead_ms / 1e3, decode_request_overhead=args.decode_request_ms / 1e3,
        colocated_law_of=lambda tp: law(colo_profile, tp, extra),
        colocated_kv_of=lambda tp: _kv_beside(Path(colo_profile), args.model, tp), requests=args.requests,
        seed=seed, progress=progress)
    if out is not None:
        from fluidopt.core.files import atomic_path

        with atomic_path(out / "placement.csv") as tmp:
            res.table.to_csv(tmp, index=False)
    d = res.to_dict()
    d.update(model=args.model, profile=str(args.profile), lengths=source, layout=args.layout)
    if args.json:
        print(json.dumps(d, indent=2, default=float))
        return 0
    b, f = d["best"], d["best_on_fleet"]
    print(f"best per GPU: {_label(b)}: {b['goodput']:.3f} req/s on {b['gpus']} GPUs = {b['goodput_per_gpu']:.3f} per GPU")
    if f is not None and f is not b:
        print(f"best using all {args.gpus} GPUs: {_label(f)}: {f['goodput']:.3f} req/s = {f['goodput_per_gpu']:.3f} per GPU")
    if out is not None:
        print(f"wrote {out / 'placement.csv'}")
    return 0


def _label(row: dict) -> str:
    from fluidopt.planning.placement import Split

    return Split(row["layout"], row["prefill_tp"], row["prefill_instances"], row["decode_tp"],
                 row["decode_instances"]).label()


def _lengths(args, np):
    """(prompt, output, where from): the measured runs' pairs, or the scenario's classes at their means."""
    if args.lengths:
        from fluidopt.core.errors import TraceError, UsageError
        from fluidopt.engines.validation import read_measured

        try:
            runs = [read_measured(f) for f in args.lengths]
        except TraceError as e:
            raise UsageError(str(e)) from None
        return (np.concatenate([r.prompt for r in runs]), np.concatenate([r.output for r in runs]),
                f"{len(runs)} measured run(s)")
    from fluidopt.scenario import load_scenario

    sc = load_scenario(args.scenario)
    rates = np.array([c.rate for c in sc.classes], dtype=float)
    # 1,000 requests mixed in proportion to the class rates (largest remainders), each at its class's means
    share = rates / rates.sum() * 1000
    n = np.floor(share).astype(int)
    n[np.argsort(-(share - n), kind="stable")[: 1000 - n.sum()]] += 1
    prompt = np.repeat([max(1, round(c.prompt)) for c in sc.classes], n)
    output = np.repeat([max(1, round(c.decode)) for c in sc.classes], n)
    return prompt, output, f"scenario {sc.name!r} (class means, mixed by rate)"
