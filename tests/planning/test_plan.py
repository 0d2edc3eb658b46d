"""`fluidopt plan` / fluidopt.planning.fleet at a tiny size: fluid bound, verified search, costs, bad input."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

import fluidopt
from fluidopt.cli import main
from fluidopt.core.errors import ScenarioError, UsageError
from fluidopt.core.model import paper_gpu
from fluidopt.planning.fleet import PlanSLIs, batch_chunk_study, plan

# the paper's classes at a demand that needs a handful of GPUs
TINY = replace(fluidopt.default_scenario(gpus=4), name="tiny")


def test_plan_search_starts_at_the_fluid_bound_and_is_minimal(tmp_path):
    res = plan(TINY, PlanSLIs(served=0.9), seeds=2, horizon=250.0, warmup=60.0, out=tmp_path)
    row = res.table.iloc[0]
    assert row["n_fluid_int"] == math.ceil(row["n_fluid"] - 1e-9)
    assert row["n_sim"] >= row["n_fluid_int"] and row["correction"] == row["n_sim"] - row["n_fluid_int"]
    assert row["binding"].startswith("served_fraction")
    cv = res.curves
    ok = cv.groupby("n")["met"].all()
    assert ok[int(row["n_sim"])]  # the answer meets every SLI
    assert not ok[ok.index < row["n_sim"]].any()  # every smaller probe misses one
    if row["n_sim"] > row["n_fluid_int"]:
        assert int(row["n_sim"]) - 1 in ok.index  # the one just below was probed (the search is exact)
    assert row["cost_per_hour"] == pytest.approx(row["n_sim"] * 1.8)
    assert row["cost_per_million_output_tokens"] == pytest.approx(
        row["cost_per_hour"] / (row["output_tokens_per_s"] * 3600 / 1e6))
    fig = res.figure()
    assert fig.axes and fig.axes[0].get_xlabel() == "GPUs n"
    # a rerun finds every run in the store: same answer, nothing simulated
    again = plan(TINY, PlanSLIs(served=0.9), seeds=2, horizon=250.0, warmup=60.0, out=tmp_path,
                 executor=_NoRuns())
    assert again.table.iloc[0]["n_sim"] == row["n_sim"]


class _NoRuns:
    """An executor that fails if asked to run anything."""

    workers = 1

    def imap(self, fn, jobs):
        jobs = list(jobs)
        assert not jobs, f"{len(jobs)} runs were not in the store"
        return iter(())

    def close(self):
        pass

    def describe(self):
        return "none"


def test_fluid_only_profiles_growth_and_cheapest():
    res = plan(TINY, PlanSLIs(served=0.99, tpot=0.03), profiles=["qwen-8b-a100", "qwen-4b-a100", "llama2-7b-v100"],
               growth=[1, 2, 4], fluid_only=True)
    t = res.table
    assert len(t) == 9 and t["n_sim"].isna().all()
    for _prof, g in t.groupby("profile"):
        n = g.sort_values("growth")["n_fluid"].to_numpy()
        assert n[1] == pytest.approx(2 * n[0], rel=1e-9) and n[2] == pytest.approx(4 * n[0], rel=1e-9)  # linear in demand
    assert t.groupby("growth")["cheapest"].sum().eq(1).all()


def test_batch_chunk_study_rows():
    df = batch_chunk_study(fluidopt.default_scenario(gpus=500), batches=(8, 16), chunks=(128, 256))
    assert len(df) == 4 and set(df["status"]) == {"optimal"}
    # a bigger batch never earns less per GPU in the fluid model (more decode slots per GPU)
    r = df.set_index(["batch", "chunk"])["revenue_per_gpu"]
    assert r[(16, 256)] >= r[(8, 256)] - 1e-9


@pytest.mark.parametrize("kwargs,exc,message", [
    (dict(growth=[0]), UsageError, "--growth"),
    (dict(growth=[-1]), UsageError, "--growth"),
    (dict(profiles=["nope"]), ScenarioError, "unknown GPU profile"),
    (dict(policy="nope"), UsageError, "--policy"),
    (dict(seeds=0), UsageError, "--seeds"),
])
def test_bad_plan_input(kwargs, exc, message):
    with pytest.raises(exc, match=message):
        plan(TINY, PlanSLIs(served=0.9), fluid_only=True, **kwargs)


def test_profile_without_a_price():
    sc = replace(TINY, gpu=replace(paper_gpu(), price_per_hour=None, name="unpriced"))
    with pytest.raises(ScenarioError, match="'unpriced': no price per GPU-hour"):
        plan(sc, PlanSLIs(served=0.9), fluid_only=True)


@pytest.mark.parametrize("args,message", [
    (["--tpot", "0.01"], "no fleet size meets TPOT <= 0.01 s because the GPU law's solo decode time is 0.022"),
    (["--ttft", "0.01"], "no fleet size meets mean TTFT <= 0.01 s for class 'short-prompt' because its prefill"),
    (["--served", "0"], "--served"),
    (["--served", "1.5"], "--served"),
    (["--growth", "1,0"], "--growth"),
    (["--growth", "x"], "--growth"),
    (["--profiles", "qwen-8b-a100,nope"], "unknown GPU profile"),
    (["--workers", "0"], "--workers"),
])
def test_cli_bad_input_one_line_exit_2(args, message, capsys):
    rc = main(["plan", "--fluid-only", *args])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and message in err, err


def test_cli_fluid_only_json(capsys):
    rc = main(["plan", "--fluid-only", "--served", "0.95", "--profiles", "qwen-8b-a100,llama2-7b-v100",
               "--growth", "1,2", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(d["fleets"]) == 4
    assert all(f["binding"] for f in d["fleets"])
