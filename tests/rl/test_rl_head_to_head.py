"""Head to head: trace windows as episodes and the Azure example on a tiny slice (c; skips without the trace),
the revenue example (b) at a small size."""

from __future__ import annotations

import importlib.util

import numpy as np
import pandas as pd
import pytest

from fluidopt.core.errors import ScenarioError
from fluidopt.rl.evaluate import evaluate, trace_episodes
from fluidopt.workloads import TraceWorkload

from .conftest import ROOT, tiny_scenario


def _trace(n=50, speedup=1.0):
    t = 10.0 + np.arange(n) * 0.5
    df = pd.DataFrame({"time": t, "prompt": np.arange(n) + 1, "output": (np.arange(n) % 7) * 100 + 5,
                       "cls": np.arange(n) % 2})
    return TraceWorkload(df, ("short", "long"), speedup=speedup)


def test_trace_windows_are_consecutive_rows_from_time_zero():
    tr = _trace(50, speedup=2.0)  # times already halved: 5.0, 5.25, ...
    eps = trace_episodes(tr, 20, speedup=5.0)
    assert len(eps) == 2  # the 10-row tail is dropped
    for k, w in enumerate(eps):
        rows = slice(20 * k, 20 * (k + 1))
        assert w.time[0] == 0.0
        np.testing.assert_allclose(w.time, (tr.time[rows] - tr.time[20 * k]) / 5.0)
        assert w.prompt.tolist() == tr.prompt[rows].tolist() and w.output.tolist() == tr.output[rows].tolist()
        assert w.cls.tolist() == tr.cls[rows].tolist() and w.class_names == tr.class_names
    assert len(trace_episodes(tr, 20, max_episodes=1)) == 1
    with pytest.raises(ScenarioError, match="n_requests = 60"):
        trace_episodes(tr, 60)
    with pytest.raises(ScenarioError, match="speedup"):
        trace_episodes(tr, 10, speedup=0)


def test_evaluate_replays_given_windows_for_every_router():
    sc = tiny_scenario()
    eps = trace_episodes(_trace(60), 30)
    df = evaluate(sc, ["round-robin", "jsq"], workloads=eps, seed=3)
    assert len(df) == 4 and set(df.episode) == {0, 1}
    assert (df.completed == 30).all()
    # the same episode seed (predictions) for every router in a window
    assert df.groupby("episode").seed.nunique().eq(1).all()


AZURE_EXAMPLE = ROOT / "examples" / "rl_azure_head_to_head.py"


def _example(path=AZURE_EXAMPLE):
    spec = importlib.util.spec_from_file_location(f"fluidopt_example_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_azure_head_to_head_on_a_small_slice():
    mod = _example()
    if not mod.AZURE.is_file():
        pytest.skip("the Azure conversation trace is not in ../shared/data")
    df = mod.run(mod.AZURE, requests=150, speedups=[1.0, 2.0], seed=1000, max_episodes=2,
                 policies=("round-robin", "wg-rl"), gate_and_route=("gate-and-route",))
    assert len(df) == 2 * 2 * 3 and (df.completed == 150).all()
    # doubling the speed-up doubles the replayed rate of the same windows
    r = df.groupby("speedup").rate.first()
    assert r[2.0] == pytest.approx(2 * r[1.0])
    rr = df[df.policy == "round-robin"].set_index(["speedup", "episode"]).e2e_mean
    assert (rr > 0).all()


def test_revenue_head_to_head_at_two_gpus():
    mod = _example(ROOT / "examples" / "rl_revenue_head_to_head.py")
    df = mod.run([2], seeds=2, policies=("round-robin", "least-requests"), gate_and_route=("gate-and-route",),
                 windows={2: (50.0, 350.0)})
    assert len(df) == 2 * 3 and set(df.gpus) == {2}
    from fluidopt.fluid import solve_fluid

    r_star = solve_fluid(mod.load_scenario(mod.SCENARIO).with_gpus(2)).revenue_per_gpu
    assert df.r_star.eq(r_star).all() and r_star == pytest.approx(297.70, abs=0.01)  # the paper instance's R*
    assert ((df.ratio > 0.3) & (df.ratio < 1.2)).all()
    assert df.ratio.to_numpy() == pytest.approx((df.revenue_per_gpu / r_star).to_numpy())
    s = mod.summarize(df)
    assert len(s) == 3 and (s.seeds == 2).all()
