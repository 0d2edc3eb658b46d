"""``--hit-ratio H`` and ``--from-trace TRACE``, shared by ``solve``, ``plan`` and ``price``: the fluid model
with a prefix cache (docs/prefix-cache.md). Every class then prefills (1 - H) x its prompt and keeps the
whole prompt in KV; ``--from-trace`` estimates H with :func:`fluidopt.workloads.prefix.hit_ratio`."""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from fluidopt.core.errors import UsageError

__all__ = ["add_cache_arguments", "apply_cache", "cache_given", "check_cache_args", "check_cache_simulated"]

_RULES = ("round-robin", "least-load", "sglang", "llm-d", "consistent-hash", "consistent-hash-bounded")


def add_cache_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("prefix cache (the fluid model with reuse; docs/prefix-cache.md)")
    g.add_argument("--hit-ratio", type=float, default=None, metavar="H",
                   help="share of prompt tokens found in a prefix cache, every class (0 <= H < 1): the fluid model "
                        "prefills (1 - H) x prompt and keeps the whole prompt in KV")
    g.add_argument("--from-trace", default=None, metavar="TRACE",
                   help="estimate H from a JSON-lines trace with block hashes (Mooncake format) under --cache-rule "
                        "over --cache-instances instances of --cache-blocks blocks each")
    g.add_argument("--cache-rule", default=None, choices=_RULES,
                   help="with --from-trace: the routing rule (default round-robin)")
    g.add_argument("--cache-instances", type=int, default=None, metavar="N",
                   help="with --from-trace: instances, each with its own cache (default: the scenario's gpus)")
    g.add_argument("--cache-blocks", type=int, default=None, metavar="B",
                   help="with --from-trace: blocks per instance's cache (default: unlimited)")


def cache_given(args: argparse.Namespace) -> bool:
    return getattr(args, "hit_ratio", None) is not None or getattr(args, "from_trace", None) is not None


def check_cache_args(args: argparse.Namespace) -> None:
    """One line for any bad value, before any work."""
    h, trace = args.hit_ratio, args.from_trace
    if h is not None and trace is not None:
        raise UsageError("--hit-ratio, --from-trace: expected one of them, got both")
    if h is not None and not (math.isfinite(h) and 0.0 <= h < 1.0):
        raise UsageError(f"--hit-ratio: expected a number in [0, 1) (the share of prompt tokens cached), got {h:g}")
    for flag, v in (("--cache-rule", args.cache_rule), ("--cache-instances", args.cache_instances),
                    ("--cache-blocks", args.cache_blocks)):
        if v is not None and trace is None:
            raise UsageError(f"{flag}: only used with --from-trace")
    for flag, v in (("--cache-instances", args.cache_instances), ("--cache-blocks", args.cache_blocks)):
        if v is not None and v < 1:
            raise UsageError(f"{flag}: expected an integer >= 1, got {v}")
    if trace is not None and not Path(trace).is_file():
        raise UsageError(f"--from-trace: {trace!r}: no such file (expected a JSON-lines trace with block hashes)")


def apply_cache(args: argparse.Namespace, scenario: Any) -> Any:
    """The scenario with every class's ``hit_ratio`` set from ``--hit-ratio`` or estimated by ``--from-trace``
    (its overall token hit ratio; the timing law is the scenario's GPU: tau_mix / chunk seconds per
    uncached prompt token, tau_mix per output token); unchanged without either."""
    check_cache_args(args)
    if not cache_given(args):
        return scenario
    h = args.hit_ratio
    if args.from_trace is not None:
        from fluidopt.workloads.jsonl import read_jsonl_trace
        from fluidopt.workloads.prefix import H_MAX, hit_ratio_on_gpu

        n = args.cache_instances or scenario.gpus
        rule = args.cache_rule or "round-robin"
        est = hit_ratio_on_gpu(read_jsonl_trace(args.from_trace), scenario.gpu, rule, n, args.cache_blocks)
        h = min(est.hit_ratio, H_MAX)
        blocks = "unlimited" if args.cache_blocks is None else f"{args.cache_blocks:,}"
        print(f"--from-trace: hit ratio {h:.4f} ({rule}, {n} instances, {blocks} blocks each; one global cache "
              f"{est.ideal:.4f})", file=sys.stderr)
    return replace(scenario, classes=tuple(replace(c, hit_ratio=float(h)) for c in scenario.classes))


def check_cache_simulated(scenario: Any, what: str) -> None:
    """Refuse a simulation of a scenario whose classes have a hit ratio: the engine prefills every prompt
    token (its prefix cache is the next step), so it would not verify the cache-aware fluid numbers."""
    cached = [c.name for c in scenario.classes if c.hit_ratio > 0]
    if cached:
        raise UsageError(f"{what}: classes {', '.join(cached)} have a prefix-cache hit ratio, but the simulator does "
                         "not model the cache yet (docs/prefix-cache.md); add --fluid-only, or drop the hit ratio")
