"""Property test: every paper controller keeps the simulator's invariants on random scenarios.

Hypothesis draws small fleets (1-6 GPUs, B = 2-8), 1-3 classes, random GPU laws and prices, either
service semantics and, in tokens mode, sometimes a KV capacity (preemptions, dropped prompts). Each
run uses ``check=True``: after every event the engine recounts its whole state (per-GPU slots and caps,
pool sets, queues, per-class conservation arrived = resolved + in system) and any invalid action raises
ActionError. On top of that we assert whole-run conservation and that gated controllers never prefill a
class whose LP target is zero.
"""

from __future__ import annotations

import numpy as np
import pytest
from builders import random_fleet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluidopt import GPUProfile, RequestClass, Scenario
from fluidopt.control.registry import make_controller
from fluidopt.fluid import solve_fluid
from fluidopt.sim.api import simulate

POLICIES = ("gate-and-route", "prioritize-and-route", "sli-gate-and-route", "sli-weighted-gate-and-route",
            "fi-wsp", "gi-wsp", "gf-wsp", "fg-sp")
GATED = {"gate-and-route", "sli-gate-and-route", "sli-weighted-gate-and-route", "gi-wsp", "gf-wsp"}


@st.composite
def cases(draw):
    s, service = random_fleet(draw)
    classes = s.classes
    policy = draw(st.sampled_from(POLICIES))
    opts = {}
    if policy.startswith("sli") and draw(st.booleans()):
        opts["slis"] = [draw(st.sampled_from(("decode_fairness=0.5", "prefill_fairness=0.05")))]
    if policy == "sli-weighted-gate-and-route" and "slis" not in opts and draw(st.booleans()):
        opts["pricing"] = "separate"  # q_d* > 0 is possible there: the case this policy is for
    # about 150 arrivals: enough events to exercise every code path, few enough to stay fast
    horizon = float(min(300.0, 150.0 / sum(c.rate for c in classes)))
    seed = draw(st.integers(0, 2**16))
    return s, policy, opts, service, horizon, seed


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@pytest.mark.integration
@given(cases())
def test_controllers_keep_engine_invariants(case):
    s, policy, opts, service, horizon, seed = case
    ctrl = make_controller(policy, s, **opts)
    res = simulate(s, ctrl, horizon=horizon, warmup=0.0, seed=seed, service=service, check=True, batches=2)
    t = res.totals
    assert t["requests"] == t["completed"] + t["abandoned"] + t["dropped"] + t["in_system"]
    assert t["requests"] > 0
    if policy in GATED:
        x = np.asarray(ctrl.x)
        prefilled = res.per_class["x_mean"].to_numpy()
        assert np.all(prefilled[x == 0] == 0.0), (policy, x, prefilled)


@pytest.mark.integration
@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_on_a_fleet_of_one(policy):
    """n = 1: M = 1 (the only GPU is mixed, no solo pool) or M = 0 is impossible with arrivals; still valid."""
    gpu = GPUProfile.from_gamma(alpha=0.0174, beta=6.2e-5, gamma=45.45, chunk=256, batch=4)
    s = Scenario(gpu=gpu, gpus=1, classes=(RequestClass("a", 300, 100, rate=0.5, patience=0.2),),
                 prefill_price=0.1, decode_price=0.2)
    sol = solve_fluid(s)
    ctrl = make_controller(policy, s)
    res = simulate(s, ctrl, horizon=200.0, seed=1, check=True, batches=2)
    assert res.totals["completed"] > 0
    if hasattr(ctrl, "mixed_gpus") and policy in ("gate-and-route", "fg-sp"):
        assert ctrl.mixed_gpus == 1 and sol.prefill_occupancy > 0
