"""A full context handed over to the model's own summary, so that the attempt goes on.

The original's agent (Harbor's Terminus-2) does not stop when its context is full: it summarises its
work and continues in a fresh context. Here the model is asked for a summary with as much of the
recent conversation as fits (the request is retried with less history when even it is too long);
the new context is the instruction, the first user message (with any transferred skill) and the
summary. Every message of the exchange stays in the transcript.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkb.agent import prompts
from mkb.agent.budget import Clock, Usage
from mkb.agent.model import ContextExhausted, Model
from mkb.agent.tools import TOOL_SPECS

PINNED = 2
"""Messages every context keeps: the instruction (system) and the first user message."""
HISTORY_SHARES = (0.5, 0.25, 0.0)
"""Shares of the conversation (by size) sent with the summary request, tried in turn."""


def hand_over(model: Model, context: list[dict[str, Any]], *, append: Callable[[dict[str, Any], bool], None],
              usage: Usage, clock: Clock, n: int, dsl_name: str, templates_dir: Path) -> bool:
    """Replace the conversation after the pinned messages by the model's summary of it.

    Args:
        context: the messages sent to the model (changed in place on success).
        append: append(message, keep) records a message in the transcript, and in the context when keep.
        n: the number of this handoff in the attempt (1 for the first).

    Returns:
        False when not even the shortest summary request fits the context: the attempt has to end.
    """
    request = {"role": "user", "content": prompts.render("handoff_request.md.j2", templates_dir, dsl_name=dsl_name),
               "extra": {"notice": "handoff_request", "handoff": n}}
    history = context[PINNED:]
    for share in HISTORY_SHARES:
        window = [*context[:PINNED], *recent(history, share), request]
        try:
            completion = model.complete(wire(window), TOOL_SPECS)
        except ContextExhausted:
            continue
        clock.pause(completion.waited_s)
        usage.add(completion.extra)
        append({**request, "extra": {**request["extra"], "history_share": share}}, False)
        append({**completion.message, "extra": {**completion.extra, "notice": "handoff_summary", "handoff": n}}, False)
        summary = (completion.message.get("content") or "").strip() or "(the summary came back empty)"
        del context[PINNED:]
        usage.n_handoffs += 1
        append({"role": "user", "extra": {"notice": "handoff", "handoff": n},
                "content": prompts.render("handoff.md.j2", templates_dir, n=n, summary=summary,
                                          clock=clock.elapsed_text())}, True)
        return True
    return False


def recent(history: list[dict[str, Any]], share: float) -> list[dict[str, Any]]:
    """The latest messages holding at most `share` of the history's size, starting at an assistant message
    (a tool result is never sent without the call it answers)."""
    sizes = [len(json.dumps(wire([m])[0], default=str)) for m in history]
    room, start = share * sum(sizes), len(history)
    while start > 0 and sizes[start - 1] <= room:
        room -= sizes[start - 1]
        start -= 1
    while start < len(history) and history[start].get("role") != "assistant":
        start += 1
    return history[start:]


def wire(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The message list as the API expects it: per-message metadata ('extra') stripped."""
    return [{k: v for k, v in m.items() if k != "extra"} for m in messages]
