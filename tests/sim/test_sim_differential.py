"""Differential test: the two service semantics agree where they must.

With chunk C = 1 a prefill of P tokens takes P mixed iterations, so its mean duration P_i tau_mix is
the markov model's 1/mu_p,i; a decode of D tokens takes D iterations of its GPU's current mode, mean
D_i tau (mixed) or D_i / gamma (solo) = 1/mu_m,i, 1/mu_s,i. With geometric ("exponential") lengths
and many GPUs the per-class throughputs, occupancies and queues of ``markov`` and ``tokens`` must then
agree within sampling error. What may differ is of the order of one iteration per phase (work joins
at the next iteration boundary; a few ms against service times of seconds here).
"""

from __future__ import annotations

import numpy as np
import pytest
from builders import semantics_scenario
from scipy import stats

from fluidopt.sim.api import simulate

T = stats.t.ppf(0.975, 19)


@pytest.mark.integration
@pytest.mark.slow  # about 11 s on the pure-Python engine; it meets this scenario in test_sim_backends.py instead
def test_markov_and_tokens_agree_within_sampling_error():
    sc = semantics_scenario(300)
    res = {s: simulate(sc, "fi-wsp", horizon=1200.0, warmup=150.0, seed=1, service=s) for s in ("markov", "tokens")}
    ci = {s: r.ci.set_index(["metric", "class"]) for s, r in res.items()}
    checked = 0
    for m in ("throughput", "x_mean", "y_mixed_mean", "y_solo_mean", "q_prefill_mean", "abandoned_fraction"):
        for c in ("short", "long"):
            a, b = res["markov"].per_class.loc[c, m], res["tokens"].per_class.loc[c, m]
            se = np.hypot(ci["markov"].loc[(m, c), "half_width"], ci["tokens"].loc[(m, c), "half_width"]) / T
            assert abs(a - b) <= 4 * se, f"{m}[{c}]: markov {a:.6g} vs tokens {b:.6g} (4 se = {4 * se:.3g})"
            if m in ("throughput", "x_mean", "y_mixed_mean", "y_solo_mean"):
                assert se <= 0.02 * abs(a), f"{m}[{c}]: standard error {se:.3g} too large to be informative"
            checked += 1
    assert checked == 12
    # the same arrivals drive both runs (common random numbers)
    assert res["markov"].totals["requests"] == res["tokens"].totals["requests"]
