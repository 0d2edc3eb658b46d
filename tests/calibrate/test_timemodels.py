"""The generalised iteration-time laws: closed forms, DistServe's profile, fitting without noise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fluidopt.calibration.timemodels import (
    DecodeLaw,
    IterationLaw,
    PrefillLaw,
    fit_time_models,
    law_from_table,
    load_distserve_profile,
    load_law_toml,
    profile_points,
)
from fluidopt.core.errors import CalibrationError
from fluidopt.core.model import GPUProfile

# ../shared beside the checkout (a worktree one level deeper finds it too); the tests skip without it
DATA = next((p / "shared/data/distserve-opt13b-a100" for p in Path(__file__).resolve().parents[2:]
             if (p / "shared/data/distserve-opt13b-a100").is_dir()), Path("../shared/data/distserve-opt13b-a100"))
VLLM_PROFILE = DATA / "profiler-a100-80g.vllm.json"
needs_data = pytest.mark.skipif(not VLLM_PROFILE.is_file(), reason="shared DistServe data not found")

# DistServe's vLLM profile of OPT-13B, TP 1 (milliseconds), as shipped
OPT13B_MS = {"prefill": [22.052204789310185, 0.14050923870128956, 8.076584822611088e-06],
             "decoding_smallbs": [23.475041008414784, 0.000592934466077393, 0.060726861260369455],
             "decoding_largebs": [20.206356173691958, 0.0004907727036234946, 0.1200031385587413],
             "decoding_large_small_bs_threshold": 95}


def opt13b_law() -> IterationLaw:
    ms = 1e-3
    return IterationLaw(PrefillLaw(*(x * ms for x in OPT13B_MS["prefill"])),
                        DecodeLaw(tuple(x * ms for x in OPT13B_MS["decoding_smallbs"]),
                                  tuple(x * ms for x in OPT13B_MS["decoding_largebs"]), 95))


def test_prefill_and_decode_closed_forms():
    law = opt13b_law()
    # two prompts of 100 and 300 tokens: 22.0522 + 0.140509 * 400 + 8.0766e-6 * (100^2 + 300^2) ms
    want = (22.052204789310185 + 0.14050923870128956 * 400 + 8.076584822611088e-06 * 100_000) * 1e-3
    assert law.prefill_time([100, 300]) == pytest.approx(want, rel=1e-12)
    # 94 requests: small-batch coefficients; 95: large
    assert law.decode_time(10_000, 94) == pytest.approx((23.475041008414784 + 0.000592934466077393 * 1e4
                                                         + 0.060726861260369455 * 94) * 1e-3, rel=1e-12)
    assert law.decode_time(10_000, 95) == pytest.approx((20.206356173691958 + 0.0004907727036234946 * 1e4
                                                         + 0.1200031385587413 * 95) * 1e-3, rel=1e-12)
    # the quadratic term at 8k tokens: 8.0766e-6 ms * 8192^2 = 0.542 s, the "about 0.5 s"
    assert law.prefill.c * 8192**2 == pytest.approx(0.542, abs=0.001)


def test_mixed_iteration_pays_the_prefill_intercept_once():
    law = opt13b_law()
    # a 200-token chunk at offset 300 beside 10 decodes holding 5000 tokens
    t = law.mixed(200, 500**2 - 300**2, 5000, 10)
    want = law.prefill.a + law.prefill.b * 200 + law.prefill.c * (500**2 - 300**2) \
        + law.decode.small[1] * 5000 + law.decode.small[2] * 10
    assert t == pytest.approx(want, rel=1e-12)
    assert law.mixed(0, 0, 5000, 10) == law.decode_time(5000, 10)
    assert law.mixed(200, 200**2, 0, 0) == pytest.approx(law.prefill_time([200]), rel=1e-12)


def test_straight_line_is_a_special_case_exactly():
    p = GPUProfile(alpha=0.015, beta=6e-5, tau_solo=0.02, chunk=256, batch=16)
    law = IterationLaw.from_gpu_profile(p)
    assert law.mixed(p.chunk, p.chunk**2, 3000, p.batch - 1) == p.tau_mix  # bit for bit
    assert law.decode_time(3000, p.batch) == p.tau_solo


@needs_data
def test_loads_distserve_profile_in_seconds():
    law = load_distserve_profile(VLLM_PROFILE, "facebook/opt-13b", 1)
    assert law == opt13b_law()


@pytest.mark.parametrize("entry, fragment", [
    (None, "no model 'facebook/opt-13b'"),
    ({"2": OPT13B_MS}, "has no TP degree 1"),
    ({"1": {**OPT13B_MS, "prefill": [22.0, -0.1, 0.0]}}, "prefill[1] = -0.1"),
    ({"1": {k: v for k, v in OPT13B_MS.items() if k != "decoding_smallbs"}}, "decoding_smallbs is missing"),
    ({"1": {**OPT13B_MS, "prefill": [22.0, 0.1]}}, "expected three coefficients"),
])
def test_profile_errors_name_the_file_and_the_problem(tmp_path, entry, fragment):
    f = tmp_path / "p.json"
    f.write_text(json.dumps({} if entry is None else {"facebook/opt-13b": entry}))
    with pytest.raises(CalibrationError) as e:
        load_distserve_profile(f, "facebook/opt-13b", 1)
    assert fragment in str(e.value) and str(f) in str(e.value) and "\n" not in str(e.value)


def test_toml_table(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text("[timemodel]\nprefill = [0.02, 1e-4, 1e-9]\ndecode_small = [0.02, 1e-7, 1e-4]\n"
                 "decode_large = [0.03, 1e-7, 2e-4]\ndecode_threshold = 64\n")
    law = load_law_toml(f)
    assert law.decode_time(100, 64) == pytest.approx(0.03 + 1e-5 + 64 * 2e-4)
    with pytest.raises(CalibrationError, match="decode_small is missing"):
        law_from_table({"prefill": [0.02, 1e-4, 0]})
    with pytest.raises(CalibrationError, match="unknown key 'prefil'"):
        law_from_table({"prefil": [0.02, 1e-4, 0]})


def test_fit_recovers_distserve_coefficients_without_noise():
    law = opt13b_law()
    fits = fit_time_models(profile_points(law), threshold=95, holdout=0.0)
    g = fits.general.law
    for got, want in [(g.prefill.a, law.prefill.a), (g.prefill.b, law.prefill.b), (g.prefill.c, law.prefill.c),
                      *zip(g.decode.small, law.decode.small), *zip(g.decode.large, law.decode.large)]:
        assert got == pytest.approx(want, rel=1e-6)
    assert g.decode.threshold == 95


def test_fit_finds_the_threshold_and_prefers_the_generalised_form():
    law = opt13b_law()
    fits = fit_time_models(profile_points(law), holdout=0.3, seed=1)
    assert fits.general.law.decode.threshold == 95
    assert fits.better == "generalised"
    assert fits.general.heldout_rel_error < 1e-6 < fits.straight.heldout_rel_error
    # the intervals of an exact fit are (numerically) points around the estimate
    lo, hi = fits.general.ci["prefill_b"]
    assert lo <= fits.general.coefficients["prefill_b"] <= hi


def test_calibrate_command_fits_both_forms_from_a_profile_csv(tmp_path, capsys):
    from fluidopt.cli import main

    f = tmp_path / "profile.csv"
    profile_points(opt13b_law()).to_csv(f, index=False, float_format="%.17g")
    assert main(["calibrate", str(f), "--json", "--threshold", "95"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["better"] == "generalised"
    assert d["generalised"]["law"]["decode_threshold"] == 95
    assert d["generalised"]["coefficients"]["prefill_c"] == pytest.approx(opt13b_law().prefill.c, rel=1e-6)
    assert main(["calibrate", str(f)]) == 0
    assert "better on held-out iterations: generalised" in capsys.readouterr().out
    assert main(["calibrate", str(f), "--threshold", "0"]) == 2
    assert "--threshold: expected an integer >= 1" in capsys.readouterr().err
