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
from fluidopt.core.model import GPUProfile, RequestClass, Scenario

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
    q = make_controller("qlm", scenario(n), calibrated=False)
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
    q = make_controller("qlm", scenario(2), calibrated=False)
    q.setup(st)
    q.on_tick(st)
    assert q._bslack == math.inf and q._order(st) == [0]


def test_the_orchestrators_throughputs_by_hand():
    q = make_controller("qlm", scenario(4), calibrated=False)
    assert (q.b_int, q.b_bat) == (B_MIX, 63)
    assert q.mu_mix == pytest.approx(MU_MIX, rel=1e-12) and q.mu_bat == pytest.approx(MU_BAT, rel=1e-12)
    assert q.ttft_pre == pytest.approx([2 * TAU_MIX, 2 * TAU_MIX])


# -- the orchestrators' other decisions (mutation survivors of orchestration.py, issue 35) ---------------


def test_split_classes_takes_one_name_as_a_string():
    from fluidopt.control.orchestration import split_classes

    # naming the deadline-free class as the batch class (not the default split)
    assert split_classes(scenario(), "interactive") == ([1], [0])
    assert split_classes(scenario()) == ([0], [1])


def test_head_of_several_classes_is_the_earliest_arrival():
    sc = Scenario(gpu=GPU, gpus=2, classes=(*scenario().classes, RequestClass("chat", prompt=100, decode=50, rate=1.0)),
                  name="three")
    q = make_controller("qlm", sc, calibrated=False)
    st = HandState(2, 10.0, {}, {0: (4, 7.5), 2: (5, 3.0)})
    assert q.inter == [0, 2] and q.head_of(st, PREFILL_QUEUE, q.inter) == 5
    st = HandState(2, 10.0, {}, {0: (4, 2.5), 2: (5, 3.0)})
    assert q.head_of(st, PREFILL_QUEUE, q.inter) == 4
    assert q.head_of(HandState(2, 10.0, {}, {}), PREFILL_QUEUE, q.inter) == -1


def test_chiron_and_autoscaler_options():
    from fluidopt.core.errors import ScenarioError

    c = make_controller("chiron", scenario(), interactive_gpus=0)
    assert c.n_int == 0 and c.int_scaling is True
    with pytest.raises(ScenarioError, match="interactive_gpus"):
        make_controller("chiron", scenario(), interactive_gpus=-1)
    ua = make_controller("utilisation-autoscaler", scenario())
    assert (ua.up, ua.down, ua.step, ua.min_gpus, ua.bsize) == (0.8, 0.3, 0.25, 1, B_MIX)
    with pytest.raises(ScenarioError, match="utilisation-autoscaler: step: expected"):
        make_controller("utilisation-autoscaler", scenario(), step=0)


class UAState:
    """What the utilisation autoscaler reads and does, recorded: per-GPU requests, online GPUs."""

    def __init__(self, load, online=None, queued=None):
        self.load, self.n_gpus = load, len(load)
        self.online = list(range(len(load))) if online is None else online
        self.queued = queued or {}
        self.log = []

    def set_pool(self, gpus, pool, max_decodes=None):
        pass

    def instance_queue(self, g):
        return 100 + g

    def fleet_online(self):
        return list(self.online)

    def gpu_online(self, g):
        return g in self.online

    def instance_requests(self, g):
        return self.load[g]

    def enqueue(self, r, q, front=False):
        self.log.append(("enqueue", r, q, front))

    def queue_requests(self, q):
        return list(self.queued.get(q, []))

    def drain_gpu(self, g):
        self.log.append(("drain", g))
        self.online.remove(g)

    def add_gpu(self, g=None):
        self.log.append(("add", g))

    def qlen(self, *a):
        return 0

    def gpu_prefill(self, g):
        return 0  # busy: nothing admitted


def _ua(fleet: bool = True):
    from fluidopt.core.model import Fleet

    sc = scenario(4)
    if fleet:
        from dataclasses import replace

        sc = replace(sc, fleet=Fleet(initial=2, startup_delay=10.0))
    return make_controller("utilisation-autoscaler", sc)


def test_a_preempted_request_goes_back_to_the_front_of_its_own_instance():
    ua = _ua()
    st = UAState([5, 0, 3, 9])
    ua.setup(st)
    ua.on_preempt(st, 42, 0)  # GPU 0 is online: its own queue, although GPU 1 is emptier
    assert st.log == [("enqueue", 42, 100, True)]
    st = UAState([5, 0, 3, 9], online=[2, 3])
    ua.setup(st)
    ua.on_preempt(st, 43, 0)  # GPU 0 went offline: the least-loaded online instance
    assert st.log == [("enqueue", 43, 102, True)]


def test_draining_the_least_loaded_instance_redispatches_its_queue():
    ua = _ua()
    st = UAState([1, 0, 1, 1], online=[0, 1, 2], queued={101: [7, 8]})
    ua.setup(st)
    ua.on_tick(st)  # utilisation 2 / (3 x 36) < 0.3: drain GPU 1, its two queued requests to the others
    assert st.log[0] == ("drain", 1)
    assert st.log[1:] == [("enqueue", 7, 100, False), ("enqueue", 8, 100, False)]
    busy = UAState([40, 40, 40, 40], online=[0, 1])
    ua.setup(busy)
    ua.on_tick(busy)  # 80 / (2 x 36) > 0.8: add ceil(0.25 x 2) = 1 instance
    assert busy.log == [("add", None)]


def test_qlm_starts_an_arrival_on_gpu_0():
    """One GPU: QLM must start work on GPU 0 at arrival (nothing else would ever start it)."""
    import pandas as pd

    from fluidopt.sim.api import simulate
    from fluidopt.workloads import TraceWorkload

    sc = Scenario(gpu=GPU, gpus=1, classes=scenario().classes, name="qlm-one")
    wl = TraceWorkload(pd.DataFrame({"time": [0.5, 1.0], "prompt": [300, 300], "output": [20, 20], "cls": [0, 1]}),
                       sc.class_names)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = simulate(sc, "qlm", horizon=30.0, service="tokens", workload=wl, seed=0, progress=False)
    assert res.totals["completed"] == 2


def test_chiron_types_its_interactive_spares_and_base_with_the_itl_safe_limit():
    from fluidopt.sim.api import make_engine

    from .test_orchestration import workflow

    sc, wl = workflow()  # 10 GPUs, 4 online: 1 interactive, 3 mixed; 2 offline spares typed interactive
    ctrl = make_controller("chiron", sc, interactive_spares=2)
    eng = make_engine(sc, ctrl, horizon=5.0, seed=3, service="tokens", workload=wl)
    eng.start()
    # pools (0 interactive, 1 mixed, 2 batch) and batch limits (offline GPUs: 0 until added)
    assert [(eng.gpu_pool(g), eng.gpu_max_decodes(g)) for g in range(10)] == (
        [(0, ctrl.b_int)] + [(1, ctrl.b_int)] * 3 + [(2, 0)] * 4 + [(0, 0)] * 2)
    assert ctrl._spares(0, 4) == 0 and ctrl._spares(6, 4) == 2
    off = make_controller("chiron", sc, interactive_scaling=False, interactive_spares=2)
    assert off._spares(6, 4) == 0


@pytest.mark.parametrize("pol", ["fluid-plan", "chiron"])
def test_batch_autoscalers_meet_the_deadline_without_running_every_gpu(pol):
    """The small workflow (function-scoped, so that mutation testing attributes each run to this test):
    the backlog is done by its deadline, batch instances are added and drained again, and the
    fleet-hours stay below the whole fleet's for the whole run (10 GPUs x 450 s = 1.25 GPU-hours)."""
    from fluidopt.sim.api import simulate

    from .test_orchestration import workflow

    sc, wl = workflow()
    res = simulate(sc, pol, horizon=450.0, seed=3, service="tokens", workload=wl, check=False)
    assert res.per_class.loc["batch", "slo_attainment"] == 1.0
    log = res.meta["fleet_log"]
    assert log["gpus"].max() > 4
    # the fluid plan keeps its 4-GPU base; Chiron drains the mixed instances it lent to the backlog
    # with it (issue 31): 1 to 4 left
    assert log["online"].iloc[-1] == 4 if pol == "fluid-plan" else 1 <= log["online"].iloc[-1] <= 4
    assert res.gpu_hours < 0.75 * 10 * 450.0 / 3600.0


def test_fluid_plan_measures_its_batch_instance_seconds():
    """The fluid-plan controller re-plans with a measured batch rate: batch requests done over the batch
    instances' GPU-seconds, counted per tick as (online batch instances) x tick. Those GPU-seconds are
    the area of the fleet log's online count above the 4-GPU base (batch instances start on tick times)."""
    from fluidopt.sim.api import make_engine

    from .test_orchestration import workflow

    sc, wl = workflow()
    ctrl = make_controller("fluid-plan", sc)
    eng = make_engine(sc, ctrl, horizon=450.0, seed=3, service="tokens", workload=wl)
    eng.start()
    eng.advance()
    res = eng.finish()
    log = res.meta["fleet_log"]
    t = list(log["time"]) + [450.0]
    area = sum(max(0, on - 4) * (t[k + 1] - t[k]) for k, on in enumerate(log["online"]))
    assert area > 100 and ctrl.batch_gpu_s == pytest.approx(area, abs=2 * ctrl.tick_interval)
    assert ctrl.plans and all(gh > 0 for _, gh in ctrl.plans)


def test_class_defaults_and_an_all_batch_split():
    from fluidopt.control.orchestration import Chiron, UtilisationAutoscaler

    c = Chiron(scenario())
    assert c.int_scaling is True and c.n_int >= 1
    assert UtilisationAutoscaler(scenario()).step == 0.25
    # every class named batch: no interactive load (its mean lengths default to 1 token), still builds
    allb = make_controller("chiron", scenario(), batch_classes=["interactive", "batch"])
    assert allb.inter == [] and allb.bat == [0, 1]


def test_fluid_plan_drains_down_to_its_target_and_no_further():
    """Little batch work left on four running batch instances: the plan's target is one instance
    (ceil of its mean batch GPUs), so it drains len(active) - target = 3, the idlest first, keeping one."""
    from .test_orchestration import workflow

    sc, _ = workflow()
    fp = make_controller("fluid-plan", sc)

    class State:
        now = 100.0

        def __init__(self):
            self.drained = []

        def gpu_online(self, g):
            return True

        def gpu_state(self, g):
            return "online"

        def gpu_decodes(self, g):
            return {4: 5, 5: 1, 6: 3, 7: 2}[g]

        def drain_gpu(self, g):
            self.drained.append(g)

    st = State()
    fp.pool_of = [0, 1, 1, 1, 2, 2, 2, 2, 2, 2]
    fp.batch_gpus = [4, 5, 6, 7, 8, 9]
    fp.mixed_done = fp.batch_done = 0
    fp.batch_gpu_s = 0.0
    fp.win4 = [(0.0, 0, 0, 0.0)]
    fp.startup = 20.0
    fp._batch_work = lambda ctx: (50, [4, 5, 6, 7])  # 50 batch requests left, four instances up
    fp.batch_deadline = lambda ctx: 400.0
    fp._global_autoscaler(st)
    target = 4 - len(st.drained)
    assert fp.plans and target == 1
    assert st.drained == [5, 7, 6]  # fewest decodes first
