"""Pricing what-if on the paper's instance: bundled against separate token prices, the price of an SLI.

1. A grid of prefill and decode token prices (c_p per prompt token, c_d per output token), bundled and
   separate: the fluid LP's revenue per GPU per second and each class's served fraction (heatmaps),
   solved through the direct highspy path (fluidopt.fluid.direct).
2. The GPU and SLI shadow prices at the scenario's own prices.
3. The price of an SLI: LP revenue against the prefill fairness bound and against the TPOT bound
   (the paper's Figs. 8-10 analogues).
4. A few grid points simulated with Gate-and-Route (bundled) through fluidopt.harness.compare: where
   the LP's promise and the simulated revenue part.

    python examples/pricing_whatif.py              # about a minute on 2 cores
    python examples/pricing_whatif.py --quick      # a few seconds
"""

from __future__ import annotations

from fluidopt.core.interrupt import script_guard

script_guard()  # Ctrl-C / SIGTERM from here on, the imports below included: one line, exit 130 / 143

import argparse
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import numpy as np

import fluidopt
from fluidopt.harness.executor import add_executor_arguments, executor_from_args
from fluidopt.pricing import grid_figure, pareto, pareto_figure, price_grid, shadow_prices, simulate_points

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", type=int, default=60, help="prices per axis (default 60)")
    ap.add_argument("--gpus", type=int, default=200, help="fleet for the simulated points")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--horizon", type=float, default=600.0)
    add_executor_arguments(ap, workers=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "examples" / "pricing_whatif")
    a = ap.parse_args(argv)
    if a.quick:
        a.grid, a.gpus, a.seeds, a.horizon = 12, 10, 1, 80.0
    t0 = time.perf_counter()
    sc = fluidopt.default_scenario()
    a.out.mkdir(parents=True, exist_ok=True)
    prices = np.linspace(0.0, 0.5, a.grid)
    grid = price_grid(sc, prices, prices)
    grid.to_csv(a.out / "grid.csv", index=False)
    grid_figure(grid).savefig(a.out / "grid.png", dpi=90)
    print(f"{len(grid)} LPs ({a.grid} x {a.grid} prices, bundled and separate) in {grid.attrs['seconds']:.2f} s\n")
    at = grid[(np.isclose(grid["prefill_price"], prices[len(prices) // 5]))
              & (np.isclose(grid["decode_price"], prices[len(prices) // 2]))]
    print(at[["pricing", "prefill_price", "decode_price", "revenue_per_gpu", "served[short-prompt]",
              "served[long-prompt]"]].to_string(index=False))
    print("\nshadow prices at c_p = 0.1, c_d = 0.2 (with a TPOT SLI of 30 ms):")
    from fluidopt.fluid.sli import TPOT

    print(shadow_prices(sc, slis=(TPOT(0.03),)).to_string(index=False))
    k = 8 if a.quick else 25
    fair = pareto(sc, "fairness", np.linspace(0.0, 0.2, k))
    tpot = pareto(sc, "tpot", np.linspace(sc.gpu.tau_solo * 1.001, 0.034, k))
    pareto_figure(fair, tpot).savefig(a.out / "pareto.png", dpi=90)
    print("\nprice of the prefill fairness SLI (bundled):")
    print(fair[fair["pricing"] == "bundled"][["bound", "revenue_per_gpu"]].iloc[:: max(1, k // 6)].to_string(index=False))
    print("\nprice of the TPOT SLI (bundled):")
    print(tpot[tpot["pricing"] == "bundled"][["bound", "revenue_per_gpu"]].iloc[:: max(1, k // 6)].to_string(index=False))
    points = [(0.1, 0.2), (0.3, 0.1), (0.05, 0.4)]
    with executor_from_args(a) as ex:
        sim = simulate_points(sc.with_gpus(a.gpus), points, seeds=range(a.seeds), horizon=a.horizon,
                              warmup=a.horizon / 4, executor=ex, out=a.out / "runs", progress=False)
    print(f"\nGate-and-Route at n = {a.gpus} against the LP's promise (bundled):")
    print(sim.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"\nfiles under {a.out}; {time.perf_counter() - t0:.0f} s wall")
    return 0


if __name__ == "__main__":
    from fluidopt.core.interrupt import script_main

    # Ctrl-C / SIGTERM: one line on what was kept, exit 130 / 143, no traceback
    raise SystemExit(script_main(main))
