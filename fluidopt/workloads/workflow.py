"""The workload a scenario describes: its classes' arrival streams (:func:`workload_from_scenario`), or
its workflow, the ``[[arrivals]]`` and ``[[backlogs]]`` tables, as one workload.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence

import numpy as np

from fluidopt.core.errors import ScenarioError
from fluidopt.core.model import RequestClass, Scenario
from fluidopt.workloads.backlog import Backlog, BacklogWorkload
from fluidopt.workloads.base import ArrivalBatch, _check_horizon, _children, _num, collect
from fluidopt.workloads.synthetic import (
    ArrivalProcess,
    ClassSpec,
    GammaRenewal,
    PiecewiseRate,
    Poisson,
    SyntheticWorkload,
    _length_law,
)

__all__ = ["WorkflowWarning", "check_workflow", "read_slot_rates", "workflow_workload", "workload_from_scenario"]

# --------------------------------------------------------------------------------------------
# A scenario's workflow ([[arrivals]] and [[backlogs]] in the scenario file)
# --------------------------------------------------------------------------------------------


class WorkflowWarning(UserWarning):
    """A workflow that will not do what it says within the run (e.g. a batch class that never arrives)."""


class _Renamed:
    """A one-class workload under another class name."""

    def __init__(self, base, name: str):
        self.base = base
        self.class_names = (name,)

    def __repr__(self) -> str:
        return f"{self.base!r} as {self.class_names[0]!r}"

    def batches(self, rng, horizon, size=65536):
        return self.base.batches(rng, horizon, size)


class _Nothing:
    """No ongoing arrivals (a workflow of backlogs only)."""

    class_names: tuple[str, ...] = ()

    def batches(self, rng, horizon, size=65536):
        return iter(())


class _Merged:
    """Several workloads merged in time order (ties: the parts' order); each part gets its own child
    stream of ``rng``. Collects every part over the horizon first (a finite horizon is needed)."""

    def __init__(self, parts, class_names: Sequence[str]):
        self.parts = list(parts)
        self.class_names = tuple(class_names)
        self._maps = [np.array([self.class_names.index(n) for n in p.class_names], dtype=np.int64) for p in self.parts]

    def __repr__(self) -> str:
        return f"Merged({self.parts!r})"

    def batches(self, rng: np.random.Generator, horizon: float, size: int = 65536) -> Iterator[ArrivalBatch]:
        horizon = _check_horizon(horizon)
        if not math.isfinite(horizon):
            raise ScenarioError("workflow: several arrival processes with a trace need a finite horizon")
        gens = _children(rng, len(self.parts))
        got = [collect(p, g, horizon) for p, g in zip(self.parts, gens)]
        t = np.concatenate([b.time for b in got])
        src = np.concatenate([np.full(len(b), k) for k, b in enumerate(got)])
        order = np.lexsort((src, t))
        cls = np.concatenate([m[b.cls] for m, b in zip(self._maps, got)])[order]
        pp = np.concatenate([b.prompt for b in got])[order]
        po = np.concatenate([b.output for b in got])[order]
        t = t[order]
        for s in range(0, t.size, size):
            yield ArrivalBatch(t[s:s + size], cls[s:s + size], pp[s:s + size], po[s:s + size])


def _arrival_part(spec, c: RequestClass):
    """One [[arrivals]] table as a one-class workload."""
    w = f"arrivals[{c.name}]"
    if spec.process == "trace":
        from fluidopt.workloads.traces import _is_azure, load_azure_trace, load_trace_csv

        load = load_azure_trace if _is_azure(spec.file) else load_trace_csv
        return _Renamed(load(spec.file, classes="single"), c.name)
    prompt = _length_law(f"classes[{c.name}]", c.lengths, c.prompt, c.prompt_sigma)
    output = _length_law(f"classes[{c.name}]", c.lengths, c.decode, c.decode_sigma)
    rate = c.rate if spec.rate is None else spec.rate
    if spec.process == "poisson":
        proc: ArrivalProcess = Poisson(rate)
    elif spec.process == "gamma":
        proc = GammaRenewal(rate, spec.cv)
    else:  # rates: a CSV of per-slot rates
        r = read_slot_rates(spec.file, f"{w}.file")
        proc = PiecewiseRate(spec.slot * np.arange(r.size + 1), np.append(r, 0.0))
    return SyntheticWorkload([ClassSpec(proc, prompt, output, name=c.name)])


def read_slot_rates(path, where: str) -> np.ndarray:
    """Per-slot rates (requests/s) from a CSV: a ``rate`` column, or one column of numbers without a
    header; blank lines skipped. Errors name ``where``, the line and the value."""
    import csv

    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            rows = [(n, r) for n, r in enumerate(csv.reader(f), start=1) if any(c.strip() for c in r)]
    except (OSError, UnicodeDecodeError) as e:
        raise ScenarioError(f"{where}: cannot read {str(path)!r}: {e}") from None
    head = [c.strip().lower() for c in rows[0][1]] if rows else []
    col = 0
    if "rate" in head:
        col = head.index("rate")
        rows = rows[1:]
    if not rows:
        raise ScenarioError(f"{where}: {str(path)!r}: expected one rate per slot, got no rows")
    out = np.empty(len(rows))
    for k, (line, r) in enumerate(rows):
        v = r[col].strip() if col < len(r) else ""
        try:
            x = float(v)
        except ValueError:
            x = math.nan
        if not math.isfinite(x) or x < 0:
            raise ScenarioError(f"{where}: {str(path)!r} line {line}: rate = {v!r}: expected requests/s >= 0")
        out[k] = x
    if not np.any(out > 0):
        raise ScenarioError(f"{where}: {str(path)!r}: expected at least one positive rate, got all zero")
    return out


def workflow_workload(scenario: Scenario):
    """The workload of a scenario's workflow (:class:`fluidopt.core.model.Workflow`): the ``[[arrivals]]``
    processes (the synthetic ones in one :class:`SyntheticWorkload`, in class order; a trace merged in
    time order) plus the ``[[backlogs]]`` (:class:`BacklogWorkload`, lengths from the class). A class
    without an ``[[arrivals]]`` table has no ongoing arrivals."""
    wf = scenario.workflow
    if wf is None:
        raise ScenarioError(f"workflow_workload: scenario {scenario.name!r} has no workflow ([[arrivals]] / [[backlogs]])")
    names = scenario.class_names
    cl = {c.name: c for c in scenario.classes}
    specs = sorted(wf.arrivals, key=lambda a: names.index(a.cls))
    synth = [s for s in specs if s.process != "trace"]
    parts = []
    if synth:
        ws = [_arrival_part(s, cl[s.cls]) for s in synth]
        parts.append(SyntheticWorkload([w.specs[0] for w in ws]))
    parts += [_arrival_part(s, cl[s.cls]) for s in specs if s.process == "trace"]
    if not parts:
        base = _Nothing()
    elif len(parts) == 1:
        base = parts[0]
    else:
        base = _Merged(parts, [n for n in names if any(n in p.class_names for p in parts)])
    backlogs = [Backlog(b.cls, int(b.count), float(b.at),
                        _length_law(f"classes[{b.cls}]", cl[b.cls].lengths, cl[b.cls].prompt, cl[b.cls].prompt_sigma),
                        _length_law(f"classes[{b.cls}]", cl[b.cls].lengths, cl[b.cls].decode, cl[b.cls].decode_sigma))
                for b in wf.backlogs]
    return BacklogWorkload(base, backlogs, class_names=names)


def check_workflow(scenario: Scenario, horizon: float) -> list[str]:
    """Warnings for a workflow run over [0, ``horizon``): a batch class (one with a deadline) that gets
    fewer than one request in expectation (no backlog before the horizon, no arrivals process bringing
    one) completes nothing; each is also issued as a :class:`WorkflowWarning`. Returns the messages."""
    wf = scenario.workflow
    if wf is None:
        return []
    out = []
    for c in scenario.classes:
        if c.deadline is None and c.deadline_at is None:
            continue
        n = sum(b.count for b in wf.backlogs if b.cls == c.name and b.at < horizon)
        for a in wf.arrivals:
            if a.cls == c.name:
                n += math.inf if a.process in ("trace", "rates") else (c.rate if a.rate is None else a.rate) * horizon
        if n < 1:
            late = [b for b in wf.backlogs if b.cls == c.name]
            why = (f"its backlog arrives at {min(b.at for b in late):g} s, not before the horizon {horizon:g} s"
                   if late else "it has no [[backlogs]] table and no [[arrivals]] table bringing a request")
            out.append(f"workflow: batch class {c.name!r} never arrives within the horizon ({why}): no request of it "
                       "will be served")
    for m in out:
        warnings.warn(m, WorkflowWarning, stacklevel=2)
    return out

def workload_from_scenario(scenario: Scenario, *, cv: float = 1.0) -> SyntheticWorkload:
    """The scenario's own workload: Poisson arrivals per class at ``RequestClass.rate`` (whole cluster)
    and lengths per ``RequestClass.lengths`` with means ``prompt``/``decode`` (a mean below one token is
    raised to 1, since every request has at least one prompt and one output token).

    ``cv != 1`` replaces each Poisson stream by a stationary :class:`GammaRenewal` stream with the same
    rate and that coefficient of variation (a burstiness stress test of a plan made for Poisson).
    A scenario with a workflow (``[[arrivals]]`` / ``[[backlogs]]``) gives :func:`workflow_workload`
    (with ``cv`` = 1).
    """
    if not isinstance(scenario, Scenario):
        raise ScenarioError(f"workload_from_scenario: expected a Scenario, got {type(scenario).__name__}")
    cv = _num("workload_from_scenario: cv", cv, strict=False)
    if scenario.workflow is not None and cv == 1.0:
        return workflow_workload(scenario)
    specs = []
    for c in scenario.classes:
        w = f"classes[{c.name}]"
        specs.append(
            ClassSpec(
                Poisson(c.rate) if cv == 1.0 else GammaRenewal(c.rate, cv),
                _length_law(w, c.lengths, c.prompt, c.prompt_sigma),
                _length_law(w, c.lengths, c.decode, c.decode_sigma),
                name=c.name,
            )
        )
    return SyntheticWorkload(specs, class_names=scenario.class_names)
