"""Benchmark the fluid LP: build and solve times for 2, 10 and 50 classes, and a 1,000-point price sweep.

Not a test. Run from the repository root:

    python benchmarks/bench_lp.py            # full run (about a minute on one core)
    python benchmarks/bench_lp.py --repeat 3

Prints markdown tables; the recorded numbers are in docs/benchmarks-lp.md. Every random scenario is
drawn from a seeded generator, so the instances are the same on every run.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np

import fluidopt
from fluidopt import GPUProfile, RequestClass, Scenario
from fluidopt.fluid import (
    TPOT,
    FluidModel,
    MinServedFraction,
    PrefillFairness,
    solve_fluid,
    solve_fluid_cvxpy,
    sweep,
)


def random_scenario(n_classes: int, seed: int = 0) -> Scenario:
    """Dolly-like classes (prompt 40-1,200 tokens, output 140-920 tokens) on the paper's GPU, n = 500."""
    rng = np.random.default_rng(seed)
    gpu = GPUProfile.from_gamma(alpha=0.0174, beta=6.2e-5, gamma=45.45, chunk=256, batch=16)
    classes = tuple(
        RequestClass(
            name=f"class-{i}",
            prompt=float(rng.uniform(40, 1200)),
            decode=float(rng.uniform(140, 920)),
            rate=float(rng.uniform(0.25, 0.5) / n_classes * 2 * 500),
            patience=float(rng.uniform(0.05, 0.2)),
        )
        for i in range(n_classes)
    )
    return Scenario(gpu=gpu, gpus=500, classes=classes, prefill_price=0.1, decode_price=0.2, name=f"random-{n_classes}")


def slis_for(s: Scenario) -> tuple:
    """A few SLIs that bind or nearly bind: fairness, TPOT and served fractions for half of the classes."""
    return (PrefillFairness(0.05), TPOT(0.0245, penalty=1e4),
            *(MinServedFraction(c, 0.5) for c in s.class_names[: max(1, s.n_classes // 2)]))


def median_seconds(fn, repeat: int) -> float:
    """Median CPU seconds of this process (threads included) over ``repeat`` calls.

    CPU time rather than wall time: the benchmark machine is shared, and waiting for a core is not
    the solver's cost. Sweeps report both.
    """
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def bench_sizes(repeat: int) -> list[dict]:
    rows = []
    for n in (2, 10, 50):
        s = random_scenario(n, seed=n)
        for pricing in ("bundled", "separate"):
            for with_slis in (False, True):
                slis = slis_for(s) if with_slis else ()
                rows.append(_time_one(n, s, pricing, slis, repeat))
    return rows


def _time_one(n: int, s: Scenario, pricing: str, slis: tuple, repeat: int) -> dict:
    build = median_seconds(lambda: FluidModel(s, pricing, slis), repeat)
    first = median_seconds(lambda: FluidModel(s, pricing, slis).solve(), repeat)
    fm = FluidModel(s, pricing, slis)
    fm.solve()
    shifted = s.with_prices(0.11, 0.19)
    resolve = median_seconds(lambda: (fm.update(shifted), fm.solve()), repeat)
    cvx = median_seconds(lambda: solve_fluid_cvxpy(s, pricing, slis), repeat)
    sol = solve_fluid(s, pricing, slis)
    return {"classes": n, "pricing": pricing, "slis": len(slis), "rows": _rows(fm), "build_ms": build * 1e3,
            "build_and_solve_ms": first * 1e3, "update_and_resolve_ms": resolve * 1e3,
            "cvxpy_clarabel_ms": cvx * 1e3, "objective": sol.objective_per_gpu}


def _rows(fm: FluidModel) -> int:
    import pyomo.environ as pyo

    return sum(1 for _ in fm.model.component_data_objects(pyo.Constraint, active=True))


def bench_sweep() -> list[dict]:
    rows = []
    cases = [
        ("paper, bundled", fluidopt.default_scenario(), "bundled", ()),
        ("paper, separate", fluidopt.default_scenario(), "separate", ()),
        ("paper, bundled, TPOT 0.0242 s", fluidopt.default_scenario(), "bundled", (TPOT(0.0242),)),
        ("10 classes, bundled", random_scenario(10, seed=10), "bundled", ()),
    ]
    cps, cds = np.linspace(0.0, 0.5, 40), np.linspace(0.02, 0.5, 25)  # 1,000 points
    for label, s, pricing, slis in cases:
        c0 = time.process_time()
        df = sweep(s, cps, cds, pricing=pricing, slis=slis)
        cpu = time.process_time() - c0
        a = df.attrs
        # The alternative the sweep avoids: a fresh model per point (timed on 50 points, scaled).
        c0 = time.process_time()
        for cp, cd in zip(cps[:50], np.resize(cds, 50)):
            solve_fluid(s.with_prices(cp, cd), pricing, slis)
        rebuild = (time.process_time() - c0) / 50 * len(df)
        rows.append({"case": label, "points": a["points"], "wall_s": a["seconds"], "cpu_s": cpu,
                     "cpu_ms_per_point": cpu / a["points"] * 1e3, "build_ms": a["build_seconds"] * 1e3,
                     "cpu_s_if_rebuilt_per_point": rebuild, "optimal": int((df.status == "optimal").sum())})
    return rows


def markdown(rows: list[dict]) -> str:
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="repeats per timing (median reported)")
    args = ap.parse_args()
    import highspy
    import pyomo

    print(f"python {platform.python_version()}, pyomo {pyomo.version.version}, highspy "
          f"{'.'.join(map(str, (highspy.HIGHS_VERSION_MAJOR, highspy.HIGHS_VERSION_MINOR, highspy.HIGHS_VERSION_PATCH)))}, "
          f"{platform.machine()}")
    solve_fluid(fluidopt.default_scenario())  # warm up imports
    solve_fluid_cvxpy(fluidopt.default_scenario())
    print("\n## Build and solve (median CPU milliseconds of", args.repeat, "runs)\n")
    print(markdown(bench_sizes(args.repeat)))
    print("\n## 1,000-point price sweep (40 prefill x 25 decode prices)\n")
    print(markdown(bench_sweep()))


if __name__ == "__main__":
    main()
