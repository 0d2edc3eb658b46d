"""The stepping API: Engine.start / advance(until) / pause / finish.

Any sequence of advance() calls with nothing acting in between follows the same sample path as one
run, bit for bit; a pause returns control at an event; actions taken between calls are applied at
the time reached.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fluidopt
from fluidopt.control.protocol import Controller
from fluidopt.core.errors import ActionError, ScenarioError
from fluidopt.core.model import GPUProfile, RequestClass, Scenario
from fluidopt.sim.api import make_engine

BACKENDS = ["python", "compiled"]


def _engine(backend, sc, policy, *, service, horizon, seed=3, records=None, **kw):
    try:
        e = make_engine(sc, policy, horizon=horizon, warmup=0.1 * horizon, seed=seed, service=service,
                        records=records, batches=4, sample_interval=horizon / 10, backend=backend, progress=False, **kw)
    except ScenarioError as exc:
        pytest.skip(str(exc))
    assert e.engine_name == backend
    return e


def _kv_scenario(n=6):
    gpu = GPUProfile(alpha=0.017, beta=3.2e-4, tau_solo=0.02, chunk=64, batch=6, kv_capacity=3000.0,
                     kv_time_per_token=2e-6)
    cl = (RequestClass("a", prompt=300, decode=200, rate=4.0, patience=0.3, lengths="exponential"),
          RequestClass("b", prompt=900, decode=80, rate=2.0, patience=0.3, lengths="exponential"))
    return Scenario(gpu=gpu, gpus=n, classes=cl, prefill_price=0.1, decode_price=0.2)


CASES = [
    ("gate-and-route", "markov", lambda: fluidopt.default_scenario(gpus=20)),
    ("fi-wsp", "tokens", lambda: fluidopt.default_scenario(gpus=20)),
    ("jsq", "tokens", _kv_scenario),
    ("round-robin", "tokens", _kv_scenario),
]


@pytest.mark.integration
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("policy,service,make", CASES, ids=[c[0] + "-" + c[1] for c in CASES])
def test_advance_in_pieces_is_the_same_run(tmp_path, backend, policy, service, make):
    sc = make()
    horizon = 60.0
    one = _engine(backend, sc, policy, service=service, horizon=horizon, records=tmp_path / "one.csv").run()
    e = _engine(backend, sc, policy, service=service, horizon=horizon, records=tmp_path / "two.csv")
    rng = np.random.default_rng(0)
    stops = np.sort(rng.uniform(0, horizon, 37)).tolist() + [horizon + 5.0]
    stops[5] = stops[4]  # a repeated stop is a no-op
    for t in stops:
        reached = e.advance(t)
        assert reached == pytest.approx(min(t, horizon)) or e.done
        assert e.now == reached
    assert e.done
    two = e.finish()
    drop = ("wall_seconds", "requests_per_wall_second", "records")
    assert {k: v for k, v in one.summary().items() if k not in drop} == {
        k: v for k, v in two.summary().items() if k not in drop}
    pd.testing.assert_frame_equal(one.per_class, two.per_class)
    pd.testing.assert_frame_equal(one.timeseries, two.timeseries)
    assert (tmp_path / "one.csv").read_bytes() == (tmp_path / "two.csv").read_bytes()


class _PauseOnArrival(Controller):
    """FCFS to any idle prefill slot; pauses the engine at every arrival (a decision epoch)."""

    name = "pause-on-arrival"

    def __init__(self):
        self.arrivals = 0

    def on_arrival(self, ctx, r):
        self.arrivals += 1
        ctx.pause()

    def on_prefill_done(self, ctx, r, g):
        ctx.start_decode(r, g)  # decode in the slot it holds


@pytest.mark.parametrize("backend", BACKENDS)
def test_pause_returns_at_each_decision_epoch_and_the_driver_acts(backend):
    # The driver (like a Gymnasium environment) decides for the paused arrival: it starts the
    # prefill on an idle GPU itself, or leaves it to the default queue.
    sc = fluidopt.default_scenario(gpus=4)
    ctrl = _PauseOnArrival()
    e = _engine(backend, sc, ctrl, service="markov", horizon=30.0)
    e.start()
    epochs = 0
    last = 0.0
    while not e.done:
        t = e.advance()
        if e.done:
            break
        epochs += 1
        assert t >= last
        last = t
        r = e.head(0)  # the arrival just queued by the engine's default placement
        g = e.idle_prefill(0).first()
        if r >= 0 and g >= 0:
            e.start_prefill(r, g)
    res = e.finish()
    assert epochs == ctrl.arrivals == res.totals["requests"]
    tot = res.totals
    assert tot["requests"] == tot["completed"] + tot["abandoned"] + tot["dropped"] + tot["in_system"]
    assert tot["completed"] > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_actions_between_advances_take_effect_at_the_time_reached(backend):
    # A controller that never admits anything; the driver admits every 0.5 s from outside. The
    # prefills start exactly at the driver's times (ttft = wait until the next 0.5 s mark + service).
    sc = fluidopt.default_scenario(gpus=3)

    class Hold(Controller):
        name = "hold"

        def on_prefill_done(self, ctx, r, g):
            ctx.start_decode(r, g)

    e = _engine(backend, sc, Hold(), service="markov", horizon=20.0, check=True)
    t = 0.0
    starts = []
    while t < 19.5:
        t = e.advance(t + 0.5)
        assert e.now == t
        while True:
            r, g = e.head(0), e.idle_prefill(0).first()
            if r < 0 or g < 0:
                break
            e.start_prefill(r, g)
            starts.append(t)
    res = e.finish()
    assert starts and all(abs(s * 2 - round(s * 2)) < 1e-9 for s in starts)
    assert res.totals["completed"] > 0
    assert not res.interrupted


@pytest.mark.parametrize("backend", BACKENDS)
def test_finish_before_the_horizon_measures_up_to_now(backend):
    sc = fluidopt.default_scenario(gpus=5)
    e = _engine(backend, sc, "gate-and-route", service="markov", horizon=100.0)
    e.advance(40.0)
    res = e.finish()
    assert res.meta["engine"] == backend
    assert res.totals["requests"] > 0
    assert not res.interrupted
    with pytest.raises(ActionError, match="already finished"):
        e.finish()
    with pytest.raises(ActionError, match="already finished"):
        e.advance(50.0)
