"""Chiron, QLM and the utilisation autoscaler (fluidopt.control.orchestration) on a small version of
the Chiron workflow: closed forms of the GPU law, the controllers' decisions, conservation and
SLO accounting with a changing fleet, both engines agreeing bit for bit."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fluidopt.control.orchestration import (
    Chiron,
    batch_throughput,
    iteration_time,
    largest_batch,
    split_classes,
)
from fluidopt.control.registry import available, make_controller
from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import Fleet, GPUProfile, RequestClass, Scenario
from fluidopt.sim import backend as core
from fluidopt.sim.api import simulate
from fluidopt.workloads import Backlog, BacklogWorkload, ClassSpec, Exponential, GammaRenewal, SyntheticWorkload

GPU = GPUProfile(alpha=0.0174, beta=6.2e-5, tau_solo=1 / 45.45, chunk=256, batch=64, kv_time_per_token=1.5e-6)


def workflow(n_max=10, initial=4, backlog=1500, at=30.0, deadline=400.0, rate=6.0):
    """A small Chiron workflow: bursty interactive traffic, a batch backlog with an absolute deadline."""
    classes = (RequestClass("interactive", prompt=300, decode=100, rate=rate, ttft_slo=2.0, itl_slo=0.06),
               RequestClass("batch", prompt=300, decode=400, rate=1e-6, deadline_at=deadline))
    sc = Scenario(gpu=GPU, gpus=n_max, classes=classes, name="mini-workflow",
                  fleet=Fleet(initial=initial, startup_delay=20.0, kv_swap_time_per_token=5e-6))
    base = SyntheticWorkload([ClassSpec(GammaRenewal(rate, 4.0), Exponential(300), Exponential(100), name="interactive")])
    wl = BacklogWorkload(base, [Backlog("batch", backlog, at, Exponential(300), Exponential(400))],
                         class_names=sc.class_names)
    return sc, wl


def test_gpu_law_closed_forms():
    ctx = 300 + 400 / 2
    assert iteration_time(GPU, 10, ctx) == pytest.approx(GPU.tau_mix + 1.5e-6 * 10 * ctx)
    # largest b with tau_mix + kap * b * ctx <= 0.06
    b = largest_batch(GPU, 0.06, ctx)
    assert iteration_time(GPU, b, ctx) <= 0.06 < iteration_time(GPU, b + 1, ctx)
    assert largest_batch(GPU, None, ctx) == GPU.batch - 1
    assert largest_batch(GPU, 0.001, ctx) == 1  # infeasible target: one decode
    # decode-bound: b / (D * mean iteration), mean iteration from the mixed share f = b/D * ceil(P/C)
    b, P, D = 8, 300, 400
    f = b / D * 2
    tau = f * GPU.tau_mix + (1 - f) * GPU.tau_solo + 1.5e-6 * b * (P + D / 2)
    assert batch_throughput(GPU, b, P, D) == pytest.approx(b / D / tau)
    # prefill-bound: one prefill at a time
    assert batch_throughput(GPU, 63, 3000, 10) == pytest.approx(1 / (12 * (GPU.tau_mix + 1.5e-6 * 63 * 3005)))


def test_class_split_and_options():
    sc, _ = workflow()
    assert split_classes(sc) == ([0], [1])
    assert split_classes(sc, ["interactive"]) == ([1], [0])
    with pytest.raises(ScenarioError, match="batch_classes: 'x' is not a class"):
        split_classes(sc, ["x"])
    for name in ("chiron", "qlm", "utilisation-autoscaler"):
        assert name in available()
    with pytest.raises(ScenarioError, match="batch_size: expected an integer in 1..63"):
        make_controller("utilisation-autoscaler", sc, batch_size=0)
    with pytest.raises(ScenarioError, match="chiron: safety: expected a number > 0"):
        make_controller("chiron", sc, safety=-1)
    c = make_controller("chiron", sc)
    assert isinstance(c, Chiron) and c.b_int == largest_batch(GPU, 0.06, 500) and c.b_bat == 63
    # interactive instances sized from the interactive load at the ITL-safe batch
    mu = batch_throughput(GPU, c.b_int, 300, 100)
    assert c.n_int == math.ceil(6.0 / mu)


@pytest.fixture(scope="module")
def runs():
    sc, wl = workflow()
    out = {}
    for pol in ("chiron", "qlm", "utilisation-autoscaler", "fluid-plan"):
        out[pol] = simulate(sc, pol, horizon=450.0, seed=3, service="tokens", workload=wl, check=False)
    return out


def test_every_request_is_accounted_for(runs):
    for pol, res in runs.items():
        t = res.totals
        assert t["requests"] == t["completed"] + t["abandoned"] + t["dropped"] + t["in_system"], pol
        assert res.per_class.loc["batch", "arrived"] == 1500


def test_chiron_meets_the_deadline_and_scales_batch_instances(runs):
    res = runs["chiron"]
    log = res.meta["fleet_log"]
    assert log["gpus"].max() > 4  # batch instances were added for the backlog
    # batch instances drained once it was done, and the mixed instances lent to it (judged surplus for
    # the interactive load) with them: at most the initial 4 online at the end
    assert log["online"].iloc[-1] <= 4
    assert log["online"].iloc[-1] >= 1  # min_interactive
    assert res.per_class.loc["batch", "slo_attainment"] == 1.0
    assert res.per_class.loc["interactive", "slo_attainment"] > 0.95
    assert res.totals["preemptions"] > 0  # batch work evicted on mixed instances


def test_qlm_keeps_its_fixed_fleet(runs):
    res = runs["qlm"]
    assert res.gpu_hours == pytest.approx(4 * 450.0 / 3600.0)
    assert res.meta["fleet_log"]["gpus"].max() == 4 if "fleet_log" in res.meta else True


def test_utilisation_autoscaler_grows_to_the_maximum(runs):
    res = runs["utilisation-autoscaler"]
    assert res.meta["fleet_log"]["gpus"].max() == 10
    # it grows past Chiron's peak and its interactive requests wait behind batch work in its instance
    # queues (GPU-hours: 0.640 against Chiron's 0.681 with calibrated rates, 0.634 with the fluid ones)
    assert res.meta["fleet_log"]["gpus"].max() > runs["chiron"].meta["fleet_log"]["gpus"].max()
    pc, ch = res.per_class, runs["chiron"].per_class
    assert pc.loc["interactive", "slo_attainment"] < ch.loc["interactive", "slo_attainment"] - 0.1


@pytest.mark.integration
@pytest.mark.skipif(not core.compiled_status()[0], reason="compiled core not built")
@pytest.mark.parametrize("pol", ["chiron", "qlm", "utilisation-autoscaler"])
def test_both_engines_agree_with_a_changing_fleet(pol, tmp_path):
    sc, wl = workflow(backlog=200, deadline=90.0)
    res = {}
    for backend in ("compiled", "python"):
        r = simulate(sc, pol, horizon=70.0, seed=5, service="tokens", workload=wl, backend=backend, check=True,
                     records=tmp_path / f"{backend}.csv")
        s = r.summary()
        for k in ("wall_seconds", "requests_per_wall_second", "engine", "records"):
            s.pop(k, None)
        res[backend] = s
    assert res["compiled"] == res["python"]
    assert (tmp_path / "compiled.csv").read_bytes() == (tmp_path / "python.csv").read_bytes()


def test_fluid_plan_follows_the_lp_and_meets_the_deadline(runs):
    res = runs["fluid-plan"]
    assert res.per_class.loc["batch", "slo_attainment"] == 1.0
    assert res.meta["fleet_log"]["gpus"].max() > 4


def test_multiperiod_lp_closed_form_and_bounds():
    from fluidopt.core.errors import InfeasibleError
    from fluidopt.fluid.multiperiod import BacklogJob, plan_fleet

    sc, _ = workflow()
    # no base fleet to fill: the optimum is the interactive GPUs of every slot plus the backlog's
    # GPU-seconds on batch instances, N / mu_bat (batch instances serve it fastest)
    p = plan_fleet(sc, [BacklogJob("batch", 1500, 60.0, 420.0)], slot=60.0, end=480.0, utilisation=1.0)
    lam = 6.0
    assert p.gpu_hours == pytest.approx((8 * 60.0 * lam / p.mu_int + 1500 / p.mu_bat) / 3600.0, rel=1e-6)
    assert p.served_mixed.sum() + p.served_batch.sum() == pytest.approx(1500)
    assert p.served_batch[0] == 0 and p.served_batch[-1] == 0  # before arrival, after the deadline
    # a base fleet kept anyway lends its leftover capacity first
    q = plan_fleet(sc, [BacklogJob("batch", 1500, 60.0, 420.0)], slot=60.0, end=480.0, utilisation=1.0, min_gpus=4)
    spare = (4 - lam / q.mu_int) * q.mu_mix * 360.0
    extra = max(0.0, 1500 - spare) / q.mu_bat
    assert q.gpu_hours == pytest.approx((4 * 480.0 + extra) / 3600.0, rel=1e-6)
    with pytest.raises(InfeasibleError, match="no fleet of at most 10 GPUs"):
        plan_fleet(sc, [BacklogJob("batch", 10**6, 60.0, 420.0)], slot=60.0)
    with pytest.raises(ScenarioError, match="expected 0 <= at < deadline"):
        BacklogJob("batch", 10, 500.0, 420.0)


def test_cli_bad_fleet_input_exits_2(tmp_path, capsys):
    from fluidopt.cli import main

    text = (Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "chiron-workflow.toml").read_text()
    for bad, msg in (("initial = 15", "initial = 60"), ("ttft_slo = 2.0", "ttft_slo = 0"),
                     ("startup_delay = 60.0", "startup_delay = -1")):
        f = tmp_path / "bad.toml"
        f.write_text(text.replace(bad, msg))
        assert main(["simulate", str(f), "--policy", "chiron", "--horizon", "5", "--service", "tokens"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "Traceback" not in err[0]
    ok = tmp_path / "ok.toml"
    ok.write_text(text)
    assert main(["simulate", str(ok), "--policy", "chiron", "--horizon", "20", "--service", "tokens", "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["gpu_hours"] == pytest.approx(15 * 20 / 3600)


def test_interactive_step_on_hand_built_states():
    from fluidopt.control.orchestration import interactive_step

    mu, rho = 7.25, 0.8  # one instance: 7.25 interactive completions/s, run at 80%
    step = lambda rate, cap, short=False, peak=None, now=0.0, since=None, minimum=1: interactive_step(  # noqa: E731
        rate, rate if peak is None else peak, cap, mu, rho, short, now, since, 600.0, minimum)
    assert step(6.0, 2) == (0, None)  # 6 / 5.8 = 1.03 instances: two are enough
    assert step(12.0, 2) == (1, None)  # the load doubles: 2.07 instances, one more
    assert step(24.0, 2) == (3, None)  # quadruples: 4.14, three more at once
    assert step(1.0, 2, short=True) == (1, None)  # TTFT / ITL headroom gone: one more whatever the rate
    # a quiet period: the peak needs 1 of 4 instances; the first tick starts the clock, a drain comes
    # only after the cooldown, one instance at a time, and a burst resets the clock
    assert step(0.5, 4, now=100.0) == (0, 100.0)
    assert step(0.5, 4, now=650.0, since=100.0) == (0, 100.0)
    assert step(0.5, 4, now=700.0, since=100.0) == (-1, 100.0)
    assert step(0.5, 4, peak=12.0, now=700.0, since=100.0) == (0, None)  # the window's peak needs 3: keep 4
    assert step(30.0, 4, now=700.0, since=100.0) == (2, None)
    # never below the minimum, and one instance of hysteresis (a need of 1 keeps 2)
    assert step(0.0, 2, now=900.0, since=100.0, minimum=2) == (0, None)
    assert step(0.0, 1, now=900.0, since=100.0) == (0, None)
    assert step(0.5, 2, now=900.0, since=100.0) == (0, None)


def _interactive_only(initial=2, n_max=8):
    from fluidopt.workloads import PiecewiseRate

    sc = Scenario(gpu=GPU, gpus=n_max, name="interactive-only",
                  classes=(RequestClass("chat", prompt=300, decode=100, rate=6.0, ttft_slo=2.0, itl_slo=0.06),),
                  fleet=Fleet(initial=initial, startup_delay=20.0))
    # 6/s, doubling to 12/s at t = 200, quiet (no arrivals) from t = 500
    wl = SyntheticWorkload([ClassSpec(PiecewiseRate([0, 200, 500], [6.0, 12.0, 0.0]), Exponential(300),
                                      Exponential(100), name="chat")])
    return sc, wl


@pytest.mark.parametrize("minimum", [1, 2])
def test_chiron_scales_the_interactive_pool_with_the_load(minimum):
    sc, wl = _interactive_only()
    res = simulate(sc, "chiron", horizon=1000.0, seed=2, service="tokens", workload=wl, check=True,
                   controller_options={"cooldown": 60.0, "min_interactive": minimum})
    log = res.meta["fleet_log"]
    t = res.totals
    assert t["requests"] == t["completed"] + t["abandoned"] + t["dropped"] + t["in_system"]
    assert log["time"][log["gpus"] > 2].min() > 200.0  # nothing added before the load doubled
    assert log["gpus"].max() >= 3  # the doubled load added an interactive instance
    assert log["online"].min() >= minimum and log["gpus"].min() >= minimum  # never below the minimum
    assert log["gpus"].iloc[-1] == minimum  # the quiet period drained down to it
    assert log["time"][log["gpus"] < log["gpus"].max()].max() > 500.0 + 60.0  # only after the cooldown
    assert res.per_class.loc["chat", "slo_attainment"] > 0.99
    # without interactive scaling the pool keeps its two instances
    fixed = simulate(sc, "chiron", horizon=1000.0, seed=2, service="tokens", workload=wl,
                     controller_options={"interactive_scaling": False})
    assert fixed.gpu_hours == pytest.approx(2 * 1000.0 / 3600.0)
    with pytest.raises(ScenarioError, match="chiron: min_interactive: expected an integer >= 0"):
        make_controller("chiron", sc, min_interactive=-1)
    with pytest.raises(ScenarioError, match="chiron: interactive_utilisation: expected a fraction in"):
        make_controller("chiron", sc, interactive_utilisation=1.5)


@pytest.mark.parametrize("backend", ["python"] + (["compiled"] if core.compiled_status()[0] else []))
def test_the_fleet_actions_protocol_is_what_the_engine_offers(backend):
    from fluidopt.control.protocol import Context, FleetActions, FleetView
    from fluidopt.control.snapshot import ClusterSnapshot
    from fluidopt.sim.api import make_engine

    sc, wl = workflow()
    eng = make_engine(sc, "chiron", horizon=10.0, seed=1, service="tokens", workload=wl, backend=backend)
    assert isinstance(eng, Context) and isinstance(eng, FleetActions) and isinstance(eng, FleetView)
    snap = ClusterSnapshot(2, 4, ("a",))
    assert isinstance(snap, Context) and not isinstance(snap, FleetActions)  # a router's snapshot has no fleet
    # the documented errors: a batch limit of 0, draining an offline GPU, adding beyond the maximum
    from fluidopt.core.errors import ActionError

    eng.start()
    with pytest.raises(ActionError, match=r"batch limit: expected an integer in 1\.\.64"):
        eng.set_max_decodes(0, 0)
    with pytest.raises(ActionError, match="already offline"):
        eng.drain_gpu(9)
    for _ in range(6):
        eng.add_gpu()
    with pytest.raises(ActionError, match="all 10 GPUs .* are already in the fleet"):
        eng.add_gpu()


def test_interactive_spares_are_typed_at_setup_and_kept_from_the_batch_autoscaler():
    from fluidopt.sim.api import make_engine

    sc, wl = workflow()  # 10 GPUs, 4 online: 1 interactive, 3 mixed, 6 offline
    ctrl = make_controller("chiron", sc, interactive_spares=2)
    eng = make_engine(sc, ctrl, horizon=450.0, seed=3, service="tokens", workload=wl)
    eng.start()
    assert ctrl.batch_gpus == [4, 5, 6, 7] and [eng.gpu_pool(g) for g in (8, 9)] == [0, 0]
    assert make_controller("chiron", sc)._spares(6, 4) == 0  # default: the base covers twice the rate
    eng.advance()
    res = eng.finish()
    log = res.meta["fleet_log"]
    assert log["gpus"].max() <= 10 and res.per_class.loc["batch", "slo_attainment"] == 1.0


def test_controllers_plan_with_the_calibrated_rates():
    """issue 31: the controllers' planning rates are the roles' saturated throughputs (the LP's), or the
    fluid estimates with calibrated=False."""
    from fluidopt.fluid.multiperiod import role_rates

    sc, _ = workflow()
    r = role_rates(sc, [0], [1])
    for name in ("chiron", "qlm", "fluid-plan"):
        c = make_controller(name, sc)
        assert (c.mu_bat, c.mu_mix) == (r.mu_bat, r.mu_mix), name
        f = make_controller(name, sc, calibrated=False)
        assert f.mu_bat == batch_throughput(GPU, 63, 300, 400) and f.mu_mix == batch_throughput(GPU, c.b_int, 300, 400)
    c = make_controller("chiron", sc)
    assert c.mu_int_gpu == r.mu_int and c.n_int == math.ceil(6.0 / r.mu_int)
    assert r.mu_bat < 0.8 * batch_throughput(GPU, 63, 300, 400)  # the fluid estimate is optimistic


def test_chiron_mixed_instances_at_the_batch_limit_only_without_interactive_work():
    """issue 31 (the local autoscaler from the ITL of the requests served): a mixed instance holding
    batch work only runs the batch instances' limit; one holding an interactive request never has a
    limit above the ITL-safe one (its batch decodes beyond it were evicted to host memory); surplus
    mixed instances are lent to the backlog and drained with it."""
    sc, wl = workflow()
    c = Chiron(sc)
    seen = {"batch_limit": 0, "interactive": 0}
    tick = c.on_tick

    def check(ctx):
        tick(ctx)
        for g in c.mixed_gpus:
            if not ctx.gpu_online(g):
                continue
            if any(ctx.gpu_decodes_by_class(g)[i] for i in c.inter):
                seen["interactive"] += 1
                # (the local autoscaler's ITL-safe limit on the context held now, below the batch limit)
                k = ctx.gpu_decodes(g) + (ctx.gpu_prefill(g) >= 0)
                assert not c.bmode[g] and ctx.gpu_max_decodes(g) < c.b_bat
                if k >= 4:
                    assert ctx.gpu_max_decodes(g) == largest_batch(GPU, c.itl_int, ctx.gpu_kv_used(g) / k)
            elif c.bmode[g] and ctx.gpu_decodes(g) >= 4:
                seen["batch_limit"] += 1
                assert ctx.gpu_max_decodes(g) == c.b_bat

    c.on_tick = check
    res = simulate(sc, c, horizon=450.0, seed=3, service="tokens", workload=wl, check=False)
    assert seen["batch_limit"] > 0 and seen["interactive"] > 0 and c.mode_switches > 0
    assert res.per_class.loc["batch", "slo_attainment"] >= 0.99
    off = simulate(sc, "chiron", horizon=450.0, seed=3, service="tokens", workload=wl, check=False,
                   controller_options={"mixed_batch_limit": False})
    assert res.gpu_hours < off.gpu_hours  # the lent capacity serves the backlog at the larger batch


def test_chiron_statistical_bound_tightens_with_the_queue():
    """The waiting-time estimate's factor 1 + z cv / sqrt(N): geometric outputs of mean 400 have
    cv = sqrt(1 - 1/400); the default margin is the batch limit over the batch rate plus a tick."""
    sc, _ = workflow()
    c = Chiron(sc)
    assert c.cv_bat == pytest.approx(math.sqrt(1 - 1 / 400), rel=1e-6)
    assert c.margin == pytest.approx(c.rates.b_bat / c.mu_bat + 10.0)
    with pytest.raises(ScenarioError, match="chiron: estimator: expected 'statistical' or 'safety', got 'x'"):
        Chiron(sc, estimator="x")
    assert Chiron(sc, estimator="safety").margin == pytest.approx(20.0 + 120.0)


def test_qlm_groups_keeps_models_apart_and_swaps():
    """issue 31, item 5: QLM with two models on a shared fixed fleet. Every request runs on an instance
    holding its model, never during that instance's swap; the plan moves instances to the model whose
    backlog needs them (a swap each), and every request is accounted for."""
    from fluidopt.control.orchestration import QLMGroups

    classes = (RequestClass("chat-a", prompt=300, decode=100, rate=3.0, ttft_slo=2.0, itl_slo=0.06),
               RequestClass("batch-a", prompt=300, decode=400, rate=1e-6, deadline_at=600.0),
               RequestClass("batch-b", prompt=300, decode=400, rate=1e-6, deadline_at=600.0))
    sc = Scenario(gpu=GPU, gpus=6, classes=classes, name="qlm-two")
    base = SyntheticWorkload([ClassSpec(GammaRenewal(3.0, 2.0), Exponential(300), Exponential(100), name="chat-a")])
    wl = BacklogWorkload(base, [Backlog("batch-a", 100, 20.0, Exponential(300), Exponential(400)),
                                Backlog("batch-b", 5000, 20.0, Exponential(300), Exponential(400))],
                         class_names=sc.class_names)
    models = {"chat-a": "a", "batch-a": "a", "batch-b": "b"}
    c = QLMGroups(sc, models=models, swap_time=5.0)
    bad = []
    tick = c.on_tick

    def check(ctx):
        tick(ctx)
        for g in c.gpus:
            for r in ctx.gpu_requests(g):
                m = c.model_of[ctx.req_class(r)]
                if m != c.loaded[g]:
                    bad.append((ctx.now, g, r))

    c.on_tick = check
    res = simulate(sc, c, horizon=700.0, seed=2, service="tokens", workload=wl, check=False)
    assert not bad
    assert c.swaps >= 1 and c.k_of["b"] > 3  # instances moved to the larger backlog
    t = res.totals
    assert t["requests"] == t["completed"] + t["in_system"]
    assert res.per_class.loc["batch-b", "slo_attainment"] >= 0.9  # (0.945: a tight backlog)
    with pytest.raises(ScenarioError, match="qlm-groups: models: 'x' is not a class"):
        QLMGroups(sc, models={"x": "a"})
    with pytest.raises(ScenarioError, match="qlm-groups: swap_time: expected a number >= 0"):
        QLMGroups(sc, swap_time=-1.0)


def test_chiron_warm_pool_and_startup_distribution():
    """issue 31, item 6: a warm pool's instances start in warm_startup seconds (a used slot is ready
    again one cold start-up later); otherwise start-up times are Gamma with the fleet's delay as mean
    and CV startup_cv, drawn from the controller's seeded stream (the same seed, the same run); the
    fleet log shows the first added GPU online its warm start-up later."""
    sc, wl = workflow()
    c = Chiron(sc, warm_pool=2, warm_startup=3.0)
    res = simulate(sc, c, horizon=450.0, seed=3, service="tokens", workload=wl, check=False)
    assert len(c.startups) > 2 and c.startups[:2] == [3.0, 3.0]
    assert all(d in (3.0, 20.0) for d in c.startups)
    log = res.meta["fleet_log"]
    first = log[log["gpus"] > log["gpus"].iloc[0]].iloc[0]  # the first add (counted at once)
    up = log[(log["online"] > log["online"].iloc[0])].iloc[0]  # the first GPU online beyond the base
    assert up["time"] == pytest.approx(first["time"] + 3.0)
    runs = []
    for _ in range(2):
        d = Chiron(sc, startup_cv=0.5)
        res = simulate(sc, d, horizon=450.0, seed=3, service="tokens", workload=wl, check=False)
        runs.append((d.startups, res.gpu_hours))
    assert runs[0] == runs[1] and len(set(runs[0][0])) > 2  # drawn, and reproducible
    assert 5.0 < sum(runs[0][0]) / len(runs[0][0]) < 40.0  # mean 20 s, CV 0.5
    with pytest.raises(ScenarioError, match="chiron: warm_pool: expected an integer >= 0"):
        Chiron(sc, warm_pool=-1)
