"""Output-length predictors: buckets, the noisy oracle's accuracy and neighbour rule, the trainable one."""

from __future__ import annotations

import numpy as np
import pytest

from fluidopt.core.errors import ScenarioError
from fluidopt.rl.predictors import BinnedPredictor, NoisyOracle, bucket_of, confusion_matrix


def test_bucket_edges():
    assert [bucket_of(x) for x in (1, 255, 256, 2047, 2048, 10**6)] == [0, 0, 1, 1, 2, 2]


def test_noisy_oracle_accuracy_and_neighbours():
    rng = np.random.default_rng(3)
    n = 20000
    t = np.cumsum(rng.exponential(0.05, n))
    o = rng.integers(1, 4000, n)
    p = rng.integers(1, 500, n)
    orc = NoisyOracle(0.79, seed=7)
    pred = np.array([orc.predict(t[i], 0, int(p[i]), int(o[i])) for i in range(n)])
    true = np.array([bucket_of(x) for x in o])
    acc = (pred == true).mean()
    assert abs(acc - 0.79) < 0.015  # binomial sd ~0.003
    wrong = pred != true
    assert np.all(np.abs(pred[wrong] - true[wrong]) == 1)  # errors go to a neighbouring bucket
    assert np.all(pred[true == 0] != 2) and np.all(pred[true == 2] != 0)
    # the middle bucket errs down and up about equally often
    mid = wrong & (true == 1)
    down = (pred[mid] == 0).mean()
    assert 0.45 < down < 0.55
    # same seed, same predictions, whatever the order of the calls
    again = [orc.predict(t[i], 0, int(p[i]), int(o[i])) for i in reversed(range(200))]
    assert again[::-1] == list(pred[:200])
    other = NoisyOracle(0.79, seed=8)
    assert [other.predict(t[i], 0, int(p[i]), int(o[i])) for i in range(500)] != list(pred[:500])


@pytest.mark.parametrize("accuracy,seed", [(0.79, 7), ([0.5, 0.9, 1.0, 0.0], 3), (1.0, 0), (0.0, 2**64 - 1)])
def test_predict_many_equals_predict_bit_for_bit(accuracy, seed):
    # the environment predicts a whole episode in bulk; it must give every request the bucket that the
    # per-request hash gives (including 64-bit wrap-around, masked prompt/output bits, class accuracy)
    rng = np.random.default_rng(1)
    n = 3000
    t = np.cumsum(rng.exponential(0.05, n))
    t[:2] = (0.0, 1e-300)
    c = rng.integers(0, 4, n)
    p = rng.integers(1, 1 << 26, n)
    o = rng.integers(1, 6000, n)
    o[2:9] = (255, 256, 2047, 2048, 1 << 24, (1 << 24) + 5, 1)
    orc = NoisyOracle(accuracy, seed=seed)
    many = orc.predict_many(t, c, p, o)
    one = [orc.predict(float(t[i]), int(c[i]), int(p[i]), int(o[i])) for i in range(n)]
    assert many.tolist() == one


def test_noisy_oracle_extremes_and_errors():
    assert NoisyOracle(1.0).predict(1.0, 0, 10, 300) == 1
    assert NoisyOracle(0.0).predict(1.0, 0, 10, 100) == 1  # always wrong: the only neighbour of bucket 0
    assert NoisyOracle([1.0, 0.0]).predict(1.0, 1, 10, 5000) == 1  # per class
    with pytest.raises(ScenarioError, match="accuracy"):
        NoisyOracle(1.5)
    with pytest.raises(ScenarioError, match="seed"):
        NoisyOracle(0.5, seed=-1)


def test_binned_predictor_learns_a_prompt_rule_and_confusion():
    rng = np.random.default_rng(0)
    p = rng.integers(16, 4096, 5000)  # every log2 bin holds >= min_count samples
    out = np.where(p < 512, 100, 1000)  # long prompts -> long outputs
    bp = BinnedPredictor().fit(p, out)
    pred = bp.predict_many(p)
    cm = confusion_matrix([bucket_of(x) for x in out], pred)
    assert cm.sum() == 5000
    assert np.trace(cm) == 5000  # the rule is exact at bin edges that are powers of two (512 = 2^9)
    # class labels: the class decides
    c = rng.integers(0, 2, 5000)
    out2 = np.where(c == 1, 3000, 50)
    bp2 = BinnedPredictor().fit(p, out2, c)
    assert (bp2.predict_many(p, c) == np.where(c == 1, 2, 0)).all()
