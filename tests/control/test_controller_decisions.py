"""Single decisions of the controllers, checked against docs/controllers.md and docs/routing.md.

Two kinds of checks, both fast and deterministic:

* one decision at a time on a hand-written cluster view (``_View``): the state is set up by hand,
  the controller is asked once, and the action it takes is compared with the rule in the docs;
* short tokens-mode runs on a fixed trace (no randomness in the arrivals or the lengths) whose
  outcome follows from the rules by hand: which GPU a request lands on, that a policy with a KV
  capacity still serves every request FCFS, that the registered names build the documented classes.
"""

from __future__ import annotations

import numpy as np
import pytest
from builders import hand_scenario, replay_trace

from fluidopt.control.fcfs import ReservedPrefillFCFS
from fluidopt.control.gate_and_route import (
    MIXED_POOL,
    SOLO_POOL,
    GateAndRoute,
    PrioritizeAndRoute,
    SLIGateAndRoute,
    WeightedSLIGateAndRoute,
)
from fluidopt.control.load_balancers import ClassMeanOutput
from fluidopt.control.paper_baselines import FGSP, FIWSP, GFWSP, GIWSP
from fluidopt.control.protocol import DECODE_QUEUE
from fluidopt.control.registry import make_controller
from fluidopt.core.errors import ScenarioError
from fluidopt.fluid import solve_fluid


# -- a hand-written cluster view ---------------------------------------------------------------------
class _Set(list):
    def choice(self):
        return self[0] if self else -1


class _View:
    """Just enough of the Context for one decision; records the actions taken."""

    def __init__(self, *, cls=None, decode_waiting=None, free_decode=None, pool=None, rng=None):
        self.cls = cls or {}
        self.decode_waiting = decode_waiting or {}  # class -> list of requests in DECODE_QUEUE
        self.free = free_decode or {}  # pool -> GPUs with a free decode slot
        self.pool = pool or {}
        self.rng = rng or np.random.default_rng(0)
        self.started: list[tuple[int, int]] = []

    # view
    def req_class(self, r):
        return self.cls[r]

    def qlen(self, q, i=None):
        assert q == DECODE_QUEUE
        if i is None:
            return sum(len(v) for v in self.decode_waiting.values())
        return len(self.decode_waiting.get(i, []))

    def head(self, q, i=None):
        assert q == DECODE_QUEUE and i is not None
        w = self.decode_waiting.get(i, [])
        return w[0] if w else -1

    def free_decode(self, pool):
        return _Set(self.free.get(pool, []))

    def gpu_pool(self, g):
        return self.pool.get(g, MIXED_POOL)

    def gpu_prefill_allowed(self, g):
        return False

    def gpu_prefill(self, g):
        return -1

    def gpu_free(self, g):
        return 1 if g in self.free.get(self.gpu_pool(g), []) else 0

    def gpu_decodes(self, g):
        return 0

    def gpu_max_decodes(self, g):
        return 1

    # actions
    def start_decode(self, r, g):
        self.started.append((r, g))
        self.free[self.gpu_pool(g)].remove(g)
        for w in self.decode_waiting.values():
            if r in w:
                w.remove(r)


def _weighted(weights_mixed, weights_solo=None, p_solo=None, *, solo=False):
    k = len(weights_mixed)
    c = WeightedSLIGateAndRoute([0.1] * k, p_solo or [0.0] * k, weights_mixed, weights_solo or [0.0] * k)
    c._has_mixed, c._has_solo, c._kv = True, solo, False  # what setup() sets for a mixed-only fleet
    return c


def test_weighted_router_never_decodes_a_class_without_planned_flow():
    # docs/controllers.md: a class with weight 0 in the pool it is sent to waits (it is never decoded
    # there), a class with a positive weight starts on a free GPU of that pool
    c = _weighted([1.0, 0.0])
    v = _View(cls={7: 1, 8: 0}, free_decode={MIXED_POOL: [3]})
    c.on_prefill_done(v, 7, 0)
    assert v.started == []
    c.on_prefill_done(v, 8, 0)
    assert v.started == [(8, 3)]


def test_weighted_pick_class_is_proportional_to_the_weights_of_the_waiting_classes():
    # weights (1, 1, 2); classes 0 and 1 wait, class 2 does not: each is drawn with probability 1/2
    c = _weighted([1.0, 1.0, 2.0])
    v = _View(decode_waiting={0: [10], 1: [11]}, rng=np.random.default_rng(12345))
    picks = [c.pick_class(v, MIXED_POOL) for _ in range(4000)]
    assert set(picks) == {0, 1}
    share = picks.count(0) / len(picks)
    assert abs(share - 0.5) < 0.04  # 4000 draws: sd 0.008
    # nobody with a positive weight waits: -1
    assert c.pick_class(_View(decode_waiting={}), MIXED_POOL) == -1
    assert _weighted([0.0, 1.0]).pick_class(_View(decode_waiting={0: [5]}), MIXED_POOL) == -1


def test_weighted_freed_slot_pulls_a_waiting_decode():
    c = _weighted([1.0, 1.0])
    v = _View(cls={10: 0}, decode_waiting={0: [10]}, free_decode={MIXED_POOL: [2]})
    c.on_slot_freed(v, 2)
    assert v.started == [(10, 2)]


def test_weighted_router_rejects_weights_of_the_wrong_length():
    with pytest.raises(ScenarioError, match="weights_mixed: expected 2 values"):
        WeightedSLIGateAndRoute([0.1, 0.1], [0, 0], [1.0, 1.0, 1.0], [0.0, 0.0])
    with pytest.raises(ScenarioError, match="weights_solo: expected 2 values"):
        WeightedSLIGateAndRoute([0.1, 0.1], [0, 0], [1.0, 1.0], [0.0])


def test_sli_router_sends_decodes_to_the_planned_pool():
    c = SLIGateAndRoute([0.1, 0.1], [1.0, 0.0])
    c._has_mixed, c._has_solo, c._kv = True, True, False
    c._buf = [DECODE_QUEUE, DECODE_QUEUE]
    v = _View(cls={1: 0, 2: 1}, free_decode={MIXED_POOL: [0], SOLO_POOL: [5]}, pool={5: SOLO_POOL})
    c._free_mixed, c._free_solo = v.free_decode(MIXED_POOL), v.free_decode(SOLO_POOL)  # as _read_pools at setup
    c.on_prefill_done(v, 1, 0)  # p_solo = 1: solo pool
    c.on_prefill_done(v, 2, 0)  # p_solo = 0: mixed pool
    assert v.started == [(1, 5), (2, 0)]


# -- constructor and factory errors ------------------------------------------------------------------
def test_error_messages_name_the_bad_input():
    with pytest.raises(ScenarioError, match=r"PrioritizeAndRoute\.from_solution: expected the Scenario"):
        PrioritizeAndRoute.from_solution(solve_fluid(_scenario(), "separate"), None)
    with pytest.raises(ScenarioError, match="class-mean outputs: expected finite numbers >= 0"):
        ClassMeanOutput([1.0, -2.0])
    with pytest.raises(ScenarioError, match=r"prefill_gpus: expected 1\.\.2"):
        _run(_scenario(n=2), ReservedPrefillFCFS(prefill_gpus=3), [(0.0, 16, 4, 0)])
    with pytest.raises(ScenarioError, match="needs batch >= 2"):
        _run(_scenario(batch=1), ReservedPrefillFCFS(), [(0.0, 16, 4, 0)])


@pytest.mark.parametrize("name, cls", [
    ("gate-and-route", GateAndRoute), ("gg-sp", GateAndRoute), ("prioritize-and-route", PrioritizeAndRoute),
    ("sli-gate-and-route", SLIGateAndRoute), ("sli-weighted-gate-and-route", WeightedSLIGateAndRoute),
    ("sli-general", WeightedSLIGateAndRoute), ("gi-wsp", GIWSP), ("gf-wsp", GFWSP), ("fg-sp", FGSP),
    ("fi-wsp", FIWSP), ("fcfs", FIWSP), ("reserved-prefill-fcfs", ReservedPrefillFCFS),
])
def test_registered_names_build_the_documented_policy(name, cls):
    c = make_controller(name, _scenario())
    assert type(c) is cls


# -- short deterministic runs ------------------------------------------------------------------------
def _scenario(n=1, batch=4, kv=None, classes=("a", "b"), decode=(4, 4)):
    return hand_scenario(n, batch, tau_solo=0.01, chunk=16, kv=kv, classes=classes, prompt=16, decode=decode,
                         lengths="fixed")


def _run(sc, ctrl, rows, horizon=20.0, tmp_path=None, **kw):
    return replay_trace(sc, ctrl, rows, horizon=horizon, records=None if tmp_path is None else tmp_path / "rec.csv",
                        **kw)


# Four requests on one GPU whose 40-token KV cache holds at most two contexts: the third and fourth
# must wait for room while the GPU has no prefill running (the FCFS wait of FI-WSP and the gates'
# "KV full: the slot waits" branch), and all four complete in arrival order of their prefills.
KV_ROWS = [(0.0, 16, 8, 0), (0.001, 16, 8, 1), (0.03, 16, 8, 0), (0.06, 16, 8, 1)]


# (sli-weighted-gate-and-route is not here: on one GPU its plan has no mixed-pool decode weight, and a
# pool never decodes a class of weight 0 -- the documented rule, checked on a hand view above.)
@pytest.mark.parametrize("policy", ["fi-wsp", "gate-and-route", "gi-wsp", "gf-wsp", "fg-sp", "sli-gate-and-route",
                                    "reserved-prefill-fcfs"])
@pytest.mark.integration
def test_kv_limited_single_gpu_serves_everyone_fcfs(policy, tmp_path):
    sc = _scenario(kv=40)
    res, rec = _run(sc, policy, KV_ROWS, tmp_path=tmp_path)
    assert res.totals["completed"] == 4 and res.totals["dropped"] == 0
    first_token = rec["arrival"] + rec["ttft"]
    assert (rec["outcome"] == "completed").all()
    if policy in ("fi-wsp", "reserved-prefill-fcfs", "fg-sp"):  # FCFS across classes
        assert list(first_token.rank().astype(int)) == [1, 2, 3, 4]
    # one GPU: everything ran on GPU 0
    assert (rec["prefill_gpu"] == 0).all() and (rec["decode_gpu"] == 0).all()


def test_reserved_prefill_fcfs_decodes_on_the_decode_only_gpu_first(tmp_path):
    # n = 2, one prefill GPU: GPU 0 prefills (keeping its prefill slot), GPU 1 only decodes (B = 2)
    sc = _scenario(n=2, batch=2)
    rows = [(0.0, 16, 50, 0), (0.001, 16, 50, 0), (0.002, 16, 50, 0), (0.003, 16, 50, 0)]
    res, rec = _run(sc, ReservedPrefillFCFS(prefill_gpus=1), rows, tmp_path=tmp_path)
    assert res.totals["completed"] == 4
    assert (rec["prefill_gpu"] == 0).all()
    # prefills end one after another (FCFS); the first two decodes fill GPU 1's two slots, the third
    # takes GPU 0's single decode slot (B - 1 = 1), the fourth waits for a freed slot
    assert list(rec["decode_gpu"][:3]) == [1, 1, 0]
    assert list((rec["arrival"] + rec["ttft"]).rank().astype(int)) == [1, 2, 3, 4]
    # without decodes on the prefill GPU, every decode runs on GPU 1
    res, rec = _run(sc, ReservedPrefillFCFS(prefill_gpus=1, decode_on_prefill_gpus=False), rows, tmp_path=tmp_path)
    assert res.totals["completed"] == 4 and (rec["decode_gpu"] == 1).all()


def test_small_large_jsq_picks_the_instance_with_fewest_outstanding_tokens(tmp_path):
    # two small-group instances (0, 1) and one large (2); three small requests in quick succession.
    # JSQ: the first goes to 0 (all empty, lowest index), the second to 1 (0 holds tokens), the third
    # to 1 again (prompt 10 outstanding there against 100 on 0). Round robin would send it to 0.
    sc = _scenario(n=3, batch=4, decode=(2, 200))
    rows = [(0.0, 100, 2, 0), (0.0001, 10, 2, 0), (0.0002, 10, 2, 0), (0.0003, 10, 200, 1)]
    opts = {"within": "jsq", "small_gpus": 2}
    res, rec = _run(sc, "small-large", rows, tmp_path=tmp_path, controller_options=opts)
    assert list(rec["prefill_gpu"]) == [0, 1, 1, 2]
    res, rec = _run(sc, "small-large", rows, tmp_path=tmp_path, controller_options={"small_gpus": 2})
    assert list(rec["prefill_gpu"]) == [0, 1, 0, 2]  # round robin within the small group
