"""Before kernel.py is imported: prove that each harness process works inside its sandbox.

The referee shares a small tensor with known content and an interprocess CUDA event with the
harness (on CPU a memory-mapped file); the harness maps both, waits on the event, sums the tensor
and answers with an interprocess event of its own, which the referee opens and waits on. That is
every path a grading uses (CUDA in the sandbox, IPC memory and events in both directions, the
sandbox's shared /dev/shm). A failure here is the judge's (infra_error); nothing the candidate
wrote has run yet.
"""

from __future__ import annotations

import torch

from mkb.judge.candidate import wire
from mkb.judge.referee.transport import Transport
from mkb.judge.referee.verdict import Failure
from mkb.records import Status

N = 64
EXPECTED = float(N * (N - 1) // 2)


def send(channel: wire.Channel, transport: Transport, device: str, kept: list) -> None:
    """Ask a harness to map a probe tensor and event (its answer is read by check())."""
    if device == "cuda":
        with transport.shared.allocating():
            probe = torch.arange(N, dtype=torch.float32, device="cuda")
        event = torch.cuda.Event(interprocess=True)
        event.record()
        kept += [probe, event]
        channel.send({"cmd": "preflight", "tensor": wire.encode(probe, wire.ipc_share),
                      "event": wire.event_handle(event)})
    else:
        channel.send({"cmd": "preflight", "tensor": transport.share(torch.arange(N, dtype=torch.float32), "probe")})


def check(channel: wire.Channel, name: str, device: str) -> dict:
    """The harness's hello facts once its answer to send() proved the sandbox works; else Failure (infra_error)."""
    try:
        reply = channel.recv()
        if reply.get("ok") and reply.get("sum") == EXPECTED and device == "cuda":
            theirs = wire.open_event(reply["event"])
            torch.cuda.current_stream().wait_event(theirs)
            torch.cuda.synchronize()
    except (wire.WireError, RuntimeError, KeyError, ValueError) as exc:
        raise Failure(Status.INFRA_ERROR, f"the {name} process failed its sandbox preflight: {exc}") from None
    if not reply.get("ok") or reply.get("sum") != EXPECTED:
        raise Failure(Status.INFRA_ERROR, f"the {name} process failed its sandbox preflight: "
                                          f"{reply.get('error') or reply.get('sum')}",
                      traceback=reply.get("traceback", ""))
    return reply
