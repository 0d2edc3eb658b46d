"""Checks every command makes before doing any work: output paths, counts, sizes.

An output that cannot be written must fail in the first second, not after an hour of simulation.
"""

from __future__ import annotations

import os
from pathlib import Path

from fluidopt.errors import UsageError

__all__ = ["check_output_dir", "check_output_file", "check_positive_int"]


def _writable_dir(d: Path, flag: str, what: str) -> None:
    if not d.exists():
        raise UsageError(f"{flag} {what}: folder {str(d)!r} does not exist")
    if not d.is_dir():
        raise UsageError(f"{flag} {what}: {str(d)!r} is not a folder")
    if not os.access(d, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {what}: folder {str(d)!r} is not writable")


def check_output_file(path: str | os.PathLike | None, flag: str) -> None:
    """``path`` can be created or overwritten as a file (its folder exists and is writable)."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {str(p)!r}: is a folder, expected a file name")
    if p.exists() and not os.access(p, os.W_OK):
        raise UsageError(f"{flag} {str(p)!r}: the file exists and is not writable")
    _writable_dir(p.parent if str(p.parent) else Path("."), flag, repr(str(p)))


def check_output_dir(path: str | os.PathLike | None, flag: str) -> None:
    """``path`` is a writable folder, or one that can be created (its parent exists and is writable)."""
    if path is None:
        return
    p = Path(path)
    if p.exists():
        if not p.is_dir():
            raise UsageError(f"{flag} {str(p)!r}: exists and is not a folder")
        _writable_dir(p, flag, repr(str(p)))
    else:
        _writable_dir(p.parent if str(p.parent) else Path("."), flag, repr(str(p)))


def check_positive_int(value: int | None, flag: str, *, minimum: int = 1, maximum: int = 2**31 - 1) -> None:
    """An integer count in [minimum, maximum] (None: the default applies)."""
    if value is None:
        return
    if not minimum <= value <= maximum:
        raise UsageError(f"{flag}: expected an integer in {minimum}..{maximum:,}, got {value}")
