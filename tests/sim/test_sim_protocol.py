"""The controller protocol, action validation, the simulate API and the CLI."""

from __future__ import annotations

import io
import json
import warnings
from contextlib import redirect_stdout

import pandas as pd
import pytest

import fluidopt
from fluidopt.cli import main
from fluidopt.control.instance import RoundRobin
from fluidopt.control.paper_baselines import FIWSP
from fluidopt.control.protocol import (
    DECODE,
    DECODE_QUEUE,
    PREFILL,
    PREFILL_QUEUE,
    WAIT_DECODE,
    WAIT_PREFILL,
    ClusterView,
    Context,
    Controller,
)
from fluidopt.control.registry import available, make_controller, register
from fluidopt.core.errors import ActionError, ScenarioError, UsageError
from fluidopt.core.model import GPUProfile, RequestClass, Scenario
from fluidopt.sim.api import simulate
from fluidopt.sim.engine import Engine
from fluidopt.workloads import TraceWarning, TraceWorkload


def _sc(n=2, batch=3, classes=("a", "b"), patience=0.0, **gpu_kw) -> Scenario:
    gpu = GPUProfile(alpha=0.01, beta=0.001, tau_solo=0.005, chunk=10, batch=batch, **gpu_kw)
    cl = tuple(RequestClass(nm, prompt=20, decode=5, rate=1.0, patience=patience) for nm in classes)
    return Scenario(gpu=gpu, gpus=n, classes=cl, prefill_price=1.0, decode_price=1.0)


def _trace(rows, names=("a", "b")) -> TraceWorkload:
    return TraceWorkload(pd.DataFrame(rows, columns=["time", "prompt", "output", "cls"]), names)


def _run(sc, ctrl, rows, horizon=10.0, service="markov", **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        return simulate(sc, ctrl, horizon=horizon, service=service, workload=_trace(rows, sc.class_names),
                        batches=2, check=True, **kw)


class Scripted(Controller):
    """Runs a test function at a given arrival, with the engine as context."""

    def __init__(self, at: int, fn):
        self.at, self.fn, self.seen = at, fn, 0
        self.out = {}

    def on_arrival(self, ctx, r):
        self.seen += 1
        if self.seen == self.at:
            self.fn(ctx, r, self.out)


def test_engine_is_a_context():
    from fluidopt.sim.window import RunWindow

    eng = Engine(_sc(), FIWSP(), _trace([(0.0, 5, 5, 0)]), window=RunWindow(1.0))
    assert isinstance(eng, Context) and isinstance(eng, ClusterView)


def test_action_errors_are_precise_and_change_nothing():
    def fn(ctx, r, out):
        g = ctx.idle_prefill().first()
        ctx.start_prefill(r, g)
        for call, msg in [
            (lambda: ctx.start_prefill(r, g), "is in prefill, not waiting for a prefill"),
            (lambda: ctx.start_decode(r, 1), "is in prefill, not waiting for a decode"),
            (lambda: ctx.start_prefill(99, 0), "request 99 is not in the system"),
            (lambda: ctx.start_prefill(r, 7), "GPU 7 does not exist"),
            (lambda: ctx.enqueue(r, PREFILL_QUEUE), "not waiting"),
            (lambda: ctx.enqueue(r, 999), "queue 999 does not exist"),
            (lambda: ctx.set_pool([0], 1), "only be declared in Controller.setup"),
            (lambda: ctx.add_queue("x"), "only be declared in Controller.setup"),
            (lambda: ctx.queue_id("nope"), "no queue named 'nope'"),
        ]:
            with pytest.raises(ActionError, match=msg):
                call()
        assert ctx.req_phase(r) == PREFILL and ctx.gpu_prefill(g) == r
        out["ok"] = True

    ctrl = Scripted(1, fn)
    _run(_sc(), ctrl, [(0.0, 5, 5, 0)])
    assert ctrl.out["ok"]


def test_busy_slot_and_caps_are_enforced():
    class Ctl(Controller):
        def setup(self, ctx):
            ctx.set_pool([1], 1, prefill=False, max_decodes=1)

        def on_arrival(self, ctx, r):
            if ctx.req_class(r) == 0:
                ctx.start_prefill(r, 0)
            else:
                with pytest.raises(ActionError, match="already runs a prefill"):
                    ctx.start_prefill(r, 0)
                with pytest.raises(ActionError, match="does not take prefills"):
                    ctx.start_prefill(r, 1)

        def on_prefill_done(self, ctx, r, g):
            if ctx.gpu_decodes(1) == 0:
                ctx.start_decode(r, 1)
            else:
                with pytest.raises(ActionError, match="its cap"):
                    ctx.start_decode(r, 1)

    res = _run(_sc(), Ctl(), [(0.0, 30, 50, 0), (0.001, 5, 5, 1), (0.1, 5, 5, 0)], service="tokens")
    assert res.totals["requests"] == 3


def test_default_placements_and_fcfs_queues():
    log = []

    class Lazy(Controller):
        """Never acts on arrival: requests wait in PREFILL_QUEUE; slot freed pulls FCFS heads."""

        def setup(self, ctx):
            self.t = 0

        def on_arrival(self, ctx, r):
            assert ctx.req_phase(r) == WAIT_PREFILL and ctx.req_queue(r) == -1

        def on_prefill_done(self, ctx, r, g):
            assert ctx.req_phase(r) == WAIT_DECODE
            assert ctx.n_wait_decode(ctx.req_class(r)) >= 1

        def on_slot_freed(self, ctx, g):
            r = ctx.head(DECODE_QUEUE)
            if r >= 0 and ctx.gpu_free(g) and ctx.gpu_decodes(g) < ctx.gpu_max_decodes(g):
                ctx.start_decode(r, g)
            if g in ctx.idle_prefill():
                r = ctx.head(PREFILL_QUEUE)
                if r >= 0:
                    log.append((ctx.req_arrival(r), ctx.req_class(r)))
                    ctx.start_prefill(r, g)

    class Kick(Lazy):
        tick_interval = 0.5

        def on_tick(self, ctx):
            for g in list(ctx.idle_prefill()):
                self.on_slot_freed(ctx, g)

    rows = [(0.1 * k, 5, 3, k % 2) for k in range(8)]
    res = _run(_sc(), Kick(), rows, horizon=20.0)
    assert res.totals["completed"] == 8
    assert [a for a, _ in log] == sorted(a for a, _ in log)  # FCFS across classes


def test_queue_views_named_queues_front_and_moves():
    def fn(ctx, r, out):
        q = ctx.queue_id("hold")
        reqs = ctx.queue_requests(q)
        assert len(reqs) == 3 and ctx.qlen(q) == 3
        assert [ctx.req_arrival(x) for x in reqs] == [0.0, 0.1, 0.2]
        assert ctx.head(q) == reqs[0] and ctx.head(q, 1) == reqs[1] and ctx.qlen(q, 0) == 2
        ctx.enqueue(reqs[2], q, front=True)  # move to the front
        assert ctx.queue_requests(q)[0] == reqs[2] and ctx.head(q, 0) == reqs[2]
        ctx.enqueue(reqs[1], ctx.instance_queue(1))  # move to another queue
        assert ctx.qlen(q) == 2 and ctx.req_queue(reqs[1]) == ctx.instance_queue(1)
        assert ctx.instance_requests(1) == 1 and ctx.instance_tokens(1) == 5 + 5
        ctx.start_prefill(reqs[0], 0)  # starting from the middle of a queue removes it
        assert ctx.queue_requests(q) == [reqs[2]]
        assert ctx.n_wait_prefill(0) == 1 + 1 and ctx.n_prefill(0) == 1  # r itself is pending
        out["ok"] = True

    class Hold(Scripted):
        def setup(self, ctx):
            self.q = ctx.add_queue("hold")
            with pytest.raises(ActionError, match="already exists"):
                ctx.add_queue("hold")

        def on_arrival(self, ctx, r):
            super().on_arrival(ctx, r)
            if ctx.req_phase(r) == WAIT_PREFILL and ctx.req_queue(r) < 0 and self.seen < 4:
                ctx.enqueue(r, self.q)

    ctrl = Hold(4, fn)
    _run(_sc(), ctrl, [(0.0, 5, 5, 0), (0.1, 5, 5, 1), (0.2, 5, 5, 0), (0.3, 5, 5, 0)], horizon=1.0)
    assert ctrl.out["ok"]


def test_gpu_views_and_sets():
    def fn(ctx, r, out):
        assert ctx.n_gpus == 2 and ctx.batch == 3 and ctx.n_classes == 2 and ctx.service == "tokens"
        s = ctx.idle_prefill()
        assert len(s) == 2 and 0 in s and 5 not in s and sorted(s) == [0, 1]
        ctx.start_prefill(r, 0)
        assert 0 not in s and ctx.gpu_mixed(0) and ctx.gpu_free(0) == 2 and ctx.gpu_requests(0) == [r]
        assert ctx.gpu_kv_used(0) == 20 and ctx.gpu_kv_free(0) == 80
        assert ctx.free_decode().choice() in (0, 1)
        out["ok"] = True

    ctrl = Scripted(1, fn)
    _run(_sc(kv_capacity=100), ctrl, [(0.0, 20, 5, 0)], service="tokens")
    assert ctrl.out["ok"]


def test_api_argument_errors():
    sc = fluidopt.default_scenario(gpus=2)
    for kw, msg in [
        ({"horizon": 0}, "horizon"),
        ({"horizon": 10, "warmup": 10}, "warmup"),
        ({"horizon": 10, "service": "fast"}, "service"),
        ({"horizon": 10, "seed": -1}, "seed"),
        ({"horizon": 10, "batches": 1}, "batches"),
        ({"horizon": 10, "sample_interval": -1.0}, "sample_interval"),
    ]:
        with pytest.raises(ScenarioError, match=msg):
            simulate(sc, "fi-wsp", **kw)
    with pytest.raises(UsageError, match="unknown policy 'nope'"):
        simulate(sc, "nope", horizon=10)
    with pytest.raises(ScenarioError, match="differ from the scenario"):
        simulate(sc, "fi-wsp", horizon=10, workload=_trace([(0.0, 1, 1, 0)], ("x",)))


def test_controller_exception_leaves_no_records_file(tmp_path):
    class Boom(FIWSP):
        def on_prefill_done(self, ctx, r, g):
            ctx.start_decode(r, 99)

    path = tmp_path / "rec.csv"
    with pytest.raises(ActionError, match="GPU 99 does not exist"):
        simulate(fluidopt.default_scenario(gpus=2), Boom(), horizon=10.0, records=path)
    assert list(tmp_path.iterdir()) == []


def test_registry_names_and_plugins():
    names = available()
    assert {"fi-wsp", "round-robin", "round-robin-chunked", "reserved-prefill-fcfs"} <= set(names)
    sc = fluidopt.default_scenario(gpus=2)
    assert isinstance(make_controller("FI_WSP", sc), FIWSP)
    rr = make_controller("rr-chunked", sc)
    assert isinstance(rr, RoundRobin) and rr.chunked_prefill

    @register("test-only-policy", description="x")
    def _mk(scenario):
        return FIWSP()

    assert isinstance(make_controller("test-only-policy", sc), FIWSP)
    with pytest.raises(ValueError, match="already registered"):
        register("test-only-policy", lambda s: FIWSP())


def test_summary_timeseries_and_frame():
    res = simulate(fluidopt.default_scenario(gpus=4), "fi-wsp", horizon=60.0, warmup=10.0, seed=2,
                   sample_interval=2.0)
    s = res.summary()
    json.dumps(s, allow_nan=False)
    for k in ("revenue_per_gpu", "requests", "completed", "abandoned", "wall_seconds"):
        assert k in s
    for c in s["classes"]:
        for k in ("name", "throughput", "abandoned_fraction", "ttft_mean", "ttft_p99", "e2e_mean", "e2e_p99",
                  "x_mean", "y_mixed_mean", "y_solo_mean", "q_prefill_mean", "q_decode_mean"):
            assert k in c
    ts = res.timeseries
    assert len(ts) == 30 and ts.time.iloc[1] == 2.0
    assert (ts["arrived[short-prompt]"].diff().dropna() >= 0).all()
    df = res.to_frame()
    assert list(df["class"]) == ["short-prompt", "long-prompt"] and (df.policy == "fi-wsp").all()
    assert res.ci.query("metric == 'throughput' and `class` == 'all'").half_width.iloc[0] > 0


def test_cli_json(tmp_path):
    rec = tmp_path / "r.csv"
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(["simulate", "--policy", "round-robin", "--gpus", "3", "--horizon", "40", "--service", "tokens",
                   "--seed", "1", "--records", str(rec), "--json", "--no-progress"])
    assert rc == 0
    out = json.loads(buf.getvalue())
    assert out["n_gpus"] == 3 and out["service"] == "tokens" and out["policy"] == "round-robin"
    assert out["requests"] == out["completed"] + out["abandoned"] + out["dropped"] + out["in_system"]
    assert len(pd.read_csv(rec)) == out["requests"]
    assert {c["name"] for c in out["classes"]} == {"short-prompt", "long-prompt"}


def test_cli_text_and_errors(capsys):
    assert main(["simulate", "--policy", "fi-wsp", "--gpus", "2", "--horizon", "20", "--no-progress"]) == 0
    assert "revenue per GPU per s" in capsys.readouterr().out
    assert main(["simulate", "--horizon", "20"]) == 2
    assert "--policy" in capsys.readouterr().err
    assert main(["simulate", "--policy", "fi-wsp", "--gpus", "0"]) == 2
    assert main(["simulate", "--list-policies"]) == 0
    assert "fi-wsp" in capsys.readouterr().out


def test_phase_constants_are_distinct():
    assert len({WAIT_PREFILL, PREFILL, WAIT_DECODE, DECODE}) == 4


def test_interrupt_before_warmup_reports_no_metrics(capsys):
    from fluidopt.commands.simulate import format_result

    class Stop(FIWSP):
        tick_interval = 1.0

        def on_tick(self, ctx):
            raise KeyboardInterrupt

    res = simulate(fluidopt.default_scenario(gpus=2), Stop(), horizon=50.0, warmup=10.0)
    assert res.interrupted and res.t_end == 1.0
    assert "before the warm-up ended" in format_result(res)
    json.dumps(res.summary(), allow_nan=False)


def test_req_generated_counts_decoded_tokens():
    """Tokens mode: a lone decode produces one token per solo iteration (tau_solo = 0.005 s)."""
    seen = {}

    class Probe(FIWSP):
        tick_interval = 0.1

        def on_arrival(self, ctx, r):
            super().on_arrival(ctx, r)
            self.r = r

        def on_tick(self, ctx):
            if ctx.req_phase(self.r) == DECODE:
                seen[round(ctx.now, 9)] = ctx.req_generated(self.r)

    # P = 10 (one mixed iteration of 0.02 s from t = 0.05), then 100 decode iterations of 0.005 s
    _run(_sc(n=1), Probe(), [(0.05, 10, 100, 0)], horizon=1.0, service="tokens")
    # at t = 0.1: (0.1 - 0.07) / 0.005 = 6 tokens; at 0.3: 46; ...
    assert seen == {0.1: 6, 0.2: 26, 0.3: 46, 0.4: 66, 0.5: 86}
