"""Issue 44's bad input, on every command that takes a disaggregated layout (validate, plan, solve): a
layout without a decode pool, a link bandwidth <= 0, a TP degree missing from the profile and a model
shape that does not fit the GPU each exit 2 with one line naming the flag and the value, and print
nothing else. A synthetic profile (no shared data needed)."""

from __future__ import annotations

import json

import pytest

from fluidopt.cli import main

ENTRY = {"prefill": [10.0, 1.0, 0.0], "decoding_smallbs": [5.0, 0.0, 1.0]}  # ms
ROWS = [dict(prompt_len=10, output_len=3, issue_time=7.0, ttft_ms=20.0, tpot_ms=12.0, latency_ms=44.0)]

# (command, extra arguments, what the one line says); {p} is the profile, {e} the measured run
CASES = [
    # a layout without a decode pool
    ("validate", ["--decode-instances", "0"], "needs a decode pool"),
    ("plan", ["--gpus", "1", "--tp", "1"], "--gpus 1: no split fits; a disaggregated split needs a decode pool"),
    ("plan", ["--gpus", "3", "--tp", "2"], "--gpus 3: no split fits"),
    ("solve", ["--decode-tp", "0"], "--decode-tp 0: a disaggregated layout needs a decode pool"),
    # a link bandwidth <= 0
    ("validate", ["--link-gbps", "0"], "--link-gbps: expected a bandwidth in GB/s > 0, got 0"),
    ("validate", ["--link-gbps", "-1"], "--link-gbps: expected a bandwidth in GB/s > 0, got -1"),
    ("plan", ["--gpus", "4", "--link-gbps", "0"], "--link-gbps: expected a bandwidth in GB/s > 0, got 0"),
    # a TP degree missing from the profile
    ("validate", ["--prefill-tp", "4"], "has no TP degree 4"),
    ("plan", ["--gpus", "4", "--tp", "4"], "--tp 4: the profile has TP degrees 1, 2"),
    ("solve", ["--prefill-tp", "4"], "has no TP degree 4"),
    # a model shape that does not fit the GPU: OPT-66B's 131 GB of fp16 weights on one 80 GB GPU
    ("validate", ["--model", "facebook/opt-66b", "--prefill-tp", "1"], "needs 131.4 GB of weights per GPU"),
    ("plan", ["--model", "facebook/opt-66b", "--gpus", "4", "--tp", "1"], "needs 131.4 GB of weights per GPU"),
    ("solve", ["--model", "facebook/opt-66b", "--prefill-tp", "1", "--decode-tp", "2"],
     "--prefill-tp: facebook/opt-66b at TP 1 needs 131.4 GB of weights per GPU"),
]


@pytest.mark.parametrize("command, extra, fragment", CASES, ids=[f"{c}-{i}" for i, (c, *_) in enumerate(CASES)])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, monkeypatch, command, extra, fragment):
    monkeypatch.chdir(tmp_path)
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({m: {"1": ENTRY, "2": ENTRY} for m in ("facebook/opt-13b", "facebook/opt-66b")}))
    exp = tmp_path / "r.exp"
    exp.write_text(repr(ROWS) + "\n")
    args = {"--model": "facebook/opt-13b"}
    if command == "validate":
        args.update({"--prefill-tp": "2", "--decode-tp": "1"})
        head = ["validate", str(exp), "--no-figure"]
    elif command == "plan":
        args.update({"--lengths": str(exp)})
        head = ["plan"]
    else:
        args.update({"--prefill-tp": "2", "--decode-tp": "1"})
        head = ["solve"]
    args.update(dict(zip(extra[::2], extra[1::2])))
    argv = [*head, "--layout", "disaggregated", "--profile", str(prof), *sum(map(list, args.items()), [])]
    before = sorted(tmp_path.iterdir())
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in err, err
    assert out == "" and sorted(tmp_path.iterdir()) == before
