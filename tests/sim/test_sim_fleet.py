"""The changing fleet: GPUs added (start-up delay), drained and removed during a run; GPU-hours;
runtime batch limits; eviction to host memory with its restore cost; SLO attainment; batch backlogs.

Hand-computed cases use binary-fraction times (exact sums); the conservation property runs random
scale-up / scale-down schedules with every invariant recounted after every event, on both engines.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluidopt.control.protocol import DECODE_QUEUE, PREFILL_QUEUE, Controller
from fluidopt.core.errors import ActionError, ScenarioError
from fluidopt.core.model import Fleet, GPUProfile, RequestClass, Scenario
from fluidopt.sim import backend as core
from fluidopt.sim.api import make_engine, simulate
from fluidopt.sim.results import SLOWarning
from fluidopt.workloads import (
    ArrivalBatch,
    Backlog,
    BacklogWorkload,
    Exponential,
    Fixed,
    collect,
    workload_from_scenario,
)

BACKENDS = ["python"] + (["compiled"] if core.compiled_status()[0] else [])


class Trace:
    """A fixed list of arrivals (time, class, prompt, output)."""

    def __init__(self, rows, names=("a",)):
        self.rows = rows
        self.class_names = tuple(names)

    def batches(self, rng, horizon, size=65536):
        rows = [r for r in self.rows if r[0] < horizon]
        if rows:
            t, c, p, o = (np.array(x) for x in zip(*rows))
            yield ArrivalBatch(t.astype(float), c.astype(np.int64), p.astype(np.int64), o.astype(np.int64))


class AnyOnline(Controller):
    """FCFS over the online GPUs: a prefill on any GPU with an idle prefill slot and decode room, its
    decode on the same GPU if it has room, else any; freed slots pull decodes, then prefills."""

    name = "any-online"

    def _room(self, ctx, g):
        return ctx.gpu_online(g) and ctx.gpu_prefill(g) < 0 and ctx.gpu_decodes(g) < ctx.gpu_max_decodes(g) \
            and ctx.gpu_free(g) > 0

    def on_arrival(self, ctx, r):
        if ctx.qlen(PREFILL_QUEUE):
            return
        for g in range(ctx.n_gpus):
            if self._room(ctx, g):
                ctx.start_prefill(r, g)
                return

    def on_prefill_done(self, ctx, r, g):
        for h in [g] + list(range(ctx.n_gpus)):
            if ctx.gpu_online(h) and ctx.gpu_decodes(h) < ctx.gpu_max_decodes(h) and ctx.gpu_free(h) > 0:
                ctx.start_decode(r, h)
                return

    def on_slot_freed(self, ctx, g):
        while ctx.qlen(DECODE_QUEUE) and ctx.gpu_online(g) and ctx.gpu_decodes(g) < ctx.gpu_max_decodes(g) \
                and ctx.gpu_free(g) > 0:
            ctx.start_decode(ctx.head(DECODE_QUEUE), g)
        if ctx.qlen(PREFILL_QUEUE) and self._room(ctx, g):
            ctx.start_prefill(ctx.head(PREFILL_QUEUE), g)


def _gpu(**kw):
    base = dict(alpha=0.25, beta=0.0, tau_solo=0.125, chunk=256, batch=4)
    base.update(kw)
    return GPUProfile(**base)


def _scenario(n=2, fleet=None, classes=None, **gpu):
    classes = classes or (RequestClass("a", prompt=256, decode=8, rate=1.0),)
    return Scenario(gpu=_gpu(**gpu), gpus=n, classes=classes, fleet=fleet, name="fleet")


# -- a fixed fleet is untouched -------------------------------------------------------------------

def test_fixed_fleet_reports_gpu_hours_but_keeps_its_summary():
    sc = _scenario(n=3)
    res = simulate(sc, AnyOnline(), horizon=40.0, seed=2, service="tokens")
    assert res.gpu_hours == pytest.approx(3 * 40.0 / 3600.0, rel=0, abs=1e-12)
    assert "gpu_hours" not in res.summary() and "fleet_log" not in res.meta
    assert res.slo_attainment is None


# -- hand-computed timelines -------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_hours_and_start_up_delay_by_hand(backend):
    # fleet of at most 2, one online; GPU 1 added at t=5 (start-up 10 s: online at 15), drained at 50
    # while idle (offline at once). GPU-seconds: 100 (GPU 0) + 45 (GPU 1, from 5 to 50).
    sc = _scenario(n=2, fleet=Fleet(initial=1, startup_delay=10.0))
    rows = [(0.0, 0, 256, 8), (16.0, 0, 256, 8), (16.0, 0, 256, 8)]
    eng = make_engine(sc, AnyOnline(), horizon=100.0, seed=1, service="tokens", workload=Trace(rows), backend=backend,
                      check=True)
    eng.start()
    assert eng.gpu_state(1) == "offline" and eng.fleet_size() == 1
    eng.advance(5.0)
    assert eng.add_gpu() == 1
    assert eng.gpu_state(1) == "starting" and eng.fleet_size() == 2
    eng.advance(14.999)
    assert eng.gpu_state(1) == "starting"
    eng.advance(15.5)
    assert eng.gpu_state(1) == "online"
    eng.advance(50.0)
    eng.drain_gpu(1)
    assert eng.gpu_state(1) == "offline"
    eng.advance(100.0)
    res = eng.finish()
    assert res.gpu_hours == pytest.approx((100.0 + 45.0) / 3600.0, abs=1e-12)
    assert res.summary()["gpu_hours"] == pytest.approx((100.0 + 45.0) / 3600.0, abs=1e-12)
    log = res.meta["fleet_log"]
    assert list(log["gpus"]) == [1, 2, 2, 1] and list(log["online"]) == [1, 1, 2, 1]
    # the two arrivals at t=16 run on GPUs 0 and 1 (GPU 1 came online at 15)
    assert res.totals["completed"] == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_gpu_added_with_its_own_start_up_delay(backend):
    # the fleet's delay is 10 s; GPU 1 added at t=5 with 2.5 s is online at 7.5, GPU 2 added at t=8
    # with 0 s at once, GPU 3 with None takes the fleet's 10 s (online at 18). GPU-seconds to t=20:
    # 20 + 15 + 12 + 12.
    sc = _scenario(n=4, fleet=Fleet(initial=1, startup_delay=10.0))
    eng = make_engine(sc, AnyOnline(), horizon=20.0, seed=1, service="tokens", workload=Trace([]), backend=backend,
                      check=True)
    eng.start()
    assert eng.startup_delay() == 10.0
    eng.advance(5.0)
    with pytest.raises(ActionError, match=r"add_gpu\(startup_delay=-1\.0\) at t=5: expected a finite number of "
                                          r"seconds >= 0 \(or None for the fleet's start-up delay\)"):
        eng.add_gpu(startup_delay=-1.0)
    for bad in (float("nan"), float("inf"), "2", True):
        with pytest.raises(ActionError, match="expected a finite number of seconds >= 0"):
            eng.add_gpu(1, startup_delay=bad)
    assert eng.gpu_state(1) == "offline" and eng.fleet_size() == 1  # the refusals changed nothing
    assert eng.add_gpu(1, startup_delay=2.5) == 1
    eng.advance(7.499)
    assert eng.gpu_state(1) == "starting"
    eng.advance(7.75)
    assert eng.gpu_state(1) == "online"
    eng.advance(8.0)
    assert eng.add_gpu(2, startup_delay=0.0) == 2 and eng.gpu_state(2) == "online"
    assert eng.add_gpu(3) == 3
    eng.advance(17.999)
    assert eng.gpu_state(3) == "starting"
    eng.advance(20.0)
    assert eng.gpu_state(3) == "online"
    res = eng.finish()
    assert res.gpu_hours == pytest.approx((20.0 + 15.0 + 12.0 + 12.0) / 3600.0, abs=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_draining_gpu_finishes_its_work_then_goes_offline(backend, tmp_path):
    sc = _scenario(n=2, fleet=Fleet(initial=2))
    rows = [(0.0, 0, 256, 8), (0.0, 0, 256, 8)]  # one on each GPU: prefill 0.25 s, decode 8 x 0.125 s
    eng = make_engine(sc, AnyOnline(), horizon=10.0, seed=1, service="tokens", workload=Trace(rows), backend=backend,
                      check=True, records=tmp_path / "r.csv")
    eng.advance(0.5)
    eng.drain_gpu(1)
    assert eng.gpu_state(1) == "draining" and eng.gpu_max_decodes(1) == 0
    eng.advance(1.25)
    assert eng.gpu_state(1) == "draining"
    eng.advance(1.2501)
    assert eng.gpu_state(1) == "offline"  # its request completed at 1.25
    eng.advance(10.0)
    res = eng.finish()
    rec = pd.read_csv(tmp_path / "r.csv")
    assert list(rec["end"]) == [1.25, 1.25] and list(rec["decode_gpu"]) == [0, 1]
    assert res.gpu_hours == pytest.approx((10.0 + 1.25) / 3600.0, abs=1e-12)


def _evicted_and_restarted(sc, backend, at, host, tmp_path):
    """One request (prompt 256, output 8) alone on GPU 0, evicted at time ``at`` (a boundary, after its second
    token; ``host``: to host memory, else for recompute), restarted there at once and run to the end: its
    records and the run's result."""
    eng = make_engine(sc, AnyOnline(), horizon=10.0, seed=1, service="tokens", workload=Trace([(0.0, 0, 256, 8)]),
                      backend=backend, check=True, records=tmp_path / "r.csv")
    eng.advance(at)
    r = eng.gpu_requests(0)[0]
    assert eng.req_generated(r) == 2
    assert eng.evict(r, host=host)
    assert eng.req_phase(r) == 0 and eng.qlen(PREFILL_QUEUE) == 1 and eng.gpu_requests(0) == []
    eng.start_prefill(r, 0)
    eng.advance(10.0)
    res = eng.finish()
    return pd.read_csv(tmp_path / "r.csv"), res


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("host,end", [(True, 2.25), (False, 2.37890625)])
def test_eviction_restore_cost_by_hand_under_a_law(backend, host, end, tmp_path):
    # gpu.timemodel: prefill 0.125 + 1/512 s per token, decode 0.125 s. Alone: one chunk of 256 [0, 0.625],
    # then 8 decode steps. Evicted at 0.875 (2 tokens generated) and restarted at once:
    # * to host: 0.516 s of restore in iterations of the law's chunk, 0.125 + 0.5 = 0.625 s: one, [0.875, 1.5];
    #   then the 6 tokens left: 1.5 + 0.75 = 2.25;
    # * recompute: 258 tokens, a chunk of 256 [0.875, 1.5] and one of 2 tokens, which pays for its 2 tokens
    #   (0.125 + 2/512), to 1.62890625; then 1.62890625 + 0.75 (the straight line would charge a whole chunk)
    from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw

    law = IterationLaw(PrefillLaw(0.125, 1 / 512, 0.0), DecodeLaw((0.125, 0.0, 0.0)))
    rec, _ = _evicted_and_restarted(_scenario(n=1, fleet=Fleet(kv_swap_time_per_token=0.002), timemodel=law),
                                    backend, 0.875, host, tmp_path)
    assert rec["ttft"].tolist() == [0.625] and rec["preemptions"].tolist() == [1]
    assert rec["end"].tolist() == [end]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("host,end", [(True, 2.0), (False, 1.75)])
def test_eviction_restore_cost_by_hand(backend, host, end, tmp_path):
    # tau_mix = 0.25 (one chunk: prompt 256), tau_solo = 0.125, 8 output tokens. Alone: prefill
    # [0, 0.25], decode 0.25 + 8 x 0.125 = 1.25. Evicted at 0.5 (a boundary: 2 tokens generated) and
    # restarted at once on the now idle GPU:
    # * to host: restore 0.002 s/token x 258 tokens = 0.516 s -> ceil(0.516 / 0.25) = 3 mixed
    #   iterations [0.5, 1.25], then the 6 tokens left: 1.25 + 0.75 = 2.0;
    # * recompute: prefill of 258 tokens -> 2 chunks [0.5, 1.0], then 1.0 + 0.75 = 1.75.
    rec, res = _evicted_and_restarted(_scenario(n=1, fleet=Fleet(kv_swap_time_per_token=0.002)), backend, 0.5, host,
                                      tmp_path)
    assert rec["preemptions"].tolist() == [1]
    assert rec["ttft"].tolist() == [0.25]
    assert rec["end"].tolist() == [end]
    assert res.totals["completed"] == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_evict_returns_false_when_the_work_ends_at_the_next_boundary(backend):
    sc = _scenario(n=1)
    eng = make_engine(sc, Controller(), horizon=10.0, seed=1, service="tokens", workload=Trace([(0.0, 0, 256, 8)]),
                      backend=backend, check=True)
    eng.advance(1e-12)
    r = eng.head(PREFILL_QUEUE)
    eng.start_prefill(r, 0)
    eng.advance(0.1)
    assert not eng.evict(r)  # its only chunk ends at 0.25, the next boundary
    assert eng.req_phase(r) == 1
    res = eng.finish()
    assert res.totals["preemptions"] == 0


# -- errors --------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_fleet_actions_are_one_clear_error(backend):
    sc = _scenario(n=2, fleet=Fleet(initial=1))
    eng = make_engine(sc, AnyOnline(), horizon=10.0, seed=1, service="tokens", workload=Trace([]), backend=backend)
    eng.advance(1.0)
    with pytest.raises(ActionError, match=r"drain_gpu\(g=1\).*already offline"):
        eng.drain_gpu(1)  # scale-down below zero
    with pytest.raises(ActionError, match=r"batch limit: expected an integer in 1..4 \(B\), got 0"):
        eng.set_max_decodes(0, 0)
    with pytest.raises(ActionError, match="batch limit"):
        eng.set_max_decodes(0, 5)
    with pytest.raises(ActionError, match="is online, not offline"):
        eng.add_gpu(0)
    eng.add_gpu()
    with pytest.raises(ActionError, match="all 2 GPUs"):
        eng.add_gpu()
    with pytest.raises(ActionError, match="does not exist"):
        eng.drain_gpu(7)
    with pytest.raises(ScenarioError, match=r"fleet.initial: expected an integer >= 0, got -1"):
        Fleet(initial=-1)
    with pytest.raises(ScenarioError, match=r"fleet.initial: expected at most cluster.gpus = 2"):
        _scenario(n=2, fleet=Fleet(initial=3))


@pytest.mark.parametrize("backend", BACKENDS)
def test_runtime_batch_limit_is_enforced(backend):
    sc = _scenario(n=1)
    rows = [(0.0, 0, 256, 8), (0.0, 0, 256, 8)]
    eng = make_engine(sc, Controller(), horizon=10.0, seed=1, service="tokens", workload=Trace(rows), backend=backend,
                      check=True)
    eng.advance(1e-12)
    eng.set_max_decodes(0, 1)
    r1 = eng.head(PREFILL_QUEUE)
    eng.start_prefill(r1, 0)
    eng.advance(0.3)
    eng.start_decode(eng.head(DECODE_QUEUE), 0)
    r2 = eng.head(PREFILL_QUEUE)
    eng.start_prefill(r2, 0)
    eng.advance(0.7)
    assert eng.req_phase(r2) == 2  # waiting for a decode: the cap is 1
    with pytest.raises(ActionError):
        eng.start_decode(r2, 0)
    eng.set_max_decodes(0, 2)
    eng.start_decode(r2, 0)
    eng.advance(10.0)
    assert eng.finish().totals["completed"] == 2


# -- conservation under random scale-up / scale-down schedules -------------------------------------

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    markov=st.booleans(),
    plan=st.lists(st.tuples(st.floats(0.5, 29.5), st.sampled_from(["add", "drain", "remove", "remove-host", "cap"]),
                            st.integers(0, 3), st.integers(1, 4)), min_size=1, max_size=12),
)
@pytest.mark.integration
def test_conservation_with_random_scaling(seed, markov, plan):
    classes = (RequestClass("a", prompt=200, decode=20, rate=3.0, patience=0.05),
               RequestClass("b", prompt=600, decode=60, rate=1.0))
    sc = _scenario(n=4, fleet=Fleet(initial=2, startup_delay=2.0, kv_swap_time_per_token=1e-3), classes=classes,
                   alpha=0.02, beta=1e-4, tau_solo=0.02)
    out = {}
    for backend in BACKENDS:
        eng = make_engine(sc, AnyOnline(), horizon=30.0, seed=seed, service="markov" if markov else "tokens",
                          backend=backend, check=True)
        for t, what, g, m in sorted(plan):
            eng.advance(t)
            st_ = eng.gpu_state(g)
            if what == "add" and st_ == "offline":
                eng.add_gpu(g)
            elif what == "drain" and st_ in ("online", "starting"):
                eng.drain_gpu(g)
            elif what.startswith("remove") and st_ in ("online", "starting"):
                eng.remove_gpu(g, host=what.endswith("host"))
            elif what == "cap" and st_ == "online":
                eng.set_max_decodes(g, m)
            # re-admit what is waiting, as a controller would (the actions may free capacity)
            for h in range(4):
                if eng.gpu_online(h):
                    eng.controller.on_slot_freed(eng, h)
        eng.advance(30.0)
        res = eng.finish()
        tot = res.totals
        assert tot["requests"] == tot["completed"] + tot["abandoned"] + tot["dropped"] + tot["in_system"]
        log = res.meta.get("fleet_log")
        if log is not None:  # GPU-hours = the integral of the fleet size over the fleet log
            t = list(log["time"]) + [30.0]
            seconds = sum(log["gpus"].iloc[k] * (t[k + 1] - t[k]) for k in range(len(log)))
            assert res.gpu_hours * 3600 == pytest.approx(seconds, rel=1e-12, abs=1e-9)
        out[backend] = (res.summary(), tot)
    if len(out) == 2:
        a, b = out["python"][0], out["compiled"][0]
        for k in ("wall_seconds", "requests_per_wall_second", "engine"):
            a.pop(k, None)
            b.pop(k, None)
        assert a == b


# -- SLO attainment ----------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_slo_attainment_matches_the_records(backend, tmp_path):
    classes = (RequestClass("chat", prompt=300, decode=50, rate=6.0, ttft_slo=0.6, itl_slo=0.05),
               RequestClass("batch", prompt=500, decode=100, rate=2.0, deadline=8.0))
    sc = Scenario(gpu=GPUProfile(alpha=0.02, beta=6e-5, tau_solo=0.025, chunk=256, batch=8), gpus=2, classes=classes)
    res = simulate(sc, "fi-wsp", horizon=120.0, warmup=10.0, seed=4, service="tokens", records=tmp_path / "r.csv",
                   backend=backend)
    rec = pd.read_csv(tmp_path / "r.csv")
    rec = rec[rec["arrival"] >= 10.0]
    done = rec["outcome"] == "completed"
    tpot = (rec["e2e"] - rec["ttft"]) / rec["output"]
    chat = rec["class"] == "chat"
    met = done & np.where(chat, (rec["ttft"] <= 0.6) & (tpot <= 0.05), rec["end"] <= rec["arrival"] + 8.0)
    for nm in ("chat", "batch"):
        k = rec["class"] == nm
        assert res.per_class.loc[nm, "slo_requests"] == k.sum()
        assert res.per_class.loc[nm, "slo_met"] == (met & k).sum()
        assert res.slo_attainment[nm] == pytest.approx((met & k).sum() / k.sum(), abs=0)
    s = res.summary()
    assert {"slo_attainment", "slo_met"} <= set(s["classes"][0])


def test_deadline_shorter_than_own_service_time_is_warned_and_missed():
    # deadline 1 s: a 256-token prompt (0.25 s) plus 8 tokens (1 s) cannot make it
    classes = (RequestClass("a", prompt=256, decode=8, rate=1.0, lengths="fixed", deadline=1.0),)
    sc = _scenario(n=2, classes=classes)
    with pytest.warns(SLOWarning, match=r"deadline shorter than the request's own service time .*class 'a'"):
        res = simulate(sc, "fi-wsp", horizon=50.0, seed=1, service="tokens")
    pc = res.per_class.loc["a"]
    assert pc["slo_met"] == 0 and pc["deadline_infeasible"] == pc["slo_requests"] > 0


def test_slo_fields_round_trip_through_toml():
    from fluidopt.scenario import loads_scenario

    text = """
[gpu]
alpha = 0.02
beta = 6e-5
gamma = 40
chunk = 256
batch = 8
[cluster]
gpus = 4
[fleet]
initial = 2
startup_delay = 30
kv_swap_time_per_token = 1e-5
[[classes]]
name = "chat"
prompt = 300
decode = 100
rate = 2
ttft_slo = 1.5
itl_slo = 0.05
[[classes]]
name = "batch"
prompt = 300
decode = 100
rate = 1
deadline_at = 3900
"""
    sc = loads_scenario(text)
    assert sc.fleet == Fleet(initial=2, startup_delay=30.0, kv_swap_time_per_token=1e-5)
    from fluidopt.scenario import scenario_from_dict, scenario_to_dict

    assert scenario_from_dict(scenario_to_dict(sc)) == sc
    assert sc.classes[0].ttft_slo == 1.5 and sc.classes[1].deadline_at == 3900.0 and sc.classes[1].has_slo
    with pytest.raises(ScenarioError, match=r"classes\[chat\].ttft_slo: expected a number > 0, got -1.0"):
        loads_scenario(text.replace("ttft_slo = 1.5", "ttft_slo = -1"))
    with pytest.raises(ScenarioError, match="fleet: unknown"):
        loads_scenario(text.replace("initial = 2", "initial = 2\nsize = 3"))


# -- batch backlogs -----------------------------------------------------------------------------------

def test_backlog_is_injected_on_top_of_the_base_arrivals():
    classes = (RequestClass("chat", prompt=300, decode=50, rate=5.0), RequestClass("batch", prompt=500, decode=100, rate=1.0))
    sc = Scenario(gpu=_gpu(), gpus=2, classes=classes[:1])
    base = workload_from_scenario(sc)
    wl = BacklogWorkload(base, [Backlog("batch", 1000, 7.5, Fixed(500), Exponential(100))], class_names=("chat", "batch"))
    rng = np.random.default_rng(3)
    a = collect(wl, np.random.default_rng(3), 20.0, size=333)
    assert np.all(np.diff(a.time) >= 0)
    b = a.cls == 1
    assert b.sum() == 1000 and np.all(a.time[b] == 7.5) and np.all(a.prompt[b] == 500)
    # the base's arrivals are those of the base workload under the same child stream
    from fluidopt.workloads.base import _children

    base_rng = _children(rng, 3)[0]
    ref = collect(base, base_rng, 20.0)
    np.testing.assert_array_equal(a.time[~b], ref.time)
    np.testing.assert_array_equal(a.prompt[~b], ref.prompt)
    with pytest.raises(ScenarioError, match="Backlog\\('batch'\\).n: expected an integer >= 0"):
        Backlog("batch", -1, 1.0, Fixed(1), Fixed(1))
    with pytest.raises(ScenarioError, match="backlog class 'x'"):
        BacklogWorkload(base, [Backlog("x", 1, 1.0, Fixed(1), Fixed(1))])
