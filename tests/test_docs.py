"""The agents' DSL manuals: generated API reference, example kernels (compile on CPU, run on GPU), guide parity."""

from __future__ import annotations

import re
from pathlib import Path
import shutil

import pytest
from click.testing import CliRunner

from mkb import docs, manuals
from mkb.docs import generate
from mkb.cli import main
from mkb.settings import load_settings

PROBLEMS = load_settings().problems_dir
EXAMPLES = [(dsl, p) for dsl in manuals.DSL_NAMES for p in manuals.example_files(PROBLEMS, dsl)]


def _ids(items):
    return [f"{dsl}-{p.stem}" for dsl, p in items]


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """`mkb docs build --out DIR` for both DSLs, run once (each DSL in its own child process)."""
    out = tmp_path_factory.mktemp("api")
    result = CliRunner().invoke(main, ["docs", "build", "--out", str(out), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return out


def _documented(directory) -> set[str]:
    """Qualified names with an entry (### heading) or an alias line pointing at one."""
    names = set()
    for page in directory.glob("*.md"):
        text = page.read_text()
        names |= {m.group(1) for m in re.finditer(r"^### (\S+)", text, re.M)}
        names |= {m.group(1) for m in re.finditer(r"^- `(\S+)` = `", text, re.M)}
    return names


@pytest.mark.parametrize("dsl,names", [
    ("cutedsl", ["cutlass.cute.make_layout", "cutlass.cute.compile", "cutlass.cute.TiledCopy.get_slice",
                 "cutlass.cute.arch.thread_idx", "cutlass.cute.runtime.make_fake_compact_tensor",
                 "cutlass.cute.nvgpu.warpgroup.MmaF16BF16Op", "cutlass.cute.nvgpu.cpasync.make_tiled_tma_atom",
                 "cutlass.pipeline.PipelineTmaAsync", "cutlass.utils.hopper_helpers.make_trivial_tiled_mma"]),
    ("tirx", ["tvm.script.tirx.prim_func", "tvm.script.tirx.match_buffer", "tvm.script.tirx.cta_id",
              "tvm.script.tirx.cuda.cta_sum", "tvm.script.tirx.ptx.wgmma", "tvm.script.tirx.ptx.mbarrier",
              "tvm.script.tirx.tile.copy", "tvm.tirx.decl_buffer", "tvm.tirx.Buffer", "tvm.script.tirx.Var.vload",
              "tvm.tirx.tile_dispatch.copy_async", "tvm.compile"]),
])
def test_build_writes_an_entry_per_api(api, dsl, names):
    documented = _documented(api / dsl)
    assert not [n for n in names if n not in documented]
    index = (api / dsl / "INDEX.md").read_text()
    assert "| page | entries | lines | KiB |" in index and "Skipped" not in index


def test_tirx_entries_carry_the_T_alias(api):
    text = (api / "tirx" / "tvm.script.tirx.cuda.md").read_text()
    assert "### tvm.script.tirx.cuda.cta_sum  (T.cuda.cta_sum)" in text


def test_unimportable_module_is_skipped_and_listed(tmp_path, monkeypatch):
    monkeypatch.setattr(generate, "CUTEDSL_MODULES", ("cutlass.no_such_module", "cutlass.cute.nvgpu.warpgroup"))
    report = docs.build_dsl("cutedsl", tmp_path)
    assert [m for m, _ in report.skipped] == ["cutlass.no_such_module"]
    assert [p.file for p in report.pages] == ["cutlass.cute.nvgpu.warpgroup.md"]
    assert "cutlass.no_such_module" in (tmp_path / "INDEX.md").read_text()


def test_signature_drops_internal_parameters_and_module_prefixes():
    import cutlass.cute as cute

    sig = docs.signature_of(cute.make_layout, "make_layout")
    assert sig.startswith("make_layout(shape: ") and "stride" in sig
    assert "loc" not in sig and "cutlass." not in sig and "ForwardRef" not in sig
    assert docs.first_paragraph("Make a thing\n  over two lines.\n\nMore text.") == "Make a thing over two lines."


@pytest.mark.parametrize("dsl,path", EXAMPLES, ids=_ids(EXAMPLES))
def test_example_compiles_for_sm90a_on_cpu(dsl, path, tmp_path):
    module = manuals.load_example(path, tmp_path)
    if dsl == "cutedsl":
        module.build("sm_90a", keep_dir=str(tmp_path / "keep"))
        ptx = "".join(p.read_text() for p in (tmp_path / "keep").glob("*.ptx"))
        assert ".target sm_90a" in ptx
    else:
        util = __import__("tirx_util")
        source = util.cuda_source(module.build("sm_90a"))
        assert "__global__" in source
        if shutil.which("nvcc"):
            ptx = util.nvcc(source, "sm_90a", "ptx").decode()
            assert ".target sm_90a" in ptx
            assert len(util.nvcc(source, "sm_90a", "cubin")) > 0
            ptx = ptx if path.stem.startswith("04") else ""
        else:
            ptx = source if path.stem.startswith("04") else ""
    if path.stem.startswith("04"):  # the Hopper GEMM really uses TMA and wgmma
        assert "wgmma" in ptx and "cp.async.bulk.tensor" in ptx


@pytest.mark.gpu
@pytest.mark.parametrize("dsl,path", EXAMPLES, ids=_ids(EXAMPLES))
def test_example_runs_and_matches_torch(dsl, path, tmp_path, gpu_records):
    """Every manual example compiles for this GPU, matches torch on several shapes, and is timed with its
    manual's own helper (records: docs_examples.json under --gpu-records)."""
    from dataclasses import asdict

    from mkb.environment import gpus

    arch = gpus()[0]["arch"]
    if path.stem.startswith("04") and arch != "sm_90a":
        pytest.skip("the wgmma GEMM example is sm_90a only")
    manuals.load_example(path, tmp_path)  # puts the manual's helpers (cute_util, tirx_util) on the path
    helpers = __import__("cute_util" if dsl == "cutedsl" else "tirx_util")
    result = manuals.run_example(path, tmp_path, arch, run=True, time_fn=helpers.time_us)
    gpu_records("docs_examples", asdict(result))
    assert result.passed, result.error


def test_guides_have_the_same_chapters_and_matched_size():
    sizes = {dsl: manuals.chapter_sizes(PROBLEMS, dsl) for dsl in manuals.DSL_NAMES}
    for dsl, chapters in sizes.items():
        guide = manuals.manual_dir(PROBLEMS, dsl) / "guide"
        assert sorted(p.name for p in guide.glob("*.md")) == [f"{n}_{s}.md" for n, s, _ in manuals.CHAPTERS]
        for number, slug, title in manuals.CHAPTERS:
            first = (guide / f"{number}_{slug}.md").read_text().splitlines()[0]
            assert first == f"# {number}. {title}", f"{dsl} {number}: {first!r}"
    cute, tirx = sizes["cutedsl"], sizes["tirx"]
    for a, b in zip(cute, tirx):
        assert 0.6 < a.words / b.words < 1 / 0.6, f"chapter {a.number}: {a.words} vs {b.words} words"
    total = [sum(c.words for c in s) for s in (cute, tirx)]
    assert 0.85 < total[0] / total[1] < 1 / 0.85


def test_guides_reference_existing_examples_and_every_example_is_used():
    for dsl in manuals.DSL_NAMES:
        root = manuals.manual_dir(PROBLEMS, dsl)
        text = "".join(p.read_text() for p in (root / "guide").glob("*.md"))
        cited = set(re.findall(r"examples/(\w+\.py)", text))
        assert cited <= {p.name for p in (root / "examples").glob("*.py")}
        assert {p.name for p in manuals.example_files(PROBLEMS, dsl)} <= cited


def test_manuals_say_there_is_no_gpu():
    for dsl in manuals.DSL_NAMES:
        text = (manuals.manual_dir(PROBLEMS, dsl) / "INDEX.md").read_text()
        assert "no GPU" in text and "grep" in text


def test_generated_tables_are_current():
    assert manuals.sync_tables(PROBLEMS, PROBLEMS.parent / "docs", write=False) == []
    result = CliRunner().invoke(main, ["docs", "tables", "--check"], catch_exceptions=False)
    assert result.exit_code == 0, result.output


def test_the_protocol_section_of_fidelity_md_is_current():
    from mkb import paper

    root = Path(__file__).resolve().parent.parent
    points = paper.load_points(root / "problems")
    assert [p.n for p in points] == list(range(1, 13))  # one per point of issue #25
    assert all(p.original and p.ours and p.default and p.option for p in points)
    assert not paper.sync(root / "problems", root / "docs" / "fidelity.md", write=False), \
        "docs/fidelity.md's protocol section is stale: run .venv/bin/python -m mkb.paper"


def test_the_protocol_section_keeps_the_rest_of_the_page():
    from mkb import paper

    section = paper.render_section([paper.ProtocolPoint(n=1, name="a|b", original="o", ours="x", default="d",
                                                        option="none")])
    page = paper.with_section("# Title\n\nfamily tables\n", section)
    assert page.startswith("# Title\n\nfamily tables\n\n" + paper.BEGIN) and "| 1 | a\\|b | o |" in page
    assert paper.with_section(page, section) == page
    assert paper.with_section(page.replace("| o |", "| old |"), section) == page
