"""grade(): stage the kernel, run the referee and the candidate in fresh processes, build a JudgeRecord.

The parent side of the judge. It runs the static policy scan, starts the trusted referee, the
candidate process (and, for GPU timing, the trusted eager process) in their own sessions with
their limits, wires their pipes, enforces the hard timeout, and turns whatever happened into one
JudgeRecord. Candidate failures are statuses, never exceptions.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

from mkb import environment
from mkb.errors import MkbError
from mkb.judge import static
from mkb.judge.processes import Evaluation, Plan, launched
from mkb.records import Dsl, JudgeRecord, ProblemInfo, Status
from mkb.settings import Settings

log = logging.getLogger(__name__)


_NETNS_FAILURES: list[str] = []
"""Why CUDA failed inside a network namespace, each time it did in this process."""
STICKY_AFTER = 2
"""After this many such failures later GPU gradings skip the namespace. On the H200 (2026-12-02) 23
gradings ran inside the namespace, then one failed to start there (a CUDA IPC producer gone) and
passed outside it; with a sticky first failure every later grading of that run lost its network
isolation. One failure re-grades that kernel only."""


def _netns_breaks_cuda() -> str | None:
    """The reason to skip the namespace for every grading from now on, or None."""
    return _NETNS_FAILURES[-1] if len(_NETNS_FAILURES) >= STICKY_AFTER else None


def _netns_failure(verdict: dict, details: dict, log_tail: str) -> str | None:
    """The reason to re-grade without a network namespace, when the namespace (not the kernel) may have broken CUDA.

    On the H200 (driver 580, torch 2.11) CUDA and CUDA IPC work inside `unshare -n`; a crash in
    getIpcDevPtr there came from mapping handles before CUDA was initialised (fixed in wire.py).
    The fallback stays for machines where the namespace does break CUDA.
    """
    if not details["isolation"]["network"].startswith(("unshare", "bwrap")):
        return None
    if verdict["status"] == Status.INFRA_ERROR:
        return verdict.get("message", "")
    if verdict["status"] == Status.CRASHED and "getIpcDevPtr" in log_tail:
        return "mapping CUDA IPC handles crashed (SIGSEGV in getIpcDevPtr)"
    return None


def grade(problem: ProblemInfo, kernel_path: str | Path, dsl: Dsl | str, *, device: str,
          timing: str = "paper", timeout_s: float | None = None, settings: Settings | None = None,
          scale: str = "full", visible_devices: str | None = None,
          now: Callable[[], float] = time.monotonic) -> JudgeRecord:
    """Grade kernel_path against one problem variant (DESIGN §5).

    device is cuda or cpu, as the caller resolved it (mkb.environment.resolve_device); settings
    default to the defaults. visible_devices pins the judge's processes to GPUs (CUDA_VISIBLE_DEVICES, e.g. "3").

    Raises:
        MkbError: the kernel file does not exist or an option is invalid (user errors only).
    """
    settings = settings or Settings()
    dsl, started = Dsl(dsl), now()
    if device not in ("cuda", "cpu"):
        raise MkbError(f"unknown device '{device}': grade() takes cuda or cpu (resolve 'auto' with "
                       f"mkb.environment.resolve_device).")
    if timing not in ("paper", "flushed"):
        raise MkbError(f"unknown timing mode '{timing}'. Use paper or flushed.")
    kernel = Path(kernel_path)
    if not kernel.is_file():
        raise MkbError(f"kernel file {kernel} not found. Pass the path of your kernel.py.")
    base = {"problem": problem.id, "dsl": dsl, "device": device}
    findings = static.scan(kernel.read_text(errors="replace"), dsl)
    if findings:
        return JudgeRecord(status=Status.POLICY_VIOLATION, message="; ".join(str(f) for f in findings[:5]),
                           details={"static": [f.__dict__ for f in findings]}, wall_s=now() - started, **base)
    timeout_s = float(timeout_s if timeout_s is not None else settings.judge_timeout_s)
    first_try = _netns_breaks_cuda() if device == "cuda" else None
    for isolate_network in (False,) if first_try else (True, False):
        verdict, details, log_tail = _evaluate(problem, kernel, dsl, device, timing, scale, settings, timeout_s,
                                               isolate_network, visible_devices, now)
        failure = _netns_failure(verdict, details, log_tail) if device == "cuda" else None
        if failure is None:
            break
        _NETNS_FAILURES.append(failure)
        first_try = failure
        log.warning("grading failed inside a network namespace (%s); grading again WITHOUT network isolation%s",
                    failure[:200], " (and so for the rest of this process)" if _netns_breaks_cuda() else "")
    if first_try is not None and not isolate_network:
        details["isolation"]["network"] = f"none: CUDA failed inside a network namespace ({first_try[:300]})"
    details.update(static=[], timeout_s=timeout_s, scale=scale, timing_mode=timing if device == "cuda" else "none",
                   environment=_environment(device))
    return JudgeRecord(status=verdict["status"], message=verdict.get("message", ""), draws=verdict.get("draws", []),
                       kernel_ms=verdict.get("kernel_ms"), eager_ms=verdict.get("eager_ms"),
                       speedup=verdict.get("speedup"), dsl_check=verdict.get("dsl_check", "not_checked"),
                       details=details, log_tail=log_tail, wall_s=now() - started, **base)


def _evaluate(problem, kernel, dsl, device, timing, scale, settings, timeout_s, isolate_network, visible_devices,
              now) -> tuple[dict, dict, str]:
    """One run of the judge processes, on a spare Launch when one is waiting (processes.launched)."""
    timed = device == "cuda" and timing != "none"
    plan = Plan.of(settings, device, timed, isolate_network, visible_devices)
    with launched(plan, keep_spare=settings.judge_spares > 0) as (launch, ahead_s):
        try:
            evaluation = Evaluation(launch, problem, kernel, dsl, timing, scale, settings.judge_pin_cpus)
        except BaseException:
            launch.close()
            raise
        verdict, details, log_tail = evaluation.supervise(timeout_s, now)
    details["spare"] = {"used": ahead_s is not None, "started_s_before": ahead_s}
    return verdict, details, log_tail


def _environment(device: str) -> dict:
    """Host, platform, tool versions and git commit; the driver version on a GPU."""
    facts = environment.describe(with_gpu=False)
    if device == "cuda":
        facts["driver"] = environment.driver_version()
    return facts
