"""Oracles for the head-to-head summary of routers (fluidopt.rl.evaluate.summarize), on scripted
evaluation frames whose latencies are set by hand.

From the docstring: per policy, the mean over episodes of each metric with a 95% t half-width; the
improvement of mean e2e over the baseline, in percent, 100 (1 - mean e2e(policy) / mean e2e(baseline))
over the episodes both ran (positive: faster than the baseline), with a paired half-width over the
per-episode improvements 100 (1 - e2e_k(policy) / e2e_k(baseline)); the completed share; the paper's
number where Jain et al. report one.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluidopt.rl.evaluate import PAPER_IMPROVEMENT, summarize

T_975_2 = 4.302652729911275  # Student t, 97.5% quantile, 2 degrees of freedom


def _frame(latencies: dict[str, list[float]], completed: dict[str, list[int]] | None = None) -> pd.DataFrame:
    rows = []
    for pol, e2e in latencies.items():
        for k, v in enumerate(e2e):
            if v is None:
                continue
            done = (completed or {}).get(pol, [100] * len(e2e))[k]
            rows.append({"policy": pol, "episode": k, "seed": 1000 + k, "e2e_mean": v, "ttft_mean": v / 10,
                         "tpot_mean": 0.02, "e2e_p99": 3 * v, "preemptions": float(k), "router_wait_mean": math.nan,
                         "completed": done, "requests": 100, "t_end": 100.0, "wall_seconds": 0.1})
    return pd.DataFrame(rows)


def _row(summary: pd.DataFrame, pol: str) -> pd.Series:
    return summary.set_index("policy").loc[pol]


def test_improvement_of_a_faster_and_a_slower_router_by_hand():
    df = _frame({"round-robin": [2.0, 4.0, 5.0], "jsq": [1.5, 3.0, 4.5], "random": [3.0, 5.0, 5.0]},
                completed={"jsq": [100, 90, 80]})
    s = summarize(df)
    assert list(s["policy"]) == ["round-robin", "jsq", "random"]
    fast, slow, base = _row(s, "jsq"), _row(s, "random"), _row(s, "round-robin")
    # jsq: means 3 against 11/3 -> 100 (1 - 9/11) = +18.18%; per episode 25, 25, 10 %: sd sqrt(75)
    assert fast["improvement_pct"] == pytest.approx(100 * (1 - 9 / 11), rel=1e-12)
    assert fast["improvement_pct"] > 0
    assert fast["improvement_ci"] == pytest.approx(T_975_2 * math.sqrt(75) / math.sqrt(3), rel=1e-9)
    # random: means 13/3 against 11/3 -> -18.18% (slower); per episode -50, -25, 0: sd 25
    assert slow["improvement_pct"] == pytest.approx(100 * (1 - 13 / 11), rel=1e-12)
    assert slow["improvement_ci"] == pytest.approx(T_975_2 * 25 / math.sqrt(3), rel=1e-9)
    assert base["improvement_pct"] == 0.0 and base["improvement_ci"] == 0.0
    # means and half-widths over episodes
    assert fast["e2e_mean"] == pytest.approx(3.0) and fast["ttft_mean"] == pytest.approx(0.3)
    assert fast["e2e_mean_ci"] == pytest.approx(T_975_2 * 1.5 / math.sqrt(3), rel=1e-9)
    assert fast["preemptions"] == pytest.approx(1.0) and fast["preemptions_ci"] == pytest.approx(T_975_2 / math.sqrt(3))
    assert math.isnan(fast["router_wait_mean"]) and math.isnan(fast["router_wait_mean_ci"])
    assert fast["tpot_mean_ci"] == pytest.approx(0.0)
    assert fast["completed_share"] == pytest.approx(0.9) and base["completed_share"] == 1.0
    assert fast["episodes"] == 3
    assert fast["paper_improvement_pct"] == PAPER_IMPROVEMENT["jsq"] == 0.46
    assert math.isnan(slow["paper_improvement_pct"])


def test_improvement_uses_only_the_episodes_both_ran_and_the_named_baseline():
    df = _frame({"round-robin": [2.0, 4.0, None], "jsq": [1.0, 2.0, 10.0], "random": [4.0, 4.0, 4.0]})
    s = summarize(df)
    # common episodes 0 and 1: 100 (1 - 3/6) = 50%, per episode 50, 50 (sd 0)
    assert _row(s, "jsq")["improvement_pct"] == pytest.approx(50.0)
    assert _row(s, "jsq")["improvement_ci"] == pytest.approx(0.0)
    assert _row(s, "jsq")["e2e_mean"] == pytest.approx(13 / 3)  # the policy's own mean covers all its episodes
    # against random as the baseline: jsq 13/3 vs 4 -> -8.33%; round-robin (episodes 0, 1) 3 vs 4 -> +25%
    s2 = summarize(df, baseline="random")
    assert _row(s2, "jsq")["improvement_pct"] == pytest.approx(100 * (1 - (13 / 3) / 4))
    assert _row(s2, "round-robin")["improvement_pct"] == pytest.approx(25.0)
    # one common episode: no half-width
    one = summarize(_frame({"round-robin": [2.0], "jsq": [1.0]}))
    assert _row(one, "jsq")["improvement_pct"] == pytest.approx(50.0)
    assert math.isnan(_row(one, "jsq")["improvement_ci"]) and math.isnan(_row(one, "jsq")["e2e_mean_ci"])


def test_no_baseline_no_improvement_columns():
    s = summarize(_frame({"jsq": [1.0, 2.0]}))
    assert "improvement_pct" not in s.columns and "improvement_ci" not in s.columns
    assert _row(s, "jsq")["e2e_mean"] == pytest.approx(1.5)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(base=st.lists(st.floats(0.1, 100.0), min_size=2, max_size=6),
       factor=st.floats(0.05, 0.99), jitter=st.lists(st.floats(0.0, 0.5), min_size=6, max_size=6))
def test_a_router_faster_in_every_episode_has_a_positive_improvement(base, factor, jitter):
    """A router whose e2e is below the baseline's in every episode improves on it (and one above it does
    not); with every episode scaled by the same factor f the improvement is exactly 100 (1 - f) with a
    zero-width interval."""
    faster = [b * factor * (1 + 0.0 * j) for b, j in zip(base, jitter)]
    mixed = [b * factor ** (1 - j) for b, j in zip(base, jitter)]  # each below b, by different amounts
    slower = [b / f for b, f in zip(base, [factor ** (1 - j) for j in jitter])]
    df = _frame({"round-robin": base, "fast": faster, "mixed": mixed, "slow": slower})
    s = summarize(df)
    assert _row(s, "fast")["improvement_pct"] == pytest.approx(100 * (1 - factor), rel=1e-9, abs=1e-9)
    assert _row(s, "fast")["improvement_ci"] == pytest.approx(0.0, abs=1e-7)
    assert _row(s, "mixed")["improvement_pct"] > 0
    assert _row(s, "slow")["improvement_pct"] < 0
    # the interval is over per-episode improvements, each of which is positive for "mixed"
    imp = 100 * (1 - np.array(mixed) / np.array(base))
    assert _row(s, "mixed")["improvement_ci"] == pytest.approx(
        T_975(len(base)) * imp.std(ddof=1) / math.sqrt(len(base)), rel=1e-6, abs=1e-9)


def T_975(n: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.975, n - 1))


# -- evaluate(), run_episode(), policy_options() on a tiny scenario (mutation survivors, issue 35) --------


def _tiny():
    from .conftest import tiny_scenario

    return tiny_scenario()


def test_evaluate_draws_the_episodes_and_reports_every_column():
    from fluidopt.rl.core import episode_seed
    from fluidopt.rl.evaluate import evaluate

    df = evaluate(_tiny(), ["round-robin", "jsq"], episodes=2, n_requests=25, seed=4)
    assert len(df) == 4 and list(df.policy) == ["round-robin", "jsq", "round-robin", "jsq"]
    assert list(df.columns) == ["policy", "episode", "seed", "e2e_mean", "ttft_mean", "tpot_mean", "e2e_p99",
                                "preemptions", "router_wait_mean", "completed", "requests", "t_end", "wall_seconds"]
    assert (df.requests == 25).all() and (df.completed == 25).all()
    assert list(df.seed) == [episode_seed(4, 0)] * 2 + [episode_seed(4, 1)] * 2
    assert df.router_wait_mean.isna().all()  # the heuristic routers do not wait
    assert (df.tpot_mean > 0).all() and (df.e2e_mean >= df.ttft_mean).all()


def test_evaluate_hands_each_policy_its_own_options():
    from fluidopt.core.errors import UsageError
    from fluidopt.rl.evaluate import evaluate

    with pytest.raises(UsageError, match="bogus"):
        evaluate(_tiny(), ["round-robin"], episodes=1, n_requests=5, options={"round-robin": {"bogus": 1}})


def test_policy_options_seed_the_predictions():
    from fluidopt.rl.evaluate import policy_options

    jsq = policy_options("jsq", 7, accuracy=0.5)
    assert jsq["predictor"].bp.seed == 7 and jsq["predictor"].bp.accuracy == (0.5,)
    rl = policy_options("wa-rl", 9, accuracy=0.6, extra={"x": 1})
    assert rl == {"x": 1, "predictor_seed": 9, "accuracy": 0.6}
    assert policy_options("round-robin", 9) == {}


def test_run_episode_stops_once_every_request_is_resolved():
    import pandas as pd

    from fluidopt.rl.evaluate import run_episode
    from fluidopt.workloads import TraceWorkload

    sc = _tiny()
    wl = TraceWorkload(pd.DataFrame({"time": [0.0, 1.0, 2.0], "prompt": [50, 50, 50], "output": [20, 20, 20],
                                     "cls": [0, 0, 0]}), sc.class_names)
    res = run_episode(sc, "round-robin", wl, seed=1)
    assert res.totals["completed"] == 3
    # checked every 5 s after the last arrival: done by 5 s, not run on to the 3,600 s drain cap
    assert res.t_end <= 2.0 + 5.0 + 1e-9


def test_router_wait_is_read_from_the_episodes_controller(monkeypatch):
    """A router that reports ``router_wait`` (total seconds its requests waited for a routing decision,
    as the RL routers do): the row's router_wait_mean is that total over the episode's requests."""
    from fluidopt.control import registry
    from fluidopt.control.instance import RoundRobin
    from fluidopt.rl.evaluate import evaluate

    class WaitingRoundRobin(RoundRobin):
        name = "waiting-round-robin"
        router_wait = 3.0

    registry.available()  # load the built-in policies first
    monkeypatch.setitem(registry._REGISTRY, "waiting-round-robin",
                        registry._Entry("waiting-round-robin", lambda scenario: WaitingRoundRobin(), "test router"))
    df = evaluate(_tiny(), ["waiting-round-robin"], episodes=1, n_requests=12, seed=1)
    assert df.router_wait_mean.tolist() == [pytest.approx(3.0 / 12)]


def test_run_episode_waits_for_a_last_arrival_on_a_check_time():
    """The last request arrives at 5.0 s, exactly when the loop checks (every 5 s): the episode is not
    over until it has arrived and been served (the run stops only once now is past the last arrival)."""
    import pandas as pd

    from fluidopt.rl.evaluate import run_episode
    from fluidopt.workloads import TraceWorkload

    sc = _tiny()
    wl = TraceWorkload(pd.DataFrame({"time": [0.0, 1.0, 5.0], "prompt": [50] * 3, "output": [20] * 3,
                                     "cls": [0] * 3}), sc.class_names)
    res = run_episode(sc, "round-robin", wl, seed=1)
    assert res.totals["requests"] == 3 and res.totals["completed"] == 3 and res.t_end == 10.0
