"""The paper-reproduction example scripts run at their --quick size through the harness.

Each script's ``main`` runs in this process (one worker), writes the harness's tables and its figures
into a temporary folder, and redraws the same tables from those files with ``--replot``.
"""

from __future__ import annotations

import pandas as pd
import pytest
from builders import load_example


def _tables(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


@pytest.mark.integration
@pytest.mark.parametrize(
    "name, figures, runs",
    [
        ("asymptotic_optimality", ["asymptotic_revenue.png", "occupancy_paths.png"], 6),
        ("baseline_grid", ["baseline_grid.png"], 18),
        ("separate_pricing", ["separate_pricing.png"], 8),
    ],
)
def test_example_runs_through_the_harness_and_replots(name, figures, runs, tmp_path, capsys):
    mod = load_example(name)
    args = ["--out", str(tmp_path / "out"), "--fig-dir", str(tmp_path / "fig")]
    assert mod.main(["--quick", "--workers", "1", *args]) == 0
    first = capsys.readouterr().out
    df = pd.read_csv(tmp_path / "out" / "runs.csv")
    assert len(df) == runs
    # every run is a harness run: its ratio is revenue over the scenario's own LP bound
    assert ((df["ratio"] > 0.5) & (df["ratio"] < 1.05)).all()
    assert (tmp_path / "out" / "store.jsonl").is_file()
    for f in figures:
        assert (tmp_path / "fig" / f).stat().st_size > 10_000
    assert mod.main(["--quick", "--replot", *args]) == 0
    assert _tables(capsys.readouterr().out) == _tables(first)


@pytest.mark.integration
def test_sli_routing_runs_both_parts(tmp_path, capsys):
    mod = load_example("sli_routing")
    args = ["--out", str(tmp_path / "out"), "--fig-dir", str(tmp_path / "fig")]
    assert mod.main(["--quick", "--workers", "1", *args]) == 0
    first = capsys.readouterr().out
    part1 = pd.read_csv(tmp_path / "out" / "fairness" / "runs.csv")
    part2 = pd.read_csv(tmp_path / "out" / "backlog" / "runs.csv")
    assert set(part1["policy"]) == {"sli", "greedy"} and set(part2["policy"]) == {"weighted", "sli-sep", "par"}
    # part 2 is paid per phase: the harness's ratio there is separate revenue over the separate LP
    b = pd.read_csv(tmp_path / "out" / "backlog" / "bounds.csv")
    assert (part2["lp_bound"] == b["lp_separate"].iloc[0]).all()
    assert mod.main(["--quick", "--replot", *args]) == 0
    assert _tables(capsys.readouterr().out) == _tables(first)


@pytest.mark.integration
def test_orchestration_example_runs_through_the_executor(tmp_path, capsys):
    """examples/orchestration.py at a tiny size, on two local workers: every controller, the LP bound."""
    mod = load_example("orchestration")
    assert mod.main(["--backlog", "500", "--seeds", "1", "--horizon", "400", "--workers", "2",
                     "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "multi-period LP lower bound" in out
    table = pd.read_csv(tmp_path / "orch_table.csv")
    assert set(table["policy"]) == set(mod.POLICIES)
    # nobody beats the fluid lower bound on GPU-hours
    assert (table["ratio_to_lp"] >= 1.0).all()
    for f in ("orch_fleet.png", "orch_batch_queue.png"):
        assert (tmp_path / f).stat().st_size > 10_000
