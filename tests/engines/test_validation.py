"""``fluidopt validate`` and the measured-run reader: formats, the errors a user meets, the JSON names
scripts rely on, and the comparison on DistServe's measured vLLM runs (../shared, skipped without it)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fluidopt.cli import main
from fluidopt.core.errors import TraceError
from fluidopt.engines.validation import FIELDS, read_measured

# ../shared beside the checkout (a worktree one level deeper finds it too)
DATA = next((p / "shared/data/distserve-opt13b-a100" for p in Path(__file__).resolve().parents[2:]
             if (p / "shared/data/distserve-opt13b-a100").is_dir()), Path("../shared/data/distserve-opt13b-a100"))
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="shared DistServe data not found")
ROOT = Path(__file__).resolve().parents[2]

ROWS = [dict(prompt_len=10, output_len=3, issue_time=100.5, ttft_ms=30.0, tpot_ms=12.0, latency_ms=54.0),
        dict(prompt_len=20, output_len=1, issue_time=100.0, ttft_ms=40.0, tpot_ms=0.0, latency_ms=40.0)]
LAW = "[timemodel]\nprefill = [0.010, 0.001, 0.0]\ndecode_small = [0.005, 0.0, 0.001]\n"


def write_exp(path: Path, rows=ROWS) -> Path:
    path.write_text(repr(rows) + "\n{\n\tnum_requests: 2\n}\n")
    return path


def test_exp_and_csv_read_alike_sorted_by_arrival(tmp_path):
    e = read_measured(write_exp(tmp_path / "r.exp"))
    c = tmp_path / "r.csv"
    c.write_text(",".join(FIELDS) + "\n" + "\n".join(",".join(str(r[k]) for k in FIELDS) for r in ROWS) + "\n")
    cc = read_measured(c)
    for run in (e, cc):
        assert list(run.arrival) == [0.0, 0.5] and list(run.prompt) == [20, 10]
        assert run.ttft == pytest.approx([0.040, 0.030]) and run.attainment(0.035, 0.1) == 0.5


@pytest.mark.parametrize("text, fragment", [
    ('{"not": "a run"}\n', "not a measured run"),
    ("[1, 2\n", "not a Python literal"),
    ("[1, 2]\n", "not a list of dicts"),
    ("[{'prompt_len': 10}]\n", "output_len is missing"),
    ("[{'prompt_len': 0, 'output_len': 1, 'issue_time': 0, 'ttft_ms': 1, 'tpot_ms': 1, 'latency_ms': 1}]\n",
     "prompt_len = 0"),
    ("time,prompt_tokens\n0,1\n", "not a measured run"),
])
def test_other_formats_are_one_line_naming_the_file(tmp_path, text, fragment):
    f = tmp_path / "m.exp"
    f.write_text(text)
    with pytest.raises(TraceError) as e:
        read_measured(f)
    assert fragment in str(e.value) and str(f) in str(e.value) and "\n" not in str(e.value)


def test_validate_replays_and_writes_the_figure(tmp_path, capsys):
    # the two requests by hand: r20 at 0 prefills alone (0.010 + 0.020 = 0.030 s, its only token);
    # r10 at 0.5 finds the instance idle: 0.020 s, then two decodes of 0.006 s: TTFT 20 ms, TPOT 6 ms
    law = tmp_path / "law.toml"
    law.write_text(LAW)
    out = tmp_path / "figs"
    argv = ["validate", str(write_exp(tmp_path / "r.exp")), "--timemodel", str(law), "--out", str(out), "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    for k in ("attainment_measured", "attainment_simulated", "ttft_median_ms_measured", "ttft_median_ms_simulated",
              "tpot_median_ms_measured", "tpot_median_ms_simulated"):
        assert k in d
    assert d["ttft_median_ms_simulated"] == pytest.approx((30 + 20) / 2)
    assert d["tpot_median_ms_simulated"] == pytest.approx((0 + 6) / 2)
    assert d["ttft_relerr_median"] == pytest.approx(np.median([abs(30 - 40) / 40, abs(20 - 30) / 30]))
    assert (out / "r-vllm-cdf.png").stat().st_size > 1000


@pytest.mark.parametrize("extra, fragment", [
    (["--engine", "vlm"], "no such engine (did you mean 'vllm'?)"),
    (["--profile", "{p}", "--model", "facebook/opt-66b", "--tp", "1"], "no model 'facebook/opt-66b'"),
    (["--profile", "{p}", "--model", "facebook/opt-13b", "--tp", "8"], "has no TP degree 8"),
    (["--profile", "{neg}", "--model", "facebook/opt-13b", "--tp", "1"], "prefill[1] = -0.1"),
    (["--profile", "{p}"], "needs --model NAME and --tp N"),
    (["--slo-ttft-ms", "0"], "--slo-ttft-ms: expected a time in ms > 0"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, monkeypatch, extra, fragment):
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "p.json"
    p.write_text(json.dumps({"facebook/opt-13b": {"1": {"prefill": [22.0, 0.1, 0.0], "decoding_smallbs": [20.0, 0.0, 0.1]}}}))
    neg = tmp_path / "neg.json"
    neg.write_text(json.dumps({"facebook/opt-13b": {"1": {"prefill": [22.0, -0.1, 0.0],
                                                          "decoding_smallbs": [20.0, 0.0, 0.1]}}}))
    exp = write_exp(tmp_path / "r.exp")
    law = tmp_path / "law.toml"
    law.write_text(LAW)
    extra = [x.format(p=p, neg=neg) for x in extra]
    base = [] if "--profile" in extra else ["--timemodel", str(law)]
    before = sorted(tmp_path.iterdir())
    assert main(["validate", str(exp), *base, *extra]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1
    assert sorted(tmp_path.iterdir()) == before


def test_a_measured_file_of_another_format(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    law = tmp_path / "law.toml"
    law.write_text(LAW)
    scen = ROOT / "examples/scenarios/paper-two-class.toml"
    assert main(["validate", str(scen), "--timemodel", str(law)]) == 2
    err = capsys.readouterr().err
    assert "paper-two-class.toml" in err and "not a measured run" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["law.toml"]


@needs_data
def test_distserve_profile_as_shipped_on_the_measured_vllm_runs(capsys):
    # The shipped profile (with max_num_tokens.csv's 66,144 KV tokens) on the four runs: these are the
    # numbers docs/fidelity.md reports, a regression guard for the replay (not the acceptance target).
    runs = sorted(DATA.glob("measured/vllm-*.exp"), key=lambda f: int(f.stem.split("-")[1]))
    argv = ["validate", *map(str, runs), "--profile", str(DATA / "profiler-a100-80g.vllm.json"),
            "--model", "facebook/opt-13b", "--tp", "1", "--no-figure", "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kv_tokens"] == 66144
    att = [(r["attainment_measured"], r["attainment_simulated"]) for r in d["runs"]]
    assert att == [(0.68, 0.6), (0.52, 0.6), (0.27, 0.46), (0.0675, 0.095)]
    assert d["mean_abs_attainment_error"] == pytest.approx(0.094375)


@needs_data
def test_fitted_law_meets_the_acceptance_targets_on_every_measured_vllm_run(capsys):
    # issue 43's acceptance: attainment within 0.08 on every run and 0.04 on average; median TTFT and
    # TPOT within 15% on every run (the law in calibration/ was fitted to these runs: docs/fidelity.md
    # reports how it does on runs left out of the fit)
    runs = sorted(DATA.glob("measured/vllm-*.exp"), key=lambda f: int(f.stem.split("-")[1]))
    assert len(runs) == 4
    argv = ["validate", *map(str, runs), "--timemodel", str(ROOT / "calibration/opt-13b-a100-vllm-fitted.toml"),
            "--no-figure", "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kv_tokens"] == 57579
    for r in d["runs"]:
        assert abs(r["attainment_error"]) <= 0.08, r["run"]
        for k in ("ttft", "tpot"):
            assert abs(r[f"{k}_median_ms_simulated"] / r[f"{k}_median_ms_measured"] - 1) <= 0.15, (r["run"], k)
    assert d["mean_abs_attainment_error"] <= 0.04


@pytest.mark.integration  # a few seconds: about 1,500 replays
def test_fit_recovers_an_engine_from_its_own_replay(tmp_path, capsys):
    # "measured" runs made by the stepper with a known law (per-request decode cost 0.4 ms; its KV cache,
    # 60,000 tokens, never full); fitted from a law with the profile's 0.06 ms, the fit meets the runs far
    # better than its start, and its TOML loads back as the law it reports
    from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw, load_law_toml
    from fluidopt.engines import engine_config, replay

    truth = IterationLaw(PrefillLaw(0.022, 1.4e-4, 8e-9), DecodeLaw((0.024, 6e-7, 4e-4)))
    rng = np.random.default_rng(3)
    files = []
    for i, rate in enumerate((4.0, 8.0)):
        arr = np.cumsum(rng.exponential(1 / rate, 60))
        p, o = rng.integers(10, 300, 60), rng.integers(2, 80, 60)
        r = replay(truth, engine_config("vllm", kv_tokens=60_000), arr, p, o)
        rows = [dict(prompt_len=int(p[k]), output_len=int(o[k]), issue_time=float(arr[k]), ttft_ms=float(r.ttft[k] * 1e3),
                     tpot_ms=float(r.tpot[k] * 1e3), latency_ms=float(r.e2e[k] * 1e3)) for k in range(60)]
        files.append(str(write_exp(tmp_path / f"run{i}.exp", rows)))
    start = tmp_path / "start.toml"
    start.write_text("[timemodel]\nprefill = [0.022, 1.4e-4, 8e-9]\ndecode_small = [0.024, 6e-7, 6e-5]\n")
    fit = tmp_path / "fitted.toml"
    assert main(["validate", *files, "--timemodel", str(start), "--no-figure", "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert main(["validate", *files, "--timemodel", str(start), "--fit", str(fit), "--no-figure", "--json"]) == 0
    after = json.loads(capsys.readouterr().out)
    assert after["law"] == load_law_toml(fit).to_dict()
    err = lambda d, k: max(abs(r[f"{k}_median_ms_simulated"] / r[f"{k}_median_ms_measured"] - 1) for r in d["runs"])  # noqa: E731
    assert err(after, "tpot") < 0.05 < err(before, "tpot")
    assert after["mean_abs_attainment_error"] <= 0.03
