"""Shared pieces of the RL tests: tiny hand-built scenarios and workloads."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from fluidopt.scenario import scenario_from_dict
from fluidopt.workloads import TraceWorkload

ROOT = Path(__file__).resolve().parents[2]
RL_SCENARIO = ROOT / "examples" / "scenarios" / "rl-router-v100.toml"


def tiny_scenario(gpus: int = 2, batch: int = 8, kv: float | None = 100000.0):
    """Llama-2-7B/V100-like instances with a small batch; two classes: short and long outputs."""
    gpu = {"alpha": 0.017, "beta": 3.2e-4, "tau_solo": 0.017, "chunk": 256, "batch": batch}
    if kv is not None:
        gpu.update(kv_capacity=kv, kv_time_per_token=7e-7)
    return scenario_from_dict({
        "name": "tiny-rl",
        "gpu": gpu,
        "cluster": {"gpus": gpus},
        "classes": [{"name": "short", "prompt": 50, "decode": 20, "rate": 5.0},
                    {"name": "long", "prompt": 50, "decode": 3000, "rate": 0.1}],
    })


def blocked_workload(batch: int = 8, n_short: int = 120, gap: float = 0.1, long_out: int = 6000):
    """``batch`` long decodes at t ~ 0 (to be pinned to instance 0), then short requests every ``gap`` s."""
    rows = [(0.001 * i, 50, long_out, 1) for i in range(batch)]
    rows += [(0.05 + gap * i, 50, 20, 0) for i in range(n_short)]
    df = pd.DataFrame(rows, columns=["time", "prompt", "output", "cls"])
    return TraceWorkload(df, ("short", "long"), name="blocked")


def blocked_env(**kw):
    """A RouterEnv on tiny_scenario() where instance 0 is kept full: its 8 slots hold 6,000-token decodes
    (~100 s), pinned there; 40 short requests follow. Needs gymnasium (imported here, not at module level)."""
    from fluidopt.rl.env import RouterEnv

    return RouterEnv(tiny_scenario(), workload=blocked_workload(batch=8, n_short=40), pin={i: 0 for i in range(8)},
                     max_time=30.0, **kw)


@pytest.fixture
def tiny():
    return tiny_scenario()
