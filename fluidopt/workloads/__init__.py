"""Workloads: what arrives, when, with how many tokens.

A workload hands the simulator its arrivals lazily, as time-sorted chunks, so a run of millions of
requests never holds them all in memory (:mod:`fluidopt.workloads.base`). By source:

* :mod:`fluidopt.workloads.synthetic`: arrival processes (:class:`Poisson`, :class:`GammaRenewal`,
  :class:`PiecewiseRate`), token-length distributions (:class:`Fixed`, :class:`Exponential`,
  :class:`LogNormal`, :class:`Empirical`) and their composition, :class:`SyntheticWorkload`;
* :mod:`fluidopt.workloads.replay`: :class:`TraceWorkload`, the replay of a recorded trace;
* :mod:`fluidopt.workloads.traces`: the trace file readers (Azure CSV, generic CSV), class assignment,
  summaries and the fluid load of a trace;
* :mod:`fluidopt.workloads.backlog`: batch backlogs on top of ongoing arrivals;
* :mod:`fluidopt.workloads.workflow`: the workload a scenario describes (:func:`workload_from_scenario`),
  its ``[[arrivals]]`` / ``[[backlogs]]`` workflow included.

The names below are the package's public API; ``fluidopt.sim.workload`` and ``fluidopt.sim.trace``, the
former homes, still import them.
"""

from fluidopt.workloads.backlog import Backlog, BacklogWorkload
from fluidopt.workloads.base import ArrivalBatch, TraceWarning, Workload, collect
from fluidopt.workloads.replay import TraceWorkload
from fluidopt.workloads.synthetic import (
    ArrivalProcess,
    ClassSpec,
    Empirical,
    Exponential,
    Fixed,
    GammaRenewal,
    LengthDistribution,
    LogNormal,
    PiecewiseRate,
    Poisson,
    SyntheticWorkload,
)
from fluidopt.workloads.workflow import (
    WorkflowWarning,
    check_workflow,
    read_slot_rates,
    workflow_workload,
    workload_from_scenario,
)

__all__ = [
    "WorkflowWarning",
    "check_workflow",
    "read_slot_rates",
    "workflow_workload",
    "ArrivalBatch",
    "ArrivalProcess",
    "Backlog",
    "BacklogWorkload",
    "ClassSpec",
    "Empirical",
    "Exponential",
    "Fixed",
    "GammaRenewal",
    "LengthDistribution",
    "LogNormal",
    "PiecewiseRate",
    "Poisson",
    "SyntheticWorkload",
    "TraceWarning",
    "TraceWorkload",
    "Workload",
    "collect",
    "workload_from_scenario",
]
