"""An attempt's fresh workspace: problem file, grading contract, DSL docs, empty kernel.py and SKILL.md."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from mkb.agent import prompts
from mkb.records import Dsl, ProblemInfo

DELIVERABLES = ("kernel.py", "SKILL.md")


def docs_dir(problems_dir: Path, dsl: Dsl) -> Path:
    """Where the DSL's documentation for agents lives: problems/docs/<dsl>/."""
    return Path(problems_dir) / "docs" / str(dsl)


def docs_sha256(problems_dir: Path, dsl: Dsl) -> str:
    """One sha256 over the DSL docs (relative paths and contents); the hash of nothing when absent."""
    digest = hashlib.sha256()
    root = docs_dir(problems_dir, dsl)
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not _is_scratch(p, root)) if root.is_dir() else []:
        digest.update(f"{path.relative_to(root).as_posix()}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


SCRATCH = ("__pycache__", "build_*", "*.pyc")
"""Files an example run leaves in the docs folder: neither hashed nor copied into workspaces."""


def _is_scratch(path: Path, root: Path) -> bool:
    return any(part.endswith(".pyc") or part == "__pycache__" or part.startswith("build_")
               for part in path.relative_to(root).parts)


def prepare_workspace(problem: ProblemInfo, dsl: Dsl, path: Path, problems_dir: Path, dsl_policy: str = "paper") -> Path:
    """Create the workspace directory at path (which must not exist yet) and return it.

    Only public material goes in: the problem file (as problem.py), CONTRACT.md, docs/ — never
    grader code, solutions or anything of another attempt.
    """
    templates_dir = Path(problems_dir) / "templates"
    path = Path(path)
    path.mkdir(parents=True)
    shutil.copyfile(problem.path, path / "problem.py")
    (path / "CONTRACT.md").write_text(prompts.contract(problem, dsl, templates_dir, dsl_policy), encoding="utf-8")
    docs = docs_dir(problems_dir, dsl)
    if docs.is_dir():
        shutil.copytree(docs, path / "docs", ignore=shutil.ignore_patterns(*SCRATCH))
    else:
        (path / "docs").mkdir()
    for name in DELIVERABLES:
        (path / name).write_text("", encoding="utf-8")
    return path


def has_docs(problems_dir: Path, dsl: Dsl) -> bool:
    """Whether the variant comes with documentation (problems/docs/<dsl>/ has files)."""
    root = docs_dir(problems_dir, dsl)
    return root.is_dir() and any(p.is_file() for p in root.rglob("*"))
