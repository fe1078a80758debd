"""What the agent is told about a submission: the check before grading, and the report after it.

The report carries what the original's grader reports (imported, correct draws k of 5, the first
mismatch, median times and speedup, passed) plus, for an exception, its traceback filtered to the
kernel's own frames and the libraries it called (the judge's frames and paths are grader internals).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable

from mkb.agent.conditions import KERNEL_BYTE_LIMIT
from mkb.records import JudgeRecord, Status

N_DRAWS = 5
"""Correctness draws per grading (DESIGN §5)."""
TAIL_CHARS = 2000
"""Characters of a crashed or timed-out kernel's output shown (the original's error tail)."""
TRACEBACK_CHARS = 4000
"""Characters of a filtered traceback shown."""

_FRAME = re.compile(r'^  File "(?P<path>[^"]*)", line \d+, in .*$')
_KERNEL_PATH = re.compile(r'"[^"]*/kernel\.py"')
_GRADER_FILE = re.compile(r"(^|/)mkb/(?:[a-z_]+/)?\w+\.py$")
"""A module of the mkb package (the judge's harness), wherever the package is installed."""


def precheck(source: str) -> str | None:
    """Why kernel.py cannot be graded (empty, over the size limit, not parsable Python), or None.

    Such a kernel never reaches the judge; as a feedback submission it is not charged (the original's rule).
    """
    if not source.strip():
        return "kernel.py is empty"
    size = len(source.encode("utf-8", "surrogatepass"))
    if size > KERNEL_BYTE_LIMIT:
        return f"kernel.py is {size} bytes, over the {KERNEL_BYTE_LIMIT}-byte limit"
    try:
        ast.parse(source, "kernel.py")
    except SyntaxError as exc:
        return f"kernel.py does not parse: {exc.msg} (line {exc.lineno})"
    except (ValueError, RecursionError, MemoryError) as exc:
        return f"kernel.py does not parse: {type(exc).__name__}: {str(exc)[:200]}"
    return None


def n_correct(record: JudgeRecord) -> int:
    """Correctness draws the kernel got right (the judge runs all five unless an error stops it)."""
    return sum(d.ok for d in record.draws)


def kernel_traceback(text: str) -> str:
    """A traceback with the judge's own frames (mkb, importlib) removed and the kernel's path shown as kernel.py."""
    kept: list[str] = []
    skipping = False
    for line in text.splitlines():
        frame = _FRAME.match(line)
        if frame:
            skipping = _is_grader_frame(frame["path"])
        elif not line.startswith("    "):
            skipping = False
        if not skipping:
            kept.append(_KERNEL_PATH.sub('"kernel.py"', line) if frame else line)
    return "\n".join(kept).strip()[-TRACEBACK_CHARS:]


def _is_grader_frame(path: str) -> bool:
    return path.startswith("<frozen importlib") or _GRADER_FILE.search(path) is not None


def report(record: JudgeRecord, head: str, redact: Callable[[str], str] = lambda text: text) -> str:
    """The report of one grading, under a first line (which submission, where graded, budget left).

    redact is applied to everything the kernel could have influenced (messages, traceback, output).
    """
    r = record
    if r.status == Status.INFRA_ERROR:
        return (f"{head}\nstatus: infra_error\nthe grading infrastructure failed ({redact(r.message)}): this "
                f"submission does not count against your budget")
    lines = [head, f"status: {r.status}", f"imported: {'no' if r.status == Status.IMPORT_ERROR else 'yes'}"]
    k = n_correct(r)
    lines.append(f"correct: {'yes' if k == N_DRAWS else 'no'} ({k} of {N_DRAWS} draws)")
    if r.status != Status.PASSED and r.message:
        lines.append(f"message: {redact(r.message)}")
    if r.kernel_ms is not None and r.eager_ms is not None:
        lines.append(f"median of the timed calls: kernel {r.kernel_ms:.4f} ms, eager {r.eager_ms:.4f} ms")
        lines.append(f"speedup vs eager: {r.speedup:.3f}x")
    elif r.status == Status.PASSED:
        lines.append(f"not timed (graded on {r.device})")
    lines.append(f"passed: {'yes' if r.status == Status.PASSED else 'no'}")
    trace = r.details.get("traceback") if isinstance(r.details.get("traceback"), str) else ""
    if r.status in (Status.IMPORT_ERROR, Status.RUNTIME_ERROR) and trace.strip():
        lines.append(f"traceback:\n{redact(kernel_traceback(trace))}")
    elif r.status in (Status.CRASHED, Status.TIMEOUT) and r.log_tail.strip():
        lines.append(f"output tail:\n{redact(r.log_tail.strip()[-TAIL_CHARS:])}")
    return "\n".join(lines)
