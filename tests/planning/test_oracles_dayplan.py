"""Oracles for `fluidopt plan --day` (fluidopt.planning.day): when batch work may run and when it is due,
and the GPU-hours that follow, by hand; property tests on the GPU-hours bound.

From docs/planning.md section 2: a backlog CLASS=N@AT is due by the class's ``deadline_at`` or by
AT + its ``deadline`` (a relative deadline counts from the backlog's arrival AT), rounded outwards to
whole slots (available from the start of the slot AT is in, due at the end of the slot holding the
deadline); a batch class's ongoing arrivals form groups of whole slots, each available from its first
slot and due its ``deadline`` after its *last* slot (rounded up to a slot boundary); deadlines after the
day's end move to the end. GPU-hours: sum over slots of the fleet times the slot length; the second
stage levels the batch work to the smallest peak fleet.

Throughputs of the instance below (hand arithmetic in tests/fluid/test_oracles_multiperiod.py):
mu_int = 0.07 / 0.0212, mu_mix = 0.035 / 0.03905, mu_bat = 0.075 / 0.07225 requests/s per GPU.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluidopt.core.errors import InfeasibleError, UsageError
from fluidopt.core.model import GPUProfile, RequestClass, Scenario
from fluidopt.fluid.multiperiod import BacklogJob
from fluidopt.planning.fleet import plan_day as _plan_day

# These oracles derive the plan by hand from the documented fluid throughputs (docs/planning.md); the
# calibrated ones (the default since the saturation model) have their own test (tests/fluid/test_saturation.py).
plan_day = functools.partial(_plan_day, calibrated=False)

GPU = GPUProfile(alpha=0.02, beta=0.0, tau_solo=0.01, chunk=100, batch=16, kv_time_per_token=1e-5,
                 price_per_hour=1.5)
MU_INT, MU_MIX, MU_BAT = 0.07 / 0.0212, 0.035 / 0.03905, 0.075 / 0.07225
H = 3600.0


def day_scenario(*, deadline: float | None = 7200.0, deadline_at: float | None = None, rate: float = 1e-6,
                 gpus: int = 50) -> Scenario:
    cl = (RequestClass("interactive", prompt=100, decode=100, rate=2.0, itl_slo=0.05),
          RequestClass("batch", prompt=300, decode=200, rate=rate, deadline=deadline, deadline_at=deadline_at))
    return Scenario(gpu=GPU, gpus=gpus, classes=cl, name="day-hand")


def test_a_relative_deadline_counts_from_the_backlogs_arrival():
    """Backlog of N at 9,000 s (2.5 h, inside slot 2) with a 2 h relative deadline: due at 16,200 s,
    rounded out to the end of slot 4 (18,000 s); available from slot 2's start (7,200 s). Its work,
    N / mu_bat GPU-seconds, is levelled over slots 2, 3, 4; the interactive 2/s needs 2 / mu_int GPUs
    in every one of the 6 slots."""
    N = 3 * H * MU_BAT * 2.0  # exactly 2 batch GPUs over three hourly slots
    day = plan_day(day_scenario(), [2.0] * 6, slot=H, backlogs=[("batch", N, 9000.0)])
    assert day.backlogs == (BacklogJob("batch", N, 2 * H, 5 * H),)
    inter = 2.0 / MU_INT
    assert day.interactive_gpus == pytest.approx([inter] * 6, rel=1e-12)
    assert day.batch == pytest.approx([0, 0, 2, 2, 2, 0], abs=1e-6)
    assert day.gpus == pytest.approx([inter, inter, inter + 2, inter + 2, inter + 2, inter], rel=1e-6)
    assert day.gpu_hours == pytest.approx(6 * inter + 6.0, rel=1e-7)
    assert day.gpus_int.tolist() == [1, 1, 3, 3, 3, 1]
    assert day.gpu_hours_int == pytest.approx(12.0) and day.peak_gpus == 3
    assert day.cost == pytest.approx(1.5 * (6 * inter + 6.0), rel=1e-7) and day.cost_int == pytest.approx(18.0)
    assert day.binding == ("interactive", "interactive", "deadline:batch", "deadline:batch", "deadline:batch",
                           "interactive")
    d = day.to_dict()
    assert d["backlogs"] == [{"class": "batch", "requests": N, "at": 2 * H, "deadline": 5 * H}]
    assert d["lower_bound"] is True and d["peak_gpus"] == 3


def test_a_relative_deadline_on_a_slot_boundary_and_past_the_day():
    # at 3,600 s + 1 h: due 7,200 s exactly (slot 1 only): all N in one slot
    N = H * MU_BAT * 1.5
    day = plan_day(day_scenario(deadline=3600.0), [0.0] * 4, slot=H, backlogs=[("batch", N, 3600.0)])
    assert day.backlogs == (BacklogJob("batch", N, H, 2 * H),)
    assert day.batch == pytest.approx([0, 1.5, 0, 0], abs=1e-6)
    assert day.binding == ("idle", "deadline:batch", "idle", "idle")
    # at 2 h + 3 h > the 4-hour day: the deadline is kept (5 h) and the plan runs one slot past the day
    # (a note says so): 1.5 GPU-hours levelled over slots 2, 3 and 4
    day = plan_day(day_scenario(deadline=3 * H), [0.0] * 4, slot=H, backlogs=[("batch", N, 2 * H)])
    assert day.backlogs == (BacklogJob("batch", N, 2 * H, 5 * H),)
    assert day.batch == pytest.approx([0, 0, 0.5, 0.5, 0.5], abs=1e-6)
    assert any("after the day's end" in n for n in day.notes)


def test_an_absolute_deadline_does_not_move_with_the_arrival():
    """deadline_at = 4 h: a backlog at 1 h or at 2.5 h is due at 4 h either way."""
    N = H * MU_BAT * 3.0
    for at, first in ((H, 1), (2.5 * H, 2)):
        day = plan_day(day_scenario(deadline=None, deadline_at=4 * H), [0.0] * 6, slot=H,
                       backlogs=[("batch", N, at)])
        assert day.backlogs == (BacklogJob("batch", N, first * H, 4 * H),)
        per = 3.0 / (4 - first)
        want = [per if first <= k < 4 else 0.0 for k in range(6)]
        assert day.batch == pytest.approx(want, abs=1e-6)


def test_ongoing_batch_arrivals_are_due_their_deadline_after_their_last_slot():
    """A batch class at 0.5/s with a 1.5 h relative deadline, hourly groups over a 6 h day: the group
    of slot k (1,800 requests) is available from k h and due at ceil(k + 1 + 1.5) = k + 3 h (kept past the
    6-hour day: the plan runs to 8 h)."""
    day = plan_day(day_scenario(deadline=1.5 * H, rate=0.5), [0.0] * 6, slot=H)
    want = tuple(BacklogJob("batch", 1800.0, k * H, (k + 3) * H) for k in range(6))
    assert day.backlogs == want
    # all of it on batch instances: 6 x 1800 / mu_bat GPU-seconds whatever the schedule
    assert day.gpu_hours == pytest.approx(6 * 1800 / MU_BAT / H, rel=1e-7)
    # levelled: by t hours (3 <= t <= 8) at least t - 2 groups are due, so the smallest constant rate is
    # max (t - 2) / t = 6 / 8 of a group per hour: 0.75 x 1800 / 3600 / mu_bat GPUs
    assert max(day.batch) == pytest.approx(0.75 * 0.5 / MU_BAT, rel=1e-6)


def test_ongoing_arrivals_after_an_absolute_deadline_are_left_out():
    """deadline_at = 3 h + 100 s: groups of slots 0-3 are due at 4 h (the slot holding the deadline);
    those of slots 4 and 5 start after it and can never meet it: 2 x 1,800 requests left out (a note)."""
    day = plan_day(day_scenario(deadline=None, deadline_at=3 * H + 100, rate=0.5), [0.0] * 6, slot=H)
    assert day.backlogs == tuple(BacklogJob("batch", 1800.0, k * H, 4 * H) for k in range(4))
    assert any("3600 requests arrive at or after its deadline_at" in n for n in day.notes)
    assert day.gpu_hours == pytest.approx(4 * 1800 / MU_BAT / H, rel=1e-7)


def test_a_deadline_that_needs_more_than_the_maximum_is_infeasible_and_one_more_gpu_fixes_it():
    N = 2 * H * MU_BAT * 3.0  # 3 batch GPUs over 2 slots (at 1 h, due 1 h + 2 h = 3 h)
    with pytest.raises(InfeasibleError, match="raise --max-gpus"):
        plan_day(day_scenario(), [0.0] * 4, slot=H, backlogs=[("batch", N, H)], max_gpus=2)
    day = plan_day(day_scenario(), [0.0] * 4, slot=H, backlogs=[("batch", N, H)], max_gpus=3)
    assert day.binding == ("idle", "max_gpus", "max_gpus", "idle")
    with pytest.raises(UsageError, match="not a class of the scenario"):
        plan_day(day_scenario(), [0.0] * 4, slot=H, backlogs=[("nope", N, H)])


def test_a_kept_base_fleet_lends_its_leftover_before_batch_instances_are_added():
    """min_gpus = 2 with no interactive load: 2 spare base GPUs serve batch work at mu_mix each for free;
    a backlog that fits in that leftover adds no GPU-hours; the rest goes on batch instances."""
    fits = 2 * H * MU_MIX * 0.5  # half of one slot's leftover
    day = plan_day(day_scenario(), [0.0] * 3, slot=H, backlogs=[("batch", fits, 0.0)], min_gpus=2.0)
    assert day.gpu_hours == pytest.approx(3 * 2.0, rel=1e-7) and day.binding == ("min_gpus",) * 3
    # due 2 h after 0: the leftover of slots 0 and 1 (2 GPUs x 1 h x mu_mix each) and 1000 requests more
    more = 2 * 2 * H * MU_MIX + 1000.0
    day = plan_day(day_scenario(), [0.0] * 3, slot=H, backlogs=[("batch", more, 0.0)], min_gpus=2.0)
    assert day.gpu_hours == pytest.approx(3 * 2.0 + 1000.0 / MU_BAT / H, rel=1e-7)
    assert day.batch[2] == pytest.approx(0.0, abs=1e-9)  # nothing runs after the deadline


@settings(max_examples=12, deadline=None, derandomize=True)
@given(rates=st.lists(st.floats(0.0, 20.0), min_size=3, max_size=5), n=st.floats(0.0, 60000.0),
       at=st.integers(0, 2), dl=st.floats(0.5, 4.0), extra=st.floats(0.0, 3.0), base=st.floats(0.0, 4.0),
       nmax=st.integers(4, 12), more=st.integers(0, 5))
def test_gpu_hours_never_rise_with_a_later_deadline_or_more_gpus(rates, n, at, dl, extra, base, nmax, more):
    """The day's GPU-hours bound is monotone: a later deadline (more freedom) and a larger maximum fleet
    never raise it; an infeasible day stays infeasible with fewer GPUs or an earlier deadline."""
    def hours(deadline, cap):
        try:
            return plan_day(day_scenario(deadline=deadline * H, gpus=cap), rates, slot=H,
                            backlogs=[("batch", n, at * H)], min_gpus=base).gpu_hours
        except InfeasibleError:
            return float("inf")

    h0 = hours(dl, nmax)
    h_late = hours(dl + extra, nmax)
    h_big = hours(dl, nmax + more)
    assert h_late <= h0 * (1 + 1e-7) + 1e-9
    assert h_big <= h0 * (1 + 1e-7) + 1e-9


def test_the_reported_summary_and_rows():
    N = 3 * H * MU_BAT * 2.0
    day = plan_day(day_scenario(), [2.0] * 6, slot=H, backlogs=[("batch", N, 9000.0)])
    d = day.to_dict()
    assert d["slot_seconds"] == H and d["slots"] == 6 and d["hours"] == pytest.approx(6.0)
    tp = dict(d["throughput_per_gpu"])
    assert tp.pop("model") == "fluid"  # (these oracles use the documented fluid throughputs)
    assert tp == pytest.approx({"interactive": MU_INT, "batch_on_base": MU_MIX, "batch_instance": MU_BAT}, rel=1e-12)
    assert d["gpu_hours"] == pytest.approx(day.gpu_hours) and d["cost_int"] == pytest.approx(18.0)
    f = day.to_frame()
    assert list(f.columns) == ["t_start", "rate", "gpus", "gpus_int", "base_gpus", "batch_gpus", "interactive_gpus",
                               "served_batch_requests", "binding"]
    assert f["base_gpus"].to_numpy() == pytest.approx([2.0 / MU_INT] * 6, rel=1e-6)
    assert f["served_batch_requests"].sum() == pytest.approx(N, rel=1e-7)
    assert d["per_slot"][2]["binding"] == "deadline:batch" and d["per_slot"][0]["t_start"] == 0.0


def test_plan_day_names_a_bad_scenario():
    from fluidopt.core.errors import ScenarioError

    with pytest.raises(ScenarioError, match="plan_day: scenario: expected a Scenario, got str"):
        plan_day("day.toml", [1.0])
