"""Speed of the planning workflows (numbers recorded in docs/planning.md and docs/scaling.md).

    python benchmarks/bench_plan.py grid       # 100 x 100 price grid, bundled and separate, direct highspy path
    python benchmarks/bench_plan.py bound      # the capacity LP (n as a variable) on the paper instance
    python benchmarks/bench_plan.py plan       # fluid bound + verified search at 5 seeds, 2 workers
    python benchmarks/bench_plan.py scaling    # one 12-run comparison per executor backend
"""

from __future__ import annotations

import os
import sys
import time


def grid() -> None:
    import numpy as np
    import scipy.linalg  # noqa: F401 - imported once, outside the timing

    import fluidopt
    from fluidopt.pricing import price_grid

    sc = fluidopt.default_scenario()
    p = np.linspace(0.0, 0.5, 100)
    t0 = time.perf_counter()
    g = price_grid(sc, p, p)
    print(f"100 x 100 grid, bundled and separate: {len(g)} LPs in {time.perf_counter() - t0:.2f} s "
          f"(first call in this process: includes importing Pyomo and HiGHS)")
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        g = price_grid(sc, p, p)
        times.append(time.perf_counter() - t0)
    print(f"100 x 100 grid again, solver stack loaded: best of 3 {min(times):.2f} s "
          f"({', '.join(f'{t:.2f}' for t in times)})")


def bound() -> None:
    import fluidopt
    from fluidopt.fluid.capacity import fluid_fleet_bound
    from fluidopt.fluid.sli import MinServedFraction

    sc = fluidopt.default_scenario()
    slis = [MinServedFraction(c, 0.99) for c in sc.class_names]
    fluid_fleet_bound(sc, slis)
    t0 = time.perf_counter()
    for _ in range(100):
        fb = fluid_fleet_bound(sc, slis)
    print(f"capacity LP: n* = {fb.gpus:.4f} ({fb.binding_sli}), {(time.perf_counter() - t0) * 10:.2f} ms per solve")


def plan() -> None:
    import fluidopt
    from fluidopt.harness.executor import LocalExecutor
    from fluidopt.planning.fleet import PlanSLIs
    from fluidopt.planning.fleet import plan as run_plan

    t0, c0 = time.perf_counter(), os.times()
    with LocalExecutor(2) as ex:
        r = run_plan(fluidopt.default_scenario(), PlanSLIs(served=0.99), seeds=5, executor=ex, progress=False)
    c1 = os.times()
    cpu = (c1.user + c1.system + c1.children_user + c1.children_system) - (c0.user + c0.system + c0.children_user
                                                                            + c0.children_system)
    row = r.table.iloc[0]
    print(f"plan (paper, served 0.99, 5 seeds, 2 workers): n_fluid {row['n_fluid']:.2f}, n_sim {int(row['n_sim'])}, "
          f"{time.perf_counter() - t0:.1f} s wall, {cpu:.1f} s CPU")


def scaling() -> None:
    import fluidopt
    from fluidopt.harness import compare
    from fluidopt.harness.executor import DaskExecutor, LocalExecutor

    sc = fluidopt.default_scenario(gpus=200)
    ref = None
    backends = [("local-1", lambda: LocalExecutor(1)), ("local-2", lambda: LocalExecutor(2)),
                ("local-4", lambda: LocalExecutor(4)), ("dask-local-2", lambda: DaskExecutor(2))]
    for name, make in backends:
        t0 = time.perf_counter()
        with make() as ex:
            t1 = time.perf_counter()
            c = compare(sc, ["gate-and-route", "fi-wsp"], seeds=range(6), horizon=600.0, warmup=150.0, executor=ex,
                        progress=False)
            t2 = time.perf_counter()
        cols = [k for k in c.runs.columns if k != "wall_seconds"]
        same = ref is None or c.runs[cols].equals(ref)
        ref = c.runs[cols] if ref is None else ref
        print(f"{name}: {len(c.runs)} runs, wall {t2 - t1:.1f} s (start-up {t1 - t0:.1f} s), "
              f"sum of run walls {c.runs['wall_seconds'].sum():.1f} s, same numbers: {same}", flush=True)


if __name__ == "__main__":  # worker processes re-import this module: keep the work under the guard
    {"grid": grid, "bound": bound, "plan": plan, "scaling": scaling}[sys.argv[1] if len(sys.argv) > 1 else "grid"]()
