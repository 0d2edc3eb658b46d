"""The many-server simulator under a calibrated law against the per-instance vLLM replay on DistServe's
measured runs (docs/fidelity.md, "The many-server simulator on the same runs").

Two implementations of one engine instance, written apart: ``fluidopt.sim``'s event kernel (its closed-form
clock, ``timelaw.iteration``) and ``fluidopt.engines``' iteration stepper (vLLM's scheduler, blocks of 16
tokens). Below saturation their rules coincide but for vLLM's batching of several waiting prompts in one
prefill iteration, which is rare at 1-2 requests/s, so the two must agree there on the real workloads.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fluidopt.calibration.timemodels import load_law_toml
from fluidopt.control.instance import RoundRobin
from fluidopt.core.model import GPUProfile, RequestClass, Scenario
from fluidopt.engines import engine_config
from fluidopt.engines.validation import compare, read_measured
from fluidopt.sim.api import simulate
from fluidopt.workloads import TraceWorkload

ROOT = Path(__file__).resolve().parents[2]
DATA = next((p / "shared/data/distserve-opt13b-a100" for p in Path(__file__).resolve().parents[2:]
             if (p / "shared/data/distserve-opt13b-a100").is_dir()), Path("/nonexistent"))
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="shared DistServe data not found")
KV = 56864  # the cache read off the runs (calibration/opt-13b-a100-vllm-overheads.toml)


def _many_server(run, law, tmp_path):
    """One GPU, round robin, whole prompts, 256 slots, the 1% watermark; the kernel's prefill emits no token,
    so its decodes are the output less the first. Returns (TTFT, TPOT) per request, s."""
    gpu = GPUProfile(alpha=law.prefill.a, beta=law.prefill.b, tau_solo=law.decode.small[0], chunk=2048, batch=256,
                     kv_capacity=float(KV), timemodel=law)
    sc = Scenario(gpu=gpu, gpus=1, classes=(RequestClass("c", prompt=500.0, decode=200.0, rate=1.0),),
                  prefill_price=0.0, decode_price=0.0)
    frame = pd.DataFrame({"time": run.arrival, "prompt": run.prompt, "output": np.maximum(run.output - 1, 1),
                          "cls": 0})
    path = tmp_path / "records.csv"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        simulate(sc, RoundRobin(chunked=False, kv_watermark=0.01), horizon=float(run.arrival[-1]) + 3600.0,
                 service="tokens", workload=TraceWorkload(frame, ("c",)), records=path, progress=False)
    rec = pd.read_csv(path).sort_values("id")
    ttft = rec.ttft.to_numpy()
    tpot = np.where(run.output > 1, (rec.end.to_numpy() - rec.arrival.to_numpy() - ttft)
                    / np.maximum(run.output - 1, 1), 0.0)
    return ttft, tpot


@needs_data
@pytest.mark.parametrize("name", ["vllm-100-1", "vllm-200-2"])
def test_the_kernel_under_the_law_agrees_with_the_vllm_replay_below_saturation(name, tmp_path):
    law = load_law_toml(ROOT / "calibration" / "opt-13b-a100-vllm-overheads.toml")
    run = read_measured(DATA / "measured" / f"{name}.exp")
    ttft, tpot = _many_server(run, law, tmp_path)
    rep = compare(run, law, engine_config("vllm", kv_tokens=KV), "vllm").to_dict()
    assert np.mean((ttft < 0.2) & (tpot < 0.1)) == pytest.approx(rep["attainment_simulated"], abs=0.015)
    assert 1e3 * np.median(ttft) == pytest.approx(rep["ttft_median_ms_simulated"], rel=0.02)
    assert 1e3 * np.median(tpot) == pytest.approx(rep["tpot_median_ms_simulated"], rel=0.02)
