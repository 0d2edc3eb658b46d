"""The engine costs a kernel-only profile leaves out, on the disaggregated replay: each prefill-side form
worked out by hand, and the fit of the default form checked on runs it was not fitted to (issue 44)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw
from fluidopt.core.errors import UsageError
from fluidopt.engines.disaggregated import PREFILL_COST_FORMS, Pool, fit_costs, replay_disaggregated

# prefill 10 ms + 1 ms per prompt token; decode step 5 ms + 1 ms per request (s), as test_disaggregated.py
LAW = IterationLaw(PrefillLaw(0.010, 0.001, 0.0), DecodeLaw((0.005, 0.0, 0.001)))
LINK = dict(kv_bytes_per_token=1000, link_bandwidth=1e6, link_latency=0.002)  # 1 ms per token + 2 ms


def _two(pre: Pool):
    """Prompts of 10 and 20 tokens, both at t = 0, two output tokens each."""
    return replay_disaggregated(pre, Pool(LAW), [0.0, 0.0], [10, 20], [2, 2], **LINK)


def test_each_prefill_cost_form_by_hand():
    # without costs the shared batch takes 0.010 + 30 x 0.001 = 0.040 (first token); the link sends r0
    # (0.012) then r1 (0.022); each decodes one step of 0.006: finish 0.058 and 0.080
    base = _two(Pool(LAW))
    assert base.first_token == pytest.approx([0.040, 0.040]) and base.finish == pytest.approx([0.058, 0.080])
    # per batch 2 ms: 0.042; per prompt 3 ms (two prompts): 0.046; per token 0.5 ms (30): 0.055
    for pool, first in ((Pool(LAW, overhead=0.002), 0.042), (Pool(LAW, prompt_overhead=0.003), 0.046),
                        (Pool(LAW, token_overhead=0.0005), 0.055)):
        s = _two(pool)
        assert s.first_token == pytest.approx([first, first])
        assert s.finish == pytest.approx(base.finish + (first - 0.040))
    # an entry latency of 5 ms shifts the whole run: TTFT + 5 ms, TPOT as without it
    s = _two(Pool(LAW, entry_latency=0.005))
    assert s.ttft == pytest.approx(base.ttft + 0.005) and s.tpot == pytest.approx(base.tpot)
    assert s.arrival == pytest.approx([0.0, 0.0])  # issue times stay the requests' own


def test_an_entry_latency_occupies_no_prefill_instance():
    # r0 (10 tokens, batch 0.020) at 0, r1 (10 tokens) at 0.010: r1 waits for r0's batch, so its TTFT is
    # 0.040 - 0.010 = 0.030. A cost of 5 ms per batch lengthens r0's batch and so r1's wait: 0.050 - 0.010
    # = 0.040 (+10 ms); 5 ms before the pool delays both arrivals alike: 0.045 - 0.015 + 0.005 = 0.035 (+5 ms)
    def ttft(pool):
        return replay_disaggregated(pool, Pool(LAW), [0.0, 0.010], [10, 10], [2, 2], **LINK).ttft

    assert ttft(Pool(LAW)) == pytest.approx([0.020, 0.030])
    assert ttft(Pool(LAW, overhead=0.005)) == pytest.approx([0.025, 0.040])
    assert ttft(Pool(LAW, entry_latency=0.005)) == pytest.approx([0.025, 0.035])


def test_fit_costs_refuses_an_unknown_form():
    with pytest.raises(UsageError, match="prefill cost form 'queue': expected one of entry, batch, prompt, token"):
        fit_costs([], Pool(LAW), Pool(LAW), kv_bytes_per_token=1.0, prefill_form="queue")


DATA = next((p / "shared/data/distserve-opt13b-a100" for p in Path(__file__).resolve().parents[2:]
             if (p / "shared/data/distserve-opt13b-a100").is_dir()), Path("/nonexistent"))


@pytest.mark.skipif(not DATA.is_dir(), reason="shared DistServe data not found")
def test_the_default_form_meets_the_acceptance_on_each_run_left_out():
    # issue 44's bounds on runs the costs were not fitted to: fit on three of DistServe's four measured runs
    # and predict the fourth. The cost per batch failed this at 12/s (median TTFT +11.8%); the entry latency
    # keeps every median within 6% (docs/fidelity.md, "Results on the four runs")
    from fluidopt.calibration.timemodels import load_distserve_profile
    from fluidopt.engines.disaggregated import model_kv_bytes
    from fluidopt.engines.validation import read_measured

    prof = DATA / "profiler-a100-80g.distserve.json"
    runs = [read_measured(DATA / f"measured/distserve-c21d11-300-{r}.exp") for r in (3, 6, 9, 12)]
    pre = Pool(load_distserve_profile(prof, "facebook/opt-13b", 2), kv_tokens=163008)
    dec = Pool(load_distserve_profile(prof, "facebook/opt-13b", 1), kv_tokens=66144)
    kv = model_kv_bytes("facebook/opt-13b")
    errs = []
    for i, run in enumerate(runs):
        dc, e = fit_costs([r for j, r in enumerate(runs) if j != i], pre, dec, kv_bytes_per_token=kv)
        assert 5e-3 < e < 8e-3 and 0.2e-3 < dc < 0.25e-3  # the entry latency and the decode cost per request
        s = replay_disaggregated(dataclasses.replace(pre, **{PREFILL_COST_FORMS["entry"][0]: e}),
                                 dataclasses.replace(dec, request_overhead=dc), run.arrival, run.prompt, run.output,
                                 kv_bytes_per_token=kv)
        errs.append(s.attainment(0.2, 0.1) - run.attainment(0.2, 0.1))
        for sim, meas in ((s.ttft, run.ttft), (s.tpot, run.tpot)):
            assert abs(np.nanmedian(sim) / np.median(meas) - 1) <= 0.06
    assert max(map(abs, errs)) <= 0.01 and np.mean(np.abs(errs)) <= 0.006
