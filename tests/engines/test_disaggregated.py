"""The disaggregated replay (prefill pool, KV transfer, decode pool): requests worked out by hand,
conservation across both pools and the link, and the KV admission rule."""

from __future__ import annotations

import numpy as np
import pytest

from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw
from fluidopt.core.errors import UsageError
from fluidopt.engines.disaggregated import Pool, check_fits, model_kv_bytes, replay_disaggregated

# prefill 10 ms + 1 ms per prompt token; decode step 5 ms + 1 ms per request (s)
LAW = IterationLaw(PrefillLaw(0.010, 0.001, 0.0), DecodeLaw((0.005, 0.0, 0.001)))
LINK = dict(kv_bytes_per_token=1000, link_bandwidth=1e6, link_latency=0.002)  # 1 ms per token + 2 ms


def test_kv_bytes_of_opt13b_from_its_shape():
    # K and V x 40 layers x 40 heads x 128 dims x 2 bytes (fp16)
    assert model_kv_bytes("facebook/opt-13b") == 2 * 40 * 40 * 128 * 2 == 819_200


def test_one_request_by_hand():
    # prefill 0.010 + 10 x 0.001 = 0.020 (first token); transfer 0.002 + 10 x 0.001 = 0.012;
    # two decode steps of 0.005 + 0.001 = 0.006: finish 0.044, TPOT (0.044 - 0.020) / 2 = 0.012
    s = replay_disaggregated(Pool(LAW), Pool(LAW), [0.0], [10], [3], **LINK)
    assert s.ttft == pytest.approx([0.020]) and s.transfer == pytest.approx([0.012])
    assert s.e2e == pytest.approx([0.044]) and s.tpot == pytest.approx([0.012])


def test_a_batch_then_the_link_in_turn():
    # both prompts in one batch: 0.010 + 0.030 = 0.040; the link sends r0 (0.012, to 0.052) then r1
    # (0.002 + 0.020, to 0.074); each decodes one step of 0.006 when it lands
    s = replay_disaggregated(Pool(LAW), Pool(LAW), [0.0, 0.0], [10, 20], [2, 2], **LINK)
    assert s.first_token == pytest.approx([0.040, 0.040])
    assert s.transfer_start == pytest.approx([0.040, 0.052]) and s.transfer_end == pytest.approx([0.052, 0.074])
    assert s.finish == pytest.approx([0.058, 0.080])
    # a token limit of 25 splits them: r0 alone (0.020), then r1 (0.030)
    s = replay_disaggregated(Pool(LAW, max_tokens=25), Pool(LAW), [0.0, 0.0], [10, 20], [2, 2], **LINK)
    assert s.first_token == pytest.approx([0.020, 0.050]) and s.prefill_iterations == 2


def test_decode_admits_a_request_only_when_its_kv_fits():
    # decode KV of 32 tokens = 2 blocks; r0 (20 tokens) takes both, r1 (10 tokens) waits for r0 to finish:
    # r0 lands at 0.040 + 0.022 = 0.062, two steps to 0.074; r1 leaves then: 0.074 + 0.012 + 0.006 = 0.092
    s = replay_disaggregated(Pool(LAW), Pool(LAW, kv_tokens=32), [0.0, 0.0], [20, 10], [3, 2], **LINK)
    assert s.finish[0] == pytest.approx(0.074)
    assert s.transfer_start[1] == pytest.approx(0.074) and s.finish[1] == pytest.approx(0.092)
    assert s.tpot[1] == pytest.approx(0.052)


def test_one_token_requests_never_leave_the_prefill_pool():
    s = replay_disaggregated(Pool(LAW), Pool(LAW), [0.0], [10], [1], **LINK)
    assert s.e2e == pytest.approx([0.020]) and np.isnan(s.transfer_start[0])
    assert s.counts == dict(arrived=1, prefilled=1, transferred=0, finished=1, rejected=0)


def test_conservation_across_both_pools_and_the_link():
    # two prefill and three decode instances with small caches (swaps happen): every request passes each
    # stage once, in order, and the decode steps a request was in sum to its output less the first token
    rng = np.random.default_rng(4)
    n = 400
    arr = np.cumsum(rng.exponential(0.02, n))
    P = rng.integers(1, 300, n)
    O = rng.integers(1, 120, n)
    s = replay_disaggregated(Pool(LAW, instances=2, kv_tokens=2000, max_tokens=600),
                             Pool(LAW, instances=3, kv_tokens=1200), arr, P, O, **LINK)
    moved = O > 1
    assert s.counts == dict(arrived=n, prefilled=n, transferred=int(moved.sum()), finished=n, rejected=0)
    assert np.all(np.isfinite(s.finish)) and np.all(s.first_token >= arr) and np.all(s.finish >= s.first_token)
    assert np.all(s.transfer_start[moved] >= s.first_token[moved])
    assert np.all(s.transfer_end[moved] > s.transfer_start[moved]) and np.all(s.finish[moved] > s.transfer_end[moved])
    assert set(s.prefill_instance) == {0, 1} and set(s.decode_instance[moved]) == {0, 1, 2}
    assert s.preemptions.sum() > 0  # the small decode caches forced swaps, and every swapped request finished
    # each decode step of an instance lasts at least the law's intercept plus 1 ms per request
    assert np.all(s.tpot[moved] >= 0.006 - 1e-12)


def test_bad_layouts_and_links_are_usage_errors():
    with pytest.raises(UsageError, match="bandwidth"):
        replay_disaggregated(Pool(LAW), Pool(LAW), [0.0], [1], [1], kv_bytes_per_token=1, link_bandwidth=0)
    with pytest.raises(UsageError, match="one decode instance"):
        replay_disaggregated(Pool(LAW), Pool(LAW, instances=0), [0.0], [1], [1], kv_bytes_per_token=1)
    with pytest.raises(UsageError, match="raise the TP degree"):
        check_fits("facebook/opt-66b", 1)  # 131 GB of fp16 weights on one 80 GB GPU
    check_fits("facebook/opt-13b", 1)


# ------------------------------------------------------------------------------------------------
# fluidopt validate --layout disaggregated
# ------------------------------------------------------------------------------------------------
import json  # noqa: E402
from pathlib import Path  # noqa: E402

from fluidopt.cli import main  # noqa: E402

DATA = next((p / "shared/data/distserve-opt13b-a100" for p in Path(__file__).resolve().parents[2:]
             if (p / "shared/data/distserve-opt13b-a100").is_dir()), Path("../shared/data/distserve-opt13b-a100"))
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="shared DistServe data not found")
ENTRY = {"prefill": [10.0, 1.0, 0.0], "decoding_smallbs": [5.0, 0.0, 1.0]}  # ms, as LAW above
ROWS = [dict(prompt_len=10, output_len=3, issue_time=7.0, ttft_ms=20.0, tpot_ms=12.0, latency_ms=44.0)]


def _files(tmp_path, profile=None):
    p = tmp_path / "p.json"
    p.write_text(json.dumps(profile or {"facebook/opt-13b": {"1": ENTRY, "2": ENTRY}}))
    e = tmp_path / "r.exp"
    e.write_text(repr(ROWS) + "\n")
    return p, e


def test_validate_disaggregated_by_hand_with_the_colocated_keys(tmp_path, capsys):
    # the one request of test_one_request_by_hand, over a link of 819,200 bytes/token at 8.192 GB/s
    # (1 ms per token) and 2 ms latency: TTFT 20 ms, transfer 12 ms, TPOT 12 ms -- as measured
    p, e = _files(tmp_path)
    argv = ["validate", str(e), "--profile", str(p), "--model", "facebook/opt-13b", "--layout", "disaggregated",
            "--prefill-tp", "2", "--decode-tp", "1", "--link-gbps", "0.8192", "--link-latency-ms", "2",
            "--no-figure", "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["ttft_median_ms_simulated"] == pytest.approx(20.0) and d["tpot_median_ms_simulated"] == pytest.approx(12.0)
    assert d["transfer_median_ms_simulated"] == pytest.approx(12.0) and d["attainment_error"] == 0
    for k in ("attainment_measured", "attainment_simulated", "ttft_relerr_median", "tpot_relerr_p90", "e2e_relerr_median",
              "law", "kv_tokens", "mean_abs_attainment_error"):
        assert k in d
    assert d["kv_bytes_per_token"] == 819_200 and d["layout"] == "disaggregated"


@pytest.mark.parametrize("extra, fragment", [
    (["--decode-instances", "0"], "needs a decode pool"),
    (["--link-gbps", "0"], "--link-gbps: expected a bandwidth in GB/s > 0, got 0"),
    (["--link-gbps", "-3"], "--link-gbps: expected a bandwidth in GB/s > 0"),
    (["--prefill-tp", "4"], "has no TP degree 4"),
    (["--model", "facebook/opt-66b"], "needs 131.4 GB of weights per GPU"),
    (["--model", "facebook/opt-1.3b"], "no shape known"),
    (["--tp", "1"], "--tp: not with --layout disaggregated"),
    (["--engine", "vllm"], "--engine: not with --layout disaggregated"),
    (["--fit-overheads", "law.toml"], "--fit-overheads: not with --layout disaggregated"),
    (["--link-latency-ms", "-1"], "--link-latency-ms: expected a time in ms >= 0"),
    (["--prefill-entry-ms", "-1"], "--prefill-entry-ms: expected a time in ms >= 0"),
    (["--prefill-cost", "batch"], "--prefill-cost: only with --fit-costs"),
])
def test_disaggregated_bad_input_is_one_line_exit_2(tmp_path, capsys, monkeypatch, extra, fragment):
    monkeypatch.chdir(tmp_path)
    entry = {"1": ENTRY, "2": ENTRY}
    p, e = _files(tmp_path, {"facebook/opt-13b": entry, "facebook/opt-66b": entry, "facebook/opt-1.3b": entry})
    args = {"--model": "facebook/opt-13b", "--prefill-tp": "2", "--decode-tp": "1"}
    args.update(dict(zip(extra[::2], extra[1::2])))
    argv = ["validate", str(e), "--profile", str(p), "--layout", "disaggregated", *sum(map(list, args.items()), [])]
    before = sorted(tmp_path.iterdir())
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1
    assert sorted(tmp_path.iterdir()) == before


def _measured(*extra):
    runs = sorted(DATA.glob("measured/distserve-c21d11-300-*.exp"), key=lambda f: int(f.stem.split("-")[-1]))
    assert len(runs) == 4
    return ["validate", *map(str, runs), "--profile", str(DATA / "profiler-a100-80g.distserve.json"),
            "--model", "facebook/opt-13b", "--layout", "disaggregated", "--prefill-tp", "2", "--decode-tp", "1",
            "--no-figure", "--json", *extra]


@needs_data
def test_distserve_profile_as_shipped_on_the_measured_disaggregated_runs(capsys):
    # the kernel-only profile: attainment right at 3 and 6 req/s, too high at 9 and 12, TPOT 21-25% short
    # (docs/fidelity.md, "Disaggregated replay"): a regression guard, not the acceptance target
    assert main(_measured()) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["kv_tokens"], d["prefill_kv_tokens"]) == (66144, 163008)
    # in requests out of 300: measured 289, 272, 164, 107; simulated 289, 277, 199, 129
    assert [r["attainment_measured"] * 300 for r in d["runs"]] == pytest.approx([289, 272, 164, 107])
    assert [r["attainment_simulated"] * 300 for r in d["runs"]] == pytest.approx([289, 277, 199, 129])
    tpot = [r["tpot_median_ms_simulated"] / r["tpot_median_ms_measured"] - 1 for r in d["runs"]]
    assert all(-0.26 < x < -0.20 for x in tpot)


@needs_data
def test_fitted_engine_costs_meet_the_acceptance_targets_on_every_run(capsys):
    # issue 44: attainment within 0.06 on every run and 0.03 on average, median TTFT and TPOT within 10%;
    # the two engine costs are fitted to the medians only (attainment is not in the fit);
    # the prefill side's cost is, by default, a latency before the prefill pool (docs/fidelity.md: it
    # generalises to a run left out, where a cost per batch did not: tests/engines/test_disagg_costs.py)
    assert main(_measured("--fit-costs")) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["decode_request_ms"] == pytest.approx(0.224, abs=0.002)
    assert d["prefill_entry_ms"] == pytest.approx(6.22, abs=0.02) and d["prefill_overhead_ms"] == 0
    assert d["prefill_cost_form"] == "entry"
    for r in d["runs"]:
        assert abs(r["attainment_error"]) <= 0.06
        for k in ("ttft", "tpot"):
            assert abs(r[f"{k}_median_ms_simulated"] / r[f"{k}_median_ms_measured"] - 1) <= 0.10
    assert d["mean_abs_attainment_error"] <= 0.03
