"""File plumbing shared by the loaders and writers: precise read errors, never half-written outputs."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fluidopt.core.errors import FolderInUseError, OutputError


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
        try:
            yield tmp
            os.replace(tmp, path)
        except OSError as e:  # a full or read-only disk: the file named, not an internal error
            raise _os_error(path, e, "cannot write") from None
    finally:
        if tmp.exists():
            tmp.unlink()


# -- output folders: checked before the work, one writer, one generation of tables ------------------
_TMP = re.compile(r"^\.(?P<stem>.+)\.tmp-(?P<pid>\d+)(?P<suffix>\.[^.]*)?$")
LOCK_FILE = ".fluidopt.lock"
JOURNAL_SUFFIX = ".generation.json"
_held: dict[Path, tuple[object, int]] = {}  # folder -> (filelock lock, depth): the folders this process holds


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _os_error(path: Path, e: OSError, doing: str) -> OutputError:
    reason = e.strerror or type(e).__name__
    return OutputError(f"{doing} {str(path)!r}: {reason}")


def check_writable_folder(path: str | os.PathLike, flag: str = "--out") -> Path:
    """Create ``path`` if missing and prove it writable by writing, syncing and removing a small probe
    file; a missing parent, a file in the way, a read-only or full file system is an :class:`OutputError`
    naming the path, raised before any work. (A probe write, not ``os.access``: root passes
    ``os.access`` on read-only folders, and only a write finds a full disk.)"""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputError(f"{flag} {str(p)!r}: exists and is not a folder")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _os_error(p, e, f"{flag}: cannot create the folder") from None
    probe = p / f".fluidopt-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, b"x" * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise _os_error(p, e, f"{flag}: cannot write in the folder") from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return p


def clean_stale_temps(folder: Path) -> list[Path]:
    """Remove temporary files (``.NAME.tmp-PID.EXT``, ``.fluidopt-probe-PID``) that a killed process left
    in ``folder``; a live process's own are left alone. Returns the files removed."""
    removed = []
    if not folder.is_dir():
        return removed
    for f in folder.iterdir():
        m = _TMP.match(f.name)
        pid = int(m["pid"]) if m else None
        if pid is None and f.name.startswith(".fluidopt-probe-") and f.name[16:].isdigit():
            pid = int(f.name[16:])
        if pid is None or (pid != os.getpid() and _pid_alive(pid)) or f.name.endswith(JOURNAL_SUFFIX):
            continue
        with contextlib.suppress(OSError):
            f.unlink()
            removed.append(f)
    return removed


def holds(folder: str | os.PathLike) -> bool:
    """True while this process holds ``folder``'s lock."""
    return Path(folder).resolve() in _held


@contextlib.contextmanager
def lock_folder(folder: str | os.PathLike, flag: str = "--out", command: str = "") -> Iterator[Path]:
    """Hold ``folder`` as its only writer: an exclusive ``flock`` on ``folder/.fluidopt.lock`` (taken with
    ``filelock``), which records the holder's PID. The kernel drops the lock when its process dies, however
    it dies, so a stale lock (a lock file left by a killed process) is simply taken over; a live holder is a
    :class:`FolderInUseError` (exit 2) naming its PID. Re-entrant within a process. On entry, finishes
    an interrupted table generation (:func:`write_generation`) and removes dead processes' temporary
    files."""
    p = Path(folder)
    key = p.resolve()
    if key in _held:  # held already: proved writable when it was taken (no second probe write and sync)
        held, depth = _held[key]
        _held[key] = (held, depth + 1)
        try:
            yield p
        finally:
            held, depth = _held[key]
            _held[key] = (held, depth - 1)
        return
    p = check_writable_folder(p, flag)
    lock = p / LOCK_FILE
    held = _acquire(lock, flag, p, command)
    try:
        _held[key] = (held, 1)
        recover_generation(p)
        clean_stale_temps(p)
        yield p
    finally:
        _held.pop(key, None)
        with contextlib.suppress(OSError):
            lock.unlink()  # still holding it: a process that opened it meanwhile finds it unlinked and retries
        held.release()


def _acquire(lock: Path, flag: str, folder: Path, command: str):
    # filelock >= 3.31 leaves a held file's contents alone when another process fails to take it (older
    # ones truncated it on open), so the PID written here is still there for the refused process to name.
    from filelock import FileLock, Timeout

    record = f"{os.getpid()} {command}".strip().encode() + b"\n"

    def write_holder(fd: int) -> None:
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)

    for _ in range(100):
        # thread_local=False: the app may take a folder in one thread and leave it from another
        held = FileLock(lock, blocking=False, thread_local=False, on_acquired=write_holder)
        try:
            held.acquire()
            return held
        except Timeout:
            holder = _holder(lock)
            if holder is None:
                continue  # its holder removed it as we tried (or filelock saw the inode unlinked): try again
            who = f"process {holder[0]}" if holder else "another process"
            what = f" ({' '.join(holder[1:])})" if len(holder) > 1 else ""
            raise FolderInUseError(f"{flag} {str(folder)!r}: in use by {who}{what}; wait for it to finish, or "
                                   "write to another folder") from None
        except OSError as e:
            raise _os_error(lock, e, f"{flag}: cannot create the lock file") from None
    raise FolderInUseError(f"{flag} {str(folder)!r}: could not take its lock file {str(lock)!r}")


def _holder(lock: Path) -> list[str] | None:
    """The holder's record (PID, then the command) split in words; None when the file is gone."""
    try:
        return lock.read_bytes()[:200].decode(errors="replace").split()
    except FileNotFoundError:
        return None
    except OSError:
        return []


@contextlib.contextmanager
def maybe_lock(folder: str | os.PathLike | None, flag: str = "--out", command: str = "") -> Iterator[Path | None]:
    """:func:`lock_folder` when ``folder`` is given, else nothing."""
    if folder is None:
        yield None
        return
    with lock_folder(folder, flag, command) as p:
        yield p


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_generation(folder: str | os.PathLike, writers: dict[str, Callable[[Path], object]],
                     owned: Iterable[str] = ()) -> list[Path]:
    """Write a set of tables and figures into ``folder`` as one generation: all of them replace the old
    ones, or none does.

    ``writers`` maps a file name to a function that writes that file at the path it is given. Each is
    written to a temporary file beside its target and synced; then a journal listing the renames is
    written and synced, the renames are made, files of ``owned`` that this generation did not write
    are removed (a table an earlier, different sweep wrote must not sit beside this one's), and the
    journal is removed. A crash before the journal leaves the old generation; a crash after it is
    finished by the next :func:`lock_folder` (:func:`recover_generation`). An ``OSError`` (a full or
    read-only disk) is an :class:`OutputError` naming the file, with the old generation intact.
    """
    d = Path(folder)
    pid = os.getpid()
    temps: dict[str, str] = {}
    try:
        for name, write in writers.items():
            target = d / name
            tmp = target.with_name(f".{target.stem}.tmp-{pid}{target.suffix}")
            temps[name] = tmp.name
            try:
                write(tmp)
                _fsync_file(tmp)
            except OSError as e:
                raise _os_error(target, e, "cannot write") from None
        stale = sorted(set(owned) - set(writers))
        journal = d / f".{pid}{JOURNAL_SUFFIX}"
        try:
            with open(journal, "w", encoding="utf-8") as fh:
                json.dump({"rename": temps, "remove": stale}, fh)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as e:
            with contextlib.suppress(OSError):
                journal.unlink()
            raise _os_error(journal, e, "cannot write") from None
    except BaseException:
        for t in temps.values():
            with contextlib.suppress(OSError):
                (d / t).unlink()
        raise
    _fsync_dir(d)
    _apply_journal(d, journal)
    return [d / name for name in writers]


def _apply_journal(d: Path, journal: Path) -> None:
    plan = json.loads(journal.read_text(encoding="utf-8"))
    for name, tmp in plan["rename"].items():
        if (d / tmp).exists():
            os.replace(d / tmp, d / name)
    for name in plan["remove"]:
        with contextlib.suppress(FileNotFoundError):
            (d / name).unlink()
    _fsync_dir(d)
    journal.unlink()


def recover_generation(folder: Path) -> bool:
    """Finish a generation whose journal was written but whose renames a crash cut short. True if one was."""
    done = False
    for journal in sorted(folder.glob(f".*{JOURNAL_SUFFIX}")):
        try:
            _apply_journal(folder, journal)
            done = True
        except (OSError, ValueError, KeyError):
            with contextlib.suppress(OSError):
                journal.unlink()  # a torn journal: its generation never committed
    return done
