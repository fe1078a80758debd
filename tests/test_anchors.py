"""External anchors (issue #20): the agent's judge refuses kernel libraries, the trusted anchor path lets one through.

CPU: the static scan, the anchor's site checks, an anchor grading of a stand-in `quack` package in a site of its
own (it imports; an ordinary grading's cell does not even contain it), the generator's listing and the rendered
section. GPU (marked gpu, skipped without CUDA or without the installed library): the real quack-kernels anchors.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import sys
from pathlib import Path

import pytest

from mkb.errors import MkbError
from mkb.judge import grade, grade_final, sandbox, static
from mkb.judge.anchor import Anchor
from mkb.judge.view import View
from mkb.problems import catalog_for, resolve
from mkb.records import Dsl, Status

ROOT = Path(__file__).resolve().parent.parent
GENERATORS = ROOT / "artifact" / "generators"
sys.path.insert(0, str(GENERATORS))
import anchors as generator  # noqa: E402  (artifact/generators/anchors.py)
import solutions_table  # noqa: E402

needs_sandbox = pytest.mark.skipif(sandbox.find()[0] is None, reason=f"no judge sandbox here: {sandbox.find()[1]}")
STAND_IN = '''"""A stand-in for quack-kernels on the CPU: plain torch, the functional forward's signature."""
import torch


def rmsnorm_fwd(x, weight=None, bias=None, residual=None, out_dtype=None, residual_dtype=None, eps=1e-6,
                store_rstd=False, weight_offset=0.0):
    h = x.float() + (residual.float() if residual is not None else 0)
    out = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
    return out, (h.to(x.dtype) if residual is not None else x), None
'''


@pytest.fixture(scope="module")
def catalog():
    return catalog_for(ROOT / "problems")


@pytest.fixture
def stand_in(tmp_path) -> Path:
    """A site directory of its own holding a `quack` package (torch RMSNorm) and its metadata."""
    site = tmp_path / "anchors" / "quack-kernels-0.0.test" / "site-packages"
    (site / "quack").mkdir(parents=True)
    (site / "quack" / "__init__.py").write_text('__version__ = "0.0.test"\n')
    (site / "quack" / "cache.py").write_text("CACHE_ENABLED = True\n")
    (site / "quack" / "rmsnorm.py").write_text(STAND_IN)
    (site / "quack_kernels-0.0.test.dist-info").mkdir()
    (site / "quack_kernels-0.0.test.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.4\nName: quack-kernels\nVersion: 0.0.test\n")
    return site


@pytest.mark.parametrize("source", ["import quack\n", "from quack.rmsnorm import rmsnorm_fwd\n",
                                    "import flash_attn.cute as fa\n", "from flashinfer import norm\n"])
def test_the_agents_static_scan_refuses_kernel_libraries(source):
    findings = static.scan(source, Dsl.CUTEDSL)
    assert findings and {f.rule for f in findings} == {"kernel_library"}


def test_an_anchor_waives_its_own_modules_and_nothing_else():
    source = "import quack\nimport flashinfer\nimport subprocess\nimport tvm\n"
    rules = {(f.rule, f.detail.split()[1].rstrip(":")) for f in static.scan(source, Dsl.CUTEDSL, allow=("quack",))}
    assert rules == {("kernel_library", "flashinfer"), ("forbidden_import", "subprocess"), ("other_dsl", "tvm")}


@pytest.mark.parametrize("wrapper", sorted((ROOT / "artifact" / "anchors").glob("p*.py")), ids=lambda p: p.stem)
def test_every_wrapper_is_refused_by_the_agents_judge(wrapper, catalog):
    record = grade(resolve(wrapper.stem.split("_")[0], catalog), wrapper, "cutedsl", device="cpu", scale="smoke")
    assert record.status == Status.POLICY_VIOLATION and "anchor" not in record.details
    assert {f["rule"] for f in record.details["static"]} == {"kernel_library"}


@pytest.mark.parametrize("wrapper", sorted((ROOT / "artifact" / "anchors").glob("p*.py")), ids=lambda p: p.stem)
def test_every_wrapper_is_clean_for_its_anchor_and_calls_only_public_api(wrapper):
    source = wrapper.read_text()
    assert static.scan(source, Dsl.CUTEDSL, allow=("quack",)) == []
    imported = [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in imported for a in n.names] + [n.module or "" for n in imported if isinstance(n, ast.ImportFrom)]
    assert not [n for n in names if any(part.startswith("_") for part in n.split("."))]


def test_the_anchor_path_is_reachable_only_from_the_generator():
    """grade(anchor=...) is passed by artifact/generators/anchors.py only: not by the agent's submit tool, `mkb
    verify`, the protocol or final gradings (which take no anchor at all)."""
    assert "anchor" not in inspect.signature(grade_final).parameters
    callers = [f"{p.relative_to(ROOT)}:{node.lineno}" for p in sorted((ROOT / "mkb").rglob("*.py"))
               for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.Call)
               and any(k.arg == "anchor" for k in node.keywords)]
    assert callers == []
    generators = [p.name for p in GENERATORS.glob("*.py") if re.search(r"\banchor=anchor\b", p.read_text())]
    assert generators == ["anchors.py"]


def test_an_anchor_site_must_be_apart_from_every_cells_libraries(stand_in, tmp_path):
    with pytest.raises(MkbError, match="site-packages"):
        Anchor.installed("quack-kernels", ("quack",), stand_in.parent)
    with pytest.raises(MkbError, match="every grading's cell shows"):
        Anchor.installed("torch", ("torch",), Path(inspect.getfile(pytest)).parents[1])
    with pytest.raises(MkbError, match="not installed"):
        Anchor.installed("flashinfer-python", ("flashinfer",), stand_in)
    anchor = Anchor.installed("quack-kernels", ("quack",), stand_in)
    assert (anchor.version, anchor.describe()["distributions"]) == ("0.0.test", {"quack-kernels": "0.0.test"})


def test_only_the_anchors_cell_shows_its_site(stand_in):
    args = dict(harness_dir=None, stage=None, stage_root="/kernel", gpu=False, visible_devices=None, tmp_bytes=1 << 20,
                private=())
    plain, shown = View.for_harness(**args), View.for_harness(**args, extra=(str(stand_in),))
    assert str(stand_in) not in plain.readonly and str(stand_in) not in plain.pythonpath
    assert str(stand_in) in shown.readonly and shown.pythonpath[0] == str(stand_in)


@needs_sandbox
def test_an_anchor_grading_imports_its_library_and_says_so(stand_in, catalog):
    """p36's wrapper over the stand-in: imported in the cell, run and checked against the fp64 anchor (a CPU grading
    does not require a DSL kernel: the GPU's DSL check is what would find a stand-in out)."""
    anchor = Anchor.installed("quack-kernels", ("quack",), stand_in)
    record = grade(resolve("p36", catalog), ROOT / "artifact/anchors/p36_quack.py", "cutedsl", device="cpu",
                   scale="smoke", anchor=anchor)
    assert record.status == Status.PASSED, record.message
    assert record.details["anchor"]["package"] == "quack-kernels" and record.details["anchor"]["version"] == "0.0.test"
    assert record.details["anchor"]["waived"] and record.details["static"] == []


@needs_sandbox
def test_an_ordinary_grading_does_not_even_contain_the_library(stand_in, tmp_path, catalog):
    """A kernel that imports quack past the static scan: in an ordinary grading the module is not there."""
    kernel = tmp_path / "kernel.py"
    kernel.write_text('"""Imports a kernel library past the static scan."""\nimport builtins\n\n'
                      'quack = getattr(builtins, "__imp" + "ort__")("qu" + "ack")\n\n\ndef solve(x, weight):\n'
                      '    return x\n')
    record = grade(resolve("p36", catalog), kernel, "cutedsl", device="cpu", scale="smoke")
    assert record.status == Status.IMPORT_ERROR and "quack" in record.message


def test_the_generator_lists_every_wrapper_once():
    listed = [(pid, key) for pid, key, _ in generator.anchors(None)]
    assert listed == [("p28", "quack"), ("p36", "quack")]
    assert generator.site(generator.LIBRARIES["quack"], Path("/x")) == Path("/x/quack-kernels-0.6.5/site-packages")


def test_the_section_says_not_measured_yet_without_records(tmp_path):
    text = "\n".join(solutions_table.external_anchors({}, tmp_path))
    assert "## External anchors" in text and "Not measured yet" in text and "p28 (quack-kernels 0.6.5)" in text


def test_the_section_renders_an_anchor_beside_ours(tmp_path):
    row = dict(problem="p36", dsl="cutedsl", device="NVIDIA H200", graded_at="2026-12-07T14:00:00+00:00",
               status="passed", dsl_check="passed", message="")
    rows = [{**row, "role": "anchor", "library": "quack-kernels", "version": "0.6.5", "kernel_ms": 0.0655,
             "sol_fraction": 0.94},
            {**row, "role": "ours", "library": None, "kernel_ms": 0.0910, "sol_fraction": 0.68}]
    (tmp_path / "anchors_h200.json").write_text(json.dumps(rows))
    shipped = {"h200": [{**row, "dsl": "tirx", "kernel_ms": 0.0833, "sol_fraction": 0.74}]}
    table = [line for line in solutions_table.external_anchors(shipped, tmp_path) if line.startswith("| p36")]
    assert table == ["| p36 | quack-kernels 0.6.5 | passed | 0.0655 | 0.94 | passed | 0.0910 | 0.68 | "
                     "0.0833 † | 0.74 | 0.79 |"]


@pytest.mark.gpu
@needs_sandbox
@pytest.mark.parametrize("pid", ["p36", "p28"])
def test_the_quack_anchor_passes_on_the_gpu(pid, catalog, gpu_records):
    library = generator.LIBRARIES["quack"]
    site = generator.site(library)
    if not site.is_dir():
        pytest.skip(f"quack-kernels is not installed in {site}: bash scripts/install_anchors.sh")
    anchor = Anchor.installed(library.package, library.modules, site)
    record = grade(resolve(pid, catalog), ROOT / f"artifact/anchors/{pid}_quack.py", "cutedsl", device="cuda",
                   anchor=anchor)
    gpu_records("anchor_records", {"problem": pid, **record.model_dump(mode="json")})
    assert record.status == Status.PASSED, record.message
    assert record.details["anchor"]["version"] == library.version


def _quack_order(h: "torch.Tensor", weight, eps: float, lanes: int, rsqrt_error: float):
    """quack's RMSNorm forward as it orders its arithmetic (read from the library, not copied): fp32 x (+ residual),
    each of `lanes` threads sums its strided squares, a butterfly tree joins them, rsqrt.approx (relative error up
    to rsqrt_error, drawn per row), the weight product in fp32, one rounding to bf16."""
    import torch

    n = h.shape[-1]
    part = (h * h).reshape(h.shape[0], n // lanes, lanes).sum(1)
    while part.shape[1] > 1:
        part = part[:, : part.shape[1] // 2] + part[:, part.shape[1] // 2:]
    ms = part[:, 0] / n + eps
    r = torch.rsqrt(ms) * (1 + rsqrt_error * (2 * torch.rand_like(ms) - 1))
    return (h * r[:, None] * weight.float()).to(torch.bfloat16)


@pytest.mark.parametrize("pid, rows, lanes", [("p28", 256, 256), ("p36", 4096, 16)])
def test_quacks_arithmetic_order_is_within_the_tolerance(pid, rows, lanes, catalog):
    """CPU replay of the anchor's arithmetic against the judge's rule (full-width rows, fewer of them): about 0.12 of
    the allowance, the reference's own bf16 rounding, with rsqrt.approx off by up to 2^-20 (4x its documented bound)."""
    import importlib.util

    import torch

    from mkb.tensortree import compare, to_anchor

    info = resolve(pid, catalog)
    spec = importlib.util.spec_from_file_location(f"mkb_{pid}", info.path)
    problem = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(problem)
    torch.manual_seed(0)
    hidden, eps = (4096, 1e-5) if pid == "p28" else (128, 1e-6)
    inputs = [torch.randn(rows, hidden, dtype=torch.bfloat16) for _ in range(2 if pid == "p28" else 1)]
    inputs.append((1 + 0.1 * torch.randn(hidden)).to(torch.bfloat16))
    h = inputs[0].float() + (inputs[1].float() if pid == "p28" else 0)
    result = compare("out", _quack_order(h, inputs[-1], eps, lanes, 2.0 ** -20), problem.reference(*inputs),
                     problem.reference(*to_anchor(inputs)))
    assert result.ok and result.max_error / result.allowance < 0.2, result
