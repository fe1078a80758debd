"""The working conditions of an attempt where the paper's protocol and ours may differ, chosen by settings.

The paper's behaviour is every default (docs/fidelity.md, protocol section). The conditions are stated
in the instruction where the agent needs them, recorded with each run and attempt, and part of every
trial's fingerprint, so results under different conditions never mix.
"""

from __future__ import annotations

from typing import Literal

from mkb.records import Record
from mkb.settings import Settings

KERNEL_BYTE_LIMIT = 300_000
"""Largest kernel.py that is graded (the original's limit); larger ones are refused before grading."""


class Conditions(Record):
    """What the attempt is told and how it is charged, beyond its Budget."""

    dsl_policy: str = "paper"
    """The DSL-use rule: paper (a DSL kernel must run and matter, eager may do the rest) or strict."""
    clock: Literal["paper", "agent"] = "paper"
    """paper: the budget clock counts everything, GPU queue and grading included (the original's 40 minutes);
    agent: time queued for a GPU and provider backoff is paused out."""
    context_full: Literal["summarize", "end"] = "summarize"
    """summarize: a full context is handed over to the model's own summary and the attempt goes on (the
    original's agent); end: the attempt ends and its kernel is graded."""
    manual_examples: bool = True
    """The workspace's manual includes its worked example kernels (docs/examples/)."""
    sandbox_cpus: float = 2.0
    """CPUs of the agent's sandbox, as stated in the instruction."""
    sandbox_memory_mb: int = 8192
    """Memory of the agent's sandbox in MiB, as stated in the instruction."""

    @property
    def manuals(self) -> str:
        """Which parts of the DSL manual the workspace holds."""
        return "guide+api+examples" if self.manual_examples else "guide+api"

    @classmethod
    def of(cls, settings: Settings) -> Conditions:
        """The conditions the settings choose."""
        return cls(dsl_policy=settings.dsl_policy, clock=settings.clock, context_full=settings.context_full,
                   manual_examples=settings.manual_examples, sandbox_cpus=settings.sandbox_cpus,
                   sandbox_memory_mb=settings.sandbox_memory_mb)

    def recorded(self) -> dict:
        """The conditions as a run, an attempt and a fingerprint record them."""
        return {**self.model_dump(mode="json"), "manuals": self.manuals}
