"""Checks every command makes before doing any work: output paths, counts, sizes.

An output that cannot be written must fail in the first second, not after an hour of simulation.
"""

from __future__ import annotations

import os
from pathlib import Path

from fluidopt.core.errors import UsageError

__all__ = ["check_output_dir", "check_output_file", "check_positive_int"]


def check_output_file(path: str | os.PathLike | None, flag: str) -> None:
    """``path`` can be created or overwritten as a file: its folder exists and takes a write (a probe file
    is written, synced and removed, so a read-only or full file system is found now, not after the work)."""
    if path is None:
        return
    from fluidopt.core.files import check_writable_folder

    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {str(p)!r}: is a folder, expected a file name")
    if p.exists() and not os.access(p, os.W_OK):
        raise UsageError(f"{flag} {str(p)!r}: the file exists and is not writable")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{flag} {str(p)!r}: folder {str(parent)!r} does not exist")
    check_writable_folder(parent, f"{flag} {str(p)!r}")


def check_output_dir(path: str | os.PathLike | None, flag: str) -> None:
    """``path`` is a writable folder, created if missing (see :func:`fluidopt.core.files.check_writable_folder`)."""
    if path is None:
        return
    from fluidopt.core.files import check_writable_folder

    check_writable_folder(path, flag)


def check_positive_int(value: int | None, flag: str, *, minimum: int = 1, maximum: int = 2**31 - 1) -> None:
    """An integer count in [minimum, maximum] (None: the default applies)."""
    if value is None:
        return
    if not minimum <= value <= maximum:
        raise UsageError(f"{flag}: expected an integer in {minimum}..{maximum:,}, got {value}")
