"""``fluidopt simulate --timemodel FILE`` (issue 43): the law of a time-model TOML (as ``validate
--fit-overheads`` writes it) in the simulator, the same run as the law and cache written into the scenario,
tokens mode by default, bad files one line with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fluidopt.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "scenarios" / "paper-two-class.toml"
LAW = ROOT / "calibration" / "opt-13b-a100-vllm-overheads.toml"


def _run(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert main(["simulate", *argv, "--policy", "round-robin", "--horizon", "60", "--seed", "3", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_flag_is_the_law_and_cache_written_into_the_scenario(capsys, tmp_path):
    scenario = tmp_path / "s.toml"
    scenario.write_text(EXAMPLE.read_text().replace("gpus = 500", "gpus = 4"))
    by_flag = _run(capsys, str(scenario), "--timemodel", str(LAW))
    table = LAW.read_text().split("[engine]")[0].replace("[timemodel]", "[gpu.timemodel]")
    written = tmp_path / "w.toml"
    text = EXAMPLE.read_text().replace("gpus = 500", "gpus = 4").replace("[gpu]\n", "[gpu]\nkv_capacity = 56864\n")
    written.write_text(text + "\n" + table)
    in_file = _run(capsys, str(written))
    assert by_flag["service"] == in_file["service"] == "tokens"  # a law implies tokens
    assert by_flag["revenue_per_gpu"] == in_file["revenue_per_gpu"] and by_flag["completed"] == in_file["completed"]
    plain = _run(capsys, str(scenario), "--service", "tokens")
    assert plain["revenue_per_gpu"] != by_flag["revenue_per_gpu"]


@pytest.mark.parametrize("content, message", [
    ("[timemodel]\nprefill = [1, 2]\n", "prefill = [1, 2]: expected three coefficients"),
    ("[engine]\nkv_tokens = 5\n", "no [timemodel] table"),
    ("[timemodel]\nprefill = [0.02, 1e-4, 0]\ndecode_small = [0.02, 0, 0]\n[engine]\nkv_tokens = -3\n",
     "kv_tokens = -3"),
    (None, "no such file"),
])
def test_a_bad_time_model_file_is_one_line_and_exit_2(capsys, tmp_path, content, message):
    path = tmp_path / "law.toml"
    if content is not None:
        path.write_text(content)
    capsys.readouterr()
    assert main(["simulate", "--policy", "round-robin", "--horizon", "10", "--timemodel", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def _law_only() -> str:
    """The example scenario on 4 GPUs with a law in place of its straight line (the LP takes the law's line), its
    two classes at 0.25 request/s each and patient (so that a plan's served fraction can reach 0.99)."""
    lines = [ln for ln in EXAMPLE.read_text().splitlines() if ln.split("=")[0].strip() not in ("alpha", "beta", "gamma")]
    text = "\n".join(lines).replace("gpus = 500", "gpus = 4").replace("rate = 250.0", "rate = 0.25")
    text = text.replace("patience = 0.1", "patience = 0.0")
    return text + "\n" + LAW.read_text().split("[engine]")[0].replace("[timemodel]", "[gpu.timemodel]")


def test_run_and_plan_simulate_a_law_in_tokens_mode_by_default(capsys, tmp_path):
    # a law has no markov service: before, both commands failed on this scenario without --service tokens
    path = tmp_path / "law.toml"
    path.write_text(_law_only())
    capsys.readouterr()
    assert main(["run", str(path), "--json", "--horizon", "40", "--warmup", "5", "--seeds", "1", "--policies",
                 "gate-and-route", "--out", "", "--workers", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["policies"][0]["revenue"] > 0
    assert main(["plan", str(path), "--seeds", "1", "--no-progress", "--workers", "1"]) == 0
    assert main(["run", str(path), "--service", "markov", "--horizon", "40", "--warmup", "5", "--seeds", "1", "--out", "",
                 "--workers", "1"]) == 2
    assert "needs service='tokens'" in capsys.readouterr().err
