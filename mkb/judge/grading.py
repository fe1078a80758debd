"""grade(): scan the kernel, run the referee and the candidate in their sandbox, build a JudgeRecord.

The parent side of the judge. It runs the static policy scan, starts (or takes a spare of) the
grading's processes in their OS sandbox (launch.py, sandbox.py), hands them the problem and the
kernel, enforces the hard timeout and the candidate's limits (evaluation.py), and turns whatever
happened into one JudgeRecord, redacted of every credential the runner holds (credentials.py).
Candidate failures are statuses, never exceptions. When no sandbox can start, the grading is an
`infra_error` saying why; plain processes are used only when the user asked for them
(settings.judge_unsafe_no_sandbox).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

from mkb import environment
from mkb.errors import MkbError
from mkb.judge import credentials, sandbox, static
from mkb.judge.anchor import Anchor
from mkb.judge.evaluation import Evaluation
from mkb.judge.launch import LaunchError, Plan, launched
from mkb.judge.robust import Baseline
from mkb.records import Dsl, JudgeRecord, ProblemInfo, Status
from mkb.settings import Settings
from mkb.settings import environment as runner_environment

log = logging.getLogger(__name__)


def grade(problem: ProblemInfo, kernel_path: str | Path, dsl: Dsl | str, *, device: str,
          timing: str = "paper", timeout_s: float | None = None, settings: Settings | None = None,
          scale: str = "full", visible_devices: str | None = None, baseline: Baseline | None = None,
          anchor: Anchor | None = None, now: Callable[[], float] = time.monotonic) -> JudgeRecord:
    """Grade kernel_path against one problem variant in one set of fresh processes (DESIGN §5).

    device is cuda or cpu, as the caller resolved it (mkb.environment.resolve_device); settings
    default to the defaults. visible_devices pins the judge's processes to GPUs (CUDA_VISIBLE_DEVICES, e.g. "3").
    With a baseline (the stored eager figure of this problem, GPU and environment) the eager reference is
    not timed here and the speedup is against it. Final gradings use mkb.judge.final.grade_final.
    anchor (artifact/generators/anchors.py only; mkb.judge.anchor) grades a trusted wrapper of a published
    library: its modules pass the static scan and its site is shown to the candidate; details.anchor says so.

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
    source = kernel.read_text(errors="replace")
    findings = static.scan(source, dsl, allow=anchor.modules if anchor else ())
    if anchor is not None:
        base["details"] = {"anchor": {**anchor.describe(), "waived": [str(f) for f in static.scan(source, dsl)
                                                                      if f not in findings]}}
    if findings:
        record = JudgeRecord(status=Status.POLICY_VIOLATION, message="; ".join(str(f) for f in findings[:5]),
                             wall_s=now() - started, **_with(base, static=[f.__dict__ for f in findings]))
        return credentials.redact_record(record, runner_environment())
    timeout_s = float(timeout_s if timeout_s is not None else settings.judge_timeout_s)
    found, why = sandbox.find()
    if found is None and not settings.judge_unsafe_no_sandbox:
        record = JudgeRecord(status=Status.INFRA_ERROR, message=f"no OS sandbox for the candidate: {why}. {sandbox.FIX}.",
                             wall_s=now() - started, **_with(base, isolation={"sandbox": f"none: {why}"}))
        return credentials.redact_record(record, runner_environment())
    if found is None:
        log.warning("NO SANDBOX (%s): grading in plain processes that see the host, as asked "
                    "(MKB_JUDGE_UNSAFE_NO_SANDBOX)", why)
    try:
        verdict, details, log_tail = _evaluate(problem, kernel, dsl, device, timing, scale, settings, timeout_s,
                                               found is not None, visible_devices, baseline is not None, now,
                                               (anchor.site,) if anchor else ())
    except LaunchError as exc:
        verdict, details, log_tail = {"status": Status.INFRA_ERROR, "message": str(exc)}, {}, ""
    details.update(base.pop("details", {}))
    details.update(static=[], timeout_s=timeout_s, scale=scale, timing_mode=timing if device == "cuda" else "none",
                   environment=_environment(device), grading={"mode": "single", "processes": 1},
                   dsl_policy=settings.dsl_policy)
    if verdict["status"] == Status.PASSED and verdict.get("kernel_ms") is not None:
        verdict, details = _against(verdict, details, baseline)
    record = JudgeRecord(status=verdict["status"], message=verdict.get("message", ""), draws=verdict.get("draws", []),
                         kernel_ms=verdict.get("kernel_ms"), eager_ms=verdict.get("eager_ms"),
                         speedup=verdict.get("speedup"), dsl_check=verdict.get("dsl_check", "not_checked"),
                         details=details, log_tail=log_tail, wall_s=now() - started, **base)
    return credentials.redact_record(record, runner_environment())


def _with(base: dict, **details) -> dict:
    """base's fields with details added to its own (an anchor's grading carries details.anchor from the start)."""
    return {**base, "details": {**base.get("details", {}), **details}}


def _against(verdict: dict, details: dict, baseline: Baseline | None) -> tuple[dict, dict]:
    """A passed GPU verdict's eager figure and speedup: the stored baseline's, or the one timed in this grading."""
    if baseline is None:
        return verdict, details | {"eager": {"source": "timed in this grading", "processes": 1}}
    verdict = {**verdict, "eager_ms": baseline.eager_ms, "speedup": baseline.eager_ms / verdict["kernel_ms"]}
    return verdict, details | {"eager": baseline.describe(), "eager_device_ms": baseline.eager_device_ms}


def _evaluate(problem, kernel, dsl, device, timing, scale, settings, timeout_s, sandboxed, visible_devices,
              stored_eager, now, extra_paths: tuple[str, ...]) -> tuple[dict, dict, str]:
    """One run of the judge processes, on a spare Launch when one is waiting (launch.launched)."""
    timed = device == "cuda" and timing != "none"
    plan = Plan.of(settings, device, timed, sandboxed, visible_devices, extra_paths)
    with launched(plan, keep_spare=settings.judge_spares > 0) as (launch, ahead_s):
        try:
            evaluation = Evaluation(launch, problem, kernel, dsl, timing, scale, settings.judge_pin_cpus,
                                    eager="stored" if stored_eager else "time", dsl_policy=settings.dsl_policy)
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
