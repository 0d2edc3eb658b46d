"""Oracles for the arrival-cohort revenue (fluidopt.sim.cohort): every number computed by hand from the
module docstring, not from the code.

Definitions used (fluidopt/sim/cohort.py docstring, docs/simulator.md section 5):

* the cohort is the requests with warmup <= arrival < horizon;
* bundled value of a completed request: c_p * prompt + c_d * output (tokens service: its own tokens);
  separate value: c_p * prompt for every request whose first prefill completed (finite TTFT),
  plus c_d * output for every completed one;
* revenue per GPU per second = the cohort's value / (GPUs * (horizon - warmup));
* its 95% half-width: batch means over ``batches`` equal slices of the window, each request in the
  slice it *arrived* in; a slice's value is its requests' value / (GPUs * slice length), so that the
  mean of the slice values is the revenue; half-width = t_{0.975, K-1} * sd(slice values) / sqrt(K).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest

from fluidopt.core.model import GPUProfile, RequestClass, Scenario
from fluidopt.sim.cohort import CohortTracker, cohort_from_records

CP, CD = 0.1, 0.2
T_975_3 = 3.182446305284263  # Student t, 97.5% quantile, 3 degrees of freedom (a table value)


def _scenario(gpus: int = 2) -> Scenario:
    gpu = GPUProfile(alpha=0.01, beta=0.0, tau_solo=0.01, chunk=256, batch=4)
    cl = (RequestClass("a", prompt=100, decode=200, rate=1.0, patience=0.5),)
    return Scenario(gpu=gpu, gpus=gpus, classes=cl, prefill_price=CP, decode_price=CD, name="cohort-hand")


# window [2, 10), 4 slices of L = 2 s, 2 GPUs: a slice's value is divided by 2 * 2 = 4 GPU-seconds
ROWS = [  # arrival, prompt, output, outcome, ttft        bundled / separate value, slice
    (1.0, 50, 50, "completed", 0.1),                  # before the window: not in the cohort
    (2.5, 10, 20, "completed", 0.1),                  # 1 + 4 = 5 / 5,                  slice 0
    (3.0, 20, 10, "completed", 0.1),                  # 2 + 2 = 4 / 4,                  slice 0
    (4.5, 30, 30, "completed", 0.1),                  # 3 + 6 = 9 / 9,                  slice 1
    (6.2, 60, 60, "abandoned_prefill", math.nan),     # 0 / 0 (never prefilled),        slice 2
    (7.0, 40, 50, "abandoned_decode", 0.3),           # 0 / 0.1 * 40 = 4 (prefill only), slice 2
    (8.0, 10, 10, "completed", 0.1),                  # 1 + 2 = 3 / 3,                  slice 3
    (9.9, 70, 70, "dropped", math.nan),               # 0 / 0,                          slice 3
    (10.5, 80, 80, "completed", 0.1),                 # after the window: not in the cohort
]


def _records() -> pd.DataFrame:
    df = pd.DataFrame(ROWS, columns=["arrival", "prompt", "output", "outcome", "ttft"])
    df["class"] = "a"
    df["end"] = df["arrival"] + 1.0
    return df


def test_cohort_revenue_and_batch_means_half_width_by_hand():
    m = cohort_from_records(_records(), _scenario(gpus=2), warmup=2.0, horizon=10.0, service="tokens", batches=4)
    # bundled: slices 9, 9, 0, 3 -> / (2 GPUs * 2 s) = 2.25, 2.25, 0, 0.75; total 21 / (2 * 8) = 1.3125
    assert m["cohort_revenue_per_gpu"] == pytest.approx(21 / 16, rel=1e-12)
    # sd of (2.25, 2.25, 0, 0.75) with ddof 1: sum of squared deviations 3.796875 / 3 -> sd 1.125
    assert m["cohort_revenue_per_gpu_ci"] == pytest.approx(T_975_3 * 1.125 / 2, rel=1e-9)
    # separate: slices 9, 9, 4, 3 -> 2.25, 2.25, 1, 0.75; total 25 / 16
    assert m["cohort_revenue_per_gpu_separate"] == pytest.approx(25 / 16, rel=1e-12)
    sd_sep = math.sqrt(1.921875 / 3)
    assert m["cohort_revenue_per_gpu_separate_ci"] == pytest.approx(T_975_3 * sd_sep / 2, rel=1e-9)
    assert (m["cohort_arrived"], m["cohort_completed"], m["cohort_abandoned"], m["cohort_dropped"]) == (7, 4, 2, 1)
    assert m["cohort_unresolved"] == 0 and m["cohort_drained"] is True
    assert m["drain_seconds"] == pytest.approx(0.9)  # the last cohort request (9.9) ends at 10.9
    pc = m["per_class"]
    assert pc.loc["a", "revenue_per_gpu"] == pytest.approx(21 / 16)
    assert pc.loc["a", "revenue_per_gpu_separate"] == pytest.approx(25 / 16)


def test_half_width_scales_with_the_gpus_and_the_slice_length_not_the_window():
    """Each slice's value is divided by GPUs * slice length: one GPU doubles every slice value (and the
    half-width); the same requests over 2 slices of 4 s halve the slice values of 4 slices of 2 s
    summed pairwise."""
    one = cohort_from_records(_records(), _scenario(gpus=1), warmup=2.0, horizon=10.0, service="tokens", batches=4)
    assert one["cohort_revenue_per_gpu"] == pytest.approx(21 / 8)
    assert one["cohort_revenue_per_gpu_ci"] == pytest.approx(T_975_3 * 2.25 / 2, rel=1e-9)
    two = cohort_from_records(_records(), _scenario(gpus=2), warmup=2.0, horizon=10.0, service="tokens", batches=2)
    # slices (9 + 9) / (2 * 4) = 2.25 and (0 + 3) / 8 = 0.375: mean 1.3125, sd |2.25 - 0.375| / sqrt 2
    t1 = 12.706204736174707  # t_{0.975, 1}
    assert two["cohort_revenue_per_gpu"] == pytest.approx(21 / 16)
    assert two["cohort_revenue_per_gpu_ci"] == pytest.approx(t1 * (1.875 / math.sqrt(2)) / math.sqrt(2), rel=1e-9)


def test_markov_service_prices_a_request_at_its_class_means():
    m = cohort_from_records(_records(), _scenario(gpus=2), warmup=2.0, horizon=10.0, service="markov", batches=4)
    # every completed request is worth 0.1 * 100 + 0.2 * 200 = 50: slices 100, 50, 0, 50 over 4 GPU-s
    assert m["cohort_revenue_per_gpu"] == pytest.approx(200 / 16)
    vals = np.array([25.0, 12.5, 0.0, 12.5])
    assert m["cohort_revenue_per_gpu_ci"] == pytest.approx(T_975_3 * vals.std(ddof=1) / 2, rel=1e-9)
    # separate: the abandoned-in-decode request earns its class's prefill part, 0.1 * 100 = 10
    assert m["cohort_revenue_per_gpu_separate"] == pytest.approx(210 / 16)


def test_tracker_folds_chunks_into_the_same_numbers():
    """The engine's path: CohortTracker.add over two chunks of record arrays, then metrics()."""
    df = _records()
    code = {"completed": 0, "abandoned_prefill": 1, "abandoned_decode": 2, "dropped": 3, "in_system": 4}
    tr = CohortTracker(1, 2.0, 10.0, 4, 30.0, cp=[CP], cd=[CD], mean_prompt=[100.0], mean_output=[200.0],
                       markov=False, n_gpus=2)
    for part in (df.iloc[:4], df.iloc[4:]):
        tr.add({"cls": np.zeros(len(part), np.int64), "arrival": part["arrival"].to_numpy(float),
                "prompt": part["prompt"].to_numpy(float), "output": part["output"].to_numpy(float),
                "outcome": part["outcome"].map(code).to_numpy(np.int64), "end": part["end"].to_numpy(float),
                "ttft": part["ttft"].to_numpy(float)})
    tr.arrived = np.array([7.0])
    m = tr.metrics()
    assert m["cohort_revenue_per_gpu"] == pytest.approx(21 / 16)
    assert m["cohort_revenue_per_gpu_ci"] == pytest.approx(T_975_3 * 1.125 / 2, rel=1e-9)
    assert m["drain_cap"] == 30.0 and tr.pending() == 0


def test_engine_cohort_matches_a_second_implementation_from_its_records(tmp_path):
    """A drained tokens run: the engine's cohort revenue and half-width against the definitions applied
    by hand (pandas) to the run's own records."""
    from fluidopt.sim.api import simulate

    sc = _scenario(gpus=2)
    sc = Scenario(gpu=sc.gpu, gpus=2, classes=(RequestClass("a", prompt=100, decode=20, rate=6.0, patience=0.5),),
                  prefill_price=CP, decode_price=CD, name="cohort-run")
    path = tmp_path / "rec.csv"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = simulate(sc, "fcfs", horizon=60.0, warmup=10.0, seed=3, service="tokens", batches=5, drain=200.0,
                       records=path, progress=False)
    rec = pd.read_csv(path)
    coh = rec[(rec["arrival"] >= 10.0) & (rec["arrival"] < 60.0)].copy()
    assert len(coh) > 100 and (coh["outcome"] != "in_system").all()
    done = coh["outcome"] == "completed"
    coh["value"] = np.where(done, CP * coh["prompt"] + CD * coh["output"], 0.0)
    coh["slice"] = np.floor((coh["arrival"] - 10.0) / 10.0).astype(int)
    per = coh.groupby("slice")["value"].sum().reindex(range(5), fill_value=0.0).to_numpy() / (2 * 10.0)
    from scipy import stats

    c = res.cluster
    assert c["cohort_revenue_per_gpu"] == pytest.approx(coh["value"].sum() / (2 * 50.0), rel=1e-9)
    assert c["cohort_revenue_per_gpu_ci"] == pytest.approx(
        stats.t.ppf(0.975, 4) * per.std(ddof=1) / math.sqrt(5), rel=1e-9)
    assert c["cohort_arrived"] == len(coh) and c["cohort_completed"] == int(done.sum())


def test_a_request_just_before_the_horizon_falls_in_the_last_slice():
    """(arrival - warmup) / L can round up to K for an arrival one ulp before the horizon
    (0.9999999999999999 / (1/3) = 3.0): it belongs to the last of the K slices, not past them."""
    df = pd.DataFrame({"class": ["a", "a"], "arrival": [0.1, 0.9999999999999999], "prompt": [10, 10],
                       "output": [10, 10], "outcome": ["completed", "completed"], "end": [0.5, 1.5],
                       "ttft": [0.1, 0.1]})
    m = cohort_from_records(df, _scenario(gpus=1), warmup=0.0, horizon=1.0, service="tokens", batches=3)
    # 3 per request (1 + 2); slices 3 / (1/3) = 9, 0, 9 per GPU-second
    assert m["cohort_revenue_per_gpu"] == pytest.approx(6.0)
    assert m["cohort_revenue_per_gpu_ci"] == pytest.approx(
        4.302652729911275 * np.std([9.0, 0.0, 9.0], ddof=1) / math.sqrt(3), rel=1e-9)


def test_records_of_unknown_classes_and_the_per_class_index():
    from fluidopt.core.errors import UsageError

    df = _records()
    df.loc[0, "class"] = "zz"
    with pytest.raises(UsageError, match=r"cohort_from_records: classes \['zz'\] are not the scenario's \['a'\]"):
        cohort_from_records(df, _scenario(), warmup=2.0, horizon=10.0)
    m = cohort_from_records(_records(), _scenario(), warmup=2.0, horizon=10.0, batches=4)
    assert m["per_class"].index.name == "class" and list(m["per_class"].index) == ["a"]
    assert m["per_class"].loc["a", "arrived"] == 7 and m["per_class"].loc["a", "completed"] == 4


def test_an_undrained_cohort_warns_at_the_callers_line():
    from fluidopt.sim.api import simulate
    from fluidopt.sim.cohort import CohortWarning

    sc = Scenario(gpu=_scenario().gpu, gpus=1, classes=(RequestClass("a", prompt=100, decode=2000, rate=5.0),),
                  prefill_price=CP, decode_price=CD, name="undrained")
    with pytest.warns(CohortWarning, match="were still in the system 1 s after the horizon") as rec:
        res = simulate(sc, "fcfs", horizon=20.0, warmup=5.0, seed=1, service="tokens", drain=1.0, progress=False)
    # pointed past the simulator's own frames, at its caller (this file; under mutation testing a wrapper)
    import os

    assert not rec[0].filename.endswith(os.path.join("fluidopt", "sim", os.path.basename(rec[0].filename)))
    assert rec[0].filename == __file__ or "mutmut" in rec[0].filename
    assert res.cluster["cohort_drained"] is False and res.cluster["cohort_unresolved"] > 0
