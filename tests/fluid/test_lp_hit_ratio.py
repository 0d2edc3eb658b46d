"""The fluid model with prefix reuse (issue 42, step 3): a class with hit ratio h prefills (1 - h) x prompt
and keeps the whole prompt in KV. The LP with h equals, to 1e-6, an LP written here independently
whose prefill length is scaled by (1 - h), with rewards and the KV footprint on the whole prompt."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import linprog

from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import RequestClass, paper_scenario
from fluidopt.fluid.batch import mean_context
from fluidopt.fluid.capacity import fluid_fleet_bound
from fluidopt.fluid.lp import solve_fluid
from fluidopt.fluid.sli import MinServedFraction

_DATA = Path(os.environ.get("FLUIDOPT_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared/data"))
MOONCAKE = _DATA / "mooncake-traces/conversation_trace.jsonl"


def _with_h(sc, hs):
    return replace(sc, classes=tuple(replace(c, hit_ratio=h) for c, h in zip(sc.classes, hs)))


def _independent_lp(sc, hs) -> float:
    """Revenue per GPU per s (bundled) of the per-GPU fluid LP, columns x, ym, ys, qp, qd per class,
    with prefill work (1 - h) P and every reward on the whole prompt."""
    g = sc.gpu
    tau = g.alpha + g.beta * g.chunk
    B = g.batch
    P = np.array([c.prompt for c in sc.classes])
    D = np.array([c.decode for c in sc.classes])
    lam = np.array([c.rate for c in sc.classes]) / sc.gpus
    th = np.array([c.patience for c in sc.classes])
    mu_p = g.chunk / ((1 - np.asarray(hs)) * P * tau)
    mu_m, mu_s = 1 / (D * tau), (1 / g.tau_solo) / D
    w = sc.prefill_price * P + sc.decode_price * D
    n = len(P)
    X, YM, YS, QP, QD = (slice(k * n, (k + 1) * n) for k in range(5))
    c = np.zeros(5 * n)
    c[YM], c[YS] = -w * mu_m, -w * mu_s
    A_ub = np.zeros((3, 5 * n))
    A_ub[0, X] = 1
    A_ub[1, YM], A_ub[1, X] = 1, -(B - 1)
    A_ub[2, YS], A_ub[2, X] = 1, B
    A_eq = np.zeros((2 * n, 5 * n))
    for i in range(n):
        A_eq[i, i], A_eq[i, 3 * n + i] = mu_p[i], th[i]
        A_eq[n + i, i], A_eq[n + i, 4 * n + i] = mu_p[i], -th[i]
        A_eq[n + i, n + i], A_eq[n + i, 2 * n + i] = -mu_m[i], -mu_s[i]
    res = linprog(c, A_ub=A_ub, b_ub=[1, 0, B], A_eq=A_eq, b_eq=np.concatenate([lam, np.zeros(n)]),
                  bounds=[(0, None)] * (5 * n), method="highs")
    assert res.status == 0
    return -res.fun


@pytest.mark.parametrize("hs", [(0.0, 0.0), (0.3, 0.3), (0.1, 0.6), (0.9, 0.05)])
@pytest.mark.parametrize("lam", [(0.5, 0.5), (2.0, 1.5)])
def test_the_lp_with_hit_ratios_equals_the_lp_with_shorter_prefills(hs, lam):
    sc = paper_scenario(gpus=100, lam=lam)
    got = solve_fluid(_with_h(sc, hs), "bundled", ())
    want = _independent_lp(sc, hs)
    assert got.objective_per_gpu == pytest.approx(want, rel=1e-6, abs=1e-9)
    # the same through the model's own inputs: prompt scaled by (1 - h), the prefill price scaled back up
    scaled = replace(sc, classes=tuple(replace(c, prompt=(1 - h) * c.prompt, prefill_price=sc.prefill_price / (1 - h))
                                       for c, h in zip(sc.classes, hs)))
    other = solve_fluid(scaled, "bundled", ())
    assert got.objective == pytest.approx(other.objective, rel=1e-6)
    assert np.allclose(got.x, other.x, atol=1e-6)


def test_a_hit_ratio_raises_revenue_when_prefill_binds_and_the_fleet_shrinks():
    sc = paper_scenario(gpus=100, lam=(2.0, 1.5))  # overloaded: the long prompts' prefill binds
    r0 = solve_fluid(sc, "bundled", ()).objective
    r5 = solve_fluid(_with_h(sc, (0.5, 0.5)), "bundled", ()).objective
    assert r5 > r0
    served = [MinServedFraction(c.name, 0.99) for c in sc.classes]
    n0 = fluid_fleet_bound(sc, served).gpus
    n5 = fluid_fleet_bound(_with_h(sc, (0.5, 0.5)), served).gpus
    scaled = replace(sc, classes=tuple(replace(c, prompt=0.5 * c.prompt) for c in sc.classes))
    assert n5 < n0
    assert n5 == pytest.approx(fluid_fleet_bound(scaled, served).gpus, rel=1e-6)


def test_the_kv_footprint_and_the_prompt_reward_stay_the_whole_prompt():
    c = RequestClass("a", prompt=3000, decode=400, rate=1.0, hit_ratio=0.4)
    assert mean_context(c) == mean_context(replace(c, hit_ratio=0.0)) == 3200
    assert c.prefill_tokens == pytest.approx(1800)
    sc = _with_h(paper_scenario(gpus=10), (0.4, 0.4))
    r, r0 = sc.rates(), paper_scenario(gpus=10).rates()
    assert np.allclose(r.prefill_reward, r0.prefill_reward)
    assert np.allclose(r.mu_p, r0.mu_p / 0.6)


@pytest.mark.parametrize("h", [1.0, -0.1, True, 1.5, "0.3"])
def test_a_bad_hit_ratio_is_one_line(h):
    with pytest.raises(ScenarioError, match=r"^classes\[a\]\.hit_ratio: expected a number in \[0, 1\)"):
        RequestClass("a", prompt=10, decode=10, rate=1.0, hit_ratio=h)


def test_the_scenario_file_reads_and_round_trips_the_hit_ratio(tmp_path):
    from fluidopt.scenario import load_scenario, scenario_from_dict, scenario_to_dict

    sc = _with_h(paper_scenario(gpus=10), (0.25, 0.0))
    d = scenario_to_dict(sc)
    assert [c.get("hit_ratio") for c in d["classes"]] == [0.25, None]  # 0, the default, is not written
    assert [c.hit_ratio for c in scenario_from_dict(d).classes] == [0.25, 0.0]
    text = """
[gpu]
alpha = 0.0174
beta = 6.2e-5
gamma = 45.45
chunk = 256
batch = 16
[cluster]
gpus = 4
[[classes]]
name = "chat"
prompt = 3000
decode = 400
rate = 2.0
hit_ratio = {h}
"""
    (tmp_path / "s.toml").write_text(text.format(h=0.35))
    assert load_scenario(tmp_path / "s.toml").classes[0].hit_ratio == 0.35
    (tmp_path / "bad.toml").write_text(text.format(h=1))
    with pytest.raises(ScenarioError, match=r"^classes\[chat\]\.hit_ratio: expected a number in \[0, 1\)"):
        load_scenario(tmp_path / "bad.toml")


@pytest.mark.integration
@pytest.mark.parametrize("argv, message", [
    (["solve", "--hit-ratio", "1"], "--hit-ratio: expected a number in [0, 1)"),
    (["solve", "--hit-ratio", "0.2", "--from-trace", "x.jsonl"], "--hit-ratio, --from-trace: expected one of them"),
    (["solve", "--cache-blocks", "10"], "--cache-blocks: only used with --from-trace"),
    (["solve", "--from-trace", "no-such.jsonl"], "--from-trace: 'no-such.jsonl': no such file"),
    (["plan", "--hit-ratio", "0.2"], "plan: classes short-prompt, long-prompt have a prefix-cache hit ratio, but the "
                                     "simulator does not model the cache yet"),
    (["plan", "--hit-ratio", "0.2", "--day"], "--hit-ratio, --from-trace: not with --day"),
    (["price", "--hit-ratio", "0.2", "--simulate", "0.1,0.2"], "--simulate: classes short-prompt, long-prompt"),
])
def test_cli_bad_cache_arguments_exit_2_with_one_line(capsys, argv, message):
    from fluidopt.cli import main

    assert main(argv) == 2
    out, err = capsys.readouterr()
    line, = err.strip().splitlines()
    assert message in line


@pytest.mark.integration
def test_cli_solve_and_plan_take_the_hit_ratio(capsys):
    from fluidopt.cli import main

    assert main(["solve", "--json"]) == 0
    base = json.loads(capsys.readouterr().out)
    assert main(["solve", "--json", "--hit-ratio", "0.3"]) == 0
    cached = json.loads(capsys.readouterr().out)
    sc = paper_scenario()
    assert cached["objective_per_gpu"] == pytest.approx(_independent_lp(sc, (0.3, 0.3)), rel=1e-6)
    assert base["objective_per_gpu"] == pytest.approx(_independent_lp(sc, (0.0, 0.0)), rel=1e-6)


@pytest.mark.integration
@pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"shared Mooncake trace not found at {MOONCAKE}")
def test_cli_from_trace_estimates_the_hit_ratio(capsys):
    from fluidopt.cli import main
    from fluidopt.workloads.jsonl import read_jsonl_trace
    from fluidopt.workloads.prefix import hit_ratio

    assert main(["solve", "--json", "--from-trace", str(MOONCAKE), "--cache-instances", "8",
                 "--cache-blocks", "5000"]) == 0
    out, err = capsys.readouterr()
    g = paper_scenario().gpu
    est = hit_ratio(read_jsonl_trace(MOONCAKE), "round-robin", 8, 5000, prefill_time_per_token=g.tau_mix / g.chunk,
                    decode_time_per_token=g.tau_mix).hit_ratio
    assert f"--from-trace: hit ratio {est:.4f} (round-robin, 8 instances, 5,000 blocks each" in err
    assert json.loads(out)["objective_per_gpu"] == pytest.approx(_independent_lp(paper_scenario(), (est, est)), rel=1e-6)


@pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"shared Mooncake trace not found at {MOONCAKE}")
def test_the_mooncake_fleet_of_the_docs():
    """docs/prefix-cache.md: the example scenario is the trace's means, and its fluid fleet falls from 5.32
    GPUs to 4.74 with round robin's 5,000-block caches on 8 instances (h = 0.1087)."""
    from fluidopt.scenario import load_scenario
    from fluidopt.workloads.jsonl import read_jsonl_trace
    from fluidopt.workloads.prefix import hit_ratio

    root = Path(__file__).resolve().parents[2]
    sc = load_scenario(root / "examples/scenarios/mooncake-conversation.toml")
    df = read_jsonl_trace(MOONCAKE)
    c, = sc.classes
    assert c.prompt == pytest.approx(df["prompt"].mean(), abs=0.01)
    assert c.decode == pytest.approx(df["output"].mean(), abs=0.01)
    assert c.rate == pytest.approx(len(df) / df["time"].iloc[-1], abs=1e-4)
    g = sc.gpu
    h = hit_ratio(df, "round-robin", 8, 5000, prefill_time_per_token=g.tau_mix / g.chunk,
                  decode_time_per_token=g.tau_mix).hit_ratio
    assert round(h, 4) == 0.1087
    served = [MinServedFraction("conversation", 1.0)]
    assert fluid_fleet_bound(sc, served).gpus == pytest.approx(5.32, abs=0.005)
    assert fluid_fleet_bound(_with_h(sc, (h,)), served).gpus == pytest.approx(4.74, abs=0.005)
    # prefill-bound: the fleet scales with 1 - h
    assert fluid_fleet_bound(_with_h(sc, (h,)), served).gpus == pytest.approx((1 - h) * fluid_fleet_bound(sc, served).gpus,
                                                                             rel=1e-6)


@pytest.mark.integration
def test_simulate_says_it_does_not_model_the_hit_ratio(tmp_path, capsys):
    from fluidopt.cli import main

    path = tmp_path / "h.toml"
    path.write_text('[gpu]\nalpha = 0.0174\nbeta = 6.2e-5\ngamma = 45.45\nchunk = 256\nbatch = 16\n[cluster]\ngpus = 2\n'
                    '[[classes]]\nname = "chat"\nprompt = 300\ndecode = 40\nrate = 1.0\nhit_ratio = 0.3\n')
    assert main(["simulate", str(path), "--policy", "round-robin", "--horizon", "20", "--json"]) == 0
    err = capsys.readouterr().err
    assert "warning: classes chat: the simulator does not read hit_ratio" in err
