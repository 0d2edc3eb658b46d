"""How many GPUs of which kind, and what do they cost?

* :mod:`fluidopt.planning.fleet`: the fleet for a scenario and its SLIs -- the fluid lower bound as one
  LP, then a fleet verified by simulation (:func:`plan`), batch/chunk studies;
* :mod:`fluidopt.planning.day`: GPU-hours for a day of interactive and batch work (the multi-period
  fluid plan, ``fluidopt plan --day``), with a mix of instance types.

``fluidopt.plan`` and ``fluidopt.dayplan``, the modules' former names, still import.
"""

from fluidopt.planning.day import DayPlan, plan_day
from fluidopt.planning.fleet import PlanResult, PlanSLIs, batch_chunk_study, fluid_plan_slis, plan, simulation_window

__all__ = ["PlanSLIs", "PlanResult", "plan", "fluid_plan_slis", "batch_chunk_study", "simulation_window", "DayPlan",
           "plan_day"]
