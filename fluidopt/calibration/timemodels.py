"""Iteration-time laws beyond the straight line: a prefill law quadratic in prompt length and a decode
law in context tokens and batch size, with their composition for mixed iterations.

Units: every coefficient is in seconds (``a``: s; ``b``: s per token; ``c``: s per token^2 for prefill,
s per request for decode); lengths and context in tokens. DistServe's profile JSON is in milliseconds
and :func:`load_distserve_profile` converts it.

* :class:`PrefillLaw`: ``a + b * sum(l) + c * sum(l^2)`` for a batch of prompts of lengths ``l``;
* :class:`DecodeLaw`: ``a + b * T + c * B`` for a decode step of ``B`` requests holding ``T`` context
  tokens in all, with one coefficient triple below ``threshold`` requests and another at or above it
  (DistServe's ``decoding_smallbs`` / ``decoding_largebs``);
* :class:`IterationLaw`: both, and the composition rule for an iteration that runs prefill work and
  decodes together (:meth:`IterationLaw.mixed`): **the prefill intercept plus the variable terms of
  both laws**; the decode intercept is not paid a second time, because one iteration launches the
  model once. A prompt chunk of ``l`` tokens whose first ``o`` tokens are already in the KV cache pays
  the quadratic (attention) term ``c * ((o + l)^2 - o^2)``, which is ``c * l^2`` for a whole prompt.

The project's straight line ``tau = alpha + beta * C`` (mixed) / ``tau_solo`` (decode-only) is the
special case ``PrefillLaw(alpha, beta, 0)`` with ``DecodeLaw(tau_solo, 0, 0)``
(:meth:`IterationLaw.straight_line`): the rule above then gives ``alpha + beta * C`` exactly.

Fitting both forms from a profile CSV is :func:`fit_time_models` (statsmodels OLS, 95% confidence
intervals, held-out error).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fluidopt.core.errors import CalibrationError
from fluidopt.core.files import read_text_file


def _coef(where: str, name: str, value: object, scale: float = 1.0) -> float:
    if value is None:
        raise CalibrationError(f"{where}: {name} is missing; expected a number >= 0")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CalibrationError(f"{where}: {name} = {value!r}: expected a number >= 0")
    x = float(value)
    if not math.isfinite(x) or x < 0:
        raise CalibrationError(f"{where}: {name} = {value!r}: expected a finite number >= 0")
    return x * scale


def _triple(where: str, name: str, value: object, scale: float = 1.0) -> tuple[float, float, float]:
    if value is None:
        raise CalibrationError(f"{where}: {name} is missing; expected three coefficients [a, b, c]")
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise CalibrationError(f"{where}: {name} = {value!r}: expected three coefficients [a, b, c]")
    a, b, c = (_coef(where, f"{name}[{i}]", v, scale) for i, v in enumerate(value))
    return a, b, c


@dataclass(frozen=True)
class PrefillLaw:
    """Seconds of a prefill iteration over prompts of lengths ``l_i`` (tokens):
    ``a + b * sum(l_i) + c * sum(l_i^2)``; ``a`` in s, ``b`` in s/token, ``c`` in s/token^2."""

    a: float
    b: float
    c: float = 0.0

    def __post_init__(self) -> None:
        for k in ("a", "b", "c"):
            _coef("prefill law", k, getattr(self, k))

    def time(self, lengths: Sequence[int]) -> float:
        """Seconds to prefill the whole prompts ``lengths`` (tokens) in one iteration."""
        s = s2 = 0
        for n in lengths:
            s += n
            s2 += n * n
        return self.a + self.b * s + self.c * s2

    def variable(self, tokens: float, attention: float) -> float:
        """The part above the intercept, seconds: ``b * tokens + c * attention``, where ``attention`` is
        the sum over chunks of ``(o + l)^2 - o^2`` (tokens^2)."""
        return self.b * tokens + self.c * attention


@dataclass(frozen=True)
class DecodeLaw:
    """Seconds of a decode step of ``B`` requests holding ``T`` context tokens: ``a + b * T + c * B``
    with ``small = (a, b, c)`` when ``B < threshold`` and ``large`` otherwise (s, s/token, s/request)."""

    small: tuple[float, float, float]
    large: tuple[float, float, float] | None = None
    threshold: int = 0  # requests; 0 (or large None): ``small`` at every batch size

    def __post_init__(self) -> None:
        object.__setattr__(self, "small", _triple("decode law", "small", list(self.small)))
        if self.large is not None:
            object.__setattr__(self, "large", _triple("decode law", "large", list(self.large)))
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, int) or self.threshold < 0:
            raise CalibrationError(f"decode law: threshold = {self.threshold!r}: expected an integer >= 0 (requests)")

    def coefficients(self, batch: int) -> tuple[float, float, float]:
        """The (a, b, c) in force for a batch of ``batch`` requests."""
        if self.large is not None and batch >= self.threshold:
            return self.large
        return self.small

    def time(self, context: float, batch: int) -> float:
        """Seconds of a decode-only step of ``batch`` requests holding ``context`` tokens in all."""
        a, b, c = self.coefficients(batch)
        return a + b * context + c * batch

    def variable(self, context: float, batch: int) -> float:
        """The part above the intercept, seconds."""
        _, b, c = self.coefficients(batch)
        return b * context + c * batch


@dataclass(frozen=True)
class IterationLaw:
    """Prefill and decode laws of one engine instance, and their composition (module docstring)."""

    prefill: PrefillLaw
    decode: DecodeLaw
    name: str = field(default="", compare=False)

    @classmethod
    def straight_line(cls, alpha: float, beta: float, tau_solo: float, name: str = "") -> IterationLaw:
        """The project's law: mixed ``alpha + beta * C``, decode-only ``tau_solo`` (seconds)."""
        return cls(PrefillLaw(alpha, beta, 0.0), DecodeLaw((tau_solo, 0.0, 0.0)), name=name)

    @classmethod
    def from_gpu_profile(cls, profile: Any) -> IterationLaw:
        """The straight line of a :class:`~fluidopt.core.model.GPUProfile` (its KV term is not carried)."""
        return cls.straight_line(profile.alpha, profile.beta, profile.tau_solo, name=profile.name)

    def prefill_time(self, lengths: Sequence[int]) -> float:
        """Seconds of an iteration that prefills the whole prompts ``lengths`` and nothing else."""
        return self.prefill.time(lengths)

    def decode_time(self, context: float, batch: int) -> float:
        """Seconds of a decode-only iteration."""
        return self.decode.time(context, batch)

    def mixed(self, tokens: float, attention: float, context: float, batch: int) -> float:
        """Seconds of an iteration with ``tokens`` prompt tokens (``attention`` = sum of
        ``(o + l)^2 - o^2`` over its chunks) and ``batch`` decodes holding ``context`` tokens: the prefill
        intercept once, plus both variable terms. With no prompt tokens it is the decode law; with no
        decodes, the prefill law."""
        if tokens <= 0:
            return self.decode.time(context, batch)
        t = self.prefill.a + self.prefill.variable(tokens, attention)
        if batch > 0:
            t += self.decode.variable(context, batch)
        return t

    def to_dict(self) -> dict[str, Any]:
        """Coefficients in seconds, in the layout of :func:`law_from_table`."""
        d: dict[str, Any] = {"prefill": [self.prefill.a, self.prefill.b, self.prefill.c],
                             "decode_small": list(self.decode.small)}
        if self.decode.large is not None:
            d["decode_large"] = list(self.decode.large)
            d["decode_threshold"] = self.decode.threshold
        return d


def straight_line_at(law: IterationLaw, batch: int, classes: Sequence[Any],
                     second_moments: Sequence[tuple[float, float]] | None = None) -> tuple[float, float, float]:
    """The paper's straight line ``(alpha, beta, tau_solo)`` (seconds) that ``law`` gives on a full GPU, for the
    fluid LP of a scenario whose simulator runs the law.

    A full GPU holds ``batch`` requests: a decode-only iteration runs B decodes, a mixed one a prompt chunk
    beside B - 1 decodes. A decode of D tokens after a prompt of P holds P + k tokens at its k-th iteration,
    so the mean context T of a decode iteration, over the classes' decode iterations, is
    ``sum(rate (E[D] E[P] + (E[D^2] - E[D]) / 2)) / sum(rate E[D])``. Then::

        tau_solo = a_d + b_d B T + c_d B                    (the triple in force for B)
        alpha    = a_p + b_d (B - 1) T + c_d (B - 1)        (the triple in force for B - 1)
        beta     = b_p + c_p P2,   P2 = sum(rate E[P^2]) / sum(rate E[P])

    A prompt of P tokens in n chunks costs ``n a_p + b_p P + c_p P^2`` under the law (plus the decodes beside
    it) and ``n alpha + beta P`` on the line, so with P2 the line carries the classes' whole prefill work,
    attention included. ``classes``: objects with ``prompt``, ``decode`` (means) and ``rate``
    (:class:`~fluidopt.core.model.RequestClass`); ``second_moments``: ``(E[P^2], E[D^2])`` per class
    (tokens^2; a scenario's come from its length distributions), None for fixed lengths."""
    if second_moments is None:
        second_moments = [(float(c.prompt) ** 2, float(c.decode) ** 2) for c in classes]
    w = [(float(c.rate), float(c.prompt), float(c.decode), float(p2), float(d2))
         for c, (p2, d2) in zip(classes, second_moments)]
    pw = sum(r * p for r, p, _, _, _ in w)
    dw = sum(r * d for r, _, d, _, _ in w)
    if pw <= 0 or dw <= 0:
        raise CalibrationError("straight line from a law: the classes carry no prompt or no decode tokens "
                               "(rate x prompt and rate x decode must be > 0)")
    P2 = sum(r * p2 for r, _, _, p2, _ in w) / pw
    T = sum(r * (d * p + (d2 - d) / 2) for r, p, d, _, d2 in w) / dw
    B = int(batch)
    tau_solo = law.decode.time(B * T, B)
    alpha = law.prefill.a + (law.decode.variable((B - 1) * T, B - 1) if B > 1 else 0.0)
    beta = law.prefill.b + law.prefill.c * P2
    return alpha, beta, tau_solo


# ------------------------------------------------------------------------------------------------
# Loading
# ------------------------------------------------------------------------------------------------
def load_distserve_profile(path: str | Path, model: str, tp: int) -> IterationLaw:
    """The law of ``model`` at tensor-parallel degree ``tp`` from DistServe's profiler JSON
    (``{model: {tp: {prefill, decoding_smallbs, decoding_largebs, decoding_large_small_bs_threshold}}}``,
    milliseconds), converted to seconds. Any problem raises :class:`CalibrationError` in one line naming
    the file."""
    p = Path(path)
    text = read_text_file(p, "profile", CalibrationError)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CalibrationError(f"profile file {str(p)!r}: not JSON ({e.msg}, line {e.lineno}); expected "
                               "DistServe's profiler JSON") from None
    if not isinstance(data, dict):
        raise CalibrationError(f"profile file {str(p)!r}: expected a JSON object of models, got "
                               f"{type(data).__name__}")
    if model not in data or not isinstance(data[model], dict):
        from fluidopt.core.errors import did_you_mean

        known = ", ".join(sorted(map(str, data))) or "none"
        raise CalibrationError(f"profile file {str(p)!r}: no model {model!r}{did_you_mean(model, list(data))} "
                               f"(models: {known})")
    by_tp = data[model]
    if str(tp) not in by_tp or not isinstance(by_tp[str(tp)], dict):
        raise CalibrationError(f"profile file {str(p)!r}: model {model!r} has no TP degree {tp} "
                               f"(degrees: {', '.join(sorted(by_tp, key=str)) or 'none'})")
    entry = by_tp[str(tp)]
    where = f"profile file {str(p)!r}, {model} TP {tp}"
    ms = 1e-3
    prefill = _triple(where, "prefill", entry.get("prefill"), ms)
    small = _triple(where, "decoding_smallbs", entry.get("decoding_smallbs"), ms)
    large = entry.get("decoding_largebs")
    threshold = entry.get("decoding_large_small_bs_threshold")
    if large is not None:
        large = _triple(where, "decoding_largebs", large, ms)
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
            raise CalibrationError(f"{where}: decoding_large_small_bs_threshold = {threshold!r}: expected an "
                                   "integer >= 1 (requests)")
    return IterationLaw(PrefillLaw(*prefill), DecodeLaw(small, large, int(threshold or 0)),
                        name=f"{model} TP {tp} ({p.name})")


def law_from_table(table: Mapping[str, Any], where: str = "timemodel") -> IterationLaw:
    """The law from a scenario-style TOML table, in seconds::

        [timemodel]
        prefill = [0.022, 1.4e-4, 8.1e-9]        # a (s), b (s/token), c (s/token^2)
        decode_small = [0.0235, 5.9e-7, 6.1e-5]  # a (s), b (s/context token), c (s/request)
        decode_large = [0.0202, 4.9e-7, 1.2e-4]  # optional, from decode_threshold requests on
        decode_threshold = 95

    Unknown keys, missing or negative coefficients raise :class:`CalibrationError` naming the key."""
    if not isinstance(table, Mapping):
        raise CalibrationError(f"{where}: expected a table, got {type(table).__name__}")
    known = ("prefill", "decode_small", "decode_large", "decode_threshold", "name")
    for k in table:
        if k not in known:
            raise CalibrationError(f"{where}: unknown key {k!r}; expected {', '.join(known)}")
    prefill = _triple(where, "prefill", table.get("prefill"))
    small = _triple(where, "decode_small", table.get("decode_small"))
    large = table.get("decode_large")
    threshold = table.get("decode_threshold", 0)
    if large is not None:
        large = _triple(where, "decode_large", large)
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
            raise CalibrationError(f"{where}: decode_threshold = {threshold!r}: expected an integer >= 1 (requests) "
                                   "with decode_large")
    return IterationLaw(PrefillLaw(*prefill), DecodeLaw(small, large, int(threshold)), name=str(table.get("name", "")))


def _time_model_toml(path: str | Path, table: str) -> tuple[IterationLaw, dict]:
    """The law of a TOML file's ``[table]`` and the file's whole content."""
    import tomllib

    p = Path(path)
    text = read_text_file(p, "time-model", CalibrationError)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise CalibrationError(f"time-model file {str(p)!r}: not valid TOML: {' '.join(str(e).split())}") from None
    if table not in data:
        raise CalibrationError(f"time-model file {str(p)!r}: no [{table}] table")
    return law_from_table(data[table], where=f"{p}: [{table}]"), data


def load_law_toml(path: str | Path, table: str = "timemodel") -> IterationLaw:
    """:func:`law_from_table` of the ``[table]`` of a TOML file."""
    return _time_model_toml(path, table)[0]


def load_time_model_file(path: str | Path) -> tuple[IterationLaw, int | None]:
    """A time-model file as ``fluidopt validate --fit-overheads`` writes it (and ``validate`` and ``simulate
    --timemodel`` read it): the law of its ``[timemodel]`` table (seconds) and its ``[engine] kv_tokens``, the
    instance's KV cache in tokens (None when absent). Any problem raises :class:`CalibrationError` in one line
    naming the file."""
    law, data = _time_model_toml(path, "timemodel")
    engine = data.get("engine", {})
    kv = engine.get("kv_tokens") if isinstance(engine, dict) else None
    if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1):
        raise CalibrationError(f"time-model file {str(Path(path))!r}: [engine] kv_tokens = {kv!r}: expected an "
                               "integer >= 1")
    return law, kv


# ------------------------------------------------------------------------------------------------
# Fitting
# ------------------------------------------------------------------------------------------------
PROFILE_COLUMNS = ("kind", "tokens", "tokens_sq", "batch", "context", "iteration_seconds")


def read_profile_csv(path: str | Path):
    """A generalised profile CSV (``#`` comments allowed), one row per measured iteration:

    ``kind``               ``prefill`` or ``decode``
    ``tokens``             prefill: sum of the prompt lengths (tokens); decode: 0
    ``tokens_sq``          prefill: sum of the squared prompt lengths (tokens^2); decode: 0
    ``batch``              requests in the iteration
    ``context``            decode: context tokens held by the batch; prefill: 0
    ``iteration_seconds``  wall time, s (> 0)
    """
    import io

    import pandas as pd

    p = Path(path)
    text = read_text_file(p, "profile", CalibrationError)
    try:
        raw = pd.read_csv(io.StringIO(text), comment="#", skipinitialspace=True)
    except (pd.errors.EmptyDataError, pd.errors.ParserError) as e:
        raise CalibrationError(f"profile file {str(p)!r}: not a CSV: {e}") from None
    raw.columns = [str(c).strip() for c in raw.columns]
    for c in PROFILE_COLUMNS:
        if c not in raw.columns:
            raise CalibrationError(f"profile file {str(p)!r}: missing column {c!r}; expected {', '.join(PROFILE_COLUMNS)}")
    kind = raw["kind"].astype(str).str.strip().str.lower()
    bad = ~kind.isin(["prefill", "decode"])
    if bad.any():
        r = int(np.flatnonzero(bad.to_numpy())[0])
        raise CalibrationError(f"profile file {str(p)!r}: data row {r + 1}: kind = {raw['kind'].iloc[r]!r}: expected "
                               "prefill or decode")
    out = pd.DataFrame({"kind": kind})
    for c in PROFILE_COLUMNS[1:]:
        v = pd.to_numeric(raw[c], errors="coerce")
        badv = ~np.isfinite(v.to_numpy(dtype=float)) | (v.to_numpy(dtype=float) < 0)
        if badv.any():
            r = int(np.flatnonzero(badv)[0])
            raise CalibrationError(f"profile file {str(p)!r}: data row {r + 1}: {c} = {raw[c].iloc[r]!r}: expected a "
                                   "number >= 0")
        out[c] = v.astype(float)
    if (out["iteration_seconds"] <= 0).any():
        r = int(np.flatnonzero((out["iteration_seconds"] <= 0).to_numpy())[0])
        raise CalibrationError(f"profile file {str(p)!r}: data row {r + 1}: iteration_seconds must be > 0")
    return out


@dataclass(frozen=True)
class LawFit:
    """One fitted form: the law, the coefficient names, estimates, 95% confidence intervals (s units of
    each coefficient), R^2 per part and the held-out mean relative error (a share, 0.02 = 2%)."""

    form: str  # "straight-line" or "generalised"
    law: IterationLaw
    coefficients: dict[str, float]
    ci: dict[str, tuple[float, float]]
    r2: dict[str, float]
    heldout_rel_error: float
    n_train: int
    n_test: int

    def to_dict(self) -> dict[str, Any]:
        return {"form": self.form, "law": self.law.to_dict(), "coefficients": self.coefficients,
                "ci95": {k: list(v) for k, v in self.ci.items()}, "r2": self.r2,
                "heldout_mean_relative_error": self.heldout_rel_error, "n_train": self.n_train, "n_test": self.n_test}


@dataclass(frozen=True)
class TimeModelFits:
    """Both forms fitted to one profile; ``better`` names the one with the smaller held-out error."""

    straight: LawFit
    general: LawFit

    @property
    def better(self) -> str:
        return self.general.form if self.general.heldout_rel_error <= self.straight.heldout_rel_error else self.straight.form

    def to_dict(self) -> dict[str, Any]:
        return {"straight_line": self.straight.to_dict(), "generalised": self.general.to_dict(), "better": self.better}

    def summary(self) -> str:
        lines = []
        for f in (self.straight, self.general):
            lines.append(f"{f.form}: held-out mean relative error {100 * f.heldout_rel_error:.2f}% "
                         f"({f.n_train} iterations fitted, {f.n_test} held out)")
            for k, v in f.coefficients.items():
                lo, hi = f.ci[k]
                lines.append(f"  {k:<16} {v: .6g}   95% CI [{lo:.6g}, {hi:.6g}]")
            lines.append("  R^2 " + ", ".join(f"{k} {v:.5f}" for k, v in f.r2.items()))
        lines.append(f"better on held-out iterations: {self.better}")
        lines.append("units: a in s, b in s/token (prefill) or s/context token (decode), c in s/token^2 (prefill) "
                     "or s/request (decode)")
        return "\n".join(lines)


def _ols(X: np.ndarray, y: np.ndarray, names: Sequence[str], what: str):
    import statsmodels.api as sm

    if len(y) <= X.shape[1]:
        raise CalibrationError(f"{what}: {len(y)} iterations, need more than {X.shape[1]} to fit {', '.join(names)}")
    res = sm.OLS(y, X).fit()
    ci = res.conf_int(alpha=0.05)
    return res, {n: float(v) for n, v in zip(names, res.params)}, {n: (float(lo), float(hi)) for n, (lo, hi) in zip(names, ci)}


def _decode_design(d) -> np.ndarray:
    return np.column_stack([np.ones(len(d)), d["context"].to_numpy(), d["batch"].to_numpy()])


def fit_time_models(data, *, threshold: int | None = None, holdout: float = 0.2, seed: int = 0) -> TimeModelFits:
    """Fit the straight line (prefill ``alpha + beta * tokens``, decode the mean ``tau_solo``) and the
    generalised law (prefill ``a + b * tokens + c * tokens_sq``; decode ``a + b * context + c * batch``
    split at ``threshold`` requests) to a profile (a path or the frame of :func:`read_profile_csv`) by OLS.

    A share ``holdout`` of the iterations (drawn with ``seed``) is kept out of the fit and scores both
    forms by their mean relative error there; the coefficients reported come from the training rows.
    ``threshold`` None searches the measured batch sizes for the split with the smallest decode residual
    (no split when it does not help)."""
    if not (0 <= holdout < 1):
        raise CalibrationError(f"holdout = {holdout!r}: expected a share in [0, 1)")
    if isinstance(data, (str, Path)):
        data = read_profile_csv(data)
    rng = np.random.default_rng(seed)
    test = rng.random(len(data)) < holdout if holdout > 0 else np.zeros(len(data), bool)
    train, held = data[~test], data[test]
    pre, dec = train[train["kind"] == "prefill"], train[train["kind"] == "decode"]
    if len(pre) == 0 or len(dec) == 0:
        raise CalibrationError("profile: need both prefill and decode iterations to fit a law")
    y_pre = pre["iteration_seconds"].to_numpy()
    y_dec = dec["iteration_seconds"].to_numpy()

    # straight line
    res_s, coef_s, ci_s = _ols(np.column_stack([np.ones(len(pre)), pre["tokens"].to_numpy()]), y_pre,
                               ("alpha", "beta"), "prefill iterations")
    tau = float(y_dec.mean())
    se = float(y_dec.std(ddof=1) / math.sqrt(len(y_dec))) if len(y_dec) > 1 else float("nan")
    coef_s["tau_solo"] = tau
    ci_s["tau_solo"] = (tau - 1.96 * se, tau + 1.96 * se)
    straight = IterationLaw.straight_line(max(coef_s["alpha"], 0.0), max(coef_s["beta"], 0.0), tau)
    r2_s = {"prefill": float(res_s.rsquared), "decode": 0.0}

    # generalised
    res_p, coef_p, ci_p = _ols(np.column_stack([np.ones(len(pre)), pre["tokens"].to_numpy(), pre["tokens_sq"].to_numpy()]),
                               y_pre, ("prefill_a", "prefill_b", "prefill_c"), "prefill iterations")
    batches = dec["batch"].to_numpy()

    def fit_split(th: int | None):
        parts = [("decode_small", dec)] if th is None else [("decode_small", dec[batches < th]),
                                                              ("decode_large", dec[batches >= th])]
        out = []
        for name, part in parts:
            names = (f"{name}_a", f"{name}_b", f"{name}_c")
            out.append(_ols(_decode_design(part), part["iteration_seconds"].to_numpy(), names, f"{name} iterations"))
        return out

    if threshold is None:
        best, best_ssr = None, sum(r.ssr for r, _, _ in fit_split(None))
        for th in np.unique(batches)[1:]:
            lo, hi = (batches < th).sum(), (batches >= th).sum()
            if lo < 5 or hi < 5:
                continue
            ssr = sum(r.ssr for r, _, _ in fit_split(int(th)))
            if ssr < best_ssr * (1 - 1e-9):
                best, best_ssr = int(th), ssr
        threshold = best
    fits = fit_split(threshold)
    coef_g, ci_g, r2_g = dict(coef_p), dict(ci_p), {"prefill": float(res_p.rsquared)}
    for _res, c, ci in fits:
        coef_g.update(c)
        ci_g.update(ci)
    r2_g["decode"] = float(fits[0][0].rsquared) if len(fits) == 1 else float(
        1 - sum(r.ssr for r, _, _ in fits) / float(((y_dec - y_dec.mean()) ** 2).sum() or 1.0))
    clip = lambda xs: tuple(max(x, 0.0) for x in xs)  # noqa: E731 -- a law's coefficients are >= 0
    small = clip(list(fits[0][1].values()))
    large = clip(list(fits[1][1].values())) if len(fits) == 2 else None
    general = IterationLaw(PrefillLaw(*clip(list(coef_p.values()))), DecodeLaw(small, large, int(threshold or 0)))
    if threshold is not None:
        coef_g["decode_threshold"] = float(threshold)
        ci_g["decode_threshold"] = (float(threshold), float(threshold))

    def score(law: IterationLaw) -> float:
        if len(held) == 0:
            return float("nan")
        pred = np.where(held["kind"] == "prefill",
                        [law.prefill.a + law.prefill.variable(t, s) for t, s in zip(held["tokens"], held["tokens_sq"])],
                        [law.decode_time(c, int(b)) for c, b in zip(held["context"], held["batch"])])
        y = held["iteration_seconds"].to_numpy()
        return float(np.mean(np.abs(pred - y) / y))

    n_test = int(test.sum())
    return TimeModelFits(
        LawFit("straight-line", straight, coef_s, ci_s, r2_s, score(straight), len(train), n_test),
        LawFit("generalised", general, coef_g, ci_g, r2_g, score(general), len(train), n_test),
    )


def profile_points(law: IterationLaw, *, prefill_batches: Sequence[Sequence[int]] | None = None,
                   decode_points: Sequence[tuple[int, int]] | None = None):
    """Noise-free profile rows (the :func:`read_profile_csv` frame) generated from ``law``: one prefill
    row per batch of prompt lengths, one decode row per ``(batch, context)``. For tests and examples."""
    import pandas as pd

    if prefill_batches is None:
        prefill_batches = [[n] for n in (16, 64, 128, 256, 512, 768, 1024, 1536, 2048)] + [[128, 256], [512, 512, 64]]
    if decode_points is None:
        decode_points = [(b, b * ctx) for b in (1, 2, 4, 8, 16, 32, 64, 94, 95, 128, 160, 200, 256)
                         for ctx in (128, 512, 1024)]
    rows = [{"kind": "prefill", "tokens": float(sum(ls)), "tokens_sq": float(sum(x * x for x in ls)),
             "batch": float(len(ls)), "context": 0.0, "iteration_seconds": law.prefill_time(ls)} for ls in prefill_batches]
    rows += [{"kind": "decode", "tokens": 0.0, "tokens_sq": 0.0, "batch": float(b), "context": float(c),
              "iteration_seconds": law.decode_time(c, b)} for b, c in decode_points]
    return pd.DataFrame(rows)
