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


def test_a_mix_too_small_for_the_interactive_load_names_its_cap_and_types():
    from pathlib import Path

    import pytest
    from fluidopt.errors import InfeasibleError

    from fluidopt.fluid.multiperiod import BacklogJob, plan_fleet_mix
    from fluidopt.scenario import load_scenario

    sc = load_scenario(Path(__file__).resolve().parents[2] / "examples/scenarios/chiron-workflow-mix.toml")
    # 30 interactive requests/s need 30 / 6.864 = 4.4 'fast' instances (tests/planning/test_fleet_mix.py), or
    # more of the slower 'cheap' ones: 2 instances serve neither
    with pytest.raises(InfeasibleError) as e:
        plan_fleet_mix(sc, [BacklogJob("batch", 100_000, 300.0, 3900.0)], end=4200.0, slot=60.0, max_gpus=2)
    assert str(e.value) == ("plan_fleet_mix: no fleet of at most 2 instances of types fast, cheap serves the "
                            "interactive load and finishes the backlog in time")
    assert e.value.conflicting == ("max_gpus", "deadline")


def test_a_slot_without_interactive_load_serves_none_and_the_cheaper_type_per_request_takes_the_rest():
    from pathlib import Path

    import pytest

    from fluidopt.fluid.multiperiod import plan_fleet_mix
    from fluidopt.scenario import load_scenario

    sc = load_scenario(Path(__file__).resolve().parents[2] / "examples/scenarios/chiron-workflow-mix.toml")
    p = plan_fleet_mix(sc, [], end=180.0, slot=60.0, interactive_rate=[30.0, 0.0, 12.0])
    fast, cheap = p.types
    # per interactive request/s: fast costs 2.0 / mu_int, cheap 1.2 / mu_int (per hour); fast is cheaper here
    assert fast.price_per_hour / fast.rates.mu_int < cheap.price_per_hour / cheap.rates.mu_int
    np.testing.assert_allclose(p.interactive[0], np.array([30.0, 0.0, 12.0]) / fast.rates.mu_int, rtol=1e-6)
    np.testing.assert_allclose(p.interactive[1], 0.0, atol=1e-9)
    # requests served per slot and type: rate x 60 s, all on fast; none (not NaN) in the empty slot
    np.testing.assert_array_equal(np.isfinite(p.served_interactive), True)
    np.testing.assert_allclose(p.served_interactive, [[1800.0, 0.0, 720.0], [0.0, 0.0, 0.0]], atol=1e-6)
    assert p.cost == pytest.approx(60.0 * 2.0 * (42.0 / fast.rates.mu_int) / 3600.0, rel=1e-6)


def test_uncalibrated_type_rates_are_the_fluid_estimates_by_hand():
    """calibrated=False: each type's rates are the fluid estimates (tests/control/test_oracles_orchestration.py's
    ``thr``, the iteration law of the orchestration module's docstring), not the simulator's saturated
    throughputs. 'fast' is that GPU law (tau_mix = 0.0174 + 6.2e-5 x 256, 1.5e-6 s per resident token,
    1 / 45.45 s solo) with B = 128."""
    import math
    from pathlib import Path

    import pytest

    from fluidopt.fluid.multiperiod import type_rates
    from fluidopt.scenario import load_scenario

    tau_mix, tau_solo = 0.0174 + 6.2e-5 * 256, 1 / 45.45

    def thr(b, P, D):
        chunks = math.ceil(P / 256)
        f = b / D * chunks
        kv = 1.5e-6 * b * (P + D / 2)
        if f >= 1:
            return 1 / (chunks * (tau_mix + kv))
        return (b / D) / (f * tau_mix + (1 - f) * tau_solo + kv)

    sc = load_scenario(Path(__file__).resolve().parents[2] / "examples/scenarios/chiron-workflow-mix.toml")
    fast, cheap = type_rates(sc, calibrated=False)
    assert not fast.rates.calibrated and not cheap.rates.calibrated
    # interactive limit: the 0.06 s ITL on the longer mean context, 300 + 400 / 2 = 500 -> b = 35; batch: B - 1
    r = fast.rates
    assert (r.b_int, r.b_bat) == (35, 127)
    assert r.mu_int == pytest.approx(thr(35, 300, 100), rel=1e-12)
    assert r.mu_mix == pytest.approx(thr(35, 300, 400), rel=1e-12)
    assert r.mu_bat == pytest.approx(thr(127, 300, 400), rel=1e-12)
    assert type_rates(sc)[0].rates.calibrated
