"""The tensors the referee shares with the harnesses: memory-mapped files (CPU) or CUDA IPC (GPU).

Everything the candidate may map comes from here, and only from here. On a GPU, shared tensors
are allocated from a memory pool of their own (SharedPool), because a CUDA IPC handle maps the
whole allocation its tensor was carved from, and reused draw after draw (Arena). The referee draws
and computes in private memory (its inputs, references, anchors) and shares copies; the private
inputs are the pristine copy the input guard compares with.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable

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


class Arena:
    """The storages a grading shares, lent to one draw (or timing set) at a time, given back, never freed.

    The candidate keeps whatever it mapped: torch's CUDA IPC holds a shared block back from reuse
    until every process that mapped it lets go, so storages freed per draw would pile up for as long
    as a kernel holds on to them, which it controls. The arena instead reuses its storages draw after
    draw (a problem's inputs have the same sizes on every draw), so the referee's shared memory is
    one input set and one answer however many draws a grading makes, and no kernel can make it grow.
    What a storage held before is never trusted: the referee computes on its private copies and
    only copies them in (Transport.share), right before the candidate's call.
    """

    def __init__(self, allocate: Callable[[int], torch.UntypedStorage]):
        self.allocate = allocate
        self.made: list[torch.UntypedStorage] = []
        self.idle: list[torch.UntypedStorage] = []

    @property
    def nbytes(self) -> int:
        """Bytes of every storage the arena has made."""
        return sum(s.nbytes() for s in self.made)

    def lend(self, nbytes: int) -> torch.UntypedStorage:
        """The smallest idle storage of at least nbytes, or a new one."""
        fits = [i for i, s in enumerate(self.idle) if s.nbytes() >= nbytes]
        if fits:
            return self.idle.pop(min(fits, key=lambda i: self.idle[i].nbytes()))
        storage = self.allocate(max(nbytes, 1))
        self.made.append(storage)
        return storage

    def give_back(self, storages: list[torch.UntypedStorage]) -> None:
        self.idle.extend(storages)


@dataclass
class Shared:
    """Tensors shared with a harness: their wire tree, and on a GPU the referee's views of them (None on CPU,
    where they are files) and the arena storages they use."""

    tree: dict
    tensors: Any = None
    storages: list = field(default_factory=list)


def copy_in(obj: Any, arena: Arena) -> tuple[Any, list[torch.UntypedStorage]]:
    """obj with every tensor copied into storages lent by the arena: the same offsets, shapes and strides, and
    tensors that shared a storage still share one. The storages it lent."""
    sources: dict[tuple, torch.UntypedStorage] = {}
    for t in _tensors(obj):
        storage = t.untyped_storage()
        sources.setdefault(_key(storage), storage)
    lent = {}
    for key in sorted(sources, key=lambda k: -k[2]):  # the largest first, so small ones do not take big storages
        lent[key] = arena.lend(key[2])
        if key[2]:
            wire.byte_view(lent[key])[:key[2]].copy_(wire.byte_view(sources[key]))

    def view(t: torch.Tensor) -> torch.Tensor:
        storage = lent[_key(t.untyped_storage())]
        return torch.empty(0, dtype=t.dtype, device=storage.device).set_(storage, t.storage_offset(), t.shape,
                                                                         t.stride())

    return tree_map(obj, view), list(lent.values())


def _key(storage: torch.UntypedStorage) -> tuple:
    return str(storage.device), storage.data_ptr(), storage.nbytes()


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    return [obj.detach()] if isinstance(obj, torch.Tensor) else []


class Transport:
    """Tensors the referee owns and shares: mapped files on CPU, CUDA IPC on a GPU (from its arena)."""

    def __init__(self, device: str, workdir: str):
        self.device, self.workdir = device, workdir
        self.shared = SharedPool(device)
        self.arena = Arena(self._allocate)
        self.described: dict[int, dict] = {}
        """data_ptr of an arena storage -> its CUDA IPC description (wire.ipc_storage), made once."""
        if device == "cpu":
            os.makedirs(workdir, exist_ok=True)

    def _allocate(self, nbytes: int) -> torch.UntypedStorage:
        with self.shared.allocating():
            return torch.empty(nbytes, dtype=torch.uint8, device=self.device).untyped_storage()

    def _leaf(self, t: torch.Tensor, path: str) -> dict:
        storage = t.untyped_storage()
        if storage.data_ptr() not in self.described:
            self.described[storage.data_ptr()] = wire.ipc_storage(storage)
        return wire.ipc_leaf(self.described[storage.data_ptr()], t)

    def share(self, obj: Any) -> Shared:
        """Copies of obj's tensors for a harness to map (obj is the referee's private draw, never shared itself)."""
        if self.device == "cpu":
            return Shared(wire.encode(obj, wire.file_share(self.workdir)))
        tensors, storages = copy_in(obj, self.arena)
        torch.cuda.synchronize()  # the harness maps them with no IPC event (wire.ipc_storage)
        return Shared(wire.encode(tensors, self._leaf), tensors, storages)

    def slots(self, like: Any) -> Shared:
        """Zeroed, contiguous output slots shaped like `like`'s tensors, for the candidate to copy its outputs into."""
        if self.device == "cpu":
            return Shared(wire.encode(like, wire.file_slot(self.workdir)))
        storages = []

        def slot(t: torch.Tensor) -> torch.Tensor:
            storage = self.arena.lend(t.numel() * t.element_size())
            storages.append(storage)
            wire.byte_view(storage).zero_()
            return torch.empty(0, dtype=t.dtype, device="cuda").set_(storage, 0, t.shape,
                                                                     torch.empty(t.shape, device="meta").stride())

        tensors = tree_map(like, slot)
        torch.cuda.synchronize()
        return Shared(wire.encode(tensors, self._leaf), tensors, storages)

    def read(self, shared: Shared, place: str = "cpu") -> Any:
        """A private copy of what shared tensors hold now, on `place` (outside the arena)."""
        if shared.tensors is None:
            return wire.decode(shared.tree, wire.read_file_leaf)
        return tree_map(shared.tensors, lambda t: t.detach().to(place, copy=True))

    def give_back(self, *shared: Shared) -> None:
        """The arena storages of draws that are judged, for the next draw to reuse."""
        for s in shared:
            self.arena.give_back(s.storages)
            s.storages = []


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
