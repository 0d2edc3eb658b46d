"""Workflows in scenario files (issue 31, item 2): [[arrivals]], [[backlogs]] and [workflow] parsed
strictly, built into the same workload as by hand, run by `fluidopt simulate` from the file alone,
with a warning for a batch class that never arrives and one-line errors (exit 2) for bad input."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fluidopt.cli import main
from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import ArrivalSpec, BacklogSpec, Workflow
from fluidopt.scenario import load_scenario, loads_scenario, scenario_from_dict, scenario_to_dict
from fluidopt.workloads import (
    Backlog,
    BacklogWorkload,
    ClassSpec,
    Exponential,
    GammaRenewal,
    SyntheticWorkload,
    WorkflowWarning,
    check_workflow,
    collect,
    workload_from_scenario,
)

WORKFLOW = Path(__file__).resolve().parents[2] / "examples/scenarios/chiron-workflow.toml"
TEXT = WORKFLOW.read_text()


def small(text: str = TEXT, **subs: str) -> str:
    """The workflow file with lines replaced (key -> new line)."""
    for old, new in subs.items():
        text = re.sub(rf"^{old} = .*$", new, text, count=1, flags=re.M)
    return text


def test_the_workflow_file_states_the_whole_workflow():
    sc = load_scenario(WORKFLOW)
    wf = sc.workflow
    assert wf.horizon == 4200.0
    assert wf.arrivals == (ArrivalSpec("interactive", "gamma", rate=30.0, cv=4.0),)
    assert wf.backlogs == (BacklogSpec("batch", 100_000, 300.0),)
    assert scenario_from_dict(scenario_to_dict(sc)) == sc  # round trip


def test_workflow_workload_is_the_hand_built_one():
    """The file's workload draws exactly the arrivals of the hand-built workload of the example
    script before issue 31 (same seeds, same streams), so the recorded runs reproduce."""
    sc = load_scenario(WORKFLOW)
    sc = replace(sc, workflow=replace(sc.workflow, backlogs=(BacklogSpec("batch", 2000, 300.0),)))
    hand = BacklogWorkload(
        SyntheticWorkload([ClassSpec(GammaRenewal(30.0, 4.0), Exponential(300), Exponential(100), name="interactive")]),
        [Backlog("batch", 2000, 300.0, Exponential(300), Exponential(400))], class_names=sc.class_names)
    a = collect(workload_from_scenario(sc), np.random.default_rng(7), 600.0)
    b = collect(hand, np.random.default_rng(7), 600.0)
    for f in ("time", "cls", "prompt", "output"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    assert (a.cls == 1).sum() == 2000 and a.time[a.cls == 1].min() == 300.0


@pytest.mark.filterwarnings("ignore::fluidopt.workloads.TraceWarning")
def test_trace_and_rate_file_processes(tmp_path):
    (tmp_path / "trace.csv").write_text("time,prompt_tokens,output_tokens\n0,100,10\n1,300,30\n59,200,20\n")
    (tmp_path / "rates.csv").write_text("rate\n2.0\n0.0\n")
    text = TEXT.replace('process = "gamma"\nrate = 30.0               # requests/s\ncv = 4.0',
                        'process = "trace"\nfile = "trace.csv"')
    assert 'file = "trace.csv"' in text
    text = text + (
        '\n[[arrivals]]\nclass = "batch"\nprocess = "rates"\nfile = "rates.csv"\nslot = 100.0\n')
    f = tmp_path / "wf.toml"
    f.write_text(text.replace("count = 100000", "count = 5"))
    sc = load_scenario(f)
    assert sc.workflow.arrivals[0].file == str(tmp_path / "trace.csv")  # relative to the scenario file
    got = collect(workload_from_scenario(sc), np.random.default_rng(1), 400.0)
    inter = got.cls == 0
    assert got.time[inter].tolist() == [0.0, 1.0, 59.0] and got.prompt[inter].tolist() == [100, 300, 200]
    bat = got.time[got.cls == 1]
    assert (bat == 300.0).sum() == 5  # the backlog
    ongoing = bat[bat != 300.0]
    assert ongoing.max() < 100.0 and 150 < ongoing.size < 250  # Poisson at 2/s in the first slot only
    assert np.all(np.diff(got.time) >= 0)


def test_batch_class_that_never_arrives_is_a_warning():
    sc = load_scenario(WORKFLOW)
    with pytest.warns(WorkflowWarning, match=r"batch class 'batch' never arrives within the horizon \(its backlog "
                                             r"arrives at 300 s, not before the horizon 200 s\)"):
        check_workflow(sc, 200.0)
    assert check_workflow(sc, 4200.0) == []
    none = replace(sc, workflow=Workflow(arrivals=sc.workflow.arrivals))
    with pytest.warns(WorkflowWarning, match="it has no \\[\\[backlogs\\]\\] table"):
        check_workflow(none, 4200.0)


@pytest.mark.parametrize("edit, message", [
    ({"class": 'class = "nope"'}, "arrivals[0].class: expected a class of the scenario (interactive, batch), got 'nope'"),
    ({"at": "at = 300.0\ndeadline = 200.0"}, "backlogs[0].deadline: expected a time after its arrival at = 300 s, got 200"),
    ({"at": "at = 300.0\ndeadline = 4000.0"}, "backlogs[0].deadline: expected the class's deadline_at = 3900 s"),
    ({"at": "at = 5000.0"}, "backlogs[0]: the deadline of class 'batch', deadline_at = 3900 s, is not after the "
                            "backlog's arrival at = 5000 s"),
    ({"count": "count = -5"}, "backlogs[0].count: expected an integer >= 0, got -5"),
    ({"startup_delay": "startup_delay = -1.0"}, "fleet.startup_delay: expected a number >= 0, got -1.0"),
    ({"cv": "cvv = 4.0"}, "arrivals[0]: unknown key 'cvv' (did you mean 'cv'?)"),
    ({"cv": ""}, "arrivals[0].cv: expected a value for process = 'gamma', got none"),
    ({"process": 'process = "weibull"'}, "arrivals[0].process: expected one of poisson, gamma, trace, rates, got 'weibull'"),
    ({"horizon": "horizon = -1.0"}, "workflow.horizon: expected a number > 0, got -1.0"),
])
def test_bad_workflow_is_one_line_and_exit_2(tmp_path, capsys, edit, message):
    f = tmp_path / "bad.toml"
    f.write_text(small(TEXT, **edit))
    with pytest.raises(ScenarioError) as e:
        load_scenario(f)
    assert message in str(e.value)
    assert main(["simulate", str(f), "--policy", "chiron"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_backlog_deadline_sets_the_class_deadline():
    text = small(TEXT, deadline_at="", at="at = 300.0\ndeadline = 3600.0")
    sc = loads_scenario(text)
    assert sc.classes[1].deadline_at == 3600.0
    with pytest.raises(ScenarioError, match=r"backlogs\[0\]: class 'batch' has no deadline"):
        loads_scenario(small(TEXT, deadline_at=""))


@pytest.mark.integration
def test_simulate_runs_the_whole_workflow_from_the_file(capsys):
    """issue 31: `fluidopt simulate examples/scenarios/chiron-workflow.toml --policy chiron` completes
    the backlog (before, it completed 0 batch requests) and prints GPU-hours and both attainments."""
    assert main(["simulate", str(WORKFLOW), "--policy", "chiron", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "service tokens" in out and "window 0 .. 4200 s" in out
    m = re.search(r"GPU-hours ([\d.]+) \(time 0 to 4200 s\); SLO attainment: interactive ([\d.]+) .*; batch ([\d.]+) "
                  r"\((\d+) of 100000 met; (\d+) completed", out)
    assert m, out
    gh, si, sb, met, done = float(m[1]), float(m[2]), float(m[3]), int(m[4]), int(m[5])
    # issue 31's targets: both SLOs >= 0.99 (Chiron's statistical bound plans to finish about 75 s
    # before the deadline; a few long batch requests admitted last miss it: 219 of 100,000 here)
    assert done == 100_000 and met >= 99_000 and sb >= 0.99 and si >= 0.99
    assert 20.0 < gh < 24.09  # within 1.25x of the calibrated bound (19.27)


def test_with_gpus_scales_the_workflow():
    """The same per-GPU load on another fleet: the Gamma rate and the backlog scale with n."""
    sc = load_scenario(WORKFLOW)
    half = replace(sc, fleet=replace(sc.fleet, initial=5)).with_gpus(25)
    assert half.workflow.arrivals[0].rate == 15.0 and half.classes[0].rate == 15.0
    assert half.workflow.backlogs[0].count == 50_000
    traced = replace(sc, workflow=replace(sc.workflow, arrivals=(ArrivalSpec("interactive", "trace", file="t.csv"),)))
    with pytest.raises(ScenarioError, match=r"arrivals\[0\] \(interactive\): a trace file cannot be rescaled to 25 GPUs"):
        traced.with_gpus(25)
