"""``fluidopt simulate --trace`` on the Mooncake file as shipped (issue 42, step 3): the JSON totals that
scripts rely on, the prefix cache on by default and off with --no-prefix-cache, --speedup K < 1."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fluidopt.cli import main

_DATA = Path(os.environ.get("FLUIDOPT_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared/data"))
MOONCAKE = _DATA / "mooncake-traces/conversation_trace.jsonl"
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"shared Mooncake trace not found at {MOONCAKE}")]


def _json(capsys, *extra: str) -> dict:
    capsys.readouterr()
    argv = ["simulate", "--trace", str(MOONCAKE), "--policy", "round-robin", "--gpus", "8", "--service", "tokens",
            "--json", *extra]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_the_json_has_the_cache_totals_and_the_fluid_load(capsys):
    on = _json(capsys, "--horizon", "300")
    off = _json(capsys, "--horizon", "300", "--no-prefix-cache")
    for d in (on, off):
        assert {"prompt_tokens", "cached_prompt_tokens", "fluid_load"} <= set(d)
        assert 0.0 < d["fluid_load"] < 1.0
    assert on["fluid_load"] == off["fluid_load"]  # cache-blind
    assert 0 < on["cached_prompt_tokens"] < on["prompt_tokens"]
    assert on["hit_ratio"] == pytest.approx(on["cached_prompt_tokens"] / on["prompt_tokens"])
    assert sum(i["cached_prompt_tokens"] for i in on["instances"]) == on["cached_prompt_tokens"]
    assert off["cached_prompt_tokens"] == 0 and "instances" not in off and "hit_ratio" not in off
    assert on["classes"][0]["prompt_tokens"] > 0 and "hit_ratio" in on["classes"][0]


def test_a_speedup_below_one_stretches_time(capsys):
    # with K = 0.5 the horizon of 200 s holds the arrivals of the trace's first 100 s, and the load halves
    raw = [json.loads(line)["timestamp"] for line in MOONCAKE.read_text().splitlines() if line.strip()]
    slow = _json(capsys, "--horizon", "200", "--speedup", "0.5")
    fast = _json(capsys, "--horizon", "100")
    assert slow["requests"] == fast["requests"] == sum(1 for t in raw if t < 100_000)
    assert slow["fluid_load"] == pytest.approx(fast["fluid_load"] / 2, rel=0.02)
