"""The judge against real subprocesses: every hostile or broken kernel in tests/kernels gets its status.

Each fixture's docstring names the hack and the expected verdict (Problem/DSL/Device/Expected
lines). CPU fixtures run here at scale="smoke"; GPU fixtures are marked gpu and skip without CUDA
(tests/test_judge_gpu.py grades more of them on the GPU).
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from mkb.judge import grade, sandbox, static
from mkb.judge.referee.policy import origin
from mkb.problems import catalog_for, resolve
from mkb.records import Check, Dsl, Status

ROOT = Path(__file__).resolve().parent.parent
KERNELS = Path(__file__).resolve().parent / "kernels"


def fixture_facts(path: Path) -> dict:
    """Problem, DSL, Device, Expected (and optional Timeout) from a fixture's docstring."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    facts = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in doc.splitlines()[1:]) if v}
    return {"problem": facts["problem"], "dsl": facts["dsl"], "device": facts["device"],
            "expected": Status(facts["expected"]), "timeout": float(facts.get("timeout", 120)),
            "memory_mb": int(facts["memory"]) if "memory" in facts else None,
            "also": {Status(x.strip()) for x in facts.get("also", "").split(",") if x.strip()},
            "hack": doc.splitlines()[0]}


FIXTURES = sorted(p for p in KERNELS.glob("*.py") if not p.name.startswith("attack_"))
"""The attack fixtures need the sandbox's small test limits: tests/test_judge_sandbox.py grades them."""
needs_sandbox = pytest.mark.skipif(sandbox.find()[0] is None, reason=f"no judge sandbox here: {sandbox.find()[1]} "
                                   "(every grading would be an infra_error)")


def _param(path: Path):
    marks = [pytest.mark.gpu] if fixture_facts(path)["device"] == "gpu" else []
    marks.append(needs_sandbox)
    return pytest.param(path, id=path.stem, marks=marks)


@pytest.fixture(scope="module")
def catalog():
    return catalog_for(ROOT / "problems")


@pytest.fixture(scope="module")
def graded(catalog):
    """Grade a fixture once per test module (each grading starts real processes: seconds, not ms)."""
    cache = {}

    def get(name: str):
        if name not in cache:
            path = KERNELS / f"{name}.py"
            facts = fixture_facts(path)
            device = "cuda" if facts["device"] == "gpu" else "cpu"
            cache[name] = grade(resolve(facts["problem"], catalog), path, facts["dsl"], device=device,
                                scale="smoke", timeout_s=facts["timeout"])
        return cache[name]

    return get


@pytest.mark.parametrize("path", [_param(p) for p in FIXTURES])
def test_fixture_gets_expected_status(path, graded):
    facts = fixture_facts(path)
    record = graded(path.stem)
    assert record.status == facts["expected"] or record.status in facts["also"], \
        f"{facts['hack']}\n{record.message}\n{record.log_tail[-2000:]}"
    if record.status == Status.PASSED:
        assert all(d.ok for d in record.draws) and len(record.draws) == 5
        assert record.dsl_check != Check.FAILED
        assert record.details["candidate_stop"]["left"] == 0  # no process of the candidate outlived its checks
    if record.device == "cpu":
        assert record.kernel_ms is None and record.speedup is None
        assert record.dsl_check != Check.PASSED or facts["dsl"] == Dsl.TIRX, "GPU-only checks never pass on CPU"
    else:
        assert "RLIMIT_AS" not in record.details["isolation"]["memory"]  # CUDA reserves more than it uses


def test_every_fixture_documents_its_hack():
    assert len([p for p in FIXTURES if fixture_facts(p)["expected"] != Status.PASSED]) >= 12
    for path in sorted(KERNELS.glob("*.py")):
        assert fixture_facts(path)["hack"], path


@needs_sandbox
def test_tirx_cpu_kernel_passes_the_real_dsl_check(graded):
    record = graded("valid_tirx_p28")
    assert record.status == Status.PASSED and record.dsl_check == Check.PASSED
    assert record.details["dsl_checks"] == {"calls": "passed", "knockout": "passed", "trace": "not_checked",
                                            "share": "not_checked"}
    assert len(set(record.details["seeds"])) == 5
    knocked = record.details["knockout"]
    assert knocked["nan"]["evidence"] and knocked["noise"]["evidence"] and knocked["repeat"]["correct"]
    assert sorted(knocked["order"]) == ["draw 1", "draw 2", "draw 3", "draw 4", "knockout nan", "knockout noise",
                                        "repeat 0"]
    assert record.details["dsl_share"] > 0.9 and record.details["dsl_policy"] == "paper"
    assert record.details["candidate"]["baseline"] and not record.details["candidate"]["patched"]
    assert set(record.details["correctness_s"]) == {"inputs", "reference", "pristine copy", "solve", "read outputs",
                                                    "compare", "digests", "input guard"}
    assert record.details["candidate_startup_s"]["import_torch"] > 0
    assert len(record.details["solve_step_s"]) == 5


@needs_sandbox
@pytest.mark.parametrize("fixture, strict_status", [("valid_tirx_p28", Status.PASSED),
                                                     ("valid_tirx_p32", Status.POLICY_VIOLATION),
                                                     ("knockout_exact_gate", Status.POLICY_VIOLATION)])
def test_strict_policy_requires_the_dsl_share(fixture, strict_status, catalog, graded):
    """A full TIRx kernel passes both policies; a torch-heavy GEMM with a TIRx epilogue passes paper, with its
    small share recorded, and fails strict with a message naming both shares. So does eager torch gated on a
    TIRx copy being exact: what no knock-out can tell from a kernel that uses its DSL's output."""
    from mkb.settings import load_settings

    paper = graded(fixture)
    facts = fixture_facts(KERNELS / f"{fixture}.py")
    strict = grade(resolve(facts["problem"], catalog), KERNELS / f"{fixture}.py", facts["dsl"], device="cpu",
                   scale="smoke", settings=load_settings(dsl_policy="strict"))
    assert paper.status == Status.PASSED and strict.status == strict_status, strict.message
    assert strict.details["dsl_policy"] == "strict" and paper.details["dsl_share"] is not None
    if strict_status == Status.POLICY_VIOLATION:
        assert paper.details["dsl_share"] < 0.9 and "below the strict policy's 90%" in strict.message
        assert f"{strict.details['dsl_share']:.1%}" in strict.message


@needs_sandbox
@pytest.mark.xfail(strict=True, reason="known limit (docs/judge.md, red team 2026-12-08): the share is time, and a "
                   "decorative TIRx kernel that burns time lifts it; the knock-out cannot tell an exact gate from use")
def test_burnt_dsl_time_does_not_buy_the_strict_share(catalog):
    from mkb.settings import load_settings

    facts = fixture_facts(KERNELS / "rt8dsl_share_burn_tirx_p28.py")
    strict = grade(resolve(facts["problem"], catalog), KERNELS / "rt8dsl_share_burn_tirx_p28.py", facts["dsl"],
                   device="cpu", scale="smoke", settings=load_settings(dsl_policy="strict"))
    assert strict.status == Status.POLICY_VIOLATION, strict.details.get("dsl_share")


@needs_sandbox
def test_a_thread_of_the_kernels_leaves_no_cpu_share_to_read(catalog, graded):
    """torch's work on a thread kernel.py started is invisible to the CPU profiler (it records its own thread's
    operators): such a profiled call has no CPU share, so the strict policy, which needs one, refuses it."""
    from mkb.settings import load_settings

    paper = graded("share_thread_torch")
    strict = grade(resolve("p28", catalog), KERNELS / "share_thread_torch.py", "tirx", device="cpu", scale="smoke",
                   settings=load_settings(dsl_policy="strict"))
    assert paper.status == Status.PASSED and paper.details["dsl_share"] is None  # paper records, does not enforce
    assert strict.status == Status.POLICY_VIOLATION and "thread kernel.py started" in strict.message, strict.message
    honest = grade(resolve("p28", catalog), KERNELS / "valid_tirx_p28.py", "tirx", device="cpu", scale="smoke",
                   settings=load_settings(dsl_policy="strict"))
    assert honest.status == Status.PASSED and honest.details["dsl_share"] is not None  # no thread: a share


@needs_sandbox
def test_profiled_calls_are_judged_like_every_call(catalog, graded):
    """A kernel that tells a profiled call (torch's profiler flag) and runs only its decorative DSL copy there made
    the strict policy's share read 1.0: every profiled call's answer is now compared with the reference."""
    from mkb.settings import load_settings

    fixture = "share_profiled_skip"
    strict = grade(resolve("p28", catalog), KERNELS / f"{fixture}.py", "tirx", device="cpu", scale="smoke",
                   settings=load_settings(dsl_policy="strict"))
    for record in (graded(fixture), strict):
        assert record.status == Status.INCORRECT, record.message
        assert record.message.startswith("profiled call 1: ") and record.dsl_check != Check.PASSED, record.message
    honest = graded("valid_tirx_p28").details["dsl_share_detail"]
    assert honest["calls"] == 3 and honest["share"] > 0.9


def test_profiles_of_one_call_each_merge_into_one():
    from mkb.judge.referee import profiled

    one = {"ok": True, "calls": [{"device_us": 2.0}], "escaped": ["k"],
           "instances": [{"name": "a", "call": 0, "dur": 1.0}],
           "kernels": [{"name": "a", "count": 1, "device_us": 1.0, "streams": [7]}]}
    merged = profiled.merge([one, one, {**one, "escaped": []}])
    assert len(merged["calls"]) == 3 and [i["call"] for i in merged["instances"]] == [0, 1, 2]
    assert merged["kernels"] == [{"name": "a", "count": 3, "device_us": 3.0, "streams": [7]}]
    assert merged["escaped"] == ["k"] and "cpu" not in merged
    assert profiled.merge([one, {"ok": False, "error": "x"}]) == {"ok": False, "error": "x"}
    assert profiled.merge([{"ok": True, "cpu": True, "calls": [{"dsl_us": 1.0}]}] * 2)["cpu"] is True


@needs_sandbox
def test_cutedsl_compiles_in_the_sealed_process_and_its_kernel_is_recorded(graded):
    built = graded("cutedsl_compiles_sealed").details["candidate"]["built"]["cutedsl"]
    assert any(name.startswith("kernel_cutlass_scale_kernel") for name in built)


@needs_sandbox
def test_huge_output_is_capped_and_forged_verdict_ignored(graded):
    record = graded("huge_output")
    assert record.status == Status.PASSED and record.message == "passed"
    assert len(record.log_tail) <= 10_000 and "discarded" in record.log_tail
    assert record.wall_s < 120


@needs_sandbox
def test_a_death_inside_a_knocked_out_draw_is_evidence_and_a_fresh_process_goes_on(graded):
    record = graded("knockout_death_tirx_p28")
    assert record.status == Status.PASSED, record.message
    knocked = record.details["knockout"]
    assert knocked["nan"]["replaced"] == "died" and knocked["nan"]["evidence"] and knocked["nan"]["relief"] == 1
    assert "SIGABRT" in knocked["nan"]["how"] and knocked["noise"]["evidence"] and knocked["repeat"]["correct"]
    relieved, = record.details["relieved"]
    assert relieved["relieved"] and relieved["left"] == 0 and "SIGABRT" in relieved["exit"]
    assert record.details["candidate"]["baseline"] and not record.details["candidate"]["patched"]


@needs_sandbox
def test_a_knocked_out_draw_that_raised_hands_the_rest_to_a_fresh_process(graded):
    """A sticky error (a CUDA context after an illegal address) fails every later call of its process."""
    record = graded("knockout_sticky_tirx_p28")
    assert record.status == Status.PASSED, record.message
    nan = record.details["knockout"]["nan"]
    assert nan["evidence"] and nan["relief"] == 1 and nan["replaced"] == "raised" and "illegal memory access" in nan["how"]
    relieved, = record.details["relieved"]
    assert relieved["relieved"] and "SIGKILL" in relieved["exit"]


@needs_sandbox
def test_a_knocked_out_draw_that_hangs_hands_the_rest_to_a_fresh_process(graded):
    """A poisoned ready flag leaves the consumer waiting forever, in both knock-outs."""
    record = graded("knockout_hang_tirx_p28")
    assert record.status == Status.PASSED, record.message
    for poison in ("nan", "noise"):
        knocked = record.details["knockout"][poison]
        assert knocked["evidence"] and knocked["replaced"] == "hung" and "did not answer within" in knocked["how"]
    assert sorted(r["relief"] for r in (record.details["knockout"]["nan"], record.details["knockout"]["noise"])) \
        == [1, 2]
    assert [r["exit"] for r in record.details["relieved"]] == ["was killed by SIGKILL"] * 2


@needs_sandbox
def test_dying_on_purpose_buys_nothing(graded):
    record = graded("knockout_death_on_purpose")
    assert record.status == Status.CRASHED and "SIGABRT" in record.message


def test_one_relief_per_poison():
    from mkb.judge.launch import RELIEFS
    from mkb.judge.referee.knockout import POISONS
    assert RELIEFS == len(POISONS)


@needs_sandbox
def test_a_crash_does_not_poison_the_next_evaluation(graded):
    assert graded("crash_segfault").status == Status.CRASHED
    assert "SIGSEGV" in graded("crash_segfault").message
    assert graded("valid_torch_p28").status == Status.PASSED


@needs_sandbox
def test_isolation_is_reported(graded):
    isolation = graded("no_solve").details["isolation"]
    assert isolation["network"].startswith("none (own network namespace)")
    assert "RLIMIT_AS" in isolation["memory"] and "watchdog" in isolation["memory"]
    assert "own session" in isolation["session"] and "PID" in isolation["namespaces"]


@pytest.mark.parametrize("source, dsl, rule", [
    ("import tvm\n", "cutedsl", "other_dsl"),
    ("import cutlass.cute as cute\n", "tirx", "other_dsl"),
    ("import torch\nf = torch.compile(lambda x: x)\n", "tirx", "forbidden_call"),
    ("import torch\ng = torch.cuda.CUDAGraph()\n", "cutedsl", "forbidden_call"),
    ("import ctypes\n", "cutedsl", "forbidden_import"),
    ("import subprocess\n", "tirx", "forbidden_import"),
    ("import os\nos.system('ls')\n", "tirx", "forbidden_call"),
    ("from torch.utils.cpp_extension import load_inline\n", "cutedsl", "forbidden_import"),
    ("SRC = '__global__ void k() {}'\n", "cutedsl", "inline_source"),
    ("import torch\ntorch.cuda.synchronize = lambda: None\n", "cutedsl", "patching"),
    ("from problems.mlp_norm import x\n", "cutedsl", "forbidden_import"),
    ("def solve(*a):\n    return reference(*a)\n", "tirx", "forbidden_call"),
    ("import runpy\n", "tirx", "forbidden_import"),
    ("import _socket\n", "cutedsl", "forbidden_import"),
    ("from posix import fork\n", "cutedsl", "forbidden_import"),
])
def test_static_scan_flags(source, dsl, rule):
    assert rule in {f.rule for f in static.scan(source, Dsl(dsl))}


def test_static_scan_accepts_a_plain_dsl_kernel():
    assert static.scan((KERNELS / "valid_tirx_p28.py").read_text(), Dsl.TIRX) == []
    assert static.scan("import torch\nimport cutlass.cute as cute\nimport cuda.bindings.driver as cuda\n"
                       "torch.backends.cuda.matmul.allow_tf32 = False\n", Dsl.CUTEDSL) == []


def test_kernels_are_attributed_by_built_symbols_not_names():
    built = {"tirx": ["rms_kernel"], "cutedsl": ["kernel_cutlass_add_0"]}
    assert origin("rms_kernel", built) == "tirx"
    assert origin("kernel_cutlass_add_0", built) == "cutedsl"
    assert origin("rms_kernel", {}) == "other"
    assert origin("void at::native::vectorized_elementwise_kernel<4>(...)", built) == "torch"
    assert origin("triton_poi_fused_0", built) == "triton"


@needs_sandbox
def test_verify_cli_json_and_exit_codes(tmp_path):
    from mkb.cli import main

    db = tmp_path / "v.duckdb"
    ok = CliRunner().invoke(main, ["verify", "p28", "--dsl", "cutedsl", str(KERNELS / "valid_torch_p28.py"),
                                   "--device", "cpu", "--scale", "smoke", "--json", "--db", str(db)])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["status"] == "passed"
    bad = CliRunner().invoke(main, ["verify", "p28", "--dsl", "cutedsl", str(KERNELS / "timer_patch.py"),
                                    "--device", "cpu", "--scale", "smoke", "--json"])
    assert bad.exit_code == 1 and json.loads(bad.stdout)["status"] == "policy_violation"
    from mkb.store import Store

    with Store(db) as store:
        assert [r["status"] for r in store.rows("SELECT status FROM evaluations")] == ["passed"]


def test_verify_cli_user_errors_are_one_line(tmp_path):
    from mkb.cli import main

    missing = CliRunner().invoke(main, ["verify", "p28", "--dsl", "tirx", str(tmp_path / "nope.py"), "--device", "cpu"])
    assert missing.exit_code != 0 and "Error:" in missing.stderr
    unknown = CliRunner().invoke(main, ["verify", "p99", "--dsl", "tirx", str(KERNELS / "no_solve.py")])
    assert unknown.exit_code == 1 and "not found" in unknown.stderr


def test_bench_judge_needs_a_gpu():
    import torch

    from mkb.cli import main

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    result = CliRunner().invoke(main, ["bench", "judge"])
    assert result.exit_code == 1
    assert "GPU" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_trace_summary_flags_unjoined_side_stream_work():
    from mkb.judge.candidate import trace

    def span(name, ts, dur):
        return {"cat": "user_annotation", "name": name, "ts": ts, "dur": dur}

    def launch(corr, ts):
        return {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 1, "args": {"correlation": corr}}

    def kernel(name, corr, stream, ts, dur):
        return {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr, "stream": stream}}

    events = [span("mkb_solve", 0, 10), launch(1, 1), launch(2, 2), span("mkb_marker", 11, 2), launch(3, 11.5),
              kernel("main_kernel", 1, 7, 3, 5), kernel("side_gemm", 2, 9, 4, 100), kernel("fill", 3, 7, 12, 1)]
    summary = trace.summarize(events)
    assert summary["escaped"] == ["side_gemm"]
    assert {k["name"] for k in summary["kernels"]} == {"main_kernel", "side_gemm"}
    assert summary["calls"][0]["kernels"] == 2
    joined = [e for e in events if e.get("name") != "side_gemm"]
    assert trace.summarize(joined)["escaped"] == []


def test_trace_summary_assigns_uncorrelated_driver_launches_to_their_call():
    from mkb.judge.candidate import trace

    events = [{"cat": "user_annotation", "name": "mkb_solve", "ts": 0, "dur": 5},
              {"cat": "user_annotation", "name": "mkb_marker", "ts": 6, "dur": 1},
              {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 6.5, "dur": 1, "args": {"correlation": 9}},
              {"cat": "kernel", "name": "kernel_cutlass_x_0", "ts": 8, "dur": 20, "args": {"stream": 7}},
              {"cat": "kernel", "name": "fill", "ts": 29, "dur": 1, "args": {"correlation": 9, "stream": 7}}]
    summary = trace.summarize(events)
    assert [k["name"] for k in summary["kernels"]] == ["kernel_cutlass_x_0"] and summary["escaped"] == []


def test_busy_time_counts_concurrent_kernels_once():
    from mkb.judge.candidate.trace import busy_us

    assert busy_us([]) == 0
    assert busy_us([(0, 10), (2, 6), (12, 15)]) == 13
    assert busy_us([(5, 9), (0, 6)]) == 9


def _timing(self_ms, trusted_ms, busy_ms=None, device_ms=None):
    kernel = {"ms": trusted_ms, "sync_ms": self_ms}
    calls = ([{"device_us": (device_ms or busy_ms) * 1e3, "busy_us": busy_ms * 1e3, "span_us": busy_ms * 1e3}]
             if busy_ms else [])
    return kernel, {"ok": bool(calls), "calls": calls}


@pytest.mark.parametrize("self_ms, trusted_ms, busy_ms, device_ms", [
    (0.1177, 0.2080, 0.1161, None),  # p28 CuTe DSL solution on the H200
    (0.4280, 0.4212, 0.5254, None),  # p01 CuTe DSL: profiled calls slower than timed ones
    (21.548, 21.819, 16.540, None),  # p44 CuTe DSL
    (0.1085, 0.2570, None, None),    # p19 TIRx: the 0.15 ms context-switch gap that a 0.1 ms floor failed
    (0.1332, 0.3275, None, None),    # p49 CuTe DSL, gap 0.19 ms
    (1.0, 1.05, 0.95, 1.9),          # two joined 0.95 ms kernels on two streams: busy time counts, not the sum
    (0.1620, 0.1800, 0.0670, None),  # p25 CuTe DSL in the original window: the host sync adds ~0.05-0.1 ms
])
def test_honest_timings_measured_on_the_h200_pass(self_ms, trusted_ms, busy_ms, device_ms):
    from mkb.judge.referee.speed import timing_violation

    assert timing_violation(*_timing(self_ms, trusted_ms, busy_ms, device_ms=device_ms)) is None


@pytest.mark.parametrize("self_ms, trusted_ms, busy_ms, words", [
    (0.02, 2.2, None, "trusted clock"),        # timers patched to report almost nothing
    (None, 2.2, None, "trusted clock"),        # no in-process figure at all
    (0.05, 0.30, 0.28, "kept the GPU busy"),   # 0.25 ms hidden on a side stream: inside the band, seen here
    (0.2, 0.2, 0.1, "span"),                   # kernels spread far beyond the timed window
])
def test_hidden_work_and_patched_timers_are_violations(self_ms, trusted_ms, busy_ms, words):
    from mkb.judge.referee.speed import timing_violation

    kernel, profile = _timing(self_ms, trusted_ms, busy_ms)
    if words == "span":
        profile["calls"][0]["span_us"] = 5000.0
    message = timing_violation(kernel, profile)
    assert message is not None and words in message


def test_small_references_are_compared_on_the_gpu_large_ones_on_the_host():
    from mkb.judge.referee.transport import keep_on_device

    h200 = 150_000_000_000  # bytes of device memory torch reports on an H200
    p28 = 14509 * 4096 * (2 + 8)  # the bf16 output and its fp64 anchor
    assert keep_on_device(p28, h200)
    assert not keep_on_device(56_000_000_000, h200)  # p06's fp64 anchor


def _supervised(states: dict[str, tuple[str, bool]]):
    """An Evaluation's supervision over real processes: name -> (python code to run, wrote its ready byte)."""
    import os
    import subprocess
    import sys
    from types import SimpleNamespace

    from mkb.judge.evaluation import Evaluation

    evaluation = Evaluation.__new__(Evaluation)
    evaluation.children, evaluation.closed = {}, set()
    evaluation.launch = SimpleNamespace(ready={}, signals={})
    for name, (code, ready) in states.items():
        popen = subprocess.Popen([sys.executable, "-c", code])
        evaluation.children[name] = SimpleNamespace(popen=popen)
        evaluation.launch.ready[name], write_end = os.pipe()
        evaluation.launch.signals[name] = b""
        if ready:
            os.write(write_end, b"ready")
    for name, (code, _) in states.items():
        if code == "pass":  # those that finish have finished before supervision looks
            evaluation.children[name].popen.wait(timeout=30)
    return evaluation


def test_a_verdict_before_the_eager_harness_is_ready_is_no_startup_failure():
    """Seen on the H200: an import error's verdict came while the eager harness (needed only for timing)
    was still starting, and the judge called it a start-up failure (infra_error) and blamed the sandbox."""
    import time

    sleeper = "import time; time.sleep(20)"
    fast = _supervised({"referee": ("pass", True), "candidate": ("pass", True), "eager": (sleeper, False)})
    started = time.monotonic()
    assert fast._wait_ready(time.monotonic) is None and time.monotonic() - started < 5
    died = _supervised({"referee": (sleeper, True), "candidate": ("pass", True),
                        "eager": ("raise SystemExit(1)", False)})
    assert died._wait_ready(time.monotonic) == "startup_died"
    # A whole fast grading can end before its readiness bytes are read (seen in CI on a loaded host): every
    # process said ready, then exited 0; that is no start-up failure.
    done = _supervised({"referee": ("pass", True), "candidate": ("pass", True), "eager": ("pass", True)})
    for child in done.children.values():
        child.popen.wait()
    assert done._wait_ready(time.monotonic) is None
    for evaluation in (fast, died, done):
        for child in evaluation.children.values():
            child.popen.kill()
            child.popen.wait()


def test_the_candidate_is_ended_before_the_referee_goes_on(tmp_path):
    """h26's finding: the candidate stayed alive while the eager reference was timed, so a thread of it could
    load the machine. Asked by the referee, the judge kills a candidate that does not exit when told, with the
    process it started, and answers only once none of them is left."""
    import os
    import subprocess
    import sys
    import time
    from types import SimpleNamespace

    from mkb.judge import processes
    from mkb.judge.evaluation import Evaluation

    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "time.sleep(60)")
    popen = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    candidate = SimpleNamespace(popen=popen, pid=popen.pid, kill=lambda: os.killpg(popen.pid, 9))
    deadline = time.monotonic() + 30
    while len(processes.descendants(popen.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    tree = set(processes.descendants(popen.pid))
    assert len(tree) == 2
    control_r, control_w = os.pipe()
    evaluation = Evaluation.__new__(Evaluation)
    evaluation.children, evaluation.stops = {"candidate": candidate}, []
    evaluation.launch = SimpleNamespace(control=control_w)
    evaluation._stop_candidate(time.monotonic, grace_s=0.2)
    answer = json.loads(os.read(control_r, 4096))
    assert answer == evaluation.stops[0]
    assert answer["exited_by_itself"] is False and answer["processes"] == 2 and answer["left"] == 0
    assert not any(processes.alive(pid) for pid in tree)
    os.close(control_r)
    os.close(control_w)


@pytest.mark.gpu
def test_the_candidate_cannot_reach_the_referees_tensors_through_its_ipc_mapping():
    """An IPC handle maps the whole allocation: shared tensors come from a pool that holds nothing else."""
    import importlib.util

    path = Path(__file__).resolve().parent / "ipc_segment_probe.py"
    spec = importlib.util.spec_from_file_location("ipc_segment_probe", path)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    result = probe.probe()
    assert result["default_allocator"]["secret_floats_seen"] > 0  # the probe does see what shares a segment
    assert result["shared_pool"]["secret_floats_seen"] == 0


def test_bench_summary_reports_spread_overhead_and_where_the_time_goes():
    from mkb.cli.bench_cmd import summarize
    from mkb.records import JudgeRecord

    def rec(speedup, wall, start, correctness):
        return JudgeRecord(status=Status.PASSED, problem="p28", dsl=Dsl.CUTEDSL, device="cuda", kernel_ms=0.25,
                           eager_ms=0.25 * speedup, speedup=speedup, wall_s=wall,
                           details={"solve_calls": 120, "processes_start_s": start, "gpu": {"name": "NVIDIA H200"},
                                    "environment": {"driver": "580.159.04"},
                                    "phases_s": {"correctness": correctness, "import": 2.0}})

    failed = JudgeRecord(status=Status.INCORRECT, problem="p28", dsl=Dsl.CUTEDSL, device="cuda", wall_s=5.0,
                         details={"processes_start_s": 1.0})
    row = summarize("paper", [rec(4.6, 22.0, 9.0, 12.0), rec(4.5, 24.0, 10.0, 13.0), rec(4.7, 23.0, 8.0, 11.0),
                              failed])
    assert row["passed"] == "3/4" and row["speedup_median"] == 4.6
    assert abs(row["spread_pct"] - 100 * 0.2 / 4.6) < 1e-9
    assert abs(row["overhead_s"] - (23.0 - 120 * 0.25 / 1e3)) < 1e-9
    assert row["startup_s"] == 9.0 and row["phases_s"] == {"correctness": 12.0, "import": 2.0}
    assert row["correctness_s"] == {}
    assert row["gpu"] == "NVIDIA H200" and row["environment"] == {"driver": "580.159.04"}


@needs_sandbox
def test_spare_processes_serve_the_next_grading_and_vanish(catalog, tmp_path):
    """A grading starts the next one's processes ahead; a different kind of grading does not take them."""
    import os

    from mkb.judge import launch as processes
    from mkb.settings import load_settings

    processes.discard_spares()
    fds_before = len(os.listdir("/proc/self/fd"))
    problem, kernel = resolve("p28", catalog), KERNELS / "valid_tirx_p28.py"
    settings = load_settings(judge_spares=1)
    first = grade(problem, kernel, "tirx", device="cpu", scale="smoke", settings=settings)
    second = grade(problem, kernel, "tirx", device="cpu", scale="smoke", settings=settings)
    assert first.passed and second.passed
    assert first.details["spare"]["used"] is False
    assert second.details["spare"]["used"] is True and second.details["spare"]["started_s_before"] > 0
    assert second.details["processes_start_s"] < first.details["processes_start_s"]
    other = grade(problem, kernel, "tirx", device="cpu", scale="smoke",
                  settings=load_settings(judge_spares=1, judge_memory_mb=16384))
    assert other.passed and other.details["spare"]["used"] is False  # other limits: another kind of launch
    spares = [launch for waiting in processes._SPARES.values() for launch in waiting]
    assert spares and all(s.alive() for s in spares)
    pids = [c.pid for s in spares for c in s.children.values()]
    workdirs = [s.hostdir for s in spares]
    processes.discard_spares()
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
    assert not any(Path(w).exists() for w in workdirs)
    assert len(os.listdir("/proc/self/fd")) == fds_before  # no pipe end left open by any grading
    cold = grade(problem, kernel, "tirx", device="cpu", scale="smoke", settings=load_settings(judge_spares=0))
    assert cold.passed and cold.details["spare"]["used"] is False
    assert not any(processes._SPARES.values()) and not any(processes._IN_FLIGHT.values())


@needs_sandbox
def test_a_spare_that_is_never_used_exits_on_its_own():
    """The judge's end of a spare's spec pipe closing (discarded, or the judge died) ends the spare."""
    import time

    from mkb.judge import launch as processes
    from mkb.settings import load_settings

    plan = processes.Plan.of(load_settings(), "cpu", False, True, None)
    launch = processes.Launch(plan)
    for fd in list(launch._go.values()):  # what the kernel does when the judge's process dies
        os.close(fd)
    launch._go.clear()
    deadline = time.monotonic() + 60
    while any(c.popen.poll() is None for c in launch.children.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(c.popen.returncode == 0 for c in launch.children.values())
    launch.close()


def test_gpu_fingerprint_tells_outputs_apart_and_equal_bytes_alike():
    import torch

    from mkb.judge.referee import checks

    x = torch.randn(3 * checks._FINGERPRINT_CHUNK // 2 + 3)  # two chunks, no trailing bytes
    f = checks.gpu_fingerprint(x)
    assert checks.gpu_fingerprint(x.clone()) == f
    for i in (0, 5, checks._FINGERPRINT_CHUNK, x.numel() - 1):  # one word changed anywhere
        y = x.clone()
        y[i] = torch.nextafter(y[i], torch.tensor(float("inf")))
        assert checks.gpu_fingerprint(y) != f
    swapped = x.clone()
    swapped[[0, 1]] = swapped[[1, 0]]
    assert checks.gpu_fingerprint(swapped) != f  # positions matter
    odd = torch.arange(7, dtype=torch.uint8)
    assert checks.gpu_fingerprint(odd)[-3:] == (4, 5, 6)  # trailing bytes that make no word
    sliced = torch.arange(11, dtype=torch.int16)[1:]  # a storage offset that is not word-aligned
    assert checks.gpu_fingerprint(sliced) == checks.gpu_fingerprint(sliced.clone())
    assert checks.digest([x, odd]) == checks.digest([x.clone(), odd.clone()]) != checks.digest([swapped, odd])


def test_the_profiler_warm_up_imports_nothing_heavy():
    """torch.profiler.profile imported torch._inductor (dynamo, sympy, Triton): 3-6 s per judge process."""
    import subprocess
    import sys

    code = ("import importlib.util, sys; import torch\n"
            f"spec = importlib.util.spec_from_file_location('t', {str(ROOT / 'mkb/judge/candidate/trace.py')!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); m.warm_up()\n"
            "print([n for n in ('torch._inductor', 'torch._dynamo', 'sympy', 'triton') if n in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


@needs_sandbox
def test_concurrent_graders_of_one_kind_keep_a_spare_each(catalog):
    from concurrent.futures import ThreadPoolExecutor

    from mkb.judge import launch as processes
    from mkb.settings import load_settings

    processes.discard_spares()
    problem, kernel, settings = resolve("p28", catalog), KERNELS / "valid_tirx_p28.py", load_settings(judge_spares=1)
    run = lambda _: grade(problem, kernel, "tirx", device="cpu", scale="smoke", settings=settings)  # noqa: E731
    with ThreadPoolExecutor(2) as pool:
        assert all(r.passed for r in pool.map(run, range(2)))
    waiting = [launch for spares in processes._SPARES.values() for launch in spares]
    assert 1 <= len(waiting) <= 2  # never more spares than gradings that were in flight
    assert run(0).details["spare"]["used"] is True
    processes.discard_spares()
