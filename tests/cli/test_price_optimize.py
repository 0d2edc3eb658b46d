"""``fluidopt price --optimize`` and ``--fit-demand``: the report, JSON, and bad input (exit 2, one line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_fuzz import assert_clean, run_cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples/scenarios/paper-two-class-demand.toml"
OBS = ROOT / "examples/demand-observations.csv"


def test_optimize_reports_prices_today_and_the_grid(capsys):
    code, out, err = run_cli(["price", str(EXAMPLE), "--optimize"], capsys)
    assert code == 0, err
    assert "status: optimal" in out and "short-prompt 245.658" in out and "long-prompt 349.239" in out
    assert "today's prices" in out and "interior" in out


def test_optimize_json(capsys):
    # an 11 x 11 grid (the report's test keeps the default 21 x 21): nothing here reads the grid's best point
    code, out, err = run_cli(["price", str(EXAMPLE), "--optimize", "--json", "--gpus", "400",
                              "--prefill", "0:0.5:11", "--decode", "0:0.5:11"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["status"] == "optimal" and d["gpus"] == 400 and len(d["classes"]) == 2
    assert d["revenue_per_s"] > d["today"]["revenue_per_s"]


def test_fit_demand_prints_tables_that_load(capsys, tmp_path):
    from fluidopt.scenario import loads_scenario

    code, out, err = run_cli(["price", "--fit-demand", str(OBS)], capsys)
    assert code == 0, err
    assert out.count("[classes.demand]") == 3 and 'model = "linear"' in out
    # the printed tables paste into a scenario file
    tables = out.split("to paste (the class's rate anchors the curve at its price):")[1].strip().split("\n\n")
    text = EXAMPLE.read_text().split("[classes.demand]")
    pasted = text[0] + tables[0] + "\n" + text[1].split("\n\n", 1)[1] + tables[1] + "\n"
    sc = loads_scenario(pasted)
    assert [c.demand.model for c in sc.classes] == ["linear", "linear"]
    assert sc.classes[0].demand.slope == pytest.approx(2.0, rel=0.03)


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("make, message", [
    (lambda t: ["price", write(t, "s.toml", EXAMPLE.read_text().replace("slope = 2.0", "slope = -2.0")), "--optimize"],
     "classes[0].demand.slope: expected a number > 0, got -2.0"),
    (lambda t: ["price", write(t, "s.toml", EXAMPLE.read_text().replace(
        'model = "linear"   # max_rate = 250 + 1 * 380 = 630\nslope = 1.0',
        'model = "logit"\nmarket = "solo"\nmarket_size = 250.0\nprice_sensitivity = 0.01\noutside_option = false')),
        "--optimize"],
     "logit market 'solo' has one class and no outside option"),
    (lambda t: ["price", write(t, "s.toml", EXAMPLE.read_text().replace("slope = 1.0", "elasticity = 0")),
                "--optimize"], "unknown key 'elasticity' for model = 'linear'"),
    (lambda t: ["price", "--fit-demand", write(t, "o.csv", "class,price\na,1\na,2\na,3\n")],
     "missing column 'rate'"),
    (lambda t: ["price", "--fit-demand", write(t, "o.csv", "class,price,rate\na,1,3\na,x,2\na,3,1\n")],
     "row 3, column 'price': expected a number >= 0"),
    (lambda t: ["price", "--fit-demand", str(t / "none.csv")], "no such file"),
    (lambda t: ["price", "--optimize"], "no class has a demand model"),
    (lambda t: ["price", str(EXAMPLE), "--fleet"], "--fleet: only used with --optimize"),
    (lambda t: ["price", str(EXAMPLE), "--gpus", "3"], "--gpus: only used with --optimize"),
    (lambda t: ["price", str(EXAMPLE), "--optimize", "--gpus", "0"], "--gpus: expected an integer >= 1, got 0"),
    (lambda t: ["price", str(EXAMPLE), "--optimize", "--simulate", "0.1,0.2"], "with --optimize, expected 'optimal'"),
    (lambda t: ["price", str(EXAMPLE), "--optimize", "--simulate", "optimal", "--policy", "gate-and-route,nope"],
     "unknown policy 'nope'"),
    (lambda t: ["price", str(EXAMPLE), "--optimize", "--fleet", "--gpu-price", "-1"], "--gpu-price: expected"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, make, message):
    argv = make(tmp_path)
    code, out, err = run_cli(argv, capsys)
    assert_clean(argv, code, err)
    assert code == 2 and message in err, err


def test_unbounded_revenue_is_a_status_not_a_number(tmp_path, capsys):
    text = EXAMPLE.read_text().replace('model = "linear"   # max_rate = 250 + 1 * 380 = 630\nslope = 1.0',
                                       'model = "constant-elasticity"\nelasticity = 0.8')
    code, out, err = run_cli(["price", write(tmp_path, "s.toml", text), "--optimize", "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["status"] == "unbounded" and d["revenue_per_s"] is None and "revenue unbounded" in d["message"]


@pytest.mark.integration
def test_optimal_prices_simulated_from_the_command_line(capsys, tmp_path):
    argv = ["price", str(EXAMPLE), "--optimize", "--gpus", "50", "--simulate", "optimal", "--policy",
            "gate-and-route,backpressure-gate-and-route", "--seeds", "1", "--horizon", "120", "--warmup", "30",
            "--no-progress", "--json", "--out", str(tmp_path / "o"), "--pareto", "", "--points", "5"]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    d = json.loads(out)
    assert [r["policy"] for r in d["simulated"]] == ["gate-and-route", "backpressure-gate-and-route"]
    for r in d["simulated"]:
        assert r["program_revenue_per_gpu"] == pytest.approx(d["revenue_per_s"] / 50)
        assert 0.5 < r["ratio_to_program"] < 1.1
    assert (tmp_path / "o" / "simulated.csv").is_file() and (tmp_path / "o" / "price_response.png").is_file()


def test_fit_demand_recovers_a_logit_market(capsys):
    # examples/demand-observations-logit.csv: 12 periods drawn (seed 7) from a market of 1000 requests/s with
    # utilities 1.0 and 0.5, price sensitivity 0.01 and 2% multiplicative noise
    code, out, err = run_cli(["price", "--fit-demand", str(ROOT / "examples/demand-observations-logit.csv"),
                              "--market-size", "1000", "--json"], capsys)
    assert code == 0, err
    fits = [f for f in json.loads(out)["fits"] if f["model"] == "logit"]
    assert all(f["best"] for f in fits)
    for f, u in zip(fits, (1.0, 0.5)):
        assert f["ci_low"] <= 0.01 <= f["ci_high"] and f["ci2_low"] <= u <= f["ci2_high"]


@pytest.mark.parametrize("argv, message", [
    (["price", "--fit-demand", str(OBS), "--market-size", "1000"], "needs a 'period' column"),
    (["price", "--fit-demand", str(ROOT / "examples/demand-observations-logit.csv"), "--market-size", "100"],
     "expected more than the rates of every period add up to"),
    (["price", str(EXAMPLE), "--market-size", "100"], "--market-size: only used with --fit-demand"),
])
def test_bad_logit_fits(capsys, argv, message):
    code, out, err = run_cli(argv, capsys)
    assert_clean(argv, code, err)
    assert code == 2 and message in err, err


def test_an_observation_without_a_class_name_is_one_line(tmp_path, cli_here):
    # found by the fuzzer (a pandas KeyError reported as an internal error before)
    f = tmp_path / "o.csv"
    f.write_text("class,price,rate\n,1,3\n")
    r = cli_here("price", "--fit-demand", str(f))
    assert r.returncode == 2 and "row 2, column 'class': expected a class name, got an empty cell" in r.stderr
