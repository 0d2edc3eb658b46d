"""The newcomer's stumbles (issue 47): each fixed or explained in the command's own output.

In-process calls of :func:`fluidopt.cli.main` (faster than a subprocess); output read with capsys."""

from __future__ import annotations

import json

import pytest
from builders import ROOT

from fluidopt.cli import main

pytestmark = pytest.mark.integration

REGIME = str(ROOT / "examples" / "scenarios" / "rl-router-paper-regime.toml")


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
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


def test_rl_evaluate_marks_weights_trained_for_another_scenario(capsys):
    code, out, err = cli(capsys, "rl", "evaluate", REGIME, "--policies", "round-robin,baseline-rl,wg-rl",
                         "--episodes", "1", "--requests", "40")
    assert code == 0, err
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
    ("jsonl", "looks like JSON lines (one JSON object per line), not CSV"),
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
    assert "fields, expected" not in line


def test_the_library_readers_refuse_json_lines_too(tmp_path):
    import io

    from fluidopt.errors import TraceError
    from fluidopt.sim.trace import read_azure_trace, read_trace_csv

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
