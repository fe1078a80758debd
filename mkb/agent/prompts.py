"""The agent's prompts: Jinja templates in problems/templates/, rendered strictly, and their hashes."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from mkb.agent.conditions import KERNEL_BYTE_LIMIT, Conditions
from mkb.records import Dsl, ProblemInfo

DSL_NAMES = {Dsl.CUTEDSL: "CuTe DSL", Dsl.TIRX: "TIRx"}
OTHER_DSL_NAMES = {Dsl.CUTEDSL: "TIRx / TVM", Dsl.TIRX: "CuTe DSL / CUTLASS"}
GRADING = {"correctness_draws": 5, "warmup_calls": 10, "timed_calls": 50, "kernel_byte_limit": KERNEL_BYTE_LIMIT}
"""The judge's procedure and the submission limit as the contract states them (DESIGN §5)."""


@dataclass(frozen=True)
class Gpu:
    """The GPU the attempt is graded on, as the instruction names it."""

    name: str = "NVIDIA H200"
    arch: str = "sm_90a"


def _environment(templates_dir: Path) -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir)), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, autoescape=False)


def render(name: str, templates_dir: Path, **values: Any) -> str:
    """Render one template; a missing variable raises jinja2.UndefinedError."""
    return _environment(templates_dir).get_template(name).render(**values).strip() + "\n"


def template_hashes(templates_dir: Path) -> dict[str, str]:
    """sha256 of every template file, by name."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(templates_dir).glob("*.j2"))}


def templates_sha256(templates_dir: Path) -> str:
    """One sha256 over all templates (names and contents): the prompt part of a trial fingerprint."""
    digest = hashlib.sha256()
    for name, sha in template_hashes(templates_dir).items():
        digest.update(f"{name}\0{sha}\n".encode())
    return digest.hexdigest()


def contract_values(problem: ProblemInfo, dsl: Dsl, dsl_policy: str = "paper") -> dict[str, Any]:
    """What the contract (and the instruction, which includes it) is rendered with; dsl_policy is the DSL-use
    policy in force (Settings.dsl_policy) and dsl_share_min the strict policy's floor for this problem."""
    return {"problem": problem, "dsl": str(dsl), "dsl_name": DSL_NAMES[dsl], "other_dsl_name": OTHER_DSL_NAMES[dsl],
            "grading": GRADING, "dsl_policy": dsl_policy,
            "dsl_share_min": problem.dsl_share_min if problem.dsl_share_min is not None else 0.9}


def instruction(problem: ProblemInfo, dsl: Dsl, *, gpu: Gpu, budget_s: float | None, n_submissions: int,
                workdir: str, has_docs: bool, templates_dir: Path, conditions: Conditions = Conditions()) -> str:
    """The instruction (system message): task, meaning of results, deliverables, boundary, contract,
    environment, budget and a suggested workflow, in the original's order."""
    budget_text = "unlimited time" if budget_s is None else f"{budget_s / 60:g} minutes"
    return render("instruction.md.j2", templates_dir, **contract_values(problem, dsl, conditions.dsl_policy),
                  gpu=gpu.name, arch=gpu.arch, budget_text=budget_text, n_submissions=n_submissions, workdir=workdir,
                  has_docs=has_docs, clock=conditions.clock, sandbox_cpus=conditions.sandbox_cpus,
                  sandbox_memory_mb=conditions.sandbox_memory_mb)


def kickoff(workdir: str, skill_text: str | None, templates_dir: Path) -> str:
    """The first user message; for a skill arm it carries the transfer header and the skill."""
    return render("kickoff.md.j2", templates_dir, workdir=workdir, skill_text=skill_text)


def opening(problem: ProblemInfo, dsl: Dsl, skill_text: str | None, *, gpu: Gpu, budget_s: float | None,
            n_submissions: int, workdir: str, has_docs: bool, templates_dir: Path,
            conditions: Conditions = Conditions()) -> list[dict[str, str]]:
    """The first two messages of an attempt, exactly as the model receives them: the instruction and the kickoff."""
    system = instruction(problem, dsl, gpu=gpu, budget_s=budget_s, n_submissions=n_submissions, workdir=workdir,
                         has_docs=has_docs, templates_dir=templates_dir, conditions=conditions)
    return [{"role": "system", "content": system},
            {"role": "user", "content": kickoff(workdir, skill_text, templates_dir)}]


def contract(problem: ProblemInfo, dsl: Dsl, templates_dir: Path, dsl_policy: str = "paper") -> str:
    """The public grading contract, written to the workspace as CONTRACT.md."""
    return render("contract.md.j2", templates_dir, **contract_values(problem, dsl, dsl_policy))
