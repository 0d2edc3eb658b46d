"""The reported metrics, recomputed by hand from the per-request records (docs/simulator.md section 5).

Nothing here reads the engine's counters or the metric module's helpers: every expected value is
rebuilt from the records CSV and the scenario's own numbers (token prices, class means, n, the window),
following the documented definitions:

* rates are events timed in the window ``[warmup, t_end)``, per GPU per second: bundled revenue is
  ``c_p prompt + c_d output`` per request completed in the window (``tokens``; ``markov`` uses the
  class means, w_i = c_p P_i + c_d D_i); separate revenue is ``c_p prompt`` at the first prefill
  completion (arrival + ttft) plus ``c_d output`` at the completion;
* per-request statistics use the cohort that *arrived* in the window and was resolved by t_end
  (outcome other than in_system): TPOT is (e2e - ttft) / output over its completed requests;
* a reported percentile is the geometric midpoint of a 200-per-decade log bin, hence within
  10**(1/400) - 1 (0.577%) of the exact sample percentile; the docs do not fix the sample-quantile
  definition, so a reported value passes if it is within that bound of either order statistic
  around rank q N (values under 1e-6 s count as 0).

Each check is exact up to the records' 15 significant digits (1e-9 relative), and prices differ
between prefill and decode and between classes, so a revenue priced at the wrong token or class
price, a TPOT that keeps the TTFT, or a percentile one bin off fails here (each was tried).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest

from fluidopt.control.instance import RoundRobin
from fluidopt.core.model import GPUProfile, RequestClass, Scenario
from fluidopt.sim.api import simulate
from fluidopt.workloads import TraceWarning

REL = 1e-9
BIN = 10.0 ** (1.0 / 400.0) - 1.0  # half a 200-per-decade bin, relative: 0.5773%
SHIFT = 10.0 ** (1.0 / 200.0)  # one bin

# Per-class token prices that differ from each other and from the scenario's defaults.
PRICES = {"chat": (0.3, 0.7), "summarise": (0.11, 2.5)}


def _scenario(n: int, kv: float | None, chat_rate: float, chat_decode: float) -> Scenario:
    """Two classes, loaded enough that some requests abandon (rates are per GPU)."""
    gpu = GPUProfile(alpha=0.012, beta=4e-4, tau_solo=0.01, chunk=16, batch=4, kv_capacity=kv)
    classes = (
        RequestClass("chat", prompt=30.0, decode=chat_decode, rate=chat_rate * n, patience=1.5,
                     prefill_price=PRICES["chat"][0], decode_price=PRICES["chat"][1], lengths="lognormal",
                     prompt_sigma=0.7, decode_sigma=0.8),
        RequestClass("summarise", prompt=90.0, decode=8.0, rate=3.0 * n, patience=0.6,
                     prefill_price=PRICES["summarise"][0], decode_price=PRICES["summarise"][1]),
    )
    return Scenario(gpu=gpu, gpus=n, classes=classes, prefill_price=1.0, decode_price=3.0, name="records")


def _run(tmp_path, sc, ctrl, service, horizon=80.0, warmup=15.0, seed=7):
    path = tmp_path / f"rec-{service}.csv"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        res = simulate(sc, ctrl, horizon=horizon, warmup=warmup, seed=seed, service=service, records=path,
                       batches=5)
    rec = pd.read_csv(path)
    assert len(rec) == res.totals["requests"]
    return res, rec


def _window(res, rec):
    """(in-window completions, in-window first prefills, cohort, window length)."""
    lo, hi = res.warmup, res.t_end
    done = rec[(rec.outcome == "completed") & (rec.end >= lo) & (rec.end < hi)]
    first = rec.arrival + rec.ttft  # NaN when never prefilled
    prefilled = rec[first.notna() & (first >= lo) & (first < hi)]
    cohort = rec[(rec.arrival >= lo) & (rec.arrival < hi) & (rec.outcome != "in_system")]
    return done, prefilled, cohort, hi - lo


@pytest.fixture(scope="module")
def tokens_run(tmp_path_factory):
    """Tokens mode with a KV cache (preemptions and drops on the way), round robin with chunked prefill."""
    sc = _scenario(3, kv=400.0, chat_rate=6.0, chat_decode=40.0)
    res, rec = _run(tmp_path_factory.mktemp("tok"), sc, RoundRobin(chunked=True), "tokens")
    # the run exercises what the definitions distinguish
    assert (rec.outcome == "completed").sum() > 1000
    assert (rec.outcome == "abandoned_prefill").sum() > 100 and rec.preemptions.sum() > 20
    assert (rec.outcome == "dropped").sum() > 0
    assert (rec.outcome == "in_system").sum() > 0  # requests still running at t_end: not in any cohort
    return sc, res, rec


@pytest.fixture(scope="module")
def markov_run(tmp_path_factory):
    """markov, a central decode buffer (requests abandon from both queues)."""
    sc = _scenario(4, kv=None, chat_rate=8.0, chat_decode=30.0)
    res, rec = _run(tmp_path_factory.mktemp("mkv"), sc, "reserved-prefill-fcfs", "markov", horizon=60.0, warmup=10.0,
                    seed=3)
    assert (rec.outcome == "completed").sum() > 1000 and (rec.outcome == "abandoned_prefill").sum() > 10
    assert (rec.outcome == "abandoned_decode").sum() > 100
    return sc, res, rec


def test_tokens_revenue_per_gpu_from_records(tokens_run):
    """Bundled and separate revenue, per class and cluster, from the requests' own tokens and prices."""
    sc, res, rec = tokens_run
    done, prefilled, _, W = _window(res, rec)
    nW = sc.gpus * W
    tot_b = tot_s = 0.0
    for name, (cp, cd) in PRICES.items():
        d = done[done["class"] == name]
        p = prefilled[prefilled["class"] == name]
        bundled = (cp * d.prompt.sum() + cd * d.output.sum()) / nW
        separate = (cp * p.prompt.sum() + cd * d.output.sum()) / nW
        assert bundled > 0 and separate > 0
        assert res.per_class.loc[name, "revenue_bundled"] == pytest.approx(bundled, rel=REL), name
        assert res.per_class.loc[name, "revenue_separate"] == pytest.approx(separate, rel=REL), name
        tot_b += bundled
        tot_s += separate
    assert res.cluster["revenue_per_gpu"] == pytest.approx(tot_b, rel=REL)
    assert res.cluster["revenue_per_gpu_separate"] == pytest.approx(tot_s, rel=REL)
    assert res.cluster["throughput"] == pytest.approx(len(done) / nW, rel=REL)
    assert res.cluster["window_seconds"] == pytest.approx(W, rel=1e-12)


def test_markov_revenue_uses_class_means_at_class_prices(markov_run):
    """markov: w_i = c_p,i P_i + c_d,i D_i per completion (class means, not the drawn lengths);
    separate: c_p,i P_i per first prefill completion plus c_d,i D_i per completion."""
    sc, res, rec = markov_run
    done, prefilled, _, W = _window(res, rec)
    nW = sc.gpus * W
    tot_b = tot_s = 0.0
    for c in sc.classes:
        cp, cd = PRICES[c.name]
        n_done = int((done["class"] == c.name).sum())
        n_pre = int((prefilled["class"] == c.name).sum())
        assert n_done > 100 and n_pre >= n_done - 50
        w = cp * c.prompt + cd * c.decode
        bundled = n_done * w / nW
        separate = (n_pre * cp * c.prompt + n_done * cd * c.decode) / nW
        assert res.per_class.loc[c.name, "revenue_bundled"] == pytest.approx(bundled, rel=REL), c.name
        assert res.per_class.loc[c.name, "revenue_separate"] == pytest.approx(separate, rel=REL), c.name
        assert res.per_class.loc[c.name, "throughput"] == pytest.approx(n_done / nW, rel=REL), c.name
        tot_b += bundled
        tot_s += separate
    assert res.cluster["revenue_per_gpu"] == pytest.approx(tot_b, rel=REL)
    assert res.cluster["revenue_per_gpu_separate"] == pytest.approx(tot_s, rel=REL)
    # the drawn lengths are not the rewards: the same count at actual tokens differs visibly
    d = done[done["class"] == "chat"]
    actual = (PRICES["chat"][0] * d.prompt.sum() + PRICES["chat"][1] * d.output.sum()) / nW
    assert abs(actual / res.per_class.loc["chat", "revenue_bundled"] - 1) > 1e-6


@pytest.mark.parametrize("run", ["tokens_run", "markov_run"])
def test_request_means_from_the_cohort(run, request):
    """ttft, e2e, tpot = (e2e - ttft) / output, wait_decode: means over the completed cohort;
    wait_prefill, sojourn, abandoned and dropped fractions: over the whole resolved cohort."""
    sc, res, rec = request.getfixturevalue(run)
    _, _, cohort, _ = _window(res, rec)
    for name in sc.class_names:
        c = cohort[cohort["class"] == name]
        d = c[c.outcome == "completed"]
        assert len(d) > 200
        e2e = d.end - d.arrival
        tpot = (e2e - d.ttft) / d.output
        assert tpot.min() > 0
        row = res.per_class.loc[name]
        assert row.tpot_mean == pytest.approx(tpot.mean(), rel=REL), name
        assert row.ttft_mean == pytest.approx(d.ttft.mean(), rel=REL), name
        assert row.e2e_mean == pytest.approx(e2e.mean(), rel=REL), name
        assert row.wait_decode_mean == pytest.approx(d.wait_decode.mean(), rel=REL), name
        assert row.wait_prefill_mean == pytest.approx(c.wait_prefill.mean(), rel=REL), name
        sojourn = c.end - c.arrival  # e2e, or the time to abandonment (or to a drop)
        assert row.sojourn_mean == pytest.approx(sojourn.mean(), rel=REL), name
        ab = c.outcome.isin(["abandoned_prefill", "abandoned_decode"]).mean()
        assert row.abandoned_fraction == pytest.approx(ab, rel=REL, abs=1e-15), name
        assert row.abandoned_prefill_fraction == pytest.approx((c.outcome == "abandoned_prefill").mean(),
                                                               rel=REL, abs=1e-15), name
        assert row.dropped_fraction == pytest.approx((c.outcome == "dropped").mean(), rel=REL, abs=1e-15), name
    done = cohort[cohort.outcome == "completed"]
    tpot_all = ((done.end - done.arrival - done.ttft) / done.output).mean()
    assert res.cluster["tpot_mean"] == pytest.approx(tpot_all, rel=REL)
    assert res.cluster["ttft_mean"] == pytest.approx(done.ttft.mean(), rel=REL)
    assert res.cluster["e2e_mean"] == pytest.approx((done.end - done.arrival).mean(), rel=REL)


def _rank_stats(values: np.ndarray, q: float) -> tuple[float, float]:
    """The two order statistics around rank q N (1-based ranks floor(qN) and floor(qN) + 1, clipped)."""
    v = np.sort(values)
    N = v.size
    k = math.floor(q * N)
    return float(v[min(max(k, 1), N) - 1]), float(v[min(k + 1, N) - 1])


def _accepts(reported: float, exact: float) -> bool:
    """``reported`` is what a 200-per-decade histogram may report for the sample value ``exact``."""
    if exact < 1e-6:
        return reported == 0.0
    return abs(reported / exact - 1.0) <= BIN + 1e-12


def _percentile_cases(sc, res, rec):
    _, _, cohort, _ = _window(res, rec)
    done = cohort[cohort.outcome == "completed"]
    series = {
        "ttft": lambda d: d.ttft.to_numpy(),
        "e2e": lambda d: (d.end - d.arrival).to_numpy(),
        "tpot": lambda d: ((d.end - d.arrival - d.ttft) / d.output).to_numpy(),
    }
    for name in sc.class_names:
        d = done[done["class"] == name]
        for metric, f in series.items():
            for q, tag in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
                yield f"{metric}_{tag}[{name}]", res.per_class.loc[name, f"{metric}_{tag}"], f(d), q
        w = cohort[cohort["class"] == name].wait_prefill.dropna().to_numpy()
        for q, tag in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
            yield f"wait_prefill_{tag}[{name}]", res.per_class.loc[name, f"wait_prefill_{tag}"], w, q
    yield "ttft_p99[all]", res.cluster["ttft_p99"], series["ttft"](done), 0.99
    for q, tag in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        yield f"e2e_{tag}[all]", res.cluster[f"e2e_{tag}"], series["e2e"](done), q


@pytest.mark.parametrize("run", ["tokens_run", "markov_run"])
def test_percentiles_within_half_a_bin_of_the_sample(run, request):
    """Every reported p50/p90/p99 (ttft, e2e, tpot, wait_prefill; per class and cluster) is within
    0.577% of an order statistic at its rank; and the data make the check sharp: for most of them a
    value one bin higher or lower (x 10**(+-1/200), 1.16%) would be rejected (counted here)."""
    sc, res, rec = request.getfixturevalue(run)
    n_cases = n_sharp_up = n_sharp_down = 0
    for what, reported, values, q in _percentile_cases(sc, res, rec):
        assert values.size > 200, what
        lo, hi = _rank_stats(values, q)
        assert _accepts(reported, lo) or _accepts(reported, hi), (
            f"{what}: reported {reported!r}, order statistics at rank {q} x {values.size}: {lo!r}, {hi!r}")
        n_cases += 1
        if reported > 0:
            n_sharp_up += not (_accepts(reported * SHIFT, lo) or _accepts(reported * SHIFT, hi))
            n_sharp_down += not (_accepts(reported / SHIFT, lo) or _accepts(reported / SHIFT, hi))
    assert n_cases == 2 * 12 + 4
    # (a p99 has few samples above it, so its two order statistics can lie a bin apart; a p50 of waits
    # can be 0: those cannot tell a one-bin shift from a change of quantile definition, the rest can)
    assert n_sharp_up >= n_cases // 2 and n_sharp_down >= n_cases // 2
