"""examples/capacity_planning.py and examples/pricing_whatif.py run, at a tiny size."""

from __future__ import annotations

import pandas as pd
import pytest
from builders import load_example


def test_capacity_planning_quick(tmp_path, capsys):
    mod = load_example("capacity_planning")
    assert mod.main(["--quick", "--workers", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "fluid lower bound" in out and "verified in simulation" in out
    t = pd.read_csv(tmp_path / "fluid_paper-tiny.csv")
    assert len(t) == 9 and t.groupby("growth")["cheapest"].sum().eq(1).all()
    assert (tmp_path / "sli_vs_n.png").exists()
    if mod.AZURE.exists():  # the trace's four classes, when the shared data is there
        assert len(pd.read_csv(tmp_path / "fluid_azure-conv.csv")) == 9


@pytest.mark.integration
def test_pricing_whatif_quick(tmp_path, capsys):
    mod = load_example("pricing_whatif")
    assert mod.main(["--quick", "--workers", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "LPs (12 x 12 prices" in out and "against the LP's promise" in out
    g = pd.read_csv(tmp_path / "grid.csv")
    assert len(g) == 2 * 12 * 12
    for f in ("grid.png", "pareto.png"):
        assert (tmp_path / f).exists()
