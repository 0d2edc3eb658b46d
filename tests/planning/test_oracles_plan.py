"""Oracles for `fluidopt plan --fluid-only` (fluidopt.planning.fleet, fluidopt.fluid.capacity): a one-class fleet
whose fluid bound, tokens per second and cost are arithmetic.

The instance (round numbers): tau_mix = alpha + beta C = 0.01 + 0.001 * 10 = 0.02 s, gamma = 1 / tau_solo
= 200 tokens/s, C = 10, B = 4; one class with P = 20, D = 5 (or 100), Lambda = 10 requests/s for the whole
fleet, patience 1/s; 2.00 per GPU-hour. Rates (docs/lp.md): mu_p = C / (P tau_mix) = 25 prefills/s per
prefilling GPU, mu_m = 1 / (D tau_mix), mu_s = gamma / D.

Capacity LP (docs/planning.md section 1): minimise n over
    X <= n;  Ym <= (B - 1) X;  Ys + B X <= B n;  mu_p X + theta Qp = Lambda;  mu_p X = mu_m Ym + mu_s Ys;
    mu_p X / Lambda >= s.
Served s = 0.99: X >= 0.99 * 10 / 25 = 0.396, and n is smallest at X = 0.396 (a larger X only adds
decode work). Output tokens per second at the bound: mu_p X D = 9.9 D (every prefilled request
completes: the capacity LP keeps no decode buffer). Cost per hour: ceil(n*) * price; per million output
tokens: cost per hour / (tokens per second * 3600 / 1e6).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluidopt.core.model import GPUProfile, RequestClass, Scenario
from fluidopt.fluid.capacity import fluid_fleet_bound
from fluidopt.fluid.sli import MinServedFraction
from fluidopt.planning.fleet import PlanSLIs, fluid_plan_slis, plan

PRICE = 2.0


def one_class(decode: float = 5.0, rate: float = 10.0, price: float | None = PRICE, batch: int = 4) -> Scenario:
    gpu = GPUProfile(alpha=0.01, beta=0.001, tau_solo=0.005, chunk=10, batch=batch, price_per_hour=price,
                     name="hand-gpu")
    cl = (RequestClass("a", prompt=20.0, decode=decode, rate=rate, patience=1.0),)
    return Scenario(gpu=gpu, gpus=1, classes=cl, prefill_price=1.0, decode_price=1.0, name="one-class")


def test_prefill_bound_fleet_tokens_and_cost_by_hand():
    """D = 5: mixed decode capacity (B - 1) X mu_m = 3 * 0.396 * 10 = 11.88 >= 9.9 decodes/s, so the
    decodes fit on the prefilling GPU and n* = X = 0.396; ceil -> 1 GPU."""
    res = plan(one_class(decode=5.0), PlanSLIs(served=0.99), fluid_only=True)
    row = res.table.iloc[0]
    assert row["n_fluid"] == pytest.approx(0.396, rel=1e-7)
    assert row["n_fluid_int"] == 1 and math.isnan(row["n_sim"]) and math.isnan(row["correction"])
    assert row["binding"] == "served_fraction[a]"
    assert row["output_tokens_per_s"] == pytest.approx(9.9 * 5, rel=1e-7)  # 49.5 tokens/s
    assert row["price_per_gpu_hour"] == PRICE
    assert row["cost_per_hour"] == pytest.approx(1 * PRICE)
    # 2.00 per hour / (49.5 tokens/s * 3600 s / 1e6) = 2 / 0.1782 = 11.2233... per million output tokens
    assert row["cost_per_million_output_tokens"] == pytest.approx(2.0 / 0.1782, rel=1e-7)
    assert bool(row["cheapest"]) is True


def test_decode_bound_fleet_tokens_and_cost_by_hand():
    """D = 100: mu_m = 0.5, mu_s = 2. The prefilling GPU's B - 1 = 3 mixed slots decode 3 * 0.396 * 0.5 =
    0.594 requests/s; the other 9.306/s need Ys = 4.653 solo-decoding slots; solo capacity
    Ys + B X <= B n gives n* = (4.653 + 4 * 0.396) / 4 = 1.55925 -> 2 GPUs. Tokens 9.9 * 100 = 990/s;
    cost 2 * 2.00 = 4.00 per hour, 4 / (990 * 3600 / 1e6) = 1.12233... per million."""
    res = plan(one_class(decode=100.0), PlanSLIs(served=0.99), fluid_only=True)
    row = res.table.iloc[0]
    assert row["n_fluid"] == pytest.approx(1.55925, rel=1e-7)
    assert row["n_fluid_int"] == 2
    assert row["output_tokens_per_s"] == pytest.approx(990.0, rel=1e-7)
    assert row["cost_per_hour"] == pytest.approx(4.0)
    assert row["cost_per_million_output_tokens"] == pytest.approx(4.0 / 3.564, rel=1e-7)
    assert "solo_decode_capacity" in row["binding_rows"].split(";")


def test_growth_scales_tokens_and_the_bound_exactly():
    """Demand x3: n* = 3 * 0.396 = 1.188 -> 2 GPUs; tokens 3 * 49.5 = 148.5/s; cost 4.00 per hour,
    4 / (148.5 * 0.0036) per million; the cheaper of two profiles is marked at each growth factor."""
    sc = one_class(decode=5.0)
    dear = replace(sc.gpu, price_per_hour=3.0, name="dear")
    res = plan(sc, PlanSLIs(served=0.99), profiles=[sc.gpu, dear], growth=[1, 3], fluid_only=True)
    t = res.table.set_index(["profile", "growth"])
    r = t.loc[("hand-gpu", 3.0)]
    assert r["n_fluid"] == pytest.approx(1.188, rel=1e-7) and r["n_fluid_int"] == 2
    assert r["output_tokens_per_s"] == pytest.approx(148.5, rel=1e-7)
    assert r["cost_per_million_output_tokens"] == pytest.approx(4.0 / (148.5 * 3600 / 1e6), rel=1e-7)
    assert t.loc[("dear", 1.0), "cost_per_hour"] == pytest.approx(3.0)
    assert t.loc[("dear", 3.0), "cost_per_million_output_tokens"] == pytest.approx(6.0 / (148.5 * 0.0036), rel=1e-7)
    assert bool(t.loc[("hand-gpu", 1.0), "cheapest"]) and not bool(t.loc[("dear", 1.0), "cheapest"])
    assert bool(t.loc[("hand-gpu", 3.0), "cheapest"]) and not bool(t.loc[("dear", 3.0), "cheapest"])


def test_unpriced_profile_has_no_cost_columns():
    res = plan(one_class(price=None), PlanSLIs(served=0.99), fluid_only=True, require_price=False)
    row = res.table.iloc[0]
    assert row["output_tokens_per_s"] == pytest.approx(49.5, rel=1e-7)
    assert math.isnan(row["cost_per_hour"]) and math.isnan(row["cost_per_million_output_tokens"])
    assert math.isnan(row["price_per_gpu_hour"]) and not bool(row["cheapest"])


def test_cli_fluid_only_json_reports_the_hand_numbers(tmp_path, capsys):
    from fluidopt.cli import main

    toml = tmp_path / "one.toml"
    toml.write_text(
        'name = "one-class"\n'
        "[gpu]\nalpha = 0.01\nbeta = 0.001\ntau_solo = 0.005\nchunk = 10\nbatch = 4\nprice_per_hour = 2.0\n"
        "[cluster]\ngpus = 1\n"
        '[[classes]]\nname = "a"\nprompt = 20\ndecode = 5\nrate = 10.0\npatience = 1.0\n', encoding="utf-8")
    rc = main(["plan", str(toml), "--fluid-only", "--served", "0.99", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(d["fleets"]) == 1
    f = d["fleets"][0]
    assert f["n_fluid"] == pytest.approx(0.396, rel=1e-7) and f["n_fluid_int"] == 1
    assert f["output_tokens_per_s"] == pytest.approx(49.5, rel=1e-7)
    assert f["cost_per_million_output_tokens"] == pytest.approx(2.0 / 0.1782, rel=1e-7)


def test_mean_ttft_becomes_a_prefill_wait_by_hand():
    """--ttft 0.5 s: class a's prefill takes P/C = 2 iterations of 0.02 s = 0.04 s, so its mean prefill
    wait is bounded by 0.46 s; Little's law: Qp <= 0.46 * Lambda."""
    sc = one_class()
    slis = fluid_plan_slis(sc, PlanSLIs(served=0.99, ttft=0.5))
    waits = [s for s in slis if type(s).__name__ == "MaxPrefillWait"]
    assert len(waits) == 1 and waits[0].cls == "a" and waits[0].seconds == pytest.approx(0.46)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(decode=st.floats(1.0, 300.0), rate=st.floats(0.5, 50.0), served=st.floats(0.5, 1.0))
def test_one_class_bound_and_tokens_match_the_closed_form(decode, rate, served):
    """For any one-class instance: X = s Lambda / mu_p; n* = max(X, X + (s Lambda - 3 X mu_m)+ / (B mu_s))
    (mixed slots first, the rest solo, each solo slot-row B n >= Ys + B X); tokens = s Lambda D."""
    sc = one_class(decode=decode, rate=rate)
    mu_p, mu_m, mu_s = 25.0, 1.0 / (decode * 0.02), 200.0 / decode
    X = served * rate / mu_p
    rest = max(0.0, served * rate - 3 * X * mu_m)
    n_star = X + rest / mu_s / 4
    fb = fluid_fleet_bound(sc, [MinServedFraction("a", served)])
    assert fb.gpus == pytest.approx(n_star, rel=1e-6)
    res = plan(sc, PlanSLIs(served=served), fluid_only=True)
    row = res.table.iloc[0]
    assert row["output_tokens_per_s"] == pytest.approx(served * rate * decode, rel=1e-6)
    n_int = math.ceil(n_star - 1e-9 * max(1.0, n_star))
    if abs(n_star - round(n_star)) > 1e-6:
        assert row["n_fluid_int"] == n_int
        assert row["cost_per_million_output_tokens"] == pytest.approx(
            n_int * PRICE / (served * rate * decode * 3600 / 1e6), rel=1e-6)


# -- the rest of what plan reports (mutation survivors of fluidopt/planning/fleet.py, issue 35) -------------------


def test_simulation_window_by_hand():
    """warm-up 3 T (at least 60 s), then 10 T (at least 300 s), T = the largest D_i times the slower of
    tau_mix and tau_solo; both scaled by ``scale``."""
    from fluidopt.planning.fleet import simulation_window

    # T = 5 * 0.02 = 0.1 s: the floors apply
    assert simulation_window(one_class(decode=5.0)) == (360.0, 60.0)
    # D = 2000: T = 2000 * 0.02 = 40 s -> warm-up 120, measured 400
    assert simulation_window(one_class(decode=2000.0)) == pytest.approx((520.0, 120.0))
    assert simulation_window(one_class(decode=2000.0), scale=0.5) == pytest.approx((260.0, 60.0))
    # tau_solo the slower (0.05 s > tau_mix 0.02): T = 2000 * 0.05 = 100 -> 300 + 1000
    slow = replace(one_class(decode=2000.0), gpu=replace(one_class().gpu, tau_solo=0.05))
    assert simulation_window(slow) == pytest.approx((1300.0, 300.0))


def test_each_probe_runs_on_a_fleet_of_that_size_named_after_it():
    from fluidopt.planning.fleet import _on_fleet

    s = _on_fleet(one_class(), 7)
    assert s.gpus == 7 and s.name == "one-class-n7" and s.classes == one_class().classes


class _Recording:
    """An executor that runs the jobs here and counts them."""

    name, workers = "recording", 1

    def __init__(self):
        self.jobs = 0

    def imap(self, fn, jobs):
        jobs = list(jobs)
        self.jobs += len(jobs)
        for k, j in enumerate(jobs):
            yield k, fn(j)

    def close(self):
        pass

    def describe(self):
        return "recording"


def test_the_search_runs_on_the_given_executor_and_reports_it():
    sc = one_class()
    rec = _Recording()
    res = plan(sc, PlanSLIs(served=0.5), seeds=2, horizon=40.0, warmup=10.0, executor=rec, policy="fcfs")
    assert rec.jobs >= 2 and res.meta["executor"] == "recording" and res.meta["fluid_only"] is False
    assert res.table.iloc[0]["n_sim"] >= 1
    # without one: a local pool of min(cores, seeds) workers, here one seed -> one worker
    one = plan(sc, PlanSLIs(served=0.5), seeds=1, horizon=40.0, warmup=10.0, policy="fcfs")
    assert one.meta["executor"] == "local (1 worker)"
    fo = plan(sc, PlanSLIs(served=0.5), fluid_only=True)
    assert fo.meta["fluid_only"] is True and fo.meta["executor"] is None and fo.to_dict()["fluid_only"] is True


def test_figure_draws_mean_bound_target_and_fluid_bound():
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd

    from fluidopt.planning.fleet import PlanResult

    table = pd.DataFrame([{"profile": "p", "growth": 1.0, "n_fluid": 2.5, "cost_per_hour": 1.0}])
    curves = pd.DataFrame([{"profile": "p", "growth": 1.0, "n": n, "metric": "served", "class": "a", "mean": m,
                            "bound": b, "target": 0.9, "met": b >= 0.9}
                           for n, m, b in ((3, 0.85, 0.8), (4, 0.95, 0.93))])
    fig = PlanResult(table=table, curves=curves, slis=PlanSLIs(served=0.9), policy="fcfs", seeds=2).figure()
    ax = fig.axes[0]
    mean_line = ax.lines[0]
    assert list(mean_line.get_xdata()) == [3, 4] and list(mean_line.get_ydata()) == [0.85, 0.95]
    assert mean_line.get_markersize() == 4
    # the shaded band runs between the mean and the bound
    verts = ax.collections[0].get_paths()[0].vertices
    ys = {round(float(y), 6) for y in verts[:, 1]}
    assert {0.8, 0.93, 0.85, 0.95} <= ys
    assert any(list(ln.get_xdata()) == [2.5, 2.5] for ln in ax.lines)  # the fluid bound
    assert ax.get_title() == "p, demand x1"


def test_fleet_bound_duals_and_report():
    """n* = s Lambda / mu_p = 0.4 s on the prefill-bound instance: d n* / d s = 0.4 (the served-fraction
    row's dual); on the decode-bound one n* is linear in s too: 1.55925 / 0.99."""
    fb = fluid_fleet_bound(one_class(decode=5.0), [MinServedFraction("a", 0.99)])
    assert fb.duals["served_fraction[a]"] == pytest.approx(0.4, rel=1e-7)
    assert fb.x == pytest.approx([1.0]) and fb.q_prefill == pytest.approx([0.1 / 0.396], rel=1e-6)
    d = fb.to_dict()
    assert d["gpus"] == pytest.approx(0.396) and d["gpus_int"] == 1 and d["slis"] == ["served:a=0.99"]
    assert d["binding"][0] == "served_fraction[a]" and d["binding_sli"] == "served_fraction[a]"
    fb2 = fluid_fleet_bound(one_class(decode=100.0), [MinServedFraction("a", 0.99)])
    assert fb2.duals["served_fraction[a]"] == pytest.approx(1.55925 / 0.99, rel=1e-6)


def test_an_unattainable_tpot_names_the_profile():
    from fluidopt.core.errors import ScenarioError
    from fluidopt.fluid.sli import TPOT

    with pytest.raises(ScenarioError, match=r"solo decode time is 0.005 s per token \(1/gamma, profile hand-gpu\)"):
        fluid_fleet_bound(one_class(), [MinServedFraction("a", 0.9), TPOT(0.004)])
    anon = replace(one_class(), gpu=replace(one_class().gpu, name=None))
    with pytest.raises(ScenarioError, match=r"profile custom\)"):
        fluid_fleet_bound(anon, [MinServedFraction("a", 0.9), TPOT(0.005)])


def test_fleet_bound_operating_point_per_gpu():
    """Per-GPU operating point at n*: prefill-bound, the 9.9 decodes/s fill Ym = 0.99 mixed slots
    (mu_m = 10) on n* = 0.396 GPUs -> y_mixed = 2.5, y_solo = 0; decode-bound (D = 100), Ym = 3 X = 1.188 and
    Ys = 4.653 on n* = 1.55925."""
    fb = fluid_fleet_bound(one_class(decode=5.0), [MinServedFraction("a", 0.99)])
    assert fb.y_mixed == pytest.approx([2.5], rel=1e-6) and fb.y_solo == pytest.approx([0.0], abs=1e-9)
    fb2 = fluid_fleet_bound(one_class(decode=100.0), [MinServedFraction("a", 0.99)])
    assert fb2.x == pytest.approx([0.396 / 1.55925], rel=1e-6)
    assert fb2.y_mixed == pytest.approx([1.188 / 1.55925], rel=1e-6)
    assert fb2.y_solo == pytest.approx([4.653 / 1.55925], rel=1e-6)
    assert fb2.class_names == ("a",) and len(fb2.slis) == 1
