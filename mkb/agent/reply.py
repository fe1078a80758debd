"""One model reply: the endpoint's raw body checked and turned into a Completion (wire-format message + usage).

The body is parsed here rather than by the openai client's models, which accept anything: a 200 whose
body is not JSON raised JSONDecodeError out of the client, and a JSON body of the wrong shape surfaced as
an AttributeError somewhere later. Both are the endpoint's fault, so both become one MalformedReply with
the first thing that is wrong.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any


class MalformedReply(ValueError):
    """The endpoint answered with a body that is not a chat completion."""


@dataclass
class Completion:
    """One model reply: the assistant message in wire format plus what it cost."""

    message: dict[str, Any]
    """role, content and tool_calls, ready to append to the message list."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Tokens, reasoning text, finish reason, retries, latency: stored, never sent back."""
    waited_s: float = 0.0
    """Seconds slept in backoff before this reply (not charged to the attempt's budget)."""

    @property
    def prompt_tokens(self) -> int:
        return int(self.extra.get("prompt_tokens") or 0)

    @property
    def completion_tokens(self) -> int:
        return int(self.extra.get("completion_tokens") or 0)


def parse_body(text: str) -> dict[str, Any]:
    """The reply's JSON object.

    Raises:
        MalformedReply: not JSON, or JSON but not an object.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MalformedReply(f"the body is not JSON ({exc.msg} at character {exc.pos}): {_clip(text)}") from None
    if not isinstance(data, dict):
        raise MalformedReply(f"the body is {_kind(data)} in JSON, not an object: {_clip(text)}")
    return data


def completion(data: dict[str, Any], retries: int, waited_s: float, latency_s: float) -> Completion:
    """The first choice of a chat completion with non-empty choices.

    Raises:
        MalformedReply: a choice, its message, or a tool call is not shaped as the API defines it.
    """
    choices = data["choices"]
    if not isinstance(choices, list):
        raise MalformedReply(f"'choices' is {_kind(choices)}, not a list")
    choice = choices[0]
    raw = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(raw, dict):
        raise MalformedReply(f"choices[0] has no message object: {_clip(json.dumps(choice))}")
    message: dict[str, Any] = {"role": "assistant", "content": _content(raw.get("content"))}
    calls = [_tool_call(c, i) for i, c in enumerate(_list(raw.get("tool_calls"), "tool_calls"))]
    if calls := [c for c in calls if c is not None]:
        message["tool_calls"] = calls
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    details = usage.get("completion_tokens_details") if isinstance(usage.get("completion_tokens_details"), dict) else {}
    prompt_details = usage.get("prompt_tokens_details") if isinstance(usage.get("prompt_tokens_details"), dict) else {}
    cached = prompt_details.get("cached_tokens", usage.get("prompt_cache_hit_tokens"))  # OpenAI's name, DeepSeek's
    extra = {"prompt_tokens": _count(usage.get("prompt_tokens")),
             "completion_tokens": _count(usage.get("completion_tokens")),
             "reasoning_tokens": _count(details.get("reasoning_tokens")), "cached_tokens": _count(cached),
             "cost_usd": _number(usage.get("cost")),
             "finish_reason": _text(choice.get("finish_reason")), "model": _text(data.get("model")),
             "retries": retries, "latency_s": round(latency_s, 3)}
    reasoning = _text(raw.get("reasoning_content")) or _text(raw.get("reasoning"))
    if reasoning:
        extra["reasoning"] = reasoning
    return Completion(message, {k: v for k, v in extra.items() if v is not None}, waited_s)


def _tool_call(call: Any, index: int) -> dict[str, Any] | None:
    if not isinstance(call, dict):
        raise MalformedReply(f"tool_calls[{index}] is {_kind(call)}, not an object")
    function = call.get("function")
    if function is None:
        return None
    if not isinstance(function, dict):
        raise MalformedReply(f"tool_calls[{index}].function is {_kind(function)}, not an object")
    return {"id": _text(call.get("id")) or f"call_{uuid.uuid4().hex[:12]}", "type": "function",
            "function": {"name": _text(function.get("name")) or "", "arguments": as_text(function.get("arguments"))}}


def as_text(arguments: Any) -> str:
    """Tool-call arguments as the JSON string the API expects back (some servers send an object)."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments) if arguments is not None else ""


def _content(value: Any) -> str | None:
    """Text content; a list of content parts (some servers) is joined; anything else is kept as JSON text."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        return "".join(str(p.get("text") or "") for p in value)
    return json.dumps(value)


def _list(value: Any, name: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedReply(f"'{name}' is {_kind(value)}, not a list")
    return value


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _kind(value: Any) -> str:
    """A JSON value's kind as the JSON spec names it (an array, a string, null, ...)."""
    kinds = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def _clip(text: str, limit: int = 200) -> str:
    return repr(text[:limit]) + (f" ... ({len(text)} characters)" if len(text) > limit else "")
