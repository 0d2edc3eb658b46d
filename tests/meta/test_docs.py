"""The documentation runs: the site builds strictly, the tutorials' code executes, the contributor's
recipes still work, and nothing points outside the repository."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = sorted((ROOT / "docs" / "tutorials").glob("*.md"))


def python_blocks(path: Path) -> str:
    """The page's ```python blocks, in order, as one program."""
    blocks = re.findall(r"^([ \t]*)```python\n(.*?)^[ \t]*```", path.read_text(encoding="utf-8"), re.S | re.M)
    return "\n\n".join(textwrap.dedent(body) for _, body in blocks)


def run_program(code: str, cwd: Path, name: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (registrations and state never leak into other tests)."""
    script = cwd / f"{name}.py"
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(script)], cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=240)


@pytest.mark.integration
@pytest.mark.parametrize("page", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_code_runs(page, tmp_path):
    code = python_blocks(page)
    assert code.strip(), f"{page.name} has no python blocks"
    r = run_program(code, tmp_path, page.stem.replace("-", "_"))
    assert r.returncode == 0, f"{page.name} failed:\n{r.stderr[-3000:]}"


def test_there_are_three_tutorials_one_per_user():
    assert [p.stem for p in TUTORIALS] == ["capacity-planner", "pricing-analyst", "router-engineer"]


@pytest.mark.integration
def test_contributing_recipes_run(tmp_path):
    code = python_blocks(ROOT / "CONTRIBUTING.md")
    # the controller recipe names a class the reader writes; give it one
    prelude = ("from fluidopt.control.protocol import Controller\n"
               "class MyPolicy(Controller):\n    name = 'my-policy'\n    def __init__(self, threshold):\n"
               "        self.threshold = threshold\n")
    epilogue = ("\nfrom fluidopt.control.registry import available, make_controller, policy_options\n"
                "import fluidopt\n"
                "assert 'my-policy' in available() and policy_options('my-policy') == ('threshold',)\n"
                "assert make_controller('my-policy', fluidopt.default_scenario(), threshold=0.3).threshold == 0.3\n"
                "from fluidopt.sim.api import simulate\n"
                "sc = fluidopt.default_scenario(gpus=2)\n"
                "res = simulate(sc, 'fi-wsp', horizon=5, service='tokens', workload=workload)\n"
                "assert res.totals['requests'] == 2\n")
    r = run_program(prelude + code + epilogue, tmp_path, "contributing")
    assert r.returncode == 0, r.stderr[-3000:]


def test_every_cli_command_follows_the_recipe():
    from fluidopt.cli import COMMANDS

    for name in COMMANDS:
        mod = importlib.import_module(f"fluidopt.commands.{name.replace('-', '_')}")
        assert callable(mod.add_parser) and callable(mod.run), name


def test_an_entry_point_registers_a_policy(monkeypatch):
    """The third-party path of CONTRIBUTING.md: an entry point in the fluidopt.policies group."""
    import importlib.metadata as md

    from fluidopt.control import registry
    from fluidopt.control.paper_baselines import FIWSP

    def make_third_party(scenario):
        """a third-party policy"""
        return FIWSP()

    class EP:
        name, value = "third-party-test", "pkg:make"

        def load(self):
            return make_third_party

    # the registry loads once per process (built-ins, then the installed entry points): load it before the
    # stand-in replaces the entry points, or the process would keep a registry without fluidopt.rl's routers
    registry.available()
    monkeypatch.setattr(md, "entry_points", lambda group=None: [EP()] if group == registry.ENTRY_POINT_GROUP else [])
    try:
        registry._load_entry_points()
        assert registry.available()["third-party-test"] == "a third-party policy"
    finally:
        registry._REGISTRY.pop("third-party-test", None)


def test_no_reference_outside_the_repository():
    """Docs and code carry what a reader needs: no pointers to design files outside the repository."""
    offenders = []
    for path in [*ROOT.joinpath("fluidopt").rglob("*.py"), *ROOT.joinpath("docs").rglob("*.md"),
                 ROOT / "README.md", ROOT / "CONTRIBUTING.md", *ROOT.joinpath("examples").rglob("*.py")]:
        text = path.read_text(encoding="utf-8")
        for pat in ("DESIGN.md", "DESIGN ", "shared/reference"):
            if pat in text:
                offenders.append(f"{path.relative_to(ROOT)}: {pat}")
    assert not offenders, offenders


@pytest.mark.integration
def test_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[dev]')")
    pytest.importorskip("mkdocstrings")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, env=env, timeout=280)
    assert r.returncode == 0, r.stderr[-4000:]
    assert (tmp_path / "site" / "api" / "fluid" / "index.html").read_text().count("solve_fluid") > 0
    _api_pages_have_no_sphinx_markup(tmp_path / "site")


def _api_pages_have_no_sphinx_markup(site: Path) -> None:
    """The API pages as a reader sees them (the docs/_griffe extension, issue 47): no raw Sphinx role, no
    `::` marker, no private base class, no link to a placeholder repository; the roles became links."""
    import html as html_lib

    pages = sorted((site / "api").glob("*/index.html"))
    assert len(pages) == len(list((ROOT / "docs" / "api").glob("*.md"))) >= 8  # every API page was built
    problems, links = [], 0
    for page in pages:
        raw = page.read_text(encoding="utf-8")
        text = html_lib.unescape(re.sub(r"<[^>]+>", "", raw))
        name = page.parent.name
        problems += [f"{name}: raw role {m!r}" for m in re.findall(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj):",
                                                                     text)]
        problems += [f"{name}: '::' marker" for _ in re.findall(r"(?<![:\w])::(?=\s|$)", text)]
        problems += [f"{name}: private base {b!r}" for b in re.findall(r"Bases:[^\n]*", text) if re.search(r"\b_[A-Za-z]", b)]
        problems += [f"{name}: unrendered <autoref>" for _ in re.findall(r"<autoref\b", raw)]
        links += raw.count('class="autorefs autorefs-internal"')
    for page in site.rglob("*.html"):
        if "example.invalid" in page.read_text(encoding="utf-8"):
            problems.append(f"{page.relative_to(site)}: example.invalid")
    assert not problems, problems[:20]
    assert links > 300  # the roles resolved to the pages' own entries (359 links when written, 50 without the roles)
