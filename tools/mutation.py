#!/usr/bin/env python
"""On-demand mutation testing of the LP, the engine, the metrics and the controllers (mutmut 3.8.1).

Not part of CI. See docs/testing.md for what it measures, the last recorded score and the survivors.

    pip install mutmut==3.8.1
    python tools/mutation.py                       # sampled run, the recorded configuration (--set core)
    python tools/mutation.py --per-module 0        # every mutant (many hours on 2 cores)
    python tools/mutation.py --report-only         # reprint the table of the last run
    python tools/mutation.py --set newer --per-module 20 --work /tmp/mut_newer   # issue 35's modules
    python tools/mutation.py --set newer --rows pricing.py,executor.py --reuse --work /tmp/mut_newer

What it does:

1. copies the working tree (tracked and untracked, not ignored files) to a scratch directory
   (``--work``, default /tmp/mut_work; the repository itself is never written to) and appends
   tools/mutmut.toml, the [tool.mutmut] section, to the copy's pyproject.toml;
2. has mutmut generate every mutant of the configured modules (in the copy's ``mutants/``);
3. draws a uniform random sample of ``--per-module`` mutants from each module
   (``random.Random(seed).sample`` over the sorted mutant names; 0 = all), and runs mutmut on
   them with FLUIDOPT_ENGINE=python (so a mutated engine.py is what runs, never the compiled core);
4. prints the per-module table (mutants, killed, timeout, survived, no tests, score) and the
   surviving mutants with their diffs (``mutmut show``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETS = {  # --set -> {table row -> files (as mutmut names them: fluidopt.x.y)}
    # the recorded configuration of docs/testing.md (LP, engine, metrics, controllers)
    "core": {
        "fluid/lp.py": ["fluidopt.fluid.lp"],
        "sim/engine.py": ["fluidopt.sim.engine"],
        "sim/metrics.py": ["fluidopt.sim.metrics"],
        "control/*": ["fluidopt.control.gate_and_route", "fluidopt.control.gate_handlers", "fluidopt.control.fcfs",
                      "fluidopt.control.fcfs_handlers", "fluidopt.control.fiwsp_handlers",
                      "fluidopt.control.paper_baselines", "fluidopt.control.load_balancers",
                      "fluidopt.control.instance"],
    },
    # issue 35: the newer modules (planning, day plan, multi-period LP, robust staffing, orchestration,
    # RL evaluation, pricing, cohort revenue, run-length queueing, the executor layer)
    "newer": {
        "plan.py": ["fluidopt.planning.fleet"],
        "dayplan.py": ["fluidopt.planning.day"],
        "fluid/multiperiod.py": ["fluidopt.fluid.multiperiod"],
        "fluid/capacity.py": ["fluidopt.fluid.capacity"],
        "control/robust.py": ["fluidopt.control.robust"],
        "control/orchestration.py": ["fluidopt.control.orchestration.common", "fluidopt.control.orchestration.chiron",
                                     "fluidopt.control.orchestration.qlm", "fluidopt.control.orchestration.autoscaler"],
        "rl/evaluate.py": ["fluidopt.rl.evaluate"],
        "sim/cohort.py": ["fluidopt.sim.cohort"],
        "queueing/runlength.py": ["fluidopt.queueing.runlength"],
        "pricing.py": ["fluidopt.pricing.grids"],
        "executor.py": ["fluidopt.harness.executor"],
    },
    # issue 47, point 7: the modules changed by the last round (pricing with demand, orchestration and the
    # fleet mix, the day plan, Vidur calibration, the app's logic, the RL regimes, the interruption contract)
    "issue47": {
        "pricing.py": ["fluidopt.pricing.grids"],
        "pricing_opt.py": ["fluidopt.pricing.optimize", "fluidopt.pricing.demand_fit"],
        "demand.py": ["fluidopt.core.demand"],
        "control/orchestration.py": ["fluidopt.control.orchestration.common", "fluidopt.control.orchestration.chiron",
                                     "fluidopt.control.orchestration.qlm", "fluidopt.control.orchestration.autoscaler"],
        "fluid/multiperiod.py": ["fluidopt.fluid.multiperiod"],
        "dayplan.py": ["fluidopt.planning.day"],
        "vidur.py": ["fluidopt.calibration.vidur"],
        "app/logic.py": ["fluidopt.app.logic"],
        "rl/regimes.py": ["fluidopt.rl.regimes"],
        "interrupt.py": ["fluidopt.core.interrupt"],
    },
}
MODULES = dict(SETS["core"])  # the rows of the current run (main() sets them from --set / --rows)
KILLED = {1, 3}
TIMEOUT = {36, -24, 24, 152, 255}
SURVIVED = {0}
NO_TESTS = {33, 5}


def sh(cmd, cwd, env=None, check=True):
    print("+", " ".join(map(str, cmd)), flush=True)
    return subprocess.run(cmd, cwd=cwd, env=env, check=check)


def _toml_list(key: str, values: list[str]) -> str:
    return f"{key} = [\n" + "".join(f"    {json.dumps(v)},\n" for v in values) + "]\n"


def mutmut_section(set_name: str) -> str:
    """tools/mutmut.toml's [tool.mutmut] section for a set: ``core`` as written; another set replaces
    ``only_mutate`` and the test selection by those of its ``[tool.fluidopt-mutation.SET]`` table."""
    import tomllib

    text = (ROOT / "tools" / "mutmut.toml").read_text(encoding="utf-8")
    if set_name == "core":
        return text
    conf = tomllib.loads(text)
    mm = dict(conf["tool"]["mutmut"])
    extra = conf["tool"]["fluidopt-mutation"][set_name]
    mm["only_mutate"] = extra["only_mutate"]
    mm["pytest_add_cli_args_test_selection"] = extra["pytest_add_cli_args_test_selection"]
    out = ["[tool.mutmut]\n"]
    for k, v in mm.items():
        if isinstance(v, list):
            out.append(_toml_list(k, v))
        else:
            out.append(f"{k} = {json.dumps(v)}\n")
    return "".join(out)


def make_copy(work: Path, set_name: str = "core") -> None:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.split(b"\0")
    for f in files:
        if not f:
            continue
        src = ROOT / f.decode()
        if src.is_file():
            dst = work / f.decode()
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    with open(work / "pyproject.toml", "a", encoding="utf-8") as fh:
        fh.write("\n" + mutmut_section(set_name))


def generate(work: Path, children: int) -> None:
    code = (
        "import os, mutmut.__main__ as M\n"
        "os.makedirs('mutants', exist_ok=True)\n"
        "M.set_mutant_under_test('mutant_generation')\n"
        "M.copy_src_dir(); M.copy_also_copy_files(); M.setup_source_paths()\n"
        f"print(M.create_mutants({children}))\n"
    )
    sh([sys.executable, "-c", code], cwd=work)


def results(work: Path) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for meta in (work / "mutants").rglob("*.meta"):
        out.update(json.loads(meta.read_text())["exit_code_by_key"])
    return out


def module_of(name: str) -> str | None:
    for row, prefixes in MODULES.items():
        if any(name.startswith(p + ".") for p in prefixes):
            return row
    return None


def sample(names: list[str], per_module: int, seed: int) -> list[str]:
    chosen = []
    for row in MODULES:
        mine = sorted(n for n in names if module_of(n) == row)
        if per_module and len(mine) > per_module:
            mine = random.Random(f"{seed}:{row}").sample(mine, per_module)
        chosen += sorted(mine)
    return chosen


def report(work: Path, chosen: list[str], show: bool) -> None:
    res = results(work)
    total = {row: len([n for n in res if module_of(n) == row]) for row in MODULES}
    print("\n| module | mutants (all) | sampled | killed | timeout | survived | no tests | score |")
    print("|---|---|---|---|---|---|---|---|")
    survivors = []
    for row in MODULES:
        mine = [n for n in chosen if module_of(n) == row]
        codes = [res.get(n) for n in mine]
        k = sum(c in KILLED for c in codes)
        t = sum(c in TIMEOUT for c in codes)
        s = sum(c in SURVIVED for c in codes)
        nt = sum(c in NO_TESTS for c in codes)
        done = k + t + s + nt
        score = f"{100 * (k + t) / done:.1f}%" if done else "-"
        print(f"| {row} | {total[row]} | {len(mine)} | {k} | {t} | {s} | {nt} | {score} |")
        survivors += [n for n, c in zip(mine, codes) if c in SURVIVED | NO_TESTS]
    other = [n for n in chosen if res.get(n) not in KILLED | TIMEOUT | SURVIVED | NO_TESTS]
    if other:
        print(f"\nnot checked / suspicious: {len(other)}: {' '.join(other)}")
    print(f"\nsurviving mutants ({len(survivors)}):")
    for n in survivors:
        print(" ", n)
        if show:
            subprocess.run(["mutmut", "show", n], cwd=work, check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("MUT_WORK", "/tmp/mut_work")))
    ap.add_argument("--per-module", type=int, default=40, help="mutants drawn per table row (0: all)")
    ap.add_argument("--seed", type=int, default=20240501)
    ap.add_argument("--children", type=int, default=2, help="parallel mutant workers")
    ap.add_argument("--reuse", action="store_true", help="keep the scratch copy and its generated mutants")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--show", action="store_true", help="print each survivor's diff")
    ap.add_argument("--set", dest="set_name", choices=sorted(SETS), default="core",
                    help="which modules: core (the recorded configuration), newer (issue 35's modules) "
                    "or issue47 (issue 47's point 7)")
    ap.add_argument("--rows", default="", help="comma-separated table rows of the set to sample and run "
                    "(default: all; e.g. run pricing.py,executor.py last with --reuse)")
    a = ap.parse_args()
    rows = SETS[a.set_name]
    if a.rows:
        want = [r.strip() for r in a.rows.split(",") if r.strip()]
        bad = [r for r in want if r not in rows]
        if bad:
            raise SystemExit(f"--rows: unknown row(s) {bad}; the rows of --set {a.set_name}: {', '.join(rows)}")
        rows = {r: rows[r] for r in want}
    MODULES.clear()
    MODULES.update(rows)
    work = a.work.resolve()
    if ROOT == work or ROOT in work.parents:
        raise SystemExit("--work must be outside the repository")
    if not a.report_only:
        if not a.reuse:
            make_copy(work, a.set_name)
        else:  # refresh the tests only (new or changed tests, same mutants), in every folder of tests/
            for f in (ROOT / "tests").rglob("*.py"):
                dst = work / f.relative_to(ROOT)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, dst)
        generate(work, a.children)
    chosen = sample(sorted(results(work)), a.per_module, a.seed)
    (work / "mutation_sample.txt").write_text("\n".join(chosen) + "\n")
    if not a.report_only:
        env = dict(os.environ, FLUIDOPT_ENGINE="python")
        sh(["mutmut", "run", "--max-children", str(a.children), *chosen], cwd=work, env=env, check=False)
    report(work, chosen, a.show)
    return 0


if __name__ == "__main__":
    sys.exit(main())
