"""Each SLI's rows, written once in fluidopt/fluid/sli.py: their numbers by hand, the per-GPU LP and the
capacity LP reading the same rows, and a scenario file's SLIs parsed once."""

import copy
import pickle
from pathlib import Path

import pytest

from fluidopt import default_scenario
from fluidopt.core.errors import ScenarioError
from fluidopt.fluid import TPOT, FluidModel, MaxPrefillWait, MinServedFraction, PrefillFairness
from fluidopt.fluid.lp import scenario_slis
from fluidopt.fluid.sli import RowData, SLIRow
from fluidopt.scenario import loads_scenario

EXAMPLE = (Path(__file__).resolve().parents[2] / "examples/scenarios/paper-two-class.toml").read_text()


def _data():
    sc = default_scenario()  # per GPU: lambda = 0.5 /s each; tau_mix = 0.0174 + 6.2e-5 * 256 s; gamma = 45.45
    return sc, RowData(sc.class_names, sc.rates(), sc.gpu)


def test_builtin_rows_by_hand():
    sc, d = _data()
    tau, gamma, B = 0.0174 + 6.2e-5 * 256, 45.45, 16.0
    (row,) = TPOT(0.0235).rows(d)
    assert row.name == "tpot" and row.sense == "<=" and row.main and row.rhs == 0.0
    assert row.rhs_per_gpu == pytest.approx(0.0235 - 1 / gamma, rel=1e-12)
    assert [t[:2] for t in row.terms] == [("x", ("short-prompt", "long-prompt"))]  # one coefficient on X
    assert row.terms[0][2] == pytest.approx((tau * (B - 1) - B / gamma + 0.0235) / B, rel=1e-12)
    (row,) = MinServedFraction("long-prompt", 0.9).rows(d)
    assert row == SLIRow("served_fraction[long-prompt]", (("x", "long-prompt", row.terms[0][2]),), ">=", 0.9, main=True)
    assert row.terms[0][2] == pytest.approx(256 / (3000 * tau) / 0.5, rel=1e-12)  # mu_p / lambda
    (row,) = MaxPrefillWait("short-prompt", 2.0).rows(d)
    assert row.terms == (("q_prefill", "short-prompt", 2.0),) and row.per_gpu_rhs == 2.0  # 1 / lambda
    rows = PrefillFairness(0.05).rows(d)
    assert [r.name for r in rows] == ["prefill_fairness_max[short-prompt]", "prefill_fairness_max[long-prompt]",
                                      "prefill_fairness_min[short-prompt]", "prefill_fairness_min[long-prompt]",
                                      "prefill_fairness"]
    assert rows[-1].rhs_per_gpu == 0.05 and rows[-1].terms == (("x_max", None, 1.0), ("x_min", None, -1.0))


def test_the_per_gpu_lp_loads_each_row_as_written():
    sc, d = _data()
    slis = (TPOT(0.0235, penalty=10.0), MinServedFraction("long-prompt", 0.9), PrefillFairness(0.05))
    fm = FluidModel(sc, slis=slis)
    m = fm.model
    for s in slis:
        for row in s.rows(d):
            if row.fixed:  # written as constants
                assert row.name.startswith(("prefill_fairness_max", "prefill_fairness_min"))
                continue
            assert m.sli_rhs[row.name].value == row.per_gpu_rhs
            assert [m.sli_coef[row.name, k].value for k in range(len(row.terms))] == [t[2] for t in row.terms]
    # update() recomputes them from the rows at the new bound
    fm.update(slis=(TPOT(0.024, penalty=10.0), MinServedFraction("long-prompt", 0.8), PrefillFairness(0.05)))
    assert m.sli_rhs["served_fraction[long-prompt]"].value == 0.8
    assert m.sli_coef["tpot", 0].value == TPOT(0.024).rows(d)[0].terms[0][2]


def test_a_row_on_an_unknown_variable_is_named():
    from dataclasses import dataclass
    from typing import ClassVar

    from fluidopt.fluid.sli import SLIBase

    @dataclass(frozen=True)
    class Bad(SLIBase):
        cap: float
        penalty: float | None = None
        kind: ClassVar[str] = "bad"
        bound_field: ClassVar[str] = "cap"

        def rows(self, d):
            return (SLIRow("bad", (("z", "short-prompt", 1.0),), "<=", self.cap, main=True),)

    with pytest.raises(ScenarioError, match=r"sli bad=1: row bad: unknown variable z\[short-prompt\]"):
        FluidModel(default_scenario(), slis=(Bad(1.0),))


def test_a_scenario_files_slis_are_parsed_once():
    s = loads_scenario('slis = ["tpot=0.0235", "served:short-prompt=0.9:penalty=5"]\n' + EXAMPLE)
    specs = s.meta["slis"]
    assert specs == ("tpot=0.0235", "served:short-prompt=0.9:penalty=5")
    assert scenario_slis(s) is specs.slis  # the objects parsed when the file was read, not parsed again
    assert specs.slis == (TPOT(0.0235), MinServedFraction("short-prompt", 0.9, penalty=5.0))
    for c in (pickle.loads(pickle.dumps(s)), copy.deepcopy(s)):  # workers get them too
        assert c.meta["slis"] == specs and scenario_slis(c) == specs.slis
