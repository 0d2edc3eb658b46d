"""Shared CLI pieces: controller options (``--option KEY=VALUE``) and user modules (``--import``)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from fluidopt.control.registry import import_user_modules
from fluidopt.core.errors import UsageError

__all__ = ["add_controller_arguments", "add_trace_arguments", "format_policies", "import_user_modules", "parse_options",
           "replay_from_args"]


def add_controller_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="controller option passed to the policy's factory (repeatable); VALUE is read as "
                        "JSON when it parses (numbers, true/false, lists), else as a string")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import a module or .py file first, so the policies it registers can be named "
                        "(repeatable)")


def parse_options(specs: list[str]) -> dict[str, Any]:
    """``["chunked=true", "predictor=oracle"]`` -> ``{"chunked": True, "predictor": "oracle"}``."""
    out: dict[str, Any] = {}
    for spec in specs:
        key, sep, text = spec.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise UsageError(f"--option {spec!r}: expected KEY=VALUE with KEY a Python identifier")
        if key in out:
            raise UsageError(f"--option {key}: given twice")
        try:
            out[key] = json.loads(text)
        except json.JSONDecodeError:
            out[key] = text
    return out


def format_policies() -> str:
    """The registered policies, one per line: name, description, and the options it accepts."""
    from fluidopt.control.registry import available, policy_options

    lines = []
    for name, desc in available().items():
        opts = policy_options(name)
        lines.append(f"{name:30s} {desc}")
        lines.append(f"{'':30s}   options: {', '.join(opts) if opts else '(none)'}")
    return "\n".join(lines)


def add_trace_arguments(p: argparse.ArgumentParser) -> None:
    """``--trace FILE`` and ``--speedup K``, shared by ``simulate`` and ``run``."""
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="replay a trace instead of the scenario's Poisson arrivals: a CSV with columns "
                        "time,prompt_tokens,output_tokens[,class], an Azure LLM inference trace "
                        "(TIMESTAMP,ContextTokens,GeneratedTokens) or Mooncake JSON lines (timestamp in ms,"
                        "input_length,output_length,hash_ids: its block hashes feed the simulator's prefix cache); needs "
                        "--service tokens")
    p.add_argument("--trace-format", default=None, metavar="SPEC",
                   help="with a JSON-lines --trace other than Mooncake's: its fields, time unit and block size as "
                        "KEY=VALUE,... with keys time, prompt, output, hashes (none: no hashes), class, unit "
                        "(seconds per time unit), block (tokens per block); e.g. time=ts,unit=1,block=16")
    p.add_argument("--speedup", type=float, default=1.0, metavar="K",
                   help="with --trace: compress time by K (K times the arrival rate; K < 1 stretches it; default 1)")


def replay_from_args(args: argparse.Namespace, scenario: Any) -> tuple[Any, Any]:
    """(scenario, replay workload) for ``--trace``, or (scenario, None) without it; bad values are one line."""
    fmt_spec = getattr(args, "trace_format", None)
    if args.trace is None:
        if fmt_spec is not None:
            raise UsageError("--trace-format: only used with --trace")
        return scenario, None
    from fluidopt.workloads.jsonl import is_jsonl, parse_format
    from fluidopt.workloads.traces import replay

    fmt = None
    if fmt_spec is not None:
        fmt = parse_format(fmt_spec)
        if Path(args.trace).is_file() and not is_jsonl(args.trace):
            raise UsageError(f"--trace-format: {args.trace!r} is not JSON lines; the format of a CSV trace is read "
                             "from its header")
    if args.service != "tokens":
        raise UsageError("--trace: a trace gives token counts, so it runs with --service tokens")
    if not (args.speedup > 0 and math.isfinite(args.speedup)):
        raise UsageError(f"--speedup: expected a finite number > 0, got {args.speedup}")
    return replay(args.trace, scenario, speedup=args.speedup, jsonl_format=fmt)
