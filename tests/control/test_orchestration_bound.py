"""The 100,000-request workflow against the calibrated multi-period bound (issue 31): every controller
uses at least the LP's GPU-hours for the work it completed, and Chiron meets both SLOs. The file's
workflow runs as `fluidopt simulate` runs it (no workload built by hand)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fluidopt.fluid.multiperiod import BacklogJob, plan_fleet
from fluidopt.scenario import load_scenario
from fluidopt.sim.api import simulate

WORKFLOW = Path(__file__).resolve().parents[2] / "examples/scenarios/chiron-workflow.toml"


def bound(sc, n: float) -> float:
    """The calibrated LP's fewest GPU-hours for n batch requests at minute 5 due at minute 65."""
    return plan_fleet(sc, [BacklogJob("batch", n, 300.0, 3900.0)], end=sc.workflow.horizon, slot=60.0,
                      utilisation=1.0).gpu_hours


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["chiron", "fluid-plan", "utilisation-autoscaler", "qlm"])
def test_no_controller_below_the_calibrated_bound(policy):
    sc = load_scenario(WORKFLOW)
    res = simulate(sc, policy, horizon=sc.workflow.horizon, seed=1, service="tokens")
    pc = res.per_class
    met = int(pc.loc["batch", "slo_met"])
    assert res.gpu_hours >= bound(sc, met)  # no controller below the bound for the work it did in time
    if policy == "chiron":
        lb = bound(sc, 100_000)
        assert lb == pytest.approx(19.27, abs=0.01)
        assert pc.loc["interactive", "slo_attainment"] >= 0.99 and pc.loc["batch", "slo_attainment"] >= 0.99
        # measured (docs/orchestration.md section 5): 1.23x the bound (1.22-1.24 over seeds 1-5) with the
        # mixed instances at the batch limit while they hold batch work only and the surplus ones lent to
        # the backlog; issue 31's target is 1.25x
        assert 1.0 < res.gpu_hours / lb <= 1.25
