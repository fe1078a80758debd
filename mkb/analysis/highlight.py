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
DIFF_LINES = 600
"""A kernel diff shows at most this many lines; the trials' JSON files hold both kernels whole."""


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
    """Diff lines past DIFF_LINES, not shown."""


def kernel_diff(old: str, new: str, old_name: str, new_name: str, max_lines: int = DIFF_LINES) -> KernelDiff:
    """Unified diff (3 lines of context) from old to new, highlighted, at most max_lines lines."""
    lines = list(difflib.unified_diff(old.splitlines(), new.splitlines(), old_name, new_name, lineterm=""))
    added = sum(1 for line in lines[2:] if line.startswith("+"))
    removed = sum(1 for line in lines[2:] if line.startswith("-"))
    shown = lines[:max_lines]
    html = highlight("\n".join(shown), "diff") if shown else Markup("")
    return KernelDiff(html, added, removed, len(lines) - len(shown))
