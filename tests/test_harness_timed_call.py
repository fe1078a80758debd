"""The candidate harness's timed call (mkb/judge/candidate/child.py, cmd_timed) on the CPU: nothing of the kernel's
runs between solve()'s return and the call's answer.

The timed call is GPU-only in a grading (its events are CUDA events), so this drives cmd_timed directly in a fresh
Python process with CUDA's event and synchronisation replaced by host stand-ins that allocate as torch's do (the
current stream's object): a reference cycle whose __del__ would do the call's work, left by solve() with the
collector's threshold at 1, must not be collected before the answer is copied (tests/kernels/gpu_deferred_gc.py,
which passed on the H100 when the collector was switched off only after the `synced` event).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CHILD = Path(__file__).resolve().parents[1] / "mkb" / "judge" / "candidate" / "child.py"

SCRIPT = r"""
import gc, importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("harness_child", sys.argv[1])
child = importlib.util.module_from_spec(spec)
spec.loader.exec_module(child)
import torch

log = []

class Event:  # a CUDA event's stand-in: record() allocates a tracked object, as torch.cuda.current_stream() does
    def __init__(self, enable_timing=False):
        pass
    def record(self):
        log.append(("record", gc.isenabled()))
        _ = [[] for _ in range(10)]
    def elapsed_time(self, other):
        return 0.0

child._Event, child._sync = Event, lambda: log.append(("sync", gc.isenabled()))

class Later:  # the hack: a cycle whose __del__ fills the output after solve() returned
    def __init__(self, out):
        self.out, self.cycle = out, self
    def __del__(self):
        log.append(("deferred work", gc.isenabled()))
        self.out.fill_(1.0)

made = {"tirx": 0}
harness_calls = lambda: dict(made)  # noqa: E731  (the knock core's count of genuine DSL calls outside draws)


def solve(x):
    made["tirx"] += 1
    out = torch.zeros_like(x)
    Later(out)  # garbage in the youngest generation, which the next allocation after this collects
    gc.set_threshold(1)
    return out

harness = child.Candidate.__new__(child.Candidate)
harness.solve, harness.pool, harness.slots = solve, [[torch.zeros(4)]], [torch.empty(4)]
harness.calls_outside = harness_calls
taken = [{"tirx:main": 32}, {"tirx:main": 16}]  # what came before the call, then the call's own
harness.take_work = lambda: taken.pop(0)
harness.window = lambda on: log.append(("window", on))
harness.send = lambda reply: log.append(("send", sorted(reply), reply.get("dsl_calls"), reply.get("dsl_work")))
harness.emit = lambda event: log.append(("emit", event))

def copy_into(slots, out):
    log.append(("copy", float(out.sum())))
    return True

harness.copy_into = copy_into
gc.enable()
harness.cmd_timed({"k": 0, "set": 0})
log.append(("after the call", gc.isenabled()))
gc.collect()
os.write(child._REAL_STDOUT, json.dumps(log).encode() + b"\n")  # importing child sent stdout to stderr
"""


def test_nothing_of_the_kernel_runs_between_solve_and_the_answer(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(CHILD)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = [tuple(entry) for entry in json.loads(proc.stdout.strip().splitlines()[-1])]
    copy = next(i for i, entry in enumerate(log) if entry[0] == "copy")
    assert log[copy] == ("copy", 0.0), log  # the answer is what solve() returned: the deferred work came too late
    deferred = next(i for i, entry in enumerate(log) if entry[0] == "deferred work")
    assert deferred > copy, log
    records = [entry for entry in log[:copy] if entry[0] == "record"]
    assert records[0] == ("record", True) and records[1:] == [("record", False)] * 2, log  # start; returned, synced
    assert ("after the call", True) in log  # the collector is on again once the call is answered
    done = next(entry for entry in log if entry[0] == "send" and "done" in entry[1])
    assert done[2] == {"tirx": 1}  # the call's own genuine DSL calls, for the referee's rule (timing.run_calls)
    assert done[3] == {"tirx:main": 16}  # and their work, taken once before solve() and once after it


class _Pool:
    def __init__(self):
        self.size, self.used, self.seeds = 2, set(), [1, 2]

    def refresh(self, s):
        self.seeds[s] += 10


class _Bracket:
    def __init__(self, counts, work=lambda k: {}):
        self.counts, self.work = counts, work

    def call(self, k, s, null=False, flush=None):
        return {"ms": 1.0, "sync_ms": 0.5, "self_ms": 0.4, "copied": True, "dsl_calls": self.counts(k),
                "dsl_work": self.work(k)}


def test_every_timed_call_must_make_a_genuine_call_of_the_dsl():
    from mkb.judge.referee import timing

    honest = timing.run_calls(_Bracket(lambda k: {"tirx": 1}), _Pool(), warmup=2, timed=4, dsl="tirx")
    assert len(honest) == 4
    for counts, why in [(lambda k: {"tirx": 0} if k == 4 else {"tirx": 2}, "timed call 5 made no tirx call"),
                        (lambda k: {"cutedsl": 3}, "timed call 1 made no tirx call"),
                        (lambda k: {"tirx": True}, "timed call 1 made no tirx call")]:
        with pytest.raises(timing.TimingError, match=why) as caught:
            timing.run_calls(_Bracket(counts), _Pool(), warmup=2, timed=4, dsl="tirx")
        assert caught.value.kind == "policy_violation"
    # the eager reference and the empty calls run no DSL: no rule there
    assert len(timing.run_calls(_Bracket(lambda k: {}), _Pool(), warmup=1, timed=2)) == 2
    assert len(timing.run_calls(_Bracket(lambda k: {}), _Pool(), warmup=1, timed=2, null=True, dsl="tirx")) == 2


def test_a_timed_call_must_give_the_dsl_the_draws_work():
    from mkb.judge.referee import timing

    floor = {"tirx:main": {"0": 4096, "1": 64}, "tirx:scale": {}}  # least bytes a draw passed, by argument
    full = {"tirx:main": {"0": 4096, "1": 64, "kw:out": 9}, "tirx:scale": {"0": 8}}
    runs = timing.run_calls(_Bracket(lambda k: {"tirx": 2}, lambda k: full), _Pool(), warmup=1, timed=3, dsl="tirx",
                            work=floor)
    assert len(runs) == 3 and runs[0]["dsl_work"] == full
    for work, why in [
        (lambda k: {"tirx:main": {"0": 16, "1": 64}, "tirx:scale": {}},
         "timed call 1 passed tirx:main 16 bytes of tensors as argument 0 where every draw passed at least 4096"),
        # the sliver beside a large argument the kernel does not use: each position counts on its own
        (lambda k: {"tirx:main": {"0": 16, "1": 64, "2": 1 << 20}, "tirx:scale": {}}, "as argument 0"),
        (lambda k: full if k < 3 else {"tirx:main": full["tirx:main"]}, "timed call 4 did not call tirx:scale"),
        (lambda k: {"tirx:main": {"0": 4096.0, "1": 64}, "tirx:scale": {}}, "passed tirx:main 0 bytes"),  # not a count
        (lambda k: {"tirx:main": 4096, "tirx:scale": {}}, "did not call tirx:main"),
    ]:
        with pytest.raises(timing.TimingError, match=why) as caught:
            timing.run_calls(_Bracket(lambda k: {"tirx": 2}, work), _Pool(), warmup=1, timed=3, dsl="tirx", work=floor)
        assert caught.value.kind == "policy_violation"
    assert timing.work_shortfall({"tirx:main": {"0": 2048, "1": 32}, "tirx:scale": {}}, floor) is None  # half: routing
    # a launch size passed as a number: the whole tensors, one row's worth of launch
    rows = {"tirx:main": {"0": 4096, "n:2": 64}}
    assert timing.work_shortfall({"tirx:main": {"0": 4096, "n:2": 64}}, rows) is None
    assert timing.work_shortfall({"tirx:main": {"0": 4096, "n:2": 1}}, rows) == (
        "passed tirx:main numbers adding to 1 as argument 2 where every draw passed at least 64 (the least a timed "
        "call may pass: 0.5x)")
    assert "numbers adding to 0 as argument 2" in timing.work_shortfall({"tirx:main": {"0": 4096}}, rows)


def test_the_draws_work_floor_and_the_cores_count_of_it():
    from mkb.judge.candidate import knock
    from mkb.judge.referee import evidence

    stream = evidence.Stream()
    for index, calls in enumerate([[("k:a", {"0": 100, "1": 5}), ("k:a", {"0": 50}), ("k:b", {"0": 10})],
                                   [("k:a", {"0": 120, "1": 7}), ("k:b", {"0": 4, "kw:x": 3})],
                                   [("k:a", {"0": 200, "1": 1}), ("k:b", {"0": 9}), ("k:c", {"0": 7})]]):
        stream.current = index
        for key, sizes in calls:
            stream.add({"ev": "call", "dsl": "tirx", "key": key, "bytes": sizes})
    # every draw's callables and positions, and all of the DSL's callables added up
    assert stream.work_floor() == {"k:a": {"0": 120, "1": 1}, "k:b": {"0": 4}, "tirx:*": {"0": 124, "1": 1}}
    stream.current = 3
    stream.add({"ev": "call", "dsl": "tirx", "key": "k:a", "bytes": {"0": True, "1": -1}})  # not counts: nothing
    stream.add({"ev": "call", "dsl": "tirx", "key": "k:b", "bytes": 2**40})
    assert stream.work_floor() == {"k:a": {}, "k:b": {}, "tirx:*": {}}

    events = []
    core = knock.make_core(events.append, lambda text: events.append(text), lambda: "dispatcher")
    core["window"](True)  # as the harness opens it around a timed call's solve()
    seen = []

    def kernel(*args, **kwargs):
        seen.append(len(args))

    obj = object()
    core["register"](obj, "tirx", kernel, "tirx:main", ["main"])
    x, y = torch.zeros(64, dtype=torch.float32), torch.zeros(8, dtype=torch.float16)
    core["dsl_call"](obj, None, (x, 3, y), {"out": x})  # outside every draw: counted, its bytes kept
    core["dsl_call"](obj, None, (y,), {})
    assert core["calls_outside"]() == {"tirx": 2}
    assert core["take_work"]() == {"tirx:main": {"0": 256 + 16, "n:1": 3, "2": 16, "kw:out": 256}}  # 3: a number
    assert core["take_work"]() == {}
    core["draw"](knock.new_state(knock.OBSERVE, {}))  # a draw's call reports the same figures with its evidence
    core["dsl_call"](obj, None, (x, y, 7, 0, -2, True, 2.5), {"rows": 5})  # positive integers only, as numbers
    core["draw"](None)
    assert [e["bytes"] for e in events if isinstance(e, dict) and e.get("ev") == "call"] == [
        {"0": 256, "1": 16, "n:2": 7, "n:kw:rows": 5}]
    assert core["take_work"]() == {} and len(seen) == 3
    import numpy as np
    core["dsl_call"](obj, None, (np.zeros(4, dtype=np.float32), object(), False), {"n": 3})  # DLPack counts, not objects
    assert core["take_work"]() == {"tirx:main": {"0": 16, "n:kw:n": 3}}

    class Size(int):  # a launch size that says 1 when asked and holds 4096
        def __index__(self):
            return 1

        __int__ = __index__

    core["dsl_call"](obj, None, (Size(4096), np.int32(7), torch.tensor([5]), 2.0, "9"), {})
    assert core["take_work"]() == {"tirx:main": {"n:0": 4096, "n:1": 7, "2": 8}}  # the int held; a tensor is bytes


def test_cute_dsl_tensor_wrappers_are_sized_by_the_dsls_own_getters():
    """CuTe DSL's runtime tensors (cutlass.cute.runtime.from_dlpack) are neither torch tensors nor DLPack-convertible:
    the hooks hand the core their class's shape and element-type getters when cutlass.cute loads, so a kernel called
    through them has its work counted like one called with torch tensors (a sliver through a wrapper is caught too)."""
    script = r"""
import json, os, sys, torch
from mkb.judge.candidate import hooks, knock
events = []
core = knock.make_core(events.append, events.append, lambda: "d")
core["window"](True)
hooks.install(core)
from cutlass.cute.runtime import from_dlpack
def kernel(*a, **k):
    pass
obj = object()
core["register"](obj, "cutedsl", kernel, "cutedsl:k", ["k"])
x = torch.zeros(4, 8, dtype=torch.bfloat16)
core["dsl_call"](obj, None, (from_dlpack(x), from_dlpack(x[:1]), 3, from_dlpack(x[:1].expand(4, 8))), {})
outside = core["take_work"]()
core["draw"](knock.new_state(knock.OBSERVE, {}))
core["dsl_call"](obj, None, (from_dlpack(x),), {"o": from_dlpack(x)})
core["draw"](None)
drawn = [e["bytes"] for e in events if isinstance(e, dict) and e.get("ev") == "call"]
print(json.dumps({"outside": outside, "drawn": drawn}))
"""
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=root,
                          env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    # 4 x 8 bf16, the one-row sliver, 3, and the sliver expanded to 4 x 8 (stride 0): its one row of memory
    assert found["outside"] == {"cutedsl:k": {"0": 64, "1": 16, "n:2": 3, "3": 16}}
    assert found["drawn"] == [{"0": 64, "kw:o": 64}]


def test_a_tensor_counts_the_memory_it_spans_not_its_numel():
    """A timed call's sliver expanded to the draws' shape (stride 0) has the draws' numel but one row of memory, and a
    TIRx kernel with symbolic strides takes any layout, so a zero stride could also tell it to do nothing
    (tests/kernels/gpu_rt8dsl_timed_expand_tirx_p28.py): the core counts what a tensor can address, not its numel."""
    from mkb.judge.candidate import knock

    core = knock.make_core(lambda e: None, lambda text: None, lambda: "dispatcher")
    core["window"](True)
    obj = object()
    core["register"](obj, "tirx", lambda *a, **k: None, "tirx:main", ["main"])
    x = torch.zeros(64, 32, dtype=torch.bfloat16)  # 4096 bytes
    big = torch.zeros(64 * 1000, dtype=torch.float32)
    for view, size in [
        (x, 4096), (x.t(), 4096), (x[:, :8], 1024), (x[::2], 2048), (x[:0], 0),  # honest layouts: numel x width
        (x[:1].expand(64, 32), 64), (x[:1, :1].expand(64, 32), 2),  # broadcast: one row, one element
        (torch.zeros(1, dtype=torch.float32).expand(1 << 40), 4),  # a terabyte of numel, four bytes of memory
        (x.view(-1).as_strided((64, 32), (1, 1)), 95 * 2),  # overlapping rows: 95 distinct elements
        (big.as_strided((64, 2), (1000, 1)), 128 * 4),  # huge strides, no overlap: each element read counts once
    ]:
        core["dsl_call"](obj, None, (view,), {"out": view})
        assert core["take_work"]() == {"tirx:main": {"0": size, "kw:out": size}}, (tuple(view.shape), view.stride())
    import numpy as np  # DLPack-converted arrays count the same way
    core["dsl_call"](obj, None, (np.broadcast_to(np.zeros(8, dtype=np.float32), (100, 8)),), {})
    assert core["take_work"]() == {"tirx:main": {"0": 32}}
    # the rule then refuses the expanded sliver where the draws passed the whole tensor
    from mkb.judge.referee import timing
    assert "passed tirx:main 64 bytes of tensors as argument 0 where every draw passed at least 4096" in (
        timing.work_shortfall({"tirx:main": {"0": 64}}, {"tirx:main": {"0": 4096}}))


def test_callables_renamed_between_draws_still_leave_a_floor():
    """The observed draw calls the kernel compiled as "main", every later call the same kernel compiled as "alt" (the
    key is the function's name and its symbols): no callable every draw called, so no floor at all, and a timed call's
    one-row sliver passed. The DSL's callables also count together (tirx:*)."""
    from mkb.judge.referee import evidence, timing

    stream = evidence.Stream()
    for index, key in enumerate(["tirx:main:", "tirx:alt:", "tirx:alt:", "tirx:alt:", "tirx:alt:"]):
        stream.current = index
        stream.add({"ev": "call", "dsl": "tirx", "key": key, "bytes": {"0": 4096, "1": 4096, "n:2": 64}})
    floor = stream.work_floor()
    assert floor == {"tirx:*": {"0": 4096, "1": 4096, "n:2": 64}}
    assert timing.work_shortfall({"tirx:alt:": {"0": 64, "1": 64, "n:2": 1}}, floor) == (
        "passed tirx:* 64 bytes of tensors as argument 0 where every draw passed at least 4096 (the least a timed call "
        "may pass: 0.5x)")
    assert timing.work_shortfall({"tirx:alt:": {"0": 4096, "1": 2048}, "tirx:main:": {"n:2": 64}}, floor) is None
    assert timing.work_shortfall({"tirx:other:": {"0": 2048, "1": 4096, "n:2": 64}}, floor) is None  # any name
    assert timing.work_shortfall({"cutedsl:k": {"0": 4096}}, floor) == "called no tirx callable, as every draw did"
    # the record's figures read each call as the rule does: the total over the DSL's callables
    from mkb.judge.referee import speed
    runs = [{"dsl_work": {"tirx:alt:": {"0": 4096, "1": 2048}, "tirx:main:": {"n:2": 64}}},
            {"dsl_work": {"tirx:other:": {"0": 3000, "1": 4096, "n:2": 64}}}]
    assert speed._work(floor, runs)["timed_least"] == {"tirx:*": {"0": 3000, "1": 2048, "n:2": 64}}


LATE = r"""
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("harness_child", sys.argv[1])
child = importlib.util.module_from_spec(spec)
spec.loader.exec_module(child)
import torch
from mkb.judge.candidate import knock

core = knock.make_core(lambda e: None, lambda text: None, lambda: "dispatcher")
kernel = object()
core["register"](kernel, "tirx", lambda x, out: out.copy_(x), "tirx:main:", ["main"])
data = torch.arange(1024, dtype=torch.float32)


def dsl(x):  # a genuine call of the TIRx callable
    out = torch.empty_like(x)
    core["dsl_call"](kernel, None, (x, out), {})
    return out


class Event:
    def __init__(self, enable_timing=False):
        pass
    def record(self):
        pass
    def elapsed_time(self, other):
        return 0.0


late = sys.argv[2] == "late"
# the hack: solve() returns torch's answer; a thread of the kernel's calls the DSL on the whole data while the harness
# waits for the device (its GIL is free then), outside the timed window, before the call's count is read
child._Event, child._sync = Event, (lambda: dsl(data)) if late else (lambda: None)
harness = child.Candidate.__new__(child.Candidate)
harness.solve = (lambda x: x * 2) if late else (lambda x: dsl(x) * 2)
harness.pool, harness.slots = [[data]], [torch.empty(1024)]
harness.calls_outside, harness.take_work, harness.window = core["calls_outside"], core["take_work"], core["window"]
sent = []
harness.send, harness.modes_left = sent.append, (lambda: 0)
harness.copy_into = lambda slots, out: True
harness.cmd_timed({"k": 0, "set": 0})
done = next(r for r in sent if "done" in r)
os.write(child._REAL_STDOUT, json.dumps([done["dsl_calls"], done["dsl_work"]]).encode() + b"\n")
"""


@pytest.mark.parametrize("when, counted", [("inside", ({"tirx": 1}, {"tirx:main:": {"0": 4096, "1": 4096}})),
                                           ("late", ({}, {}))])
def test_only_dsl_calls_made_inside_solve_count_for_a_timed_call(when, counted, tmp_path):
    """A thread's DSL call once solve() has returned (while the harness synchronises or copies the answer) is outside
    the timed window: it passed the referee's rules (a genuine call, the draws' bytes) for a solve() that was all
    torch. The core counts a timed call's DSL calls only while its solve() runs (knock.py, window())."""
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", LATE, str(CHILD), when], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    calls, work = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (calls, work) == (counted[0], counted[1])
