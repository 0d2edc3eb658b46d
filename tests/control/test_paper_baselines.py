"""The paper's baselines (GI-WSP, GF-WSP, FG-SP here; FI-WSP too) on the simulator.

Each test checks the defining behaviour of a policy from per-request records (the GPU of each
request's prefill and decode) or from queue statistics, on small fleets.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

import fluidopt
from fluidopt import RequestClass
from fluidopt.control.gate_and_route import GateAndRoute
from fluidopt.control.paper_baselines import FGSP, GFWSP, GIWSP
from fluidopt.control.registry import make_controller
from fluidopt.fluid import solve_fluid
from fluidopt.sim.api import simulate

N = 12
# The engine's per-event invariant checks (check=True) run in tests/test_controllers_property.py; here
# the policies' definitions are checked from the records of longer, unchecked runs.
KW = dict(horizon=200.0, warmup=40.0, seed=2)


@pytest.fixture(scope="module")
def paper():
    return fluidopt.default_scenario().with_gpus(N)


@pytest.fixture(scope="module")
def three_class(paper):
    """The paper's instance plus a third class priced so low that the LP never prefills it (x* = 0)."""
    cheap = RequestClass("cheap", prompt=500, decode=800, rate=0.3 * N, patience=0.1, prefill_price=0.001,
                         decode_price=0.001)
    s = replace(paper, classes=paper.classes + (cheap,), name="three-class")
    sol = solve_fluid(s)
    assert sol.x[2] == 0.0 and sol.x[:2].min() > 0
    return s, sol


def _records(scenario, ctrl, tmp_path, name, **kw) -> tuple[pd.DataFrame, object]:
    path = tmp_path / f"{name}.csv"
    res = simulate(scenario, ctrl, records=path, **{**KW, **kw})
    return pd.read_csv(path), res


def test_registry_builds_each_baseline_from_the_scenario(paper):
    sol = solve_fluid(paper)
    for name, cls in (("gi-wsp", GIWSP), ("gf-wsp", GFWSP), ("fg-sp", FGSP)):
        ctrl = make_controller(name, paper)
        assert type(ctrl) is cls and ctrl.name == name
        np.testing.assert_allclose(ctrl.x, sol.x)


def _done(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["outcome"] == "completed"]


def test_gi_wsp_decodes_in_place_with_no_buffer_and_no_partition(paper, tmp_path):
    df, res = _records(paper, "gi-wsp", tmp_path, "gi")
    done = _done(df)
    assert len(done) > 500
    assert (done["prefill_gpu"] == done["decode_gpu"]).all()  # coupled decode
    assert set(done["prefill_gpu"]) == set(range(N))  # no partition: every GPU prefills
    assert res.totals["abandoned_decode"] == 0 and (res.per_class["q_decode_mean"] == 0).all()


def test_fi_wsp_matches_the_paper_definition(paper, tmp_path):
    """The engine helper's FI-WSP: FCFS, coupled decode, no partition (checked, not assumed)."""
    df, res = _records(paper, "fi-wsp", tmp_path, "fi")
    done = _done(df)
    assert (done["prefill_gpu"] == done["decode_gpu"]).all()
    assert set(done["prefill_gpu"]) == set(range(N))
    assert res.totals["abandoned_decode"] == 0


def test_gf_wsp_prefills_first_and_decodes_anywhere(paper, tmp_path):
    df, res = _records(paper, "gf-wsp", tmp_path, "gf")
    done = _done(df)
    assert set(done["prefill_gpu"]) == set(range(N))
    moved = (done["prefill_gpu"] != done["decode_gpu"]).mean()
    assert moved > 0.5  # decoupled: a decode goes to a random GPU with a free slot
    # prefill-first: prefills almost never wait; the decode buffer takes the congestion instead
    assert res.per_class["abandoned_prefill_fraction"].max() < 0.01
    assert res.totals["abandoned_decode"] > 0


def test_fg_sp_partition_with_fcfs_admission(three_class, tmp_path):
    s, sol = three_class
    fg = FGSP.from_solution(sol)
    M = fg.plan_mixed_gpus(N)
    assert M == math.ceil(N * sol.prefill_occupancy - 1e-9)
    df, res = _records(s, fg, tmp_path, "fg")
    pre = df[df["prefill_gpu"] >= 0]
    assert pre["prefill_gpu"].max() < M  # prefills only on the mixed pool
    # no gate: the class with x* = 0 is admitted (FCFS) ...
    assert res.per_class["x_mean"].iloc[2] > 0
    # ... while Gate-and-Route never admits it
    gg = simulate(s, GateAndRoute.from_solution(sol), **KW)
    assert gg.per_class["x_mean"].iloc[2] == 0.0 and gg.per_class["completed"].iloc[2] == 0


def test_gated_baselines_never_admit_a_zero_target_class(three_class):
    s, sol = three_class
    for cls in (GIWSP, GFWSP):
        res = simulate(s, cls.from_solution(sol), **KW)
        assert res.per_class["x_mean"].iloc[2] == 0.0, cls.name
        assert res.per_class["x_mean"].iloc[:2].min() > 0


def test_baselines_are_deterministic(paper):
    a = simulate(paper, "gf-wsp", horizon=100.0, warmup=10.0, seed=9)
    b = simulate(paper, "gf-wsp", horizon=100.0, warmup=10.0, seed=9)
    assert a.cluster["revenue_per_gpu"] == b.cluster["revenue_per_gpu"]
    assert a.totals == b.totals
