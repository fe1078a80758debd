"""The agents' DSL manuals (problems/docs/<dsl>/): chapter list, example kernels, generated size tables.

Both manuals have the same chapters (CHAPTERS); their sizes are measured here and written into
docs/manuals.md and each manual's INDEX.md between markers, so the tables cannot drift (`mkb docs
tables --check`). The examples are loaded from a private copy, so running them never writes
bytecode or build output into problems/docs/ (whose hash is part of every trial's fingerprint).
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

CHAPTERS = (
    ("01", "programming_model", "Programming model"),
    ("02", "compile_launch", "Declaring, compiling, caching and launching a kernel"),
    ("03", "memory_layouts", "Memory spaces and layouts"),
    ("04", "elementwise_reduction", "Elementwise and reduction patterns"),
    ("05", "tensor_core_mma", "Tensor-core MMA: Hopper wgmma, Blackwell tcgen05"),
    ("06", "async_copy_tma", "Asynchronous copies and TMA"),
    ("07", "dtypes", "Data types: bf16, fp16, fp8, packed fp4"),
    ("08", "debugging", "Debugging: printing, generated PTX and CUDA source"),
    ("09", "errors", "Common errors and their fixes"),
)
"""(number, slug, title) of each guide chapter; the file is guide/<number>_<slug>.md in both manuals."""

DSL_NAMES = {"cutedsl": "CuTe DSL", "tirx": "TIRx"}
BEGIN, END = "<!-- generated: mkb docs tables -->", "<!-- end generated -->"


@dataclass(frozen=True)
class ChapterSize:
    number: str
    slug: str
    title: str
    lines: int
    words: int
    code_blocks: int


def manual_dir(problems_dir: Path, dsl: str) -> Path:
    return Path(problems_dir) / "docs" / dsl


def chapter_sizes(problems_dir: Path, dsl: str) -> list[ChapterSize]:
    """Lines, words and code blocks of each chapter (0 when a chapter file is missing)."""
    out = []
    for number, slug, title in CHAPTERS:
        path = manual_dir(problems_dir, dsl) / "guide" / f"{number}_{slug}.md"
        text = path.read_text(encoding="utf-8") if path.is_file() else ""
        out.append(ChapterSize(number, slug, title, text.count("\n"), len(text.split()), text.count("```") // 2))
    return out


def example_files(problems_dir: Path, dsl: str) -> list[Path]:
    """The example kernels (NN_name.py; helpers such as cute_util.py are not examples)."""
    return sorted(p for p in (manual_dir(problems_dir, dsl) / "examples").glob("[0-9][0-9]_*.py"))


def manuals_table(problems_dir: Path) -> str:
    """The side-by-side chapter table of both manuals (Markdown), with totals and example counts."""
    sizes = {dsl: chapter_sizes(problems_dir, dsl) for dsl in DSL_NAMES}
    head = " | ".join(f"{name} lines | {name} words" for name in DSL_NAMES.values())
    lines = [f"| chapter | {head} |", "|---|" + "---:|" * (2 * len(DSL_NAMES))]
    for i, (number, slug, title) in enumerate(CHAPTERS):
        cells = " | ".join(f"{sizes[d][i].lines} | {sizes[d][i].words}" for d in DSL_NAMES)
        lines.append(f"| {number} {title} (`{number}_{slug}.md`) | {cells} |")
    totals = " | ".join(f"**{sum(c.lines for c in sizes[d])}** | **{sum(c.words for c in sizes[d])}**"
                        for d in DSL_NAMES)
    lines.append(f"| **total** | {totals} |")
    examples = " | ".join(f"{len(example_files(problems_dir, d))} files | "
                          f"{sum(p.read_text().count(chr(10)) for p in example_files(problems_dir, d))} lines"
                          for d in DSL_NAMES)
    lines.append(f"| examples (`examples/NN_*.py`) | {examples} |")
    return "\n".join(lines) + "\n"


def index_table(problems_dir: Path, dsl: str) -> str:
    """The guide and example listing of one manual's INDEX.md, with sizes."""
    lines = ["| file | lines | words |", "|---|---:|---:|"]
    lines += [f"| guide/{c.number}_{c.slug}.md ({c.title}) | {c.lines} | {c.words} |"
              for c in chapter_sizes(problems_dir, dsl)]
    for path in example_files(problems_dir, dsl):
        text = path.read_text(encoding="utf-8")
        lines.append(f"| examples/{path.name} | {text.count(chr(10))} | {len(text.split())} |")
    return "\n".join(lines) + "\n"


def _replace_generated(text: str, body: str) -> str:
    if BEGIN not in text or END not in text:
        raise ValueError(f"missing the markers {BEGIN} ... {END}")
    head, rest = text.split(BEGIN, 1)
    return head + BEGIN + "\n" + body + END + rest.split(END, 1)[1]


def sync_tables(problems_dir: Path, docs_dir: Path, write: bool = True) -> list[Path]:
    """Bring the generated tables up to date; returns the files that were (or, with write=False, are) stale."""
    targets = {Path(docs_dir) / "manuals.md": manuals_table(problems_dir)}
    for dsl in DSL_NAMES:
        targets[manual_dir(problems_dir, dsl) / "INDEX.md"] = index_table(problems_dir, dsl)
    stale = []
    for path, body in targets.items():
        text = path.read_text(encoding="utf-8")
        new = _replace_generated(text, body)
        if new != text:
            stale.append(path)
            if write:
                path.write_text(new, encoding="utf-8")
    return stale


@dataclass
class ExampleResult:
    """One example: compiled for arch (and, when run, checked against torch on the GPU and timed)."""

    dsl: str
    example: str
    arch: str
    compiled: bool = False
    compile_s: float | None = None
    passed: bool | None = None
    time_us: float | None = None
    error: str | None = None


def load_example(path: Path, workdir: Path):
    """Import an example from a copy of its folder under workdir (no bytecode, no output in the repo)."""
    copy = Path(workdir) / f"{path.parent.parent.name}_examples"
    if not copy.exists():
        shutil.copytree(path.parent, copy, ignore=shutil.ignore_patterns("__pycache__", "build_*"))
    if str(copy) not in sys.path:
        sys.path.insert(0, str(copy))
    name = f"mkb_example_{path.parent.parent.name}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, copy / path.name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # class-based CuTe kernels look their source up through sys.modules
    dont_write = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = dont_write
    return module


def run_example(path: Path, workdir: Path, arch: str, run: bool, time_fn=None) -> ExampleResult:
    """Compile one example for arch; with run=True also check it on the GPU (and time it with time_fn)."""
    result = ExampleResult(path.parent.parent.name, path.stem, arch)
    try:
        module = load_example(path, workdir)
        start = time.perf_counter()
        fn = module.build(arch)
        result.compile_s = round(time.perf_counter() - start, 3)
        result.compiled = True
        if run:
            launch = module.check(fn)
            result.passed = True
            if time_fn is not None:
                result.time_us = round(time_fn(launch), 2)
    except Exception as exc:  # recorded, not raised: one broken example must not hide the others
        result.passed = False if run else None
        result.error = "".join(traceback.format_exception_only(exc)).strip()[-2000:]
    return result
