"""More oracles for fluidopt.planning.day (issue 35, the second mutation rerun): a deadline less than a
second past a short day, the note that says so, a rates CSV with a byte-order mark, a workflow that
replays a trace, and the mixed-fleet run's sub-scenarios (each type's own maximum, one type per role)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from fluidopt.core.errors import UsageError
from fluidopt.core.model import ArrivalSpec, Workflow
from fluidopt.fluid.multiperiod import BacklogJob
from fluidopt.planning.day import read_rates_csv, simulate_mix, workflow_rates

from .test_oracles_dayplan import MU_BAT, day_scenario, plan_day


def test_a_deadline_half_a_slot_past_a_short_day_extends_the_plan_by_one_slot():
    """Four slots of 0.5 s (a 2 s day); a backlog at 1.5 s with a 1 s deadline is due at 2.5 s, half a
    slot (under a second) past the end: the plan runs one slot longer, and its N = 0.75 s of batch-GPU
    work (at mu_bat) is levelled over slots 3 and 4 (0.75 GPUs each)."""
    N = 0.75 * MU_BAT
    day = plan_day(day_scenario(deadline=1.0), [0.0] * 4, slot=0.5, backlogs=[("batch", N, 1.5)])
    assert day.backlogs == (BacklogJob("batch", N, 1.5, 2.5),)
    assert day.batch == pytest.approx([0, 0, 0, 0.75, 0.75], abs=1e-6)
    assert "deadline after the day's end (2 s): backlog batch due at 2.5 s; the plan runs 1 slot of 0.5 s longer, " \
           "to 2.5 s (deadlines rounded up to whole slots), with no interactive traffic after the day's end" in day.notes


def test_a_rates_csv_with_a_byte_order_mark(tmp_path):
    p = tmp_path / "rates.csv"
    p.write_bytes("rate,note\r\n1.5,a\r\n2,b\r\n".encode("utf-8-sig"))
    assert read_rates_csv(p).tolist() == [1.5, 2.0]
    p.write_bytes("0.25\n3\n".encode("utf-8-sig"))  # no header: the first number keeps its mark off
    assert read_rates_csv(p).tolist() == [0.25, 3.0]


def test_a_workflow_replaying_a_trace_gives_its_file_not_rates():
    sc = day_scenario()
    wf = Workflow(arrivals=(ArrivalSpec("interactive", process="trace", file="day.csv"),), horizon=7200.0)
    sc = replace(sc, workflow=wf)
    rates, trace, notes = workflow_rates(sc, 3600.0)
    assert rates is None and trace == "day.csv"
    assert notes == ["interactive rates from the workflow's trace day.csv"]
    # a Poisson class instead: its rate in both hourly slots
    sc = replace(sc, workflow=Workflow(arrivals=(ArrivalSpec("interactive", rate=3.0),), horizon=7200.0))
    rates, trace, _ = workflow_rates(sc, 3600.0)
    assert trace is None and rates.tolist() == [3.0, 3.0]


def _plan_of(names, interactive, batch):
    one, zero = np.ones(2), np.zeros(2)
    return SimpleNamespace(types=[SimpleNamespace(name=n) for n in names],
                           served_interactive=[one if f else zero for f in interactive],
                           served_mixed=[zero for _ in names], served_batch=[one if f else zero for f in batch])


def test_a_mix_with_two_interactive_types_is_refused():
    from fluidopt.scenario import load_scenario

    from .test_fleet_mix import MIX

    sc = load_scenario(MIX)
    with pytest.raises(UsageError, match="at most one interactive and one batch type in the plan, got 2 and 0"):
        simulate_mix(sc, _plan_of(["fast", "cheap"], [True, True], [False, False]), seed=0)
    with pytest.raises(UsageError, match="got 0 and 2"):
        simulate_mix(sc, _plan_of(["fast", "cheap"], [False, False], [True, True]), seed=0)


def test_each_type_runs_on_its_own_maximum(monkeypatch):
    """The batch type capped at 10 instances runs in a sub-scenario of 10 GPUs (not the scenario's 50),
    starting with none; the interactive type on the scenario's 50."""
    import pandas as pd

    from fluidopt.fluid.multiperiod import plan_fleet_mix
    from fluidopt.scenario import load_scenario
    from fluidopt.sim import api

    from .test_fleet_mix import JOBS, MIX

    sc = load_scenario(MIX)
    fast, cheap = sc.fleet.types
    plan = plan_fleet_mix(sc, JOBS, end=4200.0, slot=60.0)
    plan = replace(plan, types=(plan.types[0], replace(plan.types[1], max=10)))  # cheap capped at 10
    seen = {}

    def fake(sub, policy, **kw):
        seen[sub.name] = (sub.gpus, sub.fleet.initial, sub.gpu)
        pc = pd.DataFrame({"slo_requests": [0], "slo_attainment": [1.0]}, index=["x"])
        return SimpleNamespace(per_class=pc, meta={}, gpu_hours=1.0)

    monkeypatch.setattr(api, "simulate", fake)
    run = simulate_mix(sc, plan, seed=0)
    assert sc.gpus == 50
    assert seen[f"{sc.name}[cheap]"][:2] == (10, 0) and seen[f"{sc.name}[cheap]"][2] == cheap.gpu
    assert seen[f"{sc.name}[fast]"][0] == 50 and seen[f"{sc.name}[fast]"][2] == fast.gpu
    assert run.table.loc["cheap", "max"] == 10
