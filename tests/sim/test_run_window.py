"""A run's window (fluidopt.sim.window.RunWindow): one frozen, checked object from the harness to the engine."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

import fluidopt
from fluidopt.core.errors import ScenarioError, UsageError
from fluidopt.sim.api import simulate
from fluidopt.sim.window import RunWindow


@pytest.mark.parametrize("kw, err, msg", [
    ({"horizon": 0}, ScenarioError, r"compare: horizon: expected a finite number of seconds > 0, got 0.0"),
    ({"horizon": "60"}, ScenarioError, r"compare: horizon: expected a number of seconds, got '60' \(str\)"),
    ({"horizon": 10, "warmup": 10}, ScenarioError, r"compare: warmup: expected less than the horizon 10 s, got 10 s"),
    ({"horizon": 10, "service": "fast"}, ScenarioError, r"compare: service: expected 'markov' or 'tokens', got 'fast'"),
    ({"horizon": 10, "sample_interval": -1.0}, ScenarioError, r"compare: sample_interval: expected a finite"),
    ({"horizon": 10, "drain": True}, UsageError, r"compare: drain: expected a number of seconds > 0 \(or None\)"),
])
def test_a_window_is_checked_where_it_is_made(kw, err, msg):
    with pytest.raises(err, match=msg):
        RunWindow(**kw, caller="compare")


def test_a_window_is_frozen_normalised_and_not_checked_again_when_passed_on(monkeypatch):
    w = RunWindow(60, 6, "tokens", 2, 30)
    assert (w.horizon, w.warmup, w.sample_interval, w.drain) == (60.0, 6.0, 2.0, 30.0)
    assert all(type(v) is float for v in (w.horizon, w.warmup, w.sample_interval, w.drain))
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.horizon = 1.0
    assert w == RunWindow(60.0, 6.0, "tokens", 2.0, 30.0, caller="compare")  # the caller is no part of it
    checks = []
    real = RunWindow.__post_init__
    monkeypatch.setattr(RunWindow, "__post_init__", lambda self: checks.append(self) or real(self))
    assert pickle.loads(pickle.dumps(w)) == w and not checks  # a worker receives it as it is
    sc = fluidopt.default_scenario(gpus=6)
    res = simulate(sc, "fi-wsp", window=RunWindow(20.0, 2.0), seed=1, progress=False)
    assert len(checks) == 1 and (res.horizon, res.warmup) == (20.0, 2.0)
    again = simulate(sc, "fi-wsp", horizon=20.0, warmup=2.0, seed=1, progress=False)  # made here: checked here
    assert len(checks) == 2 and again.totals == res.totals
    with pytest.raises(ScenarioError, match="either a window or horizon"):
        simulate(sc, "fi-wsp", window=RunWindow(20.0), horizon=20.0)


def test_compare_checks_each_scenarios_window_once(monkeypatch):
    from fluidopt.harness import compare

    checks = []
    real = RunWindow.__post_init__
    monkeypatch.setattr(RunWindow, "__post_init__", lambda self: checks.append(self.caller) or real(self))
    sc = fluidopt.default_scenario(gpus=6)
    c = compare(sc, ["fi-wsp", "gate-and-route"], seeds=[0, 1], horizon=20.0, warmup=2.0, workers=1,
                progress=False, save=False)
    assert checks == ["compare"] and len(c.runs) == 4 and set(c.runs["horizon"]) == {20.0}
