"""Where disaggregation wins: goodput per GPU of the disaggregated and the colocated layout over the
prompt:output ratio, the TPOT bound and the load, from the fluid LP, checked by simulation at a few
points (issue 44, point 5; docs/planning.md, "Where disaggregation wins").

Not a test. Run from the repository root (needs ../shared/data/distserve-opt13b-a100):

    python benchmarks/disagg_map.py              # the LP maps (about 1 s)
    python benchmarks/disagg_map.py --simulate   # and the simulated check (a few minutes on one core)

Model: OPT-13B on A100-80GB, DistServe's profile (kernel times) at TP 1 and 2, KV capacities from
``max_num_tokens.csv``; one class of ``l`` prompt and ``o`` output tokens, ``l + o = 1024`` (ShareGPT's
mean is about 960), TTFT bound 200 ms.

* **Disaggregated**: :func:`fluidopt.fluid.disaggregated.solve_disaggregated` (minimum GPUs for one
  request/s) at each (prefill TP, decode TP) in {1, 2}^2; the best per GPU.
* **Colocated** (the same law on one instance that prefills and decodes, vLLM's prefill-first schedule),
  the fluid steady state of one class in closed form: an instance runs prefill batches of ``m`` prompts
  (the largest with ``m l <= 2048`` and ``t_p(m) <= TTFT``) between decode steps of ``B`` requests.
  Its rate is ``x = 1 / (t_p(m) / m + (o - 1) s(B) / B)`` requests/s, and a request's token gap is the
  step plus the prefill time spread over the tokens, ``s(B) + B t_p(m) / (m (o - 1))`` (the share of
  time spent prefilling, ``x t_p / m``, stretches every gap by ``1 / (1 - share)``). ``B`` is the
  largest that keeps that gap within the TPOT bound and ``B (l + o/2)`` within the KV capacity, in the
  regime of the decode law where ``x`` is highest; the best TP per GPU.
* **Load**: the fluid optimum per GPU does not depend on the load (every row is homogeneous), but whole
  instances do: at ``lambda`` requests/s a layout needs ``ceil(lambda N_p) tp_p + ceil(lambda N_d) tp_d``
  GPUs (disaggregated) or ``ceil(lambda / x) tp`` (colocated), and its goodput per GPU is lambda over
  that, best over the TP degrees.
* **Simulated check** (``--simulate``): :func:`fluidopt.planning.placement.search_placement` with both
  layouts on at most 4 GPUs at TP 1 and 2, the same profile for both (the colocated engine is vLLM's
  schedule), 2,000 requests per rate, 90% attainment of TTFT 200 ms and the point's TPOT bound, seed 0.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_engines import distserve_data  # noqa: E402

from fluidopt.calibration.timemodels import IterationLaw, load_distserve_profile  # noqa: E402
from fluidopt.core.errors import InfeasibleError  # noqa: E402
from fluidopt.fluid.disaggregated import DisaggClass, DisaggPools, solve_disaggregated  # noqa: E402

MODEL = "facebook/opt-13b"
TPS = (1, 2)
TOTAL = 1024  # prompt + output tokens
TTFT = 0.2
MAX_TOKENS = 2048
RATIOS = ((1, 8), (1, 4), (1, 2), (1, 1), (2, 1), (4, 1), (8, 1), (16, 1))  # prompt : output
TPOTS = (0.04, 0.06, 0.1, 0.2)  # s
LOADS = (0.5, 2.0, 8.0, 32.0)  # requests/s
# (prompt:output, TPOT s) where the simulation checks the LP's winner
SIM_POINTS = (((16, 1), 0.04), ((8, 1), 0.06), ((4, 1), 0.1), ((1, 1), 0.06), ((1, 2), 0.1))


def lengths(ratio: tuple[int, int]) -> tuple[int, int]:
    """(prompt, output) tokens with prompt:output = ratio and prompt + output = TOTAL."""
    p, o = ratio
    l = round(TOTAL * p / (p + o))
    return l, TOTAL - l


def colocated_rate(law: IterationLaw, kv: float, l: float, o: float, ttft: float, tpot: float) -> float:
    """Requests/s one colocated instance serves in the fluid limit (module docstring); 0 if none."""
    pf = law.prefill
    m = max(1, int(MAX_TOKENS // l))
    while m > 1 and pf.a + pf.b * m * l + pf.c * m * l * l > ttft:
        m -= 1
    tp_m = pf.a + pf.b * m * l + pf.c * m * l * l
    if tp_m > ttft:
        return 0.0
    ctx = l + o / 2
    dec = law.decode
    regimes = [(dec.small, 0.0, math.inf if dec.large is None else float(dec.threshold))]
    if dec.large is not None:
        regimes.append((dec.large, float(dec.threshold), math.inf))
    best = 0.0
    for (a, b, c), lo, hi in regimes:
        slope = b * ctx + c + tp_m / (m * (o - 1))  # the gap's growth per request of the batch
        cap = min((tpot - a) / slope, kv / ctx, math.nextafter(hi, 0.0) if hi < math.inf else math.inf)
        if cap <= max(lo, 0.0):
            continue
        x = 1.0 / (tp_m / m + (o - 1) * (a + (b * ctx + c) * cap) / cap)
        best = max(best, x)
    return best


def disaggregated_need(laws, kvs, l: float, o: float, ttft: float, tpot: float) -> dict:
    """{(tp_p, tp_d): (N_p, N_d)} instances per request/s from the LP (pairs without a solution left out)."""
    out = {}
    for tp in TPS:
        for td in TPS:
            try:
                sol = solve_disaggregated([DisaggClass("c", 1.0, l, o, ttft=ttft, tpot=tpot)],
                                          DisaggPools(laws[tp], laws[td], tp, td, kv_tokens=kvs[td], max_tokens=MAX_TOKENS),
                                          "min_gpus")
            except InfeasibleError:
                continue
            out[(tp, td)] = (sol.prefill_instances_total, sol.decode_instances_total)
    return out


def per_gpu(laws, kvs, l, o, tpot, load: float | None):
    """(disaggregated, colocated) goodput per GPU and the best configuration of each; load None: fluid."""
    need = disaggregated_need(laws, kvs, l, o, TTFT, tpot)
    dis = (0.0, "-")
    for (tp, td), (n_p, n_d) in need.items():
        gpus = tp * n_p + td * n_d if load is None else tp * math.ceil(load * n_p - 1e-9) + td * math.ceil(load * n_d - 1e-9)
        v = (1.0 if load is None else load) / gpus
        if v > dis[0]:
            dis = (v, f"P{tp}+D{td}")
    col = (0.0, "-")
    for tp in TPS:
        x = colocated_rate(laws[tp], kvs[tp], l, o, TTFT, tpot)
        if x <= 0:
            continue
        v = x / tp if load is None else load / (tp * math.ceil(load / x - 1e-9))
        if v > col[0]:
            col = (v, f"TP{tp}")
    return dis, col


def cell(dis, col) -> str:
    if dis[0] == 0 and col[0] == 0:
        return "neither"
    if winner(dis[0], col[0], 0.005) == "=":
        return "= (within 0.5%)"
    if dis[0] >= col[0]:
        return f"**D** +{(dis[0] / col[0] - 1) * 100:.0f}%" if col[0] > 0 else "**D** only"
    return f"C +{(col[0] / dis[0] - 1) * 100:.0f}%" if dis[0] > 0 else "C only"


def winner(d: float, c: float, tol: float = 1e-9) -> str:
    """D, C, or = when within ``tol`` of each other (relative; the search's bisection is to 2%)."""
    if abs(d - c) <= tol * max(d, c):
        return "="
    return "D" if d > c else "C"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--simulate", action="store_true", help="check the LP's winner by simulation at a few points")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--gpus", type=int, default=4, help="largest fleet the simulated search tries (default 4)")
    ap.add_argument("--points", default=None, help="comma-separated indices into SIM_POINTS (default: all)")
    args = ap.parse_args()
    data = distserve_data()
    if data is None:
        return 2
    from fluidopt.commands.validate import _kv_beside

    prof = data / "profiler-a100-80g.distserve.json"
    laws = {tp: load_distserve_profile(prof, MODEL, tp) for tp in TPS}
    kvs = {tp: float(_kv_beside(prof, MODEL, tp)) for tp in TPS}
    t0 = time.process_time()
    print(f"Fluid limit: which layout has more goodput per GPU, and by how much (TTFT {TTFT * 1e3:g} ms; D ="
          " disaggregated, C = colocated)\n")
    print("| prompt:output (tokens) | " + " | ".join(f"TPOT {t * 1e3:g} ms" for t in TPOTS) + " |")
    print("|---|" + "---|" * len(TPOTS))
    for ratio in RATIOS:
        l, o = lengths(ratio)
        cells = [cell(*per_gpu(laws, kvs, l, o, tpot, None)) for tpot in TPOTS]
        print(f"| {ratio[0]}:{ratio[1]} ({l}/{o}) | " + " | ".join(cells) + " |")
    for tpot in (0.06, 0.1):
        print(f"\nWhole instances at TPOT {tpot * 1e3:g} ms: goodput per GPU, disaggregated (config) / colocated (config);"
              " bold: more by over 0.5%\n")
        print("| prompt:output | " + " | ".join(f"{x:g} req/s" for x in LOADS) + " | fluid |")
        print("|---|" + "---|" * (len(LOADS) + 1))
        for ratio in RATIOS:
            l, o = lengths(ratio)
            cells = []
            for load in (*LOADS, None):
                dis, col = per_gpu(laws, kvs, l, o, tpot, load)
                w = winner(dis[0], col[0], 0.005)
                d, c = (f"**{dis[0]:.2f}**", f"{col[0]:.2f}") if w == "D" else (
                    (f"{dis[0]:.2f}", f"**{col[0]:.2f}**") if w == "C" else (f"{dis[0]:.2f}", f"{col[0]:.2f}"))
                cells.append(f"{d} ({dis[1]}) / {c} ({col[1]})")
            print(f"| {ratio[0]}:{ratio[1]} | " + " | ".join(cells) + " |")
    print(f"\n(LP maps: {time.process_time() - t0:.2f} CPU-s)")
    if not args.simulate:
        return 0
    from fluidopt.engines.disaggregated import model_kv_bytes
    from fluidopt.planning.placement import search_placement

    print(f"\nSimulated check: best goodput per GPU on at most {args.gpus} GPUs (TP 1, 2), 90% attainment\n")
    print("| prompt:output | TPOT ms | LP fluid per GPU D / C | LP whole instances at the simulated load (req/s): D / C "
          "| simulated per GPU D (split) / C (split) | winner: fluid / whole / simulated | CPU-s |")
    print("|---|---|---|---|---|---|---|")
    chosen = SIM_POINTS if args.points is None else [SIM_POINTS[int(i)] for i in args.points.split(",")]
    for ratio, tpot in chosen:
        l, o = lengths(ratio)
        dis, col = per_gpu(laws, kvs, l, o, tpot, None)
        t = time.process_time()
        res = search_placement(lambda tp: laws[tp], lambda tp: int(kvs[tp]), [l], [o], gpus=args.gpus, tps=TPS, ttft=TTFT,
                               tpot=tpot, attainment=0.9, layouts=("colocated", "disaggregated"),
                               kv_bytes_per_token=model_kv_bytes(MODEL), requests=args.requests, rtol=0.02)
        tab = res.table
        best = {lay: tab[tab["layout"] == lay].iloc[0] for lay in ("disaggregated", "colocated")}

        def label(r):
            if r["layout"] == "colocated":
                return f"{int(r['prefill_instances'])}xTP{int(r['prefill_tp'])}"
            return f"P{int(r['prefill_instances'])}xTP{int(r['prefill_tp'])}+D{int(r['decode_instances'])}xTP{int(r['decode_tp'])}"
        sd, sc = best["disaggregated"]["goodput_per_gpu"], best["colocated"]["goodput_per_gpu"]
        # the LP with whole instances at the load the simulated winner carries
        load = max(best["disaggregated"]["goodput"], best["colocated"]["goodput"])
        wd, wc = per_gpu(laws, kvs, l, o, tpot, load)
        print(f"| {ratio[0]}:{ratio[1]} ({l}/{o}) | {tpot * 1e3:g} | {dis[0]:.2f} / {col[0]:.2f} | {load:.1f}: "
              f"{wd[0]:.2f} / {wc[0]:.2f} | {sd:.2f} ({label(best['disaggregated'])}) / {sc:.2f} "
              f"({label(best['colocated'])}) | {winner(dis[0], col[0])} / {winner(wd[0], wc[0])} / "
              f"{winner(sd, sc, 0.02)} | {time.process_time() - t:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
