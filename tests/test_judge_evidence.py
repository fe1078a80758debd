"""DSL-use evidence (issue #24): the seal, the sealed hooks, the evidence stream, the knock-out, the DSL share.

The candidate-side parts run in real subprocesses where they install process-wide state (the audit hook);
the referee-side parts are pure functions over messages and profiler events. tests/test_judge.py grades
the attack fixtures (tests/kernels/forge_*, knockout_*, patch_*) end to end.
"""

from __future__ import annotations

import dis
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from mkb.errors import ProblemFormatError
from mkb.judge.candidate import escape, guards, hooks, knock, seal, trace, wire
from mkb.judge.referee import evidence, knockout, policy, share
from mkb.records import Check, Dsl

ROOT = Path(__file__).resolve().parent.parent
CANDIDATE = ROOT / "mkb" / "judge" / "candidate"


def _nested_code(code: types.CodeType):
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield const
            yield from _nested_code(const)


@pytest.mark.parametrize("factory", [knock.make_core, hooks.make_entries, guards.make_fingerprint, wire.endpoint,
                                     escape.make_checker, escape.make_asker, escape.make_dispatcher_probe,
                                     seal.install, seal.make_plain, seal.classifier, hooks.make_ledger,
                                     wire.unmasker])
def test_sealed_code_looks_up_no_global_name(factory):
    """A candidate can rebind any module's globals (vars(module) is writable); the closures that read the
    knock-out's mode, or decide what is genuine, must not see that."""
    looked_up = [(code.co_name, ins.argval) for code in _nested_code(factory.__code__)
                 for ins in dis.get_instructions(code)
                 if ins.opname in ("LOAD_GLOBAL", "STORE_GLOBAL", "IMPORT_NAME")
                 or (ins.opname == "LOAD_NAME" and ins.argval != "__name__")]
    assert looked_up == []


SEALED = r'''
import os, sys, importlib.util, traceback, logging
here = sys.argv[1]
spec = importlib.util.spec_from_file_location("seal", os.path.join(here, "seal.py"))
seal = importlib.util.module_from_spec(spec); spec.loader.exec_module(seal)
reports = []
roots = seal.Roots(here, sys.argv[2])
seal.install(roots, reports.append)
import torch
spec = importlib.util.spec_from_file_location("escape", os.path.join(here, "escape.py"))
escape = importlib.util.module_from_spec(spec); spec.loader.exec_module(escape)
escape.patch_unaudited(reports.append, escape.make_asker(roots.kind))
spec = importlib.util.spec_from_file_location("kernel", os.path.join(sys.argv[2], "kernel.py"))
kernel = importlib.util.module_from_spec(spec); sys.modules["kernel"] = kernel; spec.loader.exec_module(kernel)
results = kernel.attempts()
assert sys._getframe() is not None   # the harness itself is not refused
print("RESULTS", results)
print("REPORTS", len(reports))
'''
KERNEL = r'''
import sys, os, builtins, logging, traceback, threading, collections, dataclasses, typing, torch

def attempts():
    tries = {
        "getframe": lambda: getattr(sys, "_get" + "frame")(0),
        "gc": lambda: builtins.__dict__["__imp" + "ort__"]("g" + "c").get_objects(),
        "tb_frame": lambda: getattr(_tb(), "tb_" + "frame"),
        "defaults": lambda: getattr(torch.nn.functional.silu, "__def" + "aults__"),
        "compile": lambda: getattr(builtins, "comp" + "ile")("1", "x", "eval"),
        "code": lambda: getattr(torch.nn.functional.silu, "__co" + "de__"),
        "proc_mem": lambda: open("/proc/self/mem", "rb"),
        "fork": lambda: getattr(os, "fo" + "rk")(),
        "settrace": lambda: getattr(sys, "set" + "trace")(None),
        # no audit event covers these: the preloaded modules' entry points are patched (escape.py)
        "signal_handler": lambda: _loaded("sig" + "nal").signal(10, lambda signum, frame: None),
        "gc_saveall": lambda: _loaded("g" + "c").set_debug(32),
        "stack_dump": lambda: _loaded("fault" + "handler").dump_traceback(all_threads=True),
        "tracemalloc": lambda: _loaded("trace" + "malloc").start(),
        # traceback's extractor reads frames for text, but not the repr of every local
        "capture_locals": lambda: traceback.TracebackException(RuntimeError, RuntimeError(), _tb(),
                                                               capture_locals=True),
    }
    refused = {}
    for name, attempt in tries.items():
        try:
            attempt()
            refused[name] = False
        except PermissionError:
            refused[name] = True
    ok = {}
    try:
        raise ValueError("x")
    except ValueError:
        ok["format_exc"] = "ValueError" in traceback.format_exc()
    logging.getLogger("k").warning("logging finds its caller")
    ok["namedtuple"] = collections.namedtuple("P", "a b")(1, 2).b == 2
    ok["typevar"] = typing.TypeVar("T") is not None

    @dataclasses.dataclass
    class Own:
        a: int = 1
    ok["dataclass"] = Own().a == 1
    Own.extra = 2  # its own class may change
    return refused, ok

def _loaded(name):
    return sys.modules[name] if name in sys.modules else builtins.__dict__["__imp" + "ort__"](name)

def _tb():
    try:
        raise RuntimeError
    except RuntimeError as exc:
        return exc.__traceback__
'''


def test_the_seal_refuses_the_candidate_and_lets_honest_code_run(tmp_path):
    kernel_dir, judge_dir = tmp_path / "kernel", tmp_path / "judge"
    for folder in (kernel_dir, judge_dir):
        folder.mkdir()
    (kernel_dir / "kernel.py").write_text(KERNEL)
    for module in ("seal.py", "escape.py"):
        (judge_dir / module).write_text((CANDIDATE / module).read_text())
    (judge_dir / "harness.py").write_text(SEALED)  # the harness is a file of the judge's folder, as child.py is
    done = subprocess.run([sys.executable, str(judge_dir / "harness.py"), str(judge_dir), str(kernel_dir)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULTS"))
    refused, ok = eval(line.removeprefix("RESULTS "))  # noqa: S307 - our own subprocess's repr of two dicts
    assert refused == dict.fromkeys(refused, True) and len(refused) == 14
    assert ok == dict.fromkeys(ok, True) and len(ok) == 4
    reports = int(next(ln for ln in done.stdout.splitlines() if ln.startswith("REPORTS")).split()[1])
    assert reports >= 14  # every refusal is reported, whether or not the kernel catches the PermissionError


def test_wire_frames_carry_a_flag_and_evidence_goes_to_the_sink():
    read, write = os.pipe()
    seen = []
    _, send, emit, _ = wire.endpoint(read, write)
    receiver = wire.Channel(read, write, sink=seen.append)
    send({"cmd": "solve", "x": [1, 2.5]}, knock.KNOCK_NOISE)
    emit({"ev": "call", "dsl": "tirx"})
    send({"cmd": "report"})
    assert receiver.recv_flagged() == ({"cmd": "solve", "x": [1, 2.5]}, knock.KNOCK_NOISE)
    assert receiver.recv_flagged() == ({"cmd": "report"}, 0) and seen == [{"ev": "call", "dsl": "tirx"}]
    os.write(write, wire._HEADER.pack(3, 0) + b"[1]")
    with pytest.raises(wire.WireError, match="not one JSON object"):
        receiver.recv()
    with pytest.raises(ValueError):
        send({"x": float("nan")})
    os.close(read)
    os.close(write)


def _call(key="tirx:main:", written=(), stats=None, s=0.001):
    return {"ev": "call", "dsl": "tirx", "key": key, "symbols": ["k"], "written": list(written),
            "stats": stats or {}, "s": s}


def test_the_stream_keeps_the_first_fingerprint_as_baseline_and_plans_the_knock_out():
    stream = evidence.Stream()
    stream.add({"ev": "integrity", "ids": {"time.perf_counter": "1", "torch.equal": "2"}})
    stream.add({"ev": "integrity", "ids": {"time.perf_counter": "9", "torch.equal": "2"}})
    stream.add({"ev": "integrity", "ids": {"time.perf_counter": "1", "torch.equal": "2"}})  # a forged "all clear"
    assert stream.patched == ["time.perf_counter"]
    stream.current = 0
    stream.add(_call(written=["3"], stats={"3": {"mean": 0.5, "std": float("inf"), "lo": -2, "hi": 2}}, s=0.002))
    stream.add(_call(written=["3", "kw:out"], s=0.004))
    stream.add({"ev": "call", "dsl": 7})  # malformed: ignored
    stream.current = None
    stream.add(_call())  # between draws: filed nowhere
    assert stream.calls_by_dsl(0) == {"tirx": 2}
    assert stream.plan(0) == {"tirx:main:": {"args": ["3", "kw:out"], "s": 0.004,
                                             "stats": {"3": {"mean": 0.5, "lo": -2, "hi": 2}, "kw:out": None}}}
    stream.add({"ev": "built", "dsl": "tirx", "symbols": ["add_kernel", 5]})
    stream.add({"ev": "finding", "text": "used torch.compile"})
    assert stream.summary()["built"] == {"tirx": ["add_kernel"]} and stream.findings == ["used torch.compile"]


def test_an_evidence_flood_is_cut_off_and_reported(monkeypatch):
    monkeypatch.setattr(evidence, "MAX_EVENTS", 3)
    stream = evidence.Stream()
    for _ in range(10):
        stream.add({"ev": "finding", "text": "x"})
    assert stream.events == 10 and any("flooding" in f for f in stream.findings)


def test_the_knock_out_schedule_hides_its_draws_among_the_graded_ones():
    orders = {tuple(knockout.schedule(5, True)) for _ in range(40)}
    assert all(sorted(map(str, o)) == sorted(map(str, [("draw", 1), ("draw", 2), ("draw", 3), ("draw", 4),
                                                        ("knockout", "nan"), ("knockout", "noise"),
                                                        ("repeat", 0)])) for o in orders)
    assert len(orders) > 10  # drawn at random, not a fixed slot a kernel could count to
    assert knockout.schedule(5, False) and all(kind == "draw" for kind, _ in knockout.schedule(5, False))


def test_a_relief_with_no_checked_answer_after_it_is_graded_once_more():
    """A fresh process that took over in a knock-out must answer a graded draw or the repeat before it is profiled
    and timed; when the knock-out was the last step (or only knock-outs followed), the referee grades it once more."""
    assert not knockout.unchecked_relief([("draw", False), ("knockout", False), ("repeat", False)])
    assert not knockout.unchecked_relief([("knockout", True), ("draw", False), ("knockout", False)])
    assert not knockout.unchecked_relief([("knockout", True), ("repeat", False)])
    assert knockout.unchecked_relief([("draw", False), ("repeat", False), ("knockout", True)])
    assert knockout.unchecked_relief([("knockout", True), ("knockout", False)])  # a knock-out checks no answer
    assert knockout.unchecked_relief([("draw", False), ("knockout", True), ("knockout", True)])


@pytest.mark.parametrize("results, expected", [
    ({"nan": {"evidence": True}, "noise": {"evidence": True}}, Check.PASSED),
    ({"nan": {"evidence": True}, "noise": {"evidence": False, "dsl_calls": 1}}, Check.FAILED),  # 0 * x
    ({"nan": {"evidence": False, "dsl_calls": 0}, "noise": {"evidence": True}}, Check.FAILED),
    (None, Check.NOT_CHECKED),
])
def test_the_knock_out_passes_only_when_both_poisons_break_the_answer(results, expected):
    assert knockout.check(results) == expected


def _span(name, ts, dur, cat="user_annotation"):
    return {"cat": cat, "name": name, "ts": ts, "dur": dur}


def _launch(corr, ts):
    return {"cat": "cuda_driver", "name": "cuLaunchKernel", "ts": ts, "dur": 1, "args": {"correlation": corr}}


def _kernel(name, corr, ts, dur):
    return {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr, "stream": 7}}


def test_trace_says_where_each_kernel_was_launched():
    events = [_span("mkb_solve", 0, 100), _span("mkb_dsl", 10, 20), _span("aten::mm", 15, 5, "cpu_op"),
              _span("mkb_marker", 101, 2), _launch(1, 12), _launch(2, 16), _launch(3, 50), _launch(4, 102),
              _kernel("tile_kernel", 1, 200, 30), _kernel("nvjet_gemm", 2, 240, 500),
              _kernel("tile_kernel", 3, 800, 30), _kernel("fill", 4, 900, 1)]
    launches = {(i["name"], i["launch"]) for i in trace.summarize(events)["instances"]}
    assert launches == {("tile_kernel", "dsl"), ("nvjet_gemm", "aten"), ("tile_kernel", "other")}


def _profile(*instances, calls=1):
    return {"ok": True, "calls": [{}] * calls,
            "instances": [{"name": n, "cat": "kernel", "dur": d, "launch": w, "call": 0} for n, d, w in instances]}


def test_the_dsl_share_counts_only_dsl_kernels_launched_by_the_dsl():
    built = {"tirx": {"add_kernel", "nvjet_tst_128x256"}}
    honest = share.measure(_profile(("add_kernel", 90.0, "dsl"), ("void at::native::fill<>()", 10.0, "aten")),
                           built, "tirx")
    assert honest["share"] == pytest.approx(0.9) and honest["by_origin_ms"]["torch"] == pytest.approx(0.01)
    # a DSL kernel named like cuBLAS's: the real cuBLAS launch (inside aten::mm) must not count, nor its twin
    forged = share.measure(_profile(("nvjet_tst_128x256", 5.0, "dsl"), ("nvjet_tst_128x256", 995.0, "aten")),
                           built, "tirx")
    assert forged["share"] == 0.0 and forged["excluded"][0]["why"].startswith("a kernel of the same name")
    outside = share.measure(_profile(("add_kernel", 50.0, "other"), ("add_kernel", 50.0, None)), built, "tirx")
    assert outside["share"] == pytest.approx(0.5)  # uncorrelated: by name; launched outside any DSL call: not
    assert share.measure({"ok": False, "error": "boom"}, built, "tirx") == {"share": None, "why": "boom"}


def test_the_cpu_share_is_dsl_time_over_dsl_and_aten_time():
    events = [_span("mkb_solve", 0, 1000), _span("mkb_dsl", 100, 400), _span("aten::add", 200, 100, "cpu_op"),
              _span("aten::mul", 600, 100, "cpu_op"), _span("aten::empty_like", 700, 200, "cpu_op")]
    profile = {"ok": True, **trace.summarize_cpu(events)}
    assert profile["calls"] == [{"dsl_us": 300.0, "total_us": 500.0, "span_us": 1000}]
    assert share.measure(profile, {}, "tirx")["share"] == pytest.approx(0.6)
    # one slow call (a page fault, a descheduled thread) does not move it: each part counts at its fastest call
    noisy = {"ok": True, "cpu": True, "calls": [{"dsl_us": 30.0, "total_us": 80.0}, {"dsl_us": 1400.0,
                                                "total_us": 1480.0}, {"dsl_us": 33.0, "total_us": 90.0}]}
    assert share.measure(noisy, {}, "tirx")["share"] == pytest.approx(30 / 80)
    # the parts' minimums from different calls: one DSL-only call beside two torch-heavy ones reads as the latter
    mixed = {"ok": True, "cpu": True, "calls": [{"dsl_us": 1000.0, "total_us": 1010.0}, {"dsl_us": 100.0,
                                                "total_us": 1100.0}, {"dsl_us": 100.0, "total_us": 1100.0}]}
    assert share.measure(mixed, {}, "tirx")["share"] == pytest.approx(100 / 1100)  # the parts alone: 100 / 110


def _evidence(**kw):
    base = dict(dsl=Dsl.TIRX, device="cuda", draw_calls=[{"tirx": 1}] * 5,
                knockout={"nan": {"evidence": True}, "noise": {"evidence": True}},
                report={"built": {"tirx": ["k"]}}, share={"share": 0.14, "dsl_ms": 0.0017, "total_ms": 1.2})
    return policy.Evidence(**{**base, **kw})


def test_strict_requires_the_share_and_names_both_shares():
    assert policy.judge(_evidence()).dsl_check == Check.PASSED  # paper: recorded, not enforced
    strict = policy.judge(_evidence(policy="strict"))
    assert strict.dsl_check == Check.FAILED and "14.0%" in strict.message and "90%" in strict.message
    lowered = policy.judge(_evidence(policy="strict", share_min=(0.1, "the GEMM is cuBLAS's")))
    assert lowered.dsl_check == Check.PASSED
    no_profile = policy.judge(_evidence(share={"share": None, "why": "no profile of solve()"}))
    assert no_profile.dsl_check == Check.FAILED and "no profile" in no_profile.message
    cpu_none = policy.judge(_evidence(device="cpu", policy="strict", share={"share": None, "why": "no CPU time",
                                                                           "basis": "cpu"}))
    assert cpu_none.dsl_check == Check.FAILED and "gave none (no CPU time)" in cpu_none.message  # not a TypeError


def test_findings_and_replaced_entry_points_are_violations():
    verdict = policy.judge(_evidence(report={"built": {"tirx": ["k"]}, "findings": ["kernel.py called os.fork"],
                                             "patched": ["time.perf_counter"]}))
    assert verdict.violations == ["kernel.py called os.fork",
                                  "replaced time.perf_counter (patching library or judge entry points is forbidden)"]


def _problem(tmp_path, share_line: str) -> Path:
    source = (ROOT / "problems/mlp_norm/28_fused_add_rmsnorm_h4096_llama31_8b.py").read_text()
    path = tmp_path / "mlp_norm" / "28_fused_add_rmsnorm_h4096_llama31_8b.py"
    path.parent.mkdir()
    path.write_text(source + "\n" + share_line + "\n")
    return path


def test_a_problem_may_lower_the_strict_floor_with_a_literal_and_a_reason(tmp_path):
    from mkb.problems import parse_problem

    info = parse_problem(_problem(tmp_path, 'DSL_SHARE = {"min": 0.5, "reason": "the GEMMs stay in cuBLAS"}'))
    assert (info.dsl_share_min, info.dsl_share_reason) == (0.5, "the GEMMs stay in cuBLAS")


@pytest.mark.parametrize("line", ['DSL_SHARE = {"min": 0.95, "reason": "x"}', 'DSL_SHARE = {"min": 0.5}',
                                  'DSL_SHARE = {"min": 0.5, "reason": " "}', 'DSL_SHARE = {"min": "low", "reason": "x"}',
                                  'DSL_SHARE = 0.5'])
def test_a_bad_dsl_share_is_a_format_error(tmp_path, line):
    from mkb.problems import parse_problem

    with pytest.raises(ProblemFormatError, match="DSL_SHARE must be"):
        parse_problem(_problem(tmp_path, line))


def test_audit_lists_the_trials_the_current_rules_would_fail(tmp_path):
    """mkb audit: a static rule added since the grading, a share under the strict floor, an unprovable pass."""
    import json as jsonlib

    from analysis_db import add_problem, add_run, add_transcript, add_trial, judge_record
    from click.testing import CliRunner

    from mkb.cli import main
    from mkb.store import Store

    poisons = {"nan": {"evidence": True}, "noise": {"evidence": True}}
    graded = {  # trial problem -> (kernel source, final record)
        1: ("import torch\n_gc = __import__('gc')\n", judge_record("p01", "tirx", dsl_share=0.97)),
        2: ("import torch\n", judge_record("p02", "tirx", dsl_share=0.14)),
        3: ("import torch\n", judge_record("p03", "tirx")),
        4: ("import torch\n", judge_record("p04", "tirx", status="incorrect", dsl_share=0.01)),
        5: ("import torch\n", judge_record("p05", "tirx", dsl_share=0.95)),
    }
    db = tmp_path / "audit.duckdb"
    with Store(db) as store:
        add_run(store, "r", "m")
        for number, (source, record) in graded.items():
            problem = add_problem(store, number, "attention")
            if number == 5:
                record = record.model_copy(update={"details": {**record.details, "knockout": poisons}})
            trial = f"{problem}_r1_solo_tirx"
            attempt = add_transcript(store, "m", trial, [{"role": "user", "content": "go"}],
                                     [("final", record, source)])
            add_trial(store, "m", problem, "solo_tirx", status=record.status, attempt_id=attempt)
    result = CliRunner().invoke(main, ["--db", str(db), "audit", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["problem_id"]: r for r in jsonlib.loads(result.stdout)}
    assert rows["p01"]["verdict"] == "would fail" and "dynamic imports" in rows["p01"]["static"][0]
    assert rows["p02"]["verdict"] == "would fail" and rows["p02"]["strict"] == "failed"
    assert rows["p03"]["verdict"] == "regrade" and rows["p03"]["strict"] == "unknown"
    assert set(rows) == {"p01", "p02", "p03"}  # the failed grading and the sound pass are not listed
    every = CliRunner().invoke(main, ["--db", str(db), "audit", "--all", "--json"])
    assert {r["problem_id"]: r["verdict"] for r in jsonlib.loads(every.stdout)}["p05"] == "ok"
    assert "5 final gradings: 2 would now fail, 1 need a new grading to tell, 2 ok." in every.stderr


def test_the_audit_floor_is_the_policy_floor():
    from mkb.audit import STRICT_SHARE

    assert STRICT_SHARE == policy.STRICT_SHARE


def _host_modules():
    """Three llvm builds: one that calls libc's getpid, one that calls a global function by name, one honest."""
    import tvm
    from tvm.script import tirx as T

    @T.prim_func
    def extern(o_h: T.handle):
        O = T.match_buffer(o_h, (2,), "int64")
        O[0] = T.call_extern("int64", "getpid")

    @T.prim_func
    def packed(o_h: T.handle):
        O = T.match_buffer(o_h, (2,), "float32")
        T.evaluate(T.call_packed("kernel_py.callback"))
        O[0] = T.float32(1)

    @T.prim_func
    def honest(o_h: T.handle):
        O = T.match_buffer(o_h, (2,), "float32")
        O[0] = T.exp(O[1]) + T.call_pure_extern("float32", "tanhf", O[1])

    return {name: tvm.compile(tvm.IRModule({"main": f}), target="llvm", tir_pipeline="tirx")
            for name, f in (("extern", extern), ("packed", packed), ("honest", honest))}


def test_tirx_host_code_may_not_call_outside_the_dsl():
    """Host code calling a host library function (call_extern) or a global function by a name that is neither
    its own kernel nor TVM's runtime (call_packed of a Python callback) is refused before it can run."""
    built, found = _host_modules(), []
    check = escape.make_checker(found.append)
    for name, needle in (("extern", "host function getpid"), ("packed", "global function kernel_py.callback")):
        with pytest.raises(PermissionError, match=needle):
            check(built[name], [])
    check(built["honest"], [])  # LLVM intrinsics, C math and TVM's own error entry point only
    check(built["packed"], ["kernel_py.callback"])  # a kernel of the same build may be looked up by name
    assert len(found) == 2 and all("code the DSL did not build" in f for f in found)


def test_the_dispatcher_probe_sees_python_between_the_judge_and_torchs_operators():
    """A kernel registered for an operator the knock-out uses (at any dispatch key), or the Python dispatcher
    switched on, changes what the probe reads; undoing either restores it."""
    import torch

    probe = escape.make_dispatcher_probe()
    baseline = probe()
    assert probe() == baseline
    library = torch.library.Library("aten", "IMPL", "PrivateUse1")  # a key no CPU tensor reaches
    library.impl("clone", lambda self, memory_format=None: self)
    try:
        assert probe() != baseline
    finally:
        library._destroy()
    assert probe() == baseline
    with torch._C._EnablePythonDispatcher():
        assert probe() != baseline
    assert probe() == baseline
