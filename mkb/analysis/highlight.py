"""Syntax highlighting and kernel diffs for the site, done once at build time with Pygments."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from markupsafe import Markup
from pygments import highlight as _pygmentize
from pygments.formatters import HtmlFormatter
from pygments.lexers import BashLexer, DiffLexer, JsonLexer, MarkdownLexer, PythonLexer, TextLexer

_LEXERS = {"python": PythonLexer, "markdown": MarkdownLexer, "bash": BashLexer, "json": JsonLexer,
           "diff": DiffLexer, "text": TextLexer}
_FORMATTER = HtmlFormatter(cssclass="hl", wrapcode=True)
DIFF_LINES, DIFF_CHARS = 600, 60_000
"""A kernel diff shows at most this much; the trials' JSON files hold both kernels whole."""


def highlight(code: str, lexer: str) -> Markup:
    """Code as highlighted HTML (Pygments escapes every character of it); unknown lexers give plain text."""
    return Markup(_pygmentize(code, _LEXERS.get(lexer, TextLexer)(stripnl=False), _FORMATTER))


def stylesheet() -> str:
    """The CSS rules of the highlighting classes, scoped to .hl."""
    return _FORMATTER.get_style_defs(".hl") + "\n"


@dataclass(frozen=True)
class KernelDiff:
    """A unified diff of two final kernels."""

    html: Markup
    """The highlighted diff; empty when the kernels are identical."""
    added: int
    removed: int
    hidden_lines: int
    """Diff lines not shown (past DIFF_LINES lines or DIFF_CHARS characters)."""


def kernel_diff(old: str, new: str, old_name: str, new_name: str) -> KernelDiff:
    """Unified diff (3 lines of context) from old to new, highlighted, at most DIFF_LINES lines and
    DIFF_CHARS characters."""
    lines = list(difflib.unified_diff(old.splitlines(), new.splitlines(), old_name, new_name, lineterm=""))
    added = sum(1 for line in lines[2:] if line.startswith("+"))
    removed = sum(1 for line in lines[2:] if line.startswith("-"))
    head = "\n".join(lines[:DIFF_LINES])
    text = head[:DIFF_CHARS]
    whole = len(text.splitlines()) - (len(text) < len(head))  # a line cut short counts as not shown
    return KernelDiff(highlight(text, "diff") if text else Markup(""), added, removed, len(lines) - whole)
