"""The many-server simulator under a calibrated law against the per-instance vLLM replay on DistServe's
measured runs (docs/fidelity.md, "The many-server simulator on the same runs"; ``fluidopt validate
--many-server``).

Two implementations of one engine instance, written apart: ``fluidopt.sim``'s event kernel (its closed-form
clock, ``timelaw.iteration``; ``fluidopt.sim.measured.replay_on_kernel``) and ``fluidopt.engines``' iteration
stepper (vLLM's scheduler, blocks of 16 tokens). Below saturation their rules coincide but for vLLM's batching
of several waiting prompts in one prefill iteration, which is rare at 1-2 requests/s, so the two must agree
there on the real workloads.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fluidopt.calibration.timemodels import load_law_toml
from fluidopt.cli import main
from fluidopt.core.errors import UsageError
from fluidopt.engines import engine_config
from fluidopt.engines.validation import compare, read_measured
from fluidopt.sim.measured import replay_on_kernel

ROOT = Path(__file__).resolve().parents[2]
DATA = next((p / "shared/data/distserve-opt13b-a100" for p in Path(__file__).resolve().parents[2:]
             if (p / "shared/data/distserve-opt13b-a100").is_dir()), Path("/nonexistent"))
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="shared DistServe data not found")
LAW = ROOT / "calibration" / "opt-13b-a100-vllm-overheads.toml"
KV = 56864  # the cache read off the runs (that file's [engine] kv_tokens)


@needs_data
@pytest.mark.parametrize("name", ["vllm-100-1", "vllm-200-2"])
def test_the_kernel_under_the_law_agrees_with_the_vllm_replay_below_saturation(name):
    law = load_law_toml(LAW)
    run = read_measured(DATA / "measured" / f"{name}.exp")
    cfg = engine_config("vllm", kv_tokens=KV)
    kernel = replay_on_kernel(law, cfg, run.arrival, run.prompt, run.output)
    rep = compare(run, law, cfg, "vllm").to_dict()
    assert kernel.attainment(0.2, 0.1) == pytest.approx(rep["attainment_simulated"], abs=0.015)
    assert 1e3 * np.median(kernel.ttft) == pytest.approx(rep["ttft_median_ms_simulated"], rel=0.02)
    assert 1e3 * np.median(kernel.tpot) == pytest.approx(rep["tpot_median_ms_simulated"], rel=0.02)


def test_one_request_alone_is_the_laws_prefill_then_its_decode_steps():
    # P = 100, D = 4 on an idle GPU: first token after a_p + b_p P + c_p P^2; then 3 decode steps of one request
    # whose context is 100, 101, 102 tokens: a_d + b_d T + c_d each; a prompt over max_model_len is rejected
    law = load_law_toml(LAW)
    cfg = engine_config("vllm", kv_tokens=KV)
    out = replay_on_kernel(law, cfg, [0.0, 50.0], [100, 3000], [4, 5])
    a, b, c = law.prefill.a, law.prefill.b, law.prefill.c
    ad, bd, cd = law.decode.small
    assert out.first_token[0] == pytest.approx(a + b * 100 + c * 100 ** 2, rel=1e-12)
    steps = sum(ad + bd * T + cd for T in (100, 101, 102))
    assert out.finish[0] == pytest.approx(out.first_token[0] + steps, rel=1e-12)
    assert np.isnan(out.first_token[1]) and np.isnan(out.finish[1])
    with pytest.raises(UsageError, match="no kernel counterpart"):
        replay_on_kernel(law, engine_config("chunked"), [0.0], [10], [2])


@needs_data
def test_validate_many_server_json(capsys):
    capsys.readouterr()
    assert main(["validate", str(DATA / "measured" / "vllm-100-1.exp"), "--timemodel", str(LAW), "--many-server",
                 "--no-figure", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["simulator"] == "many-server" and d["engine"] == "vllm" and d["kv_tokens"] == KV
    for k in ("attainment_measured", "attainment_simulated", "ttft_median_ms_measured", "ttft_median_ms_simulated",
              "tpot_median_ms_measured", "tpot_median_ms_simulated"):
        assert isinstance(d[k], float)
