"""The batch-means growth test (fluidopt.queueing.growth): exact batch means by hand, a path that grows
by construction, and the false-alarm rate on a stable M/M/1 queue."""

from __future__ import annotations

import numpy as np
import pytest

from fluidopt.core.errors import ScenarioError
from fluidopt.queueing.growth import batch_means, growth_test, number_in_system


def test_batch_means_by_hand():
    # N(t) = 1 on [0,1), 2 on [1,2), 3 on [2,3), 2 on [3,3.5), 1 on [3.5,4): the third never leaves
    arr, dep = [0.0, 1.0, 2.0], [3.0, 3.5, np.nan]
    assert batch_means(arr, dep, 0.0, 4.0, 2) == pytest.approx([1.5, (3 * 1 + 2 * 0.5 + 1 * 0.5) / 2])
    assert list(number_in_system(arr, dep, [0.5, 2.0, 3.2, 3.9])) == [1, 3, 2, 1]


def mm1(lam, mu, n, seed):
    rng = np.random.default_rng(seed)
    a = np.cumsum(rng.exponential(1 / lam, n))
    s = rng.exponential(1 / mu, n)
    d = np.empty(n)
    t = 0.0
    for i in range(n):  # Lindley: FCFS departures
        t = max(t, a[i]) + s[i]
        d[i] = t
    return a, d


def test_linear_growth_is_found_with_its_slope():
    # arrivals every 0.5 s, departures every 1 s: N grows by exactly 1 per second
    arr = np.arange(0, 1000, 0.5)
    dep = np.arange(1, 1001, 1.0)
    g = growth_test(arr, dep, 999.0)
    assert g.unstable and g.slope == pytest.approx(1.0, rel=1e-3)


def test_false_alarms_on_a_stable_queue_match_the_confidence():
    # M/M/1 at load 0.5 (correlation time ~ 8 / mu): 100 seeded runs of 4000 customers, test at 90%
    # confidence; the number of false alarms is Binomial(100, 0.1) if the batch means are i.i.d.
    # normal: 1..19 holds with probability > 0.99
    alarms = sum(growth_test(*mm1(1.0, 2.0, 4000, s), 4000 * 1.0 * 0.99, confidence=0.9).unstable for s in range(100))
    assert 1 <= alarms <= 19
    # and a queue at load 1.2 is found every time
    assert all(growth_test(*mm1(1.2, 1.0, 4000, s), 3000.0).unstable for s in range(20))


@pytest.mark.parametrize("kw", [dict(batches=2), dict(warmup=1.0), dict(confidence=1.0)])
def test_bad_settings(kw):
    with pytest.raises(ScenarioError):
        growth_test([0.0], [1.0], 1.0, **kw)
