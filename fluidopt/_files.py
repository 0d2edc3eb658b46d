"""File plumbing shared by the loaders and writers: precise read errors, never half-written outputs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def read_text_file(path: str | os.PathLike, what: str, error: type[Exception]) -> str:
    """The UTF-8 text of ``path``; a missing or unreadable file raises ``error`` naming ``what`` and the path."""
    p = Path(path)
    if p.is_dir():
        raise error(f"{what} file {str(p)!r}: is a folder, expected a file")
    if not p.is_file():
        raise error(f"{what} file {str(p)!r}: no such file")
    try:
        # utf-8-sig: a byte-order mark (as some Windows editors write) is not part of the text
        return p.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{what} file {str(p)!r}: cannot read it: {e}") from None


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it onto ``path``, on failure remove it.

    The temporary name keeps the suffix, so writers that infer a format from it (savefig) still work.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
