"""Calibration: OLS fit of tau = alpha + beta*C, named profiles, raw CSV format, profiler loop."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fluidopt.calibration import (
    CalibrationFit,
    fit_iteration_time,
    list_profiles,
    load_profile,
    profile_info,
    profile_names,
    read_measurements,
    synthetic_measurements,
    write_measurements,
)
from fluidopt.core.errors import CalibrationError, ScenarioError
from fluidopt.core.model import GPUProfile, paper_gpu

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "calibration" / "example-qwen-8b-a100.csv"
A8, B8, G8 = 0.0174, 6.2e-5, 45.45  # published Qwen-8B / A100 law (arXiv:2602.02987)


def _homoscedastic(alpha: float, beta: float, sd: float, seed: int, chunks=(64, 128, 256, 512, 1024), reps=4):
    rng = np.random.default_rng(seed)
    c = np.repeat(np.asarray(chunks, dtype=float), reps)
    return pd.DataFrame({"chunk_tokens": c, "iteration_seconds": alpha + beta * c + sd * rng.standard_normal(c.size)})


def _write(tmp_path: Path, text: str, name: str = "m.csv") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


# ------------------------------------------------------------------------------------------------
# The estimator against independent computations
# ------------------------------------------------------------------------------------------------
@pytest.mark.integration
def test_ols_matches_lstsq_and_textbook_formulas():
    df = _homoscedastic(0.02, 5e-5, 4e-4, seed=3)
    fit = fit_iteration_time(df)
    x = df["chunk_tokens"].to_numpy()
    y = df["iteration_seconds"].to_numpy()
    X = np.column_stack([np.ones_like(x), x])
    coef, ssr, *_ = np.linalg.lstsq(X, y, rcond=None)
    assert fit.alpha == pytest.approx(coef[0], rel=1e-10)
    assert fit.beta == pytest.approx(coef[1], rel=1e-10)
    n = len(y)
    s2 = float(ssr[0]) / (n - 2)
    se = np.sqrt(np.diag(s2 * np.linalg.inv(X.T @ X)))
    assert (fit.alpha_se, fit.beta_se) == pytest.approx(tuple(se), rel=1e-8)
    q = stats.t.ppf(0.975, n - 2)
    assert fit.alpha_ci == pytest.approx((coef[0] - q * se[0], coef[0] + q * se[0]), rel=1e-8)
    assert fit.beta_ci == pytest.approx((coef[1] - q * se[1], coef[1] + q * se[1]), rel=1e-8)
    assert fit.r2 == pytest.approx(1 - float(ssr[0]) / np.sum((y - y.mean()) ** 2), rel=1e-10)
    assert fit.residual_std == pytest.approx(math.sqrt(s2), rel=1e-10)
    assert fit.n_points == n and fit.cov_type == "nonrobust"
    # Durbin-Watson by hand
    e = y - X @ coef
    assert fit.durbin_watson == pytest.approx(np.sum(np.diff(e) ** 2) / np.sum(e**2), rel=1e-8)


@pytest.mark.integration
def test_confidence_band_hand_formula_at_mean_chunk():
    df = _homoscedastic(0.02, 5e-5, 4e-4, seed=5)
    fit = fit_iteration_time(df)
    xbar = df["chunk_tokens"].mean()
    p = fit.predict([xbar, 0.0, 2000.0])
    n = len(df)
    q = stats.t.ppf(0.975, n - 2)
    half_ci = q * fit.residual_std / math.sqrt(n)  # at the mean chunk the slope's error drops out
    half_pi = q * fit.residual_std * math.sqrt(1 + 1 / n)
    assert p.loc[0, "tau"] == pytest.approx(fit.alpha + fit.beta * xbar, rel=1e-12)
    assert p.loc[0, "ci_high"] - p.loc[0, "tau"] == pytest.approx(half_ci, rel=1e-8)
    assert p.loc[0, "pi_high"] - p.loc[0, "tau"] == pytest.approx(half_pi, rel=1e-8)
    # At C = 0 the confidence interval is alpha's own.
    assert (p.loc[1, "ci_low"], p.loc[1, "ci_high"]) == pytest.approx(fit.alpha_ci, rel=1e-8)
    # The band widens away from the data's centre.
    widths = (p["ci_high"] - p["ci_low"]).to_numpy()
    assert widths[0] < widths[1] and widths[0] < widths[2]


def test_hc3_matches_hand_formula_and_differs_from_classical_on_heteroscedastic_data():
    df = synthetic_measurements(A8, B8, None, rel_noise=0.04, seed=7)
    classical = fit_iteration_time(df)
    hc3 = fit_iteration_time(df, robust=True)
    assert (hc3.alpha, hc3.beta) == (classical.alpha, classical.beta)  # point estimates unchanged
    x = df["chunk_tokens"].to_numpy()
    y = df["iteration_seconds"].to_numpy()
    X = np.column_stack([np.ones_like(x), x])
    bread = np.linalg.inv(X.T @ X)
    e = y - X @ (bread @ X.T @ y)
    h = np.einsum("ij,jk,ik->i", X, bread, X)
    meat = X.T @ (X * (e**2 / (1 - h) ** 2)[:, None])
    se = np.sqrt(np.diag(bread @ meat @ bread))
    assert (hc3.alpha_se, hc3.beta_se) == pytest.approx(tuple(se), rel=1e-8)
    q = stats.t.ppf(0.975, len(y) - 2)  # t intervals under HC3 too (small samples)
    assert hc3.beta_ci == pytest.approx((hc3.beta - q * se[1], hc3.beta + q * se[1]), rel=1e-8)
    assert hc3.cov_type == "HC3"
    # The noise grows with C: HC3 sees a larger slope error and a smaller intercept error.
    assert hc3.beta_se > 1.1 * classical.beta_se
    assert hc3.alpha_se < 0.9 * classical.alpha_se
    assert classical.breusch_pagan_p < 0.01
    assert any("Breusch-Pagan" in w for w in classical.warnings())
    assert not any("Breusch-Pagan" in w for w in hc3.warnings())


@pytest.mark.integration
def test_ci_coverage_classical_on_homoscedastic_and_hc3_beats_classical_on_heteroscedastic():
    seeds = range(200)
    cov_homo = sum(
        lo <= 5e-5 <= hi for lo, hi in (fit_iteration_time(_homoscedastic(0.02, 5e-5, 4e-4, s)).beta_ci for s in seeds)
    )
    assert 0.90 <= cov_homo / 200 <= 0.99
    cov_cls = cov_hc3 = 0
    for s in seeds:
        df = synthetic_measurements(A8, B8, None, seed=s)
        a, b = fit_iteration_time(df).beta_ci, fit_iteration_time(df, robust=True).beta_ci
        cov_cls += a[0] <= B8 <= a[1]
        cov_hc3 += b[0] <= B8 <= b[1]
    # Noise proportional to tau: the classical interval is too narrow for the slope, HC3 is not.
    assert 0.88 <= cov_hc3 / 200 <= 0.99
    assert cov_cls < cov_hc3 and cov_cls / 200 < 0.90


def test_recovers_published_law_from_single_fit():
    df = synthetic_measurements(A8, B8, 1 / G8, seed=4)
    fit = fit_iteration_time(df, chunk=256, batch=16)
    assert fit.alpha_ci[0] <= A8 <= fit.alpha_ci[1]
    assert fit.beta_ci[0] <= B8 <= fit.beta_ci[1]
    assert fit.tau_solo_ci[0] <= 1 / G8 <= fit.tau_solo_ci[1]
    assert fit.r2 > 0.995
    assert fit.n_points == 45 and fit.n_solo == 12


def test_tau_solo_is_the_mean_of_decode_only_rows_with_t_interval():
    df = synthetic_measurements(A8, B8, 1 / G8, seed=9)
    fit = fit_iteration_time(df)
    ts = df.loc[df["chunk_tokens"] == 0, "iteration_seconds"].to_numpy()
    se = ts.std(ddof=1) / math.sqrt(ts.size)
    q = stats.t.ppf(0.975, ts.size - 1)
    assert fit.tau_solo == pytest.approx(ts.mean(), rel=1e-12)
    assert fit.tau_solo_se == pytest.approx(se, rel=1e-10)
    assert fit.tau_solo_ci == pytest.approx((ts.mean() - q * se, ts.mean() + q * se), rel=1e-10)
    assert fit.gamma == pytest.approx(1 / ts.mean())
    # Solo rows do not enter the OLS: dropping them changes nothing in alpha, beta.
    no_solo = fit_iteration_time(df[df["chunk_tokens"] > 0])
    assert (no_solo.alpha, no_solo.beta) == (fit.alpha, fit.beta)
    assert no_solo.tau_solo is None and no_solo.gamma is None and no_solo.n_solo == 0
    # One solo row: a mean, but no interval.
    one = fit_iteration_time(pd.concat([df[df["chunk_tokens"] > 0], df[df["chunk_tokens"] == 0].iloc[:1]]))
    assert one.tau_solo == ts[0] and one.tau_solo_ci is None and one.tau_solo_se is None


def test_balanced_raw_rows_and_per_chunk_means_give_the_same_line():
    # The paper fitted per-chunk means; with equal repeats the raw-row OLS has the same estimates.
    df = synthetic_measurements(A8, B8, None, seed=2)
    means = df.groupby("chunk_tokens", as_index=False)["iteration_seconds"].mean()
    a, b = fit_iteration_time(df), fit_iteration_time(means)
    assert a.alpha == pytest.approx(b.alpha, rel=1e-10)
    assert a.beta == pytest.approx(b.beta, rel=1e-10)
    assert a.r2 < b.r2  # averaging removes within-chunk noise, so the means' R^2 is higher


def test_studentised_residuals_match_statsmodels_and_flag_an_outlier():
    df = synthetic_measurements(A8, B8, None, seed=1)
    df.loc[17, "iteration_seconds"] *= 1.3
    fit = fit_iteration_time(df)
    ref = np.abs(fit._result.get_influence().resid_studentized_external)
    assert fit.max_abs_studentized == pytest.approx(ref.max(), rel=1e-9)
    assert fit.max_abs_studentized_row == 17
    assert fit.max_abs_studentized > 4
    assert any("row 17" in w and "outlier" in w for w in fit.warnings())
    assert "row 17" in fit.summary()


def test_outlier_row_is_named_by_file_line(tmp_path):
    df = synthetic_measurements(A8, B8, None, seed=1)
    df.loc[5, "iteration_seconds"] *= 1.4
    path = write_measurements(df, tmp_path / "o.csv", comment="two\ncomment lines")
    fit = fit_iteration_time(path)
    assert fit.max_abs_studentized_row == 5 + 4  # 2 comments + header, 1-based: data row 5 is line 9
    assert path.read_text().splitlines()[8].startswith(f"{df.loc[5, 'chunk_tokens']:g},")


# ------------------------------------------------------------------------------------------------
# Results: conversion, serialisation, plot
# ------------------------------------------------------------------------------------------------
def test_to_profile_and_its_errors():
    df = synthetic_measurements(A8, B8, 1 / G8, seed=0)
    fit = fit_iteration_time(df, chunk=256, batch=16)
    prof = fit.to_profile(name="mine")
    assert isinstance(prof, GPUProfile)
    assert (prof.alpha, prof.beta, prof.tau_solo, prof.chunk, prof.batch, prof.name) == (
        fit.alpha, fit.beta, fit.tau_solo, 256, 16, "mine",
    )
    assert prof.tau_mix == pytest.approx(fit.tau_mix(256))
    assert fit.to_profile(512, 32).chunk == 512
    bare = fit_iteration_time(df[df["chunk_tokens"] > 0])
    with pytest.raises(CalibrationError, match="chunk .* and batch .* are serving settings"):
        bare.to_profile()
    with pytest.raises(CalibrationError, match="no decode-only rows .* pass tau_solo="):
        bare.to_profile(256, 16)
    assert bare.to_profile(256, 16, tau_solo=0.02).tau_solo == 0.02
    with pytest.raises(CalibrationError, match=r"to_profile: gpu.batch: expected an integer >= 1, got 0"):
        bare.to_profile(256, 0, tau_solo=0.02)
    with pytest.raises(CalibrationError, match="chunk: expected an integer >= 1"):
        fit_iteration_time(df, chunk=0)
    with pytest.raises(CalibrationError, match="batch: expected an integer >= 1"):
        fit_iteration_time(df, batch=2.5)


def test_to_dict_is_strict_json_and_to_frame():
    fit = fit_iteration_time(synthetic_measurements(A8, B8, 1 / G8, seed=0), chunk=256)
    d = json.loads(json.dumps(fit.to_dict(), allow_nan=False))
    for k in ("alpha", "beta", "alpha_ci", "beta_ci", "r2", "n_points", "tau_solo", "tau_solo_ci", "gamma",
              "cov_type", "diagnostics", "tau_mix"):
        assert k in d
    assert d["alpha_ci"] == list(fit.alpha_ci) and d["n_points"] == 45
    assert set(d["diagnostics"]) == {"durbin_watson", "breusch_pagan_p", "jarque_bera_p", "max_abs_studentized",
                                     "max_abs_studentized_row"}
    frame = fit.to_frame()
    assert list(frame.index) == ["alpha", "beta", "tau_solo"]
    assert frame.loc["beta", "ci_low"] == fit.beta_ci[0]
    # Three points: no residual dof beyond one, so the studentised residuals are undefined -> None.
    tiny = fit_iteration_time(pd.DataFrame({"chunk_tokens": [64, 128, 256], "iteration_seconds": [0.02, 0.025, 0.034]}))
    d = json.loads(json.dumps(tiny.to_dict(), allow_nan=False))
    assert d["diagnostics"]["max_abs_studentized"] is None and "tau_solo" not in d


@pytest.mark.integration
def test_plot_has_data_fit_and_two_bands(tmp_path):
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure

    fit = fit_iteration_time(synthetic_measurements(A8, B8, 1 / G8, seed=0))
    fig = fit.plot()
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 2  # confidence and prediction bands
    assert len(ax.lines) == 1
    assert len(ax.collections) == 4  # bands, mixed points, decode-only points
    out = tmp_path / "fit.png"
    fig.savefig(out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------------
# Bad input: every error names the column, the row and the value
# ------------------------------------------------------------------------------------------------
GOOD_HEADER = "chunk_tokens,iteration_seconds\n"


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("# c\nchunk_tokens,iteration_seconds\n64,0.02\n128,-0.01\n256,0.03\n",
         r"m\.csv: line 4: iteration_seconds = -0\.01: expected a time in seconds > 0"),
        (GOOD_HEADER + "64,0.02\n128,0\n256,0.03\n", r"line 3: iteration_seconds = 0\.0: expected a time in seconds > 0"),
        (GOOD_HEADER + "64,0.02\n,0.025\n256,0.03\n", r"line 3: chunk_tokens is missing \(got ''\); expected a number"),
        (GOOD_HEADER + "64,0.02\n128,NaN\n256,0.03\n", r"line 3: iteration_seconds is missing \(got 'NaN'\)"),
        (GOOD_HEADER + "64,0.02\n128,abc\n256,0.03\n", r"line 3: iteration_seconds = 'abc': expected a number"),
        (GOOD_HEADER + "64,0.02\n128,inf\n256,0.03\n", r"line 3: iteration_seconds = 'inf': expected a finite number"),
        (GOOD_HEADER + "-64,0.02\n128,0.025\n256,0.03\n", r"line 2: chunk_tokens = -64\.0: expected a whole number of tokens >= 0"),
        (GOOD_HEADER + "32.5,0.02\n128,0.025\n256,0.03\n", r"line 2: chunk_tokens = 32\.5: expected a whole number of tokens >= 0"),
        ("chunk_tokens,seconds\n64,0.02\n", (r"missing column 'iteration_seconds'; expected columns chunk_tokens, "
                                           r"iteration_seconds .*found 'chunk_tokens', 'seconds'")),
        ("iteration_seconds\n0.02\n", r"missing column 'chunk_tokens'"),
        (GOOD_HEADER + "64,0.02\n0,0.022\n0,0.021\n128,0.025\n",
         r"too few mixed rows .*: got 2 row\(s\) with chunk_tokens > 0, need at least 3"),
        (GOOD_HEADER, r"too few mixed rows .*got 0 row"),
        ("", r"no header line; expected a CSV with columns chunk_tokens, iteration_seconds"),
        (GOOD_HEADER + "256,0.03\n256,0.031\n256,0.029\n0,0.02\n",
         r"chunk_tokens takes a single value \(256\) over the 3 mixed rows; .* at least two distinct chunk sizes"),
        ("chunk_tokens,iteration_seconds,mode\n64,0.02,mixed\n0,0.02,Solo\n128,0.025,decode\n",
         r"line 4: mode = 'decode': expected one of mixed, solo"),
        ("chunk_tokens,iteration_seconds,mode\n64,0.02,solo\n", r"line 2: mode = 'solo' but chunk_tokens = 64\.0"),
        ("chunk_tokens,iteration_seconds,mode\n0,0.02,mixed\n", r"line 2: mode = 'mixed' but chunk_tokens = 0"),
        ("chunk_tokens,iteration_seconds,decodes\n64,0.02,15\n128,0.025,2.5\n",
         r"line 3: decodes = 2\.5: expected an integer >= 0"),
        ("chunk_tokens,iteration_seconds,decodes\n64,0.02,-1\n", r"line 2: decodes = -1\.0: expected an integer >= 0"),
    ],
)
def test_bad_csv_raises_a_precise_error(tmp_path, text, pattern):
    with pytest.raises(CalibrationError, match=pattern):
        fit_iteration_time(_write(tmp_path, text))


def test_bad_dataframe_values_name_the_index_label():
    df = pd.DataFrame({"chunk_tokens": [64, 128, 256], "iteration_seconds": [0.02, np.nan, 0.03]}, index=[10, 11, 12])
    with pytest.raises(CalibrationError, match=r"^row 11: iteration_seconds is missing \(got nan\)"):
        fit_iteration_time(df)
    df = pd.DataFrame({"chunk_tokens": [64, True, 256], "iteration_seconds": [0.02, 0.02, 0.03]}, dtype=object)
    with pytest.raises(CalibrationError, match=r"row 1: chunk_tokens = True: expected a number, got a boolean"):
        fit_iteration_time(df)
    df = pd.DataFrame({"chunk_tokens": [64, 128, 256], "iteration_seconds": [0.02, -np.inf, 0.03]})
    with pytest.raises(CalibrationError, match=r"row 1: iteration_seconds = -?inf: expected a finite number"):
        fit_iteration_time(df)


def test_hc3_with_a_leverage_one_point_is_refused():
    df = pd.DataFrame({"chunk_tokens": [64, 64, 64, 512], "iteration_seconds": [0.021, 0.022, 0.0215, 0.049]})
    assert math.isfinite(fit_iteration_time(df).beta_se)  # classical errors are fine
    with pytest.raises(CalibrationError, match=r"HC3\) standard errors are undefined: row 3 has leverage 1"):
        fit_iteration_time(df, robust=True)


def test_missing_file_and_extra_columns(tmp_path):
    with pytest.raises(CalibrationError, match=r"calibration file '.*nope\.csv': no such file"):
        fit_iteration_time(tmp_path / "nope.csv")
    p = _write(tmp_path, "chunk_tokens, iteration_seconds ,gpu_id\n64,0.02,0\n128,0.025,1\n256,0.033,0\n")
    d = read_measurements(p)  # spaces around names are stripped; unknown columns are ignored
    assert list(d.columns) == ["chunk_tokens", "iteration_seconds", "mode"]
    assert list(d.index) == [2, 3, 4] and d.index.name == "line"


def test_read_measurements_normalises_mode_and_derives_it():
    d = read_measurements(pd.DataFrame({"chunk_tokens": [0, 64], "iteration_seconds": [0.02, 0.03],
                                        "mode": [" SOLO", "Mixed"], "decodes": [16.0, 15.0]}))
    assert list(d["mode"]) == ["solo", "mixed"] and d["decodes"].dtype == np.int64
    d = read_measurements(pd.DataFrame({"chunk_tokens": [0, 64], "iteration_seconds": [0.02, 0.03]}))
    assert list(d["mode"]) == ["solo", "mixed"]


# ------------------------------------------------------------------------------------------------
# Named profiles and shipped data
# ------------------------------------------------------------------------------------------------
def test_named_profiles_carry_the_published_values():
    q8 = load_profile("qwen-8b-a100")
    assert q8.name == "qwen-8b-a100"
    assert replace(q8, name="paper") == paper_gpu()  # the paper's instance GPU
    assert (q8.alpha, q8.beta, q8.gamma, q8.chunk, q8.batch) == (0.0174, 6.2e-5, pytest.approx(45.45), 256, 16)
    q4 = load_profile("qwen-4b-a100")
    assert (q4.alpha, q4.beta, q4.gamma) == (0.0152, 3.6e-5, pytest.approx(52.63))
    assert profile_info("qwen-8b-a100")["r2"] == 0.998 and profile_info("qwen-4b-a100")["r2"] == 0.997
    for n in ("qwen-8b-a100", "qwen-4b-a100"):
        assert "arXiv:2602.02987" in profile_info(n)["source"]
    v = load_profile("llama2-7b-v100")
    assert (v.beta, v.tau_solo, v.batch, v.kv_capacity, v.kv_time_per_token) == (3.2e-4, 0.017, 128, 30000, 7e-7)
    # The mapping reproduces the paper's decode range: 0.017 s empty, ~0.037 s with a full KV cache.
    assert v.tau_solo + v.kv_capacity * v.kv_time_per_token == pytest.approx(0.038)
    assert "arXiv:2408.13510" in profile_info("llama2-7b-v100")["source"]


def test_unknown_profile_lists_the_known_names():
    with pytest.raises(ScenarioError, match="unknown GPU profile 'h100-dream'; known profiles: qwen-8b-a100, "
                                            "qwen-4b-a100, llama2-7b-v100"):
        load_profile("h100-dream")
    with pytest.raises(ScenarioError, match="expected a profile name"):
        load_profile(3)  # type: ignore[arg-type]


def test_list_profiles_frame():
    df = list_profiles()
    assert tuple(df.index) == profile_names()
    assert {"qwen-8b-a100", "qwen-4b-a100", "llama2-7b-v100"} <= set(df.index)
    for col in ("alpha", "beta", "tau_solo", "gamma", "chunk", "batch", "tau_mix", "r2", "source"):
        assert col in df.columns
    assert df.loc["qwen-8b-a100", "tau_mix"] == pytest.approx(0.0174 + 6.2e-5 * 256)
    assert math.isnan(df.loc["llama2-7b-v100", "r2"])  # not published
    assert (df["source"].str.len() > 20).all()


def test_example_csv_is_documented_synthetic_and_reproducible():
    from importlib.resources import files

    text = files("fluidopt.profiles").joinpath("example-qwen-8b-a100.csv").read_text()
    assert "SYNTHETIC" in text and "seed=2602" in text
    regenerated = synthetic_measurements(A8, B8, 1 / G8, seed=2602)
    shipped = read_measurements(EXAMPLE).reset_index(drop=True)
    np.testing.assert_allclose(shipped["iteration_seconds"], regenerated["iteration_seconds"], rtol=1e-12)
    np.testing.assert_array_equal(shipped["chunk_tokens"], regenerated["chunk_tokens"])
    assert list(shipped["mode"]) == list(regenerated["mode"])
    fit = fit_iteration_time(EXAMPLE)
    assert fit.alpha_ci[0] <= A8 <= fit.alpha_ci[1] and fit.beta_ci[0] <= B8 <= fit.beta_ci[1]
    assert fit.gamma == pytest.approx(G8, rel=0.02)


def test_synthetic_measurements_are_deterministic():
    a = synthetic_measurements(A8, B8, 0.022, seed=5)
    b = synthetic_measurements(A8, B8, 0.022, seed=5)
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(synthetic_measurements(A8, B8, 0.022, seed=6))


@pytest.mark.integration
def test_library_imports_neither_the_profiler_nor_statsmodels_for_named_profiles():
    code = (
        "import sys; from fluidopt.scenario import loads_scenario; import fluidopt.calibration as c;"
        "c.load_profile('qwen-8b-a100');"
        "print('fluidopt.profiles.profile_vllm' in sys.modules, 'statsmodels' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["False", "False"]


# ------------------------------------------------------------------------------------------------
# The profiler's measuring loop, driven by a fake engine
# ------------------------------------------------------------------------------------------------
def test_profiler_loop_with_fake_engine(tmp_path):
    from fluidopt.profiles.profile_vllm import FakeEngine, measurement_plan, profile_iterations

    plan = measurement_plan([64, 256, 1024], decodes=15, repeats=4, solo_repeats=6, seed=1)
    assert len(plan) == 18 and (plan["chunk_tokens"] == 0).sum() == 6
    assert set(plan.loc[plan["mode"] == "solo", "decodes"]) == {16}  # B = decodes + 1 on a solo GPU
    assert not plan["chunk_tokens"].is_monotonic_increasing  # randomised order against drift
    pd.testing.assert_frame_equal(plan, measurement_plan([64, 256, 1024], decodes=15, repeats=4, solo_repeats=6, seed=1))

    seen = []
    engine = FakeEngine(A8, B8, 1 / G8, rel_noise=0.01, seed=3)

    def step(c: int, d: int) -> float:
        seen.append((c, d))
        return engine(c, d)

    df = profile_iterations(step, [32, 128, 256, 512, 1024], repeats=8, solo_repeats=10, warmup=2, seed=4)
    assert engine.calls == 2 + 50 and seen[:2] == [(1024, 15), (1024, 15)]  # warm-up at the largest chunk
    assert list(zip(df["chunk_tokens"], df["decodes"])) == seen[2:]
    fit = fit_iteration_time(df)
    assert fit.alpha_ci[0] <= A8 <= fit.alpha_ci[1] and fit.beta_ci[0] <= B8 <= fit.beta_ci[1]
    assert fit.tau_solo_ci[0] <= 1 / G8 <= fit.tau_solo_ci[1]
    with pytest.raises(ValueError, match=r"step\(64, 15\) returned 0\.0; expected a positive time"):
        profile_iterations(lambda c, d: 0.0, [64], repeats=1, solo_repeats=0, warmup=0)


def test_profiler_main_dry_run_writes_a_fittable_csv(tmp_path, capsys):
    from fluidopt.profiles.profile_vllm import main

    out = tmp_path / "dry.csv"
    assert main(["--fake", "0.0174,6.2e-5,0.022", "--repeats", "3", "--solo-repeats", "5", "--out", str(out)]) == 0
    assert "SYNTHETIC" in out.read_text().splitlines()[0]
    fit = fit_iteration_time(out)
    assert fit.n_points == 27 and fit.n_solo == 5
    assert "tau = alpha + beta * C" in capsys.readouterr().out


def test_fit_result_is_frozen():
    fit = fit_iteration_time(synthetic_measurements(A8, B8, None, seed=0))
    assert isinstance(fit, CalibrationFit)
    with pytest.raises(AttributeError):
        fit.alpha = 1.0  # type: ignore[misc]


def test_a_table_unfit_for_a_fit_is_refused_before_statsmodels_is_imported(tmp_path):
    # one subprocess (about 0.6 CPU-s): the refusals of read_measurements and of the row counts come first,
    # so `fluidopt calibrate` on a bad table does not pay statsmodels' import (about 2 CPU-s)
    bad = tmp_path / "bad.csv"
    bad.write_text("chunk_tokens,iteration_seconds\n64,0.02\n128,fast\n256,0.03\n")
    one = tmp_path / "one.csv"
    one.write_text("chunk_tokens,iteration_seconds\n64,0.02\n64,0.021\n64,0.019\n")
    code = ("import sys\n"
            "from fluidopt.calibration.fit import fit_iteration_time\n"
            "from fluidopt.core.errors import CalibrationError\n"
            "for path in sys.argv[1:]:\n"
            "    try:\n"
            "        fit_iteration_time(path)\n"
            "    except CalibrationError as e:\n"
            "        print(e)\n"
            "print('statsmodels' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code, str(bad), str(one)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        f"{bad}: line 3: iteration_seconds = 'fast': expected a number",
        f"{one}: chunk_tokens takes a single value (64) over the 3 mixed rows; the slope beta needs at least two "
        "distinct chunk sizes",
        "False"]
