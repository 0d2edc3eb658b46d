"""The harness's honest benchmark on trace runs: R*(window) from the arrivals in the measured window."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

import fluidopt
from fluidopt.fluid import solve_fluid
from fluidopt.harness import compare
from fluidopt.workloads import TraceWorkload

WARMUP, HORIZON = 40.0, 260.0
POLICIES = ["gate-and-route", "fi-wsp", "gi-wsp", "fcfs", "round-robin", "backpressure-gate-and-route"]


def _drifting_trace(seed: int = 7) -> tuple[fluidopt.Scenario, TraceWorkload]:
    """A 400 s trace on 16 paper GPUs whose first 260 s run at 1.3x the whole trace's mean rate, the
    last 140 s at 0.44x; the scenario's classes are the whole trace's (rates and mean lengths), as
    :func:`fluidopt.workloads.traces.classes_from_trace` would give, planned well below capacity."""
    base = fluidopt.default_scenario(gpus=16)
    rng = np.random.default_rng(seed)
    mean_rate = 0.4 * sum(c.rate for c in base.classes)  # cluster arrivals per second over the whole trace
    parts = []
    for start, end, f in ((0.0, HORIZON, 1.3), (HORIZON, 400.0, 0.44)):
        k = rng.poisson(f * mean_rate * (end - start))
        parts.append(np.sort(rng.uniform(start, end, k)))
    t = np.concatenate(parts)
    cls = rng.integers(0, 2, t.size)
    means = np.array([[c.prompt, c.decode] for c in base.classes], float)
    prompt = np.maximum(1, np.round(rng.exponential(means[cls, 0]))).astype(np.int64)
    output = np.maximum(1, np.round(rng.exponential(means[cls, 1]))).astype(np.int64)
    frame = pd.DataFrame({"time": t, "prompt": prompt, "output": output, "cls": cls.astype(np.int64)})
    wl = TraceWorkload(frame, base.class_names, name="drifting")
    dur = 400.0
    classes = tuple(replace(c, rate=float((cls == i).sum()) / dur, prompt=float(prompt[cls == i].mean()),
                            decode=float(output[cls == i].mean())) for i, c in enumerate(base.classes))
    return replace(base, classes=classes, name="drifting-trace"), wl


@pytest.fixture(scope="module")
def trace_comparison():
    sc, wl = _drifting_trace()
    comp = compare(sc, POLICIES, seeds=[0, 1], horizon=HORIZON, warmup=WARMUP, service="tokens", workers=1,
                   workloads={sc.name: wl})
    return sc, wl, comp


@pytest.mark.integration
def test_trace_runs_report_the_window_bound_computed_independently(trace_comparison):
    sc, wl, comp = trace_comparison
    runs = comp.runs
    # independently: the window's arrivals per class (from the trace frame) over the window length,
    # with the window's mean lengths, through the plain LP
    f = wl.frame
    win = f[(f["time"] >= WARMUP) & (f["time"] < HORIZON)]
    counts = win.groupby("cls").size().reindex(range(sc.n_classes), fill_value=0).to_numpy()
    # the engine counted the same arrivals in its measured window, in every run
    for _, g in comp.classes.groupby(["policy", "seed"]):
        assert g["arrived"].tolist() == counts.tolist()
    classes = tuple(replace(c, rate=counts[i] / (HORIZON - WARMUP),
                            prompt=float(win.loc[win["cls"] == i, "prompt"].mean()),
                            decode=float(win.loc[win["cls"] == i, "output"].mean()))
                    for i, c in enumerate(sc.classes))
    expected = solve_fluid(replace(sc, classes=classes)).objective_per_gpu
    assert np.allclose(runs["lp_bound_realised"], expected, rtol=1e-9)
    assert np.allclose(runs["ratio_realised"], runs["revenue"] / expected)
    # the plain bound is still the whole trace's R*, and the window holds 1.3x its traffic
    assert np.allclose(runs["lp_bound"], solve_fluid(sc).objective_per_gpu)
    assert expected > 1.2 * runs["lp_bound"].iloc[0]


@pytest.mark.integration
def test_no_policy_beats_the_window_bound_while_the_plain_one_is_beaten(trace_comparison):
    _, _, comp = trace_comparison
    s = comp.summary().set_index("policy")
    assert set(s.index) == set(POLICIES)
    for pol, row in s.iterrows():
        assert row["ratio_realised"] <= 1 + row["ratio_realised_ci"], (pol, row["ratio_realised"])
    # the whole-trace R* is no bound on this window: some policy scores clearly above it
    assert (s["ratio"] > 1 + s["ratio_ci"]).any()


@pytest.mark.integration
def test_poisson_runs_keep_the_plain_bound_only():
    sc = fluidopt.default_scenario(gpus=4)
    comp = compare(sc, ["gate-and-route"], seeds=[0], horizon=30.0, warmup=5.0, workers=1)
    assert comp.runs["lp_bound_realised"].isna().all() and comp.runs["ratio_realised"].isna().all()
    assert comp.summary()["ratio"].notna().all()


@pytest.mark.integration
def test_a_seeded_workload_uses_each_runs_own_window_counts():
    from fluidopt.workloads import workload_from_scenario

    sc = fluidopt.default_scenario(gpus=4)
    comp = compare(sc, ["fcfs"], seeds=[0, 1], horizon=40.0, warmup=10.0, service="tokens", workers=1,
                   workloads={sc.name: workload_from_scenario(sc)})
    bounds = []
    for seed, g in comp.classes.groupby("seed"):
        counts = g["arrived"].to_numpy()
        cl = tuple(replace(c, rate=counts[i] / 30.0) for i, c in enumerate(sc.classes))
        bounds.append(solve_fluid(replace(sc, classes=cl)).objective_per_gpu)
        assert comp.runs.loc[comp.runs["seed"] == seed, "lp_bound_realised"].item() == pytest.approx(bounds[-1])
    assert bounds[0] != bounds[1]  # different seeds, different arrivals, different R*(window)


def test_bound_from_counts_checks_its_counts():
    from fluidopt.core.errors import UsageError
    from fluidopt.fluid.realised import realised_bound_from_counts

    sc = fluidopt.default_scenario(gpus=4)
    # counts at exactly the scenario's rates give its R*
    same = realised_bound_from_counts(sc, [c.rate * 50 for c in sc.classes], 10.0, 60.0)
    assert same.objective_per_gpu == pytest.approx(solve_fluid(sc).objective_per_gpu, rel=1e-9)
    with pytest.raises(UsageError, match="counts"):
        realised_bound_from_counts(sc, [1, -1], 0.0, 1.0)
    with pytest.raises(UsageError, match="window"):
        realised_bound_from_counts(sc, [1, 1], 2.0, 1.0)
