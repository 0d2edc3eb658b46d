"""A seeded synthetic workload with shared prefixes: system prompts per class, multi-turn sessions, and
documents reused with a Zipf popularity law. Each request carries its prompt's chained block ids, as a
Mooncake trace does, so the prefix-cache model (:mod:`fluidopt.workloads.prefix`) and ``--trace`` read
it like the real thing (:func:`write_jsonl` writes the Mooncake format).

A class (:class:`SessionClass`) starts sessions as a Poisson process. A session's first prompt is the
class's system prompt (one of ``system_prompts`` variants, uniformly), then with probability
``doc_prob`` a document drawn from the class's pool by Zipf popularity (document d, 0-based, with
probability proportional to (d + 1)^-zipf), then the user's message. Each next turn arrives an
exponential think time after the previous one and its prompt is the previous prompt, the previous
answer and a new message: it extends the previous context. Turns per session are geometric with mean
``turns``. Lengths are exponential with the given means (at least 1 token) unless ``fixed``.

Blocks: the prompt is cut into ``block_size``-token blocks; a block's id is interned from its
predecessor's id and the content it covers (which segment, which offsets), so two prompts share block
j's id exactly when their first (j + 1) blocks are equal, the last partial block included.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fluidopt.core.errors import ScenarioError
from fluidopt.workloads.replay import TraceWorkload

__all__ = ["SessionClass", "session_workload", "write_jsonl"]


@dataclass(frozen=True)
class SessionClass:
    """One class of a shared-prefix workload (token counts are means; times in seconds).

    ``session_rate``: sessions started per second; ``turns``: mean requests per session (>= 1);
    ``think_time``: mean seconds between a session's turns; ``system_tokens`` and ``system_prompts``:
    the length and number of the class's system prompts; ``user_tokens``, ``output_tokens``: a message
    and an answer; ``doc_prob``, ``docs``, ``doc_tokens``, ``zipf``: the chance a session opens with a
    document, the pool size, a document's mean length and the popularity exponent.
    """

    name: str
    session_rate: float
    turns: float = 3.0
    think_time: float = 30.0
    system_tokens: int = 1000
    system_prompts: int = 1
    user_tokens: float = 200.0
    output_tokens: float = 300.0
    doc_prob: float = 0.0
    docs: int = 100
    doc_tokens: float = 4000.0
    zipf: float = 1.0

    def __post_init__(self) -> None:
        w = f"sessions[{self.name}]"
        for k, low, strict in (("session_rate", 0.0, True), ("turns", 1.0, False), ("think_time", 0.0, False),
                               ("system_tokens", 0.0, False), ("system_prompts", 1.0, False),
                               ("user_tokens", 1.0, False), ("output_tokens", 1.0, False), ("docs", 1.0, False),
                               ("doc_tokens", 1.0, False), ("zipf", 0.0, False), ("doc_prob", 0.0, False)):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < low \
                    or (strict and v <= low):
                raise ScenarioError(f"{w}.{k}: expected a number {'>' if strict else '>='} {low:g}, got {v!r}")
        for k in ("system_tokens", "system_prompts", "docs"):
            if getattr(self, k) != int(getattr(self, k)):
                raise ScenarioError(f"{w}.{k}: expected an integer, got {getattr(self, k)!r}")
        if self.doc_prob > 1:
            raise ScenarioError(f"{w}.doc_prob: expected a probability in [0, 1], got {self.doc_prob!r}")


def _blocks(segments: list[tuple[tuple, int]], B: int, ids: dict) -> np.ndarray:
    """Chained block ids of a prompt made of (segment key, tokens) pieces."""
    out, prev, spans, filled = [], -1, [], 0
    for key, n in segments:
        off = 0
        while off < n:
            take = min(B - filled, n - off)
            spans.append((key, off, off + take))
            off += take
            filled += take
            if filled == B:
                prev = ids.setdefault((prev, tuple(spans)), len(ids))
                out.append(prev)
                spans, filled = [], 0
    if spans:
        out.append(ids.setdefault((prev, tuple(spans)), len(ids)))
    return np.asarray(out, dtype=np.int64)


def session_workload(classes, duration: float, *, seed: int = 0, block_size: int = 512,
                     fixed: bool = False, name: str = "sessions") -> TraceWorkload:
    """Requests of sessions started in [0, ``duration``) s (later turns past it are dropped), as a replay
    workload with block hashes. ``fixed``: every length, turn count and think time at its mean (turns
    rounded), for hand-checked cases."""
    classes = tuple(classes)
    if not classes or not all(isinstance(c, SessionClass) for c in classes):
        raise ScenarioError("session_workload: classes: expected one or more SessionClass")
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not (math.isfinite(duration)
                                                                                   and duration > 0):
        raise ScenarioError(f"session_workload: duration: expected seconds > 0, got {duration!r}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ScenarioError(f"session_workload: block_size: expected an integer >= 1, got {block_size!r}")
    rng = np.random.default_rng(seed)
    ids: dict = {}
    rows: list[tuple[float, int, int, int, np.ndarray]] = []

    def length(mean: float) -> int:
        return max(1, round(mean)) if fixed else max(1, int(rng.exponential(mean)))

    for ci, c in enumerate(classes):
        doc_len = [length(c.doc_tokens) for _ in range(int(c.docs))]
        pop = (np.arange(1, int(c.docs) + 1, dtype=float)) ** -c.zipf
        pop /= pop.sum()
        t, s = 0.0, 0
        while True:
            t += (1.0 / c.session_rate) if fixed else rng.exponential(1.0 / c.session_rate)
            if t >= duration:
                break
            sys = int(rng.integers(int(c.system_prompts))) if not fixed else s % int(c.system_prompts)
            segs: list[tuple[tuple, int]] = [(("sys", ci, sys), int(c.system_tokens))] if c.system_tokens else []
            if (c.doc_prob >= 1.0) or (c.doc_prob > 0 and not fixed and rng.random() < c.doc_prob):
                d = int(rng.choice(int(c.docs), p=pop))
                segs.append((("doc", ci, d), doc_len[d]))
            turns = round(c.turns) if fixed else int(rng.geometric(1.0 / c.turns))
            at = t
            for k in range(turns):
                segs.append((("user", ci, s, k), length(c.user_tokens)))
                prompt = sum(n for _, n in segs)
                out = length(c.output_tokens)
                if at < duration:
                    rows.append((at, ci, prompt, out, _blocks(segs, block_size, ids)))
                segs.append((("answer", ci, s, k), out))
                at += c.think_time if fixed else rng.exponential(c.think_time)
            s += 1
    if not rows:
        raise ScenarioError(f"session_workload: no session starts within {duration:g} s; raise the duration or "
                            "the session rates")
    rows.sort(key=lambda r: r[0])
    frame = pd.DataFrame({"time": [r[0] for r in rows], "prompt": np.array([r[2] for r in rows], dtype=np.int64),
                          "output": np.array([r[3] for r in rows], dtype=np.int64),
                          "cls": np.array([r[1] for r in rows], dtype=np.int64)})
    return TraceWorkload(frame, [c.name for c in classes], name=name, hashes=[r[4] for r in rows],
                         block_size=block_size)


def write_jsonl(workload: TraceWorkload, path: str | os.PathLike) -> None:
    """Write a workload with hashes in the Mooncake JSON-lines format (``timestamp`` in whole ms), plus
    a ``class`` field, so ``--trace`` and ``--from-trace`` read it back (at 512-token blocks only:
    ``--trace`` reads the Mooncake block size)."""
    if workload.hashes is None:
        raise ScenarioError(f"write_jsonl: workload {workload.name!r} has no block hashes")
    with open(path, "w", encoding="utf-8") as f:
        for t, p, o, c, h in zip(workload.time, workload.prompt, workload.output, workload.cls, workload.hashes):
            f.write(json.dumps({"timestamp": int(round(float(t) * 1000)), "input_length": int(p),
                                "output_length": int(o), "hash_ids": h.tolist(),
                                "class": workload.class_names[int(c)]}) + "\n")
