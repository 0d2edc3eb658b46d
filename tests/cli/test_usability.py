"""Usability of the command line: a fleet size without a price, one meaning for --seed / --seeds, a
trace replayed on a fleet it barely loads, "did you mean" for misspelt names."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from builders import ROOT

import fluidopt
from fluidopt.core.errors import UsageError, did_you_mean

pytestmark = pytest.mark.integration


def test_plan_fluid_only_reports_the_fleet_without_a_price(cli_here):
    # paper-two-class.toml has no price per GPU-hour: the fleet size needs none; the cost columns are empty
    r = cli_here("plan", "examples/scenarios/paper-two-class.toml", "--fluid-only", "--json")
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)["table"][0] if "table" in json.loads(r.stdout) else None
    text = cli_here("plan", "examples/scenarios/paper-two-class.toml", "--fluid-only")
    assert text.returncode == 0 and "516.83" in text.stdout and "517" in text.stdout
    assert "cheapest" not in text.stdout  # nothing to rank without prices
    if row is not None:
        assert row["n_fluid_int"] == 517


def test_seed_is_the_first_seed_and_seeds_how_many(tmp_path, cli_here):
    out = tmp_path / "o"
    r = cli_here("run", "--gpus", "6", "--horizon", "30", "--warmup", "5", "--policies", "fi-wsp", "--seed", "3",
                "--seeds", "2", "--out", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    assert sorted(pd.read_csv(out / "runs.csv")["seed"]) == [3, 4]
    # the same two runs as compare(seeds=[3, 4])
    direct = fluidopt.simulate(fluidopt.default_scenario(gpus=6), "fi-wsp", horizon=30.0, warmup=5.0, seed=4)
    assert pd.read_csv(out / "runs.csv").set_index("seed").loc[4, "completed"] == direct.totals["completed"]


def test_seed_alone_no_longer_means_a_count_and_says_so(tmp_path, cli_here):
    r = cli_here("run", "--gpus", "6", "--horizon", "30", "--warmup", "5", "--policies", "fi-wsp", "--seed", "3",
                "--out", str(tmp_path / "o"), "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "note: --seed 3 is the first seed (seeds 3..4)" in r.stderr  # --seeds defaults to 2
    assert sorted(pd.read_csv(tmp_path / "o" / "runs.csv")["seed"]) == [3, 4]


def test_options_are_not_abbreviated(cli_here):
    r = cli_here("simulate", "--policy", "fi-wsp", "--hor", "10")
    assert r.returncode == 2 and "unrecognized arguments: --hor" in r.stderr


def test_bad_seed_values_are_one_line(cli_here):
    r = cli_here("run", "--seeds", "0")
    assert r.returncode == 2 and "--seeds: expected an integer >= 1, got 0" in r.stderr
    r = cli_here("run", "--seed", "-1")
    assert r.returncode == 2 and "--seed: expected an integer >= 0, got -1" in r.stderr


def test_trace_on_a_fleet_it_barely_loads_warns_and_suggests_gpus(tmp_path, cli_here):
    trace = tmp_path / "t.csv"
    pd.DataFrame({"time": [0.5 * k for k in range(200)], "prompt_tokens": 500, "output_tokens": 100}).to_csv(
        trace, index=False)
    r = cli_here("simulate", "--trace", str(trace), "--service", "tokens", "--policy", "jsq", "--horizon", "20")
    assert r.returncode == 0, r.stderr
    # 2 requests/s of 500 + 100 tokens need 0.33 GPUs of the paper's profile (fluid bound): 0.065% of 500
    assert "warning: --trace: the trace loads the 500-GPU fleet at 0.065% of its fluid capacity" in r.stderr
    assert "try --gpus 1" in r.stderr
    r = cli_here("simulate", "--trace", str(trace), "--service", "tokens", "--policy", "jsq", "--horizon", "20",
                "--gpus", "1")
    assert r.returncode == 0 and "warning" not in r.stderr  # 33%: no warning


def test_trace_load_is_the_fluid_bound_over_the_fleet(tmp_path):
    from fluidopt.workloads.traces import fleet_load, replay

    trace = tmp_path / "t.csv"
    pd.DataFrame({"time": [0.5 * k for k in range(201)], "prompt_tokens": 500, "output_tokens": 100}).to_csv(
        trace, index=False)
    sc, wl = replay(trace, fluidopt.default_scenario(gpus=10))
    # hand: 2 requests/s (201 over 100 s); a GPU's prefill capacity is chunk / (prompt * tau_mix) requests/s
    # and the decode side bounds the rest; the fluid bound solves both: 0.326 GPUs -> 3.26% of 10
    assert fleet_load(wl, sc) == pytest.approx(0.032605, rel=1e-3)
    assert fleet_load(wl, sc.with_gpus(1)) == pytest.approx(10 * fleet_load(wl, sc), rel=1e-12)


@pytest.mark.parametrize("argv, hint", [
    (["simulate", "--policy", "jsqq", "--horizon", "5"], "did you mean 'jsq'?"),
    (["simulate", "--policy", "gate-and-rout", "--horizon", "5"], "did you mean 'gate-and-route'"),
    (["plan", "--policy", "fi-wps", "--seeds", "1"], "did you mean 'fi-wsp'"),
])
def test_unknown_names_suggest_the_closest(argv, hint, cli_here):
    r = cli_here(*argv, cwd=ROOT)
    assert r.returncode == 2 and hint in r.stderr and "Traceback" not in r.stderr


def test_did_you_mean_only_suggests_close_names():
    assert did_you_mean("jsqq", ["jsq", "fi-wsp"]) == " (did you mean 'jsq'?)"
    assert did_you_mean("colour", ["cluster", "classes"]) == ""
    with pytest.raises(UsageError, match=r"unknown policy 'fcsf' \(did you mean 'fcfs'\?\)"):
        from fluidopt.control.registry import make_controller

        make_controller("fcsf", fluidopt.default_scenario(gpus=2))
