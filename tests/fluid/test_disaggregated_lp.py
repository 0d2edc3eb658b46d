"""The fluid LP of the disaggregated steady state (fluid/disaggregated.py; issue 44, point 2): the
single-class closed form, a two-class case worked by hand, the colocated comparison on the paper's
two-class scenario and ``fluidopt solve --layout disaggregated``."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw
from fluidopt.cli import main
from fluidopt.core.errors import InfeasibleError
from fluidopt.core.model import paper_scenario
from fluidopt.fluid.disaggregated import (
    DisaggClass,
    DisaggPools,
    colocated_capacity,
    compare_layouts,
    pools_of_scenario,
    solve_disaggregated,
)
from fluidopt.fluid.lp import solve_fluid
from fluidopt.fluid.split_bound import min_instances

PRE = IterationLaw(PrefillLaw(0.0625, 2.0**-12, 1e-8), DecodeLaw((0.01, 0.0, 0.0)))
DEC = IterationLaw(PrefillLaw(0.01, 1e-4), DecodeLaw((0.008, 2e-6, 2e-4)))


# The cases put the closed form's whole-number prompts per batch on an integer (max_tokens / prompt, or
# the TTFT bound exactly at 3 prompts), where the LP's real batch size is the same number.
@pytest.mark.parametrize("prompt, output, kv, ttft, tpot, binding", [
    (512, 128, math.inf, 10.0, 0.05, "tpot"),      # 4 prompts of 512 fill 2048 tokens
    (256, 300, 8000.0, 10.0, 0.2, "kv"),          # 8 prompts; KV holds 8000 / 406 requests
    (256, 1000, 1e6, 0.0625 + 3 * (2.0**-12 * 256 + 1e-8 * 256**2), 0.03, "tpot"),  # TTFT: 3 prompts
])
def test_single_class_equals_closed_form(prompt, output, kv, ttft, tpot, binding):
    rate = 7.0
    sb = min_instances(rate, prompt, output, PRE, DEC, kv_tokens=kv, ttft=ttft, tpot=tpot, prefill_tp=2, decode_tp=1)
    assert sb.binding == binding
    lp = solve_disaggregated([DisaggClass("a", rate, prompt, output, ttft=ttft, tpot=tpot)],
                             DisaggPools(PRE, DEC, 2, 1, kv_tokens=kv))
    assert lp.prefill_instances_total == pytest.approx(sb.prefill_instances, rel=1e-6, abs=1e-9)
    assert lp.decode_instances_total == pytest.approx(sb.decode_instances, rel=1e-6, abs=1e-9)
    assert lp.gpus == pytest.approx(sb.gpus, rel=1e-6)
    assert lp.prefill_batch[0] == pytest.approx(sb.batch_prompts, rel=1e-6)
    assert lp.decode_batch[0] == pytest.approx(sb.decode_batch, rel=1e-6)
    assert lp.step[0] == pytest.approx(sb.step, rel=1e-6)


def test_two_regime_law_takes_the_faster_regime():
    """Own derivation: small law (0.008, 0, 2e-4) below 32 requests, large (0.006, 0, 1e-4) from 32; TPOT
    0.02 s, no KV limit. Small: B <= (0.02 - 0.008) / 2e-4 = 60 but < 32, so B = 32, step 0.0144 s, 2222.2
    tokens/s. Large: B = (0.02 - 0.006) / 1e-4 = 140, step 0.02 s, 7000 tokens/s: the large regime wins.
    Decode instances for 10 requests/s of 101 output tokens: 10 * 100 / 7000."""
    dec = IterationLaw(PRE.prefill, DecodeLaw((0.008, 0.0, 2e-4), (0.006, 0.0, 1e-4), 32))
    lp = solve_disaggregated([DisaggClass("a", 10.0, 256, 101, tpot=0.02)], DisaggPools(PRE, dec))
    assert lp.decode_instances_total == pytest.approx(1000 / 7000, rel=1e-9)
    assert lp.decode_batch[0] == pytest.approx(140, rel=1e-9)


# Two classes by hand. Prefill a + b*tokens = 0.01 + 1e-4 * tokens, at most 1000 tokens per batch;
# decode 0.02 + 0.001 B per step, KV 2000 tokens per decode instance, TPOT 0.05 s (never binding: KV caps
# B first). Prefill TP 2, decode TP 1.
#   A: 10/s, prompt 100, output 11 -> 10 prompts per 0.11 s batch: 0.011 instances per request/s;
#      ctx 105.5, B = 2000/105.5, 10 steps per request: (0.02/B + 0.001) * 10 = 0.02055 per request/s.
#   B: 2/s, prompt 500, output 21 -> 2 prompts per 0.11 s batch: 0.055 per request/s;
#      ctx 510.5, B = 2000/510.5, 20 steps: (0.02 * 510.5/2000 + 0.001) * 20 = 0.1221 per request/s.
HAND_PRE = IterationLaw(PrefillLaw(0.01, 1e-4), DecodeLaw((0.02, 0.0, 0.001)))
HAND_POOLS = DisaggPools(HAND_PRE, HAND_PRE, prefill_tp=2, decode_tp=1, kv_tokens=2000.0, max_tokens=1000)
HAND = (DisaggClass("A", 10.0, 100, 11, reward=1.0, tpot=0.05), DisaggClass("B", 2.0, 500, 21, reward=10.0, tpot=0.05))


def test_two_classes_min_gpus_by_hand():
    lp = solve_disaggregated(HAND, HAND_POOLS)
    assert lp.prefill_instances_total == pytest.approx(10 * 0.011 + 2 * 0.055, rel=1e-9)
    assert lp.decode_instances_total == pytest.approx(10 * 0.02055 + 2 * 0.1221, rel=1e-9)
    assert lp.gpus == pytest.approx(2 * 0.22 + 0.4497, rel=1e-9)
    assert list(lp.prefill_batch) == pytest.approx([10, 2])
    assert list(lp.decode_batch) == pytest.approx([2000 / 105.5, 2000 / 510.5])
    # one more request/s costs its GPUs: prefill TP 2 times instances plus decode instances
    assert lp.duals["demand[A]"] == pytest.approx(2 * 0.011 + 0.02055, rel=1e-6)
    assert lp.duals["demand[B]"] == pytest.approx(2 * 0.055 + 0.1221, rel=1e-6)


def test_two_classes_revenue_on_a_fleet_by_hand():
    """0.5 GPUs: B earns 10 / 0.2321 per GPU, A 1 / 0.04255: B in full (0.4642 GPUs), A the rest."""
    lp = solve_disaggregated(HAND, HAND_POOLS, "max_revenue", fleet_gpus=0.5)
    ra = (0.5 - 2 * 0.2321) / 0.04255
    assert list(lp.served) == pytest.approx([ra, 2.0], rel=1e-9)
    assert lp.revenue == pytest.approx(20 + ra, rel=1e-9)
    # at a free split a GPU is worth the same in either pool: A's revenue per GPU
    assert lp.gpu_shadow_price["prefill"] == pytest.approx(1 / 0.04255, rel=1e-6)
    assert lp.gpu_shadow_price["decode"] == pytest.approx(1 / 0.04255, rel=1e-6)


def test_two_classes_fixed_split_prices_the_bottleneck_pool():
    """0.2 prefill and 0.3 decode instances: B in full uses 0.11 and 0.2442; A gets the decode left,
    0.0558 / 0.02055 requests/s, with prefill to spare. A decode GPU is worth 1 / 0.02055, a prefill GPU 0."""
    lp = solve_disaggregated(HAND, HAND_POOLS, "max_revenue", prefill_instances=0.2, decode_instances=0.3)
    assert list(lp.served) == pytest.approx([(0.3 - 0.2442) / 0.02055, 2.0], rel=1e-9)
    assert lp.gpu_shadow_price["decode"] == pytest.approx(1 / 0.02055, rel=1e-6)
    assert lp.gpu_shadow_price["prefill"] == pytest.approx(0.0, abs=1e-9)


def test_ttft_below_one_prompt_is_infeasible():
    with pytest.raises(InfeasibleError, match="TTFT bound"):
        solve_disaggregated([DisaggClass("A", 1.0, 100, 11, ttft=0.015)], HAND_POOLS)


# The paper's two-class scenario (500 GPUs, Qwen-8B on A100 straight line, bundled prices); numbers
# measured with HiGHS (docs/lp.md, "Disaggregated layout").
def test_paper_scenario_comparison():
    s = paper_scenario()
    cmp = compare_layouts(s, pools_of_scenario(s))
    co, d = cmp["colocated"], cmp["disaggregated"]
    # goodput per GPU: the largest load at the 50/50 mix served in full
    assert co["goodput_per_gpu"] == pytest.approx(0.957766, rel=1e-5)
    assert d["goodput_per_gpu"] == pytest.approx(500 / cmp["disaggregated_min_gpus"]["gpus"], rel=1e-12)
    assert cmp["disaggregated_min_gpus"]["gpus"] == pytest.approx(536.748, rel=1e-5)
    assert cmp["winner"] == "colocated" and cmp["goodput_gain"] == pytest.approx(0.931536 / 0.957766 - 1, abs=1e-5)
    # revenue on the 500 GPUs at the scenario's load
    assert co["revenue_per_gpu"] == pytest.approx(297.703, rel=1e-5)
    assert d["revenue_per_gpu"] == pytest.approx(292.882, rel=1e-5)
    assert d["served_per_gpu"] == pytest.approx(0.947312, rel=1e-5)
    assert d["gpus"] == pytest.approx(500)
    # long prompts (3000 tokens > 2048) prefill alone: 0.0174 + 6.2e-5 * 3000 s each, 250/s
    assert d["classes"]["long-prompt"]["prefill_instances"] == pytest.approx(250 * (0.0174 + 6.2e-5 * 3000))
    assert d["gpu_shadow_price"]["prefill"] == pytest.approx(d["gpu_shadow_price"]["decode"], rel=1e-6)
    assert d["gpu_shadow_price"]["prefill"] == pytest.approx(164.885, rel=1e-5)


def test_colocated_capacity_is_the_edge_of_full_service():
    s = paper_scenario()
    cap = colocated_capacity(s)

    def served(f):
        sc = replace(s, classes=tuple(replace(c, rate=c.rate * f) for c in s.classes))
        sol = solve_fluid(sc)
        return float(np.sum(sol.throughput)), float(np.sum(sol.lam))

    got, offered = served(cap * 0.999)
    assert got == pytest.approx(offered, rel=1e-7)
    got, offered = served(cap * 1.01)
    assert got < offered * (1 - 1e-4)


def test_paper_scenario_tpot_bound_favours_disaggregation():
    """TPOT 0.023 s: the colocated LP must keep mixed iterations (0.0333 s) rare; a decode pool steps at
    tau_solo = 0.022 s whatever prefill does, so disaggregation wins."""
    s = paper_scenario()
    cmp = compare_layouts(s, pools_of_scenario(s), tpot=0.023)
    assert cmp["winner"] == "disaggregated"
    assert cmp["colocated"]["goodput_per_gpu"] == pytest.approx(0.437801, rel=1e-5)
    assert cmp["disaggregated"]["goodput_per_gpu"] == pytest.approx(0.931536, rel=1e-5)


def run(capsys, *argv):
    code = main(["solve", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_disaggregated_json(capsys):
    code, out, _ = run(capsys, "--layout", "disaggregated", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["winner"] == "colocated"
    assert d["disaggregated"]["goodput_per_gpu"] == pytest.approx(0.931536, rel=1e-5)


DATA = next((p / "shared/data/distserve-opt13b-a100" for p in Path(__file__).resolve().parents[2:]
             if (p / "shared/data/distserve-opt13b-a100").is_dir()), Path("../shared/data/distserve-opt13b-a100"))
PROFILE = DATA / "profiler-a100-80g.distserve.json"


@pytest.mark.parametrize("argv, message", [
    (("--decode-tp", "0"), "needs a decode pool"),
    (("--prefill-tp", "0"), "needs a prefill pool"),
    (("--prefill-tp", "2"), "TP degree 1 only"),
    (("--tpot", "0"), "--tpot: expected seconds > 0"),
    (("--pricing", "separate"), "bundled"),
    (("--prefill-instances", "50", "--decode-instances", "0"), "--decode-instances 0: a disaggregated layout needs a decode pool"),
    (("--prefill-instances", "50"), "give both"),
])
def test_cli_bad_input_one_line_exit_2(capsys, argv, message):
    code, out, err = run(capsys, "--layout", "disaggregated", *argv)
    assert code == 2 and out == ""
    assert message in err and err.count("\n") == 1


def test_cli_disaggregated_flag_refused_on_colocated(capsys):
    code, out, err = run(capsys, "--decode-tp", "1")
    assert code == 2 and "only with --layout disaggregated" in err and err.count("\n") == 1


@pytest.mark.skipif(not PROFILE.is_file(), reason="DistServe's profile is not in shared/data")
def test_cli_tp_missing_from_profile(capsys):
    code, out, err = run(capsys, "--layout", "disaggregated", "--profile", str(PROFILE), "--model", "facebook/opt-13b",
                         "--prefill-tp", "3")
    assert code == 2 and "no TP degree 3" in err and err.count("\n") == 1


def test_bound_no_layout_meets_is_reported_not_raised():
    """TPOT 0.1 ms: below the decode step (0.022 s) and any colocated iteration; neither layout serves."""
    s = paper_scenario()
    cmp = compare_layouts(s, pools_of_scenario(s), tpot=1e-4)
    assert cmp["winner"] == "neither"
    assert cmp["colocated"]["status"] == "infeasible" and cmp["disaggregated_min_gpus"]["status"] == "infeasible"
    assert cmp["disaggregated"]["served_per_gpu"] == 0.0


@pytest.mark.skipif(not (DATA / "measured").is_dir(), reason="DistServe's measured runs are not in shared/data")
def test_distserve_placement_case_fluid_bound():
    """OPT-13B, prefill TP 2, decode TP 1 (DistServe's profile and KV capacity), TTFT 0.2 s, TPOT 0.1 s,
    every request of the four shipped runs a class of its own. The fluid LP's per-GPU goodput (3.568/s)
    bounds DistServe's 1.56/s at 90% attainment from above: it has no queueing and no tail."""
    import csv

    from fluidopt.calibration.timemodels import load_distserve_profile
    from fluidopt.engines.validation import read_measured

    runs = [read_measured(f) for f in sorted((DATA / "measured").glob("distserve-*.exp"))]
    P = np.concatenate([r.prompt for r in runs])
    O = np.concatenate([r.output for r in runs])
    with (DATA / "max_num_tokens.csv").open() as fh:
        kv = next(int(r["max_num_tokens"]) for r in csv.DictReader(fh)
                  if r["model"] == "facebook/opt-13b" and r["tp"] == "1" and r["pp"] == "1")
    pools = DisaggPools(load_distserve_profile(PROFILE, "facebook/opt-13b", 2),
                        load_distserve_profile(PROFILE, "facebook/opt-13b", 1), 2, 1, kv_tokens=kv)
    n = len(P)
    lp = solve_disaggregated([DisaggClass(f"r{k}", 1.0 / n, float(P[k]), float(O[k]), ttft=0.2, tpot=0.1)
                              for k in range(n)], pools)
    assert n == 1200
    assert 1.0 / lp.gpus == pytest.approx(3.568, rel=1e-3)
    assert 1.0 / lp.gpus > 1.56
    assert np.nanmax(lp.step) <= 0.1 * (1 + 1e-9)  # TPOT row


def test_cli_fixed_split_prices_each_pool(capsys):
    """50 prefill instances are short of the 50.85 the long prompts alone need: a prefill GPU is worth far
    more than a decode GPU there; at 60 prefill instances prefill is slack (price 0). By hand: a long
    request takes 0.0174 + 6.2e-5 * 3000 = 0.2034 prefill instances per request/s (it prefills alone) and
    399 * tau_solo / 16 = 0.548675 decode instances (16 per 0.0220022 s step); a short one 300 * 6.2e-5 + 0.0174 /
    (2048 / 300) = 0.021149 prefill and 999 * 0.0220022 / 16 = 1.373763 decode. The decode price p_d
    makes the marginal short request pay: 230 = 0.021149 p_p + 1.373763 p_d; the prefill price p_p the
    marginal long one: 380 = 0.2034 p_p + 0.548675 p_d. Solved: p_p = 1477.99, p_d = 144.67."""
    code, out, _ = run(capsys, "--layout", "disaggregated", "--prefill-instances", "50", "--decode-instances", "450",
                       "--json")
    fx = json.loads(out)["disaggregated_fixed_split"]
    assert code == 0 and fx["gpus"] == pytest.approx(500)
    tau = 1 / 45.45
    A = np.array([[300 * 6.2e-5 + 0.0174 / (2048 / 300), 999 * tau / 16], [0.0174 + 6.2e-5 * 3000, 399 * tau / 16]])
    p_p, p_d = np.linalg.solve(A, [230.0, 380.0])
    assert fx["gpu_shadow_price"]["prefill"] == pytest.approx(p_p, rel=1e-6)
    assert fx["gpu_shadow_price"]["decode"] == pytest.approx(p_d, rel=1e-6)
    code, out, _ = run(capsys, "--layout", "disaggregated", "--prefill-instances", "60", "--decode-instances", "440",
                       "--json")
    assert json.loads(out)["disaggregated_fixed_split"]["gpu_shadow_price"]["prefill"] == pytest.approx(0, abs=1e-9)
