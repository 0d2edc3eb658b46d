"""A Griffe extension for the API pages: the docstrings' Sphinx markup as Markdown, private bases hidden.

The docstrings are written for Sphinx (``:class:`X```, ``:func:`~a.b.f```, ``text::`` before a literal
block), and mkdocstrings renders Markdown, so without this the API pages showed the roles and the ``::``
markers as raw text. Rewriting hundreds of docstrings would churn every module; this rewrites them as the
pages are built (mkdocs.yml, ``extensions:`` of the python handler) and leaves the source as it is:

* a role becomes a cross-reference where its target is an object on the API pages, else a code span:
  ``:class:`~fluidopt.core.model.Scenario``` -> ``Scenario`` linked to its entry. The target is resolved in
  the docstring's own scope (Griffe's ``Object.resolve``: imports and parents), the way Sphinx reads
  a short name; the link is autorefs' *optional* kind, so a target outside the pages is a plain code
  span, never a broken link or a strict-mode warning;
* ``text::`` ends in ``:`` (a lone ``::`` line goes) and the indented block after it becomes a fenced
  code block;
* a base class whose name starts with ``_`` (``_Result``, ``_NoPartition``) is left out of "Bases:":
  an implementation detail the pages do not document.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?P<role>class|func|meth|attr|mod|data|exc|obj|const|ref|math):`(?P<body>[^`]+)`")


def _target_and_title(body: str) -> tuple[str, str]:
    """A role's target and shown text: ``Title <a.b>``, ``~a.b.c`` (shows ``c``), ``a.b``, ``!a``."""
    m = re.fullmatch(r"\s*(?P<title>.*?)\s*<(?P<target>[^<>]+)>\s*", body)
    if m:
        return m["target"].strip(), m["title"]
    target = body.strip().lstrip("!")
    if target.startswith("~"):
        target = target[1:]
        return target.lstrip("."), target.rsplit(".", 1)[-1]
    return target.lstrip("."), target.lstrip(".")


def _resolve(obj: griffe.Object, target: str) -> str | None:
    """The target's full path from the docstring's scope, or None (a name Griffe cannot place)."""
    if target.startswith("fluidopt."):
        return target
    head, _, rest = target.partition(".")
    try:
        base = obj.resolve(head)
    except Exception:  # noqa: BLE001 - any failure of Griffe's lookup: a plain code span
        return None
    return f"{base}.{rest}" if rest else base


def roles_to_markdown(text: str, obj: griffe.Object | None = None) -> str:
    """Every Sphinx role in ``text`` as a cross-reference (see the module doc) or a code span."""

    def sub(m: re.Match) -> str:
        target, title = _target_and_title(m["body"])
        code = f"<code>{html.escape(title)}</code>"
        if m["role"] in ("ref", "math") or obj is None:
            return code
        path = _resolve(obj, target)
        if path is None:
            return code
        return f'<autoref identifier="{html.escape(path)}" optional>{code}</autoref>'

    # not inside a fenced block, where the HTML of a link would show as text
    parts = re.split(r"(^[ \t]*```.*?^[ \t]*```[ \t]*$)", text, flags=re.S | re.M)
    return "".join(p if k % 2 else ROLE.sub(sub, p) for k, p in enumerate(parts))


def literal_blocks_to_fences(text: str) -> str:
    """Sphinx's ``text::`` + indented block as ``text:`` + a fenced code block."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.rstrip()
        if not stripped.endswith("::") or stripped.endswith(":::"):
            out.append(line)
            i += 1
            continue
        indent = len(line) - len(line.lstrip())
        lead = stripped[:-2].rstrip()
        if lead.strip():
            out.append(lead + ":" if not lead.endswith(" ") else lead.rstrip() + ":")
        i += 1
        j = i
        while j < len(lines) and not lines[j].strip():
            j += 1
        block: list[str] = []
        while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent):
            block.append(lines[j])
            j += 1
        while block and not block[-1].strip():
            block.pop()
        if not block:  # a marker with no block under it: keep what followed
            continue
        body_indent = min(len(b) - len(b.lstrip()) for b in block if b.strip())
        pad = " " * indent
        out += ["", pad + "```text", *(pad + b[body_indent:] if b.strip() else "" for b in block), pad + "```", ""]
        i = j
    return "\n".join(out)


def sphinx_to_markdown(text: str, obj: griffe.Object | None = None) -> str:
    return roles_to_markdown(literal_blocks_to_fences(text), obj)


def _private(base: Any) -> bool:
    return str(base).split("[", 1)[0].rsplit(".", 1)[-1].startswith("_")


class SphinxMarkup(griffe.Extension):
    """Rewrites each docstring once the object tree is whole (so names resolve), hides private bases."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.is_alias or obj.docstring is None:
            return
        obj.docstring.value = sphinx_to_markdown(obj.docstring.value, obj)

    def on_class(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        if not cls.is_alias:
            cls.bases = [b for b in cls.bases if not _private(b)]
