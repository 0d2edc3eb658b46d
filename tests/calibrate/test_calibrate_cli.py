"""``fluidopt calibrate`` and the CLI's error contract (exit 2, one line on stderr, no traceback)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import pytest
from builders import run_cli

from fluidopt.calibration import fit_iteration_time, synthetic_measurements, write_measurements
from fluidopt.cli import main
from fluidopt.scenario import default_scenario, gpu_from_dict, scenario_from_dict, scenario_to_dict

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "calibration" / "example-qwen-8b-a100.csv"


_cli = run_cli


def test_json_has_the_documented_keys_and_library_values(capsys):
    assert main(["calibrate", str(EXAMPLE), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    for k in ("alpha", "beta", "alpha_ci", "beta_ci", "r2", "n_points", "tau_solo"):
        assert k in d
    fit = fit_iteration_time(EXAMPLE)
    assert d["alpha"] == fit.alpha and d["beta"] == fit.beta and d["tau_solo"] == fit.tau_solo
    assert d["alpha_ci"] == list(fit.alpha_ci) and d["n_points"] == 45 and d["cov_type"] == "nonrobust"


def test_json_without_decode_only_rows_has_no_tau_solo(tmp_path, capsys):
    p = write_measurements(synthetic_measurements(0.0174, 6.2e-5, None, seed=1), tmp_path / "m.csv")
    assert main(["calibrate", str(p), "--json", "--robust"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert "tau_solo" not in d and "gamma" not in d and d["cov_type"] == "HC3"


@pytest.mark.integration
def test_plot_writes_a_png_and_human_table(tmp_path, capsys):
    png = tmp_path / "fit.png"
    assert main(["calibrate", str(EXAMPLE), "--plot", str(png), "--chunk", "256"]) == 0
    out = capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "alpha (s)" in out and "beta (s/token)" in out and "tau_solo (s)" in out
    assert "R^2 = 0.99" in out and "at C = 256: tau_mix" in out and f"plot written to {png}" in out


def test_toml_output_is_a_valid_gpu_table(capsys):
    assert main(["calibrate", str(EXAMPLE), "--toml", "--chunk", "256", "--batch", "16"]) == 0
    table = tomllib.loads(capsys.readouterr().out)["gpu"]
    gpu = gpu_from_dict(table)
    fit = fit_iteration_time(EXAMPLE)
    assert (gpu.alpha, gpu.beta, gpu.tau_solo, gpu.chunk, gpu.batch) == (fit.alpha, fit.beta, fit.tau_solo, 256, 16)
    d = scenario_to_dict(default_scenario())
    d["gpu"] = table
    assert scenario_from_dict(d).gpu == gpu


def test_list_profiles_table_and_json(capsys):
    assert main(["calibrate", "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("qwen-8b-a100", "qwen-4b-a100", "llama2-7b-v100"):
        assert name in out
    assert main(["calibrate", "--list", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["qwen-8b-a100"]["alpha"] == 0.0174 and d["llama2-7b-v100"]["r2"] is None
    assert "arXiv:2602.02987" in d["qwen-4b-a100"]["source"]


@pytest.mark.parametrize(
    ("argv", "pattern"),
    [
        (["calibrate"], "give a measurement CSV"),
        (["calibrate", "EXAMPLE", "--toml"], "--toml needs --chunk C and --batch B"),
        (["calibrate", "missing.csv"], "calibration file 'missing.csv': no such file"),
    ],
)
def test_usage_errors_exit_2(argv, pattern, capsys):
    argv = [str(EXAMPLE) if a == "EXAMPLE" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fluidopt calibrate: error: ") and pattern in err


# A real ``python -m fluidopt calibrate`` on purpose: the command's entry point (docs/testing.md, "Fifth round")
@pytest.mark.integration
def test_bad_csv_exits_2_with_one_line_and_no_traceback(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("chunk_tokens,iteration_seconds\n64,0.02\n128,fast\n256,0.03\n")
    r = _cli("calibrate", str(bad), "--json")
    assert r.returncode == 2
    # under --json the error is also one JSON object on stdout
    assert json.loads(r.stdout) == {"error": f"{bad}: line 3: iteration_seconds = 'fast': expected a number",
                                    "command": "calibrate", "status": 2}
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert lines[0] == f"fluidopt calibrate: error: {bad}: line 3: iteration_seconds = 'fast': expected a number"


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("[gpu]\nalpha = 0.0174\n", "scenario.cluster: missing required field"),
        ("name = 'x'\n[gpu\n", "not valid TOML"),
        (None, "no such file"),
        ('gpu = "h100-dream"\n[cluster]\ngpus = 1\n[[classes]]\nname="a"\nprompt=1\ndecode=1\nrate=1\n',
         "unknown GPU profile 'h100-dream'; known profiles: qwen-8b-a100"),
    ],
)
@pytest.mark.integration
def test_solve_bad_scenario_exits_2_with_one_line(tmp_path, text, pattern, cli_here):
    path = tmp_path / "bad.toml"
    if text is not None:
        path.write_text(text)
    # in this process, but for one case: a real ``python -m fluidopt solve`` keeps the entry point covered
    run = _cli if text is None else cli_here
    r = run("solve", str(path))
    if r.returncode == 2 and r.stderr.startswith("usage:"):  # scenario given by option, not position
        r = run("solve", "--scenario", str(path))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("fluidopt solve: error: ") and pattern in lines[0]
