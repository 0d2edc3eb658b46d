"""``fluidopt plan SCENARIO --from-trace TRACE`` without --fluid-only (issue 42): the fleet for a trace with block
hashes planned with and without the prefix cache, each verified by replaying the trace; its refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fluidopt.cli import main

SCENARIO = """name = "sessions"
[gpu]
alpha = 0.0174
beta = 6.2e-5
gamma = 45.45
chunk = 256
batch = 16
[cluster]
gpus = 4
[pricing]
prefill = 0.1
decode = 0.2
[[classes]]
name = "chat"
prompt = 5000
decode = 20
rate = 4.0
patience = 0.0
"""


def _trace(path, n: int = 400, seed: int = 3) -> None:
    """Mooncake-format JSON lines, 5 requests a second: multi-turn sessions (half the requests open one with
    six blocks of their own) whose next prompt extends the last by two 512-token blocks; long prompts and
    short answers, so that prefill binds the fluid fleet."""
    rng = np.random.default_rng(seed)
    sessions, nxt, lines = [], 0, []
    for i in range(n):
        if not sessions or rng.random() < 0.5:
            sessions.append(list(range(nxt, nxt + 6)))
            nxt += 6
        s = sessions[rng.integers(len(sessions))]
        s += [nxt, nxt + 1]
        nxt += 2
        lines.append(json.dumps({"timestamp": 200 * i, "input_length": 512 * len(s), "output_length": 20,
                                 "hash_ids": list(s)}))
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def files(tmp_path):
    sc, tr = tmp_path / "s.toml", tmp_path / "t.jsonl"
    sc.write_text(SCENARIO)
    _trace(tr)
    return str(sc), str(tr)


def test_the_cache_plan_is_smaller_and_each_plan_is_verified_by_replaying_the_trace(files, capsys):
    sc, tr = files
    # the requests of the trace's last second or so cannot be complete by its last arrival (80 s in all)
    assert main(["plan", sc, "--from-trace", tr, "--cache-rule", "consistent-hash", "--served", "0.97", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    blind, cached = out["plans"]
    assert not blind["cache"] and cached["cache"] and blind["hit_ratio"] == 0.0 and cached["hit_ratio"] > 0.3
    # prefill binds, and a request prefills (1 - h) of its prompt: the fluid fleet shrinks in proportion
    assert cached["n_fluid"] == pytest.approx(blind["n_fluid"] * (1 - cached["hit_ratio"]), rel=1e-6)
    assert cached["n_sim"] < blind["n_sim"]
    assert blind["policy"] == "least-requests-chunked" and cached["policy"] == "consistent-hash-chunked"
    for p in (blind, cached):
        by_n = {r["gpus"]: r for r in p["replays"]}
        assert by_n[p["n_sim"]]["met"] and by_n[p["n_sim"]]["served"] >= 0.97
        assert not by_n[p["n_sim"] - 1]["met"]  # one GPU fewer misses: the plan is the smallest
        assert min(by_n) == max(1, min(p["n_fluid_int"], p["n_sim"]) - 1)
    assert all(r["hit_ratio"] == 0.0 for r in blind["replays"])  # the plan without a cache replays without one


@pytest.mark.parametrize("extra, needle", [
    (["--growth", "2"], "--growth: not with --from-trace"),
    (["--hit-ratio", "0.3"], "--hit-ratio, --from-trace: expected one of them"),
    (["--out", "x"], "--out: not with --from-trace"),
    (["--policy", "no-such-router"], "--policy: unknown policy"),
])
def test_bad_input_is_one_line_and_exit_2(files, capsys, extra, needle):
    sc, tr = files
    assert main(["plan", sc, "--from-trace", tr, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_a_trace_without_block_hashes_is_refused(tmp_path, files, capsys):
    sc, _ = files
    tr = tmp_path / "plain.jsonl"
    tr.write_text("\n".join(json.dumps({"timestamp": 100 * i, "input_length": 600, "output_length": 9})
                            for i in range(5)) + "\n")
    assert main(["plan", sc, "--from-trace", str(tr)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "plain.jsonl" in err
