"""The placement search (fluidopt.planning.placement, `fluidopt plan --layout`): the splits it tries,
its goodput against the M/D/1 closed form, DistServe's placement case, and bad input."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw
from fluidopt.cli import main
from fluidopt.planning.placement import Split, search_placement, splits

DATA = next((p / "shared/data/distserve-opt13b-a100" for p in Path(__file__).resolve().parents[2:]
             if (p / "shared/data/distserve-opt13b-a100").is_dir()), Path("/nonexistent"))
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="shared DistServe data not found")


def test_the_splits_are_every_placement_within_the_fleet():
    for gpus, tps in ((1, (1,)), (4, (1, 2)), (6, (1, 2, 4)), (8, (2, 4))):
        want = set()
        for tp, n in itertools.product(tps, range(1, gpus + 1)):
            if tp * n <= gpus:
                want.add(Split("colocated", tp, n, tp, n))
        for tp, n, td, nd in itertools.product(tps, range(1, gpus + 1), tps, range(1, gpus + 1)):
            if tp * n + td * nd <= gpus:
                want.add(Split("disaggregated", tp, n, td, nd))
        got = splits(gpus, tps)
        assert len(got) == len(set(got)) and set(got) == want, (gpus, tps)
        assert all(s.gpus <= gpus for s in got)


def _md1_sojourn_cdf(lam: float, d: float, t: float) -> float:
    """P(waiting + service <= t) in M/D/1 (service d): Erlang's formula for the waiting time,
    P(W <= w) = (1 - rho) sum_{k=0}^{floor(w/d)} (lam (k d - w))^k / k! exp(-lam (k d - w))."""
    rho, w = lam * d, t - d
    if w < 0:
        return 0.0
    return (1 - rho) * sum((lam * (k * d - w)) ** k / math.factorial(k) * math.exp(-lam * (k * d - w))
                           for k in range(int(math.floor(w / d)) + 1))


def test_goodput_of_one_prefill_instance_is_the_md1_closed_form():
    """One-token requests finish at their prefill: a prefill instance that takes 50 ms per prompt, one
    prompt per batch, is an M/D/1 queue, and TTFT is its sojourn time. The rate at which 90% of
    sojourns stay under 200 ms, from Erlang's formula (solved here by bisection), against the search."""
    d, slo, target = 0.05, 0.2, 0.9
    lo, hi = 0.0, 1 / d
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _md1_sojourn_cdf(mid, d, slo) >= target else (lo, mid)
    exact = lo
    law = IterationLaw(PrefillLaw(d, 0.0, 0.0), DecodeLaw((0.01, 0.0, 0.0)))
    res = search_placement(lambda tp: law, lambda tp: None, [100], [1], gpus=2, tps=(1,), ttft=slo, tpot=1.0,
                           attainment=target, kv_bytes_per_token=1.0, prefill_max_tokens=100, requests=20000,
                           seed=3, rtol=0.002)
    best = res.best
    assert (best["prefill_instances"], best["decode_instances"]) == (1, 1)
    assert best["goodput"] == pytest.approx(exact, rel=0.03), (best["goodput"], exact)
    assert best["attainment"] >= target


def test_a_split_that_misses_the_slo_alone_has_no_goodput():
    # a prompt takes 0.3 s alone against a TTFT bound of 0.2 s: no rate attains
    law = IterationLaw(PrefillLaw(0.3, 0.0, 0.0), DecodeLaw((0.01, 0.0, 0.0)))
    res = search_placement(lambda tp: law, lambda tp: None, [100], [5], gpus=2, tps=(1,), kv_bytes_per_token=1.0,
                           requests=50)
    assert res.best["goodput"] == 0.0 and res.best["attainment"] == 0.0 and res.best["replays"] == 1


@needs_data
@pytest.mark.integration
def test_distserve_placement_case_within_15_percent_of_its_search():
    """OPT-13B, DistServe's profile with the engine costs fitted to its measured runs (docs/fidelity.md:
    3.13 ms per prefill batch, 0.224 ms per decode request), lengths drawn from the shipped runs, TTFT
    200 ms / TPOT 100 ms at 90%: DistServe reports 1.56 requests/s per GPU with prefill TP 2 and decode
    TP 1. At most 3 GPUs here (the suite's budget; docs/planning.md has the search on 4, where the best
    split is the same 3-GPU one), 1,500 requests per rate."""
    from fluidopt.calibration.timemodels import load_distserve_profile
    from fluidopt.commands.validate import _kv_beside
    from fluidopt.engines.disaggregated import model_kv_bytes
    from fluidopt.engines.validation import read_measured

    runs = [read_measured(f) for f in sorted(DATA.glob("measured/distserve-*.exp"))]
    prof = DATA / "profiler-a100-80g.distserve.json"
    res = search_placement(lambda tp: load_distserve_profile(prof, "facebook/opt-13b", tp),
                           lambda tp: _kv_beside(prof, "facebook/opt-13b", tp),
                           np.concatenate([r.prompt for r in runs]), np.concatenate([r.output for r in runs]),
                           gpus=3, tps=(2, 1), kv_bytes_per_token=model_kv_bytes("facebook/opt-13b"),
                           prefill_overhead=3.13e-3, decode_request_overhead=0.224e-3, requests=1500, rtol=0.02)
    b = res.best
    assert (b["layout"], b["prefill_tp"], b["prefill_instances"], b["decode_tp"], b["decode_instances"]) == \
        ("disaggregated", 2, 1, 1, 1)
    assert b["goodput_per_gpu"] == pytest.approx(1.56, rel=0.15)
    assert res.best_on_fleet == b
    # TP 1 prefill instances cannot prefill the longer prompts within 200 ms even alone
    tp1 = res.table[res.table["prefill_tp"] == 1]
    assert (tp1["goodput_per_gpu"] < 0.5).all()


@needs_data
@pytest.mark.integration
def test_cli_json_and_csv(tmp_path, capsys):
    prof = DATA / "profiler-a100-80g.distserve.json"
    out = tmp_path / "o"
    argv = ["plan", "--layout", "best", "--profile", str(prof), "--model", "facebook/opt-13b", "--gpus", "2",
            "--tp", "2", "--lengths", str(DATA / "measured/distserve-c21d11-300-3.exp"), "--requests", "200",
            "--colocated-request-ms", "0.34", "--out", str(out), "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["gpus"] == 2 and {r["layout"] for r in d["splits"]} == {"colocated"}  # TP 2 + TP 2 is 4 GPUs
    assert d["best"]["goodput_per_gpu"] == max(r["goodput_per_gpu"] for r in d["splits"])
    assert (out / "placement.csv").read_text().startswith("layout,prefill_tp,prefill_instances")


BAD = [
    (["--layout", "disaggregated"], "--layout needs --profile JSON --model NAME --gpus N"),
    (["--layout", "disaggregated", "--profile", "{p}", "--model", "facebook/opt-13b", "--gpus", "0"], "--gpus 0"),
    (["--layout", "disaggregated", "--profile", "{p}", "--model", "facebook/opt-13b", "--gpus", "4", "--tp", "3"],
     "--tp 3: the profile has TP degrees 1, 2, 4"),
    (["--layout", "disaggregated", "--profile", "{p}", "--model", "facebook/opt-66b", "--gpus", "4", "--tp", "1"],
     "--tp 1: the profile has TP degrees 2, 3, 4, 8"),
    (["--layout", "disaggregated", "--profile", "{small}", "--model", "facebook/opt-66b", "--gpus", "4", "--tp", "1"],
     "needs 131.4 GB of weights per GPU"),
    (["--layout", "disaggregated", "--profile", "{p}", "--model", "nobody/none", "--gpus", "4"], "--model 'nobody/none'"),
    (["--layout", "disaggregated", "--profile", "{p}", "--model", "facebook/opt-13b", "--gpus", "4",
      "--attainment", "1.5"], "--attainment 1.5"),
    (["--layout", "disaggregated", "--profile", "{p}", "--model", "facebook/opt-13b", "--gpus", "4",
      "--link-gbps", "0"], "--link-gbps"),
    (["--profile", "{p}"], "--profile: only with --layout"),
    (["--layout", "disaggregated", "--profile", "{p}", "--model", "facebook/opt-13b", "--gpus", "4",
      "--workers", "2"], "--workers, --dask, --scheduler: not with --layout"),
]


@needs_data
@pytest.mark.parametrize("argv, msg", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_exits_2_with_one_line(argv, msg, capsys, tmp_path):
    prof = str(DATA / "profiler-a100-80g.distserve.json")
    # a profile that claims OPT-66B at TP 1: its 131 GB of weights do not fit one 80 GB GPU
    small = tmp_path / "small.json"
    d = json.loads(Path(prof).read_text())
    small.write_text(json.dumps({"facebook/opt-66b": {"1": d["facebook/opt-66b"]["2"]}}))
    assert main(["plan", *[a.replace("{p}", prof).replace("{small}", str(small)) for a in argv]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0] and "Traceback" not in err[0], err
