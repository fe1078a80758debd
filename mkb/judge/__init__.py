"""The judge: grade one kernel against one problem variant, isolated and hack-resistant (DESIGN §5).

`grade(problem, kernel_path, dsl, device=..., timing=...)` is the one entry point: the CLI's
`mkb verify` and the agent's submit tool call it; an attempt's final grading is `grade_final()`, the same
grading in several fresh sets of processes (final.py, robust.py); commands that grade call `prepare_host()` first.
The package follows its trust boundaries: this folder is the parent (grading, launch, evaluation,
processes, sandbox, view, static, credentials, leftovers); `referee/` runs in the trusted referee
process; `candidate/` runs inside the sandboxed harness processes, and is all a sandbox shows of
mkb. See docs/judge.md for the procedure and the threat model.
"""

from mkb.judge.final import grade_final
from mkb.judge.grading import grade
from mkb.judge.leftovers import prepare_host

__all__ = ["grade", "grade_final", "prepare_host"]
