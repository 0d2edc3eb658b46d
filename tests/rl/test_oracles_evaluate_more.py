"""More oracles for fluidopt.rl.evaluate (issue 35, the second mutation rerun): the default baseline
when both round-robin variants ran, and trace_episodes' default speed-up and its refusals."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fluidopt.core.errors import ScenarioError
from fluidopt.rl.evaluate import summarize, trace_episodes
from fluidopt.workloads import TraceWorkload

from .test_oracles_evaluate import _frame, _row


def test_round_robin_stays_the_baseline_when_the_chunked_variant_also_ran():
    df = _frame({"round-robin": [2.0, 4.0], "round-robin-chunked": [1.0, 2.0], "jsq": [1.5, 3.0]})
    s = summarize(df)
    # against round robin (means 3): chunked 1.5 -> +50%, jsq 2.25 -> +25%
    assert _row(s, "round-robin")["improvement_pct"] == 0.0
    assert _row(s, "round-robin-chunked")["improvement_pct"] == pytest.approx(50.0)
    assert _row(s, "jsq")["improvement_pct"] == pytest.approx(25.0)
    # without round robin the chunked variant is the baseline: jsq 2.25 against 1.5 -> -50%
    s = summarize(df[df.policy != "round-robin"])
    assert _row(s, "round-robin-chunked")["improvement_pct"] == 0.0
    assert _row(s, "jsq")["improvement_pct"] == pytest.approx(-50.0)


def _trace():
    f = pd.DataFrame({"time": [10.0, 12.0, 16.0, 20.0, 21.0], "prompt": [5] * 5, "output": [3] * 5, "cls": [0] * 5})
    return TraceWorkload(f, ("a",))


def test_trace_episodes_keep_the_traces_times_by_default():
    eps = trace_episodes(_trace(), 2)
    assert len(eps) == 2  # the fifth row, a short tail, is dropped
    assert eps[0].time.tolist() == [0.0, 2.0] and eps[1].time.tolist() == [0.0, 4.0]
    fast = trace_episodes(_trace(), 2, speedup=4.0, max_episodes=1)
    assert len(fast) == 1 and fast[0].time.tolist() == [0.0, 0.5]


@pytest.mark.parametrize("bad", [math.inf, math.nan, 0.0, -1.0, True])
def test_trace_episodes_refuse_a_speedup_that_is_not_a_finite_positive_number(bad):
    with pytest.raises(ScenarioError, match="trace_episodes: speedup: expected a number > 0"):
        trace_episodes(_trace(), 2, speedup=bad)


def test_an_episode_cut_short_by_ctrl_c_raises_instead_of_passing_for_a_whole_one():
    # Ctrl-C in an evaluation: the engine stops between two events and flags its result interrupted;
    # run_episode must raise, or `rl evaluate` / `rl regimes` would average the cut-short episode with
    # the whole ones and go on to write their table as if nothing happened.
    import os
    import signal

    from fluidopt.control.load_balancers import RandomRouter
    from fluidopt.core.interrupt import Interrupted, clear, pending
    from fluidopt.rl.core import episode_workload
    from fluidopt.rl.evaluate import run_episode
    from fluidopt.scenario import load_scenario

    class CtrlCAtTheTenthArrival(RandomRouter):
        def route(self, ctx, r):
            self.seen = getattr(self, "seen", 0) + 1
            if self.seen == 10:
                os.kill(os.getpid(), signal.SIGINT)
            return super().route(ctx, r)

    sc = load_scenario("examples/scenarios/rl-router-paper-regime.toml")
    wl = episode_workload(sc, 200, 7)
    clear()
    # a run started in the background (as CI may be) inherits Ctrl-C ignored; a user's terminal does not
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        whole = run_episode(sc, RandomRouter(), wl, seed=7)
        assert not whole.interrupted and whole.totals["completed"] == 200
        with pytest.raises(Interrupted) as info:
            run_episode(sc, CtrlCAtTheTenthArrival(), wl, seed=7)
        assert info.value.signum == signal.SIGINT and pending() == signal.SIGINT
    finally:
        signal.signal(signal.SIGINT, previous)
        clear()
