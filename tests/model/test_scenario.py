"""Scenario loading: the shipped example, round trips, named GPU profiles, and every kind of bad input."""

from __future__ import annotations

import copy
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fluidopt import default_scenario, load_scenario, loads_scenario, scenario_from_dict
from fluidopt.calibration import load_profile
from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import RequestClass, Scenario
from fluidopt.scenario import gpu_from_dict, scenario_to_dict

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "scenarios" / "paper-two-class.toml"


# ------------------------------------------------------------------------------------------------
# A minimal TOML writer (floats via repr, which TOML reads back exactly), for true round trips.
# ------------------------------------------------------------------------------------------------
def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "inf" if v == math.inf else repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise TypeError(type(v))


def to_toml(d: dict[str, Any]) -> str:
    out = [f"{k} = {_value(v)}" for k, v in d.items() if not isinstance(v, (dict, list))]
    for k, v in d.items():
        if isinstance(v, dict):
            out.append(f"[{k}]")
            out += [f"{kk} = {_value(vv)}" for kk, vv in v.items()]
    for k, v in d.items():
        if isinstance(v, list):
            for item in v:
                out.append(f"[[{k}]]")
                out += [f"{kk} = {_value(vv)}" for kk, vv in item.items()]
    return "\n".join(out) + "\n"


def base() -> dict[str, Any]:
    """A valid scenario dict (the shipped example's content)."""
    return tomllib.loads(EXAMPLE.read_text())


def expect_error(d: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ScenarioError, match=pattern):
        scenario_from_dict(d)


# ------------------------------------------------------------------------------------------------
# The example file, the default, round trips
# ------------------------------------------------------------------------------------------------
def test_example_matches_default_in_every_number():
    s, d = load_scenario(EXAMPLE), default_scenario()
    assert s.classes == d.classes and s.gpus == d.gpus and s.name == d.name == "paper-two-class"
    assert (s.prefill_price, s.decode_price) == (d.prefill_price, d.decode_price) == (0.1, 0.2)
    assert replace(s.gpu, name="") == replace(d.gpu, name="")
    rs, rd = s.rates(), d.rates()
    for f in ("lam", "theta", "mu_p", "mu_m", "mu_s", "prefill_reward", "decode_reward"):
        assert (getattr(rs, f) == getattr(rd, f)).all(), f


def test_example_equals_default_scenario():
    assert load_scenario(EXAMPLE) == default_scenario()


def test_default_aliases():
    assert load_scenario() == load_scenario("default") == load_scenario("paper-two-class") == default_scenario()
    assert default_scenario(gpus=20).gpus == 20
    assert default_scenario(gpus=20).rates().lam == pytest.approx(default_scenario().rates().lam)


@pytest.mark.parametrize("scenario", [default_scenario(), load_scenario(EXAMPLE)])
def test_round_trip_dict_and_toml(scenario):
    d = scenario_to_dict(scenario)
    assert scenario_from_dict(d) == scenario
    text = to_toml(d)
    assert loads_scenario(text) == scenario
    assert scenario_to_dict(loads_scenario(text)) == d


def test_round_trip_keeps_optional_fields():
    g = replace(default_scenario().gpu, kv_capacity=30000.0, kv_time_per_token=7e-7, name="v")
    classes = (
        RequestClass("a", prompt=100, decode=50, rate=3.0, patience=0.0, prefill_price=0.5, lengths="fixed"),
        RequestClass("b", prompt=1e3, decode=20, rate=0.5, patience=2.5, decode_price=0.0, lengths="lognormal",
                     prompt_sigma=0.8, decode_sigma=1.1),
    )
    s = Scenario(gpu=g, gpus=7, classes=classes, prefill_price=0.0, decode_price=1.5, name="opt")
    assert loads_scenario(to_toml(scenario_to_dict(s))) == s


def test_gamma_and_tau_solo_forms_agree():
    d = base()
    d["gpu"].pop("gamma")
    d["gpu"]["tau_solo"] = 1 / 45.45
    assert scenario_from_dict(d).gpu == load_scenario(EXAMPLE).gpu


def test_integral_float_is_accepted_where_an_integer_is_expected():
    d = base()
    d["gpu"]["chunk"] = 256.0
    d["cluster"]["gpus"] = 500.0
    s = scenario_from_dict(d)
    assert s.gpu.chunk == 256 and isinstance(s.gpu.chunk, int) and s.gpus == 500


def test_name_defaults_to_file_stem(tmp_path):
    d = base()
    d.pop("name")
    p = tmp_path / "my-fleet.toml"
    p.write_text(to_toml(d))
    assert load_scenario(p).name == "my-fleet"
    assert scenario_from_dict(d).name == "scenario"


# ------------------------------------------------------------------------------------------------
# Named GPU profiles
# ------------------------------------------------------------------------------------------------
def test_named_gpu_profile():
    d = base()
    d["gpu"] = "qwen-8b-a100"
    s = scenario_from_dict(d)
    assert s.gpu == load_profile("qwen-8b-a100")
    assert s.gpu.name == "qwen-8b-a100"
    assert replace(s, gpu=replace(s.gpu, name="paper")) == default_scenario()
    d["gpu"] = "qwen-4b-a100"
    assert scenario_from_dict(d).gpu.gamma == pytest.approx(52.63)


def test_named_gpu_profile_from_toml_text():
    text = EXAMPLE.read_text()
    head, rest = text.split("[gpu]", 1)
    rest = rest.split("[cluster]", 1)[1]
    s = loads_scenario(head + 'gpu = "llama2-7b-v100"\n[cluster]' + rest)
    assert s.gpu.batch == 128 and s.gpu.kv_capacity == 30000


def test_unknown_named_profile_lists_known_names():
    d = base()
    d["gpu"] = "h100-dream"
    expect_error(d, r"gpu: unknown GPU profile 'h100-dream'; known profiles: qwen-8b-a100, qwen-4b-a100, llama2-7b-v100")


# ------------------------------------------------------------------------------------------------
# Bad input: every error names the field, the value and what was expected
# ------------------------------------------------------------------------------------------------
def _set(d: dict, path: str, value: Any) -> dict:
    d = copy.deepcopy(d)
    *parents, last = path.split(".")
    node: Any = d
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    key: Any = int(last) if isinstance(node, list) else last
    if value is _DELETE:
        del node[key]
    else:
        node[key] = value
    return d


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "pattern"),
    [
        # unknown keys, at every level
        ("colour", "red", (r"scenario: unknown key 'colour'; expected one of classes, cluster, description, gpu, name, "
                          r"pricing")),
        ("gpu.alpah", 0.1, r"gpu: unknown key 'alpah' \(did you mean 'alpha'\?\); expected one of alpha, batch, beta, chunk, gamma"),
        ("cluster.nodes", 3, r"cluster: unknown key 'nodes'; expected one of gpus"),
        ("pricing.input", 0.1, r"pricing: unknown key 'input'; expected one of decode, prefill"),
        ("classes.0.prompt_len", 3, r"classes\[0\]: unknown key 'prompt_len' \(did you mean 'prompt'\?\); expected one of decode, decode_price"),
        # missing fields
        ("gpu", _DELETE, r"scenario.gpu: missing required field"),
        ("cluster", _DELETE, r"scenario.cluster: missing required field"),
        ("classes", _DELETE, r"scenario.classes: missing required field"),
        ("gpu.alpha", _DELETE, r"gpu.alpha: missing required field"),
        ("gpu.batch", _DELETE, r"gpu.batch: missing required field"),
        ("cluster.gpus", _DELETE, r"cluster.gpus: missing required field"),
        ("classes.1.rate", _DELETE, r"classes\[1\].rate: missing required field"),
        ("classes.0.name", _DELETE, r"classes\[0\].name: missing required field"),
        # wrong types
        ("gpu.alpha", "0.0174", r"gpu.alpha: expected a number, got '0.0174' \(str\)"),
        ("gpu.beta", True, r"gpu.beta: expected a number, got True \(bool\)"),
        ("gpu.chunk", 256.5, r"gpu.chunk: expected an integer, got 256.5 \(float\)"),
        ("gpu.batch", "16", r"gpu.batch: expected an integer, got '16' \(str\)"),
        ("gpu.batch", False, r"gpu.batch: expected an integer, got False \(bool\)"),
        ("cluster.gpus", 2.5, r"cluster.gpus: expected an integer, got 2.5 \(float\)"),
        ("cluster.gpus", True, r"cluster.gpus: expected an integer, got True \(bool\)"),
        ("pricing.decode", "cheap", r"pricing.decode: expected a number, got 'cheap' \(str\)"),
        ("classes.0.prompt", "300", r"classes\[0\].prompt: expected a number, got '300' \(str\)"),
        ("classes.0.patience", True, r"classes\[0\].patience: expected a number, got True \(bool\)"),
        ("classes.0.name", 7, r"classes\[0\].name: expected a non-empty string, got 7"),
        ("classes.0.name", "", r"classes\[0\].name: expected a non-empty string, got ''"),
        ("classes.0.lengths", 3, r"classes\[0\].lengths: expected a string, got 3"),
        ("classes.0.lengths", "gamma", (r"classes\[short-prompt\].lengths: expected one of exponential, fixed, "
                                       r"lognormal, got 'gamma' \(in classes\[0\]\)")),
        ("gpu.name", 3, r"gpu.name: expected a string, got 3"),
        ("name", 3, r"name: expected a string, got 3"),
        ("gpu", 3, r"gpu: expected a table, got 3 \(int\)"),
        ("cluster", [1], r"cluster: expected a table, got \[1\] \(list\)"),
        ("pricing", "free", r"pricing: expected a table, got 'free' \(str\)"),
        ("classes", {"name": "a"}, r"classes: expected a non-empty array of tables \(\[\[classes\]\]\)"),
        ("classes", [], r"classes: expected a non-empty array of tables"),
        ("classes.0", "short", r"classes\[0\]: expected a table, got 'short' \(str\)"),
        # non-positive sizes and rates, negative patience and prices
        ("gpu.chunk", 0, r"gpu.chunk: expected an integer >= 1, got 0"),
        ("gpu.batch", -16, r"gpu.batch: expected an integer >= 1, got -16"),
        ("cluster.gpus", 0, r"cluster.gpus: expected an integer >= 1, got 0"),
        ("gpu.alpha", -0.01, r"gpu.alpha: expected a number >= 0, got -0.01"),
        ("gpu.beta", -1e-5, r"gpu.beta: expected a number >= 0, got -1e-05"),
        ("gpu.gamma", 0, r"gpu.gamma: expected a (finite )?number > 0, got 0"),
        ("gpu.gamma", -45.45, r"gpu.gamma: expected a (finite )?number > 0, got -45.45"),
        ("gpu.alpha", math.nan, r"gpu.alpha: expected a finite number, got nan"),
        ("gpu.kv_capacity", 0, r"gpu.kv_capacity: expected a number > 0, got 0"),
        ("gpu.kv_time_per_token", -1e-7, r"gpu.kv_time_per_token: expected a number >= 0"),
        ("classes.0.prompt", 0, r"classes\[short-prompt\].prompt: expected a number > 0, got 0.0 \(in classes\[0\]\)"),
        ("classes.0.decode", -5, r"classes\[short-prompt\].decode: expected a number > 0, got -5.0"),
        ("classes.1.rate", 0.0, r"classes\[long-prompt\].rate: expected a number > 0, got 0.0 \(in classes\[1\]\)"),
        ("classes.1.rate", math.inf, r"classes\[long-prompt\].rate: expected a finite number, got inf"),
        ("classes.0.patience", -0.1, r"classes\[short-prompt\].patience: expected a number >= 0, got -0.1"),
        ("classes.0.prefill_price", -1.0, r"classes\[short-prompt\].prefill_price: expected a number >= 0, got -1.0"),
        ("classes.0.decode_price", -0.2, r"classes\[short-prompt\].decode_price: expected a number >= 0"),
        ("pricing.prefill", -0.1, r"pricing.prefill: expected a number >= 0, got -0.1"),
        ("pricing.decode", -0.2, r"pricing.decode: expected a number >= 0, got -0.2"),
        ("classes.0.lengths", "lognormal", (r"classes\[short-prompt\]: lengths = 'lognormal' needs prompt_sigma and "
                                           r"decode_sigma")),
        ("classes.0.prompt_sigma", 0, r"classes\[short-prompt\].prompt_sigma: expected a number > 0, got 0"),
        # duplicate class names
        ("classes.1.name", "short-prompt", r"classes.name: class names must be unique, repeated: short-prompt"),
    ],
)
def test_bad_field(path, value, pattern):
    expect_error(_set(base(), path, value), pattern)


def test_tau_solo_and_gamma_exactly_one():
    d = base()
    d["gpu"]["tau_solo"] = 0.022
    expect_error(d, r"gpu: give exactly one of tau_solo \(s per decode-only iteration\) or gamma \(tokens/s\), got both")
    d["gpu"].pop("tau_solo")
    d["gpu"].pop("gamma")
    expect_error(d, r"gpu: give exactly one of tau_solo .* got neither")
    d["gpu"]["tau_solo"] = 0.0
    expect_error(d, r"gpu.tau_solo: expected a number > 0, got 0.0")


def test_zero_mixed_iteration_time_is_rejected():
    d = _set(_set(base(), "gpu.alpha", 0.0), "gpu.beta", 0.0)
    expect_error(d, r"gpu: alpha \+ beta \* chunk must be > 0, got 0.0")


def test_invalid_toml_and_missing_file(tmp_path):
    with pytest.raises(ScenarioError, match=r"bad\.toml: not valid TOML: "):
        p = tmp_path / "bad.toml"
        p.write_text("[gpu\nalpha = 1\n")
        load_scenario(p)
    with pytest.raises(ScenarioError, match=r"<string>: not valid TOML"):
        loads_scenario("name = \n")
    with pytest.raises(ScenarioError, match=r"scenario file '.*nothere\.toml': no such file"):
        load_scenario(tmp_path / "nothere.toml")
    with pytest.raises(ScenarioError, match=r"scenario file .*: is a folder, expected a file"):
        load_scenario(tmp_path)  # a directory is not a scenario file
    p = tmp_path / "latin1.toml"
    p.write_bytes(b"name = '\xe9'\n")
    with pytest.raises(ScenarioError, match=r"latin1\.toml.*cannot read it"):
        load_scenario(p)


def test_toml_duplicate_key_is_a_toml_error():
    text = EXAMPLE.read_text().replace("batch = 16", "batch = 16\nbatch = 8")
    with pytest.raises(ScenarioError, match="not valid TOML"):
        loads_scenario(text, source="dup.toml")


def test_gpu_from_dict_names_its_location():
    with pytest.raises(ScenarioError, match=r"^profiles\[x\]: unknown key 'speed'"):
        gpu_from_dict({"alpha": 0.01, "beta": 1e-5, "gamma": 40, "chunk": 256, "batch": 16, "speed": 1},
                      where="profiles[x]")


def test_errors_are_value_errors_and_fluidopt_errors():
    from fluidopt.core.errors import FluidoptError

    with pytest.raises(ValueError):
        scenario_from_dict({})
    with pytest.raises(FluidoptError):
        scenario_from_dict([])  # type: ignore[arg-type]


@pytest.mark.parametrize("gamma", [math.nan, math.inf])
def test_non_finite_gamma_is_reported_as_gamma(gamma):
    expect_error(_set(base(), "gpu.gamma", gamma), r"gpu.gamma: expected a finite number")


def test_unnamed_scenario_from_text_is_called_scenario():
    d = base()
    d.pop("name")
    assert loads_scenario(to_toml(d)).name == "scenario"


# ------------------------------------------------------------------------------------------------
# [gpu.timemodel]: the generalised iteration-time law
# ------------------------------------------------------------------------------------------------
_LAW_TOML = EXAMPLE.read_text() + """
[gpu.timemodel]
prefill = [0.022, 1.4e-4, 8.1e-9]
decode_small = [0.0235, 5.9e-7, 6.1e-5]
decode_large = [0.0202, 4.9e-7, 1.2e-4]
decode_threshold = 95
"""
DISTSERVE = ROOT.parent / "shared" / "data" / "distserve-opt13b-a100" / "profiler-a100-80g.vllm.json"


def test_a_timemodel_table_loads_and_round_trips():
    from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw

    s = loads_scenario(_LAW_TOML)
    assert s.gpu.timemodel == IterationLaw(PrefillLaw(0.022, 1.4e-4, 8.1e-9),
                                           DecodeLaw((0.0235, 5.9e-7, 6.1e-5), (0.0202, 4.9e-7, 1.2e-4), 95))
    assert s.gpu.alpha == 0.0174  # the straight line stays the LP's
    d = scenario_to_dict(s)
    assert d["gpu"]["timemodel"]["decode_threshold"] == 95
    assert scenario_from_dict(d) == s
    assert replace(s, gpu=replace(s.gpu, timemodel=None)) == load_scenario(EXAMPLE)


@pytest.mark.skipif(not DISTSERVE.is_file(), reason=f"DistServe's profile not found at {DISTSERVE}")
def test_a_timemodel_from_distserve_profile_json(tmp_path):
    from fluidopt.calibration.timemodels import load_distserve_profile

    p = tmp_path / "s.toml"
    p.write_text(EXAMPLE.read_text() + f'\n[gpu.timemodel]\ndistserve_profile = "{DISTSERVE}"\n'
                 'model = "facebook/opt-13b"\ntp = 1\n')
    assert load_scenario(p).gpu.timemodel == load_distserve_profile(DISTSERVE, "facebook/opt-13b", 1)
    p.write_text(EXAMPLE.read_text() + f'\n[gpu.timemodel]\ndistserve_profile = "{DISTSERVE}"\n'
                 'model = "facebook/opt-13b"\ntp = 3\n')
    with pytest.raises(ScenarioError, match="no TP degree 3"):
        load_scenario(p)


@pytest.mark.parametrize("extra, pattern", [
    ('prefill = [0.02, -1e-4, 0.0]\ndecode_small = [0.02, 0.0, 0.0]', r"gpu\.timemodel: prefill\[1\] = -0\.0001"),
    ('prefill = [0.02, 1e-4, 0.0]', r"decode_small is missing"),
    ('prefill = [0.02, 1e-4, 0.0]\ndecode_small = [0.02, 0.0, 0.0]\nslope = 1', r"unknown key 'slope'"),
    ('distserve_profile = "x.json"\ntp = 1', r"gpu\.timemodel\.model: missing required field"),
])
def test_a_bad_timemodel_is_one_line(extra, pattern):
    with pytest.raises(ScenarioError, match=pattern):
        loads_scenario(EXAMPLE.read_text() + "\n[gpu.timemodel]\n" + extra + "\n")


def test_a_timemodel_with_a_kv_time_term_or_the_markov_service_is_refused():
    from fluidopt.sim.api import simulate

    s = loads_scenario(_LAW_TOML)
    with pytest.raises(ScenarioError, match="kv_time_per_token or a timemodel, not both"):
        replace(s.gpu, kv_time_per_token=1e-7)
    with pytest.raises(ScenarioError, match="service='tokens'"):
        simulate(replace(s, gpus=2), "gate-and-route", horizon=1.0, service="markov")


_LINE_FREE = """
name = "law-only"
[gpu]
chunk = 64
batch = 8
[gpu.timemodel]
prefill = [0.01, 1e-4, 1e-6]
decode_small = [0.02, 1e-6, 1e-3]
decode_large = [0.015, 2e-6, 2e-3]
decode_threshold = 8
[cluster]
gpus = 4
[[classes]]
name = "a"
prompt = 100
decode = 50
rate = 2.0
lengths = "fixed"
"""


def test_without_a_straight_line_the_lp_takes_the_laws_on_a_full_gpu():
    # one class, P = 100, D = 50 fixed: a decode's iterations hold 100 ... 149 tokens, T = 124.5; P2 = 100. B = 8
    # decodes alone use the large triple (8 >= 8): 0.015 + 2e-6 * 8 * T + 2e-3 * 8; beside a chunk, 7 the small
    s = loads_scenario(_LINE_FREE)
    assert s.gpu.tau_solo == pytest.approx(0.015 + 2e-6 * 8 * 124.5 + 0.016, rel=1e-12)
    assert s.gpu.alpha == pytest.approx(0.01 + 1e-6 * 7 * 124.5 + 1e-3 * 7, rel=1e-12)
    assert s.gpu.beta == pytest.approx(1e-4 + 1e-6 * 100, rel=1e-12)
    assert loads_scenario(to_toml_nested(scenario_to_dict(s))) == s  # written out, the line is explicit
    # exponential lengths (geometric: E[L^2] = 2 m^2 - m): P2 = 19,900 / 100 = 199; T = (50 * 100 + (4,950 - 50) / 2)
    # / 50 = 149: the law's quadratic and context terms see the long tail
    e = loads_scenario(_LINE_FREE.replace('lengths = "fixed"', 'lengths = "exponential"'))
    assert e.gpu.beta == pytest.approx(1e-4 + 1e-6 * 199, rel=1e-12)
    assert e.gpu.tau_solo == pytest.approx(0.015 + 2e-6 * 8 * 149 + 0.016, rel=1e-12)


def test_two_classes_weight_the_line_by_their_tokens():
    from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw, straight_line_at

    law = IterationLaw(PrefillLaw(0.01, 1e-4, 1e-6), DecodeLaw((0.02, 1e-6, 1e-3)))
    classes = [RequestClass("a", prompt=100, decode=50, rate=2.0), RequestClass("b", prompt=1000, decode=10, rate=1.0)]
    alpha, beta, tau = straight_line_at(law, 4, classes)
    P2 = (2 * 100 ** 2 + 1000 ** 2) / (2 * 100 + 1000)  # sum rate P^2 / sum rate P
    T = (2 * 50 * 124.5 + 10 * 1004.5) / (2 * 50 + 10)  # the mean context of a decode iteration
    assert (alpha, beta, tau) == pytest.approx((0.01 + 1e-6 * 3 * T + 3e-3, 1e-4 + 1e-6 * P2, 0.02 + 4e-6 * T + 4e-3))


def test_a_partial_straight_line_beside_a_law_is_refused():
    with pytest.raises(ScenarioError, match="give alpha, beta and tau_solo .* together, or none"):
        loads_scenario(_LINE_FREE.replace("chunk = 64", "chunk = 64\nalpha = 0.01"))


def to_toml_nested(d: dict[str, Any]) -> str:
    """to_toml with the gpu's timemodel as its own table and arrays of numbers."""
    def val(v):
        return "[" + ", ".join(map(repr, v)) + "]" if isinstance(v, list) else _value(v)

    gpu = dict(d["gpu"])
    law = gpu.pop("timemodel", None)
    text = to_toml({**d, "gpu": gpu})
    if law is not None:
        text += "[gpu.timemodel]\n" + "".join(f"{k} = {val(v)}\n" for k, v in law.items())
    return text
