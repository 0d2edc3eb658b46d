"""The last oracles for fluidopt.control.orchestration (issue 47's mutation run): the batch ITL option's
batch limit and rate, the utilisation autoscaler's refusals naming their option, QLM's freed slot on a
GPU whose request slots are all taken, and Chiron placing a decode on GPU 0 of a pool.

The scenario, the GPU law and the throughput ``thr`` are those of ``test_oracles_orchestration.py``
(uncalibrated: the fluid estimates, recomputed there by hand); the hand-built cluster is that of
``test_oracles_orchestration_more.py``. Imports work before and after the package split."""

from __future__ import annotations

import pytest
from fluidopt.errors import ScenarioError

from fluidopt.control.protocol import DECODE_QUEUE
from fluidopt.control.registry import make_controller

from .test_oracles_orchestration import B_MIX, MU_BAT, scenario, thr
from .test_oracles_orchestration_more import Cluster

try:
    from fluidopt.control.orchestration.common import BATCH, INTERACTIVE
except ImportError:  # one module before the split into a package
    from fluidopt.control.orchestration import BATCH, INTERACTIVE


@pytest.mark.parametrize("name", ["chiron", "qlm", "qlm-groups"])
def test_a_batch_itl_option_sets_the_batch_instances_limit_and_rate(name):
    # batch context 300 + 400 / 2 = 500: 0.033272 + 1.5e-6 b 500 <= 0.06 -> b = 35, the mixed limit;
    # without the option (no batch class has an ITL SLO) a batch instance keeps B - 1 = 63
    c = make_controller(name, scenario(4), batch_itl=0.06, calibrated=False)
    assert c.itl_bat == 0.06 and c.b_bat == B_MIX
    assert c.rates.b_bat == B_MIX and c.mu_bat == pytest.approx(thr(B_MIX, 300, 400), rel=1e-12)
    assert make_controller(name, scenario(4), calibrated=False).mu_bat == pytest.approx(MU_BAT, rel=1e-12)


def test_the_utilisation_autoscalers_thresholds_are_refused_by_name():
    from fluidopt.control.orchestration import UtilisationAutoscaler

    for opt in ("up", "down", "step"):
        with pytest.raises(ScenarioError) as e:
            UtilisationAutoscaler(scenario(), **{opt: -0.1})
        assert str(e.value) == f"utilisation-autoscaler: {opt}: expected a number > 0, got -0.1"


class SlotCluster(Cluster):
    """The hand-built cluster with ``slots[g]`` request slots per GPU (the simulator's B): a GPU's
    free slots are those less its prefill and its decodes."""

    def __init__(self, n, slots, **kw):
        super().__init__(n, **kw)
        self.slots = list(slots)

    def gpu_free(self, g):
        return self.slots[g] - len(self.dec[g]) - (g in self.pre)


def test_qlm_starts_no_decode_on_a_gpu_without_a_free_request_slot():
    q = make_controller("qlm", scenario(2), calibrated=False)
    # GPU 1: two decodes below its batch limit, but its 2 request slots are taken; GPU 0: 3 slots, 1 used
    st = SlotCluster(2, [3, 2], now=5.0, decodes={0: [90], 1: [91, 92]})
    for r in (90, 91, 92):
        st.add(r, 0, 0.0, q=None)
    st.add(5, 0, 3.0, DECODE_QUEUE)
    st.add(6, 1, 1.0, DECODE_QUEUE)
    q.setup(st)
    q.on_slot_freed(st, 1)
    assert st.log == []
    # GPU 0's two free slots take both waiting decodes, the interactive one first
    q.on_slot_freed(st, 0)
    assert st.log == [("decode", 5, 0), ("decode", 6, 0)]


class _Choose:
    def __init__(self, g):
        self.g = g

    def choice(self):
        return self.g


@pytest.mark.parametrize("batch", [False, True])
def test_chiron_decodes_on_gpu_0_when_its_pool_offers_it(batch):
    """The prefill ended on GPU 1, which is full; the pool of the request's kind (interactive, or batch)
    offers GPU 0 for the decode: it starts there."""
    c = make_controller("chiron", scenario(2), calibrated=False)
    pool = BATCH if batch else INTERACTIVE
    c.pool_of, c.mixed_gpus = [pool, pool], []
    c.lent, c.bmode = [False, False], [False, False]
    c.fd = [_Choose(-1)] * 3
    c.fd[pool] = _Choose(0)
    st = Cluster(2, now=10.0, decodes={1: list(range(100, 100 + B_MIX))})
    for r in range(100, 100 + B_MIX):
        st.add(r, int(batch), 0.0, q=None)
    st.add(8, int(batch), 9.0, q=None)
    assert c._place_decode(st, 8, 1) is True
    assert st.log == [("decode", 8, 0)]
