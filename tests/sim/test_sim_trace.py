"""A real trace (Azure LLM inference 2023, conversation) runs end to end through simulate."""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd
import pytest

from fluidopt.core.model import Scenario, paper_gpu
from fluidopt.sim.api import simulate
from fluidopt.workloads import TraceWarning
from fluidopt.workloads.traces import classes_from_trace, load_azure_trace

TRACE = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_conv.csv"

pytestmark = pytest.mark.skipif(not TRACE.is_file(), reason=f"trace not available at {TRACE}")


@pytest.mark.integration
@pytest.mark.parametrize("service,policy", [("tokens", "round-robin"), ("markov", "fi-wsp")])
def test_azure_trace_end_to_end(tmp_path, service, policy):
    trace = load_azure_trace(TRACE, classes="thresholds", max_requests=3000)
    classes = classes_from_trace(trace, patience=0.05)
    sc = Scenario(gpu=paper_gpu(), gpus=4, classes=tuple(classes), prefill_price=0.1, decode_price=0.2,
                  name="azure-conv")
    horizon = trace.duration + 1.0
    rec = tmp_path / "rec.csv"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        res = simulate(sc, policy, horizon=horizon, warmup=60.0, seed=0, service=service, workload=trace, records=rec)
    t = res.totals
    assert t["requests"] == trace.n_requests == 3000
    assert t["requests"] == t["completed"] + t["abandoned"] + t["dropped"] + t["in_system"]
    df = pd.read_csv(rec).sort_values("id")
    # the replayed requests are the trace's rows, in order, with their own token counts
    assert df.prompt.tolist() == trace.prompt.tolist()
    assert df.output.tolist() == trace.output.tolist()
    assert df.arrival.to_numpy() == pytest.approx(trace.time)
    assert t["completed"] > 0.5 * t["requests"]
