"""The Griffe extension of the API pages (docs/_griffe/sphinx_markup.py): Sphinx markup to Markdown, on
hand-written docstrings. The whole site is checked by tests/meta/test_docs.py's strict build."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

griffe = pytest.importorskip("griffe")

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("sphinx_markup", ROOT / "docs" / "_griffe" / "sphinx_markup.py")
sm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sm)


def test_roles_become_code_spans_without_a_scope():
    text = "See :class:`~fluidopt.core.model.Scenario`, :func:`solve_fluid`, :meth:`Title <a.b.c>` and :data:`X`."
    assert sm.roles_to_markdown(text) == ("See <code>Scenario</code>, <code>solve_fluid</code>, <code>Title</code> "
                                          "and <code>X</code>.")


def test_roles_resolve_in_the_docstrings_scope():
    pkg = griffe.load("fluidopt.fluid.lp", search_paths=[str(ROOT)])
    # solve_fluid's module imports FluidSolution: a short name resolves the way Sphinx would read it
    out = sm.roles_to_markdown(":class:`FluidSolution` and :func:`~fluidopt.core.model.default_scenario`", pkg)
    assert out == ('<autoref identifier="fluidopt.fluid.solution.FluidSolution" optional><code>FluidSolution</code>'
                   '</autoref> and <autoref identifier="fluidopt.core.model.default_scenario" optional>'
                   '<code>default_scenario</code></autoref>')
    # a name nothing in scope holds: a code span, never a broken link
    assert sm.roles_to_markdown(":class:`NoSuchThing`", pkg) == "<code>NoSuchThing</code>"


def test_literal_blocks_become_fenced_code():
    text = "Rows (names as in duals)::\n\n    a   b\n      c\n\nAfter.\n\nAlone:\n\n::\n\n    x = 1\n"
    assert sm.literal_blocks_to_fences(text) == (
        "Rows (names as in duals):\n\n```text\na   b\n  c\n```\n\nAfter.\n\nAlone:\n\n\n```text\nx = 1\n```\n")
    # an indented marker keeps its indentation; a role inside the block is left as written
    nested = "  item::\n\n      :class:`X`\n  next"
    fenced = sm.literal_blocks_to_fences(nested)
    assert fenced == "  item:\n\n  ```text\n  :class:`X`\n  ```\n\n  next"
    assert sm.sphinx_to_markdown(nested) == fenced


def test_private_bases_are_recognised():
    assert sm._private("_Result") and sm._private("fluidopt.queueing.base._Result") and sm._private("_G[int]")
    assert not sm._private("Controller") and not sm._private("typing.Generic[T]")
