"""Capacity planning: how many GPUs of which profile for a demand and its SLIs, and what they cost.

Two demands: the paper's two classes (250 requests/s each, whole fleet) and the classes of the Azure
LLM inference trace (conversation, 2023; four classes by prompt and output length, patience 0.1/s),
when the trace is present. For three GPU profiles (the named ones in calibration/profiles.toml, each
with its price per GPU-hour) and demand growth 1x, 2x, 4x: the fluid lower bound on the fleet (one LP,
binding constraint named) and, for the paper demand at 1x, the fleet on which Gate-and-Route meets the
SLIs in simulation with 95% confidence (the search starts at the fluid bound), with the SLI-against-n
figure. Everything runs through fluidopt.planning.fleet, whose runs go through fluidopt.harness.executor (--dask or
--scheduler to scale out) and are kept in a results store under --out (a rerun skips them).

    python examples/capacity_planning.py                      # about 1-2 min on 2 cores
    python examples/capacity_planning.py --quick              # a few seconds: fluid bounds + a tiny search
    python examples/capacity_planning.py --trace PATH         # another Azure-format trace

The profiles serve different models (Qwen-8B and Qwen-4B on A100, Llama-2-7B on V100): the comparison
is between deployments, each with its own iteration-time law, for the same request classes.
"""

from __future__ import annotations

from fluidopt.core.interrupt import script_guard

script_guard()  # Ctrl-C / SIGTERM from here on, the imports below included: one line, exit 130 / 143

import argparse
import time
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import fluidopt
from fluidopt.core.model import Scenario
from fluidopt.harness.executor import add_executor_arguments, executor_from_args
from fluidopt.planning.fleet import PlanSLIs, plan

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ("qwen-8b-a100", "qwen-4b-a100", "llama2-7b-v100")
GROWTH = (1.0, 2.0, 4.0)
AZURE = Path("/work/shared/data/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv")


def trace_scenario(path: Path, max_requests: int | None = None) -> Scenario | None:
    """The trace's classes as a scenario (cluster rates from the trace; patience 0.1/s), or None."""
    if not path.exists():
        return None
    from fluidopt.workloads.traces import classes_from_trace, load_azure_trace

    w = load_azure_trace(path, max_requests=max_requests)  # 4 classes: prompt and output above or below the median
    classes = classes_from_trace(w, patience=0.1)
    base = fluidopt.default_scenario()
    return Scenario(gpu=base.gpu, gpus=1, classes=tuple(classes), prefill_price=base.prefill_price,
                    decode_price=base.decode_price, name="azure-conv")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--served", type=float, default=0.99)
    ap.add_argument("--tpot", type=float, default=0.05)
    ap.add_argument("--seeds", type=int, default=5)
    add_executor_arguments(ap, workers=2)
    ap.add_argument("--trace", type=Path, default=AZURE)
    ap.add_argument("--quick", action="store_true", help="tiny demand, 2 seeds, short runs")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "examples" / "capacity_planning")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    slis = PlanSLIs(served=a.served, tpot=a.tpot)
    paper = fluidopt.default_scenario()
    if a.quick:  # a fleet of a few GPUs and short runs cannot certify 99% with 95% confidence: 90%
        paper = replace(fluidopt.default_scenario(gpus=4), name="paper-tiny")
        slis = PlanSLIs(served=0.9, tpot=a.tpot)
    demands = [paper]
    tr = trace_scenario(a.trace, max_requests=2000 if a.quick else None)
    if tr is not None:
        demands.append(tr)
    a.out.mkdir(parents=True, exist_ok=True)
    print(f"SLIs: {slis.describe()}\n")
    for sc in demands:
        res = plan(sc, slis, profiles=PROFILES, growth=GROWTH, fluid_only=True)
        print(f"## {sc.name}: fluid lower bound per profile and demand growth "
              f"({', '.join(f'{c.name} {c.rate:.3g}/s' for c in sc.classes)})\n")
        cols = ["profile", "growth", "n_fluid", "n_fluid_int", "binding", "cost_per_hour",
                "cost_per_million_output_tokens", "cheapest"]
        print(res.table[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        res.table.to_csv(a.out / f"fluid_{sc.name}.csv", index=False)
        print()
    # the simulation-verified fleet for the paper demand at 1x, on the first profile
    with executor_from_args(a) as ex:
        kw = dict(seeds=2, horizon=250.0, warmup=60.0) if a.quick else dict(seeds=a.seeds)
        res = plan(paper, slis, profiles=PROFILES[:1], executor=ex, out=a.out / "store", **kw)
    r = res.table.iloc[0]
    print(f"## {paper.name} on {r['profile']}: verified in simulation ({res.policy}, {res.seeds} seeds)\n")
    print(f"fluid bound {r['n_fluid']:.2f} -> {int(r['n_fluid_int'])} GPUs; verified {int(r['n_sim'])} GPUs "
          f"(finite-n correction {int(r['correction'])}); {r['cost_per_hour']:.2f} per hour, "
          f"{r['cost_per_million_output_tokens']:.4f} per million output tokens")
    print(res.curves.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    res.curves.to_csv(a.out / "curves.csv", index=False)
    fig = res.figure()
    fig.savefig(a.out / "sli_vs_n.png", dpi=100)
    print(f"\nfigure: {a.out / 'sli_vs_n.png'}; {time.perf_counter() - t0:.0f} s wall")
    return 0


if __name__ == "__main__":
    from fluidopt.core.interrupt import script_main

    # Ctrl-C / SIGTERM: one line on what was kept, exit 130 / 143, no traceback
    raise SystemExit(script_main(main))
