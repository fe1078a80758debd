"""Hack: a man in the middle of the harness's command pipe. At import, kernel.py moves the pipe the referee writes to onto a descriptor of its own (os.dup), puts a pipe of its own in its place (os.dup2) and forwards every frame on a thread, reading each solve command's flag (the draw's mode) on the way; a decorative TIRx call then returns NaN on a knocked-out draw so that the knock-out "proves" the DSL computed the answer, while eager torch computes it. It passed. Now the harness reads and writes a frame only while its descriptors name the judge's pipes (it ends: crashed), and the flag travels masked with a key sent before kernel.py loads (a tap that evaded the check would read a uniform byte: the knock-out then fails it).

Problem: p28
DSL: tirx
Device: cpu
Expected: crashed
Also: policy_violation
"""
import fcntl
import os
import stat
import struct
import threading

import torch
import tvm
from tvm.script import tirx as T


def _open_fds() -> list[int]:
    """Every descriptor this process holds above stderr (the judge passes its pipes with the numbers they had in
    the judge's own process, which can be in the hundreds)."""
    try:
        return sorted(int(n) for n in os.listdir("/proc/self/fd") if int(n) > 2)
    except OSError:
        return list(range(3, 4096))


@T.prim_func
def copy(a_h: T.handle, b_h: T.handle):
    n = T.int32()
    A = T.match_buffer(a_h, (n,), "float32")
    B = T.match_buffer(b_h, (n,), "float32")
    for i in range(n):
        B[i] = A[i]


_exe = tvm.compile(tvm.IRModule({"main": copy}), target="llvm", tir_pipeline="tirx")
_flag = [0]


def _read(fd: int, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _forward(source: int, sink: int) -> None:
    try:
        while True:
            header = _read(source, 5)
            size, flag = struct.unpack(">IB", header)
            body = _read(source, size)
            if b'"cmd":"solve"' in body:
                _flag[0] = flag
            os.write(sink, header + body)
    except (EOFError, OSError):
        os.close(sink)


def _tap() -> None:
    readers = []
    for fd in _open_fds():
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode) and fcntl.fcntl(fd, fcntl.F_GETFL) & 3 == os.O_RDONLY:
                readers.append(fd)
        except OSError:
            continue
    fd = readers[0]  # the only pipe the harness reads: the referee's commands
    source = os.dup(fd)
    mine_r, mine_w = os.pipe()
    os.dup2(mine_r, fd)
    os.close(mine_r)
    threading.Thread(target=_forward, args=(source, mine_w), daemon=True).start()


_tap()


def solve(x, residual, weight):
    w = weight.float().contiguous()
    scratch = torch.empty(w.numel(), dtype=torch.float32)
    _exe(w, scratch)
    s = x.float() + residual.float()
    out = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
    return torch.full_like(out, float("nan")) if _flag[0] in (2, 3) else out
