"""The shared-prefix session generator (issue 42, step 1): hand-counted hits, Zipf popularity, seeds,
and the round trip through the Mooncake JSON-lines format."""

from __future__ import annotations

import numpy as np
import pytest

from fluidopt.core.errors import ScenarioError
from fluidopt.workloads.jsonl import read_jsonl_trace
from fluidopt.workloads.prefix import hit_ratio
from fluidopt.workloads.sessions import SessionClass, session_workload, write_jsonl


def test_fixed_sessions_hit_what_a_hand_count_says():
    # 1000-token system prompt, 3 turns of 50-token messages and 30-token answers, 100-token blocks.
    # Prompts 1050, 1130, 1210. Turn 1 of a later session hits the 10 system blocks (1000); turn 2 hits
    # the 10 full blocks of turn 1 (block 10 was partial, 50 tokens); turn 3 hits 11 blocks (1100).
    c = SessionClass("chat", session_rate=0.1, turns=3, think_time=1.0, system_tokens=1000, user_tokens=50,
                     output_tokens=30)
    w = session_workload([c], 100.0, fixed=True, block_size=100)
    S = 9  # sessions at 10, 20, ..., 90 s
    assert w.n_requests == 3 * S
    assert sorted(set(w.prompt.tolist())) == [1050, 1130, 1210]
    r = hit_ratio(w, "round-robin", 1)
    assert r.cached_tokens == (S - 1) * 1000 + S * (1000 + 1100)
    assert r.prompt_tokens == S * (1050 + 1130 + 1210)
    # every session's first 10 blocks are the system prompt's; its 11th is its own
    assert w.hashes[0][:10].tolist() == w.hashes[3][:10].tolist()
    assert w.hashes[0][10] != w.hashes[3][10]


def test_documents_follow_the_zipf_law():
    c = SessionClass("rag", session_rate=50.0, turns=1, system_tokens=0, doc_prob=1.0, docs=20, doc_tokens=512,
                     zipf=1.2, user_tokens=10)
    w = session_workload([c], 200.0, seed=3, block_size=512, fixed=True)  # 512-token documents: one block each
    first = np.array([int(h[0]) for h in w.hashes])
    # the first block of a document prompt identifies the document; rank the ids by frequency
    _, counts = np.unique(first, return_counts=True)
    share = np.sort(counts)[::-1] / counts.sum()
    law = np.arange(1, 21, dtype=float) ** -1.2
    law /= law.sum()
    assert w.n_requests > 9000
    assert share[0] == pytest.approx(law[0], abs=0.015)
    assert share[:5].sum() == pytest.approx(law[:5].sum(), abs=0.02)


def test_seeded_and_round_trips_through_json_lines(tmp_path):
    cs = [SessionClass("chat", session_rate=2.0, system_prompts=3), SessionClass("rag", session_rate=0.5, doc_prob=0.5)]
    a = session_workload(cs, 60.0, seed=7)
    b = session_workload(cs, 60.0, seed=7)
    assert a.frame.equals(b.frame) and all(np.array_equal(x, y) for x, y in zip(a.hashes, b.hashes))
    assert not session_workload(cs, 60.0, seed=8).frame.equals(a.frame)
    write_jsonl(a, tmp_path / "s.jsonl")
    df = read_jsonl_trace(tmp_path / "s.jsonl")
    assert df["prompt"].tolist() == a.prompt.tolist()
    # the reader interns ids in file order: the same blocks under other names, one to one
    pairs = {(int(x), int(y)) for hx, hy in zip(df["hashes"], a.hashes) for x, y in zip(hx, hy)}
    assert len({x for x, _ in pairs}) == len({y for _, y in pairs}) == len(pairs)
    assert hit_ratio(df, "round-robin", 2).cached_tokens == hit_ratio(a, "round-robin", 2).cached_tokens


def test_bad_parameters_are_one_line():
    with pytest.raises(ScenarioError, match=r"^sessions\[x\]\.turns: expected a number >= 1, got 0"):
        SessionClass("x", session_rate=1.0, turns=0)
    with pytest.raises(ScenarioError, match=r"^sessions\[x\]\.doc_prob: expected a probability in \[0, 1\]"):
        SessionClass("x", session_rate=1.0, doc_prob=2)
    with pytest.raises(ScenarioError, match=r"^session_workload: block_size: expected an integer >= 1, got 0"):
        session_workload([SessionClass("x", session_rate=1.0)], 10.0, block_size=0)
