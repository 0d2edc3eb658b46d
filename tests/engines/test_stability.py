"""Li-Dai-Peng's stability boundary, checked by the engine stepper (docs/theory.md, theorem 1).

Closed forms are worked out in each test from the scenario's numbers; the simulated boundaries use the
checker's own growth test at 99% confidence with 20,000 requests (seed 0), about a second each."""

from __future__ import annotations

import pytest

from fluidopt.core.errors import UsageError
from fluidopt.engines.stability import (
    SCENARIOS,
    check_rate,
    closed_form_boundary,
    get_scenario,
    prefill_first_boundary,
    stability_boundary,
)


def test_closed_forms_by_hand():
    s = SCENARIOS["short"]
    # b = 256, t_b = 0.005 + 5e-5 * 256 = 0.0178 s, m_p = (16 + 112) / 2 = 64, m_d = (2 + 64) / 2 - 1 = 32
    assert closed_form_boundary(s) == pytest.approx(256 / (0.0178 * 96), rel=1e-12)
    c = SCENARIOS["counterexample"]
    # t_b = 0.010 + 2e-5 * 512 = 0.02024 s; m_p + m_d = 300 + 100
    assert closed_form_boundary(c) == pytest.approx(512 / (0.02024 * 400), rel=1e-12)
    # prefill-first: one 300-token prompt per prefill iteration (0.016 s), 100 decodes at t_b / b each
    assert prefill_first_boundary(c) == pytest.approx(1 / (0.016 + 100 * 0.02024 / 512), rel=1e-12)


@pytest.mark.parametrize("name", ["short", "long", "mixed"])
def test_work_conserving_boundary_matches_li_dai_peng(name):
    s = SCENARIOS[name]
    r = stability_boundary(s, "chunked", requests=20000, seed=0)
    assert abs(r.relative_error) < 0.03
    by_load = {round(c.load, 2): c for c in r.checks}
    assert not by_load[0.95].unstable  # stable at 0.95 lam* ...
    assert by_load[1.05].unstable  # ... and not at 1.05 lam*, at 99% confidence
    # in overload a work-conserving engine serves at lam* exactly (full iterations of b tokens)
    assert r.throughput_saturated == pytest.approx(r.boundary_closed_form, rel=0.01)


def test_prefill_first_counterexample_loses_capacity():
    s = SCENARIOS["counterexample"]
    lam = closed_form_boundary(s)
    assert not check_rate(s, "chunked", 0.9 * lam).unstable
    assert check_rate(s, "vllm", 0.9 * lam).unstable
    # its own boundary sits near the heavy-traffic formula, 21% below lam*
    r = stability_boundary(s, "vllm", rates=[0.7 * lam, 0.85 * lam], requests=20000)
    assert r.boundary_simulated == pytest.approx(prefill_first_boundary(s), rel=0.03)


def test_bad_input_is_one_line():
    with pytest.raises(UsageError, match="smaller than the longest prompt"):
        stability_boundary(SCENARIOS["mixed"], "vllm")
    with pytest.raises(UsageError, match="no such engine"):
        stability_boundary(SCENARIOS["short"], "vlm")
    with pytest.raises(UsageError, match="expected requests/s > 0"):
        stability_boundary(SCENARIOS["short"], "chunked", rates=[1.0, 0.0])
    with pytest.raises(UsageError, match="did you mean 'short'"):
        get_scenario("shrt")


def test_cli_json_names_scripts_rely_on(capsys, tmp_path):
    import json

    from fluidopt.cli import main

    s = SCENARIOS["short"]
    lam = closed_form_boundary(s)
    code = main(["stability", "short", "--json", "--out", str(tmp_path), "--requests", "5000",
                 "--rates", f"{0.5 * lam},{1.5 * lam}"])
    obj = json.loads(capsys.readouterr().out)
    assert code == 0
    assert obj["boundary_closed_form"] == pytest.approx(lam, rel=1e-12)
    assert 0.5 * lam < obj["boundary_simulated"] < 1.5 * lam
    assert (tmp_path / "stability-short-chunked-b256.png").stat().st_size > 1000
