"""Before kernel.py is imported: prove that each harness process works inside its sandbox.

The referee shares a small tensor with known content and two signal slots (wire.Signal) with the
harness (on CPU a memory-mapped file); the harness maps them, waits on the referee's signal, sums
the tensor and records its own signal, which the referee's stream waits on. That is every path a
grading uses (CUDA in the sandbox, IPC memory, signals in both directions). A failure here is the
judge's (infra_error); nothing the candidate wrote has run yet.
"""

from __future__ import annotations

import torch

from mkb.judge.candidate import wire
from mkb.judge.referee import timing
from mkb.judge.referee.transport import Transport
from mkb.judge.referee.verdict import Failure
from mkb.records import Status

PREFLIGHT_LIMIT_S = 60.0
N = 64
EXPECTED = float(N * (N - 1) // 2)


def send(channel: wire.Channel, transport: Transport, device: str, kept: list) -> wire.Signal | None:
    """Ask a harness to map a probe tensor and two signals (its answer is read by check()); the harness's
    signal on a GPU."""
    if device == "cuda":
        with transport.shared.allocating():
            probe = torch.arange(N, dtype=torch.float32, device="cuda")
        slots = transport.slots(torch.zeros(2, dtype=torch.int32))  # never given back: signal slots
        ours, theirs = wire.Signal(slots.tensors[0:1]), wire.Signal(slots.tensors[1:2])
        ours.record()
        kept.append(probe)
        channel.send({"cmd": "preflight", "tensor": wire.encode(probe, wire.ipc_share), "signals": slots.tree})
        return theirs
    channel.send({"cmd": "preflight", "tensor": transport.share(torch.arange(N, dtype=torch.float32)).tree})
    return None


def check(channel: wire.Channel, name: str, device: str, theirs: wire.Signal | None) -> dict:
    """The harness's hello facts once its answer to send() proved the sandbox works; else Failure (infra_error).

    theirs: what send() returned.
    """
    try:
        reply = channel.recv()
        if reply.get("ok") and reply.get("sum") == EXPECTED and device == "cuda":
            theirs.wait_next()
            done = torch.cuda.Event()
            done.record()
            try:
                timing.settle(done, PREFLIGHT_LIMIT_S, "the harness answered but never signalled")
            except timing.TimingError:
                theirs.release()
                raise
    except (wire.WireError, timing.TimingError, RuntimeError, KeyError, ValueError) as exc:
        raise Failure(Status.INFRA_ERROR, f"the {name} process failed its sandbox preflight: {exc}") from None
    if not reply.get("ok") or reply.get("sum") != EXPECTED:
        raise Failure(Status.INFRA_ERROR, f"the {name} process failed its sandbox preflight: "
                                          f"{reply.get('error') or reply.get('sum')}",
                      traceback=reply.get("traceback", ""))
    return reply
