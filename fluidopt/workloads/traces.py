"""Trace loaders: the Azure LLM inference trace format and a simple generic CSV.

Both loaders validate every row and raise :class:`fluidopt.core.errors.TraceError` naming the file, the
first bad row (1-based data row and its line in the file, the header being line 1), the column, the
value and what was expected, e.g. ``conv.csv: row 17 (line 18): ContextTokens = '-3': expected a
non-negative integer``. Policies (see docs/workloads.md):

* times are made relative to the first request (so replay starts at t = 0) and divided by
  ``speedup``; rows out of time order are stably sorted, with a :class:`TraceWarning` naming the first
  one (``sort=False`` rejects them instead);
* token counts must be non-negative integers; a count of 0 is raised to 1 (a request has at least
  one prompt token and generates at least one token) and the fix-up is counted in a warning and in
  ``TraceWorkload.notes``;
* blank lines are skipped; a file without data rows is an error.

Class assignment (``classes=``): ``"thresholds"`` (prompt and output tokens against thresholds,
default the trace medians: up to four classes ``short-prompt/short-output`` ...), ``"kmeans"``
(k-means on standardised log lengths, seeded, deterministic), ``"single"`` (one class ``all``), the
generic CSV's own ``class`` column, or a callable returning one class name per row.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from fluidopt.core.errors import TraceError
from fluidopt.core.model import RequestClass, Scenario
from fluidopt.workloads.base import TraceWarning
from fluidopt.workloads.replay import TraceWorkload

# No model's context is longer: a count beyond this is a corrupt row, not a request.
MAX_TOKENS = 100_000_000

__all__ = [
    "AZURE_COLUMNS",
    "CSV_COLUMNS",
    "assign_classes",
    "classes_from_trace",
    "load_azure_trace",
    "load_trace_csv",
    "read_azure_trace",
    "read_trace_csv",
    "replay",
    "summarize_trace",
]

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
CSV_COLUMNS = ("time", "prompt_tokens", "output_tokens", "class")

PathLike = str | os.PathLike | io.TextIOBase
ClassRule = str | Callable[[pd.DataFrame], Sequence[str]] | None

_MORE = 5  # how many further bad rows to mention by number


# --------------------------------------------------------------------------------------------
# Reading and validating
# --------------------------------------------------------------------------------------------


def _label(path: PathLike) -> str:
    if isinstance(path, io.TextIOBase):
        return getattr(path, "name", None) or "<stream>"
    return Path(path).name


FORMATS_READ = ("an Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens), the generic trace "
                "CSV (time,prompt_tokens,output_tokens[,class]) or, by --trace, Mooncake JSON lines "
                "(timestamp,input_length,output_length,hash_ids), UTF-8 text (docs/workloads.md)")
"""The trace formats the readers take, as the error for any other format names them."""


def _not_csv(path: PathLike) -> str | None:
    """What a file that is plainly not CSV text looks like (JSON lines, JSON, gzip, Parquet, a zip or
    Excel workbook, binary), from its first bytes; None for anything that may be CSV. Without this a
    JSON-lines file fails deep in the CSV parse on a field count, which names no format."""
    try:
        if isinstance(path, io.TextIOBase):
            pos = path.tell()
            head = path.read(4096).encode("utf-8", "replace")
            path.seek(pos)
        else:
            with open(path, "rb") as f:
                head = f.read(4096)
    except (OSError, ValueError):
        return None
    for magic, what in ((b"\x1f\x8b", "a gzip-compressed file"), (b"PAR1", "a Parquet file"),
                        (b"PK\x03\x04", "a zip archive (or an Excel workbook)")):
        if head.startswith(magic):
            return what
    if b"\x00" in head:
        return "a binary file"
    first = head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    if first == b"{":
        return "JSON lines (one JSON object per line)"
    if first == b"[":
        return "JSON (an array)"
    return None


def _check_csv(path: PathLike, label: str) -> None:
    what = _not_csv(path)
    if what is not None:
        raise TraceError(f"{label}: looks like {what}, not CSV; traces are read from {FORMATS_READ}")


def _where(label: str, i: int) -> str:
    """Row i (0-based index into the data rows) -> 'file: row r (line l)'."""
    return f"{label}: row {i + 1} (line {i + 2})"


def _more(rows: np.ndarray) -> str:
    if rows.size <= 1:
        return ""
    extra = ", ".join(str(int(r) + 1) for r in rows[1 : 1 + _MORE])
    tail = ", ..." if rows.size > 1 + _MORE else ""
    return f" ({rows.size - 1} more bad row(s) in this column: {extra}{tail})"


def _field_count_error(path: PathLike, label: str, n_header: int) -> TraceError:
    """Locate the first row with more fields than the header (pandas does not say which)."""
    try:
        if isinstance(path, io.TextIOBase):
            path.seek(0)
            ctx = contextlib.nullcontext(path)
        else:
            ctx = open(path, newline="", encoding="utf-8-sig")  # noqa: SIM115 - closed by the with below
        with ctx as fh:
            reader = csv.reader(fh)
            next(reader, None)
            for row in reader:
                if len(row) > n_header:
                    line = reader.line_num
                    return TraceError(
                        f"{label}: row {line - 1} (line {line}): {len(row)} fields, expected {n_header} (the header's)"
                    )
    except (OSError, csv.Error) as e:  # pragma: no cover - defensive
        return TraceError(f"{label}: not a valid CSV file: {e}")
    return TraceError(f"{label}: not a valid CSV file: a row has more fields than the header")


def _read_raw(path: PathLike, expected: Sequence[str]) -> tuple[pd.DataFrame, str]:
    """Read a CSV as strings with one frame row per file line after the header (blank lines kept as
    rows of empty strings so row numbers map to lines), then drop the blank rows."""
    label = _label(path)
    if not isinstance(path, io.TextIOBase) and not Path(path).is_file():
        raise TraceError(f"{path}: no such file")
    _check_csv(path, label)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)
            df = pd.read_csv(
                path, dtype=str, keep_default_na=False, skip_blank_lines=False, index_col=False,
                encoding="utf-8-sig",
            )
    except pd.errors.EmptyDataError:
        raise TraceError(f"{label}: empty file: expected a header line with columns {', '.join(expected)}") from None
    except (pd.errors.ParserError, pd.errors.ParserWarning):
        n_header = _header_width(path)
        raise _field_count_error(path, label, n_header) from None
    except UnicodeDecodeError as e:
        raise TraceError(f"{label}: not a UTF-8 text file ({e.reason} at byte {e.start})") from None
    df.columns = [str(c).strip() for c in df.columns]
    blank = (df == "").all(axis=1).to_numpy()
    if blank.any():
        df = df.loc[~blank]
    if len(df) == 0:
        raise TraceError(f"{label}: no data rows: expected one request per line after the header")
    return df, label


def _header_width(path: PathLike) -> int:
    try:
        if isinstance(path, io.TextIOBase):
            path.seek(0)
            first = path.readline()
        else:
            with open(path, newline="", encoding="utf-8-sig") as fh:
                first = fh.readline()
        return len(next(csv.reader([first])))
    except (OSError, StopIteration, csv.Error):  # pragma: no cover
        return 0


def _columns(df: pd.DataFrame, label: str, wanted: Sequence[str], optional: Sequence[str] = ()) -> dict[str, str]:
    """Map wanted column names to the file's (exact match first, then case-insensitive)."""
    lower = {c.lower(): c for c in df.columns}
    found, missing = {}, []
    for w in (*wanted, *optional):
        if w in df.columns:
            found[w] = w
        elif w.lower() in lower:
            found[w] = lower[w.lower()]
        elif w in wanted:
            missing.append(w)
    if missing:
        raise TraceError(
            f"{label}: missing column(s) {', '.join(missing)}; found {', '.join(map(str, df.columns)) or 'none'}; "
            f"expected {', '.join(wanted)}"
        )
    return found


def _tokens(df: pd.DataFrame, col: str, label: str) -> np.ndarray:
    """A token column: non-negative integers (``12`` or ``12.0``), else an error naming the row."""
    raw = df[col]
    num = pd.to_numeric(raw.str.strip(), errors="coerce").to_numpy(dtype=float)
    ok = np.isfinite(num) & (num >= 0) & (num == np.floor(num)) & (num <= MAX_TOKENS)
    bad = np.flatnonzero(~ok)
    if bad.size:
        i = int(bad[0])
        raise TraceError(
            f"{_where(label, int(df.index[i]))}: {col} = {raw.iloc[i]!r}: expected a non-negative integer "
            f"at most {MAX_TOKENS:,}" + _more(df.index.to_numpy()[bad])
        )
    return num.astype(np.int64)


def _times(df: pd.DataFrame, col: str, label: str, *, numeric: bool | None) -> np.ndarray:
    """Seconds relative to the earliest row. ``numeric``: True seconds, False ISO-8601 timestamps,
    None decide from the first row (a number means seconds)."""
    raw = df[col].str.strip()
    if numeric is None:
        numeric = bool(np.isfinite(pd.to_numeric(raw.iloc[:1], errors="coerce").to_numpy(dtype=float)).all())
    if numeric:
        t = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
        bad = np.flatnonzero(~np.isfinite(t))
        expect = "expected a time in seconds (a finite number, like the first row)"
    else:
        ts = pd.to_datetime(raw, format="ISO8601", errors="coerce", utc=True)
        bad = np.flatnonzero(ts.isna().to_numpy())
        expect = "expected a timestamp like '2023-11-16 18:15:46.6805900' (ISO 8601)"
        if not bad.size:
            t = ((ts - ts.min()) / pd.Timedelta(seconds=1)).to_numpy(dtype=float)
    if bad.size:
        i = int(bad[0])
        raise TraceError(
            f"{_where(label, int(df.index[i]))}: {col} = {df[col].iloc[i]!r}: {expect}"
            + _more(df.index.to_numpy()[bad])
        )
    return t - t.min()


def _finish(
    label: str, rows: np.ndarray, t: np.ndarray, prompt: np.ndarray, output: np.ndarray, extra: dict,
    *, sort: bool, time_col: str,
) -> pd.DataFrame:
    """Sort by time (or reject), raise zero token counts to 1, attach notes."""
    notes: list[str] = []
    dec = np.flatnonzero(np.diff(t) < 0)
    if dec.size:
        i = int(dec[0]) + 1
        msg = (
            f"{_where(label, int(rows[i]))}: {time_col} is earlier than the previous row's "
            f"({dec.size} row(s) out of order)"
        )
        if not sort:
            raise TraceError(msg + ": expected nondecreasing times (pass sort=True to sort them)")
        order = np.argsort(t, kind="stable")
        t, prompt, output, rows = t[order], prompt[order], output[order], rows[order]
        extra = {k: np.asarray(v)[order] for k, v in extra.items()}
        notes.append(msg + "; rows sorted by time (stable)")
    for name, arr in (("prompt", prompt), ("output", output)):
        z = int((arr == 0).sum())
        if z:
            arr[arr == 0] = 1
            notes.append(f"{label}: {z} row(s) with 0 {name} tokens raised to 1")
    for n in notes:
        warnings.warn(n, TraceWarning, stacklevel=3)
    df = pd.DataFrame({"time": t, "prompt": prompt, "output": output, **extra, "row": rows + 1})
    df.attrs["notes"] = tuple(notes)
    df.attrs["source"] = label
    return df


def read_azure_trace(path: PathLike, *, sort: bool = True) -> pd.DataFrame:
    """Read an Azure LLM inference trace (columns TIMESTAMP, ContextTokens, GeneratedTokens).

    Returns a DataFrame with columns ``time`` (seconds since the first request), ``prompt``
    (= ContextTokens), ``output`` (= GeneratedTokens) and ``row`` (1-based data row in the file).
    TIMESTAMP is ISO 8601 with any number of fractional digits (the trace has 7); time zones, if any,
    are converted to UTC. Works for the 2023 conversation/code traces and the 2024 week-long ones.
    """
    raw, label = _read_raw(path, AZURE_COLUMNS)
    cols = _columns(raw, label, AZURE_COLUMNS)
    prompt = _tokens(raw, cols["ContextTokens"], label)
    output = _tokens(raw, cols["GeneratedTokens"], label)
    t = _times(raw, cols["TIMESTAMP"], label, numeric=False)
    return _finish(label, raw.index.to_numpy(), t, prompt, output, {}, sort=sort, time_col=cols["TIMESTAMP"])


def read_trace_csv(path: PathLike, *, sort: bool = True) -> pd.DataFrame:
    """Read the generic trace CSV: ``time``, ``prompt_tokens``, ``output_tokens`` and optionally ``class``.

    ``time`` is seconds (any float; the first row decides: a number means every row must be one)
    or ISO 8601 timestamps; times are made relative to the earliest row. ``class`` is a class name
    (non-empty). Returns columns ``time``, ``prompt``, ``output``, ``class`` (if present), ``row``.
    """
    raw, label = _read_raw(path, CSV_COLUMNS[:3])
    cols = _columns(raw, label, CSV_COLUMNS[:3], optional=("class",))
    prompt = _tokens(raw, cols["prompt_tokens"], label)
    output = _tokens(raw, cols["output_tokens"], label)
    t = _times(raw, cols["time"], label, numeric=None)
    extra = {}
    if "class" in cols:
        names = raw[cols["class"]].str.strip()
        bad = np.flatnonzero((names == "").to_numpy())
        if bad.size:
            i = int(bad[0])
            raise TraceError(
                f"{_where(label, int(raw.index[i]))}: {cols['class']} = {raw[cols['class']].iloc[i]!r}: "
                "expected a class name (non-empty)" + _more(raw.index.to_numpy()[bad])
            )
        extra["class"] = names.to_numpy(dtype=object)
    return _finish(label, raw.index.to_numpy(), t, prompt, output, extra, sort=sort, time_col=cols["time"])


# --------------------------------------------------------------------------------------------
# Class assignment
# --------------------------------------------------------------------------------------------


def _threshold(df: pd.DataFrame, col: str, value: float | str | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        if value != "median":
            raise TraceError(f"assign_classes: {col}_threshold: expected a number, 'median' or None, got {value!r}")
        return float(np.median(df[col].to_numpy()))
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not math.isfinite(value):
        raise TraceError(f"assign_classes: {col}_threshold: expected a finite number, 'median' or None, got {value!r}")
    return float(value)


def assign_classes(
    df: pd.DataFrame,
    classes: ClassRule = "thresholds",
    *,
    prompt_threshold: float | str | None = "median",
    output_threshold: float | str | None = "median",
    k: int = 4,
    seed: int = 0,
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Class index per row and the class names, by one of the documented rules.

    * ``"thresholds"``: a request is *long-prompt* when prompt tokens > ``prompt_threshold`` (else
      *short-prompt*), *long-output* when output tokens > ``output_threshold``; names like
      ``short-prompt/long-output``; a threshold of None does not split on that length; ``"median"``
      uses the trace median. Classes are ordered short/short, short/long, long/short, long/long; empty
      ones are dropped.
    * ``"kmeans"``: k-means (scipy ``kmeans2``, k-means++ start, ``seed``) with ``k`` clusters on
      (log prompt, log output), each standardised to mean 0 and sd 1; clusters are ordered by their
      mean log prompt then log output and named ``cluster-0``, ``cluster-1``, ...; empty ones dropped.
    * ``"single"``: one class ``all``.
    * ``"column"``: the frame's ``class`` column (names, in order of first appearance).
    * a callable ``f(df) -> sequence of class names`` (one per row; order of first appearance).
    """
    n = len(df)
    if callable(classes) or classes == "column":
        if classes == "column":
            if "class" not in df.columns:
                raise TraceError("assign_classes: classes='column' needs a 'class' column; the trace has none")
            labels = df["class"].to_numpy(dtype=object)
        else:
            labels = np.asarray(list(classes(df)), dtype=object)
            if labels.shape != (n,):
                raise TraceError(f"assign_classes: the class rule returned {labels.size} labels for {n} rows")
        codes, uniques = pd.factorize(pd.Series(labels).astype(str), sort=False)
        return codes.astype(np.int64), tuple(str(u) for u in uniques)
    if classes == "single":
        return np.zeros(n, dtype=np.int64), ("all",)
    if classes == "thresholds":
        tp = _threshold(df, "prompt", prompt_threshold)
        to = _threshold(df, "output", output_threshold)
        lp = (df["prompt"].to_numpy() > tp) if tp is not None else np.zeros(n, bool)
        lo = (df["output"].to_numpy() > to) if to is not None else np.zeros(n, bool)
        code = 2 * lp.astype(np.int64) + lo.astype(np.int64)
        names = []
        for c in range(4):
            p = "long-prompt" if c & 2 else "short-prompt"
            o = "long-output" if c & 1 else "short-output"
            parts = ([p] if tp is not None else []) + ([o] if to is not None else [])
            names.append("/".join(parts) or "all")
        return _compact(code, names)
    if classes == "kmeans":
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise TraceError(f"assign_classes: k: expected an integer >= 1, got {k!r}")
        if k > n:
            raise TraceError(f"assign_classes: k = {k}: expected at most the number of requests ({n})")
        from scipy.cluster.vq import kmeans2

        x = np.log(np.column_stack([df["prompt"].to_numpy(float), df["output"].to_numpy(float)]).clip(1.0))
        sd = x.std(axis=0)
        x = (x - x.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "one of the clusters is empty": handled by _compact
            cent, lab = kmeans2(x, int(k), minit="++", seed=int(seed))
        order = np.lexsort((cent[:, 1], cent[:, 0]))
        rank = np.empty(int(k), dtype=np.int64)
        rank[order] = np.arange(int(k))
        codes, kept = _compact(rank[lab], [f"cluster-{j}" for j in range(int(k))])
        # renumber so names stay contiguous after dropping empty clusters
        return codes, tuple(f"cluster-{j}" for j in range(len(kept)))
    raise TraceError(
        f"assign_classes: classes: expected 'thresholds', 'kmeans', 'single', 'column' or a callable, got {classes!r}"
    )


def _compact(code: np.ndarray, names: Sequence[str]) -> tuple[np.ndarray, tuple[str, ...]]:
    used = np.unique(code)
    remap = np.full(len(names), -1, dtype=np.int64)
    remap[used] = np.arange(used.size)
    return remap[code], tuple(names[j] for j in used)


def _workload(
    df: pd.DataFrame, classes: ClassRule, *, speedup: float, max_requests: int | None, name: str, **rule
) -> TraceWorkload:
    if max_requests is not None:
        if isinstance(max_requests, bool) or not isinstance(max_requests, (int, np.integer)) or max_requests < 1:
            raise TraceError(f"max_requests: expected an integer >= 1, got {max_requests!r}")
        df = df.iloc[: int(max_requests)]
    codes, names = assign_classes(df, classes, **rule)
    frame = pd.DataFrame({"time": df["time"].to_numpy(), "prompt": df["prompt"].to_numpy(),
                          "output": df["output"].to_numpy(), "cls": codes})
    return TraceWorkload(frame, names, speedup=speedup, name=name, notes=df.attrs.get("notes", ()))


def load_azure_trace(
    path: PathLike,
    *,
    speedup: float = 1.0,
    classes: ClassRule = "thresholds",
    prompt_threshold: float | str | None = "median",
    output_threshold: float | str | None = "median",
    k: int = 4,
    seed: int = 0,
    max_requests: int | None = None,
    sort: bool = True,
) -> TraceWorkload:
    """Replay workload from an Azure LLM inference trace file (see :func:`read_azure_trace` and
    :func:`assign_classes`). ``speedup`` divides times; ``max_requests`` keeps the first requests
    (class thresholds are computed on the kept requests)."""
    df = read_azure_trace(path, sort=sort)
    return _workload(df, classes, speedup=speedup, max_requests=max_requests, name=_label(path),
                     prompt_threshold=prompt_threshold, output_threshold=output_threshold, k=k, seed=seed)


def load_trace_csv(
    path: PathLike,
    *,
    speedup: float = 1.0,
    classes: ClassRule = None,
    prompt_threshold: float | str | None = "median",
    output_threshold: float | str | None = "median",
    k: int = 4,
    seed: int = 0,
    max_requests: int | None = None,
    sort: bool = True,
) -> TraceWorkload:
    """Replay workload from a generic trace CSV (see :func:`read_trace_csv`). ``classes=None`` uses the
    file's ``class`` column when it has one, else a single class ``all``; any rule of
    :func:`assign_classes` may be given instead."""
    df = read_trace_csv(path, sort=sort)
    if classes is None:
        classes = "column" if "class" in df.columns else "single"
    return _workload(df, classes, speedup=speedup, max_requests=max_requests, name=_label(path),
                     prompt_threshold=prompt_threshold, output_threshold=output_threshold, k=k, seed=seed)


def _is_azure(path: PathLike) -> bool:
    _check_csv(path, _label(path))
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            header = next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"trace file {str(path)!r}: cannot read it: {e}") from None
    return {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= {h.strip() for h in header}


def replay(path: PathLike, scenario: Scenario, *, speedup: float = 1.0,
           jsonl_format=None) -> tuple[Scenario, TraceWorkload]:
    """A trace file as a replay workload for ``scenario`` (what ``--trace FILE`` does on the CLI).

    The format is read from the header: an Azure LLM inference trace (``TIMESTAMP,ContextTokens,
    GeneratedTokens``), the generic CSV (``time,prompt_tokens,output_tokens[,class]``), or JSON lines
    (a first byte ``{``: :func:`fluidopt.workloads.jsonl.read_jsonl_trace`, the Mooncake format unless
    ``jsonl_format`` states another; the workload keeps the block hashes). Classes:
    the scenario's own when the file's ``class`` column names only scenario classes, or when the
    scenario has a single class (every request joins it); otherwise the trace is split by its median
    prompt and output lengths (:func:`assign_classes`), and the returned scenario's classes are
    replaced by the trace's (:func:`classes_from_trace`: mean lengths and observed rates, with the
    scenario's mean patience), keeping its GPU, fleet and prices. Returns (scenario, workload).
    """
    from dataclasses import replace as _replace

    p = Path(path)
    if p.is_dir():
        raise TraceError(f"trace file {str(p)!r}: is a folder, expected a file")
    if not p.is_file():
        raise TraceError(f"trace file {str(p)!r}: no such file")
    names = tuple(c.name for c in scenario.classes)
    from fluidopt.workloads.jsonl import MOONCAKE, is_jsonl, read_jsonl_trace

    if is_jsonl(p):  # JSON lines carry block hashes; a format other than Mooncake's is stated by jsonl_format
        df = read_jsonl_trace(p, jsonl_format or MOONCAKE)
    elif _is_azure(p):
        df = read_azure_trace(p)
    else:
        df = read_trace_csv(p)
    kv = {"hashes": df["hashes"].to_list(), "block_size": df.attrs["block_size"]} if "hashes" in df.columns else {}
    if "class" in df.columns and set(df["class"].astype(str)) <= set(names):
        codes = np.array([names.index(str(c)) for c in df["class"]], dtype=np.int64)
        frame = pd.DataFrame({"time": df["time"].to_numpy(), "prompt": df["prompt"].to_numpy(),
                              "output": df["output"].to_numpy(), "cls": codes})
        return scenario, TraceWorkload(frame, names, speedup=speedup, name=_label(p), notes=df.attrs.get("notes", ()), **kv)
    if len(names) == 1:
        frame = pd.DataFrame({"time": df["time"].to_numpy(), "prompt": df["prompt"].to_numpy(),
                              "output": df["output"].to_numpy(), "cls": np.zeros(len(df), dtype=np.int64)})
        return scenario, TraceWorkload(frame, names, speedup=speedup, name=_label(p), notes=df.attrs.get("notes", ()), **kv)
    t = df["time"].to_numpy()
    if len(t) and float(t.max() - t.min()) <= 0.0:
        raise TraceError(f"trace file {str(p)!r}: all {len(t)} request(s) arrive at the same instant, so per-class "
                         "rates cannot be derived from it; give a trace spanning more than 0 s, a 'class' column "
                         "naming the scenario's classes, or a single-class scenario")
    work = _workload(df, "thresholds", speedup=speedup, max_requests=None, name=_label(p))
    if kv:
        frame = pd.DataFrame({"time": df["time"].to_numpy(), "prompt": df["prompt"].to_numpy(),
                              "output": df["output"].to_numpy(), "cls": work.cls})
        work = TraceWorkload(frame, work.class_names, speedup=speedup, name=work.name, notes=work.notes, **kv)
    patience = float(np.mean([c.patience for c in scenario.classes]))
    classes = tuple(classes_from_trace(work, patience=patience))
    # per-class prices do not carry over to new classes: the scenario's prefill/decode prices apply
    return _replace(scenario, classes=classes), work


# --------------------------------------------------------------------------------------------
# From a trace to model classes
# --------------------------------------------------------------------------------------------


def _frame_of(trace: TraceWorkload | pd.DataFrame) -> pd.DataFrame:
    if isinstance(trace, TraceWorkload):
        return trace.frame
    if isinstance(trace, pd.DataFrame):
        missing = [c for c in ("time", "prompt", "output") if c not in trace.columns]
        if missing:
            raise TraceError(f"classes_from_trace: missing column(s) {', '.join(missing)}; found {', '.join(trace.columns)}")
        if "class" not in trace.columns:
            trace = trace.assign(**{"class": "all"})
        return trace
    raise TraceError(f"classes_from_trace: expected a TraceWorkload or a DataFrame, got {type(trace).__name__}")


def summarize_trace(trace: TraceWorkload | pd.DataFrame, *, duration: float | None = None) -> pd.DataFrame:
    """Per-class statistics: requests, share, rate (per second, cluster-wide), mean/median/CV and
    log-sd of prompt and output tokens. ``duration`` (s) defaults to last minus first arrival."""
    df = _frame_of(trace)
    t = df["time"].to_numpy(float)
    if duration is None:
        duration = float(t.max() - t.min())
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not (duration > 0 and math.isfinite(duration)):
        raise TraceError(
            f"classes_from_trace: duration: expected seconds > 0, got {duration!r} "
            "(a trace whose requests all arrive at once needs an explicit duration)"
        )
    rows = []
    groups = df.groupby("class", sort=False, observed=True)
    for name, g in groups:
        p = g["prompt"].to_numpy(float)
        o = g["output"].to_numpy(float)
        rows.append(
            {
                "class": str(name),
                "requests": len(g),
                "share": len(g) / len(df),
                "rate": len(g) / duration,
                "prompt_mean": p.mean(),
                "prompt_median": float(np.median(p)),
                "prompt_cv": p.std() / p.mean(),
                "prompt_log_sd": np.log(p).std(ddof=1) if p.size > 1 else 0.0,
                "output_mean": o.mean(),
                "output_median": float(np.median(o)),
                "output_cv": o.std() / o.mean(),
                "output_log_sd": np.log(o).std(ddof=1) if o.size > 1 else 0.0,
            }
        )
    out = pd.DataFrame(rows)
    if isinstance(trace, TraceWorkload):  # keep the workload's class order
        out = out.set_index("class").loc[[c for c in trace.class_names if c in set(out["class"])]].reset_index()
    return out


def classes_from_trace(
    trace: TraceWorkload | pd.DataFrame,
    *,
    patience: float | Sequence[float] = 0.0,
    lengths: str = "exponential",
    duration: float | None = None,
) -> list[RequestClass]:
    """Model classes estimated from a trace: per class the mean prompt and output tokens and the
    arrival rate ``requests / duration`` (per second, whole cluster; ``duration`` defaults to the
    span from first to last arrival, after speedup). ``lengths="lognormal"`` also sets the log-sd of
    each length. Use them in a :class:`fluidopt.core.model.Scenario` to solve the fluid LP for the trace."""
    s = summarize_trace(trace, duration=duration)
    pat = np.broadcast_to(np.asarray(patience, dtype=float), (len(s),))
    out = []
    for (_, r), th in zip(s.iterrows(), pat):
        kw: dict = {}
        if lengths == "lognormal":
            # a class with a single length value has log-sd 0; RequestClass needs sigma > 0
            kw = {"prompt_sigma": max(float(r.prompt_log_sd), 1e-6), "decode_sigma": max(float(r.output_log_sd), 1e-6)}
        out.append(
            RequestClass(str(r["class"]), prompt=float(r.prompt_mean), decode=float(r.output_mean),
                         rate=float(r.rate), patience=float(th), lengths=lengths, **kw)
        )
    return out



def fleet_load(trace: TraceWorkload | pd.DataFrame, scenario: Scenario) -> float | None:
    """The trace's load on the scenario's fleet: the GPUs the fluid model needs to serve every request
    of the trace at its observed rates and mean lengths (:func:`fluidopt.fluid.capacity.fluid_fleet_bound`
    with every class fully served), over ``scenario.gpus``. About 1 means the fleet is just big enough;
    0.003 means a trace of a small service replayed on a large fleet. None when it cannot be estimated."""
    from dataclasses import replace as _replace

    from fluidopt.fluid.capacity import fluid_fleet_bound
    from fluidopt.fluid.sli import MinServedFraction

    try:
        classes = classes_from_trace(trace)
        sc = _replace(scenario, classes=tuple(classes))
        bound = fluid_fleet_bound(sc, [MinServedFraction(c.name, 1.0) for c in classes])
    except Exception:  # noqa: BLE001 - an estimate for a warning, never a reason to fail the run
        return None
    return float(bound.gpus) / scenario.gpus
