"""Instructions per simulated request of the gate-and-route family (valgrind, deterministic).

Not a test. Run from the repository root (needs valgrind on PATH and the compiled core built):

    python benchmarks/controller_instructions.py                  # BP-GR and gate-and-route, markov and tokens
    python benchmarks/controller_instructions.py --policies gate-and-route prioritize-and-route \\
        staffed-prioritize-and-route sli-gate-and-route backpressure-sli-gate-and-route

Each case is ``benchmarks/bench_sim.py _case`` (the paper instance, n = 500 by default, seed 1, a 60 s
fill, then ``--requests`` arrivals: bench_sim's ``controller-cost`` case) under ``valgrind
--tool=callgrind --separate-threads=yes`` with PYTHONHASHSEED=0 and one BLAS / OpenMP thread, counting
the instructions of the main thread only (worker threads of the LP solver spin for as long as the
scheduler lets them, which no two runs repeat), at two request counts; the cost per request is the
difference of the two instruction counts over the difference of the two runs' requests, which removes
the interpreter's start, the imports, the setup and the fill. The count does not depend on the
machine's load (wall-clock ratios on a shared machine move by up to 2x). Prints a markdown table:
instructions per request, the ratio to gate-and-route's (same service) and to the policy's plain
counterpart (bench_sim's _PLAIN_OF).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# BLAS and OpenMP worker threads (numpy) spin between calls and valgrind counts their spinning: one each (the
# simulation is the same with any number); the LP solver's workers remain, so only the main thread is counted
_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
PLAIN_OF = {"backpressure-gate-and-route": "gate-and-route", "staffed-prioritize-and-route": "prioritize-and-route",
            "backpressure-sli-gate-and-route": "sli-gate-and-route"}


def count(policy: str, service: str, gpus: int, requests: float, fill: float) -> tuple[int, int]:
    """(instructions of the main thread, requests) of one ``bench_sim.py _case`` run under callgrind."""
    spec = {"kind": "fleet", "policy": policy, "service": service, "gpus": gpus, "requests": requests, "fill": fill}
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(REPO), "FLUIDOPT_REQUIRE": "compiled",
           **{v: "1" for v in _THREADS}}
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "cg.out"
        p = subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}",
                            sys.executable, str(REPO / "benchmarks" / "bench_sim.py"), "_case", "--spec",
                            json.dumps(spec)], env=env, capture_output=True, text=True, cwd=REPO)
        if p.returncode:
            raise SystemExit(f"controller_instructions: {policy} {service}: exit {p.returncode}\n{p.stderr[-2000:]}")
        row = json.loads(p.stdout.strip().splitlines()[-1])
        if row["engine"] != "compiled":
            raise SystemExit(f"controller_instructions: {policy} {service}: the {row['engine']} engine ran")
        main = Path(f"{out}-01")  # thread 1: the interpreter's (the others are the LP solver's and BLAS workers)
        m = re.search(r"^(?:summary|totals):\s+(\d+)", main.read_text(), re.M)
        return int(m.group(1)), int(row["requests"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policies", nargs="+", default=["gate-and-route", "backpressure-gate-and-route"])
    p.add_argument("--services", nargs="+", default=["markov", "tokens"])
    p.add_argument("--gpus", type=int, default=500)
    p.add_argument("--fill", type=float, default=60.0)
    p.add_argument("--requests", type=float, nargs=2, default=[20_000, 220_000],
                   help="the two request counts after the fill (default 20,000 and 220,000)")
    a = p.parse_args(argv)
    pols = list(dict.fromkeys(["gate-and-route", *a.policies]))
    per: dict = {}
    for svc in a.services:
        for pol in pols:
            (i0, k0), (i1, k1) = (count(pol, svc, a.gpus, r, a.fill) for r in a.requests)
            per[(pol, svc)] = (i1 - i0) / (k1 - k0)
            print(json.dumps({"policy": pol, "service": svc, "instructions": [i0, i1], "requests": [k0, k1],
                              "per_request": round(per[(pol, svc)], 1)}), flush=True)
    print(f"\n# valgrind --tool=callgrind --separate-threads=yes (main thread), PYTHONHASHSEED=0; paper instance, "
          f"n = {a.gpus:,}, seed 1, "
          f"{a.fill:g} s fill, then {a.requests[0]:,.0f} / {a.requests[1]:,.0f} requests; per request = difference "
          "of instructions / difference of requests\n")
    print("| policy | service | instructions / request | ratio to gate-and-route | ratio to its plain counterpart |")
    print("|---|---|---:|---:|---:|")
    for svc in a.services:
        for pol in pols:
            v = per[(pol, svc)]
            plain = PLAIN_OF.get(pol)
            ref = per.get((plain, svc)) if plain else None
            print(f"| {pol} | {svc} | {v:,.0f} | {v / per[('gate-and-route', svc)]:.3f} | "
                  f"{'-' if ref is None else format(v / ref, '.3f')} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
