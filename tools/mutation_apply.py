#!/usr/bin/env python
"""Check mutants by hand: apply each one's diff to a scratch copy that has the compiled core, run the
module's fast tests against it, restore the file (docs/testing.md, "Issue 35", pass 2).

Used where ``tools/mutation.py`` cannot decide: tests that run many simulations exceed mutmut's CPU
limit with the Python engine under its tracing, whatever the mutant does (robust.py, pricing.py,
executor.py), and to recheck survivors after new tests were written.

    python tools/mutation.py --set newer ... --work /tmp/mut_newer      # generates the mutants
    python tools/mutation_apply.py --mutmut-work /tmp/mut_newer --copy /tmp/hand_newer NAMES.txt

NAMES.txt: one mutmut mutant name per line. The copy is made from the working tree (tracked and
untracked, not ignored files) plus the built extension modules, unless ``--reuse``. Prints one line
per mutant: ``NAME | killed FAILED test`` or ``NAME | SURVIVED ...``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = {  # module (after "fluidopt.") -> the tests run against its mutants (-m "not slow", -x)
    "planning.fleet": ["tests/planning/test_oracles_plan.py", "tests/planning/test_plan.py",
             "tests/planning/test_planning_examples.py"],
    "planning.day": ["tests/planning/test_oracles_dayplan.py", "tests/planning/test_oracles_dayplan_more.py",
                "tests/planning/test_dayplan.py", "tests/planning/test_fleet_mix.py"],
    "fluid.multiperiod": ["tests/fluid/test_oracles_multiperiod.py", "tests/fluid/test_oracles_multiperiod_more.py",
                          "tests/fluid/test_oracles_fleet_mix.py", "tests/planning/test_fleet_mix.py",
                          "tests/planning/test_oracles_dayplan.py",
                          "tests/planning/test_dayplan.py", "tests/control/test_orchestration.py",
                          "tests/control/test_oracles_orchestration.py"],
    "fluid.capacity": ["tests/planning/test_oracles_plan.py", "tests/planning/test_capacity.py",
                       "tests/planning/test_plan.py"],
    "control.robust": ["tests/control/test_oracles_robust.py", "tests/control/test_oracles_robust_more.py",
                       "tests/control/test_robust.py"],
    "control.orchestration": ["tests/control/test_oracles_orchestration_rest.py", "tests/control/test_oracles_orchestration.py",
                              "tests/control/test_oracles_orchestration_more.py",
                              "tests/control/test_oracles_qlm_groups_plan.py", "tests/control/test_orchestration.py"],
    "rl.evaluate": ["tests/rl/test_oracles_evaluate.py", "tests/rl/test_oracles_evaluate_more.py",
                    "tests/rl/test_rl_head_to_head.py"],
    "sim.cohort": ["tests/sim/test_oracles_cohort.py", "tests/sim/test_cohort.py"],
    "queueing.runlength": ["tests/queueing/test_oracles_runlength.py", "tests/queueing/test_queueing_runlength.py"],
    "pricing.grids": ["tests/planning/test_oracles_pricing.py", "tests/planning/test_oracles_pricing_more.py",
                "tests/planning/test_pricing.py"],
    "harness.executor": ["tests/harness/test_oracles_executor.py", "tests/harness/test_oracles_executor_more.py",
                 "tests/harness/test_executor.py",
                 "tests/planning/test_oracles_plan.py"],
    # issue 47 (tools/mutation.py --set issue47); pricing, dayplan, orchestration and multiperiod as above
    "pricing.optimize": ["tests/planning/test_oracles_token_prices.py", "tests/planning/test_oracles_pricing_opt.py", "tests/planning/test_optimal_prices.py",
                    "tests/cli/test_price_optimize.py"],
    "core.demand": ["tests/planning/test_oracles_demand.py", "tests/planning/test_optimal_prices.py",
               "tests/planning/test_oracles_pricing_more.py"],
    "calibration.vidur": ["tests/calibrate/test_oracles_vidur_tables.py", "tests/calibrate/test_vidur.py"],
    "app.logic": ["tests/app/test_oracles_app_logic.py", "tests/app/test_app_logic.py"],
    "rl.regimes": ["tests/rl/test_oracles_regimes.py", "tests/rl/test_rl_regime.py"],
    "core.interrupt": ["tests/harness/test_oracles_interrupt.py", "tests/harness/test_harness.py"],
    "pricing.demand_fit": ["tests/planning/test_oracles_pricing_opt.py", "tests/planning/test_optimal_prices.py", "tests/cli/test_price_optimize.py"],
}


def module(name: str) -> str | None:
    rest = name[len("fluidopt."):]
    return next((k for k in sorted(TESTS, key=len, reverse=True) if rest.startswith(k + ".")), None)


def apply(diff: str, path: Path) -> bool:
    """Apply a one-hunk diff whose lines may be dedented (mutmut shows methods dedented): find the old
    block by stripped lines (it must occur once), re-indent the new block by the same offset."""
    h = [ln for ln in diff.splitlines()[2:] if not ln.startswith("@@")]
    old = [ln[1:] for ln in h if ln[:1] in (" ", "-")]
    new = [ln[1:] for ln in h if ln[:1] in (" ", "+")]
    src = path.read_text().split("\n")
    key = [ln.strip() for ln in old]
    hits = [i for i in range(len(src) - len(old) + 1) if [x.strip() for x in src[i:i + len(old)]] == key]
    if len(hits) != 1:
        return False
    i = hits[0]
    ref = next(k for k, ln in enumerate(old) if ln.strip())
    delta = (len(src[i + ref]) - len(src[i + ref].lstrip())) - (len(old[ref]) - len(old[ref].lstrip()))
    src[i:i + len(old)] = [(" " * delta + ln if delta >= 0 else ln[-delta:]) if ln.strip() else ln for ln in new]
    path.write_text("\n".join(src))
    return True


def make_copy(copy: Path) -> None:
    if copy.exists():
        shutil.rmtree(copy)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.split(b"\0")
    for f in [f.decode() for f in files if f] + [str(p.relative_to(ROOT)) for p in ROOT.glob("fluidopt/**/*.so")]:
        src = ROOT / f
        if src.is_file():
            (copy / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, copy / f)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", type=Path)
    ap.add_argument("--mutmut-work", type=Path, required=True, help="tools/mutation.py's --work (the mutants)")
    ap.add_argument("--copy", type=Path, required=True, help="scratch copy to mutate (outside the repository)")
    ap.add_argument("--reuse", action="store_true", help="keep an existing copy (refresh its tests/ only)")
    ap.add_argument("--timeout", type=float, default=400.0)
    a = ap.parse_args()
    copy = a.copy.resolve()
    if ROOT == copy or ROOT in copy.parents:
        raise SystemExit("--copy must be outside the repository")
    if not a.reuse:
        make_copy(copy)
    else:
        shutil.rmtree(copy / "tests", ignore_errors=True)
        shutil.copytree(ROOT / "tests", copy / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    env = dict(os.environ, PYTHONPATH=str(copy), MPLBACKEND="Agg")
    env.pop("FLUIDOPT_ENGINE", None)
    for name in [ln.strip() for ln in a.names.read_text().splitlines() if ln.strip()]:
        mod = module(name)
        shown = subprocess.run([mutmut, "show", name], cwd=a.mutmut_work, capture_output=True, text=True).stdout
        diff = shown[shown.find("--- "):]
        target = copy / diff.splitlines()[0][4:].strip()
        original = target.read_bytes()
        try:
            if mod is None or not apply(diff, target):
                print(name, "| NOT APPLIED", flush=True)
                continue
            try:
                r = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p",
                                    "no:benchmark", "-m", "not slow", *TESTS[mod]], cwd=copy, env=env,
                                   capture_output=True, text=True, timeout=a.timeout)
                out = r.stdout.strip().splitlines()
                failed = [ln for ln in out if ln.startswith(("FAILED", "ERROR"))]
                res = ("killed " + (failed[0] if failed else out[-1]) if r.returncode else "SURVIVED " + out[-1])
            except subprocess.TimeoutExpired:
                res = f"timeout ({a.timeout:g} s)"
        finally:
            target.write_bytes(original)
        print(name, "|", res[:200], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
