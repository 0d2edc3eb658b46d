"""Differential test: the compiled engine core and the pure-Python engine give the same numbers, bit for bit.

Both are the same source (fluidopt/sim/engine.py; the core is compiled from it with the static types of
engine.pxd, see fluidopt/sim/backend.py), so any difference is a typing or compilation error: a value that
changed type, an integer that overflowed, a rounding that differs. Every registered policy runs under
both in markov mode and in tokens mode with a KV cache (preemptions, drops, the KV time term), and
random scenarios run with every invariant checked after every event, in both. The rest of the suite
runs the default backend ("auto": the compiled core where it is built), so this file is also where
the pure-Python engine is exercised against it.
"""

from __future__ import annotations

import pickle
import warnings

import pandas as pd
import pytest
from builders import semantics_scenario
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluidopt import GPUProfile, RequestClass, Scenario, default_scenario
from fluidopt.control.registry import available
from fluidopt.core.errors import UsageError
from fluidopt.sim import backend as core
from fluidopt.sim.api import simulate
from fluidopt.sim.textbook import erlang_setup

COMPILED, WHY = core.compiled_status()
needs_core = pytest.mark.skipif(not COMPILED, reason=f"compiled core not usable: {WHY}")


def _scenario(n: int = 8, *, kv: float | None = None, kv_time: float = 0.0) -> Scenario:
    gpu = GPUProfile.from_gamma(alpha=0.0174, beta=6.2e-5, gamma=45.45, chunk=256, batch=6, kv_capacity=kv,
                                kv_time_per_token=kv_time)
    classes = (RequestClass("short", prompt=300, decode=120, rate=0.45 * n, patience=0.4),
               RequestClass("long", prompt=1800, decode=60, rate=0.2 * n, patience=0.3))
    return Scenario(gpu=gpu, gpus=n, classes=classes, prefill_price=0.02, decode_price=0.1, name="backends")


def _run(backend: str, sc: Scenario, policy: str, service: str, tmp_path=None, **kw):
    records = None if tmp_path is None else tmp_path / f"{backend}.csv"
    if policy.startswith("sb3-"):  # their shipped weights are the regime scenario's: named, not found by name
        from fluidopt.control.registry import make_controller
        from fluidopt.rl.mlp import WEIGHTS_DIR

        algo = policy.split("-")[1]
        policy = make_controller(policy, sc, weights=str(WEIGHTS_DIR / f"sb3-{algo}-regime.npz"))
    res = simulate(sc, policy, horizon=40.0, warmup=4.0, seed=7, service=service, backend=backend, batches=4,
                   sample_interval=5.0, records=records, **kw)
    assert res.meta["engine"] == backend
    return res, (records.read_bytes() if records is not None else None)


def _same_frame(a: pd.DataFrame, b: pd.DataFrame, what: str) -> None:
    """assert_frame_equal(check_exact=True), which passes whenever the two pickle to the same bytes (the
    same values, NaNs, dtypes, labels and layout): that is tried first, as it takes 0.2-0.4 ms against
    assert_frame_equal's 1-10 ms per frame (some 20 ms of each of the ~200 comparisons below); any
    difference goes to assert_frame_equal, which decides and names it, as before."""
    if pickle.dumps(a) != pickle.dumps(b):
        pd.testing.assert_frame_equal(a, b, check_exact=True, obj=what)


def _same(a, b, what: str) -> None:
    ra, fa = a
    rb, fb = b
    assert ra.events == rb.events, what
    assert ra.totals == rb.totals, what
    assert ra.t_end == rb.t_end, what
    _same_frame(ra.per_class, rb.per_class, what)
    _same_frame(ra.ci, rb.ci, what)
    _same_frame(ra.batches, rb.batches, what)
    if ra.timeseries is None or rb.timeseries is None:
        assert ra.timeseries is None and rb.timeseries is None, what
    else:
        _same_frame(ra.timeseries, rb.timeseries, what)
    assert ra.cluster == rb.cluster or all(
        (x == y) or (x != x and y != y) for x, y in zip(ra.cluster.values(), rb.cluster.values())
    ), what
    assert fa == fb, f"{what}: per-request records differ"


def _gpus_for(policy: str) -> int:
    # stable-baselines3's reference routers ship weights for the 4 instances of the paper's regime only
    return 4 if policy.startswith("sb3-") else 8


@pytest.mark.integration
@needs_core
@pytest.mark.parametrize("policy", sorted(available()))
def test_every_policy_same_numbers_markov(policy):
    sc = _scenario(_gpus_for(policy))
    _same(_run("compiled", sc, policy, "markov"), _run("python", sc, policy, "markov"), f"{policy} markov")


@pytest.mark.integration
@needs_core
@pytest.mark.parametrize("policy", sorted(available()))
def test_every_policy_same_numbers_tokens_with_kv_cache(policy, tmp_path):
    sc = _scenario(_gpus_for(policy), kv=9000.0, kv_time=2e-7)
    a = _run("compiled", sc, policy, "tokens", tmp_path)
    b = _run("python", sc, policy, "tokens", tmp_path)
    _same(a, b, f"{policy} tokens+kv")


@pytest.mark.integration
@needs_core
@pytest.mark.parametrize("policy", ["fi-wsp", "gate-and-route", "round-robin", "jsq"])
def test_paper_instance_same_numbers_tokens(policy):
    """The paper's GPU on 60 GPUs (the benchmark's configuration, smaller)."""
    import fluidopt

    sc = fluidopt.default_scenario(gpus=60)
    _same(_run("compiled", sc, policy, "tokens"), _run("python", sc, policy, "tokens"), f"{policy} paper tokens")


@pytest.mark.integration
@needs_core
@pytest.mark.parametrize("case", ["erlang-a", "semantics-markov", "semantics-tokens", "little-markov",
                                  "little-tokens"])
def test_the_long_statistical_scenarios_same_numbers(case):
    """The scenarios of three long statistical runs, at about a tenth of their length: Erlang A overloaded
    (test_sim_exact.py, 300k customers), markov against tokens (test_sim_differential.py, 300 GPUs for
    1,200 s) and Little's law (test_sim_invariants.py, 10 GPUs for 9,000 s, both service modes). They are
    marked slow, which CI's pure-Python pass leaves out (3-11 s each there), so this is where the
    pure-Python engine meets their scenarios: bit for bit against the compiled core."""
    def run(backend):
        if case == "erlang-a":
            sc, ctrl = erlang_setup(20, 22.0, 1.0, 1.0)  # a controller object is single-use: one per run
            return simulate(sc, ctrl, horizon=30_000 / 22.0 + 50.0, warmup=50.0, seed=5, batches=20,
                            backend=backend), None
        kind, service = case.split("-")
        if kind == "little":
            return simulate(default_scenario(gpus=10), "fi-wsp", horizon=900.0, warmup=50.0, seed=3,
                            service=service, backend=backend), None
        return simulate(semantics_scenario(300), "fi-wsp", horizon=120.0, warmup=15.0, seed=1,
                        service=service, backend=backend), None

    _same(run("compiled"), run("python"), case)


@st.composite
def _cases(draw):
    n = draw(st.integers(1, 5))
    service = draw(st.sampled_from(("markov", "tokens")))
    kv = float(draw(st.integers(900, 6000))) if service == "tokens" and draw(st.booleans()) else None
    gpu = GPUProfile.from_gamma(alpha=draw(st.floats(0.005, 0.03)), beta=draw(st.floats(1e-6, 2e-4)),
                                gamma=draw(st.floats(10.0, 60.0)), chunk=draw(st.sampled_from((32, 256))),
                                batch=draw(st.integers(2, 6)), kv_capacity=kv)
    classes = tuple(RequestClass(f"c{i}", prompt=draw(st.floats(20.0, 1500.0)), decode=draw(st.floats(5.0, 500.0)),
                                 rate=n * draw(st.floats(0.1, 1.5)), patience=draw(st.floats(0.05, 1.0)))
                    for i in range(draw(st.integers(1, 3))))
    sc = Scenario(gpu=gpu, gpus=n, classes=classes, prefill_price=0.05, decode_price=0.1, name="random")
    policy = draw(st.sampled_from(("fi-wsp", "gate-and-route", "gi-wsp", "round-robin", "jsq",
                                   "reserved-prefill-fcfs", "prioritize-and-route")))
    # about 80 arrivals (120 until issue 47's sixth cut: 25% fewer events, each checked in both engines);
    # of the 25 derandomized cases, as many drop (13) and abandon (19 in prefill, 6 in decode), 14 preempt (15)
    horizon = float(min(200.0, 80.0 / sum(c.rate for c in classes)))
    return sc, policy, service, horizon, draw(st.integers(0, 2**16))


@needs_core
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@pytest.mark.integration
@given(_cases())
def test_random_scenarios_same_numbers_with_invariants_checked(case):
    sc, policy, service, horizon, seed = case
    out = []
    for backend in ("compiled", "python"):
        res = simulate(sc, policy, horizon=horizon, seed=seed, service=service, check=True, batches=2,
                       backend=backend)
        out.append((res, None))
    _same(out[0], out[1], f"{policy} {service}")


@needs_core
def test_action_errors_are_the_same(tmp_path):
    """Bad actions raise the same ActionError text from both (validation never runs unchecked code)."""
    from fluidopt.control.protocol import Controller
    from fluidopt.core.errors import ActionError

    class Bad(Controller):
        name = "bad"

        def __init__(self, how):
            self.how = how

        def on_arrival(self, ctx, r):
            if self.how == "gpu":
                ctx.start_prefill(r, 10**6)
            elif self.how == "negative":
                ctx.start_prefill(r, -1)
            elif self.how == "request":
                ctx.start_decode(r + 10**6, 0)
            elif self.how == "type":
                ctx.start_prefill(r, 1.5)
            elif self.how == "queue":
                ctx.enqueue(r, 99)

    msgs = {}
    for how in ("gpu", "negative", "request", "type", "queue"):
        for backend in ("compiled", "python"):
            with pytest.raises(ActionError) as e:
                simulate(_scenario(), Bad(how), horizon=5.0, seed=1, backend=backend)
            msgs[how, backend] = str(e.value)
        assert msgs[how, "compiled"] == msgs[how, "python"], how


def test_backend_names_and_environment(monkeypatch):
    with pytest.raises(UsageError, match="backend: expected one of"):
        simulate(_scenario(), "fi-wsp", horizon=1.0, backend="fortran")
    res = simulate(_scenario(), "fi-wsp", horizon=2.0, backend="python")
    assert res.meta["engine"] == "python" and res.summary()["engine"] == "python"
    monkeypatch.setenv("FLUIDOPT_ENGINE", "python")
    assert simulate(_scenario(), "fi-wsp", horizon=2.0).meta["engine"] == "python"
    monkeypatch.setenv("FLUIDOPT_ENGINE", "turbo")
    with pytest.raises(UsageError, match="FLUIDOPT_ENGINE"):
        simulate(_scenario(), "fi-wsp", horizon=2.0)


@needs_core
def test_request_ids_beyond_the_race_pairs_32_bits_are_refused(monkeypatch):
    """The compiled core's race pairs hold 32-bit ids (state.pairs): a run that needs more request
    slots stops with a clear error instead of wrapping ids around (the limit lowered here to one a
    test reaches: the first block of 1,024 slots already passes it). The Python engine has no limit."""
    from fluidopt.sim import state

    monkeypatch.setattr(state, "MAX_ID", 1000)
    with pytest.raises(MemoryError, match="more than 1,000 request slots: the compiled core's race holds 32-bit ids"):
        simulate(_scenario(), "fi-wsp", horizon=2.0, backend="compiled")
    assert simulate(_scenario(), "fi-wsp", horizon=2.0, backend="python").totals["requests"] > 0


@needs_core
def test_a_stale_build_is_never_run(monkeypatch):
    """A core built from another engine.py: "auto" falls back to Python with a warning; "compiled" refuses."""
    from fluidopt.sim import _cengine  # type: ignore[attr-defined]

    monkeypatch.delenv("FLUIDOPT_ENGINE", raising=False)  # "auto" must look at the build (CI's Python pass sets it)
    monkeypatch.setattr(_cengine, "SOURCE_SHA256", "0" * 64)
    core.compiled_status.cache_clear()
    core._warn_once.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            res = simulate(_scenario(), "fi-wsp", horizon=2.0)
        assert res.meta["engine"] == "python"
        assert any("another version of fluidopt/sim/engine.py" in str(x.message) for x in w)
        with pytest.raises(UsageError, match="reinstall"):
            simulate(_scenario(), "fi-wsp", horizon=2.0, backend="compiled")
    finally:
        monkeypatch.undo()
        core.compiled_status.cache_clear()
    assert core.compiled_status()[0]


def test_cli_backend_flag(capsys):
    import json

    from fluidopt.cli import main

    assert main(["simulate", "--policy", "fi-wsp", "--gpus", "20", "--horizon", "20", "--backend", "python",
                 "--json", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine"] == "python" and out["requests"] > 0


# the plain modules that set an Engine's attributes from outside the kernel (its cold code)
COLD_MODULES = ("engine_setup.py", "fleet.py", "view.py", "bookkeeping.py")


def test_engine_pxd_declares_every_attribute():
    """A compiled class has no __dict__: every attribute that engine.py sets on Engine or GpuSet, or
    that the cold modules set on an engine (``eng.x = ...``), must be declared in engine.pxd (checked
    statically, so it fails even where the core is not built)."""
    import ast
    import re
    from pathlib import Path

    here = Path(core.__file__).parent
    tree = ast.parse((here / "engine.py").read_text(encoding="utf-8"))
    pxd = (here / "engine.pxd").read_text(encoding="utf-8")
    declared: dict[str, set[str]] = {}
    for cls in re.split(r"^cdef class |^@cython.final\ncdef class ", pxd, flags=re.M)[1:]:
        name = cls.split(":", 1)[0].strip()
        names = set()
        for line in cls.splitlines():
            m = re.match(r"\s+cdef public [^,]*?(\w+(?:, \w+)*)$", line.split("#")[0].rstrip())
            if m:
                names |= {x.strip() for x in m.group(1).split(",")}
        declared[name] = names

    def assigned_to(node, obj: str) -> set[str]:
        targets = [t for n in ast.walk(node) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
                   for t in (n.targets if isinstance(n, ast.Assign) else [n.target])]
        return {a.attr for t in targets for a in ast.walk(t)
                if isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name) and a.value.id == obj}

    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in ("Engine", "GpuSet"):
            assigned = assigned_to(node, "self")
            assert {"_now", "_lam"} <= assigned or node.name == "GpuSet"
            missing = assigned - declared[node.name]
            assert not missing, f"{node.name}: attributes set in engine.py but not declared in engine.pxd: {missing}"
    for mod in COLD_MODULES:
        assigned = assigned_to(ast.parse((here / mod).read_text(encoding="utf-8")), "eng")
        assert assigned, mod
        missing = assigned - declared["Engine"]
        assert not missing, f"{mod}: attributes set on the engine but not declared in engine.pxd: {missing}"
    setup = assigned_to(ast.parse((here / "engine_setup.py").read_text(encoding="utf-8")), "eng")
    assert {"alpha", "beta", "g_dcls"} <= setup


def test_kernel_stays_small():
    """The kernel (state, actions, the event loop) is at most 1,000 lines, comments included; cold
    code goes to the plain modules (docs/simulator.md section 9)."""
    from pathlib import Path

    lines = (Path(core.__file__).parent / "engine.py").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 1000, f"fluidopt/sim/engine.py has {len(lines)} lines; move cold code out (limit 1,000)"


def test_request_fields_are_defined_once_and_typed_in_the_pxd():
    """engine.REQUEST_FIELDS is each per-request field's one definition (set up and grown from it);
    engine.pxd must type exactly those r_* names, ints as long long[:] and floats as double[:] (strided
    views of the core's request rows, state.set_typed_state)."""
    import re
    from pathlib import Path

    from fluidopt.sim.engine import REQUEST_FIELDS

    pxd = (Path(core.__file__).parent / "engine.pxd").read_text(encoding="utf-8")
    typed: dict[str, str] = {}
    for line in pxd.splitlines():
        m = re.match(r"\s+cdef public (long long|double)\[:\] ([\w, ]+)", line.split("#")[0])
        if m:
            for name in (x.strip() for x in m.group(2).split(",")):
                if name.startswith("r_"):
                    typed[name] = "int" if m.group(1) == "long long" else "float"
    names = [f[0] for f in REQUEST_FIELDS]
    assert len(set(names)) == len(names)
    assert {f[0]: f[1].__name__ for f in REQUEST_FIELDS} == typed
    for _name, kind, fill, meaning in REQUEST_FIELDS:
        assert isinstance(fill, kind) and meaning
