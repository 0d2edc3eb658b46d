"""The package's layering: model -> fluid -> control -> sim -> harness -> commands.

A module may import modules of its own layer or of a layer below it, never above: the library never
reaches up into its command line, the LP never imports a controller, a controller never imports the
simulator. Imports inside functions count too (a lazy import is still a dependency), and so do string
imports: ``importlib.import_module("fluidopt.x")`` / ``__import__`` / ``importlib.util.find_spec`` with a
literal or f-string name (an f-string counts by its literal prefix, ``f"fluidopt.commands.{name}"``), and
any string literal that is a dotted module path of the package (``"fluidopt.rl.policies"`` in a tuple of
modules to load later, or ``"fluidopt.rl.policies:factory"``). A layer above registers its controllers
from below (the ``fluidopt.policies`` entry points, pyproject.toml), never by a name the registry keeps.
The check reads every module's source with :mod:`ast`, so it needs nothing installed beyond the package
itself.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "fluidopt"

# Layer of each top-level part of the package, lowest first. A module not listed fails the test, so
# a new module must be placed deliberately.
LAYERS: dict[str, int] = {
    "errors": 0, "_files": 0, "interrupt": 0, "demand": 0, "model": 0, "tables": 0, "queueing": 0, "calibrate": 0,
    "vidur": 0, "profiles": 0,
    "fluid": 1, "scenario": 1,  # a scenario file's SLIs are parsed with the fluid layer's SLI grammar
    "control": 2,
    "sim": 3, "rl": 3,
    "harness": 4, "executor": 4, "plan": 4, "dayplan": 4, "planning": 4, "pricing": 4, "pricing_opt": 4,
    "plots": 4,
    "commands": 5, "app": 5, "cli": 5, "__main__": 5, "__init__": 5,
}


def _part(module: str) -> str | None:
    """``fluidopt.fluid.lp`` -> ``fluid``; None for modules outside the package."""
    parts = module.split(".")
    if parts[0] != "fluidopt":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


# a dotted module path of the package, optionally with an attribute ("fluidopt.rl.policies:make")
_MODULE_PATH = re.compile(r"fluidopt(?:\.[A-Za-z_][A-Za-z0-9_]*)+(?::[A-Za-z_][A-Za-z0-9_.]*)?")
_IMPORT_CALLS = {"import_module", "__import__", "find_spec"}


def _string_import(node: ast.AST) -> str | None:
    """The module a string names (a literal, or an f-string's literal prefix), if it is a package path."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
    elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        text = str(node.values[0].value).rstrip(".")  # f"fluidopt.commands.{name}" -> fluidopt.commands
    else:
        return None
    if not _MODULE_PATH.fullmatch(text):
        return None
    name = text.split(":", 1)[0]
    return name if _part(name) in LAYERS else None  # "fluidopt.policies" (an entry-point group): no module


def _imports(path: Path, module: str, source: str | None = None) -> set[str]:
    tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"))
    out: set[str] = set()
    pkg = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if fname in _IMPORT_CALLS and node.args:
                name = _string_import(node.args[0])
                if name:
                    out.add(name)
        elif isinstance(node, (ast.Constant, ast.JoinedStr)):
            name = _string_import(node)
            if name:
                out.add(name)
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            # "from fluidopt import harness" imports the submodule harness
            if name == "fluidopt":
                out.update(f"fluidopt.{a.name}" for a in node.names
                           if (PKG / a.name).is_dir() or (PKG / f"{a.name}.py").is_file())
    return out


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield path, ".".join(parts)


def test_every_module_has_a_layer():
    missing = sorted({_part(m) for _, m in _modules()} - set(LAYERS))
    assert not missing, f"place these parts of the package in LAYERS: {missing}"


@pytest.mark.integration
@pytest.mark.parametrize("path, module", list(_modules()), ids=lambda v: v if isinstance(v, str) else "")
def test_imports_go_down_the_layers(path, module):
    own = _part(module)
    if own == "__init__":
        return  # the package's front door re-exports from every layer
    bad = []
    for imp in sorted(_imports(path, module)):
        part = _part(imp)
        if part is None or part == own:
            continue
        if LAYERS.get(part, 99) > LAYERS[own]:
            bad.append(f"{imp} (layer {LAYERS.get(part)} > {LAYERS[own]})")
    assert not bad, f"{module} imports upward: {', '.join(bad)}"


def test_string_imports_are_read():
    """The reader sees the lazy imports a string names, so a registry cannot hide an upward tie in one."""
    src = (
        "import importlib\n"
        "MODULES = ('fluidopt.control.fcfs', 'fluidopt.rl.policies')\n"
        "def load(name):\n"
        "    importlib.import_module('fluidopt.harness')\n"
        "    __import__('fluidopt.commands.run')\n"
        "    importlib.import_module(f'fluidopt.app.{name}')\n"
        "    return 'fluidopt.sim.api:simulate', 'fluidopt.policies', 'see fluidopt.rl.policies for more'\n"
    )
    got = _imports(PKG / "control" / "registry.py", "fluidopt.control.registry", src)
    assert got == {"importlib", "fluidopt.control.fcfs", "fluidopt.rl.policies", "fluidopt.harness", "fluidopt.commands.run",
                   "fluidopt.app", "fluidopt.sim.api"}


def test_the_registry_names_no_higher_layer():
    """rl registers its routers from below (an entry point), not as a module the control layer loads."""
    from fluidopt.control import registry

    assert all(_part(m) == "control" for m in registry.BUILTIN_MODULES)
    assert not {m for m in _imports(PKG / "control" / "registry.py", "fluidopt.control.registry")
                if _part(m) is not None and LAYERS.get(_part(m), 99) > LAYERS["control"]}


def test_no_import_cycle_between_calibrate_and_scenario():
    calib = _imports(PKG / "calibrate.py", "fluidopt.calibrate")
    assert "fluidopt.scenario" not in calib


def test_rl_registers_its_routers_from_below():
    """fluidopt.rl's routers reach the registry through the entry-point group (pyproject.toml), as a
    third-party package's do; the installed metadata must carry it (else: pip install -e . again)."""
    import importlib.metadata as md

    from fluidopt.control import registry

    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    declared = tomllib.loads((PKG.parent / "pyproject.toml").read_text(encoding="utf-8"))
    group = declared["project"]["entry-points"][registry.ENTRY_POINT_GROUP]
    assert group == {"fluidopt-rl": "fluidopt.rl.policies"}
    installed = {ep.value for ep in md.entry_points(group=registry.ENTRY_POINT_GROUP)}
    assert "fluidopt.rl.policies" in installed, (
        "the installed fluidopt metadata lacks the fluidopt.policies entry points of pyproject.toml: "
        "run pip install -e . again (and remove a stale fluidopt.egg-info from the repository root)")
    assert {"baseline-rl", "wa-rl", "wg-rl"} <= set(registry.available())
