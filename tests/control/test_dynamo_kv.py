"""NVIDIA Dynamo's KV router (``dynamo-kv``, issue 42): its cost, worked by hand from Dynamo's formula
(docs/prefix-cache.md), the tie rule, temperature sampling, the engine's invariants, and the same decisions
over a ClusterSnapshot as over the simulator."""

from __future__ import annotations

import math
import random

import pandas as pd
import pytest

from fluidopt import GPUProfile, RequestClass, Scenario
from fluidopt.control.prefix_routers import DynamoKV
from fluidopt.control.protocol import WAIT_PREFILL, Controller
from fluidopt.control.registry import make_controller
from fluidopt.control.snapshot import ClusterSnapshot
from fluidopt.core.errors import ScenarioError, UsageError
from fluidopt.sim.api import simulate
from fluidopt.workloads import TraceWorkload

pytestmark = pytest.mark.filterwarnings("ignore::fluidopt.workloads.base.TraceWarning")

BS = 10  # tokens a block in every case here


def _scenario(n: int = 2, kv: float | None = None) -> Scenario:
    gpu = GPUProfile.from_gamma(alpha=0.01, beta=0.001, gamma=40.0, chunk=10, batch=4, kv_capacity=kv)
    return Scenario(gpu=gpu, gpus=n, classes=(RequestClass("c", prompt=40, decode=2, rate=0.01, patience=0.0),),
                    prefill_price=0.1, decode_price=0.2, name="dynamo-kv")


def _workload(rows) -> TraceWorkload:
    frame = pd.DataFrame({"time": [r[0] for r in rows], "prompt": [r[1] for r in rows],
                          "output": [r[2] for r in rows], "cls": [0] * len(rows)})
    return TraceWorkload(frame, ("c",), hashes=[r[3] for r in rows], block_size=BS)


def _snapshot(n: int = 2, **options) -> tuple[ClusterSnapshot, DynamoKV]:
    snap = ClusterSnapshot(n, 4, 1, block_size=BS, service="tokens")
    ctrl = DynamoKV(block_size=BS, **options)
    snap.setup(ctrl)
    return snap, ctrl


def _route(snap: ClusterSnapshot, ctrl: DynamoKV, prompt: int, blocks) -> int:
    r = snap.add_request(0, prompt, 5, blocks=blocks)
    ctrl.on_arrival(snap, r)
    return r


def _where(snap: ClusterSnapshot, r: int) -> int:
    g = snap.req_gpu(r)
    return g if g >= 0 else snap.req_queue(r) - 2  # running on g, or waiting in g's instance queue


def test_the_cost_is_dynamos_prefill_plus_decode_blocks():
    snap, ctrl = _snapshot()
    a = _route(snap, ctrl, 40, [1, 2, 3, 4])
    assert _where(snap, a) == 0  # both empty, costs 4 + 4 = 8: tie -> fewest requests -> lowest index
    # a is prefilling on 0: 40 pending prefill tokens (4 blocks) and 4 active blocks there
    b = snap.add_request(0, 40, 5, blocks=[5, 6, 7, 8])
    assert ctrl.costs(snap, b) == [1.0 * (40 + 40) / BS + 4 + 4, 1.0 * 40 / BS + 0 + 4]  # [16, 8]
    ctrl.on_arrival(snap, b)
    assert _where(snap, b) == 1
    ctrl.on_prefill_done(snap, a, snap.prefill_finished(a))  # a's blocks are cached on 0, its prefill is done
    # c shares a's first three blocks (30 tokens): on 0 it prefills 10 tokens and adds one new active block
    c = snap.add_request(0, 40, 5, blocks=[1, 2, 3, 9])
    assert snap.cached_prefix_tokens(c, 0) == 30
    assert ctrl.costs(snap, c) == [(0 + 10) / BS + 4 + 1, (40 + 40) / BS + 4 + 4]  # [6, 16]: b still prefills on 1
    ctrl.on_arrival(snap, c)
    assert _where(snap, c) == 0
    assert snap.gpu_prefill(0) == c and snap.req_phase(a) != WAIT_PREFILL  # c prefills beside a's decode
    # a finishes: c's blocks stay active on 0 (the three it shared with a counted once throughout)
    ctrl.on_decode_done(snap, a, snap.decode_finished(a))
    d = snap.add_request(0, 45, 5, blocks=[1, 2, 3, 9, 11])  # 4 complete blocks: the partial fifth is not one
    # on 0: c's 10 pending tokens + d's 45 - 30 cached; active {1, 2, 3, 9}, all of d's complete blocks
    assert ctrl.costs(snap, d)[0] == (10 + 45 - 30) / BS + 4 + 0


def test_the_overlap_weight_trades_the_cache_against_the_load(tmp_path):
    # A (blocks 1-4) decodes for 1000 tokens on instance 0; B (t = 1 s) shares k of A's blocks. On 0:
    # w x (40 - 10k) / 10 + 4 active + (4 - k) new; on 1: w x 4 + 4 new.
    def gpus(shared: list[int], **options) -> list[int]:
        rows = [(0.0, 40, 1000, [1, 2, 3, 4]), (1.0, 40, 2, shared)]
        path = tmp_path / "r.csv"
        simulate(_scenario(), "dynamo-kv", horizon=100.0, service="tokens", workload=_workload(rows), records=path,
                 progress=False, controller_options={"block_size": BS, **options})
        return pd.read_csv(path).sort_values("id").prefill_gpu.tolist()

    assert gpus([1, 2, 3, 9]) == [0, 0]  # w = 1: 1 + 4 + 1 = 6 against 8
    assert gpus([1, 2, 3, 9], overlap_score_weight=0.0) == [0, 1]  # decode blocks alone: 5 against 4
    assert gpus([1, 2, 8, 9], overlap_score_weight=2.0) == [0, 0]  # 4 + 4 + 2 = 10 against 12
    # w = 1 with two shared blocks: 2 + 4 + 2 = 8 against 8, a tie: the instance with fewer requests
    assert gpus([1, 2, 8, 9]) == [0, 1]


def _probabilities(costs: list[float], t: float) -> list[float]:
    # Dynamo's softmax over min-max-normalised costs (lower is likelier), written from its docs
    lo, hi = min(costs), max(costs)
    if hi == lo:
        return [1.0 / len(costs)] * len(costs)
    e = [math.exp(-(c - lo) / (hi - lo) / t) for c in costs]
    return [x / sum(e) for x in e]


def test_temperature_samples_dynamos_softmax_reproducibly():
    snap, ctrl = _snapshot(3, router_temperature=0.5, seed=7)
    _route(snap, ctrl, 40, [1, 2, 3, 4])
    _route(snap, ctrl, 20, [5, 6])
    r = snap.add_request(0, 40, 5, blocks=[1, 2, 8, 9])
    costs = ctrl.costs(snap, r)
    assert len(set(costs)) == 3
    p = _probabilities(costs, 0.5)
    n = 3000
    picks = [ctrl.route(snap, r) for _ in range(n)]  # route reads the state and draws; it changes no ledger
    for g in range(3):
        assert abs(picks.count(g) / n - p[g]) < 4 * math.sqrt(p[g] * (1 - p[g]) / n), (g, p)
    # the draw is one uniform number from random.Random(seed) against the cumulative p (the two routings
    # above drew one each)
    ref = random.Random(7)
    ref.random(), ref.random()
    for pick in picks[:200]:
        u = ref.random()
        assert pick == next(g for g in range(3) if u < sum(p[: g + 1]) + 1e-12)
    # equal costs at a temperature above 0: uniform
    snap2, ctrl2 = _snapshot(4, router_temperature=1.0, seed=3)
    r2 = snap2.add_request(0, 40, 5, blocks=[1, 2, 3, 4])
    picks2 = [ctrl2.route(snap2, r2) for _ in range(2000)]
    assert all(abs(picks2.count(g) / 2000 - 0.25) < 0.04 for g in range(4))


def test_options_are_checked_and_the_chunked_variant_exists():
    sc = _scenario()
    assert isinstance(make_controller("dynamo-kv", sc), DynamoKV)
    c = make_controller("dynamo-kv-chunked", sc, overlap_score_weight=2.0)
    assert c.chunked_prefill and c.name == "dynamo-kv-chunked" and c.overlap_score_weight == 2.0
    d = make_controller("dynamo-kv", sc)
    assert (d.overlap_score_weight, d.router_temperature, d.block_size, d.seed) == (1.0, 0.0, 512, None)
    with pytest.raises(UsageError, match="unknown option"):
        make_controller("dynamo-kv", sc, cache_threshold=0.5)
    for bad in ({"overlap_score_weight": -1.0}, {"router_temperature": math.nan}, {"block_size": 0},
                {"seed": -1}, {"block_size": 1.5}):
        with pytest.raises(ScenarioError, match=next(iter(bad))):
            make_controller("dynamo-kv", sc, **bad)


def _sessions(n: int = 48) -> list:
    # five sessions whose turns extend each other, in a burst: queueing, prefills in flight, reuse
    rows = []
    for k in range(n):
        s, turn = k % 5, k // 5
        rows.append((0.04 * k, 10 * (turn + 2) + 5 * (k % 2), 1 + k % 7, [100 * s + j for j in range(turn + 3)]))
    return rows


@pytest.mark.parametrize("policy,kv", [("dynamo-kv", None), ("dynamo-kv-chunked", None), ("dynamo-kv", 160.0)])
def test_engine_invariants_hold_on_a_trace_with_hashes(policy, kv):
    res = simulate(_scenario(3, kv), policy, horizon=200.0, service="tokens", workload=_workload(_sessions()),
                   progress=False, seed=3, check=True, controller_options={"block_size": BS})
    assert res.totals["completed"] == 48
    assert res.totals["cached_prompt_tokens"] > 0


class _Mirror(Controller):
    """A router on the engine and a twin on a ClusterSnapshot fed the engine's events: same scores, same picks
    (``make`` builds each; ``score`` names the router's per-instance scores)."""

    chunked_prefill = False

    def __init__(self, make=lambda: DynamoKV(block_size=BS), score: str = "costs"):
        self.eng, self.twin = make(), make()
        self.score = score
        self.decisions = 0

    def setup(self, ctx):
        self.eng.setup(ctx)
        self.snap = ClusterSnapshot(ctx.n_gpus, ctx.batch, ctx.class_names, clock=lambda: ctx.now,
                                    service="tokens", block_size=BS)
        self.snap.setup(self.twin)
        self.ids: dict[int, int] = {}

    def on_arrival(self, ctx, r):
        sr = self.ids[r] = self.snap.add_request(ctx.req_class(r), ctx.req_prompt(r), ctx.req_output(r),
                                                 blocks=list(ctx.req_blocks(r)))
        assert getattr(self.eng, self.score)(ctx, r) == getattr(self.twin, self.score)(self.snap, sr)
        self.eng.on_arrival(ctx, r)
        self.twin.on_arrival(self.snap, sr)
        assert (ctx.req_gpu(r), ctx.req_queue(r)) == (self.snap.req_gpu(sr), self.snap.req_queue(sr))
        self.decisions += 1

    def on_prefill_done(self, ctx, r, g):
        assert self.snap.prefill_finished(self.ids[r]) == g
        self.eng.on_prefill_done(ctx, r, g)
        self.twin.on_prefill_done(self.snap, self.ids[r], g)

    def on_decode_done(self, ctx, r, g):
        sr = self.ids.pop(r)
        assert self.snap.decode_finished(sr) == g
        self.eng.on_decode_done(ctx, r, g)
        self.twin.on_decode_done(self.snap, sr, g)

    def on_slot_freed(self, ctx, g):
        self.eng.on_slot_freed(ctx, g)
        self.twin.on_slot_freed(self.snap, g)
        for gg in range(ctx.n_gpus):
            assert self.snap.gpu_prefill(gg) == self.ids.get(ctx.gpu_prefill(gg), -1)


def test_a_snapshot_decides_as_the_engine():
    mirror = _Mirror()
    res = simulate(_scenario(3), mirror, horizon=200.0, service="tokens", workload=_workload(_sessions()),
                   progress=False, seed=1)
    assert res.totals["completed"] == 48 and mirror.decisions == 48
    assert res.totals["cached_prompt_tokens"] > 0
    assert not mirror.ids  # every request finished on both
