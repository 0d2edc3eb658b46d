"""Mixed instance types (issue 31, item 4): the multi-period LP chooses the mix per slot
(fluidopt.fluid.multiperiod.plan_fleet_mix), a two-type plan costs at most the cheaper single-type
plan, the mix runs role by role in the simulator with its autoscalers (fluidopt.planning.day.simulate_mix), and
bad instance types are one line and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from fluidopt.cli import main
from fluidopt.core.errors import ScenarioError
from fluidopt.fluid.multiperiod import BacklogJob, plan_fleet, plan_fleet_mix
from fluidopt.planning.day import mix_roles, simulate_mix
from fluidopt.scenario import load_scenario, loads_scenario, scenario_to_dict

MIX = Path(__file__).resolve().parents[2] / "examples/scenarios/chiron-workflow-mix.toml"
JOBS = [BacklogJob("batch", 100_000, 300.0, 3900.0)]


@pytest.fixture(scope="module")
def sc():
    return load_scenario(MIX)


def test_two_types_cost_at_most_the_cheaper_single_type(sc):
    fast, cheap = sc.fleet.types
    mix = plan_fleet_mix(sc, JOBS, end=4200.0, slot=60.0)
    only_fast = plan_fleet_mix(sc, JOBS, [fast], end=4200.0, slot=60.0)
    only_cheap = plan_fleet_mix(sc, JOBS, [cheap], end=4200.0, slot=60.0)
    # one type: the single-type LP (no kept base) times the price
    assert only_fast.cost == pytest.approx(2.0 * plan_fleet(sc, JOBS, end=4200.0, slot=60.0, utilisation=1.0).gpu_hours,
                                           rel=1e-6)
    assert only_fast.cost == pytest.approx(38.54, abs=0.01) and only_cheap.cost == pytest.approx(31.58, abs=0.01)
    assert mix.cost <= min(only_fast.cost, only_cheap.cost)
    assert mix.cost == pytest.approx(28.60, abs=0.01)
    # the mix: the interactive hour on fast (30 / 6.864 GPUs), the batch work on cheap (N / mu_bat)
    assert mix_roles(mix) == {"fast": "interactive", "cheap": "batch"}
    f, c = mix.types
    assert mix.gpu_hours[0] == pytest.approx(30.0 / f.rates.mu_int * 4200.0 / 3600.0, rel=1e-6)
    assert mix.gpu_hours[1] == pytest.approx(100_000 / c.rates.mu_bat / 3600.0, rel=1e-6)
    tab = mix.by_type()
    assert tab.loc["fast", "tokens"] == pytest.approx(30.0 * 4200.0 * 400.0, rel=1e-6)
    assert tab.loc["cheap", "tokens"] == pytest.approx(100_000 * 700.0, rel=1e-6)
    for t in ("fast", "cheap"):
        assert tab.loc[t, "cost_per_million_tokens"] == pytest.approx(tab.loc[t, "cost"] / tab.loc[t, "tokens"] * 1e6)
        assert tab.loc[t, "cost_per_hour"] == pytest.approx(tab.loc[t, "cost"] / (4200.0 / 3600.0))
    assert tab["cost"].sum() == pytest.approx(mix.cost, rel=1e-9)


def test_a_type_cap_moves_work_to_the_other_type(sc):
    from dataclasses import replace

    fast, cheap = sc.fleet.types
    capped = plan_fleet_mix(sc, JOBS, [fast, replace(cheap, max=10)], end=4200.0, slot=60.0)
    assert (capped.base[1] + capped.batch[1]).max() <= 10 + 1e-6
    assert capped.served_batch[0].sum() + capped.served_mixed[0].sum() > 0  # fast takes the rest
    assert capped.cost >= plan_fleet_mix(sc, JOBS, end=4200.0, slot=60.0).cost - 1e-9


def test_the_mix_simulated_meets_both_slos(sc):
    plan = plan_fleet_mix(sc, JOBS, end=4200.0, slot=60.0)
    run = simulate_mix(sc, plan, seed=1)
    assert run.slo["interactive"] >= 0.99 and run.slo["batch"] >= 0.99
    assert run.table.loc["fast", "role"] == "interactive" and run.table.loc["cheap", "role"] == "batch"
    assert run.cost >= plan.cost  # no controller below the bound
    assert run.cost == pytest.approx(sum(run.table["gpu_hours"] * [2.0, 1.2]))
    assert run.cost < 2.0 * 23.0  # below Chiron on the fast type alone (23.75 GPU-hours at 2.0)


def test_instance_types_round_trip_and_bad_types(sc, tmp_path, capsys):
    assert loads_scenario_from(scenario_to_dict(sc)).fleet.types == sc.fleet.types
    text = MIX.read_text()
    bad = {
        "no profile": (text.replace('gpu = { alpha = 0.025, beta = 9e-5, gamma = 30.0, chunk = 256, batch = 128, '
                                    'kv_time_per_token = 1.5e-6 }\n', ""),
                       "fleet.types[1] ('cheap'): expected a GPU profile"),
        "unknown profile": (text.replace('gpu = { alpha = 0.025, beta = 9e-5, gamma = 30.0, chunk = 256, batch = 128, '
                                         'kv_time_per_token = 1.5e-6 }', 'gpu = "nope"'),
                            "fleet.types[1] ('cheap').gpu: unknown GPU profile 'nope'"),
        "negative start-up": (text.replace("startup_delay = 120.0", "startup_delay = -5.0"),
                              "fleet.types['cheap'].startup_delay: expected a number >= 0, got -5.0"),
        "negative fleet start-up": (text.replace("startup_delay = 60.0      #", "startup_delay = -1.0 #"),
                                    "fleet.startup_delay: expected a number >= 0, got -1.0"),
        "unknown backlog class": (text.replace('class = "batch"\ncount', 'class = "nope"\ncount'),
                                  "backlogs[0].class: expected a class of the scenario (interactive, batch), got 'nope'"),
        "deadline before arrival": (text.replace("at = 300.0", "at = 300.0\ndeadline = 200.0"),
                                    "backlogs[0].deadline: expected a time after its arrival at = 300 s, got 200"),
    }
    for what, (t, msg) in bad.items():
        assert t != text, what
        f = tmp_path / "bad.toml"
        f.write_text(t)
        assert main(["simulate", str(f), "--policy", "chiron"]) == 2, what
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and msg in err[0] and "Traceback" not in err[0], (what, err)
        with pytest.raises(ScenarioError):
            load_scenario(f)


def loads_scenario_from(d):
    import tomli_w

    return loads_scenario(tomli_w.dumps(d))


def test_plan_day_reports_the_mix_by_type(capsys):
    """`fluidopt plan FILE --day` with instance types: the LP's mix per type and each type alone."""
    import json

    assert main(["plan", str(MIX), "--day", "--slot", "60", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    mix = out["mix"]
    assert mix["cost"] == pytest.approx(28.60, abs=0.01)
    assert mix["single_type_cost"]["fast"] == pytest.approx(38.54, abs=0.01)
    assert mix["single_type_cost"]["cheap"] == pytest.approx(31.58, abs=0.01)
    by = {r["type"]: r for r in mix["by_type"]}
    assert by["fast"]["batch_served"] == pytest.approx(0.0, abs=1e-6) and by["cheap"]["batch_served"] == pytest.approx(1e5)
    assert main(["plan", str(MIX), "--day", "--slot", "60"]) == 0
    text = capsys.readouterr().out
    assert "the cheapest mix costs 28.60 (a lower bound)" in text and "each type alone: fast 38.54, cheap 31.58" in text
