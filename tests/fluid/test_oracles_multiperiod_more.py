"""More oracles for fluidopt.fluid.multiperiod (issue 35, the second mutation rerun): the batch limit
of a GPU with room for one decode, and the instance types' rates under a batch ITL target."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fluidopt.core.model import GPUProfile
from fluidopt.fluid.multiperiod import largest_batch, mean_context, type_rates


@pytest.mark.parametrize("B", [1, 2])
def test_a_gpu_with_room_for_one_decode_keeps_a_batch_of_one(B):
    gpu = GPUProfile(alpha=0.02, beta=0.0, tau_solo=0.01, chunk=100, batch=B, kv_time_per_token=1e-5)
    assert largest_batch(gpu, None, 500.0) == 1
    assert largest_batch(gpu, 10.0, 500.0) == 1  # any ITL target: B - 1 = 1 (at least 1)


def test_each_types_batch_limit_follows_the_batch_itl():
    """The workflow-mix types, each with its own GPU law: with a 0.06 s batch ITL, b_bat =
    floor((0.06 - tau_mix) / (kv_time_per_token ctx_b)) (fast: tau_mix = 0.0174 + 6.2e-5 x 256 =
    0.033272 s, 1.5e-6 s per token: 35); without one, B - 1."""
    from fluidopt.scenario import load_scenario

    sc = load_scenario(Path(__file__).resolve().parents[2] / "examples/scenarios/chiron-workflow-mix.toml")
    ctx_b = mean_context(sc.classes[1])
    gpus = {t.name: t.gpu for t in sc.fleet.types}
    with_itl = type_rates(sc, batch_itl=0.06, calibrated=False)
    assert [t.name for t in with_itl] == ["fast", "cheap"]
    for t in with_itl:
        g = gpus[t.name]
        want = math.floor((0.06 - (g.alpha + g.beta * g.chunk)) / (g.kv_time_per_token * ctx_b))
        assert 1 < want < g.batch - 1 and t.rates.b_bat == want
    assert with_itl[0].rates.b_bat == 35
    for t in type_rates(sc, calibrated=False):
        assert t.rates.b_bat == gpus[t.name].batch - 1
