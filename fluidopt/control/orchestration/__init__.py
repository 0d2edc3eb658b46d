"""Orchestration for interactive and batch SLOs on an autoscaling fleet (docs/orchestration.md).

Three controllers for the setting of IBM/UIUC's Chiron and QLM: interactive request classes with
second-scale TTFT and inter-token-latency (ITL) SLOs, batch classes with completion deadlines of
minutes to hours, and (Chiron, the utilisation autoscaler) a fleet that grows and shrinks during the
run (the simulator's fleet actions: ``add_gpu``, ``drain_gpu``, ``set_max_decodes``, ``evict``).

* ``chiron``: instance pools typed interactive / mixed / batch; interactive-first routing with
  overflow to mixed instances, where batch work is evicted to host memory to make room; a local
  autoscaler that sets each instance's batch limit to the largest batch whose iteration time (from
  the GPU law) meets the ITL target of the work it serves (a mixed instance holding batch work only:
  the batch limit); a global autoscaler that adds batch instances when the batch queue's waiting
  time, Chiron's statistical bound, would miss the deadline and drains them when it would not, and
  scales the interactive side from the interactive load (:func:`interactive_step`: up when the last
  tick's rate or the TTFT/ITL headroom says it is short, down after a cooldown of over-provisioning,
  never below a minimum; while batch work waits, surplus mixed instances are lent to it instead);
* ``qlm-groups``: QLM as published (:class:`QLMGroups`): request groups, per-instance virtual queues,
  several models per fleet with a model-swap time, the waiting-time estimator, plan and reorder
  every tick, eviction only for a request about to miss its TTFT;
* ``qlm``: a fixed fleet; requests grouped by class (one SLO per class); the group served next is
  the one with the least predicted slack (the waiting-time estimate against its SLO), which
  maximises predicted attainment when some group must wait; an interactive request that arrives when
  no instance has room evicts batch work at once (not only when about to miss its TTFT);
* ``utilisation-autoscaler``: the baseline the Chiron paper compares against (Llumnix-like): every
  request is dispatched at once to the least-loaded instance (join the shortest queue; interactive
  first within an instance), a fixed batch size, instances added when utilisation is high (queued
  requests are migrated to a new instance) and drained when it is low.

Every instance runs one prefill at a time (chunked) and decodes its requests on the same GPU where
there is room (a decode may move to another GPU of the pool, KV transfer free as in the engine).
A prefill is admitted only on a GPU whose decodes are below its batch limit, so the decode that
follows has a slot.

The GPU law used for the estimates is the engine's: an iteration takes tau_mix (with a prefill
chunk) or tau_solo, plus ``kv_time_per_token`` per token of resident context. Batch limits use a
decode's mean resident context of prompt + output / 2 tokens (:func:`largest_batch`); the planning
rates of the roles (``calibrated=True``, the default) are the simulator's saturated throughputs
(:func:`fluidopt.fluid.multiperiod.role_rates`, :mod:`fluidopt.fluid.saturation`), else the fluid
estimates of :func:`batch_throughput`.
"""

from fluidopt.control.orchestration.autoscaler import UtilisationAutoscaler
from fluidopt.control.orchestration.chiron import Chiron, FluidPlan
from fluidopt.control.orchestration.common import (
    FleetPlan,
    batch_throughput,
    interactive_step,
    iteration_time,
    largest_batch,
    mean_context,
    plan_fleet,
    split_classes,
)
from fluidopt.control.orchestration.qlm import QLM, QLMGroups

__all__ = [
    "Chiron",
    "FluidPlan",
    "QLM",
    "QLMGroups",
    "UtilisationAutoscaler",
    "FleetPlan",
    "batch_throughput",
    "interactive_step",
    "iteration_time",
    "largest_batch",
    "mean_context",
    "plan_fleet",
    "split_classes",
]
