"""GPU-hours for a day (fluidopt.planning.day.plan_day, `fluidopt plan --day`): the multi-period LP against
hand computations from the GPU law's fluid throughputs, the binding constraint per slot, the CLI's
JSON and its one-line errors."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fluidopt.cli import main
from fluidopt.core.errors import InfeasibleError, ScenarioError, UsageError
from fluidopt.core.model import GPUProfile, RequestClass, Scenario
from fluidopt.fluid.multiperiod import BacklogJob, plan_fleet
from fluidopt.planning.day import parse_backlog, plan_day, rates_from_trace, read_rates_csv
from fluidopt.scenario import load_scenario

GPU = GPUProfile(alpha=0.0174, beta=6.2e-5, tau_solo=1 / 45.45, chunk=256, batch=64, kv_time_per_token=1.5e-6,
                 price_per_hour=2.5)
AZURE = Path(__file__).resolve().parents[3] / "shared/data/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv"


TOML = """
name = "day"
[gpu]
alpha = 0.0174
beta = 6.2e-5
gamma = 45.45
chunk = 256
batch = 64
kv_time_per_token = 1.5e-6
price_per_hour = 2.5
[cluster]
gpus = 40
[[classes]]
name = "chat"
prompt = 300
decode = 100
rate = 6.0
ttft_slo = 2.0
itl_slo = 0.06
[[classes]]
name = "batch"
prompt = 300
decode = 400
rate = 1e-6
deadline_at = 3000.0
"""


def scenario(n_max=40, batch_deadline=None, batch_deadline_at=3000.0, batch_rate=1e-6):
    classes = (RequestClass("chat", prompt=300, decode=100, rate=6.0, ttft_slo=2.0, itl_slo=0.06),
               RequestClass("batch", prompt=300, decode=400, rate=batch_rate, deadline=batch_deadline,
                            deadline_at=batch_deadline_at))
    return Scenario(gpu=GPU, gpus=n_max, classes=classes, name="day")


def test_constant_rate_is_slots_times_the_single_slot_lp():
    sc = scenario()
    one = plan_day(sc, [6.0], slot=600.0)
    day = plan_day(sc, [6.0] * 24, slot=600.0)
    mu = day.fleet_plan.mu_int
    # one slot: the interactive GPUs lambda / mu_int for slot seconds
    assert one.gpu_hours == pytest.approx(6.0 / mu * 600.0 / 3600.0, rel=1e-9)
    assert day.gpu_hours == pytest.approx(24 * one.gpu_hours, rel=1e-9)
    assert np.allclose(day.gpus, 6.0 / mu) and set(day.binding) == {"interactive"}
    assert (day.gpus_int == math.ceil(6.0 / mu)).all()
    assert day.gpu_hours_int == pytest.approx(24 * math.ceil(6.0 / mu) * 600.0 / 3600.0)
    assert day.cost == pytest.approx(2.5 * day.gpu_hours) and day.cost_int == pytest.approx(2.5 * day.gpu_hours_int)
    # headroom: utilisation rho divides the interactive GPUs
    assert plan_day(sc, [6.0] * 24, slot=600.0, utilisation=0.5).gpu_hours == pytest.approx(2 * day.gpu_hours)


def test_backlog_due_by_a_deadline_by_hand():
    sc = scenario()
    rates = [6.0, 3.0, 9.0, 6.0, 0.0, 6.0]  # six 10-minute slots
    d = plan_day(sc, rates, slot=600.0, backlogs=[("batch", 20000, 600.0)])  # due by deadline_at = 3000
    fp = d.fleet_plan
    inter = sum(rates) * 600.0 / fp.mu_int  # GPU-seconds of interactive work
    # no base fleet is kept, so base GPUs have no leftover: the backlog runs on batch instances at mu_bat
    assert d.gpu_hours == pytest.approx((inter + 20000 / fp.mu_bat) / 3600.0, rel=1e-7)
    assert (fp.served_mixed + fp.served_batch).sum() == pytest.approx(20000)
    served = fp.served_mixed + fp.served_batch
    assert served[0] == 0 and served[5] == 0  # before its arrival, after its deadline (3000 s)
    # leveled: the smallest peak that still uses the fewest GPU-hours fills slots 1..4 to one level P
    # (water-filling: their interactive GPU-seconds plus the backlog's, over 4 slots)
    P = (sum(rates[1:5]) * 600.0 / fp.mu_int + 20000 / fp.mu_bat) / (4 * 600.0)
    assert np.allclose(d.gpus[1:5], P, rtol=1e-6) and d.peak_gpus == math.ceil(P)
    assert d.binding == ("interactive", "deadline:batch", "deadline:batch", "deadline:batch", "deadline:batch",
                         "interactive")
    # the same LP as plan_fleet's (leveling changes when, never how much)
    ref = plan_fleet(sc, [BacklogJob("batch", 20000, 600.0, 3000.0)], end=3600.0, slot=600.0, utilisation=1.0,
                     interactive_rate=rates)
    assert d.gpu_hours == pytest.approx(ref.gpu_hours, rel=1e-9)
    # a backlog arriving inside a slot is available from that slot's start (whole slots, rounded outwards)
    mid = plan_day(sc, rates, slot=600.0, backlogs=[("batch", 20000, 900.0)])
    assert mid.backlogs[0].at == 600.0 and mid.gpu_hours == pytest.approx(d.gpu_hours, rel=1e-9)
    # a kept base fleet lends its leftover first (at mu_mix), so the backlog costs less extra
    k = plan_day(sc, rates, slot=600.0, backlogs=[("batch", 20000, 600.0)], min_gpus=4)
    spare = sum(4 - r / fp.mu_int for r in rates[1:5]) * 600.0 * fp.mu_mix
    extra = max(0.0, 20000 - spare) / fp.mu_bat
    assert k.gpu_hours == pytest.approx((6 * 4 * 600.0 + extra) / 3600.0, rel=1e-7)
    assert k.binding[0] == "min_gpus" and k.binding[1] == "deadline:batch"


def test_tight_deadline_hits_the_maximum_and_infeasible_is_one_line():
    sc = scenario(n_max=12)
    fp0 = plan_day(sc, [6.0] * 3, slot=600.0).fleet_plan
    # the most one 10-minute slot can serve on batch instances with 12 GPUs
    cap = (12 - 6.0 / fp0.mu_int) * 600.0 * fp0.mu_bat
    d = plan_day(sc, [6.0] * 3, slot=600.0, backlogs=[BacklogJob("batch", 0.999 * cap, 600.0, 1200.0)])
    assert d.binding[1] == "deadline:batch" and d.gpus[1] == pytest.approx(12 - 0.001 * (12 - 6.0 / fp0.mu_int))
    d = plan_day(sc, [6.0] * 3, slot=600.0, backlogs=[BacklogJob("batch", cap, 600.0, 1200.0)])
    assert d.binding[1] == "max_gpus" and d.peak_gpus == 12
    with pytest.raises(InfeasibleError, match=r"^plan --day: .*no fleet of at most 12 GPUs.*raise --max-gpus"):
        plan_day(sc, [6.0] * 3, slot=600.0, backlogs=[BacklogJob("batch", 1.01 * cap, 600.0, 1200.0)])


def test_ongoing_batch_class_with_a_relative_deadline():
    # 2 batch requests/s all day, each due 30 minutes after arrival: N = 2 x day on batch instances
    sc = scenario(batch_deadline=1800.0, batch_deadline_at=None, batch_rate=2.0)
    d = plan_day(sc, [6.0] * 12, slot=600.0)
    fp = d.fleet_plan
    assert sum(j.n for j in d.backlogs) == pytest.approx(2.0 * 7200.0)
    assert d.gpu_hours == pytest.approx((12 * 600.0 * 6.0 / fp.mu_int + 2.0 * 7200.0 / fp.mu_bat) / 3600.0, rel=1e-7)
    # every group is available from its first slot and due 1800 s after its end, after the day's end too
    for j in d.backlogs:
        assert j.deadline == j.at + 600.0 + 1800.0
    assert d.slots == 12 + 3 and d.rates[12:].tolist() == [0.0] * 3  # the plan runs on to the last deadline
    assert any("the plan runs 3 slots of 600 s longer, to 9000 s" in n for n in d.notes)


def test_trace_rates_are_the_binned_arrivals(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("time,prompt_tokens,output_tokens\n0,100,10\n1,300,30\n59,200,20\n61,100,10\n130,100,10\n")
    lam, P, D = rates_from_trace(f, 60.0)
    assert lam.tolist() == [3 / 60, 1 / 60, 1 / 60] and P == 160.0 and D == 16.0
    d = plan_day(scenario(), trace=f, slot=60.0)
    assert d.rates.tolist() == lam.tolist() and d.slots == 3
    assert any("mean prompt 160.0" in n for n in d.notes)


@pytest.mark.skipif(not AZURE.exists(), reason="Azure trace not present")
def test_azure_trace_day():
    lam, P, D = rates_from_trace(AZURE, 60.0)
    assert round(lam.sum() * 60.0) == 19366
    d = plan_day(scenario(n_max=60), trace=AZURE, slot=60.0, backlogs=[("batch", 20000, 300.0)])
    fp = d.fleet_plan
    assert d.slots == len(lam) and d.gpu_hours == pytest.approx(
        (lam.sum() * 60.0 / fp.mu_int + 20000 / fp.mu_bat) / 3600.0, rel=1e-6)


def test_bad_input_is_one_clear_error(tmp_path):
    sc = scenario()
    with pytest.raises(UsageError, match="--rates: expected one interactive rate per slot, got none"):
        plan_day(sc, [])
    with pytest.raises(UsageError, match=r"--rates: slot 1: rate = -1.0: expected requests/s >= 0"):
        plan_day(sc, [1.0, -1.0])
    for slot in (0, -5.0, math.inf):
        with pytest.raises(UsageError, match="--slot: expected seconds > 0"):
            plan_day(sc, [1.0], slot=slot)
    with pytest.raises(UsageError, match="exactly one of --rates FILE and --trace FILE"):
        plan_day(sc)
    only_batch = Scenario(gpu=GPU, gpus=4, classes=(sc.classes[1],), name="batch-only")
    with pytest.raises(ScenarioError, match="has no interactive class"):
        plan_day(only_batch, [1.0])
    with pytest.raises(UsageError, match="--backlog: class 'x' is not a class"):
        plan_day(sc, [1.0], backlogs=[("x", 10, 0.0)])
    with pytest.raises(UsageError, match="--backlog: class 'chat' has no deadline"):
        plan_day(sc, [1.0], backlogs=[("chat", 10, 0.0)])
    with pytest.raises(UsageError, match="--backlog: expected CLASS=N@AT"):
        parse_backlog("batch=-3@0")
    assert parse_backlog(" batch = 1e5 @ 300 ") == ("batch", 1e5, 300.0)
    for text, msg in (("", "got an empty file"), ("rate\n", "a header and no rows"),
                      ("rate\n1\nabc\n", "line 3: rate = 'abc'"), ("a,b\n1,2\n", "line 1: expected a header")):
        f = tmp_path / "r.csv"
        f.write_text(text)
        with pytest.raises(UsageError, match=msg):
            read_rates_csv(f)
    f.write_text("2.5\n\n3\n")  # headerless single column, blank lines skipped
    assert read_rates_csv(f).tolist() == [2.5, 3.0]


def test_cli_day_json_and_errors(tmp_path, capsys):
    path = tmp_path / "day.toml"
    path.write_text(TOML)
    sc = load_scenario(path)
    rates = tmp_path / "rates.csv"
    rates.write_text("slot,rate\n0,6\n1,3\n2,9\n3,6\n4,0\n5,6\n")
    argv = ["plan", str(path), "--day", "--rates", str(rates), "--slot", "600", "--backlog", "batch=20000@600"]
    assert main(argv + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ref = plan_day(sc, [6, 3, 9, 6, 0, 6], slot=600.0, backlogs=[("batch", 20000, 600.0)])
    assert out["gpu_hours"] == pytest.approx(ref.gpu_hours) and out["lower_bound"] is True
    assert out["cost"] == pytest.approx(2.5 * ref.gpu_hours)
    assert [r["binding"] for r in out["per_slot"]] == list(ref.binding)
    assert [r["gpus_int"] for r in out["per_slot"]] == ref.gpus_int.tolist()
    assert main(argv) == 0
    assert "GPU-hours: " in capsys.readouterr().out
    bad = tmp_path / "neg.csv"
    bad.write_text("rate\n1\n-2\n")
    for extra in (["--rates", str(bad)], ["--rates", str(rates), "--slot", "0"], [],
                  ["--rates", str(rates), "--trace", str(rates)], ["--rates", str(rates), "--backlog", "nope"]):
        assert main(["plan", str(path), "--day", *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "Traceback" not in err[0], err
    assert main(["plan", str(path), "--rates", str(rates)]) == 2
    assert "--rates: only with --day" in capsys.readouterr().err


def test_deadline_after_the_days_end_is_kept():
    """issue 31: an hour of chat at 30/s and 145,000 batch requests due at minute 65 (after the one-hour
    day) on at most 20 GPUs. Before, the deadline was moved to the day's end and the plan was
    infeasible; kept, the plan runs to 3,900 s. With the fluid throughputs (the issue's numbers) it is
    feasible at 19.92 GPU-hours = the interactive GPU-hours plus N / mu_bat; with the calibrated ones
    (a batch instance serves 1.96, not 2.55, requests/s) 145,000 is beyond 20 GPUs: the most they
    finish is about 122,000 (20 GPUs for 65 minutes less the interactive GPU-seconds, at mu_bat)."""
    sc = load_scenario(Path(__file__).resolve().parents[2] / "examples/scenarios/chiron-workflow.toml")
    rates = [30.0] * 60
    d = plan_day(sc, rates, slot=60.0, backlogs=[("batch", 145_000, 0.0)], max_gpus=20, calibrated=False)
    fp = d.fleet_plan
    assert d.slots == 65 and d.times[-1] == 3840.0 and d.rates[60:].tolist() == [0.0] * 5
    assert d.backlogs[0].deadline == 3900.0
    assert d.gpu_hours == pytest.approx((30.0 * 3600.0 / fp.mu_int + 145_000 / fp.mu_bat) / 3600.0, rel=1e-7)
    assert d.gpu_hours == pytest.approx(19.92, abs=0.005)
    assert any("backlog batch due at 3900 s; the plan runs 5 slots of 60 s longer, to 3900 s" in n for n in d.notes)
    # calibrated: the batch capacity of 20 GPUs by minute 65 next to the interactive GPUs of the hour
    cal = plan_day(sc, rates, slot=60.0, max_gpus=20)
    cap = (20 * 3900.0 - 3600.0 * 30.0 / cal.fleet_plan.mu_int) * cal.fleet_plan.mu_bat
    assert 120_000 < cap < 125_000
    with pytest.raises(InfeasibleError, match="no fleet of at most 20 GPUs"):
        plan_day(sc, rates, slot=60.0, backlogs=[("batch", 145_000, 0.0)], max_gpus=20)
    d = plan_day(sc, rates, slot=60.0, backlogs=[("batch", 0.999 * cap, 0.0)], max_gpus=20)
    assert d.gpu_hours == pytest.approx(20 * 3900.0 / 3600.0 - 0.001 * cap / d.fleet_plan.mu_bat / 3600.0, rel=1e-6)


def test_145k_at_the_calibrated_law_needs_24_gpus_or_75_minutes():
    """issue 31's 145,000 requests by minute 65 under the calibrated law: no batch size makes 20 GPUs fit
    (the saturated rate rises with the batch limit up to B - 1 = 127: 1.443, 1.728, 1.878, 1.960
    requests/s at 35, 64, 96, 127; B = 128 itself, with no slot kept for a prefill, gives 1.962, +0.1%),
    and a batch instance beats a mixed one (1.96 vs 1.44 at the ITL-safe 35). The plan is feasible
    from 24 GPUs, or on 20 GPUs with the deadline at 4,500 s (75 minutes); either way it costs the
    interactive GPU-hours plus N / mu_bat = 24.92 GPU-hours, not about 20."""
    from fluidopt.fluid.saturation import class_laws, saturated_throughput

    sc = load_scenario(Path(__file__).resolve().parents[2] / "examples/scenarios/chiron-workflow.toml")
    laws = class_laws(sc.classes[1])
    mus = [saturated_throughput(sc.gpu, b, [laws[0]], [laws[1]]).rate for b in (35, 64, 96, 127, 128)]
    assert mus == sorted(mus) and mus[3] == pytest.approx(1.960, abs=5e-4) and mus[4] / mus[3] < 1.002
    rates = [30.0] * 60
    for n in (20, 23):
        with pytest.raises(InfeasibleError):
            plan_day(sc, rates, slot=60.0, backlogs=[("batch", 145_000, 0.0)], max_gpus=n)
    d = plan_day(sc, rates, slot=60.0, backlogs=[("batch", 145_000, 0.0)], max_gpus=24)
    fp = d.fleet_plan
    assert d.gpu_hours == pytest.approx((30.0 * 3600.0 / fp.mu_int + 145_000 / fp.mu_bat) / 3600.0, rel=1e-7)
    assert d.gpu_hours == pytest.approx(24.92, abs=0.005)
    late = replace(sc, classes=(sc.classes[0], replace(sc.classes[1], deadline_at=4500.0)))
    assert plan_day(late, rates, slot=60.0, backlogs=[("batch", 145_000, 0.0)], max_gpus=20).gpu_hours == \
        pytest.approx(d.gpu_hours, rel=1e-7)
    early = replace(sc, classes=(sc.classes[0], replace(sc.classes[1], deadline_at=4440.0)))
    with pytest.raises(InfeasibleError):
        plan_day(early, rates, slot=60.0, backlogs=[("batch", 145_000, 0.0)], max_gpus=20)


def test_cli_day_keeps_a_late_deadline(tmp_path, capsys):
    f = tmp_path / "r.csv"
    f.write_text("rate\n" + "30\n" * 60)
    toml = Path(__file__).resolve().parents[2] / "examples/scenarios/chiron-workflow.toml"
    assert main(["plan", str(toml), "--day", "--rates", str(f), "--slot", "60", "--backlog", "batch=145000@0",
                 "--max-gpus", "20", "--fluid-throughputs", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpu_hours"] == pytest.approx(19.92, abs=0.005) and out["slots"] == 65
    assert out["throughput_per_gpu"]["model"] == "fluid"
    assert main(["plan", str(toml), "--day", "--rates", str(f), "--slot", "60", "--backlog", "batch=145000@0",
                 "--max-gpus", "20"]) == 2
    assert "no fleet of at most 20 GPUs" in capsys.readouterr().err


def test_day_from_the_workflow_file(tmp_path, capsys):
    """plan --day without --rates / --backlog reads the scenario's workflow: the constant Gamma rate over
    its horizon and its backlog give the calibrated bound of docs/orchestration.md (19.27 GPU-hours)."""
    toml = Path(__file__).resolve().parents[2] / "examples/scenarios/chiron-workflow.toml"
    sc = load_scenario(toml)
    d = plan_day(sc, slot=60.0)
    assert d.slots == 70 and d.rates.tolist() == [30.0] * 70
    assert [(j.cls, j.n, j.at, j.deadline) for j in d.backlogs] == [("batch", 100_000.0, 300.0, 3900.0)]
    fp = plan_fleet(sc, [BacklogJob("batch", 100_000, 300.0, 3900.0)], end=4200.0, slot=60.0, utilisation=1.0)
    assert d.gpu_hours == pytest.approx(fp.gpu_hours, rel=1e-6) and d.gpu_hours == pytest.approx(19.27, abs=0.005)
    # a per-slot rate file of its own slot length is averaged over the plan's slots
    (tmp_path / "r.csv").write_text("rate\n10\n20\n")
    text = toml.read_text().replace('process = "gamma"\nrate = 30.0               # requests/s\ncv = 4.0',
                                    'process = "rates"\nfile = "r.csv"\nslot = 90.0')
    (tmp_path / "wf.toml").write_text(text.replace("horizon = 4200.0", "horizon = 360.0"))
    d = plan_day(load_scenario(tmp_path / "wf.toml"), slot=60.0, class_arrivals=False)
    # rates 10 on [0, 90), 20 on [90, 180), none after: slot means 10, 15, 20, 0, 0, 0
    assert d.rates[:6].tolist() == pytest.approx([10.0, 15.0, 20.0, 0.0, 0.0, 0.0])
    assert main(["plan", str(toml), "--day", "--slot", "60", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpu_hours"] == pytest.approx(19.27, abs=0.005)
