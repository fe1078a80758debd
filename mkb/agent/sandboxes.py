"""Which sandboxes attempts may use here: unisolated commands are refused unless the unsafe setting allows them."""

from __future__ import annotations

from mkb.agent.bwrap import bwrap_problem
from mkb.errors import ConfigError


class SandboxRefused(ConfigError):
    """The agent's commands would run unisolated and the unsafe setting does not allow it."""


def check_sandbox(kind: str, *, allow_unsafe: bool, image: str = "") -> None:
    """Raise now, before any attempt starts, when attempts could not open this kind of sandbox here.

    Raises:
        ConfigError: no isolation without the unsafe setting (SandboxRefused), or no Docker engine or image.
    """
    if kind == "docker":
        from mkb.agent.docker_executor import check_image

        check_image(image)
    elif (problem := isolation_problem(kind == "local")) and not allow_unsafe:
        raise refusal(problem)


def isolation_problem(isolate: bool) -> str | None:
    """Why commands would run unisolated (bubblewrap cannot run, or isolation is off), or None."""
    return bwrap_problem() if isolate else "--sandbox none asks for no isolation"


def refusal(problem: str) -> SandboxRefused:
    """The one-line error for a sandbox that cannot isolate, naming the three ways forward."""
    return SandboxRefused(
        f"the agent's commands cannot be isolated here: {problem}. Install bubblewrap (apt-get install bubblewrap), "
        f"use --sandbox docker, or set MKB_UNSAFE_SANDBOX=1 to run them unisolated (they could then read your "
        f"API key, the results database and the solutions).")
