"""The judge: grade one kernel against one problem variant, isolated and hack-resistant (DESIGN §5).

`grade(problem, kernel_path, dsl, device=..., timing=...)` is the one entry point: the CLI's
`mkb verify` and the agent's submit tool call it. See docs/judge.md for the procedure and the
threat model.
"""

from mkb.judge.grading import grade

__all__ = ["grade"]
