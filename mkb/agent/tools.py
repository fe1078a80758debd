"""The agent's five tools (bash, read_file, write_file, submit, finish): schemas and their execution."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mkb.agent import feedback, prompts
from mkb.agent.budget import Budget, Clock
from mkb.agent.executor import Executor
from mkb.records import Dsl, JudgeRecord, Record, Status

log = logging.getLogger(__name__)


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required,
                       "additionalProperties": False}}}


TOOL_SPECS: list[dict[str, Any]] = [
    _tool("bash", "Run a bash command in the workspace (no GPU, no network). Output is capped; the command "
          "and everything it started are killed at the time limit.",
          {"command": {"type": "string", "description": "The command line, run with bash -c."},
           "timeout_s": {"type": "number", "description": "Time limit in seconds (default and maximum 600)."}},
          ["command"]),
    _tool("read_file", "Read a text file of the workspace.",
          {"path": {"type": "string", "description": "Path relative to the workspace."}}, ["path"]),
    _tool("write_file", "Create or replace a text file of the workspace with the given content.",
          {"path": {"type": "string", "description": "Path relative to the workspace."},
           "content": {"type": "string", "description": "The complete new content of the file."}},
          ["path", "content"]),
    _tool("submit", "Grade the current kernel.py on the GPU (correctness on fresh inputs, then timing) and get "
          "the report. Feedback only; limited number per attempt.", {}, []),
    _tool("finish", "End the attempt early (it asks you to confirm with a second call). The kernel.py in the "
          "workspace is then graded once more: that is the result. There is no bonus for finishing early.",
          {"summary": {"type": "string", "description": "Optional one-paragraph summary of what you did."}}, []),
]
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOL_SPECS)
_TYPES = {"string": str, "number": (int, float)}


class Submission(Record):
    """One grading of kernel.py during an attempt."""

    n: int
    """1-based order within the attempt (the final grading comes last)."""
    kind: str
    """feedback (the submit tool) or final (the attempt's result)."""
    record: JudgeRecord
    """What the judge said."""
    kernel_source: str
    """The graded kernel.py."""
    kernel_sha256: str
    """sha256 of kernel_source."""
    queue_s: float = 0.0
    """Seconds the grading waited for a GPU (not charged to the budget)."""
    charged: bool = True
    """Counts against the submission budget (infra errors never do)."""


@dataclass
class ToolResult:
    """What a tool returns to the model, plus metadata for the transcript."""

    text: str
    extra: dict[str, Any] = field(default_factory=dict)


Grade = Callable[[str], Any]
"""grade(kernel_path) -> JudgeRecord, or an object with .record and .queue_s (time queued for a GPU)."""


class Toolbox:
    """Runs tool calls against one workspace. Every failure is returned to the model as text."""

    def __init__(self, executor: Executor, grade: Grade, clock: Clock, budget: Budget,
                 on_submission: Callable[[Submission], None] | None = None, *, variant: tuple[str, Dsl],
                 templates_dir: Path):
        """Args:
            variant: (problem id, dsl) of the attempt, for the records of kernels refused before grading.
        """
        self.executor, self.grade, self.clock, self.budget = executor, grade, clock, budget
        self.on_submission = on_submission or (lambda s: None)
        self.variant, self.templates_dir = variant, templates_dir
        self.submissions: list[Submission] = []
        self.finished = False
        self.turn = 0
        """The model reply being executed (the loop sets it); a finish is confirmed only in a later one."""
        self._finish_asked: int | None = None
        # named after this process: a run killed with kill -9 leaves it to the next run's sweep (mkb.judge.leftovers)
        self._staging = tempfile.TemporaryDirectory(prefix=f"mkb-submissions-{os.getpid()}-")

    @property
    def submissions_left(self) -> int:
        return self.budget.n_submissions - sum(s.charged for s in self.submissions if s.kind == "feedback")

    def run(self, call: dict[str, Any]) -> ToolResult:
        """Execute one tool call in wire format."""
        function = call.get("function") or {}
        name, raw = function.get("name", ""), function.get("arguments") or "{}"
        if name not in TOOL_NAMES:
            return ToolResult(f"error: unknown tool '{name}'. The tools are: {', '.join(TOOL_NAMES)}.",
                              {"error": "unknown_tool"})
        if name != "finish":
            self._finish_asked = None  # any other action withdraws a request to finish
        try:
            args = _arguments(name, raw)
        except ValueError as exc:
            return ToolResult(f"error: invalid arguments for {name}: {exc}", {"error": "bad_arguments"})
        try:
            return getattr(self, f"_{name}")(**args)
        except (OSError, ValueError) as exc:
            text = _error_text(exc, args)
            root = getattr(self.executor, "root", None)  # never the host path of the workspace, whatever the error
            text = text.replace(str(root), self.executor.workdir) if root is not None else text
            return ToolResult(f"error: {name} failed: {text}", {"error": type(exc).__name__})

    def _bash(self, command: str, timeout_s: float | None = None) -> ToolResult:
        limit = min(timeout_s or self.budget.bash_timeout_s, self.budget.bash_timeout_s, self.clock.remaining_s())
        result = self.executor.exec(command, max(1.0, limit), self.budget.output_limit)
        head = (f"timed out after {limit:.0f} s: the command and everything it started were killed"
                if result.timed_out else f"exit code {result.exit_code}")
        return ToolResult(f"{head}\n{result.output}", {"exit_code": result.exit_code, "timed_out": result.timed_out,
                                                        "duration_s": round(result.duration_s, 3)})

    def _read_file(self, path: str) -> ToolResult:
        text = self.executor.read_file(path)
        if len(text) > self.budget.output_limit:
            shown = text[:self.budget.output_limit]
            return ToolResult(f"{shown}\n[... truncated: {len(text)} characters in all; read the rest with bash, "
                              f"e.g. sed -n '400,600p' {path}]")
        return ToolResult(text if text else f"({path} is empty)")

    def _write_file(self, path: str, content: str) -> ToolResult:
        self.executor.write_file(path, content)
        return ToolResult(f"wrote {len(content.encode())} bytes to {path}")

    def _submit(self) -> ToolResult:
        if self.submissions_left <= 0:
            return ToolResult(f"error: no submissions left (all {self.budget.n_submissions} used). Keep improving "
                              "kernel.py if you like: it is graded once more when the attempt ends.",
                              {"error": "no_submissions_left"})
        source, unreadable = self._snapshot()
        refused = unreadable or feedback.precheck(source)
        if refused is not None:
            return ToolResult(f"not submitted: {refused}. It was not graded and does not count as a submission.",
                              {"refused": refused})
        submission = self.grade_kernel("feedback", source)
        return ToolResult(summarize(submission), {"submission": submission.n})

    def _finish(self, summary: str = "") -> ToolResult:
        extra = {"summary": summary} if summary else {}
        if self._finish_asked is not None and self._finish_asked < self.turn:
            self.finished = True
            return ToolResult("finished: kernel.py will now be graded once more; that grading is the attempt's "
                              "result.", {**extra, "confirmed": True})
        self._finish_asked = self.turn
        text = prompts.render("finish_confirm.md.j2", self.templates_dir, time_left=self.clock.left_text(),
                              submissions_left=self.submissions_left, n_submissions=self.budget.n_submissions)
        return ToolResult(text.strip(), {**extra, "confirm": "asked"})

    def _snapshot(self) -> tuple[str, str | None]:
        """kernel.py's text, or ("", why it cannot be read): missing, a directory, outside the workspace, too large."""
        try:
            return self.executor.read_file("kernel.py"), None
        except (OSError, ValueError) as exc:
            log.info("kernel.py unreadable: %s", exc)
            return "", f"kernel.py cannot be read ({exc})"

    def grade_kernel(self, kind: str, source: str | None = None) -> Submission:
        """Snapshot kernel.py out of the workspace, grade the snapshot, record the submission.

        A kernel that cannot be graded (feedback.precheck) is not sent to the judge: the final grading
        records it as an import_error with the reason (feedback submissions refuse it before this).
        """
        source, unreadable = self._snapshot() if source is None else (source, None)
        n = len(self.submissions) + 1
        refused = unreadable or feedback.precheck(source)
        if refused is not None:
            record, queue_s = self._refused(refused), 0.0
        else:
            path = Path(self._staging.name) / f"{n:02d}" / "kernel.py"
            path.parent.mkdir()
            path.write_text(source, encoding="utf-8")
            outcome = self.grade(str(path))
            record, queue_s = (outcome, float(outcome.details.get("queue_s") or 0.0)) \
                if isinstance(outcome, JudgeRecord) else (outcome.record, float(outcome.queue_s or 0.0))
        self.clock.pause(queue_s, queued=True)
        submission = Submission(n=n, kind=kind, record=record, kernel_source=source,
                                kernel_sha256=hashlib.sha256(source.encode()).hexdigest(), queue_s=queue_s,
                                charged=kind == "feedback" and record.status != Status.INFRA_ERROR)
        self.submissions.append(submission)
        self.on_submission(submission)
        return submission

    def _refused(self, reason: str) -> JudgeRecord:
        problem, dsl = self.variant
        return JudgeRecord(status=Status.IMPORT_ERROR, message=f"not graded: {reason}", problem=problem, dsl=dsl,
                           device="none", details={"refused": reason})

    def read_skill(self) -> str | None:
        """SKILL.md as the agent left it; None when missing or blank."""
        try:
            text = self.executor.read_file("SKILL.md")
        except (OSError, ValueError):
            return None
        return text if text.strip() else None

    def close(self) -> None:
        self._staging.cleanup()


def _error_text(exc: Exception, args: dict[str, Any]) -> str:
    """An OS error names the path the model gave, never the host path it resolved to."""
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{args['path']}: {exc.strerror}" if "path" in args else str(exc.strerror)
    return str(exc)


def _arguments(name: str, raw: str | dict) -> dict[str, Any]:
    """Parse and check a tool call's JSON arguments against its schema (unknown keys are ignored)."""
    schema = next(t["function"]["parameters"] for t in TOOL_SPECS if t["function"]["name"] == name)
    try:
        args = json.loads(raw) if isinstance(raw, str) and raw.strip() else (raw or {})
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at position {exc.pos}). Send a JSON object with "
                         f"{_shape(schema)}.") from None
    if not isinstance(args, dict):
        raise ValueError(f"expected a JSON object with {_shape(schema)}, got {type(args).__name__}.")
    props = schema["properties"]
    missing = [k for k in schema["required"] if k not in args]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}. Send a JSON object with {_shape(schema)}.")
    for key in [k for k in args if k in props]:
        kind, value = props[key]["type"], args[key]
        if isinstance(value, bool) or not isinstance(value, _TYPES[kind]):
            raise ValueError(f"'{key}' must be a {kind}, got {type(value).__name__}.")
    return {k: v for k, v in args.items() if k in props}


def _shape(schema: dict[str, Any]) -> str:
    fields = [f"{k} ({v['type']}{'' if k in schema['required'] else ', optional'})"
              for k, v in schema["properties"].items()]
    return "fields " + ", ".join(fields) if fields else "no fields: {}"


def summarize(submission: Submission) -> str:
    """What the model sees of a grading: which submission, then the report (mkb.agent.feedback)."""
    head = f"submission {submission.n} ({submission.kind}), graded in {submission.record.wall_s:.0f} s"
    return feedback.report(submission.record, head)
