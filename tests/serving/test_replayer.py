"""The trace replayer: prompts from block hashes, per-request records against a stand-in engine,
failures recorded (never raised), CSV and JSON written, bad input exit 2."""

from __future__ import annotations

import asyncio
import json

import pandas as pd
import pytest

from fluidopt.cli import main
from fluidopt.serving.replayer import prompt_text, read_trace, replay_async, summarize

TRACE = [
    {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]},
    {"timestamp": 100, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]},
    {"timestamp": 200, "input_length": 20, "output_length": 4, "hash_ids": [7]},
    {"timestamp": 250, "input_length": 10, "output_length": 1, "hash_ids": []},
]


@pytest.fixture
def trace(tmp_path):
    p = tmp_path / "mini.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in TRACE))
    return p


def test_prompts_share_text_exactly_where_blocks_are_shared(trace):
    df = read_trace(trace)
    texts = [prompt_text(i, int(r.prompt), r.hashes, 512) for i, r in enumerate(df.itertuples())]
    assert [len(t.split()) for t in texts] == [1100, 600, 20, 10]
    # requests 0 and 1 share blocks 1 and 2: request 1's first 600 words are request 0's
    assert texts[0].split()[:600] == texts[1].split()
    assert texts[2].split()[0] == "h3.0"  # hash 7 is the fourth id seen (ids are interned 0, 1, 2, ...)
    assert set(texts[3].split()).isdisjoint(texts[0].split())
    assert prompt_text(5, 3) == "r5.0 r5.1 r5.2"


def test_replay_against_a_stand_in(engine_factory, trace, tmp_path):
    url = engine_factory("--speed", "5")
    recs, wall = asyncio.run(replay_async(read_trace(trace), url, speed=5, progress=False))
    assert [r.status for r in recs] == [200] * 4
    assert [r.received_tokens for r in recs] == [5, 3, 4, 1]
    assert all(r.ok for r in recs)
    # request 0: 1,100 prompt tokens in chunks of 256 = 5 iterations of alpha + beta * chunk on the model's clock
    assert recs[0].ttft_s > 0.0174 * 5 + 6.2e-5 * 1100
    assert recs[3].tpot_s == 0.0
    s = summarize(recs, wall, 5)
    assert s["completed"] == 4 and s["failed"] == 0 and s["total_output_tokens"] == 13
    assert s["ttft_mean_s"] <= s["e2e_mean_s"]


def test_a_dead_endpoint_is_recorded_not_raised(trace, tmp_path, capsys):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    out = tmp_path / "out"
    assert main(["replay", str(trace), "--url", f"http://127.0.0.1:{port}", "--json", "--out", str(out),
                 "--timeout", "5"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["requests"] == 4 and got["failed"] == 4 and got["ttft_mean_s"] is None
    df = pd.read_csv(out / "requests.csv")
    assert len(df) == 4 and (df["status"] == 0).all() and df["error"].str.contains("ConnectError").all()
    assert json.loads((out / "summary.json").read_text())["failed"] == 4


@pytest.mark.parametrize("argv,msg", [
    (["replay", "/nonexistent.jsonl", "--url", "http://127.0.0.1:1"], "no such file"),
    (["replay", "x.csv", "--url", "127.0.0.1:1"], "expected http://HOST:PORT"),
    (["replay", "x.csv", "--url", "http://127.0.0.1:1", "--speed", "-2"], "--speed -2.0: expected a positive"),
    (["replay", "x.csv", "--url", "http://127.0.0.1:1", "--requests", "0"], "--requests 0: expected a positive"),
])
def test_bad_input_exits_2(argv, msg, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and len(err.strip().splitlines()) == 1
