"""The matched budget of one attempt and the clock that charges it (the paper's all-inclusive clock, or ours)."""

from __future__ import annotations

from collections.abc import Callable

from mkb.records import Record


class Budget(Record):
    """What one attempt may spend (DESIGN §6); the same for every arm of a cell."""

    wall_s: float | None = 2400.0
    """Wall clock of the attempt (what the clock charges depends on Conditions.clock); None for no limit."""
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
    cached_tokens: int = 0
    """Of the prompt tokens, those the provider served from its prompt cache (where reported)."""
    cost_usd: float | None = None
    """Provider-reported cost, where the provider reports one (e.g. OpenRouter)."""
    n_tool_calls: int = 0
    """Tool calls the model made."""
    n_handoffs: int = 0
    """Times the context was full and the conversation was handed over to the model's own summary."""

    def add(self, extra: dict) -> None:
        """Count one reply from its metadata."""
        self.n_turns += 1
        self.prompt_tokens += int(extra.get("prompt_tokens") or 0)
        self.completion_tokens += int(extra.get("completion_tokens") or 0)
        self.reasoning_tokens += int(extra.get("reasoning_tokens") or 0)
        self.cached_tokens += int(extra.get("cached_tokens") or 0)
        if extra.get("cost_usd") is not None:
            self.cost_usd = (self.cost_usd or 0.0) + float(extra["cost_usd"])


class Clock:
    """Charges wall time to an attempt.

    mode "paper" charges everything, as the original's 40 minutes did (judge queue and grading
    included); mode "agent" pauses out the time spent waiting for a GPU and in provider backoff. Both
    waits are recorded either way, so either clock can be reconstructed from a stored attempt.
    """

    def __init__(self, budget: Budget, now: Callable[[], float], mode: str = "paper"):
        self.budget, self._now, self.mode = budget, now, mode
        self.started = now()
        self.paused_s = 0.0
        self.queue_s = 0.0
        """Seconds the gradings waited for a GPU."""
        self.backoff_s = 0.0
        """Seconds slept in provider backoff."""

    def pause(self, seconds: float, queued: bool = False) -> None:
        """Seconds already spent waiting (queued for a GPU, or provider backoff): charged only by the paper clock."""
        seconds = max(0.0, seconds)
        if queued:
            self.queue_s += seconds
        else:
            self.backoff_s += seconds
        if self.mode != "paper":
            self.paused_s += seconds

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

    def left_text(self) -> str:
        """The budget left as the clock line shows it, e.g. 27m55s (or 'no time limit')."""
        return "no time limit" if self.budget.wall_s is None else _mmss(self.remaining_s())

    def elapsed_text(self) -> str:
        """The charged time as the clock line shows it, e.g. 12m05s elapsed."""
        return f"{_mmss(self.elapsed_s())} elapsed"

    def line(self, submissions_left: int) -> str:
        """The visible clock appended to every tool result."""
        left = "no limit" if self.budget.wall_s is None else f"{self.left_text()} left"
        return (f"[clock: {_mmss(self.elapsed_s())} elapsed, {left}; "
                f"submissions left: {submissions_left} of {self.budget.n_submissions}]")


def _mmss(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s"
