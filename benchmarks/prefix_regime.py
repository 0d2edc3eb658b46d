"""Regime map of the prefix cache's gain on the Mooncake trace: load x KV capacity (issue 42).

    python benchmarks/prefix_regime.py [--trace PATH] [--loads 0.5,0.6,0.75,0.9,0.95] [--kv 40gb,80gb,unlimited]
                                       [--boot 300] [--out OUT.json] [--figure OUT.png]

For every (fluid load, KV capacity per GPU) cell: replay the whole trace on 8 GPUs of
examples/scenarios/mooncake-conversation.toml with time compressed to that load (cache-blind fluid load, as
benchmarks/prefix_headtohead.py), tokens mode, the cache on, under ``least-requests`` (least-load), ``jsq``
(the best cache-blind balancer of the head-to-head), and the cache-aware routers ``sglang``, ``llm-d``,
``dynamo-kv`` and ``mooncake`` with their defaults (all prefill first, no chunking, as the head-to-head's main rows). The gain is the best
cache-aware router's change in mean TTFT (and mean E2E) against least-load, with the paired block bootstrap
interval of prefix_headtohead.py (10 arrival windows, ``--boot`` replicates), and its token hit ratio beside
least-load's and the ideal (one global unlimited cache, 0.3736). KV capacities: an 80 GB and a 40 GB GPU's,
0.9 x the memory less Qwen3-8B's fp16 weights over 147,456 bytes of KV per token (377,061 and 132,921
tokens), and unlimited. ``--figure`` saves the map as a PNG (matplotlib).
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
    GPUS,
    ROOT,
    SCENARIO,
    TRACE,
    _boot,
    _replay_at_load,
    _run,
    _stats,
    _trace_file,
    kv_tokens,
)

KV = {"unlimited": None, **{f"{gb}gb": kv_tokens(gb) for gb in (40, 80)}}
POLICIES = ("least-requests", "jsq", "sglang", "llm-d", "dynamo-kv", "mooncake")
CACHE_AWARE = ("sglang", "llm-d")  # the "best cache-aware" column: the routers that balance request counts
DYNAMO = "dynamo-kv"  # its own column: it balances blocks (prefill tokens and active KV)
MOONCAKE = "mooncake"  # its own column: it balances estimated TTFT (queued prefill time + its own)


def _table(cells: list[dict]) -> None:
    """The regime map as a markdown table (the cells main() computes, or their --out JSON)."""

    def pct(c, p, m):
        lo, hi = c["ci"][p][m]
        return f"{100 * (c['rows'][p][m] / c['rows']['least-requests'][m] - 1):+.0f}% [{100 * lo:+.0f}, {100 * hi:+.0f}]"

    print("\n| fluid load | KV per GPU | least-load: hit ratio, mean TTFT (s) | best of `sglang`, `llm-d` | its hit ratio | "
          "mean TTFT vs least-load | mean E2E vs least-load | `dynamo-kv`: hit ratio | mean TTFT vs least-load | "
          "mean E2E vs least-load | `mooncake`: hit ratio | mean TTFT vs least-load | mean E2E vs least-load | "
          "`jsq`: mean TTFT vs least-load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in cells:
        ll, best = c["rows"]["least-requests"], min(CACHE_AWARE, key=lambda p: c["rows"][p]["ttft_mean"])
        kvname = "unlimited" if c["kv_tokens"] is None else f"{c['kv'][:-2]} GB ({c['kv_tokens']:,})"
        print(f"| {c['load']:.2f} | {kvname} | {ll['hit_ratio']:.3f}, {ll['ttft_mean']:.2f} | `{best}` | "
              f"{c['rows'][best]['hit_ratio']:.3f} | {pct(c, best, 'ttft_mean')} | {pct(c, best, 'e2e_mean')} | "
              f"{c['rows'][DYNAMO]['hit_ratio']:.3f} | {pct(c, DYNAMO, 'ttft_mean')} | {pct(c, DYNAMO, 'e2e_mean')} | "
              f"{c['rows'][MOONCAKE]['hit_ratio']:.3f} | {pct(c, MOONCAKE, 'ttft_mean')} | {pct(c, MOONCAKE, 'e2e_mean')} | "
              f"{pct(c, 'jsq', 'ttft_mean')} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--loads", default="0.5,0.6,0.75,0.9,0.95")
    ap.add_argument("--kv", default="40gb,80gb,unlimited")
    ap.add_argument("--boot", type=int, default=300)
    ap.add_argument("--out", default=None)
    ap.add_argument("--figure", default=None)
    args = ap.parse_args(argv)
    trace = _trace_file("prefix_regime", args.trace)
    if trace is None:
        return 2
    loads = [float(x) for x in args.loads.split(",")]
    kvs = [k.strip() for k in args.kv.split(",")]
    bad = [k for k in kvs if k not in KV]
    if bad:
        print(f"prefix_regime: --kv {bad[0]!r}: expected one of {', '.join(KV)}", file=sys.stderr)
        return 2
    warnings.simplefilter("ignore")
    from fluidopt.scenario import load_scenario

    sys.path.insert(0, str(ROOT))
    t_start = time.perf_counter()
    base0 = replace(load_scenario(SCENARIO), gpus=GPUS)
    cells = []
    with tempfile.TemporaryDirectory() as tmp:
        for load in loads:
            k, fl, base, wl = _replay_at_load(trace, load, base0)
            span = float(wl.frame["time"].max())
            prices = (float(base.prefill_price), float(base.decode_price))
            for kv in kvs:
                cap = KV[kv]
                sc = replace(base, gpu=replace(base.gpu, kv_capacity=None if cap is None else float(cap)))
                recs, rows = {}, {}
                for p in POLICIES:
                    recs[p], sec = _run(sc, wl, p, {}, Path(tmp))
                    rows[p] = {**_stats(recs[p], span, prices), "wall_s": sec}
                ci = _boot(recs, span, args.boot)
                best = min(CACHE_AWARE, key=lambda p: rows[p]["ttft_mean"])
                ll = rows["least-requests"]
                cell = {"load": fl, "speedup": k, "kv": kv, "kv_tokens": cap, "best": best, "rows": rows, "ci": ci,
                        "ttft_gain": rows[best]["ttft_mean"] / ll["ttft_mean"] - 1,
                        "e2e_gain": rows[best]["e2e_mean"] / ll["e2e_mean"] - 1,
                        "jsq_ttft_gain": rows["jsq"]["ttft_mean"] / ll["ttft_mean"] - 1,
                        "dynamo_ttft_gain": rows[DYNAMO]["ttft_mean"] / ll["ttft_mean"] - 1,
                        "mooncake_ttft_gain": rows[MOONCAKE]["ttft_mean"] / ll["ttft_mean"] - 1}
                cells.append(cell)
                print(f"load {fl:.3f} kv {kv:9s}: least-load TTFT {ll['ttft_mean']:.3f} s (h {ll['hit_ratio']:.3f}); "
                      f"{best} {rows[best]['ttft_mean']:.3f} s ({100 * cell['ttft_gain']:+.1f}%, h "
                      f"{rows[best]['hit_ratio']:.3f}); {DYNAMO} {100 * cell['dynamo_ttft_gain']:+.1f}% (h "
                      f"{rows[DYNAMO]['hit_ratio']:.3f}); {MOONCAKE} {100 * cell['mooncake_ttft_gain']:+.1f}% (h "
                      f"{rows[MOONCAKE]['hit_ratio']:.3f}); jsq {100 * cell['jsq_ttft_gain']:+.1f}% "
                      f"[{sum(r['wall_s'] for r in rows.values()):.1f} s]", flush=True)

    _table(cells)
    total = time.perf_counter() - t_start
    print(f"\ntotal {total:.0f} s wall")
    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
        for kv in kvs:
            cs = [c for c in cells if c["kv"] == kv]
            x = [c["load"] for c in cs]
            line = axes[0].plot(x, [100 * c["ttft_gain"] for c in cs], marker="o", label=f"{kv}: sglang / llm-d")[0]
            axes[0].plot(x, [100 * c["dynamo_ttft_gain"] for c in cs], marker="s", ls="--", color=line.get_color(),
                         label=f"{kv}: {DYNAMO}")
            axes[0].plot(x, [100 * c["mooncake_ttft_gain"] for c in cs], marker="^", ls=":", color=line.get_color(),
                         label=f"{kv}: {MOONCAKE}")
            axes[1].plot(x, [c["rows"][c["best"]]["hit_ratio"] for c in cs], marker="o", color=line.get_color(),
                         label=f"{kv}: sglang / llm-d")
            axes[1].plot(x, [c["rows"][DYNAMO]["hit_ratio"] for c in cs], marker="s", ls="--", color=line.get_color(),
                         label=f"{kv}: {DYNAMO}")
            axes[1].plot(x, [c["rows"][MOONCAKE]["hit_ratio"] for c in cs], marker="^", ls=":", color=line.get_color(),
                         label=f"{kv}: {MOONCAKE}")
        axes[0].set_ylabel("mean TTFT vs least-load (%)")
        axes[0].set_title("cache-aware routers", fontsize=9)
        axes[1].set_ylabel("its token hit ratio")
        axes[1].axhline(0.3736, color="k", ls=":", lw=1, label="ideal")
        for ax in axes:
            ax.set_xlabel("fluid load (cache-blind)")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.figure, dpi=100)
    if args.out:
        Path(args.out).write_text(json.dumps({"cells": cells, "wall_seconds": total}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
