"""The model dataclasses: derived rates against the paper's formulas, identities, validation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import GPUProfile, RequestClass, Scenario, paper_gpu, paper_scenario

ALPHA, BETA, GAMMA, C, B = 0.0174, 6.2e-5, 45.45, 256, 16
TAU = ALPHA + BETA * C  # 0.033272 s


def test_paper_gpu_law():
    g = paper_gpu()
    assert g.tau_mix == pytest.approx(0.033272, rel=1e-12)
    assert g.tau_solo == pytest.approx(1 / 45.45) and g.gamma == pytest.approx(45.45)
    assert (g.chunk, g.batch) == (C, B)
    # Prop. 3.2: gamma * tau = 1.512 >= (B-1)/B = 0.9375, so the bundled LP needs no decode buffer.
    assert g.gamma * g.tau_mix == pytest.approx(1.5122124, rel=1e-6)
    assert g.decode_buffer_free


def test_decode_buffer_condition_boundary():
    # gamma * tau == (B-1)/B exactly: the condition holds (>=); a hair slower solo GPU breaks it.
    at = GPUProfile(alpha=0.5, beta=0.0, tau_solo=1.0, chunk=1, batch=2)
    assert at.gamma * at.tau_mix == 0.5 and at.decode_buffer_free
    below = dataclasses.replace(at, tau_solo=1.0 + 1e-9)
    assert not below.decode_buffer_free


def test_rates_of_the_paper_instance():
    s = paper_scenario()
    r = s.rates()
    P, D = np.array([300.0, 3000.0]), np.array([1000.0, 400.0])
    np.testing.assert_allclose(r.lam, [0.5, 0.5], rtol=1e-15)
    np.testing.assert_allclose(r.theta, [0.1, 0.1])
    np.testing.assert_allclose(r.mu_p, C / (P * TAU), rtol=1e-12)
    np.testing.assert_allclose(r.mu_m, 1 / (D * TAU), rtol=1e-12)
    np.testing.assert_allclose(r.mu_s, GAMMA / D, rtol=1e-12)
    np.testing.assert_allclose(r.mu_p, [25.647191, 2.5647191], rtol=1e-7)  # prefills/s per prefill slot
    np.testing.assert_allclose(r.w, [0.1 * 300 + 0.2 * 1000, 0.1 * 3000 + 0.2 * 400])  # 230, 380
    assert r.mu_p.dtype == np.float64


def test_rate_identities_behind_the_lps():
    """Identities the fluid model (docs/model.md) relies on: the solo/mixed decode ratio is gamma*tau for every class,
    and under uniform prices the separate objective's coefficients do not depend on the class."""
    s = Scenario(
        gpu=paper_gpu(), gpus=50,
        classes=tuple(RequestClass(f"c{i}", prompt=p, decode=d, rate=5.0) for i, (p, d) in
                      enumerate([(61, 331), (123, 142), (992, 182), (1139, 273)])),
        prefill_price=0.3, decode_price=0.7,
    )
    r, g = s.rates(), s.gpu
    np.testing.assert_allclose(r.mu_s / r.mu_m, g.gamma * g.tau_mix, rtol=1e-12)
    np.testing.assert_allclose(r.prefill_reward * r.mu_p, 0.3 * g.chunk / g.tau_mix, rtol=1e-12)  # c_p C / tau
    np.testing.assert_allclose(r.decode_reward * r.mu_m, 0.7 / g.tau_mix, rtol=1e-12)  # c_d / tau
    np.testing.assert_allclose(r.decode_reward * r.mu_s, 0.7 * g.gamma, rtol=1e-12)  # c_d gamma


def test_per_gpu_rates_are_invariant_under_fleet_scaling():
    s = paper_scenario(gpus=500)
    small = s.with_gpus(20)
    assert small.gpus == 20
    assert [c.rate for c in small.classes] == pytest.approx([10.0, 10.0])  # 0.5 per GPU
    for f in ("lam", "mu_p", "mu_m", "mu_s", "w"):
        np.testing.assert_allclose(getattr(small.rates(), f), getattr(s.rates(), f), rtol=1e-12)
    assert paper_scenario(gpus=20, lam=(0.25, 0.4), theta=(0.0, 1.0)).rates().lam == pytest.approx([0.25, 0.4])


def test_prices_and_per_class_overrides():
    s = paper_scenario().with_prices(decode=0.5)
    assert (s.prefill_price, s.decode_price) == (0.1, 0.5)
    c0 = dataclasses.replace(s.classes[0], prefill_price=0.0, decode_price=1.0)
    s2 = dataclasses.replace(s, classes=(c0, s.classes[1]))
    cp, cd = s2.class_prices()
    np.testing.assert_array_equal(cp, [0.0, 0.1])
    np.testing.assert_array_equal(cd, [1.0, 0.5])
    r = s2.rates()
    np.testing.assert_allclose(r.prefill_reward, [0.0, 300.0])
    np.testing.assert_allclose(r.decode_reward, [1000.0, 200.0])
    np.testing.assert_allclose(r.w, [1000.0, 500.0])


def test_dataclasses_are_frozen_and_hashable():
    s = paper_scenario()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.gpus = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.gpu.alpha = 1.0  # type: ignore[misc]
    assert hash(s) == hash(paper_scenario())
    assert dataclasses.replace(s, meta={"note": 1}) == s  # meta is not part of equality


def test_numpy_integers_are_accepted():
    g = GPUProfile(alpha=np.float64(0.01), beta=np.float32(1e-5), tau_solo=0.02, chunk=np.int64(128), batch=np.int32(8))
    assert g.chunk == 128 and isinstance(g.chunk, np.integer)  # validated, stored as given
    assert g.tau_mix == pytest.approx(0.01 + 1e-5 * 128, rel=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"alpha": -0.1}, r"gpu.alpha: expected a number >= 0, got -0.1"),
        ({"alpha": "0.1"}, r"gpu.alpha: expected a number, got '0.1' \(str\)"),
        ({"beta": True}, r"gpu.beta: expected a number, got True \(bool\)"),
        ({"tau_solo": 0}, r"gpu.tau_solo: expected a number > 0, got 0"),
        ({"tau_solo": float("inf")}, r"gpu.tau_solo: expected a finite number, got inf"),
        ({"chunk": 256.0}, r"gpu.chunk: expected an integer, got 256.0 \(float\)"),
        ({"chunk": 0}, r"gpu.chunk: expected an integer >= 1, got 0"),
        ({"batch": True}, r"gpu.batch: expected an integer, got True \(bool\)"),
        ({"alpha": 0.0, "beta": 0.0}, r"gpu: alpha \+ beta \* chunk must be > 0, got 0.0"),
        ({"kv_capacity": -1}, r"gpu.kv_capacity: expected a number > 0, got -1"),
        ({"kv_time_per_token": -1e-9}, r"gpu.kv_time_per_token: expected a number >= 0"),
    ],
)
def test_gpu_profile_validation(kwargs, pattern):
    base = {"alpha": ALPHA, "beta": BETA, "tau_solo": 1 / GAMMA, "chunk": C, "batch": B}
    with pytest.raises(ScenarioError, match=pattern):
        GPUProfile(**{**base, **kwargs})


def test_from_gamma_validates_gamma():
    assert GPUProfile.from_gamma(ALPHA, BETA, 50.0, C, B).tau_solo == 0.02
    for bad, pat in ((0, "> 0, got 0"), (-1.0, "> 0, got -1.0"), ("fast", "expected a number")):
        with pytest.raises(ScenarioError, match=f"gpu.gamma: .*{pat}"):
            GPUProfile.from_gamma(ALPHA, BETA, bad, C, B)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"name": ""}, r"classes.name: expected a non-empty string, got ''"),
        ({"name": None}, r"classes.name: expected a non-empty string, got None"),
        ({"prompt": 0}, r"classes\[a\].prompt: expected a number > 0, got 0"),
        ({"decode": -1}, r"classes\[a\].decode: expected a number > 0, got -1"),
        ({"rate": 0}, r"classes\[a\].rate: expected a number > 0, got 0"),
        ({"patience": -0.5}, r"classes\[a\].patience: expected a number >= 0, got -0.5"),
        ({"prefill_price": -1}, r"classes\[a\].prefill_price: expected a number >= 0"),
        ({"decode_price": float("nan")}, r"classes\[a\].decode_price: expected a finite number"),
        ({"lengths": "normal"}, r"classes\[a\].lengths: expected one of exponential, fixed, lognormal, got 'normal'"),
        ({"lengths": "lognormal", "prompt_sigma": 0.5}, r"classes\[a\]: lengths = 'lognormal' needs prompt_sigma"),
        ({"decode_sigma": 0}, r"classes\[a\].decode_sigma: expected a number > 0, got 0"),
    ],
)
def test_request_class_validation(kwargs, pattern):
    base = {"name": "a", "prompt": 100, "decode": 200, "rate": 1.0}
    with pytest.raises(ScenarioError, match=pattern):
        RequestClass(**{**base, **kwargs})


def test_scenario_validation():
    g = paper_gpu()
    a = RequestClass("a", prompt=1, decode=1, rate=1)
    with pytest.raises(ScenarioError, match="classes: expected at least one request class, got none"):
        Scenario(gpu=g, gpus=1, classes=())
    with pytest.raises(ScenarioError, match="classes: expected RequestClass items, got dict"):
        Scenario(gpu=g, gpus=1, classes=({"name": "a"},))  # type: ignore[arg-type]
    with pytest.raises(ScenarioError, match="class names must be unique, repeated: a"):
        Scenario(gpu=g, gpus=1, classes=(a, dataclasses.replace(a, prompt=5)))
    with pytest.raises(ScenarioError, match=r"cluster.gpus: expected an integer >= 1, got 0"):
        Scenario(gpu=g, gpus=0, classes=(a,))
    with pytest.raises(ScenarioError, match=r"gpu: expected a GPUProfile, got dict"):
        Scenario(gpu={"alpha": 1}, gpus=1, classes=(a,))  # type: ignore[arg-type]
    with pytest.raises(ScenarioError, match=r"pricing.decode: expected a number >= 0, got -1"):
        Scenario(gpu=g, gpus=1, classes=(a,), decode_price=-1)
    s = Scenario(gpu=g, gpus=1, classes=[a])  # a list is accepted and stored as a tuple
    assert isinstance(s.classes, tuple) and s.n_classes == 1 and s.class_names == ("a",)
