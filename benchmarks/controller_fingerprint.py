"""Fingerprint of the gate-and-route family's runs, to show that a speed change changes no decision.

    python benchmarks/controller_fingerprint.py OUT.json         # then: cmp BEFORE.json AFTER.json
    FLUIDOPT_ENGINE=python PYTHONPATH=/tmp/old_tree python benchmarks/controller_fingerprint.py OLD.json

45 cases: FI-WSP, Gate-and-Route, Prioritize-and-Route, SLI-aware Gate-and-Route and the robust
variants (fluidopt.control.robust) with several option sets, and the reference FCFS policy
(reserved-prefill-fcfs, the textbook queues' controller), each in ``markov``, ``tokens`` and
``tokens`` with a KV cache and its time term (preemptions, drops), on a 40-GPU paper instance; per
case the events, every total, the revenue and a SHA-256 of the per-request records. Policies a
tree does not register are listed as missing. Run it under any engine: the numbers are the same bit
for bit on the compiled core (with or without the controllers' fast path) and on the Python engine.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import fluidopt
from fluidopt.control.registry import available, make_controller
from fluidopt.sim.api import simulate

CASES = [
    ("fi-wsp", {}),
    ("gate-and-route", {}),
    ("prioritize-and-route", {}),
    ("sli-gate-and-route", {}),
    ("backpressure-gate-and-route", {}),
    ("backpressure-gate-and-route", {"caps": True, "staffing": True, "decode_order": "fcfs"}),
    ("backpressure-gate-and-route", {"backpressure": False, "overflow": False, "resolve": False}),
    ("backpressure-gate-and-route", {"max_overflow": 1, "caps": True}),
    ("staffed-prioritize-and-route", {}),
    ("staffed-prioritize-and-route", {"backpressure": True, "caps": True, "decode_order": "value"}),
    ("staffed-prioritize-and-route", {"staffing": False, "overflow": False}),
    ("backpressure-sli-gate-and-route", {}),
    ("backpressure-sli-gate-and-route", {"caps": False, "staffing": False}),
    ("sli-weighted-gate-and-route", {}),
    ("reserved-prefill-fcfs", {}),
]
MODES = ("markov", "tokens", "tokens+kv")


def _case(policy: str, opts: dict, mode: str) -> dict:
    sc = fluidopt.default_scenario(gpus=40)
    service = "markov" if mode == "markov" else "tokens"
    if mode == "tokens+kv":
        sc = replace(sc, gpu=replace(sc.gpu, kv_capacity=30000.0, kv_time_per_token=1e-7))
    ctrl = make_controller(policy, sc, **opts)
    if getattr(ctrl, "tick_interval", None):
        ctrl.tick_interval = 10.0  # windows inside the run: the re-solve path runs too
    with tempfile.TemporaryDirectory() as d:
        rec = Path(d) / "records.csv"
        res = simulate(sc, ctrl, horizon=60.0, warmup=6.0, seed=11, service=service, batches=4, records=rec,
                       progress=False)
        digest = hashlib.sha256(rec.read_bytes()).hexdigest()
    return {"events": res.events, "totals": res.totals, "revenue_per_gpu": repr(float(res.cluster["revenue_per_gpu"])),
            "records_sha256": digest, "resolves": getattr(ctrl, "resolves", None)}


def main(out: str) -> int:
    have = set(available())
    rows = {}
    for policy, opts in CASES:
        for mode in MODES:
            key = f"{policy} {json.dumps(opts, sort_keys=True)} {mode}"
            rows[key] = _case(policy, opts, mode) if policy in have else "missing"
            print(key, rows[key] if rows[key] == "missing" else rows[key]["records_sha256"][:16], flush=True)
    Path(out).write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1].startswith("-")):
        print(__doc__.strip())  # -h / --help (and anything else that is not one output path): the usage
        sys.exit(0 if sys.argv[1:] in (["-h"], ["--help"]) else 2)
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "controller_fingerprint.json"))
