"""The length distributions' second moments (a law's quadratic terms average over them) against large
samples of the samplers the simulator draws from."""

from __future__ import annotations

import numpy as np
import pytest

from fluidopt.workloads.synthetic import Empirical, Exponential, Fixed, LogNormal


@pytest.mark.parametrize("law", [Fixed(300), Fixed(300.5), Exponential(1.0), Exponential(250.0), LogNormal(800.0, 0.9),
                                 LogNormal(2.0, 0.3), Empirical([1, 5, 9, 9, 40])])
def test_second_moment_matches_the_sampler(law):
    x = law.sample(np.random.default_rng(7), 2_000_000).astype(float)
    m2 = float(np.mean(x * x))
    se = float(np.std(x * x)) / np.sqrt(x.size)
    assert law.second_moment == pytest.approx(m2, abs=max(5 * se, 0.3))
