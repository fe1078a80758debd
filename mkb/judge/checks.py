"""Correctness checks on the trusted side (DESIGN §5): structure, values against the fp64 anchor, guards.

Runs in the referee, which owns the inputs, the reference and the anchor; the candidate process
only ever contributes a description of what solve() returned and the bytes of each output.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from mkb import tensortree as tt
from mkb.records import Draw, TensorMismatch


def _named_type(qualified: str) -> type:
    module, _, name = qualified.rpartition(".")
    return type(name or "object", (), {"__module__": module or "builtins"})


def stand_in(desc: dict) -> Any:
    """An object with the structure a description names: containers, plain tensors, other types.

    Each plain tensor is a one-element expanded tensor on the described device, so that
    tensortree.structure_mismatch can compare it with the reference's own stand-in.
    """
    kind = desc.get("k")
    if kind == "list":
        return [stand_in(d) for d in desc["v"]]
    if kind == "tuple" and desc.get("type", "builtins.tuple") == "builtins.tuple":
        return tuple(stand_in(d) for d in desc["v"])
    if kind == "tensor" and desc.get("plain") and "shape" in desc:
        dtype = getattr(torch, desc["dtype"], None)
        device = desc["device"] if desc["device"] in ("cpu", "cuda") else "meta"
        if not isinstance(dtype, torch.dtype):
            return _named_type(f"torch.{desc['dtype']}")()
        return torch.empty(1, dtype=dtype, device=device).as_strided(desc["shape"], [0] * len(desc["shape"]))
    return _named_type(desc.get("type", "builtins.object"))()


def describe(obj: Any, device: str | None = None) -> dict:
    """The referee's own description of a structure, in the candidate's format (tensors on `device`)."""
    if isinstance(obj, (list, tuple)):
        return {"k": type(obj).__name__, "type": f"builtins.{type(obj).__name__}",
                "v": [describe(o, device) for o in obj]}
    if isinstance(obj, torch.Tensor):
        return {"k": "tensor", "plain": True, "shape": list(obj.shape),
                "dtype": str(obj.dtype).removeprefix("torch."), "device": device or obj.device.type,
                "type": "torch.Tensor"}
    return {"k": "value", "type": f"{type(obj).__module__}.{type(obj).__qualname__}"}


def structure_problem(candidate: dict, reference: dict) -> str | None:
    """The first structural difference between what solve() returned and the reference, or None."""
    return tt.structure_mismatch(stand_in(candidate), stand_in(reference))


def compare_draw(seed: int, out: Any, ref: Any, anchor: Any, factor: float) -> Draw:
    """Every output tensor against the anchor (tolerance rule), plus the degenerate-output guard."""
    tensors = []
    for (path, o), (_, r), (_, a) in zip(tt.flatten(out), tt.flatten(ref), tt.flatten(anchor)):
        c = tt.compare(path, o, r, a, factor)
        note = c.note
        ok = c.ok
        if ok and (flat := tt.degenerate(o, r)) is not None:
            ok, note = False, flat
        tensors.append(TensorMismatch(path=path, max_error=c.max_error, allowance=c.allowance, ok=ok, note=note))
    return Draw(seed=seed, ok=all(t.ok for t in tensors), tensors=tensors)


def first_failure(draw: Draw, index: int) -> str:
    """The message for a failed draw: where, and by how much."""
    bad = next(t for t in draw.tensors if not t.ok)
    return f"draw {index + 1}: {bad.path}: {bad.note}"


def digest(obj: Any) -> str:
    """A hash of the bytes of every tensor in a structure (to spot outputs that ignore new inputs)."""
    h = hashlib.blake2b(digest_size=16)
    for path, t in tt.flatten(obj):
        if isinstance(t, torch.Tensor):
            h.update(path.encode())
            h.update(memoryview(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()


def ignores_inputs(out_digests: list[str], ref_digests: list[str]) -> str | None:
    """A message when the latest output repeats an earlier draw's output though the references differ."""
    latest, latest_ref = out_digests[-1], ref_digests[-1]
    for i, (o, r) in enumerate(zip(out_digests[:-1], ref_digests[:-1])):
        if o == latest and r != latest_ref:
            return (f"draw {len(out_digests)}: output identical to draw {i + 1} although the inputs changed "
                    f"(solve ignores fresh inputs, e.g. caches results across calls)")
    return None


def changed(a: Any, b: Any) -> bool:
    """Whether two output structures differ in any bit."""
    return not tt.bitwise_equal(a, b)
