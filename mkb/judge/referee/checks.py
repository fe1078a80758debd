"""Correctness checks on the trusted side (DESIGN §5): structure, values against the fp64 anchor, guards.

Runs in the referee, which owns the inputs, the reference and the anchor; the candidate process
only ever contributes a description of what solve() returned and the bytes of each output.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from mkb import inplace
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
    if kind == "value" and desc.get("type") == "builtins.NoneType":
        return None  # a problem whose only outputs are in place returns None
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


def compare_draw(seed: int, out: Any, ref: Any, anchor: Any, factor: float,
                 positions: inplace.Positions = ()) -> Draw:
    """Every output tensor against the anchor (tolerance rule), plus the degenerate-output guard.

    out, ref and anchor are answers (returned, in-place outputs) as mkb.inplace describes them; the
    in-place outputs are judged exactly like returned ones.
    """
    tensors = []
    leaves = [inplace.leaves(answer, positions) for answer in (out, ref, anchor)]
    for (path, o), (_, r), (_, a) in zip(*leaves):
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
    """A hash of the bytes of every tensor in a structure (to spot outputs that ignore new inputs).

    Host tensors are hashed with BLAKE2b. GPU tensors are hashed where they are (copying p28's two
    238 MB outputs to the host per draw cost seconds): see gpu_fingerprint. A grading judges every
    draw in the same place, so its digests are comparable.
    """
    h = hashlib.blake2b(digest_size=16)
    for path, t in tt.flatten(obj):
        if isinstance(t, torch.Tensor):
            h.update(f"{path}:{t.dtype}:{tuple(t.shape)}:".encode())
            if t.is_cuda:
                h.update(repr(gpu_fingerprint(t)).encode())
            else:
                h.update(memoryview(_bytes(t).numpy()))
    return h.hexdigest()


FINGERPRINT_PRIMES = (2_147_483_629, 2_147_483_587)
"""Moduli (primes below 2**31) of gpu_fingerprint's two sums."""
_FINGERPRINT_CHUNK = 1 << 24


def gpu_fingerprint(t: torch.Tensor) -> tuple[int, ...]:
    """sum_i w_i * m_i mod P for each prime P, over the tensor's bytes read as int32 words w_i.

    The position weights m_i = 1 + (a_P * i + c_P) mod (P - 1) are never 0 mod P, so outputs that
    differ in a single word differ in at least one sum (the difference would have to be a multiple
    of both primes, and no two int32 words differ by that much). Equal bytes always give equal
    fingerprints, the direction the caching check relies on. The arithmetic is in int64 and never
    overflows, so the result is exact on any device. The trailing bytes that make no whole word
    are appended as they are.
    """
    b = _bytes(t)
    bulk = b.numel() - b.numel() % 4
    if b.storage_offset() % 4:
        b = b.clone()
    words = b[:bulk].view(torch.int32)
    sums = [0] * len(FINGERPRINT_PRIMES)
    for start in range(0, words.numel(), _FINGERPRINT_CHUNK):
        w = words[start:start + _FINGERPRINT_CHUNK].to(torch.int64)
        i = torch.arange(start, start + w.numel(), device=w.device, dtype=torch.int64)
        for k, prime in enumerate(FINGERPRINT_PRIMES):
            a, c = 1_000_003 + 2 * k, 7 + k
            weight = 1 + ((i % prime) * a + c) % (prime - 1)
            sums[k] = (sums[k] + int(((w % prime) * weight % prime).sum())) % prime
    return (*sums, *b[bulk:].tolist())


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat uint8 tensor, where it lives."""
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8)


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
