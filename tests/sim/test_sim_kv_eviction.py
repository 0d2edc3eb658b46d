"""KV-cache eviction picks the youngest running request (docs/simulator.md 1.1, step 3), by hand.

Rule: at a boundary, while KV_k + (running decodes) > K, evict the running request with the latest
*arrival* (ties: the larger record id), decode or prefill alike; it keeps its generated tokens, frees
its KV and waits for a re-prefill of prompt + generated tokens; nothing is admitted because of it.

Every trace below runs one GPU (alpha 0.01, beta 0.001, C = 10: tau_mix = 0.02 s; tau_solo = 0.005 s;
B = 4) in tokens mode, and every expected time is derived by hand, boundary by boundary, in the test's
docstring. The traces are built so that evicting another request (the oldest, the one that started
last, the lower id on a tie) changes the completion times.
"""

from __future__ import annotations

import pandas as pd
import pytest
from builders import hand_scenario, replay_trace

from fluidopt.control.protocol import Context, Controller
from fluidopt.core.model import Scenario

ABS = 1e-12


class OneInstance(Controller):
    """One GPU; waiting requests sit in a named queue; one prefill at a time, decode in place.

    ``lifo=False``: the waiting request that arrived first is admitted next (FCFS); ``lifo=True``: the
    one that arrived last, so that start order and arrival order differ. A request is admitted only
    when its context (prompt + generated tokens) fits in the free KV cache; admission is tried on
    arrival and on every freed slot (never after an eviction: the engine does not call back then).
    """

    name = "one-instance"
    chunked_prefill = True

    def __init__(self, lifo: bool = False):
        self.lifo = lifo
        self.evicted: list[tuple[float, int]] = []  # (time, arrival-ordered key) of every eviction

    def setup(self, ctx: Context) -> None:
        self.q = ctx.add_queue("hold")

    def _admit(self, ctx: Context, g: int = 0) -> None:
        if ctx.gpu_prefill(g) >= 0 or ctx.gpu_free(g) <= 0:
            return
        waiting = ctx.queue_requests(self.q)
        if not waiting:
            return
        key = ctx.req_arrival
        r = max(waiting, key=key) if self.lifo else min(waiting, key=key)
        if ctx.gpu_kv_free(g) >= ctx.req_prompt(r) + ctx.req_generated(r):
            ctx.start_prefill(r, g)

    def on_arrival(self, ctx, r):
        ctx.enqueue(r, self.q)
        self._admit(ctx)

    def on_prefill_done(self, ctx, r, g):
        ctx.start_decode(r, g)

    def on_slot_freed(self, ctx, g):
        self._admit(ctx, g)

    def on_preempt(self, ctx, r, g):
        self.evicted.append((ctx.now, ctx.req_arrival(r)))
        ctx.enqueue(r, self.q, front=True)


def _scenario(kv: float) -> Scenario:
    return hand_scenario(kv=kv, prompt=10, decode=10)


def _run(tmp_path, kv, rows, ctrl) -> pd.DataFrame:
    """rows: (arrival, prompt, output); returns the records by id (1, 2, ... in arrival order)."""
    res, rec = replay_trace(_scenario(kv), ctrl, [(t, p, d, 0) for t, p, d in rows], records=tmp_path / "rec.csv")
    assert res.totals["in_system"] == 0 and res.totals["dropped"] == 0
    return rec.set_index("id")


def test_youngest_by_arrival_not_by_start(tmp_path):
    """LIFO admission: C (arrived third) starts before B (arrived second); C is the one evicted.

    K = 40. A (P 10, D 8) at 0, B (10, 10) at 0.001, C (10, 10) at 0.002.
    0: A prefills (KV 10). 0.02: A decodes; the free slot admits the latest arrival, C (KV 20).
    0.04: A has 1 token (KV 21); C decodes; B prefills (KV 31). 0.06: A 2, C 1 (KV 33); B decodes.
    Three decodes, solo (0.005 s): 0.065 KV 36 (36 + 3 <= 40); 0.07 KV 39, 39 + 3 > 40: evict.
    The youngest by arrival is C (3 tokens, frees 13; KV 26, 26 + 2 fits), though B started last
    and A is the oldest. A (4 tokens at 0.07) ends at 0.09 (8 tokens), freeing 18: KV 16 (B: 10 + 6).
    C re-prefills 13 tokens (two chunks) 0.09 -> 0.13 while B makes tokens 7, 8; then both decode solo:
    B ends 0.14 (10 tokens), C makes its last 7 tokens 0.135 ... 0.165.
    """
    ctrl = OneInstance(lifo=True)
    rec = _run(tmp_path, 40, [(0.0, 10, 8), (0.001, 10, 10), (0.002, 10, 10)], ctrl)
    assert rec.preemptions.tolist() == [0, 0, 1]
    assert ctrl.evicted == [(pytest.approx(0.07, abs=ABS), 0.002)]
    assert rec.end.tolist() == pytest.approx([0.09, 0.14, 0.165], abs=ABS)
    assert (rec.arrival + rec.ttft).tolist() == pytest.approx([0.02, 0.06, 0.04], abs=ABS)  # first prefills
    # waits for a prefill: B 0.001 -> 0.04; C 0.002 -> 0.02 and again 0.07 -> 0.09
    assert rec.wait_prefill.tolist() == pytest.approx([0.0, 0.039, 0.018 + 0.02], abs=ABS)


def test_running_prefill_is_evicted_when_it_is_the_youngest(tmp_path):
    """The victim can be a prefill: K = 42, A (P 10, D 20) at 0, B (25, 5) at 0.041.

    A prefills 0 -> 0.02, then decodes solo: 5 tokens by 0.045. B arrives at 0.041 and is admitted at
    once (KV at its join boundary 0.045: 15 + 25 <= 42); its 3 chunks run from 0.045. Mixed iterations:
    0.065 KV 41 (41 + 1 <= 42), 0.085 KV 42: 42 + 1 > 42, evict the youngest, B's running prefill
    (no tokens generated: frees 25; KV 17). A (7 tokens at 0.085) ends at 0.085 + 13 x 0.005 = 0.15,
    which frees its slot: B re-prefills 25 tokens 0.15 -> 0.21 and decodes 5 tokens solo to 0.235.
    Evicting the oldest (A's decode) instead would let B's prefill finish at 0.105.
    """
    ctrl = OneInstance()
    rec = _run(tmp_path, 42, [(0.0, 10, 20), (0.041, 25, 5)], ctrl)
    assert rec.preemptions.tolist() == [0, 1]
    assert ctrl.evicted == [(pytest.approx(0.085, abs=ABS), 0.041)]
    assert rec.end.tolist() == pytest.approx([0.15, 0.235], abs=ABS)
    assert (rec.arrival + rec.ttft).tolist() == pytest.approx([0.02, 0.21], abs=ABS)  # TTFT: the prefill that finished
    assert rec.wait_prefill.tolist() == pytest.approx([0.0, 0.15 - 0.085], abs=ABS)


def test_equal_arrival_times_evict_the_larger_id(tmp_path):
    """Ties: A and B (P 10, D 10 each) both arrive at 0 (A first in the workload: id 1); K = 26.

    0: A prefills (B waits: one prefill at a time). 0.02: A decodes, B prefills (KV 20). 0.04: A 1 token
    (KV 21), B decodes. Solo: 0.045 KV 23, 0.05 KV 25: 25 + 2 > 26: evict the later arrival, i.e. the
    larger id, B (2 tokens; frees 12: KV 13). A (3 tokens at 0.05) ends at 0.05 + 7 x 0.005 = 0.085;
    B re-prefills 12 tokens (two chunks) 0.085 -> 0.125 and decodes its last 8 tokens to 0.165.
    """
    ctrl = OneInstance()
    rec = _run(tmp_path, 26, [(0.0, 10, 10), (0.0, 10, 10)], ctrl)
    assert rec.preemptions.tolist() == [0, 1]
    assert rec.end.tolist() == pytest.approx([0.085, 0.165], abs=ABS)
    assert (rec.arrival + rec.ttft).tolist() == pytest.approx([0.02, 0.04], abs=ABS)


def test_oldest_decode_survives_when_the_youngest_leaves_room(tmp_path):
    """FCFS, K = 40, A (P 10, D 30) at 0, B (P 10, D 4) at 0.001, C (P 5, D 30) at 0.002.

    0: A prefills. 0.02: A decodes, B prefills (KV 20). 0.04: A 1 (KV 21), B decodes, C prefills (5
    tokens, one chunk; KV 26). 0.06: A 2, B 1 (KV 28); C decodes. Solo, three decodes: 0.065 KV 31,
    0.07 KV 34, 0.075 KV 37: B has 4 tokens and leaves (frees 14: KV 23 = A 10 + 5, C 5 + 3). Then two
    tokens per iteration: 0.075 + 0.005 m has KV 23 + 2 m; at m = 8 (0.115) KV 39, 39 + 2 > 40: evict
    the youngest, C (11 tokens; frees 16: KV 23), not the oldest, A (13 tokens). A runs alone: token 30
    at 0.115 + 17 x 0.005 = 0.2 (KV 40 then, but A leaves first). C waits for the slot A frees (no
    admission after an eviction, and no arrival comes), re-prefills 5 + 11 = 16 tokens (two chunks)
    0.2 -> 0.24 and decodes its last 19 tokens to 0.335.
    """
    ctrl = OneInstance()
    rec = _run(tmp_path, 40, [(0.0, 10, 30), (0.001, 10, 4), (0.002, 5, 30)], ctrl)
    assert rec.preemptions.tolist() == [0, 0, 1]
    assert ctrl.evicted == [(pytest.approx(0.115, abs=ABS), 0.002)]
    assert rec.end.tolist() == pytest.approx([0.2, 0.075, 0.335], abs=ABS)
    assert rec.wait_prefill.tolist() == pytest.approx([0.0, 0.019, 0.038 + 0.085], abs=ABS)
