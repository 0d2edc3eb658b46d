"""Cache-aware Gate-and-Route and backpressure Gate-and-Route (issue 42): where the gate's request starts
(the idle mixed GPU with the longest cached prefix), that nothing else changes, and LP targets with h."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from fluidopt import GPUProfile, RequestClass, Scenario
from fluidopt.control.prefix_gate import PrefixBackpressureGateAndRoute, PrefixGateAndRoute
from fluidopt.control.registry import make_controller
from fluidopt.core.errors import ScenarioError
from fluidopt.fluid.lp import solve_fluid
from fluidopt.sim.api import simulate
from fluidopt.sim.check import check_controller
from fluidopt.workloads import TraceWorkload

pytestmark = pytest.mark.filterwarnings("ignore::fluidopt.workloads.base.TraceWarning")

POLICIES = ("gate-and-route-prefix", "backpressure-gate-and-route-prefix")
PARENT = {"gate-and-route-prefix": "gate-and-route",
          "backpressure-gate-and-route-prefix": "backpressure-gate-and-route"}


def _scenario(n: int = 4) -> Scenario:
    gpu = GPUProfile.from_gamma(alpha=0.01, beta=0.001, gamma=40.0, chunk=10, batch=4)
    return Scenario(gpu=gpu, gpus=n, classes=(RequestClass("c", prompt=40, decode=2, rate=0.01, patience=0.0),),
                    prefill_price=0.1, decode_price=0.2, name="prefix-gate")


def _workload(rows, hashes: bool = True) -> TraceWorkload:
    frame = pd.DataFrame({"time": [r[0] for r in rows], "prompt": [r[1] for r in rows],
                          "output": [r[2] for r in rows], "cls": [0] * len(rows)})
    if not hashes:
        return TraceWorkload(frame, ("c",))
    return TraceWorkload(frame, ("c",), hashes=[r[3] for r in rows], block_size=10)


def _records(tmp_path, policy, wl, seed=0, **options) -> pd.DataFrame:
    if policy in PARENT.values():
        options.pop("lookahead", None)
    path = tmp_path / f"{policy}-{seed}.csv"
    simulate(_scenario(), policy, horizon=200.0, service="tokens", workload=wl, records=path, progress=False,
             seed=seed, controller_options={"mixed_gpus": 4, **({} if policy in PARENT.values() else {"lookahead": 8}), **options})
    return pd.read_csv(path).sort_values("id").reset_index(drop=True)


# A (blocks 1-4) is prefilled at t = 0 and done by t = 1 s; B (t = 5 s) shares its first three blocks, C
# (t = 10 s) shares nothing. At each arrival all four mixed GPUs are idle, so the rule alone picks the GPU.
ROWS = [(0.0, 40, 2, [1, 2, 3, 4]), (5.0, 40, 2, [1, 2, 3, 9]), (10.0, 40, 2, [7, 8])]


@pytest.mark.parametrize("policy", POLICIES)
def test_the_gate_request_starts_where_its_prefix_is_cached(tmp_path, policy):
    hits = 0
    for seed in range(6):
        rec = _records(tmp_path, policy, _workload(ROWS), seed=seed)
        a, b = rec.prefill_gpu.iloc[0], rec.prefill_gpu.iloc[1]
        assert b == a, (seed, rec.prefill_gpu.tolist())  # B's 30 matched tokens are on A's GPU only
        assert rec.cached_prompt.tolist()[:2] == [0, 30]
        parent = _records(tmp_path, PARENT[policy], _workload(ROWS), seed=seed)
        hits += int(parent.prefill_gpu.iloc[1] == parent.prefill_gpu.iloc[0])
    assert hits < 6  # the cache-blind parent picks a random idle GPU: over six seeds it misses at least once


@pytest.mark.parametrize("policy", POLICIES)
def test_with_no_match_the_decisions_are_the_parents(tmp_path, policy):
    # no block ids: every match is 0, the tie-break is the parent's one random draw, so the runs are equal
    wl = _workload([(0.1 * k, 40, 3 + k % 5, None) for k in range(40)], hashes=False)
    for seed in (1, 2):
        mine = _records(tmp_path, policy, wl, seed=seed)
        parent = _records(tmp_path, PARENT[policy], wl, seed=seed)
        pd.testing.assert_frame_equal(mine, parent)


def _sessions() -> list:
    # a burst of sessions whose turns extend each other: queueing, overlapping prefills, reuse
    rows = []
    for k in range(60):
        s = k % 5
        turn = k // 5
        rows.append((0.05 * k, 10 * (turn + 2), 1 + k % 4, [100 * s + j for j in range(turn + 2)]))
    return rows


@pytest.mark.parametrize("policy", POLICIES)
def test_engine_invariants_hold_on_a_trace_with_hashes(policy):
    res = simulate(_scenario(), policy, horizon=200.0, service="tokens", workload=_workload(_sessions()),
                   progress=False, seed=3, check=True, controller_options={"mixed_gpus": 2})
    assert res.summary()["completed"] == 60
    assert res.totals["cached_prompt_tokens"] > 0


@pytest.mark.parametrize("policy", POLICIES)
def test_the_compiled_core_and_the_python_engine_agree(tmp_path, policy):
    from fluidopt.sim.controller_fastpath import status

    if not status()[0]:
        pytest.skip("no compiled core")
    out = []
    for backend in ("compiled", "python"):
        path = tmp_path / f"{backend}.csv"
        simulate(_scenario(), policy, horizon=200.0, service="tokens", workload=_workload(_sessions()), records=path,
                 progress=False, seed=3, backend=backend, controller_options={"mixed_gpus": 2})
        out.append(pd.read_csv(path).sort_values("id").reset_index(drop=True))
    pd.testing.assert_frame_equal(out[0], out[1])


def test_the_lp_targets_use_the_hit_ratio():
    sc = _scenario()
    h = 0.4
    want = solve_fluid(replace(sc, classes=tuple(replace(c, hit_ratio=h) for c in sc.classes)), "bundled")
    blind = solve_fluid(sc, "bundled")
    for policy, cls in zip(POLICIES, (PrefixGateAndRoute, PrefixBackpressureGateAndRoute)):
        ctrl = make_controller(policy, sc, hit_ratio=h)
        assert isinstance(ctrl, cls)
        assert ctrl.x.tolist() == pytest.approx(list(want.x), abs=1e-12)
        # a harness's plan solved without h is replaced by the LP with h
        assert make_controller(policy, sc, plan=blind, hit_ratio=h).x.tolist() == pytest.approx(list(want.x), abs=1e-12)
        # without h, the plan stands
        assert make_controller(policy, sc, plan=blind).x.tolist() == pytest.approx(list(blind.x), abs=1e-12)
    assert sum(want.x) < sum(blind.x)  # less prefill work per request: smaller prefill targets


def test_bad_options_are_one_line():
    sc = _scenario()
    for policy in POLICIES:
        with pytest.raises(ScenarioError, match="hit_ratio = 1.0"):
            make_controller(policy, sc, hit_ratio=1.0)
        with pytest.raises(ScenarioError, match="expected one of them"):
            make_controller(policy, sc, hit_ratio=0.1, from_trace="x.jsonl")


@pytest.mark.parametrize("policy", POLICIES)
def test_a_freed_slot_takes_the_waiting_request_with_the_longest_match(tmp_path, policy):
    # one mixed GPU: A (blocks 1-4) prefills on GPU 0 from t = 0 to 0.08 s (4 chunks of 0.02 s); B (no
    # match) and then C (30 tokens of A's prefix) wait behind it. When the slot frees, FCFS starts B;
    # lookahead 2 compares both and starts C, whose prefix is on GPU 0.
    rows = [(0.0, 40, 2, [1, 2, 3, 4]), (0.01, 40, 2, [5, 6, 7, 8]), (0.02, 40, 2, [1, 2, 3, 9])]
    # backpressure's variant: no overflow prefills on the solo GPUs and the static partition, so GPU 0 is the
    # only prefill slot
    more = {"overflow": False, "coupled": False} if policy.startswith("backpressure") else {}
    fcfs = _records(tmp_path, policy, _workload(rows), lookahead=1, mixed_gpus=1, **more)
    look = _records(tmp_path, policy, _workload(rows), lookahead=2, mixed_gpus=1, **more)
    assert fcfs.prefill_gpu.tolist() == look.prefill_gpu.tolist() == [0, 0, 0]
    assert fcfs.wait_prefill[1] < fcfs.wait_prefill[2]  # B before C
    assert look.wait_prefill[2] < look.wait_prefill[1]  # C before B
    assert look.cached_prompt.tolist() == [0, 0, 30]
    with pytest.raises(ScenarioError, match="lookahead = 0"):
        make_controller(policy, _scenario(), lookahead=0)


@pytest.mark.integration
@pytest.mark.parametrize("policy", POLICIES)
def test_they_pass_the_controller_checks(policy):
    check_controller(policy)
