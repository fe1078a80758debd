"""In-place outputs (MUTATES): run a reference on copies of the inputs it updates, and name what it updated.

A problem's answer is a pair (returned, updated): what `reference` returned (a tensor, a tuple of
tensors, or None when its only outputs are in place) and the MUTATES inputs as the call left them,
in MUTATES order. Problems without MUTATES have answers (returned, ()). Shared by problem QA and the
judge's referee, which compare answers leaf by leaf.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from mkb import tensortree as tt

Positions = list[tuple[int, str]]
"""(argument position, parameter name) of each MUTATES input (mkb.problems.mutated_positions)."""


def run(reference: Callable, inputs: list, positions: Positions, copy: bool = True) -> tuple[Any, tuple]:
    """The answer of reference(*inputs); with copy, the MUTATES inputs are cloned first so `inputs` stay as they are."""
    work = list(inputs)
    if copy:
        for i, _ in positions:
            work[i] = work[i].detach().clone()
    returned = reference(*work)
    return returned, updated(work, positions)


def updated(inputs: list, positions: Positions) -> tuple:
    """The MUTATES inputs of an argument list, in MUTATES order."""
    return tuple(inputs[i] for i, _ in positions)


def label(name: str) -> str:
    """How an in-place output is named in messages and draw records."""
    return f"{name} (in place)"


def leaves(answer: tuple[Any, tuple], positions: Positions) -> list[tuple[str, torch.Tensor]]:
    """(path, tensor) of every tensor of an answer: the returned ones (out, out[1], ...), then the in-place ones."""
    returned, inplace = answer
    found = [(p, t) for p, t in tt.flatten(returned) if isinstance(t, torch.Tensor)]
    return found + [(label(name), t) for (_, name), t in zip(positions, inplace)]


def aliased(returned: Any, inputs: list) -> list[str]:
    """Paths of returned tensors whose storage overlaps a tensor of `inputs` (a view of, or the same tensor as, one)."""
    spans = [_span(t) for t in inputs if isinstance(t, torch.Tensor) and t.numel()]
    found = []
    for path, t in tt.flatten(returned):
        if isinstance(t, torch.Tensor) and t.numel():
            device, lo, hi = _span(t)
            if any(d == device and lo < h and l < hi for d, l, h in spans):
                found.append(path)
    return found


def _span(t: torch.Tensor) -> tuple[str, int, int]:
    storage = t.untyped_storage()
    return str(t.device), storage.data_ptr(), storage.data_ptr() + storage.nbytes()
