"""Can a process that maps a shared input over CUDA IPC read the sharer's other tensors?

    python tests/ipc_segment_probe.py        (on a GPU machine; prints one JSON object)

A CUDA IPC handle maps the whole allocation its tensor was carved from. This probe carves an input
and a "secret" (standing in for the referee's reference) the way torch's caching allocator can,
once from the default pool and once with the input in the judge's SharedPool, shares the input
with a child process, and counts how much of the secret the child can read through its mapping.
The judge needs 0 with the SharedPool (tests/test_judge.py runs this on a GPU).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAGIC = 1234567.0
N = 4 << 20  # float32 elements: 16 MiB per tensor

CHILD = """
import json, sys, torch
from cuda.bindings import driver
from mkb.judge.candidate import wire
t = wire.open_ipc_leaf(json.loads(sys.argv[1]))
err, base, size = driver.cuMemGetAddressRange(t.data_ptr())
assert int(err) == 0, err
host = torch.empty(int(size), dtype=torch.uint8)
err, = driver.cuMemcpyDtoH(host.data_ptr(), base, size)
assert int(err) == 0, err
seen = int((host[: int(size) // 4 * 4].view(torch.float32) == float(sys.argv[2])).sum())
print(json.dumps({"mapped_bytes": int(size), "secret_floats_seen": seen}))
"""


def scenario(with_pool: bool) -> dict:
    import torch

    from mkb.judge.candidate import wire
    from mkb.judge.referee.transport import SharedPool

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    block = torch.empty(4 * N * 4, dtype=torch.uint8, device="cuda")  # a cached block both could be carved from
    del block
    pool = SharedPool("cuda")
    with pool.allocating() if with_pool else contextlib.nullcontext():
        shared = torch.randn(N, device="cuda")
    secret = torch.full((N,), MAGIC, device="cuda")
    torch.cuda.synchronize()
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(wire.ipc_share(shared)), repr(MAGIC)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    del secret, shared
    if out.returncode != 0:
        return {"error": out.stderr[-1500:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def probe() -> dict:
    return {"default_allocator": scenario(False), "shared_pool": scenario(True), "secret_floats": N}


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    print(json.dumps(probe()))
