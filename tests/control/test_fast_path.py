"""The compiled handlers (fluidopt.sim.controller_fastpath): the gate-and-route family, FI-WSP, reference FCFS.

Differential: every run is made twice on the compiled engine, with the compiled handlers and with
the Python ones (``FLUIDOPT_FAST_CONTROLLERS=0``), and must give the same events, totals, per-class
table, batches, time series and per-request records, bit for bit: the paper instance and a
two-class fleet with abandonment, ``markov``, ``tokens`` and ``tokens`` with a KV cache and its time
term (preemptions, drops), every policy with a fast path and the robust variants' option sets, the
rolling re-solve (plan off the real rates) included; plus random fleets under hypothesis. Also: when
the fast path must not run (pure-Python engine, a router's snapshot, a user's subclass, an edited
Python handler, a stale build), and that every handler is written once (no Cython twin).
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest
from builders import grid01_scenario, random_fleet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fluidopt
from fluidopt import GPUProfile, RequestClass, Scenario
from fluidopt.control.gate_and_route import GateAndRoute
from fluidopt.control.registry import make_controller
from fluidopt.control.snapshot import ClusterSnapshot
from fluidopt.sim import controller_fastpath as fastpath
from fluidopt.sim.api import simulate

FAST, WHY = fastpath.status()
needs_fast = pytest.mark.skipif(not FAST, reason=f"compiled core's controller fast path not usable: {WHY}")

# (registered policy, options): every class with a fast path, the robust ones with several option sets
POLICIES = [
    ("fi-wsp", {}),
    ("gate-and-route", {}),
    ("prioritize-and-route", {}),
    ("sli-gate-and-route", {}),
    ("backpressure-gate-and-route", {}),
    ("backpressure-gate-and-route", {"caps": True, "staffing": True, "decode_order": "fcfs"}),
    ("backpressure-gate-and-route", {"backpressure": False, "overflow": False, "resolve": False}),
    ("backpressure-gate-and-route", {"max_overflow": 1, "decode_order": "fcfs", "caps": True}),
    ("staffed-prioritize-and-route", {}),
    ("staffed-prioritize-and-route", {"backpressure": True, "caps": True, "decode_order": "value"}),
    ("staffed-prioritize-and-route", {"staffing": False, "overflow": False}),
    ("backpressure-sli-gate-and-route", {}),
    ("backpressure-sli-gate-and-route", {"caps": False, "staffing": False}),
    ("backpressure-sli-gate-and-route", {"average_caps": False, "staffing": True}),
    ("backpressure-sli-gate-and-route", {"staffing": True}),
    ("backpressure-gate-and-route", {"elastic": False}),
    ("backpressure-gate-and-route", {"elastic_slots": False}),
]


def _two_class(n: int = 12, *, kv: float | None = None, kv_time: float = 0.0) -> Scenario:
    gpu = GPUProfile.from_gamma(alpha=0.0174, beta=6.2e-5, gamma=45.45, chunk=256, batch=6, kv_capacity=kv,
                                kv_time_per_token=kv_time)
    classes = (RequestClass("short", prompt=300, decode=120, rate=0.5 * n, patience=0.4),
               RequestClass("long", prompt=1800, decode=60, rate=0.25 * n, patience=0.3))
    return Scenario(gpu=gpu, gpus=n, classes=classes, prefill_price=0.02, decode_price=0.1, name="fast-path")


def _paper(n: int = 40, *, kv: float | None = None) -> Scenario:
    s = fluidopt.default_scenario(gpus=n)
    return s if kv is None else replace(s, gpu=replace(s.gpu, kv_capacity=kv, kv_time_per_token=1e-7))


def _run(monkeypatch, fast: bool, sc: Scenario, policy: str, opts: dict, service: str, tmp_path, *,
         plan_scenario: Scenario | None = None, horizon: float = 20.0, seed: int = 5, tick: float | None = None):
    monkeypatch.setenv("FLUIDOPT_FAST_CONTROLLERS", "1" if fast else "0")
    ctrl = make_controller(policy, plan_scenario or sc, **opts)
    if tick is not None and getattr(ctrl, "tick_interval", None):
        ctrl.tick_interval = tick
    rec = tmp_path / f"{'fast' if fast else 'python'}.csv"
    res = simulate(sc, ctrl, horizon=horizon, warmup=horizon / 10, seed=seed, service=service, backend="compiled",
                   batches=4, sample_interval=horizon / 8, records=rec, progress=False)
    assert (ctrl._fast is not None) == fast, f"{policy}: fast path bound: {ctrl._fast is not None}, expected {fast}"
    return res, rec.read_bytes(), ctrl


def _same(a, b, what: str) -> None:
    ra, fa, ca = a
    rb, fb, cb = b
    assert ra.events == rb.events, what
    assert ra.totals == rb.totals, what
    assert ra.t_end == rb.t_end, what
    pd.testing.assert_frame_equal(ra.per_class, rb.per_class, check_exact=True, obj=what)
    pd.testing.assert_frame_equal(ra.batches, rb.batches, check_exact=True, obj=what)
    pd.testing.assert_frame_equal(ra.timeseries, rb.timeseries, check_exact=True, obj=what)
    assert fa == fb, f"{what}: per-request records differ"
    for attr in ("overflowing", "resolves", "_counts"):
        assert getattr(ca, attr, None) == getattr(cb, attr, None), f"{what}: controller state {attr}"


def _both(monkeypatch, tmp_path, sc, policy, opts, service, **kw):
    a = _run(monkeypatch, True, sc, policy, opts, service, tmp_path, **kw)
    b = _run(monkeypatch, False, sc, policy, opts, service, tmp_path, **kw)
    _same(a, b, f"{policy} {opts} {service}")
    return a


@pytest.mark.integration
@needs_fast
@pytest.mark.parametrize("policy,opts", POLICIES, ids=[f"{p}-{i}" for i, (p, _) in enumerate(POLICIES)])
@pytest.mark.parametrize("case", ["paper-markov", "paper-tokens", "paper-tokens-kv", "two-markov", "two-tokens-kv"])
def test_fast_path_gives_the_python_handlers_numbers(monkeypatch, tmp_path, policy, opts, case):
    sc = {"paper-markov": _paper(), "paper-tokens": _paper(), "paper-tokens-kv": _paper(kv=30000.0),
          "two-markov": _two_class(), "two-tokens-kv": _two_class(kv=3000.0, kv_time=2e-7)}[case]
    service = "markov" if case.endswith("markov") else "tokens"
    res = _both(monkeypatch, tmp_path, sc, policy, opts, service)[0]
    assert res.totals["completed"] > 0
    if case == "two-tokens-kv":
        assert res.totals["preemptions"] > 0 and res.totals["dropped"] > 0  # the KV branches ran


@pytest.mark.integration
@needs_fast
@pytest.mark.parametrize("opts", [{}, {"prefill_gpus": 7}, {"prefill_gpus": 5, "decode_on_prefill_gpus": False}])
@pytest.mark.parametrize("case", ["paper-markov", "paper-tokens", "paper-tokens-kv", "two-markov", "two-tokens-kv",
                                  "erlang-a", "mg1"])
def test_reference_fcfs_fast_path_gives_the_python_handlers_numbers(monkeypatch, tmp_path, opts, case):
    """ReservedPrefillFCFS (the textbook queues' controller): its solo and mixed pools, the KV check."""
    from fluidopt.sim.textbook import erlang_setup, mg1_setup

    if case == "erlang-a":
        sc = erlang_setup(12, 10.0, 1.0, 0.5)[0]
    elif case == "mg1":
        sc = mg1_setup(5.0, 0.01, 12.0)[0]
        opts = {"prefill_gpus": 1, "decode_on_prefill_gpus": opts.get("decode_on_prefill_gpus", True)}
    else:
        sc = {"paper-markov": _paper(12), "paper-tokens": _paper(12), "paper-tokens-kv": _paper(12, kv=20000.0),
              "two-markov": _two_class(), "two-tokens-kv": _two_class(kv=3000.0, kv_time=2e-7)}[case]
    service = "tokens" if "tokens" in case or case == "mg1" else "markov"
    res = _both(monkeypatch, tmp_path, sc, "reserved-prefill-fcfs", opts, service)[0]
    assert res.totals["completed"] > 0
    if case == "two-tokens-kv":
        assert res.totals["preemptions"] > 0 and res.totals["dropped"] > 0  # the KV branches ran


@pytest.mark.integration
@needs_fast
@pytest.mark.parametrize("policy", ["backpressure-gate-and-route", "staffed-prioritize-and-route"])
@pytest.mark.parametrize("service", ["markov", "tokens"])
def test_fast_path_follows_rolling_re_solves(monkeypatch, tmp_path, policy, service):
    """The plan is solved at 60% of the real rates: windows re-solve the LP, and the fast path reads
    each new plan (the Python handlers read it directly)."""
    sc = _paper(60)
    low = replace(sc, classes=tuple(replace(c, rate=0.6 * c.rate) for c in sc.classes))
    _, _, ctrl = _both(monkeypatch, tmp_path, sc, policy, {}, service, plan_scenario=low, horizon=30.0, tick=3.0)
    assert ctrl.resolves > 0


@pytest.mark.integration
@needs_fast
@pytest.mark.parametrize("opts", [{}, {"resolve": False}, {"coupled": False}, {"coupled": False, "resolve": False},
                                  {"coupled": False, "caps": True, "decode_order": "fcfs"},
                                  {"coupled": False, "elastic": False}, {"coupled": False, "elastic_slots": False}])
@pytest.mark.parametrize("case", ["markov", "tokens", "tokens-kv"])
def test_fast_path_with_the_elastic_mechanism(monkeypatch, tmp_path, opts, case):
    """BP-GR on grid-01, where the plan rations every class it admits: with ``coupled`` (default) one
    pool without a partition, else the elastic plan (floating GPU, full in-flight counts in the
    backpressure sum): fast path and Python handlers agree, and coupled and elastic change the run."""
    sc = grid01_scenario(20)  # the plan rations every class it admits: elastic is on
    if case == "tokens-kv":
        sc = replace(sc, gpu=replace(sc.gpu, kv_capacity=60000.0, kv_time_per_token=1e-7))
    service = "markov" if case == "markov" else "tokens"
    res, rec, ctrl = _both(monkeypatch, tmp_path, sc, "backpressure-gate-and-route", opts, service, horizon=60.0)
    coupled = opts.get("coupled", True)
    assert ctrl._coupled_on == coupled and (ctrl.mixed_gpus == sc.gpus) == coupled
    assert ctrl._elastic_on == (opts.get("elastic", True) and not coupled)
    assert res.totals["completed"] > 0
    if coupled:
        assert res.totals["abandoned_decode"] == 0 or case == "tokens-kv"  # a prefill holds its decode's slot
        # (the run with opts is the fast run above: a run is deterministic, so its records serve again)
        off = _run(monkeypatch, True, sc, "backpressure-gate-and-route", {**opts, "coupled": False}, service,
                   tmp_path, horizon=60.0)
        assert off[1] != rec, "coupled changed nothing"
    if ctrl._elastic_on:
        off = _run(monkeypatch, True, sc, "backpressure-gate-and-route", {**opts, "elastic": False}, service,
                   tmp_path, horizon=60.0)
        assert off[1] != rec, "the floating GPU never started a prefill"


@pytest.mark.integration
@needs_fast
@pytest.mark.parametrize("opts", [{}, {"staffing": True}])
@pytest.mark.parametrize("case", ["paper-markov", "paper-tokens", "paper-tokens-kv"])
def test_fast_path_with_average_caps(monkeypatch, tmp_path, opts, case):
    """The SLI variant's time-averaged caps (their state in the fast object, updated on gate calls,
    prefill completions, preemptions and drops): same runs as the Python handlers."""
    sc = _paper(60, kv=12000.0) if case == "paper-tokens-kv" else _paper(60)
    service = "markov" if case.endswith("markov") else "tokens"
    res, _, ctrl = _both(monkeypatch, tmp_path, sc, "backpressure-sli-gate-and-route", opts, service, horizon=40.0)
    assert ctrl._avg_on and ctrl._fast.handlers._avg_on  # the SLI plan rations class 1: averaged caps
    if case == "paper-tokens-kv":
        assert res.totals["preemptions"] > 0 and res.totals["dropped"] > 0  # on_preempt / on_drop ran


@st.composite
def _fleets(draw):
    sc, service = random_fleet(draw, max_gpus=24)
    policy, opts = draw(st.sampled_from(POLICIES))
    horizon = float(min(60.0, 300.0 / sum(c.rate for c in sc.classes)))
    return sc, policy, opts, service, horizon, draw(st.integers(0, 2**16))


@needs_fast
@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@pytest.mark.integration
@given(_fleets())
def test_fast_path_on_random_fleets(monkeypatch, tmp_path, case):
    sc, policy, opts, service, horizon, seed = case
    _both(monkeypatch, tmp_path, sc, policy, opts, service, horizon=horizon, seed=seed)


@needs_fast
def test_fast_path_only_where_it_is_exact(monkeypatch):
    sc = _paper(20)
    monkeypatch.delenv("FLUIDOPT_FAST_CONTROLLERS", raising=False)
    # the compiled engine and a built-in class: on
    ctrl = make_controller("gate-and-route", sc)
    simulate(sc, ctrl, horizon=5.0, seed=1, backend="compiled", progress=False)
    assert ctrl._fast is not None
    # the pure-Python engine: off (same numbers: tests/sim/test_sim_backends.py)
    simulate(sc, ctrl, horizon=5.0, seed=1, backend="python", progress=False)
    assert ctrl._fast is None

    # a user's subclass may override anything: it runs the Python handlers, its overrides included
    class Counting(GateAndRoute):
        calls = 0

        def gate_class(self, ctx):
            Counting.calls += 1
            return super().gate_class(ctx)

    sub = Counting.from_scenario(sc)
    simulate(sc, sub, horizon=5.0, seed=1, backend="compiled", progress=False)
    assert sub._fast is None and Counting.calls > 0

    # a router's snapshot: the Python handlers
    snap = ClusterSnapshot(sc.gpus, sc.gpu.batch, sc.class_names, seed=1)
    snap.setup(ctrl)
    assert ctrl._fast is None

    # copies leave the run's fast path behind
    import copy
    import pickle

    simulate(sc, ctrl, horizon=5.0, seed=1, backend="compiled", progress=False)
    assert ctrl._fast is not None
    assert copy.deepcopy(ctrl)._fast is None and pickle.loads(pickle.dumps(ctrl))._fast is None

    # switched off
    monkeypatch.setenv("FLUIDOPT_FAST_CONTROLLERS", "0")
    simulate(sc, ctrl, horizon=5.0, seed=1, backend="compiled", progress=False)
    assert ctrl._fast is None


# -- handlers written once (controller_fastpath.compiled_name): no transcription to keep in step ------------
# (handler module, its mixin, a registered policy whose handlers are all the mixin's)
SINGLE = [("fcfs_handlers", "FCFSHandlers", "reserved-prefill-fcfs"),
          ("gate_handlers", "GateHandlers", "gate-and-route"),
          ("gate_handlers", "GateHandlers", "backpressure-gate-and-route"),
          ("fiwsp_handlers", "FIWSPHandlers", "fi-wsp")]


def test_single_sourced_handlers_are_listed_alike_and_have_no_transcription():
    """Every handler module with a .pxd in fluidopt/sim is compiled from the control layer's own file; the
    built-in controllers' handlers are those modules' classes, and no hand-written Cython twin exists."""
    import importlib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    pxds = {p.stem for p in (root / "fluidopt" / "sim").glob("*.pxd")} - {"engine", "prefix_cache"}
    assert pxds == {m for m, _, _ in SINGLE}
    assert not list((root / "fluidopt").rglob("*.pyx")), "a hand-written Cython module: write the handlers once"
    assert fastpath.compiled_name("fluidopt.control.fcfs") is None  # no fluidopt/sim/fcfs.pxd: plain Python
    for stem, cls_name, policy in SINGLE:
        assert fastpath.compiled_name(f"fluidopt.control.{stem}") == f"fluidopt.sim._c_{stem}"
        mixin = getattr(importlib.import_module(f"fluidopt.control.{stem}"), cls_name)
        cls = type(make_controller(policy, _paper(12)))
        for name, fn in vars(mixin).items():
            if callable(fn) and not name.startswith("__"):
                assert getattr(cls, name) is fn, f"{policy}: {name} is not {cls_name}'s"


@needs_fast
@pytest.mark.parametrize("stem,cls_name,policy", SINGLE, ids=[p for _, _, p in SINGLE])
def test_single_sourced_fast_path_is_the_compiled_source_and_only_where_exact(monkeypatch, stem, cls_name, policy):
    import copy
    import importlib
    import pickle
    from pathlib import Path

    compiled = importlib.import_module(f"fluidopt.sim._c_{stem}")
    root = Path(__file__).resolve().parents[2]
    assert compiled.SOURCE_SHA256 == fastpath.single_source_digest(
        (root / "fluidopt" / "control" / f"{stem}.py").read_bytes(),
        (root / "fluidopt" / "sim" / f"{stem}.pxd").read_bytes())
    monkeypatch.delenv("FLUIDOPT_FAST_CONTROLLERS", raising=False)
    sc = _paper(12)
    ctrl = make_controller(policy, sc)
    simulate(sc, ctrl, horizon=5.0, seed=1, backend="compiled", progress=False)
    assert type(ctrl._fast.handlers) is getattr(compiled, cls_name)
    # a copy of the run's handlers is nothing (they hold the run's engine sets); a copy of the controller
    # leaves the engine's sets behind, and runs again
    assert copy.deepcopy(ctrl._fast) is None and pickle.loads(pickle.dumps(ctrl._fast)) is None
    for twin in (copy.deepcopy(ctrl), pickle.loads(pickle.dumps(ctrl))):
        assert twin._fast is None
        simulate(sc, twin, horizon=5.0, seed=1, backend="compiled", progress=False)
        assert twin._fast is not None
    simulate(sc, ctrl, horizon=5.0, seed=1, backend="python", progress=False)
    assert ctrl._fast is None

    base = type(ctrl)

    class Counting(base):  # overrides a handler: the Python code runs, the override included
        calls = 0

        def on_arrival(self, ctx, r):
            Counting.calls += 1
            super().on_arrival(ctx, r)

    sub = copy.copy(ctrl)
    sub.__class__ = Counting
    simulate(sc, sub, horizon=5.0, seed=1, backend="compiled", progress=False)
    assert sub._fast is None and Counting.calls > 0

    class Renamed(base):  # overrides nothing the handlers are: compiled
        name = "renamed"

    ren = copy.copy(ctrl)
    ren.__class__ = Renamed
    simulate(sc, ren, horizon=5.0, seed=1, backend="compiled", progress=False)
    assert ren._fast is not None

    # a build from another version of the source (or its .pxd), or against another core: the Python handlers
    for attr in ("SOURCE_SHA256", "ENGINE_SHA256"):
        fastpath._single_module.cache_clear()
        fastpath._single_spec.cache_clear()
        monkeypatch.setattr(compiled, attr, "0" * 64)
        mod, why = fastpath._single_module(f"fluidopt.control.{stem}")
        assert mod is None and "reinstall" in why
        ok, why = fastpath.status()
        assert not ok and "reinstall" in why
        ctrl = make_controller(policy, sc)
        simulate(sc, ctrl, horizon=5.0, seed=1, backend="compiled", progress=False)
        assert ctrl._fast is None
        monkeypatch.undo()
    fastpath._single_module.cache_clear()
    fastpath._single_spec.cache_clear()
    assert fastpath.status()[0]


# -- the state check the compiled handlers rely on (they index the live counts without bounds checks) --
def test_state_check_requires_live_counts_that_cover_every_class_and_queue():
    from fluidopt.control.gate_handlers import check_state

    ctrl = make_controller("sli-gate-and-route", fluidopt.default_scenario(gpus=8))
    with pytest.raises(ValueError, match="live counts are not read yet"):
        check_state(ctrl)  # before setup: nothing to index
    snap = ClusterSnapshot(8, 4, ctrl.class_names)
    snap.setup(ctrl)  # the SLI route adds its two buffers, then reads the live counts
    check_state(ctrl)
    n_queues = 2 + 8 + 2
    assert len(ctrl._queue_totals) == n_queues and len(ctrl._queue_counts) == n_queues * ctrl.n_classes
    assert max(ctrl._buf) == n_queues - 1  # the second buffer is the last queue
    stale = snap.queue_counts(), snap.queue_totals()
    ctrl._queue_counts, ctrl._queue_totals = [0] * ((n_queues - 1) * ctrl.n_classes), [0] * (n_queues - 1)
    with pytest.raises(ValueError, match=r"_buf: expected queue ids 0\.\.10, got \[11\]"):
        check_state(ctrl)  # vectors read before the last add_queue miss a buffer
    ctrl._queue_counts, ctrl._queue_totals = [0] * n_queues, stale[1]
    with pytest.raises(ValueError, match="do not match 2 classes and 12 queues"):
        check_state(ctrl)
    ctrl._queue_counts, ctrl._class_counts = stale[0], [0] * 9  # 5 per class: 10 needed
    with pytest.raises(ValueError, match="9 class counts"):
        check_state(ctrl)
