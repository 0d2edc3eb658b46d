"""JSON-lines traces with prompt block hashes: the Mooncake format and others with stated field names.

One JSON object per line. The Mooncake release (FAST'25) has ``timestamp`` (milliseconds since the
trace's start), ``input_length``, ``output_length`` and ``hash_ids``: the prompt's KV blocks of 512
tokens each, as ids that two requests share exactly when they share that block *and every block
before it* (chained hashes). Another trace names its own fields and block size
(:class:`JsonlFormat`).

Every line is checked with the :mod:`json` module (not ``pandas.read_json``, whose errors name neither
the line nor the field): a bad line raises :class:`fluidopt.core.errors.TraceError` with one line naming
the file, the line, the field, the value and what was expected, e.g. ``conv.jsonl: line 17:
input_length = -3: expected a non-negative integer``. Cases: a line that is not a JSON object, a missing
field, a negative or non-integer length or time, hash ids that are not a list of integers or strings,
more hash ids than ceil(prompt / block size), a block size <= 0, a file without requests. Policies
shared with the CSV readers (docs/workloads.md): times relative to the first request, rows out of time
order stably sorted with a :class:`TraceWarning`, a 0-token count raised to 1 and noted, blank lines
skipped.

Hash ids are interned to dense integers 0, 1, ... in order of first appearance (an id is a key, its
value means nothing), so strings and integers both work and the cache model indexes arrays.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fluidopt.core.errors import TraceError
from fluidopt.workloads.base import TraceWarning

__all__ = ["MOONCAKE", "JsonlFormat", "is_jsonl", "parse_format", "read_jsonl_trace"]

# the same bound as the CSV readers': no model's context is longer
_MAX_TOKENS = 100_000_000


@dataclass(frozen=True)
class JsonlFormat:
    """The field names of a JSON-lines trace and its units.

    ``time`` (in ``time_unit`` seconds: 0.001 for milliseconds), ``prompt`` and ``output`` (tokens) are
    required in every line; ``hashes`` (a list of block ids) may be None for a trace without them, and a
    line may then omit it; ``cls`` names an optional class-label field. ``block_size``: tokens per KV
    block (an integer >= 1).
    """

    time: str = "timestamp"
    prompt: str = "input_length"
    output: str = "output_length"
    hashes: str | None = "hash_ids"
    cls: str | None = None
    time_unit: float = 0.001
    block_size: int = 512

    def check(self, label: str) -> None:
        b = self.block_size
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
            raise TraceError(f"{label}: block size = {b!r}: expected an integer >= 1 (tokens per KV block)")
        u = self.time_unit
        if isinstance(u, bool) or not isinstance(u, (int, float)) or not (math.isfinite(u) and u > 0):
            raise TraceError(f"{label}: time unit = {u!r}: expected seconds > 0 (0.001 for milliseconds)")
        for what in ("time", "prompt", "output", "hashes", "cls"):
            v = getattr(self, what)
            if v is not None and (not isinstance(v, str) or not v):
                raise TraceError(f"{label}: {what} field name = {v!r}: expected a non-empty string")


def parse_format(spec: str, where: str = "--trace-format") -> JsonlFormat:
    """A format from ``KEY=VALUE,...`` over the Mooncake one: keys ``time``, ``prompt``, ``output``, ``hashes``
    (``none``: no hashes), ``class``, ``unit`` (seconds per time unit) and ``block`` (tokens per block);
    e.g. ``time=ts,unit=1,hashes=blocks,block=16``. A bad spec is one line naming ``where``."""
    names = {"time": "time", "prompt": "prompt", "output": "output", "hashes": "hashes", "class": "cls",
             "unit": "time_unit", "block": "block_size"}
    kw: dict = {}
    for part in filter(None, (p.strip() for p in str(spec).split(","))):
        key, sep, value = (x.strip() for x in part.partition("="))
        if not sep or key not in names or not value:
            raise TraceError(f"{where}: {part!r}: expected KEY=VALUE with KEY one of {', '.join(names)}")
        if names[key] in kw:
            raise TraceError(f"{where}: {key}: given twice")
        if key in ("unit", "block"):
            try:
                num = float(value) if key == "unit" else int(value)
            except ValueError:
                raise TraceError(f"{where}: {key} = {value!r}: expected "
                                 f"{'seconds per time unit' if key == 'unit' else 'an integer'}") from None
            kw[names[key]] = num
        else:
            kw[names[key]] = None if key == "hashes" and value.lower() == "none" else value
    fmt = JsonlFormat(**kw)
    fmt.check(where)
    return fmt


MOONCAKE = JsonlFormat()
"""The Mooncake trace format: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``, 512-token blocks."""


def is_jsonl(path: str | os.PathLike) -> bool:
    """Whether the file's first non-blank byte opens a JSON object (one object per line)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] == b"{"


def _count(label: str, line: int, field: str, v) -> int:
    # json gives int for 12 and float for 12.0: an integral float is the same count; bool is not a number
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or v != int(v) \
            or v > _MAX_TOKENS:
        raise TraceError(f"{label}: line {line}: {field} = {json.dumps(v)}: expected a non-negative integer "
                         f"at most {_MAX_TOKENS:,}")
    return int(v)


def read_jsonl_trace(path: str | os.PathLike, fmt: JsonlFormat = MOONCAKE, *, sort: bool = True) -> pd.DataFrame:
    """Read a JSON-lines trace into a frame like the CSV readers' (``time`` in seconds since the first
    request, ``prompt``, ``output``, ``row`` = the 1-based line in the file, ``class`` when ``fmt.cls``
    is set) plus ``hashes``: per request a read-only int64 array of interned block ids (empty when the
    line has none). ``frame.attrs["block_size"]`` is the block size in tokens."""
    p = Path(path)
    label = p.name
    fmt.check(label)
    if p.is_dir():
        raise TraceError(f"{label}: is a folder, expected a JSON-lines trace file")
    try:
        text = p.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:
        raise TraceError(f"{label}: not a UTF-8 text file ({e.reason} at byte {e.start})") from None
    B = int(fmt.block_size)
    ids: dict = {}
    t, prompt, output, rows, hashes, classes = [], [], [], [], [], []
    required = [fmt.time, fmt.prompt, fmt.output] + ([fmt.cls] if fmt.cls else [])
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise TraceError(f"{label}: line {line}: not valid JSON ({e.msg} at column {e.colno}): expected one "
                             "JSON object per line") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{label}: line {line}: a JSON {type(obj).__name__}, expected one JSON object per line")
        for f in required:
            if f not in obj:
                raise TraceError(f"{label}: line {line}: missing field {f!r} (the line has "
                                 f"{', '.join(map(repr, obj)) or 'no fields'}); expected {', '.join(map(repr, required))}")
        tv = obj[fmt.time]
        if isinstance(tv, bool) or not isinstance(tv, (int, float)) or not math.isfinite(tv) or tv < 0:
            raise TraceError(f"{label}: line {line}: {fmt.time} = {json.dumps(tv)}: expected a time >= 0 "
                             f"(in units of {fmt.time_unit:g} s)")
        n_in = _count(label, line, fmt.prompt, obj[fmt.prompt])
        n_out = _count(label, line, fmt.output, obj[fmt.output])
        h = obj.get(fmt.hashes, []) if fmt.hashes else []
        if fmt.hashes and fmt.hashes not in obj:
            raise TraceError(f"{label}: line {line}: missing field {fmt.hashes!r} (the line has "
                             f"{', '.join(map(repr, obj))}); expected a list of block ids (a format without "
                             "hashes states none)")
        if not isinstance(h, list) or any(isinstance(x, bool) or not isinstance(x, (int, str)) for x in h):
            raise TraceError(f"{label}: line {line}: {fmt.hashes} = {json.dumps(h)[:60]}: expected a list of "
                             "block ids (integers or strings)")
        most = math.ceil(max(n_in, 1) / B)
        if len(h) > most:
            raise TraceError(f"{label}: line {line}: {fmt.hashes} has {len(h)} ids: expected at most "
                             f"ceil({fmt.prompt} / block size) = ceil({n_in} / {B}) = {most}")
        hashes.append(np.fromiter((ids.setdefault(x, len(ids)) for x in h), dtype=np.int64, count=len(h)))
        t.append(float(tv) * fmt.time_unit)
        prompt.append(n_in)
        output.append(n_out)
        rows.append(line)
        if fmt.cls:
            classes.append(str(obj[fmt.cls]))
    if not t:
        raise TraceError(f"{label}: empty file: expected one JSON object per line with fields "
                         f"{', '.join(map(repr, required + ([fmt.hashes] if fmt.hashes else [])))}")
    t_arr = np.asarray(t, dtype=float)
    order = np.arange(t_arr.size)
    notes: list[str] = []
    dec = np.flatnonzero(np.diff(t_arr) < 0)
    if dec.size:
        msg = (f"{label}: line {rows[int(dec[0]) + 1]}: {fmt.time} is earlier than the previous line's "
               f"({dec.size} line(s) out of order)")
        if not sort:
            raise TraceError(msg + ": expected nondecreasing times (pass sort=True to sort them)")
        order = np.argsort(t_arr, kind="stable")
        notes.append(msg + "; lines sorted by time (stable)")
    cols = {"prompt": np.asarray(prompt, dtype=np.int64)[order], "output": np.asarray(output, dtype=np.int64)[order]}
    for name, arr in cols.items():
        z = int((arr == 0).sum())
        if z:
            arr[arr == 0] = 1
            notes.append(f"{label}: {z} line(s) with 0 {name} tokens raised to 1")
    for n in notes:
        warnings.warn(n, TraceWarning, stacklevel=2)
    t_arr = t_arr[order]
    hs = np.empty(len(hashes), dtype=object)
    for k, i in enumerate(order):
        a = hashes[int(i)]
        a.setflags(write=False)
        hs[k] = a
    df = pd.DataFrame({"time": t_arr - t_arr[0], **cols, "row": np.asarray(rows, dtype=np.int64)[order], "hashes": hs})
    if fmt.cls:
        df["class"] = np.asarray(classes, dtype=object)[order]
    df.attrs["notes"] = tuple(notes)
    df.attrs["source"] = label
    df.attrs["block_size"] = B
    return df
