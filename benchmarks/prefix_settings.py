"""The cache-aware routers at their documented settings on the Mooncake trace, 0.75 fluid load, 8 GPUs (issue 42).

    python benchmarks/prefix_settings.py [--trace PATH] [--load 0.75] [--kv both|unlimited|80gb] [--boot 1000]
                                         [--other-weights] [--out OUT.json]

Issue 42 asks the best cache-aware router to cut mean TTFT by at least 25% against least-load at 0.75 fluid
load on 8 instances. The head-to-head (benchmarks/prefix_headtohead.py) runs ``sglang`` and ``llm-d`` with
their fluidopt defaults. This script replays the same trace, the same way (the head-to-head's speedup,
records, statistics and paired block bootstrap against ``least-requests``), with the settings the routers'
own projects publish, and with no others (no sweep: a user can choose among these without the trace's
answers):

``sglang`` (balance_abs_threshold, balance_rel_threshold, cache_threshold):
  * 32, 1.0001, 0.5: the first sglang-router release's defaults (fluidopt's defaults);
  * 64, 1.5, 0.3: the defaults of the current SGLang router / model gateway
    (sgl-project/sglang, sgl-router/py_src/sglang_router/router_args.py, ``RouterArgs``);
  * 32, 1.1, 0.5: NVIDIA Dynamo's port of the SGLang cache-aware policy (its "two tier" defaults).

``llm-d`` (prefix_weight, queue_weight, kv_weight), from the scheduling profiles llm-d and the Gateway API
Inference Extension ship (``prefix-cache-scorer``, ``queue-scorer``, ``kv-cache-utilization-scorer``):
  * 3, 2, 2: llm-d's inference-scheduling profile (fluidopt's default);
  * 3, 1, 1 and 2, 1, 1: the inference extension's prefix-aware sample profiles;
  * 2, 1, 0: llm-d-inference-scheduler's sample with a prefix scorer (2) and one load scorer (1).

``dynamo-kv`` (overlap_score_weight, router_temperature), NVIDIA Dynamo's KV router
(ai-dynamo/dynamo ``lib/llm/src/kv_router/config.rs``, ``KvRouterConfig::default``; the frontend's
``--kv-overlap-score-weight`` and ``--router-temperature``):
  * 1.0, 0.0: Dynamo's defaults;
  * 0.0, 0.0: the weight Dynamo's disaggregated examples give the decode router ("pure load balancing":
    the cost is the decode blocks alone).

``mooncake``, Mooncake's Conductor (FAST 2025, Algorithm 1), has no setting: its estimate comes from the
scenario's iteration-time law; one row.

``--other-weights`` adds ``dynamo-kv`` at overlap weights 2 and 4 (temperature 0), as rows marked "not published". No
project publishes these: they show the weight's effect, and were chosen after seeing the trace.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prefix_headtohead import (  # noqa: E402
    BASELINE,
    GPUS,
    KV_SETTINGS,
    SCENARIO,
    TRACE,
    _boot,
    _rel,
    _replay_at_load,
    _run,
    _stats,
    _trace_file,
)

SETTINGS = [
    ("least-requests", "least-requests", {}),
    ("jsq", "jsq", {}),
    ("sglang 32/1.0001/0.5 (first release; default)", "sglang",
     {"balance_abs_threshold": 32, "balance_rel_threshold": 1.0001, "cache_threshold": 0.5}),
    ("sglang 64/1.5/0.3 (current gateway)", "sglang",
     {"balance_abs_threshold": 64, "balance_rel_threshold": 1.5, "cache_threshold": 0.3}),
    ("sglang 32/1.1/0.5 (Dynamo's port)", "sglang",
     {"balance_abs_threshold": 32, "balance_rel_threshold": 1.1, "cache_threshold": 0.5}),
    ("llm-d 3/2/2 (llm-d profile; default)", "llm-d", {"prefix_weight": 3, "queue_weight": 2, "kv_weight": 2}),
    ("llm-d 3/1/1 (inference extension)", "llm-d", {"prefix_weight": 3, "queue_weight": 1, "kv_weight": 1}),
    ("llm-d 2/1/1 (inference extension)", "llm-d", {"prefix_weight": 2, "queue_weight": 1, "kv_weight": 1}),
    ("llm-d 2/1/0 (scheduler sample)", "llm-d", {"prefix_weight": 2, "queue_weight": 1, "kv_weight": 0}),
    ("dynamo-kv 1/0 (Dynamo's defaults)", "dynamo-kv", {"overlap_score_weight": 1.0, "router_temperature": 0.0}),
    ("dynamo-kv 0/0 (load balancing: Dynamo's disaggregated decode router)", "dynamo-kv",
     {"overlap_score_weight": 0.0, "router_temperature": 0.0}),
    ("mooncake (Mooncake's Conductor; no options)", "mooncake", {}),
]
OTHER = [  # --other-weights: not published settings (module docstring)
    ("dynamo-kv 2/0 (not published)", "dynamo-kv", {"overlap_score_weight": 2.0, "router_temperature": 0.0}),
    ("dynamo-kv 4/0 (not published)", "dynamo-kv", {"overlap_score_weight": 4.0, "router_temperature": 0.0}),
]


def _prefill_own(rec, gpu) -> float:
    """Mean over completed requests of one whole-prompt prefill iteration, alpha + beta x uncached tokens
    (seconds): the part of TTFT that routing changes only through the hit ratio; the rest is waiting."""
    done = rec[rec.outcome == "completed"]
    return float((gpu.alpha + gpu.beta * (done.prompt - done.cached_prompt.fillna(0))).mean())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--load", type=float, default=0.75)
    ap.add_argument("--kv", choices=("both", "unlimited", "80gb"), default="both")
    ap.add_argument("--boot", type=int, default=1000)
    ap.add_argument("--other-weights", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    trace = _trace_file("prefix_settings", args.trace)
    if trace is None:
        return 2
    warnings.simplefilter("ignore")
    from fluidopt.scenario import load_scenario

    t_start = time.perf_counter()
    base = replace(load_scenario(SCENARIO), gpus=GPUS)
    k, load, base, wl = _replay_at_load(trace, args.load, base)
    span = float(wl.frame["time"].max())
    prices = (float(base.prefill_price), float(base.decode_price))
    print(f"Mooncake conversation trace, speedup {k:.4f}, fluid load {load:.4f}, {GPUS} GPUs")
    kvs = KV_SETTINGS[args.kv]
    settings = SETTINGS + (OTHER if args.other_weights else [])
    out: dict = {"speedup": k, "fluid_load": load, "kv": {}}
    for label, cap in kvs:
        sc = replace(base, gpu=replace(base.gpu, kv_capacity=None if cap is None else float(cap)))
        recs, rows = {}, {}
        with tempfile.TemporaryDirectory() as tmp:
            for name, policy, opts in settings:
                recs[name], sec = _run(sc, wl, policy, opts, Path(tmp))
                rows[name] = {**_stats(recs[name], span, prices), "wall_s": sec, "options": opts,
                              "prefill_own": _prefill_own(recs[name], sc.gpu)}
        ci = _boot(recs, span, args.boot)
        print(f"\nKV {label}: paired block bootstrap, {args.boot} replicates, relative to {BASELINE}")
        print("| router, setting | hit ratio | mean TTFT (s) | vs least-load | prefill alone (s) | waiting (s) | p99 TTFT (s) | "
              "mean E2E (s) | vs least-load |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, _, _ in settings:
            r = rows[name]
            print(f"| `{name}` | {r['hit_ratio']:.4f} | {r['ttft_mean']:.3f} | {_rel(r, rows[BASELINE], ci[name], 'ttft_mean')} | "
                  f"{r['prefill_own']:.3f} | {r['ttft_mean'] - r['prefill_own']:.3f} | {r['ttft_p99']:.2f} | {r['e2e_mean']:.2f} | {_rel(r, rows[BASELINE], ci[name], 'e2e_mean')} |")
        out["kv"][label] = {"capacity_tokens": cap, "rows": rows, "ci": ci}
    total = time.perf_counter() - t_start
    print(f"\ntotal {total:.0f} s wall")
    out["wall_seconds"] = total
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
