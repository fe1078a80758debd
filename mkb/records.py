"""Typed records shared by all parts: statuses, trial states, DSLs, arms, problem info, judge records."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class Record(BaseModel):
    """Base of every record: immutable, documented fields."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True, extra="forbid")


class Dsl(StrEnum):
    """A kernel DSL a variant is posed in."""

    CUTEDSL = "cutedsl"
    """NVIDIA CuTe DSL (nvidia-cutlass-dsl, `import cutlass.cute`)."""
    TIRX = "tirx"
    """Apache TVM TIRx (`tvm.tirx`, `from tvm.script import tirx as T`)."""


DSLS: tuple[Dsl, ...] = (Dsl.CUTEDSL, Dsl.TIRX)

FAMILIES: tuple[str, ...] = (
    "attention", "kv_cache", "mlp_norm", "moe", "quantization", "linear_attention",
)
"""The six problem families, in catalog order."""

FAMILY_SIZES: dict[str, int] = {
    "attention": 18, "kv_cache": 8, "mlp_norm": 17, "moe": 8, "quantization": 10,
    "linear_attention": 13,
}
"""Number of problems per family in the full set (74 in all)."""


class Arm(StrEnum):
    """One of the four arms of the protocol."""

    SOLO_CUTEDSL = "solo_cutedsl"
    """From scratch in CuTe DSL; writes SKILL.md."""
    SOLO_TIRX = "solo_tirx"
    """From scratch in TIRx; writes SKILL.md."""
    CUTEDSL2TIRX_SKILL = "cutedsl2tirx_skill"
    """A fresh TIRx attempt given the CuTe DSL solo's skill."""
    TIRX2CUTEDSL_SKILL = "tirx2cutedsl_skill"
    """A fresh CuTe DSL attempt given the TIRx solo's skill."""

    @property
    def dsl(self) -> Dsl:
        return {
            Arm.SOLO_CUTEDSL: Dsl.CUTEDSL, Arm.SOLO_TIRX: Dsl.TIRX,
            Arm.CUTEDSL2TIRX_SKILL: Dsl.TIRX, Arm.TIRX2CUTEDSL_SKILL: Dsl.CUTEDSL,
        }[self]

    @property
    def source(self) -> Arm | None:
        """The solo arm whose skill this arm receives (None for solo arms)."""
        return {Arm.CUTEDSL2TIRX_SKILL: Arm.SOLO_CUTEDSL,
                Arm.TIRX2CUTEDSL_SKILL: Arm.SOLO_TIRX}.get(self)

    @property
    def is_skill(self) -> bool:
        return self.source is not None




class Status(StrEnum):
    """Outcome of grading one kernel (DESIGN §5)."""

    PASSED = "passed"
    """Correct on every draw and the DSL-use check did not fail; timings present."""
    INCORRECT = "incorrect"
    """Right structure, wrong values (error over the allowance, NaN/Inf, degenerate output)."""
    WRONG_STRUCTURE = "wrong_structure"
    """Container, nesting, shape, dtype or device differs from the reference's."""
    POLICY_VIOLATION = "policy_violation"
    """Breaks the kernel contract: no kernel of the declared DSL, forbidden tools, hacks."""
    IMPORT_ERROR = "import_error"
    """kernel.py failed to import or defines no solve()."""
    RUNTIME_ERROR = "runtime_error"
    """solve() raised."""
    TIMEOUT = "timeout"
    """The evaluation ran past its time limit and was killed."""
    CRASHED = "crashed"
    """The candidate process died (signal, os._exit, CUDA fault, memory limit), or a judge process failed once
    kernel.py was loaded."""
    INFRA_ERROR = "infra_error"
    """The grader failed before the kernel's code ran (no sandbox, preflight); never charged, rerun by the protocol."""


class State(StrEnum):
    """Where a trial, attempt or run stands (DESIGN §7); the judge's verdict is a separate Status."""

    RUNNING = "running"
    """Under way, or its process died before it ended (the next run reruns it)."""
    FINISHED = "finished"
    """Ended and its final kernel was graded: the trial counts, whatever the grading's status."""
    INFRA_ERROR = "infra_error"
    """The infrastructure failed (model provider, judge, worker); rerun, never charged to the model."""
    INTERRUPTED = "interrupted"
    """Cancelled (Ctrl-C, SIGTERM, a killed task) before it ended; rerun next time, never charged."""
    SKIPPED = "skipped"
    """A skill trial whose source solo left no SKILL.md: no attempt, scored as no change (DESIGN §6)."""

    @property
    def is_done(self) -> bool:
        """A result the plan keeps (finished or skipped); the other states rerun."""
        return self in (State.FINISHED, State.SKIPPED)


class Check(StrEnum):
    """Outcome of one individual check inside a grading."""

    PASSED = "passed"
    """The check ran and passed."""
    FAILED = "failed"
    """The check ran and failed."""
    NOT_CHECKED = "not_checked"
    """The check needs a GPU (or other facility) that this grading did not have."""


class Timings(Record):
    """The timings of a final grading (DESIGN §5); set when it passed on a GPU, None otherwise."""

    speedup: float | None = None
    """eager_ms / kernel_ms."""
    kernel_ms: float | None = None
    """Median of the timed solve() calls."""
    eager_ms: float | None = None
    """Median of the timed reference calls, same procedure and judge run."""


class ProblemInfo(Record):
    """What the catalog knows about one problem file without importing it."""

    number: int
    """Slot number 1..74."""
    name: str
    """Lowercase slug, e.g. fused_add_rmsnorm_h4096_llama31_8b."""
    family: str
    """One of FAMILIES."""
    path: str
    """Absolute path of the problem file."""
    description: str
    """The one-line docstring: the task shown to the agent."""
    source: str
    """The header comment: upstream model/config facts, workload, fixed vs redrawn."""
    dtype: str
    """Primary dtype label (bf16, fp32, fp8, nvfp4, uint8, ...)."""
    sol_flops: float
    """Useful floating-point operations of the full workload."""
    sol_bytes: float
    """Fewest bytes the full workload must move (inputs read once, outputs written once)."""
    exact: bool = False
    """Outputs must match exactly (integer/bool outputs)."""
    margin: float | None = None
    """Decision-margin threshold make_inputs redraws to (discrete decisions)."""
    tolerance_factor: float = 3.0
    """Multiplier on the reference-error allowance (DESIGN §5 uses 3)."""
    tolerance_reason: str | None = None
    """Why the factor differs from 3, when it does."""
    mutates: tuple[str, ...] = ()
    """Names of reference's parameters it updates in place (MUTATES): graded after the call."""
    dsl_share_min: float | None = None
    """The strict DSL policy's floor on the DSL's share of device time for this problem (DSL_SHARE); None: 0.9."""
    dsl_share_reason: str | None = None
    """Why the problem lowers that floor, when it does."""
    fingerprint: str
    """sha256 of the problem file's bytes."""

    @property
    def id(self) -> str:
        return f"p{self.number:02d}"

    @property
    def slug(self) -> str:
        return f"{self.number:02d}_{self.name}"


def trial_id(problem_id: str, replicate: int, arm: Arm) -> str:
    """The protocol's trial id, p<NN>_r<k>_<arm> (DESIGN §1), e.g. p07_r1_cutedsl2tirx_skill."""
    return f"{problem_id}_r{replicate}_{arm}"


class TrialSpec(Record):
    """One trial of the protocol: problem × replicate × arm."""

    problem: ProblemInfo
    """The problem."""
    replicate: int
    """Replicate index k >= 1."""
    arm: Arm
    """The arm."""

    @property
    def trial_id(self) -> str:
        return trial_id(self.problem.id, self.replicate, self.arm)

    @property
    def source_trial_id(self) -> str | None:
        """The solo trial whose skill this trial receives (None for solo arms)."""
        return None if self.arm.source is None else trial_id(self.problem.id, self.replicate, self.arm.source)


class TensorMismatch(Record):
    """Comparison of one output tensor against the fp64 anchor on one draw."""

    path: str
    """Where the tensor sits in the output structure, e.g. out[1]."""
    max_error: float | None = None
    """max|out - anchor| (None for exact comparisons)."""
    allowance: float | None = None
    """3 * max(max|ref - anchor|, eps(dtype) * max|anchor|) (None for exact comparisons)."""
    ok: bool
    """Whether this tensor passed."""
    note: str = ""
    """Why it failed (NaN, mismatched elements, degenerate, ...)."""


class Draw(Record):
    """One correctness draw: fresh inputs from one seed."""

    seed: int
    """CSPRNG seed of this draw (stored after grading)."""
    ok: bool
    """All outputs passed on this draw."""
    tensors: list[TensorMismatch] = []
    """Per-output comparison."""


class LaunchedKernel(Record):
    """One distinct GPU kernel seen in the profiler trace of solve()."""

    name: str
    """Kernel symbol as the profiler reports it."""
    count: int
    """Launches over the profiled calls."""
    device_ms: float
    """Total device time over the profiled calls."""
    origin: str
    """cutedsl, tirx, torch, triton, nvrtc, other: from the modules the runtimes loaded."""


class JudgeRecord(Record):
    """The result of grading one kernel file against one problem variant (DESIGN §5)."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True, extra="allow")

    status: Status
    """Outcome; see Status."""
    message: str = ""
    """Human-readable summary; for failures, the first mismatch or the error."""
    problem: str
    """Problem id, e.g. p28."""
    dsl: Dsl
    """Declared DSL of the variant."""
    device: str
    """cuda or cpu: where the candidate ran."""
    draws: list[Draw] = []
    """Correctness draws, in order."""
    kernel_ms: float | None = None
    """Median of the timed solve() calls (CUDA events around solve() and a host synchronisation, the original
    grader's window); a final grading's is the smallest of its processes' medians. None unless passed on a GPU."""
    eager_ms: float | None = None
    """Median of the timed reference calls, same procedure: the stored baseline, or timed in this grading."""
    speedup: float | None = None
    """eager_ms / kernel_ms."""
    dsl_check: Check = Check.NOT_CHECKED
    """Runtime verification that a kernel of the declared DSL ran and mattered."""
    details: dict[str, Any] = {}
    """Everything else: launched kernels, device time, flushed timings, clocks, seeds, versions."""
    log_tail: str = ""
    """Last part of what the candidate printed."""
    wall_s: float = 0.0
    """Wall-clock seconds the grading took."""

    @model_validator(mode="after")
    def _status_ties_fields(self) -> "JudgeRecord":
        timed = self.kernel_ms is not None or self.speedup is not None
        if self.status != Status.PASSED and timed:
            raise ValueError(f"a {self.status} record carries timings")
        if self.status == Status.PASSED and self.device == "cuda" and (
                self.kernel_ms is None or self.eager_ms is None or self.speedup is None):
            raise ValueError("a passed GPU record needs kernel_ms, eager_ms and speedup")
        if self.status == Status.PASSED and self.dsl_check == Check.FAILED:
            raise ValueError("a passed record cannot have a failed DSL check")
        return self

    @property
    def passed(self) -> bool:
        return self.status == Status.PASSED
