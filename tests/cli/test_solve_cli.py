"""``fluidopt solve``: JSON and table output, SLI flags, scenario files, error messages."""

from __future__ import annotations

import json
import textwrap

import pytest

from fluidopt.cli import main

SCENARIO_TOML = textwrap.dedent(
    """
    name = "one-class"
    [gpu]
    alpha = 0.0174
    beta = 6.2e-5
    gamma = 45.45
    chunk = 256
    batch = 16
    [cluster]
    gpus = 100
    [pricing]
    prefill = 0.1
    decode = 0.2
    [[classes]]
    name = "chat"
    prompt = 300
    decode = 1000
    rate = 50.0
    patience = 0.1
    """
)


def run(capsys, *argv):
    code = main(["solve", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output_paper_instance(capsys):
    code, out, err = run(capsys, "--json")
    assert code == 0 and err == ""
    d = json.loads(out)  # stdout is exactly one JSON object (no solver banner)
    assert d["objective_per_gpu"] == pytest.approx(297.7032, abs=1e-4)
    assert d["objective"] == pytest.approx(500 * d["objective_per_gpu"])
    assert d["mixed_gpus"] == 107
    assert d["prefill_occupancy"] == pytest.approx(0.21321, abs=1e-5)
    assert d["duals"]["solo_decode_capacity"] > 0
    assert [c["name"] for c in d["classes"]] == ["short-prompt", "long-prompt"]
    for c in d["classes"]:
        assert set(c) >= {"name", "x", "y_mixed", "y_solo", "q_prefill", "q_decode", "throughput", "served_fraction"}
        assert c["q_decode"] == 0.0
    assert d["classes"][0]["x"] == pytest.approx(0.01826, abs=1e-5)


def test_separate_pricing_json(capsys):
    code, out, _ = run(capsys, "default", "--pricing", "separate", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["pricing"] == "separate"
    assert d["objective_per_gpu"] == pytest.approx(298.59, abs=0.01)


def test_human_output_is_a_table(capsys):
    code, out, _ = run(capsys)
    assert code == 0
    assert "297.70317 per GPU per s" in out
    assert "mixed GPUs M = 107" in out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("lam"))
    for col in ("x", "y_mixed", "y_solo", "q_prefill", "q_decode", "throughput", "served"):
        assert col in header.split()
    assert "short-prompt" in out and "solo_decode_capacity" in out


def test_sli_flags(capsys):
    code, out, _ = run(capsys, "--sli", "tpot=0.0242", "--sli", "served:short-prompt=0.9:penalty=100", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["tpot"] == pytest.approx(0.0242, rel=1e-9)
    assert d["slis"] == ["tpot=0.0242", "served:short-prompt=0.9:penalty=100"]
    assert d["sli_shadow_prices"]["tpot"] > 0
    assert "violations" in d and d["violations"]["served_fraction[short-prompt]"] == 0.0
    code, out, _ = run(capsys, "--sli", "tpot=0.0242")
    assert "tpot=0.0242" in out and "shadow price" in out


def test_scenario_file(tmp_path, capsys):
    p = tmp_path / "one.toml"
    p.write_text(SCENARIO_TOML)
    code, out, _ = run(capsys, str(p), "--json")
    assert code == 0
    d = json.loads(out)
    assert d["scenario"] == "one-class" and d["gpus"] == 100
    # demand-bound single class (tests/test_lp.py): R* = w lambda = 230 * 0.5
    assert d["objective_per_gpu"] == pytest.approx(115.0, rel=1e-9)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sli", "tpot=abc"], "fluidopt solve: error: --sli 'tpot=abc': expected a number for the bound, got 'abc'"),
        (["--sli", "latency=1"], "--sli 'latency=1': unknown SLI 'latency'"),
        (["--sli", "served:nope=0.9"],
         "sli 'served:nope=0.9': unknown class 'nope'; the scenario's classes are short-prompt, long-prompt"),
        (["--sli", "wait:short-prompt=-1"], "sli.wait[short-prompt].seconds: expected a mean wait >= 0 s, got -1.0"),
        (["--sli", "tpot=0.03:penalty=-5"], "sli.tpot.penalty: expected a weight >= 0"),
        (["--sli", "tpot=0.0219"], "is infeasible; an irreducible set of conflicting rows: tpot (SLI tpot=0.0219)"),
        (["no/such/file.toml"], "scenario file 'no/such/file.toml': no such file"),
    ],
)
def test_errors_exit_2_with_one_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert message in err
    assert err.count("\n") == 1


def test_bad_pricing_is_an_argparse_error(capsys):
    assert main(["solve", "--pricing", "flat"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fluidopt solve: error: argument --pricing: invalid choice: 'flat'")


def test_help_documents_sli_syntax(capsys):
    with pytest.raises(SystemExit):
        main(["solve", "--help"])
    out = capsys.readouterr().out
    for s in ("tpot=SECONDS", "served:CLASS=FRACTION", "wait:CLASS=SECONDS", ":penalty=WEIGHT", "--json"):
        assert s in out
