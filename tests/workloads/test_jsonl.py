"""JSON-lines traces with block hashes (issue 42, step 1): the Mooncake file as shipped, other formats
with stated fields, and every bad input as one line naming the file, the line and the field."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from fluidopt.core.errors import TraceError
from fluidopt.core.model import RequestClass, Scenario, paper_gpu
from fluidopt.workloads import TraceWarning
from fluidopt.workloads.jsonl import JsonlFormat, read_jsonl_trace
from fluidopt.workloads.traces import replay

# the shared data sit beside the repository (../shared/data), as for the Azure trace tests;
# FLUIDOPT_SHARED_DATA points elsewhere (a git worktree one level deeper)
_DATA = Path(os.environ.get("FLUIDOPT_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared/data"))
MOONCAKE = _DATA / "mooncake-traces/conversation_trace.jsonl"
needs_mooncake = pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"shared Mooncake trace not found at {MOONCAKE}")


def _write(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _row(t=0, i=600, o=10, h=(0, 1)):
    return {"timestamp": t, "input_length": i, "output_length": o, "hash_ids": list(h)}


@needs_mooncake
def test_the_mooncake_file_as_shipped():
    raw = [json.loads(line) for line in MOONCAKE.read_text().splitlines()]
    df = read_jsonl_trace(MOONCAKE)
    assert len(df) == len(raw) == 12031
    assert df["prompt"].sum() == sum(r["input_length"] for r in raw)
    assert df["prompt"].mean() == pytest.approx(12035.06, abs=0.01)  # the README's 12,035
    assert df["output"].sum() == sum(max(r["output_length"], 1) for r in raw)
    assert df["time"].iloc[-1] == pytest.approx(raw[-1]["timestamp"] / 1000.0)
    assert df.attrs["block_size"] == 512
    # ids are interned in order of first appearance; block sharing is kept exactly
    first = {}
    for r, h in zip(raw, df["hashes"]):
        assert len(h) == len(r["hash_ids"])
        for a, b in zip(r["hash_ids"], h):
            assert first.setdefault(a, int(b)) == int(b)
    assert len(first) == len(set(first.values()))
    assert all(int(h[0]) == 0 for h in df["hashes"])  # every request shares its first block


def test_other_fields_units_block_size_and_string_ids(tmp_path):
    fmt = JsonlFormat(time="t", prompt="in", output="out", hashes="blocks", cls="kind", time_unit=1.0, block_size=16)
    path = _write(tmp_path / "x.jsonl", [{"t": 2.5, "in": 33, "out": 4, "blocks": ["a", "b", "c"], "kind": "chat"},
                                         "",
                                         {"t": 1.0, "in": 16, "out": 0, "blocks": ["a"], "kind": "doc"}])
    with pytest.warns(TraceWarning, match=r"x\.jsonl: line 3: t is earlier than the previous line's"):
        df = read_jsonl_trace(path, fmt)
    assert df["time"].tolist() == [0.0, 1.5]
    assert df["row"].tolist() == [3, 1]  # lines in the file, the blank one counted
    assert df["output"].tolist() == [1, 4]  # 0 output tokens raised to 1
    assert df["class"].tolist() == ["doc", "chat"]
    assert [h.tolist() for h in df["hashes"]] == [[0], [0, 1, 2]]
    # a format without hashes
    df = read_jsonl_trace(_write(tmp_path / "y.jsonl", [{"t": 0, "in": 5, "out": 5}]),
                          JsonlFormat(time="t", prompt="in", output="out", hashes=None))
    assert df["hashes"].iloc[0].size == 0


@pytest.mark.parametrize("rows, fmt, message", [
    ([_row(), {"timestamp": 1, "input_length": 5, "hash_ids": []}], None,
     r"^bad\.jsonl: line 2: missing field 'output_length' \(the line has 'timestamp', 'input_length', 'hash_ids'\)"),
    ([_row(i=-3)], None, r"^bad\.jsonl: line 1: input_length = -3: expected a non-negative integer"),
    ([_row(o=2.5)], None, r"^bad\.jsonl: line 1: output_length = 2\.5: expected a non-negative integer"),
    ([_row(i="600")], None, r'^bad\.jsonl: line 1: input_length = "600": expected a non-negative integer'),
    ([_row(), _row(i=513, h=(0, 1, 2))], None,
     r"^bad\.jsonl: line 2: hash_ids has 3 ids: expected at most ceil\(input_length / block size\) = "
     r"ceil\(513 / 512\) = 2$"),
    ([_row()], JsonlFormat(block_size=0), r"^bad\.jsonl: block size = 0: expected an integer >= 1"),
    ([_row()], JsonlFormat(block_size=-512), r"^bad\.jsonl: block size = -512: expected an integer >= 1"),
    ([], None, r"^bad\.jsonl: empty file: expected one JSON object per line with fields 'timestamp'"),
    (["", "  "], None, r"^bad\.jsonl: empty file"),
    ([_row(t=-1)], None, r"^bad\.jsonl: line 1: timestamp = -1: expected a time >= 0"),
    ([_row(), "{not json"], None, r"^bad\.jsonl: line 2: not valid JSON"),
    ([_row(), "[1, 2]"], None, r"^bad\.jsonl: line 2: a JSON list, expected one JSON object per line"),
    ([_row(h=(0, None))], None, r"^bad\.jsonl: line 1: hash_ids = \[0, null\]: expected a list of block ids"),
])
def test_bad_input_is_one_line_naming_file_line_and_field(tmp_path, rows, fmt, message):
    path = _write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(TraceError, match=message) as e:
        read_jsonl_trace(path, fmt) if fmt is not None else read_jsonl_trace(path)
    assert "\n" not in str(e.value)


def test_replay_keeps_the_hashes_in_time_order(tmp_path):
    path = _write(tmp_path / "r.jsonl", [_row(t=3000, i=1024, h=(7, 8)), _row(t=1000, i=100, h=(7,)), _row(t=2000)])
    sc = Scenario(gpu=paper_gpu(), gpus=2, classes=(RequestClass("all", prompt=500, decode=10, rate=1.0),))
    with pytest.warns(TraceWarning):
        sc2, w = replay(path, sc, speedup=2.0)
    assert sc2 is sc and w.block_size == 512
    assert w.time.tolist() == [0.0, 0.5, 1.0]  # ms -> s, relative to the first, halved
    assert [h.tolist() for h in w.hashes] == [[0], [2, 3], [0, 1]]  # ids in order of first appearance in the file
    assert w.prompt.tolist() == [100, 600, 1024]


@pytest.mark.integration
def test_cli_bad_trace_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys):
    from fluidopt.cli import main

    path = _write(tmp_path / "bad.jsonl", [_row(), _row(i=-1)])
    records = tmp_path / "records.csv"
    code = main(["simulate", "--trace", str(path), "--service", "tokens", "--policy", "round-robin",
                 "--records", str(records)])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.strip().splitlines() == ["fluidopt simulate: error: bad.jsonl: line 2: input_length = -1: expected a "
                                        "non-negative integer at most 100,000,000"]
    assert not records.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


@needs_mooncake
@pytest.mark.integration
def test_cli_replays_the_mooncake_file_cache_blind(capsys):
    from fluidopt.cli import main

    code = main(["simulate", "--trace", str(MOONCAKE), "--policy", "round-robin", "--gpus", "8", "--service", "tokens",
                 "--horizon", "300", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    res = json.loads(out)
    assert res["n_gpus"] == 8 and res["completed"] > 0 and math.isfinite(res["ttft_mean"])
    # every arrival of the first 300 s of the file was offered
    raw = [json.loads(line)["timestamp"] for line in MOONCAKE.read_text().splitlines()]
    assert res["requests"] == sum(t < 300_000 for t in raw)


def test_a_stated_format_from_its_spec():
    from fluidopt.workloads.jsonl import parse_format

    assert parse_format("time=ts,unit=1,prompt=in,output=out,hashes=blocks,class=kind,block=16") == JsonlFormat(
        time="ts", time_unit=1.0, prompt="in", output="out", hashes="blocks", cls="kind", block_size=16)
    assert parse_format("hashes=none").hashes is None
    assert parse_format("") == JsonlFormat()
    for spec, message in (("block=0", r"^--trace-format: block size = 0: expected an integer >= 1"),
                          ("block=1.5", r"^--trace-format: block = '1\.5': expected an integer"),
                          ("unit=-1", r"^--trace-format: time unit = -1\.0: expected seconds > 0"),
                          ("size=3", r"^--trace-format: 'size=3': expected KEY=VALUE with KEY one of time, prompt"),
                          ("time=a,time=b", r"^--trace-format: time: given twice")):
        with pytest.raises(TraceError, match=message):
            parse_format(spec)


@pytest.mark.integration
def test_cli_replays_a_stated_format(tmp_path, capsys):
    from fluidopt.cli import main

    path = _write(tmp_path / "own.jsonl", [{"ts": 0.5 * k, "in": 40, "out": 5, "blocks": [0, 1, 2]} for k in range(20)])
    argv = ["simulate", "--trace", str(path), "--service", "tokens", "--policy", "round-robin", "--horizon", "20",
            "--json"]
    assert main(argv) == 2  # read as Mooncake: no 'timestamp'
    assert "own.jsonl: line 1: missing field 'timestamp'" in capsys.readouterr().err
    assert main(argv + ["--trace-format", "time=ts,unit=1,prompt=in,output=out,hashes=blocks,block=16"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == 20
    assert main(argv + ["--trace-format", "time=ts,unit=1,prompt=in,output=out,hashes=blocks,block=32"]) == 2
    err = capsys.readouterr().err
    assert err.strip().endswith("own.jsonl: line 1: blocks has 3 ids: expected at most ceil(in / block size) = "
                                "ceil(40 / 32) = 2")
