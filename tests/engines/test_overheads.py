"""The few-parameter calibration of a kernel profile to an engine (``fit_overheads``, ``kv_ceiling``,
``leave_one_out``, ``fluidopt validate --fit-overheads``): recovery on runs the stepper made with known
overheads, hand-computed pieces, and the numbers docs/fidelity.md reports on DistServe's measured vLLM
runs (../shared, skipped without it)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw, load_law_toml
from fluidopt.cli import main
from fluidopt.engines import engine_config, replay
from fluidopt.engines.validation import (
    MeasuredRun,
    fit_overheads,
    kv_ceiling,
    leave_one_out,
    read_measured,
    with_overheads,
)

from .test_validation import DATA, needs_data, write_exp

# DistServe's vLLM profile for OPT-13B/A100, rounded (s, s/token, s/token^2; s, s/context token, s/request)
PROFILE = IterationLaw(PrefillLaw(0.022, 1.4e-4, 8e-9), DecodeLaw((0.0235, 5.9e-7, 6e-5), (0.0202, 4.9e-7, 1.2e-4), 95))


def coefs(law_dict) -> list[float]:
    return [float(x) for k in sorted(law_dict) for x in np.atleast_1d(law_dict[k])]


def make_cfg(kv):
    return engine_config("vllm", kv_tokens=kv)


def test_overheads_add_to_every_iteration_and_every_decoding_request():
    law = with_overheads(PROFILE, 3e-4, 1e-3)
    # a prompt of 100 tokens: 0.022 + 0.001 + 1.4e-4 * 100 + 8e-9 * 100^2
    assert law.prefill_time([100]) == pytest.approx(0.023 + 0.014 + 8e-5, abs=1e-15)
    # 10 requests holding 5,000 tokens (small batch): 0.0235 + 0.001 + 5.9e-7 * 5000 + (6e-5 + 3e-4) * 10
    assert law.decode_time(5000, 10) == pytest.approx(0.0245 + 0.00295 + 0.0036, abs=1e-15)
    # 100 requests (large batch, from 95 on): 0.0202 + 0.001 + 4.9e-7 * 50000 + (1.2e-4 + 3e-4) * 100
    assert law.decode_time(50000, 100) == pytest.approx(0.0212 + 0.0245 + 0.042, abs=1e-15)
    assert with_overheads(PROFILE) == PROFILE


def test_kv_ceiling_by_hand():
    # A: prompt 100, 11 tokens, first token at 1 s, done at 2 s; B: prompt 50, 3 tokens, 1.5 s to 1.7 s.
    # At A's first token A holds 101 tokens (7 blocks of 16); at B's, A has made 1 + 0.5 * 10 = 6 tokens:
    # 106 tokens, 7 blocks, and B 51 tokens, 4 blocks: 11 blocks = 176 tokens; / 0.99 -> 177.8 -> 12 blocks
    run = MeasuredRun("hand", np.array([0.0, 1.0]), np.array([100, 50]), np.array([11, 3]),
                      np.array([1.0, 0.5]), np.array([0.1, 0.1]), np.array([2.0, 0.7]))
    assert kv_ceiling([run]) == 192
    assert kv_ceiling([run], watermark=0.0) == 176


def synthetic_runs(truth, kv, rates=(2.0, 4.0, 8.0), n=150, seed=7):
    rng = np.random.default_rng(seed)
    runs = []
    for i, rate in enumerate(rates):
        arr = np.cumsum(rng.exponential(1 / rate, n))
        arr -= arr[0]
        p, o = rng.integers(20, 600, n), rng.integers(2, 200, n)
        r = replay(truth, make_cfg(kv), arr, p, o)
        runs.append(MeasuredRun(f"r{i}", arr, p, o, r.ttft, r.tpot, r.e2e))
    return runs


@pytest.mark.integration  # about 700 replays: a few seconds
def test_fit_recovers_known_overheads_from_the_steppers_own_runs():
    # runs made by the stepper with the profile plus 0.3 ms per request per decode step and 1 ms per
    # iteration, KV 16,000 tokens (full at 8 requests/s: its queue grows, a few preemptions)
    truth = with_overheads(PROFILE, 3e-4, 1e-3)
    runs = synthetic_runs(truth, 16_000)
    fit = fit_overheads(runs, PROFILE, make_cfg, 16_000, per_iteration=True)
    assert (fit.per_request, fit.per_iteration, fit.loss) == (pytest.approx(3e-4, abs=1e-12),
                                                             pytest.approx(1e-3, abs=1e-12), 0.0)
    assert coefs(fit.law.to_dict()) == pytest.approx(coefs(truth.to_dict()), rel=1e-12)
    # without the per-iteration term the per-request term absorbs part of it, and the runs are missed
    alone = fit_overheads(runs, PROFILE, make_cfg, 16_000)
    assert alone.per_iteration == 0.0 and alone.per_request > 3e-4 and alone.loss > 0.1
    # the cache read off the runs, not fitted: within 4% of the truth (the tokens between a request's first
    # and last token are interpolated; the busiest run fills the cache, the others do not)
    assert 16_000 <= kv_ceiling(runs) <= 16_000 * 1.04
    assert kv_ceiling(runs[:2]) < 0.75 * 16_000


@pytest.mark.integration
def test_leave_one_out_predicts_each_run_from_the_others():
    truth = with_overheads(PROFILE, 3e-4, 0.0)
    runs = synthetic_runs(truth, 16_000, rates=(2.0, 4.0, 8.0), n=100, seed=11)
    out = leave_one_out(runs, PROFILE, make_cfg, 16_000)
    assert [f.per_request for f, _ in out] == [pytest.approx(3e-4, abs=1e-12)] * 3
    for _, c in out:  # the law is the truth, so each prediction is the run itself
        np.testing.assert_allclose(c.sim.ttft, c.run.ttft, rtol=0, atol=1e-12)


def test_fit_overheads_flags_are_one_line_exit_2(tmp_path, capsys):
    exp = write_exp(tmp_path / "r.exp")
    law = tmp_path / "law.toml"
    law.write_text("[timemodel]\nprefill = [0.010, 0.001, 0.0]\ndecode_small = [0.005, 0.0, 0.001]\n")
    for extra, fragment in ((["--per-iteration"], "--per-iteration: only with --fit-overheads"),
                            (["--fit-overheads", str(tmp_path / "a.toml"), "--leave-one-out"],
                             "--leave-one-out: needs at least two"),
                            (["--fit", str(tmp_path / "a.toml"), "--fit-overheads", str(tmp_path / "b.toml")],
                             "not both"),
                            (["--layout", "disaggregated", "--leave-one-out"],
                             "--leave-one-out: with --layout disaggregated only with --fit-costs")):
        assert main(["validate", str(exp), "--timemodel", str(law), "--no-figure", *extra]) == 2
        err = capsys.readouterr().err
        assert fragment in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["law.toml", "r.exp"]


@pytest.mark.integration
def test_fit_overheads_command_writes_a_law_that_loads_back(tmp_path, capsys):
    truth = with_overheads(PROFILE, 3e-4, 0.0)
    files = []
    for run in synthetic_runs(truth, 16_000, rates=(2.0, 8.0), n=100, seed=5):
        rows = [dict(prompt_len=int(run.prompt[k]), output_len=int(run.output[k]), issue_time=float(run.arrival[k]),
                     ttft_ms=float(run.ttft[k] * 1e3), tpot_ms=float(run.tpot[k] * 1e3),
                     latency_ms=float(run.e2e[k] * 1e3)) for k in range(len(run.arrival))]
        files.append(str(write_exp(tmp_path / f"{run.name}.exp", rows)))
    start = tmp_path / "profile.toml"
    start.write_text("[timemodel]\n" + "\n".join(f"{k} = {v!r}" for k, v in PROFILE.to_dict().items()) + "\n")
    out = tmp_path / "fitted.toml"
    argv = ["validate", *files, "--timemodel", str(start), "--fit-overheads", str(out), "--kv-tokens", "16000",
            "--leave-one-out", "--no-figure", "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["per_request_ms"] == pytest.approx(0.3) and d["per_iteration_ms"] == 0.0 and d["kv_tokens"] == 16000
    assert coefs(load_law_toml(out).to_dict()) == pytest.approx(coefs(truth.to_dict()), rel=1e-12)
    assert coefs(d["law"]) == coefs(load_law_toml(out).to_dict())
    assert d["mean_abs_attainment_error"] == 0.0 and d["leave_one_out_mean_abs_attainment_error"] == 0.0
    assert [r["per_request_ms"] for r in d["leave_one_out"]] == [pytest.approx(0.3)] * 2


SHARED = ("vllm-100-1", "vllm-200-2", "vllm-300-3", "vllm-400-4")
# DistServe's other vLLM runs of the setup (its repository at commit 20a1633): not in the shared folder
# today; checked when someone puts them there
OTHER_RATES = ("vllm-150-1.5", "vllm-100-2", "vllm-250-2.5", "vllm-350-3.5")
needs_other_rates = pytest.mark.skipif(not all((DATA / "measured" / f"{n}.exp").is_file() for n in OTHER_RATES),
                                       reason="DistServe's runs at 1.5, 2, 2.5 and 3.5 requests/s not in the shared folder")


def _runs(names=SHARED):
    return [read_measured(DATA / "measured" / f"{n}.exp") for n in names]


@needs_data
def test_kv_ceiling_of_the_measured_vllm_runs():
    # the two runs that fill the cache (3 and 4 requests/s) show the same ceiling within 48 tokens;
    # the lighter ones a lower bound only. DistServe's max_num_tokens.csv says 66,144.
    runs = _runs()
    assert [kv_ceiling([r]) for r in runs] == [13632, 27728, 56864, 56816]


@needs_data
@pytest.mark.integration  # about 250 replays of the four runs
def test_overheads_on_the_measured_vllm_runs_in_sample_and_left_out():
    # docs/fidelity.md's tables: the shipped profile plus one fitted term (0.34 ms per request per decode
    # step) and the KV cache read off the runs. These are the numbers, including where they miss issue
    # 43's targets (a regression guard, not the acceptance test).
    from fluidopt.calibration.timemodels import load_distserve_profile
    from fluidopt.engines.validation import compare

    runs = _runs()
    profile = load_distserve_profile(DATA / "profiler-a100-80g.vllm.json", "facebook/opt-13b", 1)
    fit = fit_overheads(runs, profile, make_cfg, kv_ceiling(runs))
    assert (fit.per_request, fit.kv_tokens) == (pytest.approx(3.4e-4, abs=1e-12), 56864)
    rows = [compare(r, fit.law, make_cfg(fit.kv_tokens)).to_dict() for r in runs]
    assert [round(r["attainment_error"], 4) for r in rows] == [-0.06, 0.06, -0.0467, -0.0275]
    for r in rows:
        for k in ("ttft", "tpot"):
            assert abs(r[f"{k}_median_ms_simulated"] / r[f"{k}_median_ms_measured"] - 1) <= 0.15, (r["run"], k)
    loo = [c.to_dict() for _, c in leave_one_out(runs, profile, make_cfg)]
    assert [round(r["attainment_error"], 4) for r in loo] == [-0.09, 0.06, -0.0633, -0.0275]


@needs_data
@needs_other_rates
@pytest.mark.integration
def test_overheads_calibrated_on_the_shared_runs_predicting_other_rates():
    # docs/fidelity.md: calibrated on the four shared runs, predicting 1.5, 2 (100 requests), 2.5 and
    # 3.5 requests/s; the targets are missed (0.109 at 3.5 requests/s), and these are the numbers
    from fluidopt.calibration.timemodels import load_distserve_profile
    from fluidopt.engines.validation import compare

    train = _runs()
    profile = load_distserve_profile(DATA / "profiler-a100-80g.vllm.json", "facebook/opt-13b", 1)
    kv = kv_ceiling(train)
    fit = fit_overheads(train, profile, make_cfg, kv)
    rows = [compare(r, fit.law, make_cfg(kv)).to_dict() for r in _runs(OTHER_RATES)]
    assert [round(r["attainment_error"], 3) for r in rows] == [-0.073, 0.03, -0.096, -0.109]
    # measured, the runs are not monotone in the rate: 2.5 requests/s attains more than either run at 2
    assert rows[2]["attainment_measured"] > max(rows[1]["attainment_measured"],
                                                compare(train[1], fit.law, make_cfg(kv)).to_dict()["attainment_measured"])


@needs_data
def test_the_shipped_overheads_file_is_the_profile_plus_the_fitted_cost(capsys):
    # calibration/opt-13b-a100-vllm-overheads.toml: what --fit-overheads wrote on the four shared runs
    from pathlib import Path

    from fluidopt.calibration.timemodels import load_distserve_profile

    toml = Path(__file__).resolve().parents[2] / "calibration/opt-13b-a100-vllm-overheads.toml"
    profile = load_distserve_profile(DATA / "profiler-a100-80g.vllm.json", "facebook/opt-13b", 1)
    assert coefs(load_law_toml(toml).to_dict()) == pytest.approx(coefs(with_overheads(profile, 3.4e-4).to_dict()),
                                                                 rel=1e-12)
    argv = ["validate", *(str(DATA / "measured" / f"{n}.exp") for n in SHARED), "--timemodel", str(toml),
            "--no-figure", "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kv_tokens"] == 56864
    assert [round(r["attainment_error"], 4) for r in d["runs"]] == [-0.06, 0.06, -0.0467, -0.0275]
