"""Abandonment from any queue is exact: the waits of never-served requests are i.i.d. Exp(theta).

(It replaces a 400-request check with a +-15% window, 3 standard errors of a 5% standard error.)
20,000 requests are
parked in a named queue (class a) or in an instance queue (class b) and never served, so each one's
wait is its patience, Exp(theta = 2) (mean 0.5 s), whatever the others do (the engine races the
abandonment clocks of everyone waiting; exact by memorylessness). The mean of 10,000 such waits has a
standard deviation of 0.5 / 100 = 1%; the window is 4 of them, and the whole sample must pass a
Kolmogorov-Smirnov test against Exp(2) at p > 1e-4. A patience rate off by 10% fails both (tried).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fluidopt.control.protocol import WAIT_PREFILL, Controller
from fluidopt.core.model import GPUProfile, RequestClass, Scenario
from fluidopt.sim.api import simulate
from fluidopt.workloads import TraceWarning, TraceWorkload

THETA = 2.0
N = 20_000  # requests, alternating classes, one every 10 ms


class Park(Controller):
    """Class a waits in a named queue, class b in GPU 1's instance queue; nobody is ever served."""

    def __init__(self):
        self.seen: list[int] = []

    def setup(self, ctx):
        self.q = ctx.add_queue("park")
        self.iq = ctx.instance_queue(1)

    def on_arrival(self, ctx, r):
        ctx.enqueue(r, self.q if ctx.req_class(r) == 0 else self.iq)

    def on_abandon(self, ctx, r, q):
        assert ctx.req_phase(r) == WAIT_PREFILL
        self.seen.append(q)


@pytest.mark.integration
def test_abandonment_from_any_queue_is_exactly_exponential(tmp_path):
    gpu = GPUProfile(alpha=0.01, beta=0.001, tau_solo=0.005, chunk=10, batch=3)
    sc = Scenario(gpu=gpu, gpus=2, classes=tuple(RequestClass(nm, prompt=20, decode=5, rate=1.0, patience=THETA)
                                                 for nm in ("a", "b")), prefill_price=1.0, decode_price=1.0)
    rows = pd.DataFrame([(0.01 * k, 5, 5, k % 2) for k in range(N)], columns=["time", "prompt", "output", "cls"])
    ctrl = Park()
    path = tmp_path / "rec.csv"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        res = simulate(sc, ctrl, horizon=0.01 * N + 20.0, seed=5, workload=TraceWorkload(rows, ("a", "b")),
                       records=path, batches=2)
    assert res.totals["abandoned"] == N == len(ctrl.seen)
    assert sorted(set(ctrl.seen)) == sorted({ctrl.q, ctrl.iq})
    rec = pd.read_csv(path)
    assert (rec.outcome == "abandoned_prefill").all()
    np.testing.assert_allclose(rec.wait_prefill, rec.end - rec.arrival, rtol=1e-12, atol=1e-12)
    sd = (1 / THETA) / math.sqrt(N / 2)  # of one class's mean wait: 1%
    for name in ("a", "b"):
        w = rec.wait_prefill[rec["class"] == name].to_numpy()
        assert w.size == N // 2
        assert abs(w.mean() - 1 / THETA) <= 4 * sd, f"{name}: mean wait {w.mean():.5f} vs 0.5 (4 sd = {4 * sd:.5f})"
        # the reported mean is the records' mean (all arrived in the window and were resolved)
        assert res.per_class.loc[name, "wait_prefill_mean"] == pytest.approx(w.mean(), rel=1e-9)
        assert res.per_class.loc[name, "abandoned_prefill_fraction"] == 1.0
    ks = stats.kstest(rec.wait_prefill.to_numpy(), "expon", args=(0.0, 1 / THETA))
    assert ks.pvalue > 1e-4, f"waits are not Exp({THETA}): KS D = {ks.statistic:.4f}, p = {ks.pvalue:.2g}"
