"""QLMGroups' instance plan (fluidopt/control/orchestration/chiron.py, ``QLMGroups._plan``) on a hand-built
state: a model with work and no instance gets its first one from a model with a surplus, whether its work
waits or is already running (a busy model needs at least one instance), and a model with nothing to do
gets none. Two models: 'A' (the interactive class), 'B' (the batch class); three GPUs, all given to A."""

from __future__ import annotations

from fluidopt.control.registry import make_controller

from .test_oracles_orchestration import scenario
from .test_oracles_orchestration_more import Cluster


def planned(st):
    q = make_controller("qlm-groups", scenario(3), calibrated=False, models={"interactive": "A", "batch": "B"})
    q.setup(st)
    assert q.models == ["A", "B"]
    q.target = ["A"] * 3  # every instance planned for A
    q._plan(st)
    return q


def test_a_model_with_one_waiting_request_gets_its_first_instance():
    st = Cluster(3, now=100.0)
    st.add(7, 1, 50.0)  # one batch request waits: B needs max(tiny, 1) = 1 instance
    q = planned(st)
    assert sorted(q.target) == ["A", "A", "B"] and q.k_of == {"A": 2, "B": 1}


def test_a_busy_model_with_nothing_waiting_gets_its_first_instance():
    st = Cluster(3, now=100.0, decodes={0: [7]})  # a batch request still decoding on an instance of A
    st.add(7, 1, 50.0, q=None)
    q = planned(st)
    assert sorted(q.target) == ["A", "A", "B"]


def test_a_model_without_work_gets_nothing():
    st = Cluster(3, now=100.0)
    q = planned(st)
    assert q.target == ["A"] * 3
