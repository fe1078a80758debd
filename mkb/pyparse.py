"""ast.parse for code that runs in threads (the judge pool grades concurrently; attempts run in threads).

CPython 3.11 and 3.12 keep the AST constructor's recursion depth in interpreter-wide state, so two
threads parsing at once can fail with "SystemError: AST constructor recursion depth mismatch" (seen in
tests/test_judge.py's concurrent graders). One lock serialises the parses; a parse takes milliseconds.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """ast.parse(source, filename), one thread at a time. Raises what ast.parse raises."""
    with _LOCK:
        return ast.parse(source, filename)
