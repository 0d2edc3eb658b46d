"""The app's numbers without a browser: fluidopt.app.logic against the library it wraps."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

import fluidopt
from fluidopt.app import logic as L
from fluidopt.core.errors import ScenarioError
from fluidopt.fluid.lp import solve_fluid
from fluidopt.scenario import default_scenario, scenario_to_dict

DATA = scenario_to_dict(default_scenario())


def test_edits_never_change_the_callers_dict_and_build_the_loaders_scenario():
    edited = L.set_field(DATA, ("classes", 1, "rate"), 100.0)
    assert DATA["classes"][1]["rate"] == 250.0 and edited["classes"][1]["rate"] == 100.0
    sc = L.build(edited)
    assert sc.classes[1].rate == 100.0 and sc.classes[0] == default_scenario().classes[0]


@pytest.mark.parametrize("path, value", [(("classes", 0, "rate"), -1.0), (("classes", 1, "name"), ""),
                                         (("cluster", "gpus"), 0), (("gpu", "chunk"), 0), (("pricing", "decode"), -0.1)])
def test_a_field_error_is_the_loaders_message(path, value):
    with pytest.raises(ScenarioError) as e:
        fluidopt.scenario.scenario_from_dict(L.set_field(DATA, path, value))
    assert L.field_error(DATA, path, value) == str(e.value)
    assert L.field_error(DATA, path[:-1] + (path[-1],), DATA_value(path)) is None


def DATA_value(path):
    node = DATA
    for k in path:
        node = node[k]
    return node


def test_toml_round_trip_and_a_bad_upload():
    text = L.to_toml(L.set_field(DATA, ("cluster", "gpus"), 123))
    sc, data = L.from_toml(text)
    assert sc == default_scenario().__class__(**{**default_scenario().__dict__, "gpus": 123})
    assert data["cluster"]["gpus"] == 123
    with pytest.raises(ScenarioError, match=r"scenario: unknown key 'colour'"):
        L.from_toml("colour = 'red'\n" + text)


def test_operating_point_is_solve_fluid_under_both_pricings():
    sc = L.build(L.set_field(DATA, ("classes", 0, "rate"), 100.0))
    op = L.operating_point(sc)
    for pricing in ("bundled", "separate"):
        sol = solve_fluid(sc, pricing=pricing)
        h = op.headline.set_index("pricing").loc[pricing]
        assert h["revenue_per_gpu"] == sol.objective_per_gpu and h["mixed_gpus"] == sol.mixed_gpus
        got = op.classes[op.classes["pricing"] == pricing]
        assert list(got["x"]) == list(sol.x) and list(got["served_fraction"]) == list(sol.served_fraction)
        d = op.duals[op.duals["pricing"] == pricing].set_index("row")["shadow_price"]
        assert d.to_dict() == {k: v for k, v in sol.duals.items() if abs(v) > 1e-9}


def test_capacity_is_the_fluid_plan_and_scales_with_growth():
    from fluidopt.planning.fleet import PlanSLIs, plan

    tab = L.capacity(default_scenario(), [1.0, 2.0], 0.99)
    want = plan(default_scenario(), PlanSLIs(served=0.99), growth=[1.0, 2.0], fluid_only=True).table
    assert list(tab["n_fluid"]) == list(want["n_fluid"])
    assert tab["n_fluid"].iloc[1] == pytest.approx(2 * tab["n_fluid"].iloc[0], rel=1e-9)  # linear in demand


def test_price_curve_is_the_price_grid_along_one_axis():
    from fluidopt.pricing import price_grid

    sc = default_scenario()
    cur = L.price_curve(sc, "decode", [0.1, 0.2, 0.3])
    grid = price_grid(sc, [sc.prefill_price], [0.1, 0.2, 0.3], pricings=("bundled",))
    assert list(cur["revenue_per_gpu"]) == list(grid["revenue_per_gpu"])
    with pytest.raises(ScenarioError, match="which"):
        L.price_curve(sc, "both", [0.1])


def _wait(job, limit=120):
    t0 = time.monotonic()
    while not job.finished and time.monotonic() - t0 < limit:
        time.sleep(0.05)
    assert job.finished


@pytest.mark.integration
def test_a_comparison_job_gives_the_harness_numbers_and_reports_progress():
    from fluidopt.harness import compare

    sc = replace(default_scenario(), gpus=20)
    job = L.compare_job(sc, ["fi-wsp"], seeds=2, horizon=60.0, warmup=10.0, workers=1)
    _wait(job)
    assert job.status == "done" and (job.done, job.total) == (2, 2)
    want = compare(sc, ["fi-wsp"], seeds=[0, 1], horizon=60.0, warmup=10.0, workers=1)
    assert list(job.result.runs["revenue"]) == list(want.runs["revenue"])


@pytest.mark.integration
def test_a_verify_job_is_cancelled_within_a_second_and_says_what_finished():
    job = L.verify_job(default_scenario(), horizon=3000.0, warmup=100.0, workers=1)
    time.sleep(2.0)
    t0 = time.monotonic()
    job.cancel()
    _wait(job, 10)
    assert time.monotonic() - t0 < 2.0
    assert job.status == "cancelled" and job.message.startswith("simulation-verified fleet: cancelled")


def test_a_failing_job_is_one_line_in_the_page():
    def work(job):
        raise ScenarioError("classes[0].rate: expected a number > 0, got -1")

    job = L.start("demo", work)
    _wait(job, 5)
    assert job.status == "failed" and job.message == "demo: classes[0].rate: expected a number > 0, got -1"
