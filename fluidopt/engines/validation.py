"""Measured runs of real engines, replayed through :mod:`fluidopt.engines` and compared request by request.

A measured run is read from DistServe's ``.exp`` format (its first line a Python literal: a list of one
dict per request with ``prompt_len``, ``output_len``, ``issue_time``, ``ttft_ms``, ``tpot_ms``,
``latency_ms``; the lines after it, a run summary, are ignored) or from a CSV with those same columns.
:func:`compare` replays the run's own arrivals and lengths and returns the errors; :func:`fit_to_runs`
fits a law (and the KV capacity) to measured runs where no profile predicts them well enough.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fluidopt.calibration.timemodels import DecodeLaw, IterationLaw, PrefillLaw
from fluidopt.core.errors import TraceError
from fluidopt.core.files import read_text_file
from fluidopt.engines import EngineConfig, Replay, replay

FIELDS = ("prompt_len", "output_len", "issue_time", "ttft_ms", "tpot_ms", "latency_ms")


@dataclass(frozen=True)
class MeasuredRun:
    """One measured run, requests in arrival order. ``arrival`` in s from the first arrival; ``ttft``,
    ``tpot``, ``e2e`` in s; lengths in tokens."""

    name: str
    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    ttft: np.ndarray
    tpot: np.ndarray
    e2e: np.ndarray

    def attainment(self, ttft_slo: float, tpot_slo: float) -> float:
        """Share of requests with TTFT < ``ttft_slo`` and TPOT < ``tpot_slo`` (s)."""
        return float(np.mean((self.ttft < ttft_slo) & (self.tpot < tpot_slo)))


def _bad(path: Path, what: str) -> TraceError:
    return TraceError(f"measured file {str(path)!r}: {what}")


def read_measured(path: str | Path) -> MeasuredRun:
    """Read a measured run (``.exp`` or CSV, by content: a first line opening a Python list is ``.exp``).
    Anything else raises :class:`TraceError` in one line naming the file."""
    p = Path(path)
    text = read_text_file(p, "measured", TraceError)
    first = text.split("\n", 1)[0].strip()
    if first.startswith("["):
        try:
            rows = ast.literal_eval(first)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise _bad(p, "the first line is not a Python literal (expected DistServe's .exp format: a list of "
                          "one dict per request)") from None
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise _bad(p, "the first line is not a list of dicts (DistServe's .exp format)")
        cols = {k: [r.get(k) for r in rows] for k in FIELDS}
    else:
        import io

        import pandas as pd

        try:
            df = pd.read_csv(io.StringIO(text), comment="#", skipinitialspace=True)
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError):
            df = None
        if df is None or not all(c in df.columns for c in FIELDS):
            raise _bad(p, "not a measured run: expected DistServe's .exp format (a Python list on the first line) "
                          f"or a CSV with columns {', '.join(FIELDS)}")
        cols = {k: df[k].tolist() for k in FIELDS}
    n = len(cols["issue_time"])
    if n == 0:
        raise _bad(p, "no requests")
    arr: dict[str, np.ndarray] = {}
    for k in FIELDS:
        vals = cols[k]
        for i, v in enumerate(vals):
            if v is None:
                raise _bad(p, f"request {i + 1}: {k} is missing")
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
                raise _bad(p, f"request {i + 1}: {k} = {v!r}: expected a finite number")
            if k != "issue_time" and (v < 0 or (k in ("prompt_len", "output_len") and (v < 1 or v != int(v)))):
                raise _bad(p, f"request {i + 1}: {k} = {v!r}: expected "
                              + ("a whole number of tokens >= 1" if k.endswith("_len") else "a time >= 0"))
        arr[k] = np.asarray(vals, dtype=float)
    order = np.argsort(arr["issue_time"], kind="stable")
    t = arr["issue_time"][order]
    return MeasuredRun(
        name=p.stem, arrival=t - t[0], prompt=arr["prompt_len"][order].astype(np.int64),
        output=arr["output_len"][order].astype(np.int64), ttft=arr["ttft_ms"][order] / 1e3,
        tpot=arr["tpot_ms"][order] / 1e3, e2e=arr["latency_ms"][order] / 1e3)


@dataclass(frozen=True)
class Comparison:
    """A measured run beside its replay; :meth:`to_dict` holds the numbers (ms and shares)."""

    run: MeasuredRun
    sim: Replay
    engine: str
    ttft_slo: float  # s
    tpot_slo: float  # s

    def to_dict(self) -> dict[str, Any]:
        m, s = self.run, self.sim
        d: dict[str, Any] = {"run": m.name, "engine": self.engine, "requests": int(len(m.arrival)),
                             "slo_ttft_ms": self.ttft_slo * 1e3, "slo_tpot_ms": self.tpot_slo * 1e3,
                             "attainment_measured": m.attainment(self.ttft_slo, self.tpot_slo),
                             "attainment_simulated": s.attainment(self.ttft_slo, self.tpot_slo)}
        for name, meas, sim in (("ttft", m.ttft, s.ttft), ("tpot", m.tpot, s.tpot), ("e2e", m.e2e, s.e2e)):
            with np.errstate(invalid="ignore", divide="ignore"):
                rel = np.abs(sim - meas) / meas
            rel = rel[np.isfinite(rel)]
            d[f"{name}_median_ms_measured"] = float(np.median(meas) * 1e3)
            d[f"{name}_median_ms_simulated"] = float(np.nanmedian(sim) * 1e3)
            d[f"{name}_relerr_median"] = float(np.median(rel)) if rel.size else None
            d[f"{name}_relerr_p90"] = float(np.quantile(rel, 0.9)) if rel.size else None
        d["attainment_error"] = d["attainment_simulated"] - d["attainment_measured"]
        d["preemptions_simulated"] = int(s.preemptions.sum())
        d["rejected_simulated"] = int(np.isnan(s.finish).sum())
        return d

    def figure(self):
        """Measured against simulated CDFs of TTFT, TPOT and E2E (ms), SLOs dashed."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker

        fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
        m, s = self.run, self.sim
        for ax, (name, a, b, slo) in zip(axes, (("TTFT", m.ttft, s.ttft, self.ttft_slo),
                                               ("TPOT", m.tpot, s.tpot, self.tpot_slo),
                                               ("E2E", m.e2e, s.e2e, None))):
            for vals, label, style in ((a, "measured", "-"), (b, f"simulated ({self.engine})", "--")):
                v = np.sort(vals[np.isfinite(vals)]) * 1e3
                ax.plot(v, np.arange(1, len(v) + 1) / len(v), style, label=label)
            if slo is not None:
                ax.axvline(slo * 1e3, color="grey", lw=0.8, ls=":")
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # 2x10^2-style labels collide
            ax.set_xlabel(f"{name} (ms)")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("share of requests")
        axes[0].legend(fontsize=8, loc="lower right")
        fig.suptitle(self.run.name, fontsize=10)
        fig.tight_layout()
        return fig


def compare(run: MeasuredRun, law: IterationLaw, cfg: EngineConfig, engine: str = "",
            ttft_slo: float = 0.2, tpot_slo: float = 0.1) -> Comparison:
    """Replay ``run``'s arrivals and lengths on one instance and pair the outcome with the measurement."""
    return Comparison(run, replay(law, cfg, run.arrival, run.prompt, run.output), engine, ttft_slo, tpot_slo)


def fit_to_runs(runs: Sequence[MeasuredRun], law: IterationLaw, make_cfg, kv_tokens: float, *,
                ttft_slo: float = 0.2, tpot_slo: float = 0.1, max_evals: int = 1500, scan: bool = True):
    """Fit a law to measured runs end to end, where no profile predicts them: the prefill intercept and
    per-token term, the decode intercept, per-context-token and per-request terms (one decode triple, no
    batch-size switch) and the KV capacity (tokens), starting from ``law`` and ``kv_tokens``. The prefill
    quadratic term is kept from ``law``. ``make_cfg(kv_tokens)`` builds the engine settings.

    The objective (Nelder-Mead, deterministic) sums over the runs the squared attainment error in units
    of 0.04 and the squared log-ratios of the median TTFT and TPOT in units of 0.15, plus a steep penalty
    on attainment errors above 0.06 and log-ratios above 0.12, and on a mean attainment error above 0.03.
    With ``scan`` the simplex starts from the best of a coarse scan of the per-request decode term (0.1 to
    0.6 ms); without it, from ``law`` as given.
    Returns ``(law, kv_tokens)``."""
    from scipy.optimize import minimize

    targets = [(r.attainment(ttft_slo, tpot_slo), float(np.median(r.ttft)), float(np.median(r.tpot))) for r in runs]
    small = law.decode.small

    def build(th):
        pa, pb, da, db, dc, kv = th
        return (IterationLaw(PrefillLaw(pa * 1e-3, pb * 1e-3, law.prefill.c), DecodeLaw((da * 1e-3, db * 1e-6, dc * 1e-3)),
                             name="fitted to measured runs"), kv * 1e3)

    def loss(th):
        if min(th) < 0:
            return 1e12
        lw, kv = build(th)
        cfg = make_cfg(kv)
        total, att = 0.0, []
        for run, (am, tm, pm) in zip(runs, targets):
            s = replay(lw, cfg, run.arrival, run.prompt, run.output)
            ea = s.attainment(ttft_slo, tpot_slo) - am
            et = math.log(max(float(np.nanmedian(s.ttft)), 1e-9) / tm)
            ep = math.log(max(float(np.nanmedian(s.tpot)), 1e-9) / pm)
            att.append(abs(ea))
            total += (ea / 0.04) ** 2 + (et / 0.15) ** 2 + (ep / 0.15) ** 2
            total += 1e4 * (max(0.0, abs(ea) - 0.06) ** 2 + max(0.0, abs(et) - 0.12) ** 2 + max(0.0, abs(ep) - 0.12) ** 2)
        return total + 1e4 * len(runs) * max(0.0, float(np.mean(att)) - 0.03) ** 2

    x0 = [law.prefill.a * 1e3, law.prefill.b * 1e3, small[0] * 1e3, small[1] * 1e6, small[2] * 1e3, kv_tokens / 1e3]
    # From a kernel-only profile the simplex stalls in a valley where a steeper prefill stands in for the
    # engine's per-request cost of a decode step (sampling, detokenising, streaming: about 0.4 ms per request
    # for vLLM 0.2 against the profile's 0.06); so it starts from the best of a coarse scan of that term.
    starts = [x0[:4] + [c] + x0[5:] for c in (x0[4], 0.1, 0.2, 0.3, 0.4, 0.5, 0.6)]
    x0 = min(starts, key=loss) if scan else x0
    res = minimize(loss, x0, method="Nelder-Mead", options=dict(maxfev=max_evals, xatol=1e-4, fatol=1e-3))
    return build(res.x)


def kv_ceiling(runs: Sequence[MeasuredRun], block_size: int = 16, watermark: float = 0.01) -> int:
    """The KV capacity (tokens) that measured runs show, read off their timestamps rather than fitted: the
    most tokens the running requests held at once, in blocks of ``block_size``, divided by ``1 - watermark``
    (a prompt is admitted only while it leaves that share free), rounded up to a block.

    A request holds its prompt plus the tokens generated so far between its first token and its completion;
    the count in between is interpolated linearly (a steady decode), and the peak is taken at the first
    tokens, where admissions push it up. This is a lower bound, and the capacity itself when a run fills
    the cache (queues that build while the held tokens plateau, as at 3 and 4 requests/s in DistServe's
    vLLM runs)."""
    peak = 0
    for r in runs:
        first, end = r.arrival + r.ttft, r.arrival + r.e2e
        span = np.maximum(end - first, 1e-12)
        for t in first:
            on = (first <= t) & (end > t)
            made = 1 + (t - first[on]) / span[on] * (r.output[on] - 1)
            held = np.ceil((r.prompt[on] + made) / block_size).sum() * block_size
            peak = max(peak, int(held))
    return int(math.ceil(peak / (1 - watermark) / block_size) * block_size)


def with_overheads(law: IterationLaw, per_request: float = 0.0, per_iteration: float = 0.0) -> IterationLaw:
    """``law`` plus an engine's own costs that a kernel profile does not see: ``per_request`` s added to every
    decode step per running request (both batch-size regimes' ``c``: the CPU work per sequence, i.e.
    sampling, detokenising, streaming) and ``per_iteration`` s added to every iteration (the prefill
    intercept and both decode intercepts: scheduling, preparing inputs)."""
    d, p = law.decode, law.prefill
    grow = lambda t: None if t is None else (t[0] + per_iteration, t[1], t[2] + per_request)  # noqa: E731
    return IterationLaw(PrefillLaw(p.a + per_iteration, p.b, p.c), DecodeLaw(grow(d.small), grow(d.large), d.threshold),
                        name=f"{law.name} + {per_request * 1e3:g} ms/request/step + {per_iteration * 1e3:g} ms/iteration")


@dataclass(frozen=True)
class OverheadFit:
    """:func:`fit_overheads`' result: ``per_request`` (s per running request per decode step),
    ``per_iteration`` (s per iteration), ``kv_tokens`` and the law with them; ``loss``: the objective."""

    law: IterationLaw
    per_request: float
    per_iteration: float
    kv_tokens: int | None
    loss: float


def _run_errors(run: MeasuredRun, sim: Replay, ttft_slo: float, tpot_slo: float) -> tuple[float, float, float]:
    """Attainment error and log-ratios of the median TTFT and TPOT, simulated against measured."""
    ea = sim.attainment(ttft_slo, tpot_slo) - run.attainment(ttft_slo, tpot_slo)
    et = math.log(max(float(np.nanmedian(sim.ttft)), 1e-9) / float(np.median(run.ttft)))
    ep = math.log(max(float(np.nanmedian(sim.tpot)), 1e-9) / max(float(np.median(run.tpot)), 1e-9))
    return ea, et, ep


def fit_overheads(runs: Sequence[MeasuredRun], profile: IterationLaw, make_cfg, kv_tokens: int | None, *,
                  ttft_slo: float = 0.2, tpot_slo: float = 0.1, per_iteration: bool = False,
                  per_request_max: float = 1e-3, per_iteration_max: float = 5e-3) -> OverheadFit:
    """Calibrate a kernel profile to an engine with few parameters: the profile as given, plus a per-request
    cost of a decode step (s per running request, in ``[0, per_request_max]``) and, with ``per_iteration``,
    a cost per iteration (s, in ``[0, per_iteration_max]``); see :func:`with_overheads`. The KV capacity is
    not fitted: give it (``kv_tokens``; :func:`kv_ceiling` reads it off measured runs that fill the cache).
    ``make_cfg(kv_tokens)`` builds the engine settings.

    The objective sums over the runs the squared attainment error in units of 0.04 and the squared
    log-ratios of the median TTFT and TPOT in units of 0.15 (issue 43's targets). Attainment moves in steps
    of one request, so the search is a grid, deterministic: steps of 1/20 of each range, then steps of
    1/100 around the best point (0.01 ms per request and 0.05 ms per iteration with the defaults)."""
    cfg = make_cfg(kv_tokens)

    def loss(c: float, h: float) -> float:
        lw = with_overheads(profile, c, h)
        total = 0.0
        for run in runs:
            ea, et, ep = _run_errors(run, replay(lw, cfg, run.arrival, run.prompt, run.output), ttft_slo, tpot_slo)
            total += (ea / 0.04) ** 2 + (et / 0.15) ** 2 + (ep / 0.15) ** 2
        return total

    cs = np.linspace(0.0, per_request_max, 21)
    hs = np.linspace(0.0, per_iteration_max, 21) if per_iteration else np.zeros(1)
    best = min((loss(c, h), c, h) for c in cs for h in hs)
    dc, dh = per_request_max / 100, per_iteration_max / 100
    fine_c = [c for c in best[1] + dc * np.arange(-5, 6) if 0 <= c <= per_request_max]
    fine_h = [h for h in best[2] + dh * np.arange(-5, 6) if 0 <= h <= per_iteration_max] if per_iteration else [0.0]
    best = min([best] + [(loss(c, h), c, h) for c in fine_c for h in fine_h])
    total, c, h = best
    c, h = round(float(c), 12), round(float(h), 12)
    return OverheadFit(with_overheads(profile, c, h), c, h, kv_tokens, float(total))


def leave_one_out(runs: Sequence[MeasuredRun], profile: IterationLaw, make_cfg, kv_tokens: int | None = None, *,
                  ttft_slo: float = 0.2, tpot_slo: float = 0.1, per_iteration: bool = False,
                  block_size: int = 16, watermark: float = 0.01, engine: str = "vllm",
                  ) -> list[tuple[OverheadFit, Comparison]]:
    """The generalisation test of :func:`fit_overheads`: for each run, fit on the others (the KV capacity
    ``kv_tokens``, or when None :func:`kv_ceiling` of the others) and replay the run left out with that fit.
    Returns one ``(fit, comparison)`` per run, in order."""
    out = []
    for i, run in enumerate(runs):
        rest = [r for j, r in enumerate(runs) if j != i]
        kv = kv_tokens if kv_tokens is not None else kv_ceiling(rest, block_size, watermark)
        fit = fit_overheads(rest, profile, make_cfg, kv, ttft_slo=ttft_slo, tpot_slo=tpot_slo,
                            per_iteration=per_iteration)
        out.append((fit, compare(run, fit.law, make_cfg(kv), engine, ttft_slo, tpot_slo)))
    return out
