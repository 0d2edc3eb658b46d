"""A time-model TOML, as ``fluidopt validate --fit-overheads`` writes it: the law every command that takes
``--timemodel`` reads (validate, simulate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fluidopt.core.errors import UsageError


def read_timemodel_file(path: str) -> tuple[Any, int | None]:
    """The law of a time-model TOML's ``[timemodel]`` table (seconds; ``fluidopt validate --fit-overheads``
    writes one) and its ``[engine] kv_tokens`` (None when absent). Bad input raises a one-line error naming
    the file (a law's own errors are :class:`~fluidopt.core.errors.CalibrationError`)."""
    import tomllib

    from fluidopt.calibration.timemodels import law_from_table
    from fluidopt.core.files import read_text_file

    p = Path(path)
    text = read_text_file(p, "time-model", UsageError)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"time-model file {str(p)!r}: not valid TOML: {' '.join(str(e).split())}") from None
    if "timemodel" not in data:
        raise UsageError(f"time-model file {str(p)!r}: no [timemodel] table")
    law = law_from_table(data["timemodel"], where=f"{p}: [timemodel]")
    kv = data.get("engine", {}).get("kv_tokens") if isinstance(data.get("engine"), dict) else None
    if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1):
        raise UsageError(f"time-model file {str(p)!r}: [engine] kv_tokens = {kv!r}: expected an integer >= 1")
    return law, kv
