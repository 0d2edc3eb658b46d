"""The newcomer's stumbles (issue 47): each fixed or explained in the command's own output.

In-process calls of :func:`fluidopt.cli.main` (faster than a subprocess); output read with capsys."""

from __future__ import annotations

import json

import pytest
from builders import ROOT, process_state, state_changes

from fluidopt.cli import main

pytestmark = pytest.mark.integration

REGIME = str(ROOT / "examples" / "scenarios" / "rl-router-paper-regime.toml")


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    before = process_state()
    code = main(list(argv))
    out, err = capsys.readouterr()
    changed = state_changes(before, process_state())  # nothing left for the next test on this worker
    assert not changed, f"fluidopt {' '.join(argv)} left the process changed: " + "; ".join(changed)
    return code, out, err


# 1. RL weights trained for another scenario are labelled in the table itself


def test_trained_on_reads_the_scenario_from_each_shipped_file():
    from fluidopt.rl.mlp import WEIGHTS_DIR, trained_on

    assert trained_on(WEIGHTS_DIR / "baseline-rl-4.npz") == "rl-router-v100"
    assert trained_on(WEIGHTS_DIR / "wa-rl-8.npz") == "rl-router-v100-8"
    assert trained_on(WEIGHTS_DIR / "wg-rl-regime.npz") == "rl-router-paper-regime"
    assert trained_on(WEIGHTS_DIR / "wg-rl-regime-fig4b.npz") == "rl-router-paper-regime-fig4b"
    # examples/rl_sb3.py without --scenario trains on the paper regime
    assert trained_on(WEIGHTS_DIR / "sb3-dqn-regime.npz") == "rl-router-paper-regime"
    assert trained_on(WEIGHTS_DIR / "no-such-file.npz") is None


def test_foreign_weights_by_router_and_scenario():
    from fluidopt.rl.policies import foreign_weights
    from fluidopt.scenario import load_scenario

    regime = load_scenario(REGIME)
    assert foreign_weights("baseline-rl", regime) == "rl-router-v100"
    assert foreign_weights("wa-rl-chunked", regime) == "rl-router-v100"
    assert foreign_weights("wg-rl", regime) is None  # its own imitation weights
    assert foreign_weights("sb3-ppo", regime) is None
    assert foreign_weights("jsq", regime) is None  # no weights at all
    v100 = load_scenario(ROOT / "examples" / "scenarios" / "rl-router-v100.toml")
    assert foreign_weights("baseline-rl", v100) is None
    # a file given with --option is judged by what it was trained on
    from fluidopt.rl.mlp import WEIGHTS_DIR

    assert foreign_weights("wg-rl", v100, str(WEIGHTS_DIR / "wg-rl-regime.npz")) == "rl-router-paper-regime"


def test_rl_evaluate_marks_weights_trained_for_another_scenario(capsys, monkeypatch):
    from fluidopt.harness.executor import Progress

    monkeypatch.setattr(Progress, "LOG_EVERY", 0.0)  # a progress line per row even off a terminal
    code, out, err = cli(capsys, "rl", "evaluate", REGIME, "--policies", "round-robin,baseline-rl,wg-rl",
                         "--episodes", "1", "--requests", "40")
    assert code == 0, err
    assert [ln.split(":")[0] for ln in err.splitlines()] == [
        "  episode 0 round-robin", "  episode 0 baseline-rl", "  episode 0 wg-rl"]
    assert all(ln.endswith(" s elapsed)") for ln in err.splitlines())
    rows = {line.split()[0]: line for line in out.splitlines()[2:5]}
    assert rows["baseline-rl"].startswith("baseline-rl *")
    assert "*" not in rows["wg-rl"] and "*" not in rows["round-robin"]
    foot = out.splitlines()[5]
    assert foot.startswith("* baseline-rl: weights trained on rl-router-v100, not on rl-router-paper-regime")
    code, out, err = cli(capsys, "rl", "evaluate", REGIME, "--policies", "round-robin,baseline-rl,wg-rl",
                         "--episodes", "1", "--requests", "40", "--json")
    by = {r["policy"]: r["weights_trained_on"] for r in json.loads(out)}
    assert by == {"round-robin": None, "baseline-rl": "rl-router-v100", "wg-rl": None}


# 2. a trace that is not CSV says so, and names the formats read


def _jsonl(path, n=30):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"timestamp": 100 * i, "input_length": 500 + i, "output_length": 100,
                                "hash_ids": list(range(14))}) + "\n")
    return path


@pytest.mark.parametrize("kind, what", [
    ("json", "looks like JSON (an array), not CSV"),
    ("gz", "looks like a gzip-compressed file, not CSV"),
    ("parquet", "looks like a Parquet file, not CSV"),
])
def test_a_trace_that_is_not_csv_names_the_formats_read(capsys, tmp_path, kind, what):
    import gzip

    src = _jsonl(tmp_path / "t.jsonl")
    path = {"jsonl": src, "json": tmp_path / "t.json", "gz": tmp_path / "t.jsonl.gz",
            "parquet": tmp_path / "t.parquet"}[kind]
    if kind == "json":
        path.write_text(json.dumps([json.loads(x) for x in src.read_text().splitlines()]))
    elif kind == "gz":
        path.write_bytes(gzip.compress(src.read_bytes()))
    elif kind == "parquet":
        path.write_bytes(b"PAR1" + b"\x00" * 64)
    code, out, err = cli(capsys, "simulate", "--trace", str(path), "--service", "tokens", "--policy", "jsq",
                         "--horizon", "10")
    assert code == 2
    line, = err.splitlines()
    assert f"error: {path.name}: {what}; traces are read from an Azure LLM inference trace CSV" in line
    assert "generic trace CSV (time,prompt_tokens,output_tokens[,class])" in line
    assert "Mooncake JSON lines (timestamp,input_length,output_length,hash_ids)" in line
    assert "fields, expected" not in line


def test_a_mooncake_json_lines_trace_is_read_by_trace(capsys, tmp_path):
    # issue 42: JSON lines in the Mooncake format replay (cache-blind) instead of being refused
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 100 * i, "input_length": 1500, "output_length": 100,
                                        "hash_ids": [0, 1, 2 + i]}) + "\n" for i in range(30)))
    code, out, err = cli(capsys, "simulate", "--trace", str(path), "--service", "tokens", "--policy", "jsq",
                         "--horizon", "10", "--json")
    assert code == 0, err
    assert json.loads(out)["requests"] == 30


def test_the_library_readers_refuse_json_lines_too(tmp_path):
    import io

    from fluidopt.core.errors import TraceError
    from fluidopt.workloads.traces import read_azure_trace, read_trace_csv

    path = _jsonl(tmp_path / "t.jsonl")
    for reader in (read_trace_csv, read_azure_trace):
        with pytest.raises(TraceError, match=r"^t\.jsonl: looks like JSON lines"):
            reader(path)
    with pytest.raises(TraceError, match="looks like JSON lines"):
        read_trace_csv(io.StringIO(path.read_text()))
    # a CSV stream is still read from where it stands
    df = read_trace_csv(io.StringIO("time,prompt_tokens,output_tokens\n0,5,6\n1,7,8\n"))
    assert list(df["prompt"]) == [5, 7]


# 4. fluidopt price: the grid's corner is not an optimum without demand; the SLI table's separate rows


def test_price_without_demand_says_the_best_point_is_the_grid_corner(capsys):
    code, out, err = cli(capsys, "price", "--prefill", "0:0.3:4", "--decode", "0:0.4:3", "--pareto", "tpot",
                         "--points", "3")
    assert code == 0, err
    head = out.splitlines()[2]
    assert head.startswith("highest LP revenue per GPU per s on the grid: the grid's top corner, not an optimal price")
    assert "the best price is the top of any range" in head  # the app's words (pricing_opt.NO_DEMAND_WHY)
    best = out.splitlines()[4].split()
    assert best[:3] == ["bundled", "0.3", "0.4"]  # the corner indeed
    # the SLI table's separate rows: the bundled revenue, and a note on why, with the value without the row
    note = [x for x in out.splitlines() if x.startswith("note: under an SLI row")]
    assert len(note) == 1
    assert "separate pricing without an SLI row: 298.587 per GPU per s" in note[0]  # docs/lp.md: 298.59


def test_price_with_demand_keeps_the_plain_headline(capsys):
    code, out, err = cli(capsys, "price", str(ROOT / "examples/scenarios/paper-two-class-demand.toml"),
                         "--prefill", "0:0.5:3", "--decode", "0:0.5:3", "--pareto", "", "--pricing", "bundled")
    assert code == 0, err
    assert "highest LP revenue per GPU per s on the grid:\n" in out
    assert "top corner" not in out and "note: under an SLI row" not in out


# 5. fluidopt run's report defines its terms, keeps the order asked for and names the store


def test_run_report_defines_its_terms_orders_rows_and_names_the_store(capsys, tmp_path, monkeypatch):
    import fluidopt.harness as harness

    real = harness.Comparison.summary
    # the runs may come back in any order (a pool, a resumed store): the report keeps --policies' order
    monkeypatch.setattr(harness.Comparison, "summary", lambda self, *a, **k: real(self, *a, **k).iloc[::-1])
    out_dir = tmp_path / "o"
    code, out, err = cli(capsys, "run", "--gpus", "6", "--horizon", "30", "--warmup", "5", "--policies",
                         "gate-and-route,gi-wsp,fi-wsp", "--seeds", "2", "--out", str(out_dir), "--no-progress")
    assert code == 0, err
    lines = out.splitlines()
    # M = ceil(6 x 0.213211) = 2 (docs/lp.md: sum x* = 0.21321 on the paper instance)
    assert "M = 2 mixed GPUs (sum x* = 0.2132)" in lines[1]
    table = lines[lines.index("") + 1:]
    assert [ln.split()[0] for ln in table[1:4]] == ["gate-and-route", "gi-wsp", "fi-wsp"]
    assert any(ln.startswith("R*: the fluid LP's revenue per GPU per s") and "M = ceil(n sum x*)" in ln
               for ln in lines)
    assert any(ln.startswith("vs LP: simulated revenue / R*; ±: 95% confidence half-width (with fewer than 5 "
                             "seeds, the runs' batch-means intervals pooled)") for ln in lines)
    why = [ln for ln in lines if ln.startswith("gate-and-route is the paper's policy")]
    assert len(why) == 1 and "gi-wsp, fi-wsp: the paper's baselines" in why[0] and "at 6 GPUs" in why[0]
    saved = [ln for ln in lines if ln.startswith("saved: ")][0]
    assert f"{out_dir / 'store.jsonl'} (every run" in saved and (out_dir / "store.jsonl").is_file()


def test_run_with_five_seeds_names_the_t_interval(capsys, tmp_path):
    code, out, err = cli(capsys, "run", "--gpus", "4", "--horizon", "20", "--warmup", "5", "--policies", "fi-wsp",
                         "--seeds", "5", "--out", "", "--no-progress")
    assert code == 0, err
    assert "±: 95% confidence half-width (t interval over the 5 seeds)" in out
    assert "gate-and-route is the paper's policy" not in out  # not run: nothing to explain
    assert "saved:" not in out  # --out '': nothing saved, no store


# 6. solve --gpus; simulate checks the values given before the policy it misses


def test_solve_gpus_scales_the_cluster_totals(capsys):
    code, out, err = cli(capsys, "solve", "--gpus", "500", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["gpus"] == 500 and d["mixed_gpus"] == 107  # ceil(500 x 0.213211) (README)
    assert d["objective"] == pytest.approx(500 * 297.7031698642446, rel=1e-9)
    code, out, err = cli(capsys, "solve", "--gpus", "20")
    assert code == 0, err
    assert "20 GPUs" in out.splitlines()[0] and "mixed GPUs M = 5, solo GPUs = 15" in out  # ceil(20 x 0.213211)
    assert "5954.0634 per s (cluster)" in out  # 20 x 297.70317
    for bad in ("0", "-3"):
        code, out, err = cli(capsys, "solve", "--gpus", bad)
        assert code == 2 and err.strip() == f"fluidopt solve: error: --gpus: expected an integer in 1..2,147,483,647, got {bad}"


@pytest.mark.parametrize("argv, message", [
    (["--horizon", "-5"], "simulate: horizon: expected a finite number of seconds > 0, got -5.0"),
    (["--warmup", "-1"], "simulate: warmup: expected a finite number of seconds >= 0, got -1.0"),
    (["--horizon", "20", "--warmup", "50"], "simulate: warmup: expected less than the horizon 20 s, got 50 s"),
    (["--drain", "0"], "simulate: drain: expected a finite number of seconds > 0, got 0.0"),
    (["--gpus", "0"], "--gpus: expected an integer in 1..2,147,483,647, got 0"),
    ([], "--policy: a policy name is required"),
])
def test_simulate_reports_bad_values_before_the_missing_policy(capsys, argv, message):
    code, out, err = cli(capsys, "simulate", *argv)
    assert code == 2
    assert err.splitlines()[0].startswith(f"fluidopt simulate: error: {message}")


# 8. small things


def test_plan_price_column_says_per_replica_when_a_profile_is_a_replica(capsys):
    code, out, err = cli(capsys, "plan", "--profiles", "a100-codellama-34b-tp1,a100-codellama-34b-tp2",
                         "--price", "a100=2", "--fluid-only")
    assert code == 0, err
    lines = out.splitlines()
    head = next(ln for ln in lines if ln.lstrip().startswith("profile"))
    assert "$/unit-h" in head and "GPUs/unit" in head and "$/GPU-h" not in head
    assert head.split()[-5:] == ["$/unit-h", "cost/h", "cost/M", "out", "tok"]
    # (GPUs/unit, price per unit-hour): the 2nd and the 3rd from last cells
    rows = {ln.split()[0]: (ln.split()[1], ln.split()[-3]) for ln in lines if ln.startswith("a100-codellama")}
    # 2 per GPU-hour: 2 per hour for one GPU, 4 for a replica of 2 GPUs
    assert rows == {"a100-codellama-34b-tp1": ("1", "2"), "a100-codellama-34b-tp2": ("2", "4")}
    assert "note: a100-codellama-34b-tp2 is one replica of 2 GPUs" in out
    code, out, err = cli(capsys, "plan", "--profiles", "a100-codellama-34b-tp1", "--price", "a100=2", "--fluid-only")
    assert code == 0 and "$/GPU-h" in out and "GPUs/unit" not in out


def test_calibrate_list_shows_names_models_and_hardware_whole(capsys):
    from fluidopt.calibration import list_profiles

    code, out, err = cli(capsys, "calibrate", "--list")
    assert code == 0, err
    df = list_profiles()
    body = out.splitlines()[1:1 + len(df)]
    for (name, row), line in zip(df.iterrows(), body):
        model = str(row["model"]).split("/")[-1]
        assert line.split()[:2] == [name, model]
        assert str(row["hardware"]) in line
    assert "CodeLlama-34b-Instruct-hf" in out and "NVIDIA A100-SXM4-80GB" in out  # were cut at 15 / 17 characters


def test_clean_shows_solver_round_off_as_zero():
    import pandas as pd

    from fluidopt.commands.price import _clean

    df = pd.DataFrame({"gpu_shadow_price": [799.715, 0.174302, 6.28322e-07, -3.5e-11],
                       "rate": [2.4e-11, 35.8, 355.0, 315.0], "gpus": [25, 713, 714, 1000]})
    c = _clean(df)
    assert list(c["gpu_shadow_price"]) == [799.715, 0.174302, 0.0, 0.0]  # 6.3e-7 / 800 < 1e-6; 0.17 is real
    assert list(c["rate"]) == [0.0, 35.8, 355.0, 315.0]
    assert list(c["gpus"]) == [25, 713, 714, 1000]  # integers untouched
    assert df["rate"].iloc[0] == 2.4e-11  # a copy: the saved tables keep the solver's numbers


def test_simulate_says_unpriced_instead_of_zero_revenue(capsys):
    code, out, err = cli(capsys, "simulate", str(ROOT / "examples/scenarios/chiron-workflow.toml"), "--policy",
                         "chiron", "--horizon", "120")
    assert code == 0, err
    assert "revenue: none, the scenario is unpriced (every token price is 0)" in out
    assert "revenue per GPU per s" not in out
    code, out, err = cli(capsys, "simulate", "--policy", "jsq", "--gpus", "4", "--horizon", "30")
    assert code == 0 and "revenue per GPU per s   bundled" in out and "unpriced" not in out


def test_fit_demand_skips_comment_lines_above_the_header(capsys, tmp_path):
    obs = tmp_path / "obs.csv"
    obs.write_text("# observed in March\n\nclass,price,rate\nshort-prompt,200,250\nshort-prompt,250,210\n"
                   "short-prompt,300,170\n")
    code, out, err = cli(capsys, "price", "--fit-demand", str(obs), "--json")
    assert code == 0, err
    lin = [f for f in json.loads(out)["fits"] if f["model"] == "linear"][0]
    # rate = 410 - 0.8 price through all three points
    assert lin["estimate"] == pytest.approx(0.8) and lin["estimate2"] == pytest.approx(410.0)
    obs.write_text("# observed\nclass,price,rate\nshort-prompt,-1,2\n")
    code, out, err = cli(capsys, "price", "--fit-demand", str(obs))
    assert code == 2 and "row 3, column 'price': expected a number >= 0, got -1" in err  # the file's line 3


@pytest.mark.parametrize("text, what", [
    ("class,price,rate\na,1,2\n", "looks like a CSV table (header 'class,price,rate'), not a scenario"),
    ("# a trace\ntime,prompt_tokens,output_tokens\n0,5,6\n", "looks like a CSV table (header "
                                                             "'time,prompt_tokens,output_tokens'), not a scenario"),
    ('{"timestamp": 0, "input_length": 5}\n{"timestamp": 1, "input_length": 6}\n', "looks like JSON, not a scenario"),
])
def test_a_csv_or_json_given_as_a_scenario_says_what_a_scenario_is(capsys, tmp_path, text, what):
    p = tmp_path / "s.csv"
    p.write_text(text)
    code, out, err = cli(capsys, "solve", str(p))
    assert code == 2
    assert what in err and "a scenario is a TOML file with [gpu], [cluster] and [[classes]] tables" in err


def test_broken_toml_still_gets_the_toml_error():
    from fluidopt.core.errors import ScenarioError
    from fluidopt.scenario import loads_scenario

    for text in ("[gpu\nalpha = 1\n", "[[classes]\n", "name = \n", "a = [1, 2\n"):
        with pytest.raises(ScenarioError, match="not valid TOML"):
            loads_scenario(text)


# 7. progress when stderr is not a terminal: a plain line every few seconds


def test_progress_log_mode_prints_plain_lines_on_a_timer(capsys, monkeypatch):
    import time

    from fluidopt.harness.executor import Progress

    monkeypatch.setattr(Progress, "LOG_EVERY", 0.05)
    p = Progress(4, enabled="log", desc="simulations")
    assert p.enabled and p.log and p._bar is None  # no tqdm in a log
    time.sleep(0.3)
    p.update(1)
    time.sleep(0.3)
    p.close()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 3
    assert lines[0].startswith("[simulations] 0/4 done, ") and lines[0].endswith(" s elapsed")  # no pace yet
    assert lines[-1].startswith("[simulations] 1/4 done, ") and ", about " in lines[-1]
    # 1 of 4 done in about 0.6 s: about 3 x 0.6 s left
    assert lines[-1].endswith(" s left")
    time.sleep(0.2)
    assert capsys.readouterr().err == ""  # closed: the timer has stopped


def test_progress_log_mode_is_silent_when_the_work_ends_sooner(capsys):
    from fluidopt.harness.executor import Progress

    p = Progress(2, enabled="log")
    p.update(2)
    p.close()
    assert capsys.readouterr().err == ""


def test_commands_ask_for_log_lines_when_stderr_is_not_a_terminal(monkeypatch):
    import argparse
    import sys

    from fluidopt.commands._scale import progress_enabled

    class Tty:
        def isatty(self):
            return True

    a = argparse.Namespace(no_progress=False, json=False)
    assert progress_enabled(a) == "log"  # pytest's stderr is no terminal
    monkeypatch.setattr(sys, "stderr", Tty())
    assert progress_enabled(a) is True
    assert progress_enabled(argparse.Namespace(no_progress=True, json=False)) is False
    assert progress_enabled(argparse.Namespace(no_progress=False, json=True)) is False


def test_run_sweep_logs_progress_lines_to_a_non_terminal(capsys, monkeypatch, tmp_path):
    from fluidopt.harness.executor import Progress

    monkeypatch.setattr(Progress, "LOG_EVERY", 0.02)
    code, out, err = cli(capsys, "run", "--gpus", "20", "--horizon", "200", "--warmup", "20", "--policies",
                         "gate-and-route", "--seeds", "2", "--workers", "1", "--out", "")
    assert code == 0, err
    lines = [ln for ln in err.splitlines() if ln.startswith("[simulations] ")]
    assert lines and all(" done, " in ln and " s elapsed" in ln for ln in lines)
    assert "\r" not in err


def test_simulate_logs_progress_lines_to_a_non_terminal(capsys, monkeypatch):
    import time
    import types

    import fluidopt.sim.bookkeeping as bk

    # a line at every look at the clock (every 16,384 events): no wait between lines, and a clock 100 s
    # ahead of the engine's own first report time (1 s after its start), however fast the machine
    monkeypatch.setattr(bk, "LOG_EVERY", 0.0)
    monkeypatch.setattr(bk, "time", types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + 100.0))
    code, out, err = cli(capsys, "simulate", "--policy", "fi-wsp", "--gpus", "100", "--horizon", "2000")
    assert code == 0, err
    lines = err.splitlines()
    assert lines and all(ln.startswith("[fluidopt simulate] ") and " s elapsed: t = " in ln for ln in lines)
    assert "/ 2000 s (" in lines[0] and "\r" not in err
    import fluidopt.sim.api as api

    real, asked = api.simulate, []
    monkeypatch.setattr(api, "simulate", lambda *a, **k: asked.append(k["progress"]) or real(*a, **k))
    for flag in ("--no-progress", "--json"):  # --json keeps stderr quiet unless --progress
        code, out, err = cli(capsys, "simulate", "--policy", "fi-wsp", "--gpus", "4", "--horizon", "20", flag)
        assert code == 0 and err == ""
    assert asked == [False, False]
