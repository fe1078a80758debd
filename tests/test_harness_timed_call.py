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

def solve(x):
    out = torch.zeros_like(x)
    Later(out)  # garbage in the youngest generation, which the next allocation after this collects
    gc.set_threshold(1)
    return out

harness = child.Candidate.__new__(child.Candidate)
harness.solve, harness.pool, harness.slots = solve, [[torch.zeros(4)]], [torch.empty(4)]
harness.send = lambda reply: log.append(("send", sorted(reply)))
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
