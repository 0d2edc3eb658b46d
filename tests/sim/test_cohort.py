"""Arrival-cohort revenue (simulate(..., drain=...), fluidopt.sim.cohort): the value of the requests
that arrived in the measured window, credited when they complete, the run draining past the horizon."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest

from fluidopt import RequestClass, Scenario, default_scenario, simulate
from fluidopt.core.model import GPUProfile
from fluidopt.sim.cohort import COHORT_KEYS, CohortWarning, cohort_from_records
from fluidopt.workloads import TraceWorkload

CP, CD = 0.1, 0.2


def hand_trace():
    """One GPU with one slot, window [10, 20): every request's fate is forced by the timing.

    A (9.0, 100 + 300 tokens): arrives before the window, finishes inside it (about 12.0 s): excluded.
    C (10.5, impatient class): waits behind A (one slot) and abandons at once: earns nothing.
    D (13.0, 100 + 100): arrives and finishes inside the window: 0.1 * 100 + 0.2 * 100 = 30.
    E (14.0, 20,000-token prompt): beyond the KV capacity, dropped on arrival: earns nothing.
    B (19.0, 100 + 200): arrives inside, finishes after the horizon (about 21 s): 10 + 40 = 50.
    F (20.5): arrives after the window: not in the cohort.
    """
    gpu = GPUProfile(alpha=0.01, beta=0.0, tau_solo=0.01, chunk=256, batch=1, kv_capacity=10_000)
    classes = (RequestClass("patient", prompt=100, decode=200, rate=0.1, patience=1e-6),
               RequestClass("impatient", prompt=100, decode=200, rate=0.1, patience=1e3))
    sc = Scenario(gpu=gpu, gpus=1, classes=classes, prefill_price=CP, decode_price=CD, name="hand")
    frame = pd.DataFrame({"time": [9.0, 10.5, 13.0, 14.0, 19.0, 20.5], "prompt": [100, 100, 100, 20_000, 100, 100],
                          "output": [300, 100, 100, 10, 200, 50], "cls": [0, 1, 0, 0, 0, 0]})
    return sc, TraceWorkload(frame, sc.class_names, name="hand")


@pytest.mark.parametrize("backend", ["compiled", "python"])
def test_hand_built_trace_cohort_value(backend, tmp_path):
    sc, wl = hand_trace()
    rec = tmp_path / "rec.csv"
    res = simulate(sc, "fi-wsp", horizon=20.0, warmup=10.0, service="tokens", workload=wl, drain=50.0,
                   records=rec, backend=backend)
    r = pd.read_csv(rec).set_index("arrival")
    # the premises of the hand computation
    assert 10.0 <= r.loc[9.0, "end"] < 20.0 and r.loc[9.0, "outcome"] == "completed"  # A
    assert r.loc[10.5, "outcome"] == "abandoned_prefill"  # C
    assert r.loc[13.0, "outcome"] == "completed" and r.loc[13.0, "end"] < 20.0  # D
    assert r.loc[14.0, "outcome"] == "dropped"  # E
    assert r.loc[19.0, "outcome"] == "completed" and r.loc[19.0, "end"] > 20.0  # B
    c = res.cluster
    # cohort: D + B = 30 + 50 over 1 GPU x 10 s; the window's completions: A + D = 70 + 30
    assert c["cohort_revenue_per_gpu"] == pytest.approx(8.0, abs=1e-12)
    assert c["revenue_per_gpu"] == pytest.approx(10.0, abs=1e-12)
    # separate pricing: prefill of D, B (C never prefilled, E dropped) + decode of D, B
    assert c["cohort_revenue_per_gpu_separate"] == pytest.approx(8.0, abs=1e-12)
    assert (c["cohort_arrived"], c["cohort_completed"], c["cohort_abandoned"], c["cohort_dropped"],
            c["cohort_unresolved"]) == (4, 2, 1, 1, 0)
    assert c["cohort_drained"] is True
    assert c["drain_seconds"] == pytest.approx(r.loc[19.0, "end"] - 20.0)
    pc = res.meta["cohort"]
    assert pc.loc["impatient", "abandoned"] == 1 and pc.loc["impatient", "revenue_per_gpu"] == 0.0
    # the same numbers from the records alone
    m = cohort_from_records(rec, sc, 10.0, 20.0)
    for k in ("cohort_revenue_per_gpu", "cohort_revenue_per_gpu_separate", "cohort_arrived", "cohort_completed",
              "cohort_abandoned", "cohort_dropped", "cohort_unresolved", "drain_seconds"):
        assert m[k] == pytest.approx(c[k], abs=1e-12), k


def test_window_metrics_unchanged_by_drain():
    sc = default_scenario().with_gpus(20)
    plain = simulate(sc, "gate-and-route", horizon=300.0, warmup=100.0, seed=3)
    drained = simulate(sc, "gate-and-route", horizon=300.0, warmup=100.0, seed=3, drain=400.0)
    for k, v in plain.cluster.items():
        assert drained.cluster[k] == v or (math.isnan(v) and math.isnan(drained.cluster[k])), k
    pd.testing.assert_frame_equal(plain.per_class, drained.per_class)
    pd.testing.assert_frame_equal(plain.ci, drained.ci)
    assert plain.totals == drained.totals and plain.t_end == drained.t_end == 300.0
    assert not any(k in plain.cluster for k in COHORT_KEYS)  # the default reports no cohort


@pytest.mark.parametrize("service", ["markov", "tokens"])
def test_cohort_conservation(service, tmp_path):
    """completed + abandoned + dropped (+ unresolved) = the cohort's arrivals, as the records count them."""
    sc = default_scenario().with_gpus(10)
    rec = tmp_path / "r.csv"
    res = simulate(sc, "gate-and-route", horizon=200.0, warmup=50.0, seed=1, service=service, drain=1000.0,
                   records=rec)
    c = res.cluster
    r = pd.read_csv(rec)
    inwin = r[(r["arrival"] >= 50.0) & (r["arrival"] < 200.0)]
    assert c["cohort_arrived"] == len(inwin) > 0
    assert c["cohort_completed"] + c["cohort_abandoned"] + c["cohort_dropped"] + c["cohort_unresolved"] \
        == c["cohort_arrived"]
    assert c["cohort_unresolved"] == 0 and c["cohort_drained"] is True
    assert c["cohort_abandoned"] > 0  # (gate-and-route rations a class here: the check is not vacuous)
    assert c["cohort_completed"] == int((inwin["outcome"] == "completed").sum())
    assert (inwin["outcome"] != "in_system").all()
    m = cohort_from_records(rec, sc, 50.0, 200.0, service=service)
    assert m["cohort_revenue_per_gpu"] == pytest.approx(c["cohort_revenue_per_gpu"], rel=1e-12)


def test_cohort_cap_too_short_warns():
    sc = default_scenario().with_gpus(10)
    with pytest.warns(CohortWarning, match="still in the system"):
        res = simulate(sc, "gate-and-route", horizon=200.0, warmup=50.0, seed=1, drain=0.5)
    c = res.cluster
    assert c["cohort_drained"] is False and c["cohort_unresolved"] > 0
    assert c["cohort_completed"] + c["cohort_abandoned"] + c["cohort_dropped"] + c["cohort_unresolved"] \
        == c["cohort_arrived"]
    assert res.meta["drain_end"] == pytest.approx(200.5)


def light_trace(n_req=400, gpus=4):
    rng = np.random.default_rng(7)
    t = np.sort(rng.uniform(0.0, 200.0, n_req))
    frame = pd.DataFrame({"time": t, "prompt": rng.integers(20, 600, n_req), "output": rng.integers(5, 300, n_req),
                          "cls": rng.integers(0, 2, n_req)})
    classes = (RequestClass("a", prompt=300, decode=150, rate=1.0, patience=1e-4),
               RequestClass("b", prompt=300, decode=150, rate=1.0, patience=1e-4))
    gpu = GPUProfile(alpha=0.0174, beta=6.2e-5, tau_solo=1 / 45.45, chunk=256, batch=16)
    sc = Scenario(gpu=gpu, gpus=gpus, classes=classes, prefill_price=CP, decode_price=CD, name="light")
    return sc, TraceWorkload(frame, sc.class_names, name="light"), frame


def test_serving_every_request_earns_the_cohorts_full_value():
    sc, wl, frame = light_trace()
    w, h = 50.0, 200.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = simulate(sc, "fi-wsp", horizon=h, warmup=w, service="tokens", workload=wl, drain=300.0)
    inwin = frame[(frame["time"] >= w) & (frame["time"] < h)]
    full = float((CP * inwin["prompt"] + CD * inwin["output"]).sum()) / (sc.gpus * (h - w))
    c = res.cluster
    assert c["cohort_completed"] == c["cohort_arrived"] == len(inwin)
    assert c["cohort_revenue_per_gpu"] == pytest.approx(full, rel=1e-12)


def test_harness_ratio_cohort_is_one_when_every_request_is_served():
    """Both sides count the same arrivals: R*(window) is their value when the LP serves them all."""
    from fluidopt.harness import compare

    sc, wl, _ = light_trace()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = compare(sc, ["fi-wsp", "round-robin"], horizon=200.0, warmup=50.0, service="tokens",
                    workloads={sc.name: wl}, drain=300.0, workers=1)
        plain = compare(sc, ["fi-wsp"], horizon=200.0, warmup=50.0, service="tokens", workloads={sc.name: wl},
                        workers=1)
    assert np.allclose(c.runs["ratio_cohort"], 1.0, rtol=0, atol=1e-9)
    assert (c.runs["cohort_drained"]).all()
    assert "ratio_cohort" in c.summary().columns
    # the window measure is unchanged by the drain, and absent the drain there are no cohort columns
    assert c.runs.loc[c.runs["policy"] == "fi-wsp", "ratio_realised"].iloc[0] == plain.runs["ratio_realised"].iloc[0]
    assert "ratio_cohort" not in plain.runs.columns and "ratio_cohort" not in plain.summary().columns


def test_drain_is_validated_and_the_cli_reports_the_cohort(capsys):
    import json

    from fluidopt.cli import main
    from fluidopt.core.errors import UsageError

    for bad in (0.0, -1.0, math.inf, True):
        with pytest.raises(UsageError, match="drain"):
            simulate(default_scenario().with_gpus(4), "fi-wsp", horizon=20.0, drain=bad)
    assert main(["simulate", "--policy", "fi-wsp", "--gpus", "10", "--horizon", "100", "--warmup", "20",
                 "--drain", "300", "--json", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cohort_drained"] is True and out["cohort_arrived"] == out["cohort_completed"] \
        + out["cohort_abandoned"] + out["cohort_dropped"]
