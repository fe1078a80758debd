"""The tensors the referee shares with the harnesses: memory-mapped files (CPU) or CUDA IPC (GPU).

Everything the candidate may map comes from here, and only from here. On a GPU, shared tensors
are allocated from a memory pool of their own (SharedPool), because a CUDA IPC handle maps the
whole allocation its tensor was carved from. The referee's private copies (references, anchors,
pristine inputs) live elsewhere in its CUDA context, or on the host (keep_on_device).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

from mkb import tensortree as tt
from mkb.judge.candidate import wire


class SharedPool:
    """The GPU memory the candidate may map: inputs and output slots, allocated from a pool of their own.

    A CUDA IPC handle maps the whole allocation a tensor was carved from, and torch's caching
    allocator carves many tensors from one allocation: a reference or a pristine copy next to an
    input in the same segment would be readable and writable by the candidate's kernels. Everything
    shared is therefore allocated here, and nothing else is.
    """

    def __init__(self, device: str):
        self.pool = torch.cuda.MemPool() if device == "cuda" else None

    @contextlib.contextmanager
    def allocating(self):
        if self.pool is None:
            yield
            return
        with torch.cuda.use_mem_pool(self.pool):
            yield


class Transport:
    """Tensors the referee owns and shares: mapped files on CPU, CUDA IPC on a GPU."""

    def __init__(self, device: str, workdir: str):
        self.device, self.workdir, self.kept = device, workdir, []
        self.shared = SharedPool(device)
        if device == "cpu":
            os.makedirs(workdir, exist_ok=True)

    def share(self, obj: Any) -> dict:
        if self.device == "cpu":
            return wire.encode(obj, wire.file_share(self.workdir))
        self.kept.append(obj)
        return wire.encode(obj, wire.ipc_share)

    def slots(self, like: Any) -> tuple[dict, Any]:
        if self.device == "cpu":
            tree = wire.encode(like, wire.file_slot(self.workdir))
            return tree, None
        with self.shared.allocating():
            empty = tree_map(like, lambda t: torch.zeros(t.shape, dtype=t.dtype, device="cuda"))
        self.kept.append(empty)
        return wire.encode(empty, wire.ipc_share), empty

    def read(self, tree: dict, tensors: Any, place: str = "cpu") -> Any:
        """A private copy of what shared tensors hold now, on `place` (outside the SharedPool)."""
        if tensors is None:
            return wire.decode(tree, wire.read_file_leaf)
        return tree_map(tensors, lambda t: t.detach().to(place, copy=True))

    def restore(self, tree: dict, tensors: list, pristine: list, positions: list[int]) -> None:
        """Put the shared inputs at `positions` back to their pristine bytes (the candidate maps the same memory)."""
        if not positions:
            return
        shared = wire.decode(tree, wire.open_file_leaf) if self.device == "cpu" else tensors
        for i in positions:
            shared[i].copy_(pristine[i])


KEEP_ON_DEVICE_FRACTION = 0.1
"""A draw is judged on the GPU while the referee's private copies (reference, anchor, pristine inputs,
read outputs) take at most this fraction of its memory (14 GB on an H200); the problems' own peaks are
at most 28 GB there, their fp64 anchors up to 56 GB (p06)."""


def keep_on_device(nbytes: int, device_bytes: int) -> bool:
    """Whether a draw's private copies (nbytes together) stay on the GPU, where it is then judged."""
    return nbytes <= KEEP_ON_DEVICE_FRACTION * device_bytes


def private_bytes(inputs: Any, ref: Any, anchor: Any) -> int:
    """What judging one draw keeps besides the shared tensors: reference, anchor, read outputs, pristine inputs."""
    return 2 * tt.nbytes(ref) + tt.nbytes(anchor) + tt.nbytes(inputs)


def tree_map(obj: Any, fn) -> Any:
    """obj with fn applied to every tensor in its (nested) lists and tuples."""
    if isinstance(obj, (list, tuple)):
        return type(obj)(tree_map(o, fn) for o in obj)
    return fn(obj) if isinstance(obj, torch.Tensor) else obj
