"""The direct highspy path against the Pyomo model on every point; price grids, Pareto curves."""

from __future__ import annotations

import numpy as np
import pytest

from fluidopt.core.model import GPUProfile, RequestClass, Scenario, paper_scenario
from fluidopt.fluid.direct import DirectFluidLP
from fluidopt.fluid.lp import FluidModel
from fluidopt.fluid.sli import TPOT, MinServedFraction, PrefillFairness
from fluidopt.pricing import pareto, parse_range, price_grid, shadow_prices

PAPER = paper_scenario(gpus=500)
# gamma * tau < (B-1)/B: the bundled LP may hold a decode buffer, so the lexicographic stage matters
BUFFERED = Scenario(
    gpu=GPUProfile.from_gamma(alpha=0.015, beta=1e-5, gamma=40.0, chunk=256, batch=16), gpus=100,
    classes=(RequestClass("a", 500, 800, 60.0, 0.1), RequestClass("b", 2500, 300, 40.0, 0.2),
             RequestClass("c", 1200, 1500, 30.0, 0.05)), prefill_price=0.1, decode_price=0.2)


@pytest.mark.parametrize("scenario,slis", [
    (PAPER, ()),
    (PAPER, (MinServedFraction("long-prompt", 0.6), TPOT(0.03))),
    (BUFFERED, ()),
    (BUFFERED, (PrefillFairness(0.05),)),
])
@pytest.mark.integration
@pytest.mark.parametrize("pricing", ["bundled", "separate"])
def test_direct_equals_pyomo_on_every_point(scenario, slis, pricing):
    # dense enough that most points reuse the previous basis (DirectFluidLP._reuse) and some do not: on this
    # 6 x 6 grid 2-12 of the 36 points go to highspy (9 x 9 until issue 47's sixth cut: 2-18 of 81)
    cps = np.linspace(0.0, 0.5, 6)
    cds = np.linspace(0.0, 0.6, 6)
    direct = DirectFluidLP(scenario, pricing, slis)
    fm = FluidModel(scenario, pricing, slis)
    fm.watch_structure = False
    vias = set()
    for cp in cps:
        for cd in cds:
            direct.set_prices(cp, cd)
            d = direct.solve()
            fm.update(scenario.with_prices(cp, cd))
            p = fm.solve(raise_infeasible=False)
            vias.add(d["via"])
            assert d["status"] == p.status
            assert d["objective_per_gpu"] == pytest.approx(p.objective_per_gpu, rel=1e-9, abs=1e-9)
            assert d["revenue_per_gpu"] == pytest.approx(p.revenue_per_gpu, rel=1e-9, abs=1e-9)
            if cp > 0 and cd > 0:  # with a zero price whole faces are optimal; the point may differ there
                np.testing.assert_allclose(d["served_fraction"], p.served_fraction, rtol=1e-7, atol=1e-7)
    assert "basis" in vias and "highspy" in vias


@pytest.mark.parametrize("kind,sli,bounds", [
    ("tpot", TPOT, np.linspace(0.0225, 0.033, 8)),
    ("fairness", PrefillFairness, np.linspace(0.0, 0.4, 8)),
])
def test_sli_bound_moves_match_a_fresh_pyomo_model(kind, sli, bounds):
    curve = pareto(PAPER, kind, bounds, pricings=("bundled",))
    for b, (_, row) in zip(bounds, curve.iterrows()):
        p = FluidModel(PAPER, "bundled", (sli(float(b)),)).solve(raise_infeasible=False)
        assert row["status"] == p.status
        if p.status == "optimal":
            assert row["revenue_per_gpu"] == pytest.approx(p.revenue_per_gpu, rel=1e-9)
    # looser bound, more revenue (an SLI's price is never negative)
    ok = curve[curve["status"] == "optimal"]["revenue_per_gpu"].to_numpy()
    assert np.all(np.diff(ok) >= -1e-9)


def test_price_grid_shape_and_homogeneity():
    g = price_grid(PAPER, [0.1, 0.2], [0.1, 0.2, 0.4])
    assert len(g) == 12 and set(g["pricing"]) == {"bundled", "separate"}
    b = g[g["pricing"] == "bundled"].set_index(["prefill_price", "decode_price"])["revenue_per_gpu"]
    # revenue is homogeneous of degree 1 in the prices: doubling both doubles it
    assert b[(0.2, 0.2)] == pytest.approx(2 * b[(0.1, 0.1)], rel=1e-9)
    assert b[(0.2, 0.4)] == pytest.approx(2 * b[(0.1, 0.2)], rel=1e-9)


def test_shadow_prices_and_ranges():
    sp = shadow_prices(PAPER, slis=(TPOT(0.03),))
    gpu = sp[(sp["pricing"] == "bundled") & (sp["item"] == "gpu")]["shadow_price"].item()
    assert gpu > 0
    assert "sli:tpot" in set(sp["item"])
    assert list(parse_range("0:1:3", "--x")) == [0.0, 0.5, 1.0]
    assert list(parse_range("0.1,0.3", "--x")) == [0.1, 0.3]
    from fluidopt.core.errors import UsageError

    for bad in ("a:b:c", "0:1:0", "-1,2", ""):
        with pytest.raises(UsageError):
            parse_range(bad, "--prefill")


@pytest.mark.integration
def test_price_cli_json_files_and_bad_input(tmp_path, capsys):
    import json

    from fluidopt.cli import main

    rc = main(["price", "--prefill", "0.05:0.5:4", "--decode", "0.1,0.2", "--points", "3", "--out", str(tmp_path),
               "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["points"] == 16 and len(d["pareto"]) == 2
    for f in ("grid.csv", "grid.png", "shadow_prices.csv", "pareto.csv", "pareto.png"):
        assert (tmp_path / f).stat().st_size > 0
    for args, message in ((["--prefill", "x"], "--prefill"), (["--decode=-1,2"], "--decode"),
                          (["--pareto", "nope"], "--pareto"), (["--simulate", "0.1"], "--simulate"),
                          (["--points", "1"], "--points"), (["--workers", "0"], "--workers")):
        rc = main(["price", *args])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and message in err, (args, err)
