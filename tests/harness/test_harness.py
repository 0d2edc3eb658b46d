"""The comparison harness and the ``fluidopt run`` main job."""

import dataclasses
import json
import signal

import numpy as np
import pytest
from builders import ROOT, run_cli

import fluidopt
from fluidopt.core.errors import ScenarioError
from fluidopt.core.interrupt import Interrupted
from fluidopt.harness import compare
from fluidopt.harness import comparison as harness

SMALL = fluidopt.default_scenario(gpus=8)
KW = dict(horizon=60.0, warmup=10.0)


@pytest.mark.integration
def test_rows_bounds_and_ratio():
    c = compare(SMALL, ["gate-and-route", "fi-wsp"], seeds=[0, 1], workers=1, **KW)
    assert len(c.runs) == 4 and not c.interrupted
    assert set(c.runs["policy"]) == {"gate-and-route", "fi-wsp"}
    lp = fluidopt.solve_fluid(SMALL).objective_per_gpu
    assert np.allclose(c.runs["lp_bound"], lp)
    assert np.allclose(c.runs["ratio"], c.runs["revenue_per_gpu"] / lp)
    # per-class table: one row per class per run
    assert len(c.classes) == 4 * SMALL.n_classes
    s = c.summary()
    assert list(s["policy"]) == ["gate-and-route", "fi-wsp"] and (s["seeds"] == 2).all()
    # two seeds: the pooled batch-means half-width sqrt(sum hw^2)/k
    g = c.runs[c.runs["policy"] == "fi-wsp"]
    expect = np.sqrt((g["revenue_ci"] ** 2).sum()) / 2
    assert s.loc[s["policy"] == "fi-wsp", "revenue_ci"].item() == pytest.approx(expect)


@pytest.mark.integration
def test_runs_reproduce_simulate_and_do_not_depend_on_workers():
    """A harness run is exactly simulate() with the same seed, in any process layout."""
    serial = compare(SMALL, ["gate-and-route"], seeds=[3, 4], workers=1, **KW)
    parallel = compare(SMALL, ["gate-and-route"], seeds=[3, 4], workers=2, **KW)
    cols = ["seed", "revenue_per_gpu", "throughput", "abandoned", "completed", "e2e_mean"]
    assert serial.runs[cols].equals(parallel.runs[cols])
    direct = fluidopt.simulate(SMALL, "gate-and-route", seed=4, **KW)
    row = serial.runs[serial.runs["seed"] == 4].iloc[0]
    assert row["revenue_per_gpu"] == direct.cluster["revenue_per_gpu"]
    assert row["completed"] == direct.totals["completed"]


def test_interrupt_keeps_finished_runs(monkeypatch):
    real = harness._run_one
    calls = []

    def flaky(job):
        calls.append(job["seed"])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(job)

    monkeypatch.setattr(harness, "_run_one", flaky)
    with pytest.raises(Interrupted) as e:
        compare(SMALL, ["fi-wsp"], seeds=[0, 1, 2], workers=1, **KW)
    c = e.value.partial
    assert c.interrupted and list(c.runs["seed"]) == [0]
    assert e.value.signum == signal.SIGINT and "1 of 3 simulations finished" in e.value.kept


def test_save_writes_complete_tables(tmp_path):
    c = compare(SMALL, ["fi-wsp"], seeds=[0], workers=1, out=tmp_path / "res", **KW)
    names = sorted(p.name for p in (tmp_path / "res").iterdir())
    # the tables, and the results store a rerun resumes from
    assert names == ["bounds.csv", "classes.csv", "meta.json", "runs.csv", "store.jsonl", "summary.csv"]
    back = harness.Comparison.load(tmp_path / "res")
    assert len(back.runs) == len(c.runs) and back.pricing == c.pricing
    assert back.runs["revenue_per_gpu"].tolist() == c.runs["revenue_per_gpu"].tolist()
    assert back.summary()["ratio"].tolist() == c.summary()["ratio"].tolist()
    assert back.meta["horizon"] == 60.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(policies=["no-such-policy"]), r"unknown policy 'no-such-policy'"),
        (dict(policies=[]), r"policies: expected at least one"),
        (dict(seeds=[-1]), r"seeds: expected integers >= 0, got -1"),
        (dict(seeds=[]), r"seeds: expected at least one seed"),
        (dict(pricing="flat"), r"pricing: expected 'bundled' or 'separate', got 'flat'"),
        (dict(warmup=100.0), r"warmup: expected less than the horizon"),
        (dict(service="fluid"), r"service: expected 'markov' or 'tokens', got 'fluid'"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    args = dict(policies=["fi-wsp"], seeds=[0], horizon=60.0, warmup=10.0, workers=1)
    args.update(kwargs)
    policies = args.pop("policies")
    with pytest.raises(ScenarioError, match=message):
        compare(SMALL, policies, **args)


@pytest.mark.integration
def test_per_scenario_windows_and_labelled_variants():
    """Each scenario runs its own window; a (label, name) pair runs one policy with other options."""
    big = dataclasses.replace(fluidopt.default_scenario(gpus=12), name="twelve")
    c = compare([SMALL, big], ["fi-wsp", ("g&r M=2", "gate-and-route"), ("g&r M=3", "gate-and-route")],
                seeds=[1], workers=1, horizon={SMALL.name: 60.0, "twelve": 40.0},
                warmup={SMALL.name: 10.0, "twelve": 5.0},
                options={"g&r M=2": {"mixed_gpus": 2}, "g&r M=3": {"mixed_gpus": 3}})
    assert list(c.runs["policy"]) == ["fi-wsp", "g&r M=2", "g&r M=3"] * 2
    for name, h, w in ((SMALL.name, 60.0, 10.0), ("twelve", 40.0, 5.0)):
        sc = SMALL if name == SMALL.name else big
        for label, m in (("g&r M=2", 2), ("g&r M=3", 3)):
            direct = fluidopt.simulate(sc, fluidopt.make_controller("gate-and-route", sc, mixed_gpus=m),
                                       horizon=h, warmup=w, seed=1)
            row = c.runs[(c.runs["scenario"] == name) & (c.runs["policy"] == label)].iloc[0]
            assert row["revenue_per_gpu"] == direct.cluster["revenue_per_gpu"]
            assert row["completed"] == direct.totals["completed"]
    assert c.meta["horizon"] == {SMALL.name: 60.0, "twelve": 40.0}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(horizon={"nope": 60.0}), r"horizon: a mapping must give one value per scenario name"),
        (dict(policies=[("a", "fi-wsp"), ("a", "gate-and-route")]), r"labels must be unique"),
        (dict(policies=[("a", 3)]), r"expected a policy name or a \(label, name\) pair"),
    ],
)
def test_bad_windows_and_labels_are_named(kwargs, message):
    args = dict(policies=["fi-wsp"], seeds=[0], horizon=60.0, warmup=10.0, workers=1)
    args.update(kwargs)
    policies = args.pop("policies")
    with pytest.raises(ScenarioError, match=message):
        compare(SMALL, policies, **args)


def test_duplicate_scenario_names_rejected():
    with pytest.raises(ScenarioError, match="names must be unique"):
        compare([SMALL, SMALL.with_gpus(4)], ["fi-wsp"], workers=1, **KW)


_cli = run_cli


@pytest.mark.integration
def test_run_main_job_json_and_files(tmp_path, cli_here):
    out = tmp_path / "out"
    p = cli_here("run", "--gpus", "6", "--horizon", "40", "--warmup", "10", "--seeds", "1", "--workers", "1",
             "--policies", "gate-and-route,fi-wsp", "--out", str(out), "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["gpus"] == 6 and d["lp_objective_per_gpu"] == pytest.approx(297.7032, abs=1e-3)
    assert [r["policy"] for r in d["policies"]] == ["gate-and-route", "fi-wsp"]
    assert all(0 < r["ratio"] < 1.2 for r in d["policies"])
    for name in ("runs.csv", "summary.csv", "comparison.png", "occupancy.png"):
        assert (out / name).stat().st_size > 0


@pytest.mark.integration
def test_run_bad_input_exits_2_without_traceback(tmp_path, cli_here):
    p = cli_here("run", "--gpus", "0", "--out", "")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "--gpus: expected an integer >= 1, got 0" in p.stderr
    p = cli_here("run", "--policies", "nope", "--gpus", "4", "--horizon", "10", "--out", "")
    assert p.returncode == 2 and "unknown policy 'nope'" in p.stderr


SLI_TOML = """
name = "paper-with-slis"
slis = [{slis}]
[gpu]
alpha = 0.0174
beta = 6.2e-5
gamma = 45.45
chunk = 256
batch = 16
[cluster]
gpus = 6
[pricing]
prefill = 0.1
decode = 0.2
[[classes]]
name = "short-prompt"
prompt = 300
decode = 1000
rate = 3.0
patience = 0.1
[[classes]]
name = "long-prompt"
prompt = 3000
decode = 400
rate = 3.0
patience = 0.1
"""


def test_run_honours_the_scenarios_slis(tmp_path, capsys):
    """R* and the plan are those of the file's SLIs; an infeasible set is one line, exit 2, before any run."""
    from fluidopt.cli import main

    f = tmp_path / "s.toml"
    f.write_text(SLI_TOML.format(slis='"served:short-prompt=0.99", "tpot=0.025"'))
    rc = main(["run", str(f), "--policies", "gate-and-route", "--seeds", "1", "--horizon", "30", "--warmup", "5",
               "--workers", "1", "--out", "", "--json"])
    d = json.loads(capsys.readouterr().out)
    expect = fluidopt.solve_fluid(fluidopt.load_scenario(f))
    assert rc == 0 and d["slis"] == ["served:short-prompt=0.99", "tpot=0.025"]
    assert d["lp_objective_per_gpu"] == pytest.approx(expect.objective_per_gpu, rel=1e-12)
    assert d["lp_objective_per_gpu"] < fluidopt.solve_fluid(fluidopt.load_scenario(f), slis=()).objective_per_gpu
    f.write_text(SLI_TOML.format(slis='"tpot=0.0001"'))
    rc = main(["run", str(f), "--out", "", "--workers", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "tpot" in err and "Traceback" not in err


@pytest.mark.integration
def test_run_replays_a_trace(tmp_path, cli_here):
    """fluidopt run --trace: every run replays the same trace; a second run resumes from the store."""
    import json as _json

    trace = tmp_path / "t.csv"
    rows = ["time,prompt_tokens,output_tokens"] + [f"{0.05 * k:.2f},{100 + 37 * (k % 9)},{20 + 11 * (k % 5)}"
                                                   for k in range(300)]
    trace.write_text("\n".join(rows) + "\n")
    argv = ["run", str(ROOT / "examples/scenarios/paper-two-class.toml"), "--trace", str(trace), "--service", "tokens",
            "--gpus", "2", "--horizon", "20", "--warmup", "2", "--seeds", "1", "--workers", "1",
            "--policies", "fi-wsp,round-robin", "--out", str(tmp_path / "out"), "--json", "--no-progress"]
    p = cli_here(*argv)
    assert p.returncode == 0, p.stderr
    runs = _json.loads(p.stdout)
    p2 = cli_here(*argv)
    again = _json.loads(p2.stdout)
    for d in (runs, again):
        d.pop("wall_seconds", None)
    assert p2.returncode == 0 and again == runs  # resumed from the store: the same numbers
    bad = cli_here("run", "--trace", str(trace), "--horizon", "5")
    assert bad.returncode == 2 and "--service tokens" in bad.stderr
