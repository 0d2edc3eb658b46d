"""GPU-hours for a day: the fleet per time slot from the multi-period fluid LP (docs/planning.md section 2).

The day is cut into slots of ``slot`` seconds; the interactive classes (those without a deadline)
arrive at a given rate per slot (a list, a CSV of per-slot rates, or a trace's arrivals binned per
slot) and the batch work (explicit backlogs, and the scenario's batch classes arriving at their
``rate``) must be done by its deadline. :func:`fluidopt.fluid.multiperiod.plan_fleet` gives the
fewest GPU-hours under the GPU law's fluid throughputs; at ``utilisation`` = 1 (the default) that
optimum is a lower bound on any controller's GPU-hours for the day.

Batch classes of the scenario: a class with ``deadline`` (s after arrival) or ``deadline_at``
(absolute s) contributes its ``rate`` x (the day) requests, in groups of whole slots (at most
:data:`MAX_GROUPS` groups): a group's requests are available from its first slot and due at the
end of its last slot plus ``deadline`` (rounded up to a slot boundary), or by ``deadline_at``; a
group that starts at or after ``deadline_at`` can never meet it and is left out (counted in
``notes``). Both are relaxations (work available earlier, due no earlier than the real requests),
so the optimum stays a lower bound. Explicit backlogs are rounded outwards to whole slots the same
way. Deadlines after the day's end are kept as they are: the plan runs on, in whole slots, to the
last deadline, with no interactive traffic after the day's end (a note says so).
"""

from __future__ import annotations

import csv
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

import fluidopt.core.interrupt as interrupt
from fluidopt.core.errors import InfeasibleError, ScenarioError, UsageError
from fluidopt.core.model import Fleet, Scenario
from fluidopt.fluid.multiperiod import BacklogJob, FleetPlan, MixPlan, plan_fleet

__all__ = ["DayPlan", "MAX_GROUPS", "MixRun", "mix_roles", "parse_backlog", "plan_day", "rates_from_trace",
           "read_rates_csv", "simulate_mix", "workflow_rates"]

MAX_GROUPS = 48  # arrival groups per ongoing batch class (keeps the LP at O(48 x slots) columns)


@dataclass(frozen=True)
class DayPlan:
    """The day's fleet. Per slot k (starting at ``times[k]``, ``slot`` seconds long): the interactive
    rate ``rates[k]`` (requests/s), the LP's GPUs ``gpus[k]`` (fractional; ``base`` + ``batch``),
    ``gpus_int[k]`` = ceil(gpus[k]) and the constraint that sets the fleet there, ``binding[k]``:

    * ``max_gpus``: the fleet is at its maximum;
    * ``deadline:CLASS``: GPUs beyond the interactive need are there to finish that class's batch work
      in time (the slot serves it and the fleet is above max(min_gpus, interactive GPUs));
    * ``min_gpus``: the kept minimum fleet (above the interactive need), in the day's slots only (not in the
      slots a deadline after the day's end adds: a later deadline never raises the GPU-hours);
    * ``interactive``: exactly the GPUs the interactive load needs at the target utilisation;
    * ``idle``: no load and no minimum.

    ``gpu_hours`` is the LP optimum (a lower bound at utilisation 1); ``gpu_hours_int`` the same fleet
    rounded up to whole GPUs per slot; ``cost`` and ``cost_int`` are those times
    ``price_per_gpu_hour`` (None without a price).
    """

    slot: float
    times: np.ndarray
    rates: np.ndarray
    gpus: np.ndarray
    gpus_int: np.ndarray
    base: np.ndarray
    batch: np.ndarray
    interactive_gpus: np.ndarray
    binding: tuple[str, ...]
    gpu_hours: float
    gpu_hours_int: float
    price_per_gpu_hour: float | None
    cost: float | None
    cost_int: float | None
    utilisation: float
    backlogs: tuple[BacklogJob, ...]
    fleet_plan: FleetPlan
    notes: tuple[str, ...] = field(default=())

    @property
    def slots(self) -> int:
        return len(self.times)

    @property
    def peak_gpus(self) -> int:
        return int(self.gpus_int.max()) if self.slots else 0

    def to_frame(self) -> pd.DataFrame:
        """One row per slot: start (s), interactive rate (requests/s), GPUs (LP, whole), base and batch
        GPUs, the interactive GPUs, the batch requests served, the binding constraint."""
        fp = self.fleet_plan
        return pd.DataFrame({"t_start": self.times, "rate": self.rates, "gpus": self.gpus, "gpus_int": self.gpus_int,
                             "base_gpus": self.base, "batch_gpus": self.batch, "interactive_gpus": self.interactive_gpus,
                             "served_batch_requests": fp.served_mixed + fp.served_batch, "binding": list(self.binding)})

    def to_dict(self) -> dict:
        """JSON-ready summary and per-slot rows."""
        from fluidopt.harness.executor import finite_or_none

        rows = [{k: finite_or_none(v.item() if hasattr(v, "item") else v) for k, v in r.items()}
                for r in self.to_frame().to_dict(orient="records")]
        return {
            "slot_seconds": self.slot, "slots": self.slots, "hours": self.slots * self.slot / 3600.0,
            "gpu_hours": self.gpu_hours, "gpu_hours_int": self.gpu_hours_int, "peak_gpus": self.peak_gpus,
            "price_per_gpu_hour": self.price_per_gpu_hour, "cost": self.cost, "cost_int": self.cost_int,
            "utilisation": self.utilisation, "lower_bound": self.utilisation == 1.0,
            "throughput_per_gpu": {"interactive": self.fleet_plan.mu_int, "batch_on_base": self.fleet_plan.mu_mix,
                                   "batch_instance": self.fleet_plan.mu_bat,
                                   "model": "calibrated" if self.fleet_plan.calibrated else "fluid"},
            "backlogs": [{"class": j.cls, "requests": j.n, "at": j.at, "deadline": j.deadline} for j in self.backlogs],
            "notes": list(self.notes), "per_slot": rows,
        }


# --------------------------------------------------------------------------------------------
# Inputs: per-slot rates from a CSV or a trace; backlogs
# --------------------------------------------------------------------------------------------


def read_rates_csv(path: str | os.PathLike) -> np.ndarray:
    """Per-slot interactive rates (requests/s) from a CSV: a column named ``rate`` (other columns are
    ignored), or a single column of numbers without a header. One row per slot; blank lines skipped."""
    label = os.fspath(path)
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            rows = [(n, r) for n, r in enumerate(csv.reader(f), start=1) if any(c.strip() for c in r)]
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--rates: cannot read {label!r}: {e}") from None
    if not rows:
        raise UsageError(f"--rates {label}: expected one interactive rate per slot, got an empty file")
    head = [c.strip().lower() for c in rows[0][1]]
    col = 0
    if "rate" in head:
        col = head.index("rate")
        rows = rows[1:]
    elif len(head) != 1 or not _is_number(head[0]):
        raise UsageError(f"--rates {label}: line 1: expected a header with a 'rate' column or a single column of "
                         f"numbers, got {','.join(rows[0][1])!r}")
    if not rows:
        raise UsageError(f"--rates {label}: expected one interactive rate per slot, got a header and no rows")
    out = np.empty(len(rows))
    for k, (line, r) in enumerate(rows):
        v = r[col].strip() if col < len(r) else ""
        x = float(v) if _is_number(v) else math.nan
        if not math.isfinite(x) or x < 0:
            raise UsageError(f"--rates {label}: line {line}: rate = {v!r}: expected requests/s >= 0 (a finite number)")
        out[k] = x
    return out


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def rates_from_trace(path: str | os.PathLike, slot: float) -> tuple[np.ndarray, float, float]:
    """A trace's arrivals binned per slot: (rates in requests/s, mean prompt, mean output tokens).

    The format is read from the header (the Azure LLM inference trace or the generic CSV, as
    ``fluidopt simulate --trace``); times start at the first request; the last slot is counted whole."""
    from fluidopt.workloads.traces import _is_azure, read_azure_trace, read_trace_csv

    _check_slot(slot)
    df = read_azure_trace(path) if _is_azure(path) else read_trace_csv(path)
    t = df["time"].to_numpy(dtype=float)
    K = max(1, math.ceil((float(t.max()) + 1e-9) / slot))
    counts = np.bincount(np.minimum((t // slot).astype(np.int64), K - 1), minlength=K)
    return counts / slot, float(df["prompt"].mean()), float(df["output"].mean())


def parse_backlog(text: str) -> tuple[str, float, float]:
    """``CLASS=N@AT`` (N requests of CLASS at AT seconds; ``@AT`` optional, default 0) as (class, n, at)."""
    s = str(text).strip()
    name, eq, rest = s.partition("=")
    n_txt, _, at_txt = rest.partition("@")
    try:
        n = float(n_txt)
        at = float(at_txt) if at_txt.strip() else 0.0
    except ValueError:
        n = at = math.nan
    if not eq or not name.strip() or not math.isfinite(n) or n < 0 or not math.isfinite(at) or at < 0:
        raise UsageError(f"--backlog: expected CLASS=N@AT (N requests >= 0 of a batch class at AT seconds >= 0), "
                         f"got {s!r}")
    return name.strip(), n, at


def workflow_rates(scenario: Scenario, slot: float) -> tuple[np.ndarray | None, str | None, list[str]]:
    """The interactive rate per slot from a scenario's workflow (``[[arrivals]]``), over its
    ``[workflow] horizon``: (rates, None, notes), or (None, trace file, notes) when the one interactive
    class with arrivals replays a trace. ``poisson`` / ``gamma``: their constant rate; ``rates``: the
    file's piecewise rate averaged over each slot; a class without arrivals adds nothing."""
    from fluidopt.workloads.workflow import read_slot_rates

    wf = scenario.workflow
    inter = [c for c in scenario.classes if c.deadline is None and c.deadline_at is None]
    specs = {a.cls: a for a in wf.arrivals}
    traced = [specs[c.name] for c in inter if c.name in specs and specs[c.name].process == "trace"]
    if traced:
        if len([c for c in inter if c.name in specs]) > 1:
            raise UsageError("plan --day: the workflow replays a trace for one interactive class next to other "
                             "interactive arrivals; give the day's rates with --rates FILE")
        return None, traced[0].file, [f"interactive rates from the workflow's trace {traced[0].file}"]
    if wf.horizon is None:
        raise UsageError("plan --day: expected the day's interactive rates: --rates FILE, --trace FILE, or a "
                         "workflow with [workflow] horizon in the scenario")
    K = max(1, math.ceil(wf.horizon / slot - 1e-9))
    lam = np.zeros(K)
    edges = slot * np.arange(K + 1)
    for c in inter:
        a = specs.get(c.name)
        if a is None:
            continue
        if a.process in ("poisson", "gamma"):
            lam += c.rate if a.rate is None else a.rate
        else:  # per-slot rates of their own slot length: the average over each plan slot
            lam += _slot_means(read_slot_rates(a.file, f"arrivals[{c.name}].file"), a.slot, edges)
    return lam, None, [f"interactive rates from the scenario's workflow over its horizon ({wf.horizon:g} s)"]


def _slot_means(r: np.ndarray, width: float, edges: np.ndarray) -> np.ndarray:
    """Mean over each [edges[k], edges[k+1]) of the piecewise rate r[j] on [j width, (j+1) width), 0 after."""
    cum = np.concatenate([[0.0], np.cumsum(r * width)])  # the integral at each breakpoint

    def integral(t: np.ndarray) -> np.ndarray:
        j = np.minimum(np.floor(t / width).astype(np.int64), r.size)
        inside = j < r.size
        return cum[j] + np.where(inside, r[np.minimum(j, r.size - 1)] * (t - j * width), 0.0)

    return np.diff(integral(edges)) / np.diff(edges)


def _check_slot(slot) -> float:
    if isinstance(slot, bool) or not isinstance(slot, (int, float)) or not math.isfinite(slot) or slot <= 0:
        raise UsageError(f"--slot: expected seconds > 0, got {slot!r}")
    return float(slot)


# --------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------


def _class_jobs(scenario: Scenario, bat: Sequence[int], K: int, slot: float, end: float,
                notes: list[str]) -> list[BacklogJob]:
    """The scenario's batch classes arriving at their rate over the day, in groups of whole slots."""
    jobs = []
    per = max(1, math.ceil(K / MAX_GROUPS))  # slots per group
    for i in bat:
        c = scenario.classes[i]
        if c.rate * end < 1.0:  # a placeholder rate (e.g. a class fed by backlogs only): no ongoing work
            notes.append(f"class {c.name!r}: rate {c.rate:g}/s brings fewer than one request in the day (ignored)")
            continue
        lost = 0.0
        for k0 in range(0, K, per):
            a, b = k0 * slot, min(K, k0 + per) * slot
            due = math.inf
            if c.deadline is not None:
                due = min(due, math.ceil((b + c.deadline) / slot - 1e-9) * slot)
            if c.deadline_at is not None:
                if a >= c.deadline_at:
                    lost += c.rate * (b - a)
                    continue
                due = min(due, math.ceil(c.deadline_at / slot - 1e-9) * slot)
            n = c.rate * (b - a)
            if n > 0 and due > a:
                jobs.append(BacklogJob(c.name, n, a, due))
        if lost > 0:
            notes.append(f"class {c.name!r}: {lost:g} requests arrive at or after its deadline_at = {c.deadline_at:g} s "
                         "and can never meet it (left out of the plan)")
    return jobs


def _binding(fp: FleetPlan, backlogs: Sequence[BacklogJob], min_gpus_per_slot, nmax: float) -> tuple[str, ...]:
    """Per slot, the constraint that sets the fleet (see :class:`DayPlan`)."""
    out = []
    served = fp.served_mixed + fp.served_batch
    for k, t0 in enumerate(fp.times):
        g = fp.base[k] + fp.batch[k]
        min_gpus = float(min_gpus_per_slot[k])
        floor = max(min_gpus, fp.interactive_demand[k])
        tol = 1e-6 * max(1.0, g)
        if g >= nmax - tol:
            out.append("max_gpus")
        elif g > floor + tol and served[k] > 0:
            due = [j for j in backlogs if j.at <= t0 + 1e-9 and t0 + fp.slot <= j.deadline + 1e-9]
            # the class whose work is due soonest is the one that cannot wait
            out.append("deadline:" + (min(due, key=lambda j: j.deadline).cls if due else "batch"))
        elif g <= tol:
            out.append("idle")
        elif min_gpus > fp.interactive_demand[k] + tol:
            out.append("min_gpus")
        else:
            out.append("interactive")
    return tuple(out)


def plan_day(
    scenario: Scenario,
    rates: Sequence[float] | np.ndarray | None = None,
    *,
    trace: str | os.PathLike | None = None,
    slot: float = 3600.0,
    backlogs: Sequence[BacklogJob | tuple[str, float, float]] = (),
    utilisation: float = 1.0,
    min_gpus: float = 0.0,
    max_gpus: int | None = None,
    class_arrivals: bool = True,
    calibrated: bool = True,
) -> DayPlan:
    """The fewest GPU-hours for a day: the multi-period LP over ``len(rates)`` slots of ``slot`` seconds.

    ``rates``: the interactive classes' arrival rate per slot (requests/s); or ``trace``: a trace file
    whose arrivals, binned per slot, give the rates (and, with one interactive class, its mean prompt
    and output tokens). ``backlogs``: batch work, :class:`BacklogJob` or (class, n, at) with the
    deadline from the class (``deadline_at``, or ``at`` + ``deadline``); ``class_arrivals``: also the
    scenario's batch classes at their ``rate`` (module docstring). ``utilisation`` (rho in (0, 1]):
    target utilisation of the interactive GPUs (1: the lower bound); ``min_gpus``: a fleet kept in
    every slot; ``max_gpus``: the fleet's maximum (default the scenario's ``gpus``); ``calibrated``: the
    roles' rates are the simulator's saturated throughputs (default; False: the fluid estimates, see
    :func:`fluidopt.fluid.multiperiod.role_rates`). A deadline after the day's end is kept: the plan
    runs on in whole slots to the last deadline, with no interactive traffic after the day. Raises
    :class:`UsageError` / :class:`ScenarioError` on bad input, :class:`InfeasibleError` when no
    fleet of at most ``max_gpus`` serves the day.
    """
    if not isinstance(scenario, Scenario):
        raise ScenarioError(f"plan_day: scenario: expected a Scenario, got {type(scenario).__name__}")
    slot = _check_slot(slot)
    wf_notes: list[str] = []
    if scenario.workflow is not None:
        if rates is None and trace is None:
            rates, trace, wf_notes = workflow_rates(scenario, slot)
        if not backlogs and scenario.workflow.backlogs:
            backlogs = [(b.cls, float(b.count), float(b.at)) for b in scenario.workflow.backlogs]
            wf_notes.append(f"backlogs from the scenario's workflow: "
                            f"{', '.join(f'{b.cls}={b.count}@{b.at:g}' for b in scenario.workflow.backlogs)}")
    if (rates is None) == (trace is None):
        raise UsageError("plan --day: expected the day's interactive rates from exactly one of --rates FILE and "
                         "--trace FILE (Python: rates= or trace=)")
    if isinstance(utilisation, bool) or not isinstance(utilisation, (int, float)) or not 0 < utilisation <= 1:
        raise UsageError(f"--utilisation: expected a target utilisation in (0, 1], got {utilisation!r}")
    if isinstance(min_gpus, bool) or not isinstance(min_gpus, (int, float)) or not math.isfinite(min_gpus) \
            or min_gpus < 0:
        raise UsageError(f"--min-gpus: expected a number of GPUs >= 0, got {min_gpus!r}")
    nmax = scenario.gpus if max_gpus is None else max_gpus
    if isinstance(nmax, bool) or not isinstance(nmax, int) or nmax < 1:
        raise UsageError(f"--max-gpus: expected an integer >= 1, got {nmax!r}")
    cl = scenario.classes
    inter = [i for i, c in enumerate(cl) if c.deadline is None and c.deadline_at is None]
    bat = [i for i in range(len(cl)) if i not in inter]
    if not inter:
        raise ScenarioError(f"plan --day: scenario {scenario.name!r} has no interactive class (every class has a "
                            "deadline); expected at least one class without deadline / deadline_at")
    notes: list[str] = list(wf_notes)
    if trace is not None:
        lam, P, D = rates_from_trace(trace, slot)
        if len(inter) == 1:
            i = inter[0]
            classes = list(cl)
            classes[i] = replace(cl[i], prompt=P, decode=D, rate=max(float(lam.mean()), 1e-9))
            scenario = replace(scenario, classes=tuple(classes))
            notes.append(f"class {cl[i].name!r}: mean prompt {P:.1f} and output {D:.1f} tokens from the trace")
        else:
            notes.append("several interactive classes: the trace gives their total rate; their lengths stay the "
                         "scenario's")
    else:
        lam = np.asarray(rates, dtype=float).ravel() if not isinstance(rates, np.ndarray) else rates.astype(float).ravel()
        if lam.size == 0:
            raise UsageError("--rates: expected one interactive rate per slot, got none")
        bad = np.flatnonzero(~np.isfinite(lam) | (lam < 0))
        if bad.size:
            k = int(bad[0])
            raise UsageError(f"--rates: slot {k}: rate = {float(lam[k])!r}: expected requests/s >= 0 (a finite number)")
    K = lam.size
    end = K * slot
    names = scenario.class_names
    jobs: list[BacklogJob] = []
    late: list[str] = []  # deadlines after the day's end, as given
    for b in backlogs:
        if isinstance(b, BacklogJob):
            jobs.append(b)
            continue
        name, n, at = b
        if name not in names:
            raise UsageError(f"--backlog: class {name!r} is not a class of the scenario ({', '.join(names)})")
        c = cl[names.index(name)]
        if c.deadline is None and c.deadline_at is None:
            raise UsageError(f"--backlog: class {name!r} has no deadline (deadline or deadline_at); a backlog needs one")
        due = min(x for x in (c.deadline_at, None if c.deadline is None else at + c.deadline) if x is not None)
        if at >= end:
            raise UsageError(f"--backlog {name}={n:g}@{at:g}: expected a time within the day [0, {end:g}) s")
        if due <= at:
            raise UsageError(f"--backlog {name}={n:g}@{at:g}: its deadline {due:g} s is not after its arrival")
        if due > end + 1e-9:
            late.append(f"backlog {name} due at {due:g} s")
        # whole slots, rounded outwards (available from the slot it arrives in, due at the end of the slot
        # holding its deadline): a relaxation, so the optimum stays a lower bound at any slot length
        jobs.append(BacklogJob(name, float(n), math.floor(at / slot + 1e-9) * slot, math.ceil(due / slot - 1e-9) * slot))
    if scenario.workflow is not None:  # with a workflow, a batch class arrives only through [[arrivals]]
        flowing = {a.cls for a in scenario.workflow.arrivals}
        bat = [i for i in bat if cl[i].name in flowing]
    if class_arrivals and bat:
        jobs += _class_jobs(scenario, bat, K, slot, end, notes)
    # deadlines after the day's end are kept: the plan runs on to the last one (whole slots), with no
    # interactive traffic after the day's end (the day's work is what arrives in the day)
    last = max([j.deadline for j in jobs], default=end)
    if last > end + 1e-9:
        extra = math.ceil((last - end) / slot - 1e-9)
        given = {x.split(" due at ")[0].removeprefix("backlog ") for x in late}
        late += sorted({f"class {j.cls} due by {j.deadline:g} s" for j in jobs
                        if j.deadline > end + 1e-9 and j.cls not in given})
        notes.append(f"deadline after the day's end ({end:g} s): {'; '.join(late)}; the plan runs {extra} slot"
                     f"{'s' if extra > 1 else ''} of {slot:g} s longer, to {end + extra * slot:g} s (deadlines rounded "
                     "up to whole slots), with no interactive traffic after the day's end")
        lam = np.concatenate([lam, np.zeros(extra)])
        floor = np.concatenate([np.full(len(lam) - extra, float(min_gpus)), np.zeros(extra)])
        end = end + extra * slot
    else:
        floor = np.full(len(lam), float(min_gpus))
    try:
        fp = plan_fleet(scenario, jobs, start=0.0, end=end, slot=slot, interactive_rate=lam, utilisation=utilisation,
                        min_gpus=floor, max_gpus=nmax, interactive=inter, level=True, calibrated=calibrated)
    except InfeasibleError as e:
        peak = float(lam.max()) / (utilisation * _mu_int(scenario, inter, calibrated))
        raise InfeasibleError(f"plan --day: {e} (peak interactive need {peak:.2f} GPUs); raise --max-gpus "
                              "(or cluster.gpus) or move the deadlines",
                              conflicting=e.conflicting) from None
    gpus = fp.base + fp.batch
    gi = np.ceil(gpus - 1e-7).astype(int)
    gh_int = float(gi.sum() * slot / 3600.0)
    price = scenario.gpu.price_per_hour
    return DayPlan(slot=slot, times=fp.times, rates=lam, gpus=gpus, gpus_int=gi, base=fp.base, batch=fp.batch,
                   interactive_gpus=fp.interactive_demand, binding=_binding(fp, jobs, floor, nmax),
                   gpu_hours=fp.gpu_hours, gpu_hours_int=gh_int, price_per_gpu_hour=price,
                   cost=None if price is None else fp.gpu_hours * price,
                   cost_int=None if price is None else gh_int * price, utilisation=float(utilisation),
                   backlogs=tuple(jobs), fleet_plan=fp, notes=tuple(notes))


def _mu_int(scenario: Scenario, inter: Sequence[int], calibrated: bool = True) -> float:
    from fluidopt.fluid.multiperiod import _rates

    return _rates(scenario, inter, [i for i in range(len(scenario.classes)) if i not in inter], None, calibrated)[0]


# --------------------------------------------------------------------------------------------
# Mixed instance types, simulated role by role (issue 31, item 4)
# --------------------------------------------------------------------------------------------
# A fleet of several instance types, simulated role by role (issue 31, item 4; docs/orchestration.md).
#
# :func:`fluidopt.fluid.multiperiod.plan_fleet_mix` chooses the cheapest mix of instance types per
# slot. When its plan gives each type one role (the interactive classes on some types, the batch work
# on the others: the usual outcome, since a type is either cheaper per interactive or per batch
# request), the types share no request, and the simulator, whose run has one GPU law, runs the mix as
# one run per type: the interactive workload on the interactive type's fleet, the batch workload on
# the batch type's, each with its own autoscaler (Chiron's interactive autoscaler on the first,
# Chiron's global (batch) autoscaler on the second, or the utilisation autoscaler on both). A plan that
# gives one type both roles (mixed instances lending to batch work) needs one engine with a GPU law per
# instance, which the engine does not have: :func:`simulate_mix` refuses it (UsageError).


@dataclass(frozen=True)
class MixRun:
    """The simulated mix: per type (``table``: role, instances at most, GPU-hours, cost, peak, SLO
    attainment of the classes it served) and in all (``cost``, ``gpu_hours``, ``slo`` per class)."""

    table: pd.DataFrame
    cost: float
    gpu_hours: float
    slo: dict[str, float]


def mix_roles(plan: MixPlan, tol: float = 1e-6) -> dict[str, str]:
    """Each type's role in the plan: ``"interactive"`` (it serves interactive requests only),
    ``"batch"`` (batch work only), ``"idle"`` (nothing) or ``"both"``."""
    out = {}
    for t, ty in enumerate(plan.types):
        ni = float(plan.served_interactive[t].sum())
        nb = float(plan.served_mixed[t].sum() + plan.served_batch[t].sum())
        out[ty.name] = ("both" if ni > tol and nb > tol else "interactive" if ni > tol else "batch" if nb > tol
                        else "idle")
    return out


def simulate_mix(scenario: Scenario, plan: MixPlan, *, seed: int, horizon: float | None = None,
                 policy: str = "chiron", utilisation: float = 0.8, service: str = "tokens") -> MixRun:
    """Run the plan's mix (module docstring). ``scenario``: the workflow (its ``[[arrivals]]`` and
    ``[[backlogs]]``) with its instance types in ``fleet.types``; each type runs at most its ``max``
    instances (default the scenario's ``gpus``) with its own start-up delay; the interactive type starts
    with the instances the interactive rate needs at ``utilisation`` (ceil(lambda / (rho mu_int))), the
    batch type with none (its autoscaler adds them when the backlog arrives)."""
    from fluidopt.sim.api import simulate
    from fluidopt.workloads.workflow import WorkflowWarning

    if scenario.workflow is None:
        raise UsageError("simulate_mix: expected a scenario with a workflow ([[arrivals]], [[backlogs]]), got none")
    roles = mix_roles(plan)
    both = [n for n, r in roles.items() if r == "both"]
    if both:
        raise UsageError(f"simulate_mix: type(s) {', '.join(both)} serve both interactive and batch work in the plan; "
                         f"a run with one GPU law per instance is not available in the simulator")
    horizon = scenario.workflow.horizon if horizon is None else horizon
    swap = scenario.fleet.kv_swap_time_per_token if scenario.fleet is not None else 0.0
    wf = scenario.workflow
    lam = sum(c.rate for c in scenario.classes if c.deadline is None and c.deadline_at is None)
    active = [(t, ty) for t, ty in enumerate(plan.types) if roles[ty.name] != "idle"]
    n_int = sum(1 for _, ty in active if roles[ty.name] == "interactive")
    n_bat = sum(1 for _, ty in active if roles[ty.name] == "batch")
    if n_int > 1 or n_bat > 1:
        raise UsageError("simulate_mix: expected at most one interactive and one batch type in the plan, got "
                         f"{n_int} and {n_bat}")
    rows = []
    slo: dict[str, float] = {}
    for _t, ty in active:
        role = roles[ty.name]
        n = ty.max if ty.max is not None else scenario.gpus
        if role == "interactive":
            initial = min(n, max(1, math.ceil(lam / (utilisation * ty.rates.mu_int) - 1e-9)))
            flow = replace(wf, backlogs=())
            opts = {"interactive_utilisation": utilisation} if policy == "chiron" else {}
        else:
            initial = 0
            flow = replace(wf, arrivals=())
            opts = {"interactive_gpus": 0} if policy == "chiron" else {}
        gpu = next(x.gpu for x in scenario.fleet.types if x.name == ty.name)
        sub = replace(scenario, gpu=gpu, gpus=n, name=f"{scenario.name}[{ty.name}]", workflow=flow,
                      fleet=Fleet(initial=initial, startup_delay=ty.startup_delay, kv_swap_time_per_token=swap))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", WorkflowWarning)  # (the other role's classes never arrive here)
            res = simulate(sub, policy, horizon=horizon, seed=seed, service=service, controller_options=opts)
        interrupt.raise_if_cut(res)
        pc = res.per_class
        served = [c for c in pc.index if pc.loc[c, "slo_requests"] > 0]
        log = res.meta.get("fleet_log")
        row = {"type": ty.name, "role": role, "max": n, "initial": initial, "gpu_hours": res.gpu_hours,
               "cost": res.gpu_hours * ty.price_per_hour,
               "peak": int(log["gpus"].max()) if log is not None else n}
        for c in served:
            row[f"slo[{c}]"] = float(pc.loc[c, "slo_attainment"])
            slo[c] = float(pc.loc[c, "slo_attainment"])
        rows.append(row)
    table = pd.DataFrame(rows).set_index("type")
    return MixRun(table=table, cost=float(table["cost"].sum()), gpu_hours=float(table["gpu_hours"].sum()), slo=slo)
