"""Benchmark: one stand-in at speed 10 keeps the time model's schedule under load (its iterations take,
in wall time x 10, within 5% of the model's seconds)."""

from __future__ import annotations

import asyncio
import re

import httpx
import numpy as np
import pandas as pd
import pytest

from fluidopt.serving.replayer import replay_async


@pytest.mark.slow
def test_speed_10_keeps_the_model_schedule(engine_factory):
    url = engine_factory("--speed", "10")
    rng = np.random.default_rng(1)
    n = 300
    t = np.cumsum(rng.exponential(1 / 3, n))
    frame = pd.DataFrame({"time": t - t[0], "prompt": rng.integers(100, 500, n), "output": rng.integers(20, 80, n)})
    recs, _ = asyncio.run(replay_async(frame, url, speed=10, progress=False))
    assert all(r.ok for r in recs)
    text = httpx.get(url + "/metrics").text

    def metric(name):
        return float(re.search(re.escape(name) + r"\{[^}]*\} (\S+)", text).group(1))

    model = metric("fluidopt:model_busy_seconds_total")
    wall = metric("fluidopt:wall_busy_seconds_total")
    assert metric("fluidopt:iterations_total") > 3000  # ~4,300 iterations of ~23 ms (model)
    assert 0.99 <= wall * 10 / model <= 1.05, (wall * 10, model)
