"""Settings: every knob, built once from flags, MKB_* environment variables and defaults.

The only module that reads the process environment: the CLI builds Settings once per command and
passes them down; library code takes them (and the device resolved from them) as arguments.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ENV_PREFIX = "MKB_"


def _repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


class Settings(BaseModel):
    """The effective configuration of one mkb invocation (frozen)."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    home: Path = Field(default_factory=lambda: _repo_root() / "results")
    """Directory holding all mutable state: the database, workspaces, caches."""
    db: Path | None = None
    """Results database; defaults to <home>/mkb.duckdb."""
    problems_dir: Path = Field(default_factory=lambda: _repo_root() / "problems")
    """Root of the problem set (problems/<family>/<NN>_<name>.py)."""
    solutions_dir: Path | None = None
    """Validated solutions (never shown to agents); defaults to <problems_dir>/solutions."""
    device: Literal["auto", "cuda", "cpu"] = "auto"
    """Where the judge runs kernels: cuda, cpu (the judge's CPU mode, smoke scale), or auto (cuda if one is visible)."""
    arch: str = "sm_90a"
    """GPU architecture to compile for and to name when no GPU is visible (sm_90a Hopper, sm_100a Blackwell)."""
    sandbox: Literal["local", "docker", "none"] = "local"
    """Where the agent's commands run: local (bubblewrap; refused where it cannot run, unless unsafe_sandbox), docker, none (needs unsafe_sandbox)."""
    image: str = "mkb:latest"
    """Image of the attempt containers when sandbox is docker."""
    judge_timeout_s: float = 600.0
    """Hard wall-clock limit for one judge child process."""
    judge_memory_mb: int = 32768
    """Host memory the candidate may use: its processes' RSS plus its tmpfs files (and RLIMIT_AS on CPU), in MiB."""
    judge_output_limit_bytes: int = 1_000_000
    """Bytes of the candidate's stdout/stderr kept; the rest is discarded."""
    judge_spares: int = 1
    """Start the next grading's judge processes ahead (torch imported, waiting) while one runs; 0: always cold."""
    judge_pin_cpus: bool = True
    """While timing, pin the referee and the timed process to physical cores of their own (GPU-local first)."""
    judge_tmpfs_mb: int = 4096
    """Size of each of a grading's tmpfs (the candidate's /tmp, the grading's /dev/shm), MiB; at most judge_memory_mb."""
    judge_final_processes: int = Field(default=5, ge=1)
    """Fresh sets of judge processes an attempt's final grading runs in (feedback gradings run in one)."""
    judge_final_summary: Literal["min", "median"] = "min"
    """How a final grading summarises its processes' medians: min (default) or median."""
    judge_unsafe_no_sandbox: bool = False
    """UNSAFE: when no OS sandbox can start, grade in plain processes that see the host (else infra_error)."""
    base_url: str | None = None
    """OpenAI-compatible endpoint for plain model names (e.g. http://127.0.0.1:8000/v1)."""
    model_retry_s: float = Field(default=240.0, ge=0)
    """Seconds one model request may spend waiting to retry rate limits, timeouts, refused connections and 5xx (waits of 2 s doubling to 60 s; one log line per retry); then the attempt ends as infra_error. 0: no retries."""
    unsafe_sandbox: bool = False
    """Let agents' commands run unisolated (they can read the API key and every file) where bubblewrap cannot run or with --sandbox none; otherwise those attempts are refused."""
    dsl_policy: Literal["paper", "strict"] = "paper"
    """DSL-use rule stated to agents and applied by the judge: paper (as the original: the DSL runs and computes the answer, eager does the rest; its share of device time is recorded) or strict (the share must also reach 0.9, or the problem's DSL_SHARE)."""
    clock: Literal["paper", "agent"] = "paper"
    """Budget clock: paper (all time counts, judge queue and grading too) or agent (GPU queue, backoff paused)."""
    context_full: Literal["summarize", "end"] = "summarize"
    """When the context is full: summarize (hand over to the model's summary and go on, as the paper) or end."""
    manual_examples: bool = True
    """Give agents the manuals' worked example kernels (docs/<dsl>/examples/); false leaves them out."""
    sandbox_cpus: float = 2.0
    """CPUs of an attempt's sandbox, as the instruction states them (the paper's 2)."""
    sandbox_memory_mb: int = 8192
    """Memory of an attempt's sandbox in MiB, as the instruction states it (the paper's 8 GB)."""

    @property
    def db_path(self) -> Path:
        return self.db if self.db is not None else self.home / "mkb.duckdb"

    @property
    def solutions_path(self) -> Path:
        return self.solutions_dir if self.solutions_dir is not None else self.problems_dir / "solutions"


def env_value(name: str) -> str | None:
    """Read one MKB_* variable (or any named variable, e.g. an API key) from the environment."""
    return os.environ.get(name)


def load_settings(**overrides) -> Settings:
    """Build Settings: explicit overrides (flags) > MKB_* environment variables > defaults."""
    values: dict = {}
    for field in Settings.model_fields:
        raw = os.environ.get(ENV_PREFIX + field.upper())
        if raw not in (None, ""):
            values[field] = raw
    values.update({k: v for k, v in overrides.items() if v is not None})
    return Settings(**values)


def environment() -> dict[str, str]:
    """A copy of the process environment (for building child-process environments)."""
    return dict(os.environ)


def settings_table() -> str:
    """The README's environment-variable table, generated from the Settings schema (so it cannot drift)."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.default if field.default_factory is None else field.default_factory()
        if isinstance(default, Path):
            default = "<checkout>/" + default.relative_to(_repo_root()).as_posix()
        shown = "unset" if default is None else f"`{default}`"
        rows.append(f"| `{ENV_PREFIX}{name.upper()}` | {shown} | {field.description} |")
    return "\n".join(rows)
