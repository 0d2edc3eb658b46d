"""setup.py's reuse of an in-place compiled core: a reinstall with unchanged sources copies the earlier build
instead of compiling it again, and anything else compiles (a stale core must never be taken)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import sysconfig
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def setup_py():
    # imported under another name than __main__: the module defines its functions without calling setup()
    spec = importlib.util.spec_from_file_location("fluidopt_setup_py", ROOT / "setup.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _stamp(path: Path, key: str, content: bytes) -> None:
    path.write_text(json.dumps({"key": key, "sha256": hashlib.sha256(content).hexdigest()}), encoding="utf-8")


def test_a_build_recorded_under_the_same_key_is_reused(setup_py, tmp_path):
    built, stamp = tmp_path / "_cengine.so", tmp_path / "stamp.json"
    built.write_bytes(b"\x7fELF core")
    _stamp(stamp, "k1", b"\x7fELF core")
    assert setup_py.reusable_build(built, stamp, "k1") is True


def test_another_key_compiles(setup_py, tmp_path):
    built, stamp = tmp_path / "_cengine.so", tmp_path / "stamp.json"
    built.write_bytes(b"\x7fELF core")
    _stamp(stamp, "k1", b"\x7fELF core")
    assert setup_py.reusable_build(built, stamp, "k2") is False


def test_a_file_replaced_since_its_record_compiles(setup_py, tmp_path):
    # e.g. a core copied in from another checkout, or an interrupted build: same key, other bytes
    built, stamp = tmp_path / "_cengine.so", tmp_path / "stamp.json"
    _stamp(stamp, "k1", b"\x7fELF core")
    built.write_bytes(b"\x7fELF core, built from something else")
    assert setup_py.reusable_build(built, stamp, "k1") is False


@pytest.mark.parametrize("stamp_text", [None, "", "not json", "[1, 2]", '{"key": "k1"}', '{"sha256": "x"}'])
def test_a_missing_or_unreadable_stamp_compiles(setup_py, tmp_path, stamp_text):
    built, stamp = tmp_path / "_cengine.so", tmp_path / "stamp.json"
    built.write_bytes(b"\x7fELF core")
    if stamp_text is not None:
        stamp.write_text(stamp_text, encoding="utf-8")
    assert setup_py.reusable_build(built, stamp, "k1") is False


def test_a_missing_build_compiles(setup_py, tmp_path):
    stamp = tmp_path / "stamp.json"
    _stamp(stamp, "k1", b"\x7fELF core")
    assert setup_py.reusable_build(tmp_path / "absent.so", stamp, "k1") is False


def test_the_key_changes_with_each_input(setup_py):
    base = ("fluidopt.sim._cengine", "x = 1\nSOURCE_SHA256 = 'a'\n", b"cdef int x", '{"cython": "3.1"}')
    key = setup_py.build_key(*base)
    assert key == setup_py.build_key(*base) and len(key) == 64
    others = [("fluidopt.sim._c_gate_handlers", *base[1:]),                   # another module
              (base[0], "x = 1\nSOURCE_SHA256 = 'b'\n", *base[2:]),            # an edited engine.py
              (*base[:2], b"cdef long x", base[3]),                              # edited types
              (*base[:3], '{"cython": "3.2"}')]                                  # another Cython or flags
    assert len({key, *(setup_py.build_key(*o) for o in others)}) == 5


def test_the_recipe_names_directives_flags_and_cython(setup_py, monkeypatch):
    # Cython is a build requirement only (pip's isolated build environment): a stand-in gives its version
    monkeypatch.setitem(sys.modules, "Cython", types.SimpleNamespace(__version__="3.9.9"))
    rec = json.loads(setup_py._recipe({"boundscheck": True}, ["-O2", "-ffp-contract=off"]))
    assert rec == {"directives": {"boundscheck": True}, "flags": ["-O2", "-ffp-contract=off"], "cython": "3.9.9",
                   "shared_utility": "fluidopt.sim._cyutility"}
    assert setup_py._recipe({"boundscheck": True}, []) != setup_py._recipe({"boundscheck": False}, [])
    # a module with its own copy of Cython's utility code (the prefix cache) has another key than one without
    assert json.loads(setup_py._recipe({}, [], shared=False))["shared_utility"] is None


def test_the_shared_utility_module_is_built_and_imported_by_the_compiled_modules(setup_py):
    """Cython's utility code is one module (fluidopt.sim._cyutility) that every compiled module imports: a core
    built without it would carry its own copy, and one built against another would not import."""
    from fluidopt.sim import backend

    ok, why = backend.compiled_status()
    if not ok:
        pytest.skip(f"compiled core not usable: {why}")
    assert setup_py.SHARED_UTILITY == "fluidopt.sim._cyutility"
    from fluidopt.sim import _cengine  # type: ignore[attr-defined]  # noqa: F401

    assert setup_py.SHARED_UTILITY in sys.modules
    c_file = ROOT / "build" / "cengine" / "fluidopt" / "sim" / "_cengine.c"
    if c_file.is_file():  # the generated C of this checkout's build: no memoryview machinery of its own
        text = c_file.read_text(encoding="utf-8", errors="replace")
        assert '"fluidopt.sim._cyutility", "memoryview"' in text  # the memoryview type is imported from it
        assert "__pyx_memoryview___cinit__(" not in text  # and not defined here
    cache_c = c_file.with_name("_c_prefix_cache.c")
    if cache_c.is_file():  # the prefix cache keeps its own copy (faster hot loops)
        assert "fluidopt.sim._cyutility" not in cache_c.read_text(encoding="utf-8", errors="replace")


def test_the_in_place_path_is_next_to_the_package_sources(setup_py):
    from setuptools import Extension

    ext = Extension("fluidopt.sim._c_gate_handlers", ["build/cengine/fluidopt/sim/_c_gate_handlers.py"])
    assert setup_py._inplace(ext) == ROOT / "fluidopt" / "sim" / ("_c_gate_handlers" + sysconfig.get_config_var("EXT_SUFFIX"))
    assert setup_py.STAMPS == ROOT / "build" / "cengine" / "stamps"


def test_a_c_file_is_translated_again_only_under_another_build_key(setup_py, tmp_path, monkeypatch):
    """Cython keeps a C file newer than its source whatever it was translated with: setup.py removes one whose
    stamp (reusable_build's, as for the built extensions) records another build key (new directives, the shared
    module) and keeps one of the same key (pip runs setup.py three times per install; only the first translates)."""
    from setuptools import Extension

    seen = []

    def cythonize(exts, **kw):  # a stand-in for Cython's: records which C files it would have had to write
        seen.append({e.name: setup_py._c_file(e).exists() for e in exts})
        for e in exts:
            setup_py._c_file(e).write_text("/* translated */", encoding="utf-8")
        return exts

    monkeypatch.setitem(sys.modules, "Cython.Build", types.SimpleNamespace(cythonize=cythonize))
    monkeypatch.setattr(setup_py, "ROOT", tmp_path)
    monkeypatch.setattr(setup_py, "STAMPS", tmp_path / "stamps")
    ext = Extension("fluidopt.sim._c_x", ["gen/_c_x.py"])
    (tmp_path / "gen").mkdir()
    setup_py._c_file(ext).write_text("/* old */", encoding="utf-8")
    ext.fluidopt_key = "k1"
    setup_py._cythonize([ext])  # no key recorded: the old C goes
    ext.fluidopt_key = "k1"
    setup_py._cythonize([ext])  # the same key: kept
    ext.fluidopt_key = "k2"
    setup_py._cythonize([ext])  # another key: goes
    assert seen == [{"fluidopt.sim._c_x": False}, {"fluidopt.sim._c_x": True}, {"fluidopt.sim._c_x": False}]
    stamp = json.loads((tmp_path / "stamps" / "fluidopt.sim._c_x.c.json").read_text(encoding="utf-8"))
    assert stamp == {"key": "k2", "sha256": hashlib.sha256(b"/* translated */").hexdigest()}
