"""Shared CLI pieces: controller options (``--option KEY=VALUE``) and user modules (``--import``)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from fluidopt.errors import ScenarioError


def add_controller_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="controller option passed to the policy's factory (repeatable); VALUE is read as "
                        "JSON when it parses (numbers, true/false, lists), else as a string")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import a module or .py file first, so the policies it registers can be named "
                        "(repeatable)")


def parse_options(specs: list[str]) -> dict[str, Any]:
    """``["chunked=true", "predictor=oracle"]`` -> ``{"chunked": True, "predictor": "oracle"}``."""
    out: dict[str, Any] = {}
    for spec in specs:
        key, sep, text = spec.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ScenarioError(f"--option {spec!r}: expected KEY=VALUE with KEY a Python identifier")
        if key in out:
            raise ScenarioError(f"--option {key}: given twice")
        try:
            out[key] = json.loads(text)
        except json.JSONDecodeError:
            out[key] = text
    return out


_imported_files: set[Path] = set()


def import_user_modules(names: list[str]) -> None:
    """Import modules by dotted name or by path to a .py file (their import registers policies).

    Each file is executed once per process, however often it is named.
    """
    for name in names:
        path = Path(name)
        try:
            if name.endswith(".py"):
                if not path.is_file():
                    raise ScenarioError(f"--import {name!r}: no such file")
                if path.resolve() in _imported_files:
                    continue
                _imported_files.add(path.resolve())
                spec = importlib.util.spec_from_file_location(path.stem, path)
                mod = importlib.util.module_from_spec(spec)
                sys.modules[path.stem] = mod
                spec.loader.exec_module(mod)
            else:
                importlib.import_module(name)
        except ScenarioError:
            raise
        except ImportError as e:
            raise ScenarioError(f"--import {name!r}: cannot import it: {e}") from None
