"""An attempt's fresh workspace: problem file, grading contract, DSL manual, empty kernel.py and SKILL.md."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from mkb.agent import prompts
from mkb.agent.conditions import Conditions
from mkb.records import Dsl, ProblemInfo

DELIVERABLES = ("kernel.py", "SKILL.md")
EXAMPLES = "examples"
"""The manual's folder of worked example kernels, left out when Conditions.manual_examples is false."""
NO_EXAMPLES_NOTE = ("\n\n> This workspace's manual comes without `examples/` (the run left the worked example kernels "
                    "out): references to `examples/...` in the guide point at files that are not here.\n")


def docs_dir(problems_dir: Path, dsl: Dsl) -> Path:
    """Where the DSL's documentation for agents lives: problems/docs/<dsl>/."""
    return Path(problems_dir) / "docs" / str(dsl)


def docs_files(problems_dir: Path, dsl: Dsl, examples: bool = True) -> list[Path]:
    """The manual files an attempt gets (relative to docs_dir), without scratch files and, unless examples, without
    the worked examples."""
    root = docs_dir(problems_dir, dsl)
    if not root.is_dir():
        return []
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file() and not _is_scratch(p, root)
                  and (examples or p.relative_to(root).parts[0] != EXAMPLES))


def docs_sha256(problems_dir: Path, dsl: Dsl, examples: bool = True) -> str:
    """One sha256 over the manual an attempt gets (relative paths and contents); the hash of nothing when absent."""
    digest = hashlib.sha256()
    root = docs_dir(problems_dir, dsl)
    for rel in docs_files(problems_dir, dsl, examples):
        digest.update(f"{rel.as_posix()}\0".encode())
        digest.update(hashlib.sha256((root / rel).read_bytes()).digest())
    if not examples:
        digest.update(NO_EXAMPLES_NOTE.encode())
    return digest.hexdigest()


def _is_scratch(path: Path, root: Path) -> bool:
    """Files an example run leaves in the docs folder (__pycache__, *.pyc, build_*): neither hashed nor copied."""
    return any(part.endswith(".pyc") or part == "__pycache__" or part.startswith("build_")
               for part in path.relative_to(root).parts)


def prepare_workspace(problem: ProblemInfo, dsl: Dsl, path: Path, problems_dir: Path,
                      conditions: Conditions = Conditions()) -> Path:
    """Create the workspace directory at path (which must not exist yet) and return it.

    Only public material goes in: the problem file (as problem.py), CONTRACT.md, docs/ (the manual,
    with or without its examples) — never grader code, solutions or anything of another attempt.
    """
    templates_dir = Path(problems_dir) / "templates"
    path = Path(path)
    path.mkdir(parents=True)
    shutil.copyfile(problem.path, path / "problem.py")
    (path / "CONTRACT.md").write_text(prompts.contract(problem, dsl, templates_dir, conditions.dsl_policy),
                                      encoding="utf-8")
    (path / "docs").mkdir()
    root = docs_dir(problems_dir, dsl)
    for rel in docs_files(problems_dir, dsl, conditions.manual_examples):
        (path / "docs" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, path / "docs" / rel)
    index = path / "docs" / "INDEX.md"
    if not conditions.manual_examples and index.is_file():
        index.write_text(index.read_text(encoding="utf-8") + NO_EXAMPLES_NOTE, encoding="utf-8")
    for name in DELIVERABLES:
        (path / name).write_text("", encoding="utf-8")
    return path


def has_docs(problems_dir: Path, dsl: Dsl) -> bool:
    """Whether the variant comes with documentation (problems/docs/<dsl>/ has files)."""
    root = docs_dir(problems_dir, dsl)
    return root.is_dir() and any(p.is_file() for p in root.rglob("*"))
