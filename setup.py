"""Build step for the optional compiled simulator core; everything else is in pyproject.toml.

The event engine (fluidopt/sim/engine.py) is plain Python. At install time Cython compiles a copy of
it, with the static types of fluidopt/sim/engine.pxd, into the extension ``fluidopt.sim._cengine``
(about 4x faster; same numbers bit for bit). The copy carries the SHA-256 of the engine.py and
engine.pxd it was built from, so that an edited engine is never shadowed by a stale build:
fluidopt.sim.backend then falls back to engine.py with a warning.

Next to it, the controllers' handlers, written once (the plain Python module
fluidopt/control/<stem>.py, a mixin of the controller, next to the static types fluidopt/sim/<stem>.pxd:
the gate-and-route family, FI-WSP and the reference FCFS policy; every such pair is found, no list), are
compiled from that same source into ``fluidopt.sim._c_<stem>``, against the core's declarations and
with the SHA-256 of both files and of the core (fluidopt.sim.controller_fastpath finds them the same
way and checks the digests).

No compiler, no Cython, or ``FLUIDOPT_PURE_PYTHON=1`` in the environment: the install goes on
without the extension and the simulator runs engine.py (a notice is printed; nothing else changes),
unless ``FLUIDOPT_REQUIRE=compiled`` is set (CI does): then a core that cannot be built fails the
install, and the tests that need it fail instead of skipping (tests/conftest.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
ENGINE = ROOT / "fluidopt" / "sim" / "engine.py"
TYPES = ROOT / "fluidopt" / "sim" / "engine.pxd"
GEN = ROOT / "build" / "cengine"  # generated sources (ignored by git), laid out as the package


def single_sourced() -> list[str]:
    """The stems of the controllers' handler modules written once: fluidopt/control/<stem>.py with the types
    of fluidopt/sim/<stem>.pxd (engine.pxd types the core itself), compiled as fluidopt.sim._c_<stem>."""
    return sorted(p.stem for p in (ROOT / "fluidopt" / "sim").glob("*.pxd")
                  if p.name != "engine.pxd" and (ROOT / "fluidopt" / "control" / f"{p.stem}.py").is_file())


_NO_FMA = ["-O2", "-ffp-contract=off"] if os.name != "nt" else []  # round exactly like Python


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
        from Cython.Build import cythonize
    except ImportError:
        _notice("Cython is not available: not compiling the simulator core")
        return []
    src = ENGINE.read_bytes()
    pkg = GEN / "fluidopt" / "sim"
    pkg.mkdir(parents=True, exist_ok=True)
    for init in (GEN / "fluidopt" / "__init__.py", pkg / "__init__.py"):
        init.touch()
    py = pkg / "_cengine.py"
    digest = hashlib.sha256(src + b"\0" + TYPES.read_bytes()).hexdigest()  # as fluidopt.sim.backend checks it
    text = src.decode("utf-8") + (
        "\n\n# Added by setup.py: the engine.py and engine.pxd this compiled core was built from.\n"
        f'SOURCE_SHA256 = "{digest}"\n'
        "_COMPILED = True  # typed arrays for the state (engine._ints)\n"
    )
    if not py.exists() or py.read_text(encoding="utf-8") != text:
        py.write_text(text, encoding="utf-8")
    pxd = pkg / "_cengine.pxd"  # Cython finds a module's .pxd by its dotted name: fluidopt/sim/_cengine.pxd
    if not pxd.exists() or pxd.read_bytes() != TYPES.read_bytes():
        shutil.copyfile(TYPES, pxd)
    ext = Extension(
        "fluidopt.sim._cengine",
        [str(py.relative_to(ROOT))],
        # no fused multiply-add: the compiled core must round exactly like the Python engine
        extra_compile_args=["-O2", "-ffp-contract=off"] if os.name != "nt" else [],
    )
    try:
        exts = cythonize(
            [ext],
            include_path=[str(GEN)],
            # annotations are documentation here: the static types come from engine.pxd alone.
            # Indexing stays bounds-checked (controllers pass GPU and request ids in); only Python's
            # negative-index wrap-around is off, which the engine never uses.
            compiler_directives={"language_level": "3", "binding": False, "annotation_typing": False,
                                 "boundscheck": True, "wraparound": False},
            quiet=True,
        )
    except Exception as exc:  # a Cython error must not stop the install: the Python engine is complete
        _notice(f"Cython could not translate the simulator core ({exc})")
        return []
    return exts + _single_sourced_extensions(cythonize, digest)


def single_source_digest(py: bytes, pxd: bytes) -> str:
    """The SHA-256 a single-sourced handler module is checked by (fluidopt.sim.controller_fastpath)."""
    return hashlib.sha256(py + b"\0" + pxd).hexdigest()


def _single_sourced_extensions(cythonize, engine_digest: str) -> list[Extension]:
    """fluidopt.sim._c_<stem> for each single-sourced handler module: the control module's source, compiled as
    is with the types of its .pxd, plus the digests it is checked by at run time."""
    out: list[Extension] = []
    pkg = GEN / "fluidopt" / "sim"
    for stem in single_sourced():
        module = f"_c_{stem}"
        src = (ROOT / "fluidopt" / "control" / f"{stem}.py").read_bytes()
        types = (ROOT / "fluidopt" / "sim" / f"{stem}.pxd").read_bytes()
        text = src.decode("utf-8") + (
            f"\n\n# Added by setup.py: the digest of fluidopt/control/{stem}.py and fluidopt/sim/{stem}.pxd, and of "
            "the engine core this module was built against.\n"
            f'SOURCE_SHA256 = "{single_source_digest(src, types)}"\n'
            f'ENGINE_SHA256 = "{engine_digest}"\n'
        )
        py = pkg / f"{module}.py"
        if not py.exists() or py.read_text(encoding="utf-8") != text:
            py.write_text(text, encoding="utf-8")
        pxd = pkg / f"{module}.pxd"
        if not pxd.exists() or pxd.read_bytes() != types:
            pxd.write_bytes(types)
        ext = Extension(f"fluidopt.sim.{module}", [str(py.relative_to(ROOT))], extra_compile_args=_NO_FMA)
        try:
            out += cythonize([ext], include_path=[str(GEN)], quiet=True,
                             compiler_directives={"language_level": "3", "binding": False, "annotation_typing": False,
                                                  "boundscheck": True, "wraparound": False})
        except Exception as exc:  # the Python handlers (the same source) are complete without it
            _notice(f"Cython could not translate fluidopt/control/{stem}.py ({exc})",
                    "the controller will run its Python handlers")
    return out


class OptionalBuildExt(build_ext):
    """Build the compiled core if a C compiler works; otherwise go on without it."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler, missing headers, ...
            _notice(f"building the compiled simulator core failed ({exc})")

    def build_extension(self, ext) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            _notice(f"building {ext.name} failed ({exc})")


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
