"""The in-process CLI runner of the tests (``builders.run_cli_here``, the ``cli_here`` fixture): the same
result as a ``python -m fluidopt`` process, and a failure when a command leaves the test process changed."""

from __future__ import annotations

import os
import signal
import warnings

import pytest
from builders import process_state, run_cli, run_cli_here, state_changes

import fluidopt


def test_same_exit_status_and_output_as_a_real_process(tmp_path, cli_here):
    bad = tmp_path / "bad.csv"
    bad.write_text("chunk_tokens,iteration_seconds\n64,0.02\n128,fast\n256,0.03\n")
    here, there = cli_here("calibrate", str(bad), "--json"), run_cli("calibrate", str(bad), "--json")
    assert (here.returncode, here.stdout, here.stderr) == (there.returncode, there.stdout, there.stderr)
    assert here.returncode == 2 and here.stderr.startswith("fluidopt calibrate: error: ")


def test_systemexit_is_the_exit_status(cli_here):
    r = cli_here("--version")  # argparse's version action exits 0
    assert r.returncode == 0 and r.stdout.strip() == f"fluidopt {fluidopt.__version__}" and r.stderr == ""
    r = cli_here("solve", "--pricing", "z")  # argparse's error, through main: returned, not raised
    assert r.returncode == 2 and "invalid choice: 'z'" in r.stderr


def test_runs_in_the_folder_asked_and_gives_the_folder_back(tmp_path, cli_here):
    (tmp_path / "s.toml").write_text("name = 'x'\n[gpu\n")
    here = os.getcwd()
    r = cli_here("solve", "s.toml", cwd=tmp_path)  # a relative path: read from cwd
    assert r.returncode == 2 and "s.toml" in r.stderr and "not valid TOML" in r.stderr
    assert os.getcwd() == here


def test_a_command_that_leaves_a_warnings_filter_fails_the_test(capfd, monkeypatch):
    import fluidopt.commands.solve as solve

    monkeypatch.setattr(solve, "run", lambda args: warnings.simplefilter("ignore", UserWarning) or 0)
    with warnings.catch_warnings(), pytest.raises(AssertionError, match="left the process changed: warnings.filters"):
        run_cli_here(capfd, "solve")


def test_state_changes_names_each_kind_of_leak():
    before = process_state()
    old = signal.signal(signal.SIGTERM, lambda *a: None)
    os.environ["FLUIDOPT_TEST_LEAK"] = "1"
    try:
        changed = state_changes(before, process_state())
    finally:
        signal.signal(signal.SIGTERM, old)
        del os.environ["FLUIDOPT_TEST_LEAK"]
    assert [c.split(":")[0] for c in changed] == ["environ", "signals"]
    assert "FLUIDOPT_TEST_LEAK: None -> '1'" in changed[0] and changed[1].startswith("signals: SIGTERM: ")
    assert state_changes(before, process_state()) == []


def test_an_import_is_not_a_leak_but_a_foreign_policy_is():
    import logging

    before = process_state()
    logging.getLogger("fluidopt-test-new-logger")  # what a library's first import does
    after = process_state()
    assert state_changes(before, after) == []
    assert state_changes({k: v for k, v in before.items() if k != "foreign policies"},
                         {**after, "foreign policies": ["class-affinity"]}) == ["foreign policies: [] -> ['class-affinity']"]
    # (an earlier test on this worker may have registered the example's class-affinity for good: add a name
    # no test registers, so the change is one whatever ran before)
    more = sorted([*before["foreign policies"], "zz-never-registered"])
    assert state_changes(before, {**after, "foreign policies": more})[0].startswith("foreign policies: ")


def test_a_librarys_import_time_settings_are_not_the_commands():
    import re

    base = {"modules": {"numpy"}, "environ": {"HOME": "/root"}, "warnings.filters": []}
    flt = ("ignore", re.compile("the matrix subclass is not the recommended way", re.I), Warning, None, 0)
    later = {"environ": {"HOME": "/root", "KMP_INIT_AT_FORK": "FALSE"}, "warnings.filters": [flt]}
    # joblib and scipy.sparse first imported in between: theirs
    assert state_changes(base, {**later, "modules": {"numpy", "joblib", "scipy.sparse"}}) == []
    # already imported before: the command's
    assert [c.split(":")[0] for c in state_changes({**base, "modules": {"numpy", "joblib", "scipy.sparse"}},
                                                   {**later, "modules": {"numpy", "joblib", "scipy.sparse"}})] == [
        "environ", "warnings.filters"]
    # a filter for a fluidopt category is the command's even on the first import of its module
    from fluidopt.workloads.base import TraceWarning

    own = ("always", None, TraceWarning, None, 0)
    assert state_changes(base, {**base, "modules": {"numpy", TraceWarning.__module__}, "warnings.filters": [own]}) != []


def test_price_closes_the_pyplot_figures_it_saves(tmp_path, cli_here):
    """Found by this runner: price's grid and Pareto figures (pyplot) stayed open after saving (plan's
    sli_vs_n too); cli_here fails on a figure left open. The grid's figure here (the Pareto's is saved the
    same way, and its curves cost LP solves); the file is still written."""
    r = cli_here("price", "--prefill", "0.1,0.2", "--decode", "0.1,0.2", "--pareto", "", "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "o" / "grid.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_save_png_writes_then_closes(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fluidopt.harness.plots import save_png

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    save_png(fig, tmp_path / "f", dpi=50)  # no suffix: write_generation's temporary names have none
    assert (tmp_path / "f").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert fig.number not in plt.get_fignums()
