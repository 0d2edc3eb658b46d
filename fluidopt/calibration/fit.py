"""Calibration: fit the iteration-time law tau = alpha + beta * C from measured iterations.

A *mixed* iteration runs one prefill chunk of C tokens alongside the decodes of a GPU's batch and
takes ``tau = alpha + beta * C`` seconds (docs/model.md); a decode-only (*solo*) iteration
takes ``tau_solo`` seconds. :func:`fit_iteration_time` estimates alpha and beta by ordinary least
squares (statsmodels) on the mixed rows of a raw measurement table and the mean ``tau_solo`` on its
decode-only rows, with standard errors, 95% confidence intervals, R^2 and residual diagnostics.

Named, already fitted profiles live in ``calibration/profiles.toml`` (installed as the package
``fluidopt.profiles``): :func:`load_profile` turns one into a :class:`~fluidopt.core.model.GPUProfile`,
:func:`list_profiles` tabulates them.

The raw measurement format (CSV, ``#`` comments allowed) is documented in docs/calibration.md:

``chunk_tokens``       prefill tokens processed in the iteration (0 for a decode-only iteration)
``iteration_seconds``  wall time of the iteration, seconds (> 0)
``decodes``            optional: decode streams in the batch (integer >= 0)
``mode``               optional: ``mixed`` or ``solo`` (solo rows must have chunk_tokens = 0)

statsmodels and matplotlib are imported lazily so that loading a named profile stays cheap.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from fluidopt.core.errors import CalibrationError, ScenarioError
from fluidopt.core.files import read_text_file
from fluidopt.core.model import GPUProfile

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

REQUIRED_COLUMNS = ("chunk_tokens", "iteration_seconds")
OPTIONAL_COLUMNS = ("decodes", "mode")
MODES = ("mixed", "solo")
MIN_MIXED_ROWS = 3  # two parameters plus at least one residual degree of freedom
CONFIDENCE = 0.95
_NA_STRINGS = {"", "nan", "na", "n/a", "null", "none"}



# ------------------------------------------------------------------------------------------------
# Raw measurements
# ------------------------------------------------------------------------------------------------
def _data_line_numbers(text: str) -> list[int]:
    """1-based file line numbers of the CSV data rows (header, blank and ``#`` lines skipped)."""
    lines = [i for i, line in enumerate(text.splitlines(), start=1) if line.split("#", 1)[0].strip()]
    return lines[1:]


def read_measurements(source: str | Path | pd.DataFrame) -> pd.DataFrame:
    """Read and validate raw iteration-time measurements from a CSV path or a DataFrame.

    Returns a clean DataFrame with float columns ``chunk_tokens`` (tokens) and
    ``iteration_seconds`` (s), an integer ``decodes`` column when the input has one, and a ``mode``
    column (``mixed``/``solo``; derived from ``chunk_tokens`` when absent). Its index locates each
    row in the input: the file line number (index name ``line``) for a CSV, the original index
    label (name ``row``) for a DataFrame. Other columns are ignored. Raises
    :class:`CalibrationError` naming the column, the row and the value for any bad input.
    """
    if isinstance(source, pd.DataFrame):
        raw = source.copy()
        prefix = ""
        raw.index = pd.Index(list(source.index), name="row")
    else:
        path = Path(source)
        prefix = f"{path}: "
        text = read_text_file(path, "calibration", CalibrationError)
        import io

        try:
            raw = pd.read_csv(io.StringIO(text), comment="#", dtype=str, keep_default_na=False, skipinitialspace=True)
        except pd.errors.EmptyDataError:
            raise CalibrationError(
                f"{prefix}no header line; expected a CSV with columns {', '.join(REQUIRED_COLUMNS)}"
            ) from None
        except pd.errors.ParserError as e:
            raise CalibrationError(f"{prefix}not a valid CSV file: {e}") from None
        lines = _data_line_numbers(text)
        if len(lines) == len(raw):
            raw.index = pd.Index(lines, name="line")
        else:  # unusual quoting; fall back to data-row numbers (1-based)
            raw.index = pd.Index(range(1, len(raw) + 1), name="row")
    raw.columns = [str(c).strip() for c in raw.columns]
    missing = [c for c in REQUIRED_COLUMNS if c not in raw.columns]
    if missing:
        raise CalibrationError(
            f"{prefix}missing column {missing[0]!r}; expected columns {', '.join(REQUIRED_COLUMNS)} "
            f"(optional: {', '.join(OPTIONAL_COLUMNS)}), found {', '.join(map(repr, raw.columns)) or 'none'}"
        )
    where = f"{prefix}{raw.index.name}"

    out = pd.DataFrame(index=raw.index)
    out["chunk_tokens"] = _numeric_column(raw, "chunk_tokens", where)
    out["iteration_seconds"] = _numeric_column(raw, "iteration_seconds", where)
    c = out["chunk_tokens"]
    bad = out.index[(c < 0) | (c != c.round()) | (c > 2**31 - 1)]
    if len(bad):
        r = bad[0]
        raise CalibrationError(
            f"{where} {r}: chunk_tokens = {float(out.at[r, 'chunk_tokens'])!r}: expected a whole number of tokens "
            ">= 0 (0 for a decode-only iteration)"
        )
    bad = out.index[out["iteration_seconds"] <= 0]
    if len(bad):
        r = bad[0]
        raise CalibrationError(
            f"{where} {r}: iteration_seconds = {float(out.at[r, 'iteration_seconds'])!r}: expected a time in seconds > 0"
        )
    if "decodes" in raw.columns:
        dec = _numeric_column(raw, "decodes", where)
        bad = dec.index[(dec < 0) | (dec != np.floor(dec))]
        if len(bad):
            r = bad[0]
            raise CalibrationError(f"{where} {r}: decodes = {float(dec[r])!r}: expected an integer >= 0 (decode streams)")
        out["decodes"] = dec.astype(np.int64)
    derived = np.where(out["chunk_tokens"] > 0, "mixed", "solo")
    if "mode" in raw.columns:
        mode = raw["mode"].astype(object)
        for r, v in mode.items():
            s = "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v).strip().lower()
            if s not in MODES:
                raise CalibrationError(f"{where} {r}: mode = {v!r}: expected one of {', '.join(MODES)}")
            c = float(out.at[r, "chunk_tokens"])
            if s == "solo" and c > 0:
                raise CalibrationError(
                    f"{where} {r}: mode = 'solo' but chunk_tokens = {c!r}; a decode-only iteration has chunk_tokens = 0"
                )
            if s == "mixed" and c == 0:
                raise CalibrationError(
                    f"{where} {r}: mode = 'mixed' but chunk_tokens = 0; a mixed iteration runs a prefill chunk > 0"
                )
        out["mode"] = mode.map(lambda v: str(v).strip().lower()).astype(object)
    else:
        out["mode"] = pd.Series(derived, index=out.index, dtype=object)
    return out


def _numeric_column(raw: pd.DataFrame, col: str, where: str) -> pd.Series:
    """Column ``col`` as finite floats; the first missing, non-numeric or infinite cell raises."""
    s = raw[col]
    if pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s):
        vals = s.to_numpy(dtype=float)
        if np.all(np.isfinite(vals)):  # fast path; otherwise the loop below finds the first bad cell
            return pd.Series(vals, index=s.index, dtype=float)
    for r, v in s.items():
        if v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and v.strip().lower() in _NA_STRINGS):
            raise CalibrationError(f"{where} {r}: {col} is missing (got {v!r}); expected a number")
        if isinstance(v, (bool, np.bool_)):
            raise CalibrationError(f"{where} {r}: {col} = {v!r}: expected a number, got a boolean")
        try:
            x = float(v.strip()) if isinstance(v, str) else float(v)
        except (TypeError, ValueError):
            raise CalibrationError(f"{where} {r}: {col} = {v!r}: expected a number") from None
        if not math.isfinite(x):
            raise CalibrationError(f"{where} {r}: {col} = {v!r}: expected a finite number")
    return pd.Series([float(v.strip()) if isinstance(v, str) else float(v) for v in s], index=s.index, dtype=float)


def write_measurements(data: pd.DataFrame, path: str | Path, *, comment: str = "") -> Path:
    """Write measurements as CSV, each line of ``comment`` prefixed with ``# `` above the header."""
    path = Path(path)
    cols = [c for c in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS) if c in data.columns]
    with path.open("w", encoding="utf-8", newline="") as f:
        for line in comment.splitlines():
            f.write(f"# {line}".rstrip() + "\n")
        data[cols].to_csv(f, index=False, lineterminator="\n", float_format="%.6g")
    return path


def synthetic_measurements(
    alpha: float,
    beta: float,
    tau_solo: float | None = None,
    *,
    chunks: Sequence[int] = (32, 64, 128, 192, 256, 384, 512, 768, 1024),
    repeats: int = 5,
    solo_repeats: int = 12,
    rel_noise: float = 0.015,
    decodes: int = 15,
    solo_decodes: int = 16,
    seed: int = 0,
) -> pd.DataFrame:
    """Synthetic raw measurements from a known law, for tests, examples and planning what-ifs.

    Each mixed iteration time is ``(alpha + beta * C) * (1 + rel_noise * Z)`` and each decode-only
    one ``tau_solo * (1 + rel_noise * Z)`` with Z standard normal (noise proportional to the mean,
    as timing jitter is), rounded to the microsecond. ``repeats`` rows per chunk size, then
    ``solo_repeats`` decode-only rows when ``tau_solo`` is given. Deterministic in ``seed``.
    """
    if repeats < 1 or not chunks:
        raise CalibrationError("synthetic_measurements: need at least one chunk size and repeats >= 1")
    rng = np.random.default_rng(seed)
    c = np.repeat(np.asarray(chunks, dtype=float), repeats)
    t = (alpha + beta * c) * (1.0 + rel_noise * rng.standard_normal(c.size))
    frames = [pd.DataFrame({"chunk_tokens": c, "iteration_seconds": t, "decodes": decodes, "mode": "mixed"})]
    if tau_solo is not None and solo_repeats > 0:
        ts = tau_solo * (1.0 + rel_noise * rng.standard_normal(solo_repeats))
        frames.append(
            pd.DataFrame({"chunk_tokens": 0.0, "iteration_seconds": ts, "decodes": solo_decodes, "mode": "solo"})
        )
    df = pd.concat(frames, ignore_index=True)
    df["iteration_seconds"] = np.round(df["iteration_seconds"].to_numpy(), 6)
    df["decodes"] = df["decodes"].astype(np.int64)
    df["mode"] = df["mode"].astype(object)
    return df


# ------------------------------------------------------------------------------------------------
# The fit
# ------------------------------------------------------------------------------------------------
def _clean(x: float) -> float | None:
    """JSON-safe float: NaN and infinities become None."""
    x = float(x)
    return x if math.isfinite(x) else None


def _exog(chunks: np.ndarray) -> np.ndarray:
    # Build [1, C] by hand: sm.add_constant skips the constant when C itself is constant.
    c = np.asarray(chunks, dtype=float).reshape(-1)
    return np.column_stack([np.ones_like(c), c])


@dataclass(frozen=True)
class CalibrationFit:
    """Result of :func:`fit_iteration_time`: tau = alpha + beta * C, in seconds and tokens.

    ``alpha_ci``/``beta_ci`` are 95% confidence intervals (Student t with ``n_points - 2`` degrees
    of freedom, also under the HC3 covariance). ``tau_solo`` is the mean decode-only iteration time
    (s) with its t interval, or None when the data has no decode-only rows. Diagnostics of the
    mixed-row residuals: ``durbin_watson`` (about 2 when successive rows are uncorrelated),
    ``breusch_pagan_p`` (small: the noise grows with C, use ``robust=True``), ``jarque_bera_p``
    (small: non-normal residuals), ``max_abs_studentized`` at row ``max_abs_studentized_row``
    (above ~4: check that row for an outlier).
    """

    alpha: float  # s
    beta: float  # s per prefill token
    alpha_se: float
    beta_se: float
    alpha_ci: tuple[float, float]
    beta_ci: tuple[float, float]
    cov_alpha_beta: float  # covariance of the two estimates (s^2 per token)
    r2: float
    n_points: int  # mixed iterations used in the OLS
    residual_std: float  # s, standard error of the regression
    cov_type: str  # "nonrobust" or "HC3"
    chunk_range: tuple[float, float]  # smallest and largest chunk measured (tokens)
    durbin_watson: float
    breusch_pagan_p: float
    jarque_bera_p: float
    max_abs_studentized: float
    max_abs_studentized_row: Hashable
    tau_solo: float | None = None  # s
    tau_solo_se: float | None = None
    tau_solo_ci: tuple[float, float] | None = None
    n_solo: int = 0
    chunk: int | None = None  # C to use in to_profile()
    batch: int | None = None  # B to use in to_profile()
    data: pd.DataFrame = field(default=None, repr=False, compare=False)  # type: ignore[assignment]
    _result: Any = field(default=None, repr=False, compare=False)

    # -- derived -------------------------------------------------------------------------------
    @property
    def gamma(self) -> float | None:
        """Tokens per second of one solo decode stream, 1 / tau_solo (None without solo rows)."""
        return None if self.tau_solo is None else 1.0 / self.tau_solo

    def tau_mix(self, chunk: float) -> float:
        """Fitted seconds of a mixed iteration with a ``chunk``-token prefill chunk."""
        return self.alpha + self.beta * float(chunk)

    def predict(self, chunks: Sequence[float] | np.ndarray) -> pd.DataFrame:
        """Fitted tau at ``chunks`` with a 95% confidence interval of the mean (``ci_low``,
        ``ci_high``) and a 95% prediction interval of one new iteration (``pi_low``, ``pi_high``)."""
        c = np.asarray(chunks, dtype=float).reshape(-1)
        sf = self._result.get_prediction(_exog(c)).summary_frame(alpha=1 - CONFIDENCE)
        return pd.DataFrame(
            {
                "chunk_tokens": c,
                "tau": sf["mean"].to_numpy(),
                "ci_low": sf["mean_ci_lower"].to_numpy(),
                "ci_high": sf["mean_ci_upper"].to_numpy(),
                "pi_low": sf["obs_ci_lower"].to_numpy(),
                "pi_high": sf["obs_ci_upper"].to_numpy(),
            }
        )

    # -- conversion ----------------------------------------------------------------------------
    def to_profile(
        self,
        chunk: int | None = None,
        batch: int | None = None,
        *,
        name: str = "",
        tau_solo: float | None = None,
    ) -> GPUProfile:
        """A :class:`GPUProfile` with the fitted alpha and beta.

        ``chunk`` (C) and ``batch`` (B) default to the values given to :func:`fit_iteration_time`;
        ``tau_solo`` defaults to the fitted decode-only mean. Missing values raise CalibrationError.
        """
        chunk = self.chunk if chunk is None else chunk
        batch = self.batch if batch is None else batch
        tau_solo = self.tau_solo if tau_solo is None else tau_solo
        if chunk is None or batch is None:
            raise CalibrationError(
                "to_profile: chunk (C, prefill tokens per mixed iteration) and batch (B, requests per GPU) "
                "are serving settings, not fitted; pass them (e.g. chunk=256, batch=16)"
            )
        if tau_solo is None:
            raise CalibrationError(
                "to_profile: the data has no decode-only rows (chunk_tokens = 0 or mode = 'solo'), so tau_solo "
                "is unknown; pass tau_solo= (seconds per decode-only iteration)"
            )
        try:
            return GPUProfile(alpha=self.alpha, beta=self.beta, tau_solo=tau_solo, chunk=chunk, batch=batch, name=name)
        except ScenarioError as e:
            raise CalibrationError(f"to_profile: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (NaN becomes None); tau_solo keys only when the data had solo rows."""
        d: dict[str, Any] = {
            "alpha": self.alpha,
            "beta": self.beta,
            "alpha_se": _clean(self.alpha_se),
            "beta_se": _clean(self.beta_se),
            "alpha_ci": [_clean(v) for v in self.alpha_ci],
            "beta_ci": [_clean(v) for v in self.beta_ci],
            "cov_alpha_beta": _clean(self.cov_alpha_beta),
            "r2": _clean(self.r2),
            "n_points": self.n_points,
            "residual_std": _clean(self.residual_std),
            "cov_type": self.cov_type,
            "chunk_range": [self.chunk_range[0], self.chunk_range[1]],
            "diagnostics": {
                "durbin_watson": _clean(self.durbin_watson),
                "breusch_pagan_p": _clean(self.breusch_pagan_p),
                "jarque_bera_p": _clean(self.jarque_bera_p),
                "max_abs_studentized": _clean(self.max_abs_studentized),
                "max_abs_studentized_row": _jsonable(self.max_abs_studentized_row),
            },
        }
        if self.tau_solo is not None:
            d["tau_solo"] = self.tau_solo
            d["tau_solo_se"] = None if self.tau_solo_se is None else _clean(self.tau_solo_se)
            d["tau_solo_ci"] = None if self.tau_solo_ci is None else [_clean(v) for v in self.tau_solo_ci]
            d["gamma"] = self.gamma
            d["n_solo"] = self.n_solo
        if self.chunk is not None:
            d["chunk"] = self.chunk
            d["tau_mix"] = self.tau_mix(self.chunk)
        if self.batch is not None:
            d["batch"] = self.batch
        return d

    def to_frame(self) -> pd.DataFrame:
        """One row per parameter (alpha, beta, tau_solo when fitted): estimate, se, ci_low, ci_high."""
        rows = [
            ("alpha", self.alpha, self.alpha_se, *self.alpha_ci, "s"),
            ("beta", self.beta, self.beta_se, *self.beta_ci, "s/token"),
        ]
        if self.tau_solo is not None:
            lo, hi = self.tau_solo_ci if self.tau_solo_ci is not None else (math.nan, math.nan)
            se = math.nan if self.tau_solo_se is None else self.tau_solo_se
            rows.append(("tau_solo", self.tau_solo, se, lo, hi, "s"))
        return pd.DataFrame(rows, columns=["parameter", "estimate", "se", "ci_low", "ci_high", "unit"]).set_index(
            "parameter"
        )

    def warnings(self) -> list[str]:
        """Plain-language warnings from the residual diagnostics (empty when nothing stands out)."""
        out = []
        if self.cov_type == "nonrobust" and self.breusch_pagan_p < 0.05:
            out.append(
                f"Breusch-Pagan p = {self.breusch_pagan_p:.3g}: the noise changes with the chunk size; "
                "the classical standard errors may be off, refit with robust=True (HC3)"
            )
        if self.durbin_watson < 1.0 or self.durbin_watson > 3.0:
            out.append(
                f"Durbin-Watson = {self.durbin_watson:.2f}: successive rows are correlated (drift or "
                "measurement order); randomise the order of chunk sizes when profiling"
            )
        if self.max_abs_studentized > 4.0:
            out.append(
                f"largest |studentised residual| = {self.max_abs_studentized:.1f} at "
                f"{self._row_label(self.max_abs_studentized_row)}: check it for an outlier"
            )
        if self.r2 < 0.95:
            out.append(f"R^2 = {self.r2:.3f}: the linear law explains the data poorly")
        return out

    def _row_label(self, r: Hashable) -> str:
        name = None if self.data is None else self.data.index.name
        return f"{name or 'row'} {r}"

    def summary(self) -> str:
        """A readable table of the fit (what ``fluidopt calibrate`` prints)."""
        lo, hi = self.chunk_range
        lines = [
            "Iteration-time law  tau = alpha + beta * C",
            (f"OLS on {self.n_points} mixed iterations, C from {lo:g} to {hi:g} tokens, "
            f"{'HC3 robust' if self.cov_type == 'HC3' else 'classical'} standard errors"),
            "",
            f"{'parameter':<16}{'estimate':>13}{'std err':>13}   95% confidence interval",
        ]

        def row(label: str, est: float, se: float | None, ci: tuple[float, float] | None) -> str:
            se_s = "" if se is None or not math.isfinite(se) else f"{se:.4g}"
            ci_s = "" if ci is None or not all(math.isfinite(v) for v in ci) else f"[{ci[0]:.5g}, {ci[1]:.5g}]"
            return f"{label:<16}{est:>13.5g}{se_s:>13}   {ci_s}"

        lines.append(row("alpha (s)", self.alpha, self.alpha_se, self.alpha_ci))
        lines.append(row("beta (s/token)", self.beta, self.beta_se, self.beta_ci))
        if self.tau_solo is not None:
            lines.append(row("tau_solo (s)", self.tau_solo, self.tau_solo_se, self.tau_solo_ci))
        lines.append("")
        lines.append(f"R^2 = {self.r2:.4f}   residual std = {self.residual_std:.4g} s")
        if self.tau_solo is not None:
            lines.append(f"decode-only: {self.n_solo} iterations, gamma = 1/tau_solo = {self.gamma:.4g} tokens/s")
        else:
            lines.append("decode-only: no rows (tau_solo not estimated)")
        if self.chunk is not None:
            lines.append(f"at C = {self.chunk}: tau_mix = {self.tau_mix(self.chunk):.5g} s")
        lines.append(
            f"diagnostics: Durbin-Watson {self.durbin_watson:.3g}, Breusch-Pagan p {self.breusch_pagan_p:.3g}, "
            f"Jarque-Bera p {self.jarque_bera_p:.3g}, max |studentised residual| {self.max_abs_studentized:.3g} "
            f"({self._row_label(self.max_abs_studentized_row)})"
        )
        for w in self.warnings():
            lines.append(f"warning: {w}")
        return "\n".join(lines)

    def plot(self, ax: Axes | None = None) -> Figure:
        """Data, fitted line, 95% confidence band of the mean and 95% prediction band.

        Decode-only rows, if any, are drawn at C = 0 with their mean. Returns the Figure (a new one
        unless ``ax`` is given); no pyplot state is touched.
        """
        if ax is None:
            from matplotlib.figure import Figure

            fig = Figure(figsize=(6.4, 4.4), layout="constrained")
            ax = fig.add_subplot()
        else:
            fig = ax.figure
        d = self.data
        mixed = d[d["mode"] == "mixed"]
        grid = np.linspace(0.0, self.chunk_range[1] * 1.05, 200)
        p = self.predict(grid)
        ax.fill_between(grid, p["pi_low"], p["pi_high"], color="C0", alpha=0.12, label="95% prediction band")
        ax.fill_between(grid, p["ci_low"], p["ci_high"], color="C0", alpha=0.35, label="95% confidence band")
        ax.plot(
            grid, p["tau"], color="C0", lw=1.8,
            label=f"fit: tau = {self.alpha:.4g} + {self.beta:.3g} C  (R^2 = {self.r2:.4f})",
        )
        ax.scatter(mixed["chunk_tokens"], mixed["iteration_seconds"], s=14, color="k", zorder=3, label="mixed iterations")
        if self.tau_solo is not None:
            solo = d[d["mode"] == "solo"]
            ax.scatter(solo["chunk_tokens"], solo["iteration_seconds"], s=18, marker="x", color="C3", zorder=3,
                       label=f"decode-only (tau_solo = {self.tau_solo:.4g} s)")
        ax.set_xlabel("prefill chunk C (tokens)")
        ax.set_ylabel("iteration time tau (s)")
        ax.set_title(f"Iteration-time calibration ({self.n_points} mixed points, {self.cov_type})")
        ax.set_xlim(left=-0.02 * grid[-1])
        ax.legend(fontsize="small", loc="upper left")
        return fig


def _jsonable(v: Any) -> Any:
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    return v if isinstance(v, (int, float, str)) or v is None else str(v)


def fit_iteration_time(
    data: pd.DataFrame | str | Path,
    *,
    robust: bool = False,
    chunk: int | None = None,
    batch: int | None = None,
) -> CalibrationFit:
    """Fit tau = alpha + beta * C by OLS on the mixed rows of ``data`` (CSV path or DataFrame).

    Mixed rows have ``chunk_tokens > 0``; decode-only rows (``chunk_tokens == 0`` or
    ``mode == 'solo'``) give ``tau_solo`` as their mean with a t interval. ``robust=True`` uses the
    HC3 heteroscedasticity-consistent covariance (the point estimates are unchanged). ``chunk`` and
    ``batch`` are stored for :meth:`CalibrationFit.to_profile`.

    Raises :class:`CalibrationError` for bad rows (see :func:`read_measurements`), fewer than
    three mixed rows, a single distinct chunk size, or (HC3) a point of leverage 1.
    """
    d = read_measurements(data)
    src = "" if isinstance(data, pd.DataFrame) else f"{Path(data)}: "
    mixed = d[d["mode"] == "mixed"]
    solo = d[d["mode"] == "solo"]
    n = len(mixed)
    if n < MIN_MIXED_ROWS:
        raise CalibrationError(
            f"{src}too few mixed rows to fit tau = alpha + beta * C: got {n} row(s) with chunk_tokens > 0, "
            f"need at least {MIN_MIXED_ROWS}"
        )
    x = mixed["chunk_tokens"].to_numpy(dtype=float)
    y = mixed["iteration_seconds"].to_numpy(dtype=float)
    distinct = np.unique(x)
    if distinct.size < 2:
        raise CalibrationError(
            f"{src}chunk_tokens takes a single value ({distinct[0]:g}) over the {n} mixed rows; the slope beta "
            "needs at least two distinct chunk sizes"
        )
    # statsmodels (about 2 CPU-s to import) only once the table is known to be fit for a fit: a bad row or
    # too few of them is reported without it
    import statsmodels.api as sm
    from scipy import stats
    from statsmodels.stats.diagnostic import het_breuschpagan
    from statsmodels.stats.stattools import durbin_watson, jarque_bera

    X = _exog(x)
    if robust:
        # HC3 divides each squared residual by (1 - h_ii)^2: a point alone at its chunk size with
        # leverage 1 makes it undefined, so say so instead of returning NaN intervals.
        h = np.einsum("ij,ji->i", X, np.linalg.solve(X.T @ X, X.T))
        if np.any(h > 1 - 1e-10):
            r = mixed.index[int(np.argmax(h))]
            raise CalibrationError(
                f"{src}robust (HC3) standard errors are undefined: {mixed.index.name} {r} has leverage 1 "
                "(the fit passes through it exactly); measure each chunk size at least twice or use robust=False"
            )
        res = sm.OLS(y, X).fit(cov_type="HC3", use_t=True)
        cov_type = "HC3"
    else:
        res = sm.OLS(y, X).fit()
        cov_type = "nonrobust"
    params = np.asarray(res.params)
    bse = np.asarray(res.bse)
    ci = np.asarray(res.conf_int(alpha=1 - CONFIDENCE))
    cov = np.asarray(res.cov_params())
    resid = np.asarray(res.resid)

    # Diagnostics; each can be undefined on tiny or exact data, so NaN then rather than an error.
    with np.errstate(all="ignore"):
        dw = float(durbin_watson(resid)) if np.any(resid != 0) else math.nan
        try:
            bp_p = float(het_breuschpagan(resid, X)[1])
        except (ValueError, np.linalg.LinAlgError, ZeroDivisionError):
            bp_p = math.nan
        jb_p = float(jarque_bera(resid)[1]) if n >= 3 and np.any(resid != 0) else math.nan
        # Externally studentised residuals in closed form (statsmodels refits n leave-one-out
        # models for this): r_i = e_i / (s_(i) sqrt(1 - h_i)),
        # s_(i)^2 = ((n - 2) s^2 - e_i^2 / (1 - h_i)) / (n - 3).
        h = np.einsum("ij,ji->i", X, np.linalg.solve(X.T @ X, X.T))
        if n > 3:
            s2_i = ((n - 2) * res.scale - resid**2 / (1 - h)) / (n - 3)
            stud = resid / np.sqrt(s2_i * (1 - h))
            stud[~np.isfinite(stud)] = np.nan
        else:
            stud = np.full(n, np.nan)
    if np.any(np.isfinite(stud)):
        k = int(np.nanargmax(np.abs(stud)))
        max_stud, max_row = float(abs(stud[k])), mixed.index[k]
    else:
        max_stud, max_row = math.nan, None

    tau_solo = tau_solo_se = None
    tau_solo_ci = None
    if len(solo):
        ts = solo["iteration_seconds"].to_numpy(dtype=float)
        tau_solo = float(ts.mean())
        if ts.size >= 2:
            tau_solo_se = float(ts.std(ddof=1) / math.sqrt(ts.size))
            q = float(stats.t.ppf(0.5 + CONFIDENCE / 2, ts.size - 1))
            tau_solo_ci = (tau_solo - q * tau_solo_se, tau_solo + q * tau_solo_se)
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1):
        raise CalibrationError(f"chunk: expected an integer >= 1 (prefill tokens per mixed iteration), got {chunk!r}")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1):
        raise CalibrationError(f"batch: expected an integer >= 1 (requests per GPU), got {batch!r}")

    return CalibrationFit(
        alpha=float(params[0]),
        beta=float(params[1]),
        alpha_se=float(bse[0]),
        beta_se=float(bse[1]),
        alpha_ci=(float(ci[0, 0]), float(ci[0, 1])),
        beta_ci=(float(ci[1, 0]), float(ci[1, 1])),
        cov_alpha_beta=float(cov[0, 1]),
        r2=float(res.rsquared),
        n_points=n,
        residual_std=float(math.sqrt(res.scale)),
        cov_type=cov_type,
        chunk_range=(float(x.min()), float(x.max())),
        durbin_watson=dw,
        breusch_pagan_p=bp_p,
        jarque_bera_p=jb_p,
        max_abs_studentized=max_stud,
        max_abs_studentized_row=_jsonable(max_row),
        tau_solo=tau_solo,
        tau_solo_se=tau_solo_se,
        tau_solo_ci=tau_solo_ci,
        n_solo=len(solo),
        chunk=None if chunk is None else int(chunk),
        batch=None if batch is None else int(batch),
        data=d,
        _result=res,
    )


__all__ = [
    "CalibrationFit",
    "fit_iteration_time",
    "read_measurements",
    "synthetic_measurements",
    "write_measurements",
]
