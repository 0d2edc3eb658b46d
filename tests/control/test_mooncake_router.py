"""Mooncake's Conductor (``mooncake``, issue 42): its TTFT estimates worked by hand from Mooncake's rule
(docs/prefix-cache.md), the cache against the queue, the engine's invariants, and the same decisions over
a ClusterSnapshot as over the simulator."""

from __future__ import annotations

import pandas as pd
import pytest

from fluidopt.control.prefix_routers import MooncakeConductor
from fluidopt.control.registry import make_controller
from fluidopt.control.snapshot import ClusterSnapshot
from fluidopt.core.errors import ScenarioError, UsageError
from fluidopt.sim.api import simulate

from .test_dynamo_kv import BS, _Mirror, _route, _scenario, _sessions, _where, _workload

pytestmark = pytest.mark.filterwarnings("ignore::fluidopt.workloads.base.TraceWarning")

A, B = 0.01, 0.001  # _scenario's law: alpha (s), beta (s/token); chunk 10 tokens, tau_mix 0.02 s


def _snapshot(n: int = 2, chunked: bool = False) -> tuple[ClusterSnapshot, MooncakeConductor]:
    snap = ClusterSnapshot(n, 4, 1, block_size=BS, service="tokens")
    ctrl = MooncakeConductor(_scenario(n).gpu, chunked=chunked)
    snap.setup(ctrl)
    return snap, ctrl


def test_the_estimate_is_the_prefill_queue_plus_the_uncached_prefill():
    snap, ctrl = _snapshot()
    a = _route(snap, ctrl, 40, [1, 2, 3, 4])
    assert _where(snap, a) == 0  # both empty, 0.01 + 0.04 each: tie -> fewest requests -> lowest index
    b = snap.add_request(0, 40, 5, blocks=[5, 6, 7, 8])
    # on 0, a's prefill (40 tokens) is queued ahead: (0.01 + 0.04) + (0.01 + 0.04); on 1 nothing is
    assert ctrl.ttft_estimates(snap, b) == pytest.approx([2 * (A + 40 * B), A + 40 * B], abs=1e-15)
    ctrl.on_arrival(snap, b)
    assert _where(snap, b) == 1
    ctrl.on_prefill_done(snap, a, snap.prefill_finished(a))  # a's four blocks are cached on 0
    c = snap.add_request(0, 40, 5, blocks=[1, 2, 3, 9])  # 30 tokens cached on 0: 10 to prefill there
    assert ctrl.ttft_estimates(snap, c) == pytest.approx([A + 10 * B, (A + 40 * B) + (A + 40 * B)], abs=1e-15)
    ctrl.on_arrival(snap, c)
    assert _where(snap, c) == 0
    # a whole prompt cached still prefills one token; c's 10 tokens queue ahead of it on 0
    d = snap.add_request(0, 40, 5, blocks=[1, 2, 3, 4])
    assert ctrl.ttft_estimates(snap, d)[0] == pytest.approx((A + 10 * B) + (A + 1 * B), abs=1e-15)
    ctrl.on_arrival(snap, d)
    assert _where(snap, d) == 0
    # the queue outweighs the cache: b's prefill is done, 1 is idle; e shares a's first block only
    ctrl.on_prefill_done(snap, b, snap.prefill_finished(b))
    e = snap.add_request(0, 40, 5, blocks=[1, 20, 21, 22])
    est = ctrl.ttft_estimates(snap, e)
    assert est == pytest.approx([(A + 10 * B) + (A + 1 * B) + (A + 30 * B), A + 40 * B], abs=1e-15)
    ctrl.on_arrival(snap, e)
    assert _where(snap, e) == 1


def test_chunked_prefill_charges_whole_chunks():
    snap, ctrl = _snapshot(chunked=True)
    assert ctrl.name == "mooncake-chunked"
    tau = ctrl.gpu.tau_mix
    _route(snap, ctrl, 35, [1, 2, 3])
    _route(snap, ctrl, 25, [4, 5])  # to 1: 0's queue (35 tokens, one prompt) estimates (3.5 + 0.5) tau
    r = snap.add_request(0, 12, 5, blocks=[6])
    # queue (W / C + k / 2) tau_mix; own prefill ceil(12 / 10) = 2 chunks
    assert ctrl.ttft_estimates(snap, r) == pytest.approx([(3.5 + 0.5) * tau + 2 * tau, (2.5 + 0.5) * tau + 2 * tau])


def test_under_a_law_the_uncached_tokens_pay_their_attention_over_the_cached_prefix():
    # gpu.timemodel: prefill 0.01 + 0.001 per token + 1e-5 per token^2. a (40 fresh tokens) queued on 0 is
    # k = 1 prompt of W = 40: 0.01 + 0.04 + 1e-5 * 40^2; c finds 30 tokens cached on 0 and computes 10 over
    # them: 0.01 + 0.01 + 1e-5 (40^2 - 30^2), against 0.01 + 0.04 + 0.016 on the empty instance 1
    from dataclasses import replace

    from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw

    law = IterationLaw(PrefillLaw(A, B, 1e-5), DecodeLaw((0.025, 0.0, 0.0)))
    snap = ClusterSnapshot(2, 4, 1, block_size=BS, service="tokens")
    ctrl = MooncakeConductor(replace(_scenario(2).gpu, timemodel=law))
    snap.setup(ctrl)
    a = _route(snap, ctrl, 40, [1, 2, 3, 4])
    ctrl.on_prefill_done(snap, a, snap.prefill_finished(a))
    c = snap.add_request(0, 40, 5, blocks=[1, 2, 3, 9])
    fresh = A + 40 * B + 1e-5 * 40 ** 2
    assert ctrl.ttft_estimates(snap, c) == pytest.approx([A + 10 * B + 1e-5 * (40 ** 2 - 30 ** 2), fresh], abs=1e-15)


def test_it_trades_the_cache_against_the_queue_in_the_simulator(tmp_path):
    # A (blocks 1-4) decodes for 1000 tokens on 0; at 1 s, k requests of 40 fresh tokens arrive, then one
    # sharing A's four blocks. With no queue on 0 the shared one goes to 0 (1 token to prefill).
    def gpus(rows) -> list[int]:
        path = tmp_path / "r.csv"
        simulate(_scenario(), "mooncake", horizon=100.0, service="tokens", workload=_workload(rows), records=path,
                 progress=False)
        return pd.read_csv(path).sort_values("id").prefill_gpu.tolist()

    assert gpus([(0.0, 40, 1000, [1, 2, 3, 4]), (1.0, 40, 2, [1, 2, 3, 4])]) == [0, 0]
    # least-requests would put the second on 1 (0 holds A): the cache is worth a whole prefill here
    assert gpus([(0.0, 40, 1000, [1, 2, 3, 4]), (1.0, 40, 2, [1, 2, 3, 9])]) == [0, 0]


@pytest.mark.parametrize("policy,kv", [("mooncake", None), ("mooncake-chunked", None), ("mooncake", 160.0)])
def test_engine_invariants_hold_on_a_trace_with_hashes(policy, kv):
    res = simulate(_scenario(3, kv), policy, horizon=200.0, service="tokens", workload=_workload(_sessions()),
                   progress=False, seed=3, check=True)
    assert res.totals["completed"] == 48
    assert res.totals["cached_prompt_tokens"] > 0


def test_a_snapshot_decides_as_the_engine():
    gpu = _scenario(3).gpu
    mirror = _Mirror(lambda: MooncakeConductor(gpu), "ttft_estimates")
    res = simulate(_scenario(3), mirror, horizon=200.0, service="tokens", workload=_workload(_sessions()),
                   progress=False, seed=1)
    assert res.totals["completed"] == 48 and mirror.decisions == 48
    assert res.totals["cached_prompt_tokens"] > 0
    assert not mirror.ids


def test_options_are_checked():
    sc = _scenario()
    c = make_controller("mooncake", sc)
    assert isinstance(c, MooncakeConductor) and c.gpu is sc.gpu and not c.chunked_prefill
    assert make_controller("mooncake-chunked", sc).chunked_prefill
    with pytest.raises(UsageError, match="unknown option"):
        make_controller("mooncake", sc, overlap_score_weight=2.0)
    with pytest.raises(ScenarioError, match="GPUProfile"):
        MooncakeConductor("h100")
