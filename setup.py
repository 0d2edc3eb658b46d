"""Build step for the optional compiled simulator core; everything else is in pyproject.toml.

The event engine (fluidopt/sim/engine.py) is plain Python. At install time Cython compiles a copy of
it, with the static types of fluidopt/sim/engine.pxd, into the extension ``fluidopt.sim._cengine``
(about 4x faster; same numbers bit for bit). The copy carries the SHA-256 of the engine.py and
engine.pxd it was built from, so that an edited engine is never shadowed by a stale build:
fluidopt.sim.backend then falls back to engine.py with a warning.

The prefix cache (fluidopt/sim/prefix_cache.py, typed by prefix_cache.pxd) is compiled from its own
source into ``fluidopt.sim._c_prefix_cache``: engine.pxd cimports its class, so the core calls it at
C level, and the core (and every module compiled against the core) records prefix_cache.pxd's SHA-256.

Next to the core, the controllers' handlers, written once (the plain Python module
fluidopt/control/<stem>.py, a mixin of the controller, next to the static types fluidopt/sim/<stem>.pxd:
the gate-and-route family, FI-WSP and the reference FCFS policy; every such pair is found, no list), are
compiled from that same source into ``fluidopt.sim._c_<stem>``, against the core's declarations and
with the SHA-256 of both files and of the core (fluidopt.sim.controller_fastpath finds them the same
way and checks the digests).

Every module's source and .pxd are written to build/cengine first; then Cython translates the modules side
by side, one process per CPU (each translation needs only the others' .pxd files), and setuptools compiles
them side by side (``build_ext``'s parallel jobs). Cython's own utility code (typed memoryviews, error
handling, type imports) is compiled once, into ``fluidopt.sim._cyutility`` (Cython's shared utility module),
which the core and the handler modules import, instead of a copy inside each of them (the prefix cache
keeps its own copy, which its hot loops run faster with).

A reinstall (``pip install -e ".[docs]"`` after ``.[dev]``, say) does not compile again what it already
built: each extension's build key (the SHA-256 of the source it is compiled from, digests included, its
types, the compiler directives and flags, and Cython's version) is recorded with the SHA-256 of the built
file in build/cengine/stamps/, and an in-place build (fluidopt/sim/_c*.so) whose record matches is copied
instead of compiled (``reusable_build``). ``rm -rf build`` forces a full rebuild.

No compiler, no Cython, or ``FLUIDOPT_PURE_PYTHON=1`` in the environment: the install goes on
without the extension and the simulator runs engine.py (a notice is printed; nothing else changes),
unless ``FLUIDOPT_REQUIRE=compiled`` is set (CI does): then a core that cannot be built fails the
install, and the tests that need it fail instead of skipping (tests/conftest.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
ENGINE = ROOT / "fluidopt" / "sim" / "engine.py"
TYPES = ROOT / "fluidopt" / "sim" / "engine.pxd"
CACHE_TYPES = ROOT / "fluidopt" / "sim" / "prefix_cache.pxd"  # the prefix cache's class, which engine.pxd cimports
GEN = ROOT / "build" / "cengine"  # generated sources (ignored by git), laid out as the package
STAMPS = GEN / "stamps"  # what each in-place extension was built from (reusable_build)


def single_sourced() -> list[str]:
    """The stems of the controllers' handler modules written once: fluidopt/control/<stem>.py with the types
    of fluidopt/sim/<stem>.pxd (engine.pxd types the core itself), compiled as fluidopt.sim._c_<stem>."""
    return sorted(p.stem for p in (ROOT / "fluidopt" / "sim").glob("*.pxd")
                  if p.name != "engine.pxd" and (ROOT / "fluidopt" / "control" / f"{p.stem}.py").is_file())


# -ffp-contract=off: no fused multiply-add, so the compiled modules round exactly like Python. -g0: no
# debug information (setuptools' CFLAGS carry -g): the machine code is the same (.text compared byte for
# byte), and gcc does about a quarter less work on the core (26.6 -> 19.3 CPU-s), the longest step of a build
_NO_FMA = ["-O2", "-ffp-contract=off", "-g0"] if os.name != "nt" else []
# The core at -O1: its compile is the build's longest step (at -O2 19.3-21.6 CPU-s, by the machine's load; at
# -O1 11.1, back to back with the 21.6), and most of a run's time is Python (controllers, bookkeeping) calling
# into it: -O1 runs 6% more of the core's own instructions, 0.2% more of a whole simulation (callgrind, three
# policies on 60 GPUs). The handlers and the prefix cache, whose own loops are a run's hot path (the cache:
# 4-8% more instructions per simulation at -O1), stay at -O2.
_CORE_FLAGS = ["-O1" if f == "-O2" else f for f in _NO_FMA]


def build_key(module: str, source: str, types: bytes, recipe: str) -> str:
    """The SHA-256 an extension's build is recorded under: its module name, the source text Cython translates
    (the generated module, digests included), its types (.pxd) and how it is compiled (directives, flags,
    Cython's version)."""
    return hashlib.sha256(b"\0".join((module.encode(), source.encode("utf-8"), types, recipe.encode()))).hexdigest()


def reusable_build(built: Path, stamp: Path, key: str) -> bool:
    """Whether ``built`` (an earlier in-place build of an extension, or the C file Cython wrote for it) may stand
    in for making it anew: its ``stamp`` records the same build ``key`` and the SHA-256 of this very file (a
    file copied or rebuilt over it since, or a missing or unreadable stamp, means make it again)."""
    try:
        rec = json.loads(stamp.read_text(encoding="utf-8"))
        return (isinstance(rec, dict) and rec.get("key") == key
                and rec.get("sha256") == hashlib.sha256(built.read_bytes()).hexdigest())
    except (OSError, ValueError):
        return False


def write_stamp(built: Path, stamp: Path, key: str) -> None:
    """Record that ``built`` (an extension, or the C file Cython wrote) was made under build ``key``: the stamp
    :func:`reusable_build` reads."""
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps({"key": key, "sha256": hashlib.sha256(built.read_bytes()).hexdigest()}),
                     encoding="utf-8")


# Cython's utility code, shared: each module would otherwise carry its own copy (the memoryview machinery
# alone is more than half of a handler module's C), and gcc would compile it in each. Shared by the core and
# the three handler modules (the prefix cache keeps its own copy: see _prefix_cache_job), the modules' C is
# 8.8 MB instead of 10.5 and their compile 36 CPU-s instead of 45 (the handlers 8.6 instead of 21.6, the
# shared module 4.3), measured back to back under the same load.
SHARED_UTILITY = "fluidopt.sim._cyutility"


def _recipe(directives: dict, flags: list[str], shared: bool = True) -> str:
    import Cython

    return json.dumps({"directives": directives, "flags": flags, "cython": Cython.__version__,
                       "shared_utility": SHARED_UTILITY if shared else None}, sort_keys=True)


# annotations are documentation here: the static types come from the .pxd files alone. Indexing stays
# bounds-checked (controllers pass GPU and request ids in); only Python's negative-index wrap-around is
# off, which the engine never uses.
_DIRECTIVES = {"language_level": "3", "binding": False, "annotation_typing": False, "boundscheck": True,
               "wraparound": False}


def _inplace(ext: Extension) -> Path:
    """Where an editable install keeps ``ext``'s built file: next to its package's sources."""
    from sysconfig import get_config_var

    return ROOT.joinpath(*ext.name.split(".")).with_name(ext.name.rsplit(".", 1)[1] + get_config_var("EXT_SUFFIX"))


def _stamp(ext: Extension) -> Path:
    """Where the stamp of ``ext``'s built extension is kept (write_stamp / reusable_build)."""
    return STAMPS / f"{ext.name}.json"


def _reused(ext: Extension) -> bool:
    """The in-place build of ``ext`` matches its build key: no need to translate it (OptionalBuildExt copies it)."""
    return reusable_build(_inplace(ext), _stamp(ext), ext.fluidopt_key)


def _required() -> bool:
    """FLUIDOPT_REQUIRE=compiled (CI, and a developer editing the engine): the core must build."""
    return "compiled" in {x.strip() for x in os.environ.get("FLUIDOPT_REQUIRE", "").split(",")}


def _notice(msg: str, fallback: str = "the simulator will run its pure-Python engine") -> None:
    if _required():
        raise SystemExit(f"fluidopt: {msg}, and FLUIDOPT_REQUIRE=compiled is set: the compiled core must build")
    sys.stderr.write(f"fluidopt: {msg}; {fallback} (same results, slower)\n")


def _extensions() -> list[Extension]:
    if os.environ.get("FLUIDOPT_PURE_PYTHON", "").strip() not in ("", "0"):
        _notice("FLUIDOPT_PURE_PYTHON is set: not compiling the simulator core")
        return []
    try:
        from Cython.Build import cythonize  # noqa: F401 (the translation jobs import it again)
    except ImportError:
        _notice("Cython is not available: not compiling the simulator core")
        return []
    src = ENGINE.read_bytes()
    pkg = GEN / "fluidopt" / "sim"
    pkg.mkdir(parents=True, exist_ok=True)
    for init in (GEN / "fluidopt" / "__init__.py", pkg / "__init__.py"):
        init.touch()
    # every module's source and .pxd are written before any is translated: engine.pxd cimports the prefix
    # cache's class and the handlers' .pxd files cimport the core's, so each translation needs only .pxd files
    cache = _prefix_cache_job()
    py = pkg / "_cengine.py"
    digest = hashlib.sha256(src + b"\0" + TYPES.read_bytes()).hexdigest()  # as fluidopt.sim.backend checks it
    text = core_source(src, TYPES.read_bytes(), CACHE_TYPES.read_bytes())
    if not py.exists() or py.read_text(encoding="utf-8") != text:
        py.write_text(text, encoding="utf-8")
    pxd = pkg / "_cengine.pxd"  # Cython finds a module's .pxd by its dotted name: fluidopt/sim/_cengine.pxd
    if not pxd.exists() or pxd.read_bytes() != TYPES.read_bytes():
        shutil.copyfile(TYPES, pxd)
    ext = Extension("fluidopt.sim._cengine", [str(py.relative_to(ROOT))], extra_compile_args=_CORE_FLAGS)
    ext.fluidopt_key = build_key(ext.name, text, TYPES.read_bytes(), _recipe(_DIRECTIVES, ext.extra_compile_args))
    core = _Job(ext, "the simulator core", "the simulator will run its pure-Python engine")
    shared = _shared_utility_job()
    jobs = [core] + _single_sourced_jobs(digest) + [cache, shared]
    built = _translate(jobs)
    if any(built[j.ext.name] is None for j in (core, cache, shared)):
        return []  # (the notice is printed) the core imports the cache's compiled class and the shared utility code
    # the largest C first (build_ext's pool takes them in order): on 2 cores the core and the prefix cache, about
    # 11 and 12 CPU-s, compile side by side, then the rest, instead of one of them starting last
    return sorted((e for job in jobs for e in built[job.ext.name] or []), key=lambda e: -_size(e.sources[0]))


def _size(path: str) -> int:
    try:
        return os.path.getsize(ROOT / path)
    except OSError:
        return 0


class _Job:
    """One extension to translate: its Extension (with ``fluidopt_key``), what the notice says if Cython
    fails on it (``source``) and what runs instead (``fallback``), and whether it imports the shared utility
    code (``shared``) or carries its own copy."""

    def __init__(self, ext: Extension, source: str, fallback: str, shared: bool = True) -> None:
        self.ext, self.source, self.fallback, self.shared = ext, source, fallback, shared


def _shared_utility_job() -> _Job:
    """fluidopt.sim._cyutility: Cython's utility code, which the core and the handler modules import instead of
    carrying a copy. Cython writes its C (build/cengine/fluidopt/sim/_cyutility.c) when it translates them; what
    it holds depends only on Cython's version, which the build key records."""
    c_file = GEN / "fluidopt" / "sim" / "_cyutility.c"
    ext = Extension(SHARED_UTILITY, [str(c_file.relative_to(ROOT))], extra_compile_args=_NO_FMA)
    ext.fluidopt_key = build_key(ext.name, "", b"", _recipe(_DIRECTIVES, _NO_FMA))
    return _Job(ext, "Cython's shared utility code", "the simulator will run its pure-Python engine")


def _c_file(ext: Extension) -> Path:
    """Where Cython writes the C of ``ext`` (next to its source under build/cengine)."""
    return (ROOT / ext.sources[0]).with_suffix(".c")


def _c_stamp(ext: Extension) -> Path:
    """Where the stamp of the C file Cython wrote for ``ext`` is kept (beside the extensions' own)."""
    return STAMPS / f"{ext.name}.c.json"


def _cythonize(exts: list[Extension], nthreads: int = 0, shared: bool = True) -> list[Extension]:
    from Cython.Build import cythonize

    # Cython keeps a C file newer than its source, whatever directives or shared module it was translated with:
    # one translated under another build key is removed first, so that Cython writes it anew. One of the same
    # key is kept, which matters within one install: pip runs setup.py three times (requirements, metadata,
    # build), and only the first translates
    for e in exts:
        if not reusable_build(_c_file(e), _c_stamp(e), e.fluidopt_key):
            _c_file(e).unlink(missing_ok=True)
    out = cythonize(exts, include_path=[str(GEN)], quiet=True, compiler_directives=_DIRECTIVES, nthreads=nthreads,
                    shared_utility_qualified_name=SHARED_UTILITY if shared else None)
    for e in exts:
        write_stamp(_c_file(e), _c_stamp(e), e.fluidopt_key)
    keys = {e.name: e.fluidopt_key for e in exts}
    for e in out:
        e.fluidopt_key = keys[e.name]
    return out


def _translate(jobs: list[_Job]) -> dict[str, list[Extension] | None]:
    """Each job's translated extensions by module name (an in-place build of the same key stands as it is; None
    where Cython failed, with its notice printed). Cython translates them side by side (its ``nthreads``, one
    process per CPU: about 18 CPU-s of translation in all, the core's 4.7); if that fails, one at a time, to
    tell which failed."""
    out: dict[str, list[Extension] | None] = {}
    todo = []
    for job in jobs:
        if _reused(job.ext):
            out[job.ext.name] = [job.ext]
        else:
            todo.append(job)
    if not todo:
        return out
    try:
        done = []
        for shared in (True, False):
            part = [j.ext for j in todo if j.shared == shared]
            if part:
                done += _cythonize(part, nthreads=min(len(part), os.cpu_count() or 1), shared=shared)
        for j in todo:
            out[j.ext.name] = [e for e in done if e.name == j.ext.name]
        return out
    except Exception:  # a Cython error must not stop the install: find the module(s) and go on without them
        pass
    for j in todo:
        try:
            out[j.ext.name] = _cythonize([j.ext], shared=j.shared)
        except Exception as exc:
            _notice(f"Cython could not translate {j.source} ({exc})", j.fallback)
            out[j.ext.name] = None
    return out


def core_source(src: bytes, types: bytes, cache_types: bytes) -> str:
    """The text compiled as fluidopt.sim._cengine: engine.py (``src``) plus the digest of it and engine.pxd
    (``types``) that fluidopt.sim.backend checks, and the digest of the prefix_cache.pxd (``cache_types``)
    whose class the core calls at C level: so the core's build key changes with that .pxd too."""
    digest = hashlib.sha256(src + b"\0" + types).hexdigest()
    return src.decode("utf-8") + (
        "\n\n# Added by setup.py: the engine.py and engine.pxd this compiled core was built from, and the\n"
        "# prefix_cache.pxd whose class it calls (part of its build key; fluidopt.sim.backend checks both).\n"
        f'SOURCE_SHA256 = "{digest}"\n'
        f'PREFIX_CACHE_TYPES_SHA256 = "{hashlib.sha256(cache_types).hexdigest()}"\n'
        "_COMPILED = True  # typed arrays for the state (engine._ints)\n"
    )


def _prefix_cache_job() -> _Job:
    """fluidopt.sim._c_prefix_cache: fluidopt/sim/prefix_cache.py compiled as is with the types of
    prefix_cache.pxd, plus their digest (fluidopt.sim.prefix_cache.compiled_class checks it)."""
    src = (ROOT / "fluidopt" / "sim" / "prefix_cache.py").read_bytes()
    types = CACHE_TYPES.read_bytes()
    note = ("\n\n# Added by setup.py: the digest of fluidopt/sim/prefix_cache.py and prefix_cache.pxd.\n"
            f'SOURCE_SHA256 = "{single_source_digest(src, types)}"\n')
    # no bounds checks here: the cache indexes its own arrays by its own state, per block (about a third
    # fewer instructions); the Python engine runs the same source with checked indexing in the tests. Said
    # in the file's header, which takes precedence over the directives given to cythonize for all modules
    head = "# cython: boundscheck=False\n"
    # it keeps its own copy of Cython's utility code: importing the shared one, a run on the Mooncake trace
    # executed 0.9% more instructions per request (callgrind), with its own copy 0.3%; the core's and the
    # handlers' runs moved by 0.2% or less either way
    return _sourced_job("_c_prefix_cache", head + src.decode("utf-8") + note, types, "fluidopt/sim/prefix_cache.py",
                        "the prefix cache will run as Python", {**_DIRECTIVES, "boundscheck": False}, shared=False)


def _sourced_job(module: str, text: str, types: bytes, source: str, fallback: str,
                 directives: dict = _DIRECTIVES, shared: bool = True) -> _Job:
    """fluidopt.sim.MODULE from ``text`` (a module's source plus its digests) and ``types`` (its .pxd), both
    written under build/cengine, to be translated by Cython (unless an in-place build of the same key exists);
    ``directives``, the module's own, go in its build key (a module whose differ from ``_DIRECTIVES`` says so
    in its text's header)."""
    pkg = GEN / "fluidopt" / "sim"
    py = pkg / f"{module}.py"
    if not py.exists() or py.read_text(encoding="utf-8") != text:
        py.write_text(text, encoding="utf-8")
    pxd = pkg / f"{module}.pxd"
    if not pxd.exists() or pxd.read_bytes() != types:
        pxd.write_bytes(types)
    ext = Extension(f"fluidopt.sim.{module}", [str(py.relative_to(ROOT))], extra_compile_args=_NO_FMA)
    ext.fluidopt_key = build_key(ext.name, text, types, _recipe(directives, _NO_FMA, shared))
    return _Job(ext, source, fallback, shared)


def single_source_digest(py: bytes, pxd: bytes) -> str:
    """The SHA-256 a single-sourced handler module is checked by (fluidopt.sim.controller_fastpath)."""
    return hashlib.sha256(py + b"\0" + pxd).hexdigest()


def _single_sourced_jobs(engine_digest: str) -> list[_Job]:
    """fluidopt.sim._c_<stem> for each single-sourced handler module: the control module's source, compiled as
    is with the types of its .pxd, plus the digests it is checked by at run time."""
    out: list[_Job] = []
    for stem in single_sourced():
        src = (ROOT / "fluidopt" / "control" / f"{stem}.py").read_bytes()
        types = (ROOT / "fluidopt" / "sim" / f"{stem}.pxd").read_bytes()
        text = src.decode("utf-8") + (
            f"\n\n# Added by setup.py: the digest of fluidopt/control/{stem}.py and fluidopt/sim/{stem}.pxd, and of "
            "the engine core this module was built against.\n"
            f'SOURCE_SHA256 = "{single_source_digest(src, types)}"\n'
            f'ENGINE_SHA256 = "{engine_digest}"\n'
            # (engine.pxd cimports the prefix cache's class: a module compiled against the core is rebuilt with it)
            f'PREFIX_CACHE_TYPES_SHA256 = "{hashlib.sha256(CACHE_TYPES.read_bytes()).hexdigest()}"\n'
        )
        out.append(_sourced_job(f"_c_{stem}", text, types, f"fluidopt/control/{stem}.py",
                                "the controller will run its Python handlers"))
    return out


class OptionalBuildExt(build_ext):
    """Build the compiled core if a C compiler works; otherwise go on without it."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            # the core and the handler modules compile side by side (distutils' thread pool, one gcc per
            # extension): on 2 cores the build takes about the core's own compile instead of the sum
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler, missing headers, ...
            _notice(f"building the compiled simulator core failed ({exc})")

    def build_extension(self, ext) -> None:
        key = getattr(ext, "fluidopt_key", None)
        built = Path(self.get_ext_fullpath(ext.name))
        if key is not None and _reused(ext):
            # an editable install builds into a fresh temporary folder and copies back to the sources: without
            # this, every reinstall would compile the unchanged core again (about a minute on 2 cores)
            sys.stderr.write(f"fluidopt: {ext.name}: reusing the in-place build of the same sources\n")
            if built.resolve() != _inplace(ext).resolve():
                built.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(_inplace(ext), built)
            return
        # not reused means compile: distutils would skip an extension whose file is newer than its C source, so
        # a change of flags alone (the build key's recipe) would keep the old file under the new key's stamp
        self.force = True
        try:
            super().build_extension(ext)
        except Exception as exc:
            _notice(f"building {ext.name} failed ({exc})")
            return
        if key is not None and built.is_file():
            write_stamp(built, _stamp(ext), key)


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import it for reusable_build
    setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
