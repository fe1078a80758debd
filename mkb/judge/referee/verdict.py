"""How a grading ends on the trusted side: Failure (stop with a status), who is charged, the verdict line.

The rule that keeps gradings from being bought: before kernel.py is imported the referee proves
that the sandbox works (CUDA, a shared tensor and signals both ways, with every
harness process); a failure up to there is the judge's (`infra_error`, never charged). From the
moment kernel.py starts to import, the candidate shares the GPU, the host's memory and the
sandbox's /dev/shm with the trusted processes and controls everything its own process says, so
whatever goes wrong after that (a trusted process failing or dying, IPC failing, the harness
reporting an infrastructure problem) is charged to it as `crashed`. The one exception is a failure the
referee proves is its own from facts it reads itself (JudgeFault): the GPU running out in a trusted
process after the kernel's processes ended, or while they held less than the allowance fixed before
kernel.py loaded (memory.py).
"""

from __future__ import annotations

import math
from typing import Any

from mkb.records import Status

CHARGED_NOTE = ("charged as a crash: it happened after kernel.py was loaded, when the kernel shares the GPU, "
                "memory and /dev/shm with the judge")


class Failure(Exception):
    """Grading stops here with this status and message."""

    def __init__(self, status: Status, message: str, **details):
        super().__init__(message)
        self.status, self.message, self.details = status, message, details


class JudgeFault(Failure):
    """An infra_error the referee proved its own from its own readings (memory.blame); never raised on anything
    the candidate reports."""

    def __init__(self, message: str, **details):
        super().__init__(Status.INFRA_ERROR, message, **details)


def charged(status: Status, message: str, kernel_loaded: bool, proven: bool = False) -> tuple[Status, str]:
    """The status a grading ends with: an infrastructure failure once kernel.py was loaded is a crash, unless the
    referee proved it its own (JudgeFault)."""
    if status == Status.INFRA_ERROR and kernel_loaded and not proven:
        return Status.CRASHED, f"{message} ({CHARGED_NOTE})"
    return status, message


def finite(obj: Any) -> Any:
    """obj with NaN/Inf replaced by None (the verdict line is strict JSON)."""
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj if not isinstance(obj, float) or math.isfinite(obj) else None
