#!/usr/bin/env python
"""Fault drill: every long command under Ctrl-C, SIGTERM and kill -9 at random moments, then a rerun.

For each command: one uninterrupted reference run in its own folder; then, in a second folder, ten
interrupted runs one after another (5 x SIGINT, then SIGTERM and SIGKILL alternating), each at a
seeded random moment between 0.3 s and 90% of the reference's wall time; then a final rerun to the
end. Checked at each interruption (not for SIGKILL, which no process can handle): the exit code
(130 / 143), one line on stderr and no traceback, the stop time (< 2 s). Checked after each: no
child process left after 2 s, no temporary file left (SIGKILL's are removed by the next run). Checked
at the end: the rerun's tables equal the reference's byte for byte, apart from wall-clock columns.

Columns: ``stopped`` (exit 130/143 and one line), ``done_first`` (the run ended before the signal, or
the signal came after its work and was ignored: exit 0), ``killed`` (SIGKILL), ``bad`` (anything else,
printed). Not part of CI (about 15 minutes on 2 cores); docs/scaling.md records its last table.

    python tools/fault_drill.py                  # every command
    python tools/fault_drill.py --only run-1w,plan --trials 4
"""

from __future__ import annotations

import argparse
import io
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
RUN = ["-m", "fluidopt", "run", "--gpus", "60", "--horizon", "1500", "--warmup", "20", "--seeds", "3", "--policies",
       "gate-and-route,fi-wsp", "--no-progress"]
COMMANDS = {
    # name: (argv with OUT, files compared, columns ignored)
    "run-1w": ([*RUN, "--workers", "1", "--out", "OUT"], ["runs.csv", "classes.csv", "summary.csv"], {"wall_seconds"}),
    "run-2w": ([*RUN, "--workers", "2", "--out", "OUT"], ["runs.csv", "classes.csv", "summary.csv"], {"wall_seconds"}),
    "run-dask": ([*RUN, "--dask", "--workers", "2", "--out", "OUT"], ["runs.csv", "summary.csv"], {"wall_seconds"}),
    "plan": (["-m", "fluidopt", "plan", "--seeds", "2", "--horizon", "300", "--warmup", "50", "--served", "0.9",
              "--growth", "0.1", "--workers", "2", "--no-progress", "--out", "OUT"], ["plan.csv", "curves.csv"], set()),
    "price-simulate": (["-m", "fluidopt", "price", "--points", "3", "--simulate", "0.001,0.002;0.002,0.001", "--seeds",
                        "2", "--horizon", "1200", "--warmup", "30", "--workers", "1", "--no-progress", "--out", "OUT"],
                       ["simulated.csv", "grid.csv", "pareto.csv"], set()),
    "simulate": (["-m", "fluidopt", "simulate", "--policy", "fi-wsp", "--gpus", "200", "--horizon", "2500",
                  "--records", "OUT/records.csv"], ["records.csv"], set()),
    "rl-evaluate": (["-m", "fluidopt", "rl", "evaluate", "examples/scenarios/rl-router-v100.toml", "--episodes", "3",
                     "--requests", "3000", "--policies", "round-robin,least-requests,wg-rl", "--csv", "OUT/eval.csv"],
                    ["eval.csv"], {"wall_seconds"}),
    "plan-day": (["-m", "fluidopt", "plan", "examples/scenarios/chiron-workflow.toml", "--day", "--out", "OUT"],
                 ["day.csv"], set()),
    "rl-train": (["-m", "fluidopt", "rl", "train", "examples/scenarios/rl-router-v100.toml", "--episodes", "3",
                  "--requests", "600", "--out", "OUT/w.npz", "--curves", "OUT/curves.csv"], ["curves.csv"],
                 {"wall_seconds"}),
    "example-orchestration": (["examples/orchestration.py", "--backlog", "5000", "--seeds", "2", "--horizon", "900",
                               "--policies", "chiron,utilisation-autoscaler", "--workers", "2", "--out", "OUT"],
                              ["orch_table.csv"], {"wall_s"}),
    "example-baseline-grid": (["examples/baseline_grid.py", "--quick", "--workers", "2", "--out", "OUT",
                               "--fig-dir", "OUT/figs"], ["runs.csv"], {"wall_seconds"}),
}


def children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(d.name))
                out += children(int(d.name))
    return out


def alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start(argv: list[str], out: Path) -> subprocess.Popen:
    args = [a.replace("OUT", str(out)) for a in argv]
    out.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([PY, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                            env=dict(os.environ, MPLBACKEND="Agg"))


def table(path: Path, ignore: set[str]) -> bytes:
    df = pd.read_csv(path)
    buf = io.StringIO()
    df[[c for c in df.columns if c not in ignore]].to_csv(buf, index=False)
    return buf.getvalue().encode()


def temps(out: Path) -> list[str]:
    return [str(p.relative_to(out)) for p in out.rglob("*") if ".tmp-" in p.name or p.name.endswith(".part")
            or p.name.endswith(".generation.json") or p.name.startswith(".fluidopt-probe")]


def drill(name: str, trials: int, rng: random.Random, work: Path) -> dict:
    argv, files, ignore = COMMANDS[name]
    ref, out = work / name / "reference", work / name / "drill"
    t0 = time.monotonic()
    p = start(argv, ref)
    _, err = p.communicate(timeout=1200)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        return {"command": name, "error": f"reference exit {p.returncode}: {err.strip()[-300:]}"}
    sigs = [signal.SIGINT] * (trials // 2) + [signal.SIGTERM, signal.SIGKILL] * ((trials + 1) // 4 + 1)
    sigs = sigs[:trials]
    row = {"command": name, "reference_s": round(wall, 1), "trials": len(sigs), "stopped": 0, "done_first": 0,
           "killed": 0, "bad": 0, "max_stop_s": 0.0, "orphans": 0, "temps_left": 0}
    bad: list[str] = []
    for sig in sigs:
        p = start(argv, out)
        time.sleep(rng.uniform(0.3, max(0.4, 0.9 * wall)))
        if p.poll() is not None:
            row["done_first"] += 1  # finished before the signal (later trials resume a fuller store)
            p.communicate()
            continue
        kids = children(p.pid)
        t = time.monotonic()
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
        stop = time.monotonic() - t
        time.sleep(2.0)
        row["orphans"] += sum(alive(k) for k in kids)
        if sig == signal.SIGKILL:
            row["killed"] += 1
            continue
        row["max_stop_s"] = max(row["max_stop_s"], round(stop, 2))
        # (a progress bar's lines on stderr are not messages)
        lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip() and "run/s" not in ln and "|" not in ln]
        # (simulate prints its partial result on stdout, and the one line on stderr)
        one_line = len(lines) == 1 and "interrupted (" in lines[0] and "Traceback" not in err
        if p.returncode == 128 + sig and one_line:
            row["stopped"] += 1
        elif p.returncode == 0 and "Traceback" not in err:
            row["done_first"] += 1  # the signal came after the work was done: ignored, exit 0
        else:
            row["bad"] += 1
            bad.append(f"{signal.Signals(sig).name}: exit {p.returncode}: {err.strip()[-200:]!r}")
        row["temps_left"] += len([t for t in temps(out) if str(p.pid) in t])  # this process's own
    p = start(argv, out)
    _, err = p.communicate(timeout=1200)
    row["rerun_exit"] = p.returncode
    row["temps_left"] += len(temps(out))
    same = [f for f in files if (out / f).exists() and table(out / f, ignore) == table(ref / f, ignore)]
    row["identical"] = f"{len(same)}/{len(files)}"
    for b in bad:
        print(f"  {name}: {b}", flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma list of commands (default: all)")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--seed", type=int, default=2026)
    a = ap.parse_args()
    names = [n for n in (a.only.split(",") if a.only else COMMANDS) if n]
    rng = random.Random(a.seed)
    work = Path(tempfile.mkdtemp(prefix="fault-drill-"))
    rows = []
    try:
        for n in names:
            rows.append(drill(n, a.trials, rng, work))
            print(pd.DataFrame(rows[-1:]).to_string(index=False), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(pd.DataFrame(rows).to_markdown(index=False) if _has_tabulate() else pd.DataFrame(rows).to_string(index=False))
    return 0


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    from fluidopt.core.interrupt import script_main

    raise SystemExit(script_main(main))
