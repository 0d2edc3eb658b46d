"""Oracles for QLM's batch slack (fluidopt.control.orchestration.QLM) on a hand-built state, with the GPU
law's throughputs recomputed from the module docstring.

QLM runs a fixed fleet of identical *mixed* instances (every GPU serves interactive and batch work at the
interactive batch limit, set by the longest mean context of either kind against the ITL target), so the
fleet's batch service rate is n * mu_mix, mu_mix the throughput of one such instance on batch requests;
a batch group's slack is deadline - now - (batch requests in the system) / (n mu_mix), an interactive
head's is ttft_slo - its age - its prefill time (ceil(P / C) iterations of tau_mix); least slack first.
"""

from __future__ import annotations

import math

import pytest

from fluidopt.control.protocol import PREFILL_QUEUE
from fluidopt.control.registry import make_controller
from fluidopt.model import GPUProfile, RequestClass, Scenario

GPU = GPUProfile(alpha=0.0174, beta=6.2e-5, tau_solo=1 / 45.45, chunk=256, batch=64, kv_time_per_token=1.5e-6)
TAU_MIX = 0.0174 + 6.2e-5 * 256  # 0.033272 s


def scenario(n: int = 4) -> Scenario:
    classes = (RequestClass("interactive", prompt=300, decode=100, rate=6.0, ttft_slo=2.0, itl_slo=0.06),
               RequestClass("batch", prompt=300, decode=400, rate=1e-6, deadline_at=400.0))
    return Scenario(gpu=GPU, gpus=n, classes=classes, name="qlm-hand")


def thr(b: int, P: float, D: float) -> float:
    chunks = math.ceil(P / 256)
    f = b / D * chunks
    kv = 1.5e-6 * b * (P + D / 2)
    if f >= 1:
        return 1 / (chunks * (TAU_MIX + kv))
    return (b / D) / (f * TAU_MIX + (1 - f) * GPU.tau_solo + kv)


# mixed limit: contexts 300 + 50 (interactive) and 300 + 200 (batch); 0.033272 + 1.5e-6 b 500 <= 0.06
# -> b <= 35.6 -> 35. A batch instance (no batch ITL) would keep B - 1 = 63.
B_MIX = 35
MU_MIX = thr(B_MIX, 300, 400)
MU_BAT = thr(63, 300, 400)


class HandState:
    """The queries QLM reads, on a state set by hand: per class (waiting prefill, prefilling, waiting
    decode, decoding mixed, decoding solo) and the head of each prefill queue (id, arrival)."""

    def __init__(self, n, now, counts, heads):
        self.n, self.now, self.counts, self.heads = n, now, counts, heads

    # setup
    def fleet_online(self):
        return list(range(self.n))

    def set_pool(self, gpus, pool, max_decodes=None):
        self.max_decodes = max_decodes

    def idle_prefill(self, pool):
        return []

    def free_decode(self, pool):
        return []

    # state
    def n_wait_prefill(self, i):
        return self.counts[i][0]

    def n_prefill(self, i):
        return self.counts[i][1]

    def n_wait_decode(self, i):
        return self.counts[i][2]

    def n_decode_mixed(self, i):
        return self.counts[i][3]

    def n_decode_solo(self, i):
        return self.counts[i][4]

    def head(self, q, i):
        assert q == PREFILL_QUEUE
        return self.heads.get(i, (-1, None))[0]

    def req_arrival(self, r):
        return next(a for rid, a in self.heads.values() if rid == r)


def test_qlm_batch_slack_uses_the_mixed_instances_rate():
    n, now = 4, 100.0
    nb = round(1280 * MU_MIX)  # batch requests in the system: 320 s of work for the fleet at n mu_mix
    st = HandState(n, now, {0: (0, 0, 0, 0, 0), 1: (nb - 53, 3, 10, 40, 0)}, {0: (7, now - 10.0), 1: (9, 1.0)})
    q = make_controller("qlm", scenario(n))
    q.setup(st)
    assert st.max_decodes == B_MIX
    q.on_tick(st)
    slack = 400.0 - now - nb / (n * MU_MIX)  # about -20 s
    assert q._bslack == pytest.approx(slack, rel=1e-9)
    # the interactive head is 10 s old: slack 2 - 10 - 2 tau_mix = -8.07 s; the batch group has less: first.
    inter = 2.0 - 10.0 - 2 * TAU_MIX
    assert slack < inter < 400.0 - now - nb / (n * MU_BAT)  # (at the batch instances' rate the order flips)
    assert q._order(st) == [1, 0]
    # far beyond saving (slack below -give_up): the batch group goes last
    late = HandState(n, 399.0, {0: (0, 0, 0, 0, 0), 1: (nb, 0, 0, 0, 0)}, {0: (7, 389.0), 1: (9, 1.0)})
    q.on_tick(late)
    assert q._bslack == pytest.approx(1.0 - nb / (n * MU_MIX), rel=1e-9) and q._bslack < -60
    assert q._order(late) == [0, 1]


def test_qlm_batch_slack_is_infinite_without_batch_work():
    st = HandState(2, 50.0, {0: (3, 0, 0, 0, 0), 1: (0, 0, 0, 0, 0)}, {0: (1, 49.0)})
    q = make_controller("qlm", scenario(2))
    q.setup(st)
    q.on_tick(st)
    assert q._bslack == math.inf and q._order(st) == [0]


def test_the_orchestrators_throughputs_by_hand():
    q = make_controller("qlm", scenario(4))
    assert (q.b_int, q.b_bat) == (B_MIX, 63)
    assert q.mu_mix == pytest.approx(MU_MIX, rel=1e-12) and q.mu_bat == pytest.approx(MU_BAT, rel=1e-12)
    assert q.ttft_pre == pytest.approx([2 * TAU_MIX, 2 * TAU_MIX])
