"""The package's layering: model -> fluid -> control -> sim -> harness -> commands.

A module may import modules of its own layer or of a layer below it, never above: the library never
reaches up into its command line, the LP never imports a controller, a controller never imports the
simulator. Imports inside functions count too (a lazy import is still a dependency). The check reads
every module's source with :mod:`ast`, so it needs nothing installed beyond the package itself.
"""

from __future__ import annotations

import ast
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


def _imports(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    pkg = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module
    for node in ast.walk(tree):
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


def test_no_import_cycle_between_calibrate_and_scenario():
    calib = _imports(PKG / "calibrate.py", "fluidopt.calibrate")
    assert "fluidopt.scenario" not in calib
