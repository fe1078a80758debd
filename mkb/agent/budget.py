"""The matched budget of one attempt and the clock that charges it (GPU queue time excluded)."""

from __future__ import annotations

from collections.abc import Callable

from mkb.records import Record


class Budget(Record):
    """What one attempt may spend (DESIGN §6); the same for every arm of a cell."""

    wall_s: float | None = 2400.0
    """Agent wall clock, excluding time queued for a GPU and provider backoff; None for no limit."""
    n_submissions: int = 10
    """Feedback submissions (the final grading is not one of them)."""
    max_turns: int | None = None
    """Cap on model replies; None for no cap."""
    max_tokens: int | None = None
    """Cap on prompt + completion tokens summed over all replies; None for no cap."""
    bash_timeout_s: float = 600.0
    """Longest a single bash command may run (it is also cut at the end of the wall clock)."""
    output_limit: int = 20_000
    """Characters of command output or file text shown to the model per tool call."""


class Usage(Record):
    """What the attempt spent on the model."""

    model_config = Record.model_config | {"frozen": False}

    n_turns: int = 0
    """Model replies received."""
    prompt_tokens: int = 0
    """Tokens sent, summed over replies (as the provider reports them)."""
    completion_tokens: int = 0
    """Tokens received, summed over replies."""
    reasoning_tokens: int = 0
    """Of the completion tokens, those spent on hidden reasoning (where reported)."""
    cost_usd: float | None = None
    """Provider-reported cost, where the provider reports one (e.g. OpenRouter)."""
    n_tool_calls: int = 0
    """Tool calls the model made."""

    def add(self, extra: dict) -> None:
        """Count one reply from its metadata."""
        self.n_turns += 1
        self.prompt_tokens += int(extra.get("prompt_tokens") or 0)
        self.completion_tokens += int(extra.get("completion_tokens") or 0)
        self.reasoning_tokens += int(extra.get("reasoning_tokens") or 0)
        if extra.get("cost_usd") is not None:
            self.cost_usd = (self.cost_usd or 0.0) + float(extra["cost_usd"])


class Clock:
    """Charges wall time to an attempt; time spent waiting (GPU queue, provider backoff) is paused out."""

    def __init__(self, budget: Budget, now: Callable[[], float]):
        self.budget, self._now = budget, now
        self.started = now()
        self.paused_s = 0.0
        self.queue_s = 0.0

    def pause(self, seconds: float, queued: bool = False) -> None:
        """Exclude seconds already spent waiting from the charged time."""
        self.paused_s += max(0.0, seconds)
        if queued:
            self.queue_s += max(0.0, seconds)

    def wall_s(self) -> float:
        """Seconds since the start, everything included."""
        return self._now() - self.started

    def elapsed_s(self) -> float:
        """Charged seconds."""
        return max(0.0, self.wall_s() - self.paused_s)

    def remaining_s(self) -> float:
        return float("inf") if self.budget.wall_s is None else max(0.0, self.budget.wall_s - self.elapsed_s())

    def exhausted(self, usage: Usage) -> str | None:
        """Which limit is reached (time, turns, tokens), or None."""
        if self.remaining_s() <= 0:
            return "time"
        if self.budget.max_turns is not None and usage.n_turns >= self.budget.max_turns:
            return "turns"
        if self.budget.max_tokens is not None and usage.prompt_tokens + usage.completion_tokens >= self.budget.max_tokens:
            return "tokens"
        return None

    def line(self, submissions_left: int) -> str:
        """The visible clock appended to every tool result."""
        left = "no limit" if self.budget.wall_s is None else f"{_mmss(self.remaining_s())} left"
        return (f"[clock: {_mmss(self.elapsed_s())} elapsed, {left}; "
                f"submissions left: {submissions_left} of {self.budget.n_submissions}]")


def _mmss(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s"
