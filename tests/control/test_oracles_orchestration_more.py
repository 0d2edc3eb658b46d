"""More oracles for fluidopt.control.orchestration (issue 35, the second mutation rerun): the decode
queue of QLM and of QLMGroups, QLMGroups' batch slack and its TTFT eviction, on a hand-built state that
records what the controller starts; option defaults and refusals; fluid-plan's measured mixed rate.

The scenario and the GPU law are those of ``test_oracles_orchestration.py`` (one interactive class with
a 2 s TTFT SLO, one batch class due at t = 400 s; uncalibrated, so the rates are the fluid estimates
recomputed there by hand).
"""

from __future__ import annotations

import math

import pytest

from fluidopt.control.protocol import DECODE_QUEUE, PREFILL_QUEUE
from fluidopt.control.registry import make_controller
from fluidopt.core.errors import ScenarioError

from .test_oracles_orchestration import B_MIX, MU_BAT, TAU_MIX, scenario, thr


class Cluster:
    """A small cluster set by hand: FCFS queues per (queue, class), per-GPU prefill / decodes; records
    every prefill, decode and eviction the controller starts (free KV cache is ample)."""

    def __init__(self, n, now=0.0, *, prefill=None, decodes=None):
        self.n_gpus, self.now = n, now
        self.q = {}  # (queue, class) -> [request ids]
        self.cls, self.arr = {}, {}
        self.pre = dict(prefill or {})  # gpu -> request in prefill
        self.dec = {g: list((decodes or {}).get(g, [])) for g in range(n)}
        self.maxd = [B_MIX] * n
        self.log = []

    def add(self, r, i, arrival, q=PREFILL_QUEUE):
        self.cls[r], self.arr[r] = i, arrival
        if q is not None:
            self.q.setdefault((q, i), []).append(r)

    # setup
    def fleet_online(self):
        return list(range(self.n_gpus))

    def set_pool(self, gpus, pool, max_decodes=None):
        for g in gpus:
            self.maxd[g] = max_decodes

    def set_max_decodes(self, g, b):
        self.maxd[g] = b

    def idle_prefill(self, pool):
        return []

    def free_decode(self, pool):
        return []

    # queries
    def qlen(self, q, i=-1):
        return sum(len(v) for (qq, c), v in self.q.items() if qq == q and i in (-1, c))

    def head(self, q, i=-1):
        v = self.q.get((q, i), [])
        return v[0] if v else -1

    def n_wait_prefill(self, i):
        return len(self.q.get((PREFILL_QUEUE, i), []))

    def n_prefill(self, i):
        return sum(1 for r in self.pre.values() if self.cls[r] == i)

    def n_wait_decode(self, i):
        return len(self.q.get((DECODE_QUEUE, i), []))

    def n_decode_mixed(self, i):
        return sum(1 for v in self.dec.values() for r in v if self.cls[r] == i)

    def n_decode_solo(self, i):
        return 0

    def req_arrival(self, r):
        return self.arr[r]

    def req_class(self, r):
        return self.cls[r]

    def req_prompt(self, r):
        return 300

    def req_generated(self, r):
        return 0

    def gpu_online(self, g):
        return True

    def gpu_prefill(self, g):
        return self.pre.get(g, -1)

    def gpu_decodes(self, g):
        return len(self.dec[g])

    def gpu_max_decodes(self, g):
        return self.maxd[g]

    def gpu_free(self, g):
        return 10**6

    def gpu_kv_free(self, g):
        return 10**6

    def gpu_kv_used(self, g):
        return 0

    def gpu_decodes_by_class(self, g):
        return [sum(1 for r in self.dec[g] if self.cls[r] == i) for i in range(2)]

    def gpu_requests(self, g):
        return ([self.pre[g]] if g in self.pre else []) + self.dec[g]

    # actions
    def enqueue(self, r, q, front=False):
        self.q.setdefault((q, self.cls[r]), []).append(r)

    def _dequeue(self, r):
        for v in self.q.values():
            if r in v:
                v.remove(r)

    def start_prefill(self, r, g):
        self._dequeue(r)
        self.pre[g] = r
        self.log.append(("prefill", r, g))

    def start_decode(self, r, g):
        self._dequeue(r)
        self.dec[g].append(r)
        self.log.append(("decode", r, g))

    def evict(self, r, host):
        for v in self.dec.values():
            if r in v:
                v.remove(r)
        for g in [g for g, p in self.pre.items() if p == r]:
            del self.pre[g]
        self.log.append(("evict", r))
        return True


def test_qlm_fills_a_freed_decode_slot_from_the_decode_queue_interactive_first():
    """A freed slot on GPU 0: the waiting decodes start there, the interactive one first although the
    batch one waited longer; then the slot's prefill goes to the least-slack group."""
    q = make_controller("qlm", scenario(1), calibrated=False)
    st = Cluster(1, now=5.0)
    st.add(6, 1, 1.0, DECODE_QUEUE)  # batch, waiting to decode since t = 1
    st.add(5, 0, 3.0, DECODE_QUEUE)  # interactive, since t = 3
    st.add(7, 0, 4.0)  # an interactive prefill waiting
    q.setup(st)
    q.on_slot_freed(st, 0)
    assert st.log == [("decode", 5, 0), ("decode", 6, 0), ("prefill", 7, 0)]


def test_qlm_groups_fills_a_freed_slot_from_its_models_decode_queue_then_its_groups():
    q = make_controller("qlm-groups", scenario(1), calibrated=False)
    st = Cluster(1, now=5.0)
    st.add(5, 0, 3.0, DECODE_QUEUE)
    st.add(7, 1, 2.0)  # a batch prefill waiting
    q.setup(st)
    q.on_slot_freed(st, 0)
    assert st.log == [("decode", 5, 0), ("prefill", 7, 0)]


def test_qlm_groups_batch_slack_by_hand():
    """deadline - now - waiting / (instances of the model x mu), mu at the batch limit (B - 1 = 63)."""
    q = make_controller("qlm-groups", scenario(4), calibrated=False)
    assert q.mu[1] == pytest.approx(MU_BAT, rel=1e-12) and q.mu[0] == pytest.approx(thr(B_MIX, 300, 100), rel=1e-12)
    st = Cluster(4, now=100.0)
    for r in range(600):
        st.add(r, 1, 50.0)
    q.setup(st)
    assert q.k_of == {"model": 4}
    assert q._slack(st, 1) == pytest.approx(400.0 - 100.0 - 600 / (4 * MU_BAT), rel=1e-12)
    # an interactive head 0.5 s old, 3 waiting: 2 - 0.5 - 3 / (4 mu_int) - 2 tau_mix
    for r in (700, 701, 702):
        st.add(r, 0, 99.5)
    assert q._slack(st, 0) == pytest.approx(2.0 - 0.5 - 3 / (4 * q.mu[0]) - 2 * TAU_MIX, rel=1e-12)


def test_qlm_groups_evicts_a_batch_prefill_for_an_interactive_request_that_would_miss_its_ttft():
    """GPU 0 prefills batch work: an interactive request 1.5 s old (> headroom 0.5 x 2 s SLO) evicts it
    and starts at once there; 0.5 s old it waits."""
    q = make_controller("qlm-groups", scenario(1), calibrated=False)
    st = Cluster(1, now=10.0, prefill={0: 3})
    st.add(3, 1, 0.0, q=None)
    q.setup(st)
    st.cls[9], st.arr[9] = 0, 9.5
    q.on_arrival(st, 9)
    assert st.log == [] and st.head(PREFILL_QUEUE, 0) == 9
    st.q.clear()
    st.cls[8], st.arr[8] = 0, 8.5
    q.on_arrival(st, 8)
    assert st.log == [("evict", 3), ("prefill", 8, 0)]


def test_qlm_groups_evicts_the_newest_batch_decode_when_no_prefill_is_there_to_evict():
    """GPU 0 holds B_MIX batch decodes and no prefill: the late interactive request evicts the last
    decode placed (one slot is enough) and starts its prefill there."""
    q = make_controller("qlm-groups", scenario(1), calibrated=False)
    st = Cluster(1, now=10.0, decodes={0: list(range(100, 100 + B_MIX))})
    for r in range(100, 100 + B_MIX):
        st.add(r, 1, 0.0, q=None)
    q.setup(st)
    st.cls[8], st.arr[8] = 0, 8.5
    q.on_arrival(st, 8)
    assert st.log == [("evict", 100 + B_MIX - 1), ("prefill", 8, 0)]


def test_orchestrator_options_defaults_and_refusals():
    from fluidopt.control.orchestration import Chiron, QLMGroups, UtilisationAutoscaler

    c = Chiron(scenario())
    assert c.warm_pool == 0 and c.tick_interval == 10.0
    assert make_controller("qlm", scenario()).tick_interval == 10.0
    assert make_controller("utilisation-autoscaler", scenario()).tick_interval == 10.0
    assert QLMGroups(scenario()).tick_interval == 1.0
    assert QLMGroups(scenario(), give_up=0).give_up == 0.0  # zero allowed: every late group goes last
    with pytest.raises(ScenarioError, match="qlm-groups: give_up"):
        QLMGroups(scenario(), give_up=-1)
    with pytest.raises(ScenarioError, match=r"utilisation-autoscaler: down: expected less than up = 0.5, got 0.5"):
        UtilisationAutoscaler(scenario(), up=0.5, down=0.5)
    assert UtilisationAutoscaler(scenario(), up=0.5, down=0.49).down == 0.49


def test_fluid_plan_measures_the_mixed_rate_from_no_completions_at_time_zero(monkeypatch):
    """In its first five minutes fluid-plan's measured mixed rate is (batch completions on mixed
    instances since t = 0) / elapsed / spare mixed GPUs, spare = base - lambda_int / (rho mu_int)."""
    from fluidopt.control.orchestration import chiron as orchestration
    from fluidopt.sim.api import make_engine

    from .test_orchestration import workflow

    sc, wl = workflow()
    ctrl = make_controller("fluid-plan", sc)
    seen = []
    real = orchestration.plan_fleet

    def spy(*a, **kw):
        now = ctrl.win4[-1][0]
        if ctrl.win4[0][0] == 0.0 and now >= 60.0:
            lam = sum(sc.classes[i].rate for i in ctrl.inter)
            base = sum(1 for p in ctrl.pool_of if p != orchestration.BATCH)
            spare = max(1e-9, base - lam / (ctrl.rho * ctrl.mu_int))
            seen.append((kw["mu_mix"], ctrl.mixed_done / now / spare))
        return real(*a, **kw)

    monkeypatch.setattr(orchestration, "plan_fleet", spy)
    eng = make_engine(sc, ctrl, horizon=200.0, seed=3, service="tokens", workload=wl)
    eng.start()
    eng.advance()
    eng.finish()
    assert seen and any(want > 0 for _, want in seen)
    for got, want in seen:
        assert got == pytest.approx(want, rel=1e-12)
    assert math.isfinite(seen[0][1])


class _NoneFree:
    def choice(self):
        return -1


def test_chiron_places_an_interactive_decode_by_evicting_batch_work_on_a_full_mixed_instance():
    """GPU 0 (interactive) and GPU 1 (mixed, at the ITL-safe limit) are full, GPU 1 with batch decodes:
    the interactive request whose prefill ended on GPU 0 evicts GPU 1's first batch decode and decodes
    there."""
    from fluidopt.control.orchestration.common import INTERACTIVE, MIXED

    c = make_controller("chiron", scenario(2), calibrated=False)
    c.pool_of, c.mixed_gpus = [INTERACTIVE, MIXED], [1]
    c.lent, c.bmode = [False, False], [False, False]
    c.fd = [_NoneFree()] * 3
    st = Cluster(2, now=10.0, decodes={0: list(range(200, 200 + B_MIX)), 1: list(range(100, 100 + B_MIX))})
    for r in range(200, 200 + B_MIX):
        st.add(r, 0, 1.0, q=None)
    for r in range(100, 100 + B_MIX):
        st.add(r, 1, 0.0, q=None)
    st.add(8, 0, 9.0, q=None)
    assert c._place_decode(st, 8, 0) is True
    assert st.log == [("evict", 100), ("decode", 8, 1)]
