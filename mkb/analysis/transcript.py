"""One trial as the site shows it: its current attempt's transcript, gradings and final kernel, clipped."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mkb.store import Store

TOOL_LINES, TOOL_CHARS = 40, 6_000
"""A tool result or tool-call body shows this much (as `mkb show` clips at 40 lines); the JSON has all."""
TEXT_LINES, TEXT_CHARS = 200, 20_000
"""An assistant or user message shows this much."""
SYSTEM_LINES = 12
"""The system prompt is the same instruction in every attempt: its first lines are enough."""


@dataclass(frozen=True)
class Clipped:
    """A text cut to a bounded size, and how much of it was left out."""

    text: str
    hidden_lines: int = 0
    """Whole lines left out (0: every line is shown, though one may be cut short)."""
    hidden_chars: int = 0
    """Characters left out in all."""
    lines: int = 0
    """Lines of the whole text."""

    @property
    def note(self) -> str:
        """What was left out, for a reader ('' when nothing was)."""
        if not self.hidden_chars:
            return ""
        what = f"{self.hidden_lines} more lines" if self.hidden_lines else f"{self.hidden_chars} more characters"
        return f"… {what} not shown; the trial's JSON has the full text"


def clip(text: str | None, max_lines: int, max_chars: int) -> Clipped:
    """The first max_lines lines of text, at most max_chars characters of them."""
    text = text or ""
    lines = text.splitlines(keepends=True)
    shown = "".join(lines[:max_lines])[:max_chars]
    hidden_lines = len(lines) - len(shown.splitlines()) if len(shown) < len(text) else 0
    return Clipped(shown.rstrip("\n"), hidden_lines, len(text) - len(shown), len(lines))


@dataclass(frozen=True)
class ToolCall:
    """One tool call of an assistant message, summarised on one line, its arguments below."""

    name: str
    summary: str
    """One line: the shell command, the file written, or the arguments."""
    body: Clipped | None
    """What the summary leaves out (a file's content, a long command); None if nothing."""
    lexer: str
    """How to highlight the body: python, markdown, bash, json or text."""


@dataclass(frozen=True)
class Entry:
    """One message of a transcript."""

    seq: int
    role: str
    """system, user, assistant or tool."""
    tool: str | None
    """For a tool result: the tool that produced it."""
    elapsed_s: float | None
    """Agent clock when the message was written (judge queue time excluded)."""
    tokens: tuple[int, int] | None
    """(prompt, completion) tokens of the model call that produced it."""
    content: Clipped
    reasoning: Clipped | None
    calls: tuple[ToolCall, ...]


@dataclass(frozen=True)
class Grading:
    """One graded submission (feedback, or the final grading that is the attempt's result)."""

    n: int
    kind: str
    status: str
    speedup: float | None
    kernel_ms: float | None
    eager_ms: float | None
    dsl_share: float | None
    """The declared DSL's share of profiled device time (record details.dsl_share, issue #24); None when
    the judge that graded it did not record one."""
    message: str


@dataclass(frozen=True)
class TrialView:
    """A trial's current attempt, ready to render."""

    model: str
    trial_id: str
    arm: str
    state: str
    status: str | None
    speedup: float | None
    attempt_id: str | None
    ended: str | None
    """How the attempt ended (the attempts table's message)."""
    other_attempts: int
    """The trial's other attempts (errored and rerun); the JSON has them."""
    entries: tuple[Entry, ...]
    gradings: tuple[Grading, ...]
    final_kernel: str | None
    """Source of the kernel the final grading graded; None if there was none."""


def _json(value: Any) -> Any:
    """DuckDB returns JSON columns as text; anything a model wrote may not parse."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _call(raw: Any) -> ToolCall:
    function = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(function, dict):
        return ToolCall("?", "(malformed tool call)", clip(json.dumps(raw, default=str), TOOL_LINES, TOOL_CHARS), "json")
    name, arguments = str(function.get("name") or "?")[:80], function.get("arguments") or ""
    args = _json(arguments) if isinstance(arguments, str) and arguments.strip() else (arguments or {})
    if not isinstance(args, dict):
        return ToolCall(name, "(arguments are not a JSON object)", clip(str(arguments), TOOL_LINES, TOOL_CHARS), "text")
    if name == "bash" and isinstance(args.get("command"), str):
        command = args["command"]
        first = command.splitlines()[0] if command.strip() else ""
        rest = None if command.strip() == first.strip() else clip(command, TOOL_LINES, TOOL_CHARS)
        return ToolCall(name, f"$ {first[:200]}", rest, "bash")
    if name == "write_file" and isinstance(args.get("content"), str):
        path, content = str(args.get("path")), args["content"]
        lexer = "python" if path.endswith(".py") else "text"  # Pygments' Markdown reads snake_case as emphasis
        return ToolCall(name, f"{path[:200]} ({len(content.encode())} bytes)",
                        clip(content, TOOL_LINES, TOOL_CHARS), lexer)
    shown = ", ".join(f"{k}={v!r}" for k, v in args.items())
    if len(shown) <= 200 and "\n" not in shown:
        return ToolCall(name, shown, None, "text")
    return ToolCall(name, f"{len(args)} arguments", clip(json.dumps(args, indent=1, default=str), TOOL_LINES,
                                                          TOOL_CHARS), "json")


def _entry(row: dict) -> Entry:
    extra = _json(row["extra"])
    extra = extra if isinstance(extra, dict) else {}
    calls = _json(row["tool_calls"])
    calls = calls if isinstance(calls, list) else ([] if calls is None else [calls])
    role = str(row["role"])
    lines = SYSTEM_LINES if role == "system" else TOOL_LINES if role == "tool" else TEXT_LINES
    chars = TOOL_CHARS if role == "tool" else TEXT_CHARS
    elapsed = extra.get("elapsed_s")
    reasoning = extra.get("reasoning")
    return Entry(seq=row["seq"], role=role, tool=str(extra["tool"])[:80] if extra.get("tool") else None,
                 elapsed_s=float(elapsed) if isinstance(elapsed, int | float) else None,
                 tokens=(row["prompt_tokens"], row["completion_tokens"] or 0) if row["prompt_tokens"] else None,
                 content=clip(row["content"], lines, chars),
                 reasoning=clip(str(reasoning), TOOL_LINES, TOOL_CHARS) if reasoning else None,
                 calls=tuple(_call(c) for c in calls))


def _grading(row: dict) -> Grading:
    record = _json(row["record"])
    details = record.get("details") if isinstance(record, dict) else None
    share = details.get("dsl_share") if isinstance(details, dict) else None
    message = record.get("message") if isinstance(record, dict) else None
    return Grading(n=row["n"], kind=row["kind"], status=row["status"], speedup=row["speedup"],
                   kernel_ms=row["kernel_ms"], eager_ms=row["eager_ms"],
                   dsl_share=float(share) if isinstance(share, int | float) and not isinstance(share, bool) else None,
                   message=clip(str(message or ""), 3, 400).text)


def _decoded(row: dict) -> dict:
    return {k: _json(v) if k in _JSON_COLUMNS else v for k, v in row.items()}


_JSON_COLUMNS = ("tool_calls", "extra", "record", "budget", "usage", "fingerprint_parts", "params", "versions", "gpus")


@dataclass(frozen=True)
class Loaded:
    """One trial read once: the view a page shows and the document its JSON file holds."""

    view: TrialView
    document: dict
    """Everything stored about the trial, unclipped: the trial row, every attempt with its messages and
    gradings (kernel sources and judge records included), and the skill it wrote."""


class Transcripts:
    """The trials, attempts and skills of the given models, read once; each attempt's messages and
    gradings read when its trial is loaded."""

    def __init__(self, store: Store, models: list[str]):
        self.store = store
        where = f"WHERE model IN ({', '.join('?' * len(models))})" if models else "WHERE false"
        self._trials = {(r["model"], r["trial_id"]): r
                        for r in store.rows(f"SELECT * FROM trials {where}", list(models))}
        self._attempts: dict[tuple[str, str], list[dict]] = {}
        for row in store.rows(f"SELECT * FROM attempts {where} ORDER BY started_at, attempt_id", list(models)):
            self._attempts.setdefault((row["model"], row["trial_id"]), []).append(row)
        current = f"AND attempt_id IN (SELECT attempt_id FROM trials {where})"  # a trial's skill: its current attempt's
        self._skills = {(r["model"], r["trial_id"]): {"text": r["text"], "sha256": r["sha256"]}
                        for r in store.rows(f"SELECT model, trial_id, text, sha256 FROM skills {where} {current}",
                                            [*models, *models])}
        self.problem_names = {r["problem_id"]: r["name"] for r in store.rows("SELECT problem_id, name FROM problems")}
        """Each problem's name (e.g. fused_add_rmsnorm_h4096_llama31_8b) by id."""

    def skill(self, model: str, trial_id: str | None) -> dict | None:
        """The SKILL.md a solo trial wrote ({'text', 'sha256'}), or None."""
        return self._skills.get((model, trial_id))

    def _attempt(self, attempt: dict) -> tuple[list[dict], list[dict]]:
        messages = self.store.rows("SELECT * FROM messages WHERE attempt_id = ? ORDER BY seq", [attempt["attempt_id"]])
        submissions = self.store.rows("SELECT * FROM submissions WHERE attempt_id = ? ORDER BY n",
                                      [attempt["attempt_id"]])
        return messages, submissions

    def load(self, model: str, trial_id: str) -> Loaded | None:
        """The trial's current attempt (trials.attempt_id) as a view, and every attempt in the document;
        None if the store has no such trial."""
        trial = self._trials.get((model, trial_id))
        if trial is None:
            return None
        attempts, documents = self._attempts.get((model, trial_id), []), []
        messages, submissions, current = [], [], None
        for attempt in attempts:
            rows = self._attempt(attempt)
            if attempt["attempt_id"] == trial["attempt_id"]:
                (messages, submissions), current = rows, attempt
            documents.append(_decoded(attempt) | {"messages": [_decoded(m) for m in rows[0]],
                                                  "submissions": [_decoded(s) for s in rows[1]]})
        final = [s for s in submissions if s["kind"] == "final"]
        view = TrialView(model=model, trial_id=trial_id, arm=trial["arm"], state=trial["state"],
                         status=trial["status"], speedup=trial["speedup"], attempt_id=trial["attempt_id"],
                         ended=current["message"] if current else None,
                         other_attempts=len(attempts) - (current is not None),
                         entries=tuple(_entry(m) for m in messages),
                         gradings=tuple(_grading(s) for s in submissions),
                         final_kernel=final[-1]["kernel_source"] if final else None)
        return Loaded(view, {"trial": _decoded(trial), "attempts": documents, "skill": self.skill(model, trial_id)})
