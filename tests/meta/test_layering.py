"""The package's layering, lowest first: core -> calibration, fluid, queueing -> scenario, workloads ->
control -> sim, rl -> harness -> planning, pricing -> commands, app, cli.

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
    # the model (dataclasses), demand models, the GPU table grammar, errors, interruption, file writing
    "core": 0,
    # how fast a GPU is; the LP; textbook queues: each stands on the core alone
    "calibration": 1, "fluid": 1, "queueing": 1, "profiles": 1,
    # a scenario file reads calibration profiles, the SLI grammar and demand models; workloads read traces
    # and size them with the fluid bound
    "scenario": 2, "workloads": 2,
    "control": 3, "engines": 3,
    "sim": 4, "rl": 4,
    "harness": 5, "serving": 5,
    "planning": 6, "pricing": 6,
    "commands": 7, "app": 7, "cli": 7, "__main__": 7, "__init__": 7,
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


def _resolve(name: str, modules: set[str]) -> str | None:
    """The package module an import names: itself, or the module that holds the attribute imported
    (``fluidopt.fluid.lp.solve_fluid`` -> ``fluidopt.fluid.lp``); None outside the package."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts = parts[:-1]
    return None


def import_graph() -> dict[str, set[str]]:
    """Every module of the package and the package modules it imports, at any depth of the source
    (top level, inside functions and methods, under ``if TYPE_CHECKING``, as strings)."""
    paths = dict((m, p) for p, m in _modules())
    mods = set(paths)
    graph: dict[str, set[str]] = {}
    for m, p in paths.items():
        out = set()
        for imp in _imports(p, m):
            target = _resolve(imp, mods)
            if target is not None and target != m and target != "fluidopt":
                out.add(target)
        graph[m] = out
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        cycles.append(sorted(comp))
    return cycles


def test_cycle_finder_finds_a_circle_through_a_function_level_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_the_reader_sees_imports_inside_functions():
    src = "def f():\n    from fluidopt.fluid.multiperiod import plan_fleet\n    import fluidopt.sim.api\n"
    got = _imports(PKG / "fluid" / "saturation.py", "fluidopt.fluid.saturation", src)
    assert got == {"fluidopt.fluid.multiperiod", "fluidopt.sim.api"}


def test_no_import_circles():
    """No two modules import each other, directly or around a circle, counting every import."""
    cycles = import_cycles(import_graph())
    assert not cycles, "import circles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_package_top_holds_packages_and_at_most_five_modules():
    modules = sorted(p.name for p in PKG.glob("*.py"))
    assert len(modules) <= 5, modules
    assert {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()} >= {
        "core", "calibration", "fluid", "scenario", "workloads", "control", "sim", "rl", "harness", "planning",
        "pricing", "commands", "app", "queueing"} - {"scenario"}


# The event kernel keeps its own limit: it is one loop the compiled core is built from.
LINE_LIMITS = {"fluidopt/sim/engine.py": 1000}


def test_no_module_over_800_lines():
    over = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).as_posix()
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > LINE_LIMITS.get(rel, 800):
            over.append(f"{rel}: {n} lines")
    assert not over, over


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


def test_every_package_is_in_the_distribution():
    """A package missing from pyproject's list installs from a checkout (editable) but not from a wheel."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    listed = set(tomllib.loads((PKG.parent / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(PKG.parent).parts) for p in PKG.rglob("__init__.py")}
    assert found - listed == set(), f"add to [tool.setuptools] packages: {sorted(found - listed)}"
