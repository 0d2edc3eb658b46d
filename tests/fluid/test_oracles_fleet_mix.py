"""The multi-period plan's table (fluidopt/fluid/multiperiod.py, ``FleetPlan.to_frame``) on a plan written
by hand: one row per slot, the documented columns, total GPUs = base + batch."""

from __future__ import annotations

import numpy as np

from fluidopt.fluid.multiperiod import FleetPlan


def test_a_plans_table_by_hand():
    p = FleetPlan(slot=60.0, times=np.array([0.0, 60.0]), base=np.array([3.0, 4.0]), batch=np.array([1.0, 0.0]),
                  served_mixed=np.array([5.0, 6.0]), served_batch=np.array([7.0, 0.0]),
                  interactive_demand=np.array([2.5, 3.5]), gpu_hours=0.1, mu_int=1.0, mu_mix=2.0, mu_bat=3.0)
    t = p.to_frame()
    assert list(t.columns) == ["t_start", "base_gpus", "batch_gpus", "gpus", "interactive_gpus", "served_mixed",
                               "served_batch"]
    assert t.to_numpy().tolist() == [[0.0, 3.0, 1.0, 4.0, 2.5, 5.0, 7.0], [60.0, 4.0, 0.0, 4.0, 3.5, 6.0, 0.0]]
