"""Side-by-side CPU check of our problems against the original MetaKernelBench problem files in the same slot.

Usage: python scripts/fidelity_side_by_side.py ORIGINAL_CHECKOUT [--slots 1,2,...] [--out FILE.json]

ORIGINAL_CHECKOUT is a checkout (or an export) of the original repository: the directory that holds its
problems/<family>/NN_*.py. Its files are imported from there at run time; nothing of them is kept here.
For each of the 32 slots whose original is a runnable problem file, one input set is drawn with OUR
make_inputs on the CPU, cloned, and handed to both references in the same argument order (the originals
take their arguments in our order; the driver checks the arity). Both runs are compared output by output:
count, order, dtype, shape and values, natively and on the fp64 anchor (f16/bf16/f32 inputs upcast, as the
judge does). Outputs the original returns as an input it updated in place are matched with that input after
our reference's call (our MUTATES). Then the full-scale workloads are compared: our make_inputs(scale="full")
against the original's make_inputs(), both drawn on the meta device where their code allows, else on the CPU.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mkb.tensortree import clone, eps, flatten, to_anchor  # noqa: E402

SLOTS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 28, 36, 44,
         68, 69, 70, 71, 72, 73, 74)
"""Slots whose original is a problem file (the other 42 are recipes with hidden reference bodies)."""

FP64_REL_TOL = 1e-9
"""fp64 anchor: both references are exact maths in another evaluation order; 1e-9 of the output's scale."""
NATIVE_ULPS = 2.0
"""Native run, 16-bit outputs: they may differ by a rounding of the last bit (the accumulation order)."""
FP32_NATIVE_REL_TOL = 1e-5
"""Native run, fp32 outputs: long recurrences (p71's 890 steps) drift by a few ulps with the order."""


@dataclass
class Workload:
    """How one slot's side-by-side inputs are drawn, when our smoke inputs do not fit the original."""

    scale: str = "smoke"
    """'smoke', or 'full' (our full-scale draw, on the CPU), or 'patched' (full dims, shorter workload)."""
    patch: dict[str, Any] = field(default_factory=dict)
    """Our module's workload constants replaced for a 'patched' draw (lengths, pool sizes; never dims)."""
    why: str = ""
    reduce: Callable[[list], list] | None = None
    """Applied to a full-scale draw to keep a slice of a dimension the original leaves free (tokens)."""


def _first_tokens(n: int) -> Callable[[list], list]:
    """p44: keep n tokens of the logits, the activations and their [hidden/128, tokens] scales."""
    def cut(inputs: list) -> list:
        out = list(inputs)
        out[0], out[2], out[3] = out[0][:n].clone(), out[2][:n].clone(), out[3][:, :n].contiguous()
        return out
    return cut


# The originals assert their head counts and dims (and some use module constants for the token count), so
# our smoke inputs, which shrink them, cannot be passed to them. There we draw with our make_inputs at the
# full dims, with the workload (sequence lengths, pool) cut down through our module's own constants.
WORKLOADS = {
    1: Workload("patched", {"KV_INDPTR": (0, 37, 40, 101), "NUM_PAGES": 300}, "original asserts 32/8 heads"),
    2: Workload("patched", {"KV_INDPTR": (0, 37, 40, 101), "NUM_PAGES": 300}, "original asserts 5/1 heads"),
    3: Workload("patched", {"KV_INDPTR": tuple(range(0, 129, 2)), "NUM_PAGES": 200},
                "original asserts 32/8 heads, page 64; our last-page lengths stay the full (1,) * 64"),
    4: Workload("patched", {"QO_INDPTR": (0, 37, 40, 101), "KV_INDPTR": (0, 37, 40, 101), "NUM_PAGES": 300},
                "original asserts 24/8 heads"),
    5: Workload("patched", {"QO_INDPTR": (0, 5, 40, 41), "KV_INDPTR": (0, 7, 60, 61), "NUM_PAGES": 300},
                "original asserts 5/1 heads"),
    6: Workload("patched", {"QO_INDPTR": (0, 3, 90, 160), "KV_INDPTR": (0, 1, 3, 5),
                            "KV_LAST_PAGE_LEN": (3, 23, 6), "NUM_PAGES": 40}, "original asserts 24/8 heads, page 64"),
    7: Workload("patched", {"QO_INDPTR": (0, 3, 90, 160), "KV_INDPTR": (0, 1, 3, 5),
                            "KV_LAST_PAGE_LEN": (3, 23, 6), "NUM_PAGES": 40}, "original asserts 16/1 heads, page 64"),
    8: Workload("patched", {"Q_LENS": (5, 1, 70), "PREFIX_LENS": (0, 3, 9)}, "original asserts 16/2 heads"),
    9: Workload("patched", {"Q_LENS": (5, 1, 70), "PREFIX_LENS": (0, 3, 9)}, "original asserts 8/1 heads, d256"),
    14: Workload("patched", {"KV_INDPTR": (0, 37, 40, 101), "NUM_PAGES": 300}, "original asserts 16 heads"),
    15: Workload("patched", {"QO_INDPTR": (0, 5, 40, 41), "KV_INDPTR": (0, 7, 60, 61), "NUM_PAGES": 300},
                 "original asserts 16 heads"),
    16: Workload("patched", {"Q_LENS": (5, 1, 40), "PREFIX_LEN": 256}, "original asserts 16 heads"),
    17: Workload("full", why="original asserts 16 heads, page 64, top-k 2048"),
    18: Workload("full", why="original asserts 64 heads, page 64"),
    19: Workload("full", why="original reads its module's head counts and block size"),
    20: Workload("full", why="original reads its module's token count"),
    21: Workload("full", why="original reads its module's block size"),
    22: Workload("full", why="original reads its module's token count"),
    23: Workload("full", why="original reads its module's block size"),
    24: Workload("full", why="original reads its module's block size and dims"),
    26: Workload("full", why="original reads its module's block sizes and token count"),
    28: Workload("full", why="original asserts hidden 4096"),
    44: Workload("full", reduce=_first_tokens(48),
                 why="original asserts hidden 7168 / 32 local experts; the token count is free: first 48 tokens"),
    71: Workload("full", why="original asserts 8/8/16 heads, head size 128"),
    72: Workload("full", why="original asserts 8/8/16 heads, head size 128"),
    73: Workload("full", why="original asserts 8/8/16 heads, head size 128"),
}


@dataclass
class OutputCheck:
    """One output of the original compared with ours."""

    index: int
    source: str
    """'returned[i]' (our i-th returned output) or 'input:NAME' (our MUTATES input after the call)."""
    dtype: str
    shape: list[int]
    ok: bool
    max_error_native: float | None
    max_error_fp64: float | None
    note: str = ""


@dataclass
class SlotRecord:
    """The side-by-side outcome of one slot."""

    slot: int
    ours: str
    original: str
    verdict: str
    """'match', 'mismatch' or 'not comparable'."""
    inputs: str
    outputs: list[OutputCheck] = field(default_factory=list)
    returns: str = ""
    """The containers both references return (in-place outputs are graded through MUTATES in ours)."""
    constants: list[str] = field(default_factory=list)
    full_scale: list[str] = field(default_factory=list)
    full_scale_devices: str = ""
    max_error_native: float | None = None
    """Worst output error relative to the output's scale, native dtypes."""
    max_error_fp64: float | None = None
    """Worst output error relative to the output's scale, both references on the fp64 anchor."""
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def load(path: Path, name: str):
    """Import one problem file as a fresh module."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def find(root: Path, slot: int) -> Path:
    """The file of a slot under root/problems/<family>/NN_*.py."""
    hits = sorted((root / "problems").glob(f"*/{slot:02d}_*.py"))
    if len(hits) != 1:
        raise SystemExit(f"slot {slot}: expected one file under {root}/problems, found {hits}")
    return hits[0]


def draw_ours(ours, slot: int) -> tuple[list, str]:
    """Our inputs for the side-by-side run and a sentence saying how they were drawn."""
    workload = WORKLOADS.get(slot, Workload())
    torch.manual_seed(1000 + slot)
    if workload.scale == "smoke":
        return ours.make_inputs(device="cpu", scale="smoke"), "our make_inputs(scale='smoke') on the CPU"
    saved = {name: getattr(ours, name) for name in workload.patch}
    try:
        for name, value in workload.patch.items():
            setattr(ours, name, value)
        inputs = ours.make_inputs(device="cpu", scale="full")
    finally:
        for name, value in saved.items():
            setattr(ours, name, value)
    if workload.reduce is not None:
        inputs = workload.reduce(inputs)
    patched = ", ".join(f"{k}={v}" for k, v in workload.patch.items())
    return inputs, (f"our make_inputs(scale='full') on the CPU" + (f" with {patched}" if patched else "")
                    + f" ({workload.why})")


_SHAPES: dict[str, str] = {}
"""The container each reference returned in the latest run (a tuple of n, a tensor, None)."""


def _structure(result: Any) -> str:
    if isinstance(result, (tuple, list)):
        return f"{type(result).__name__} of {len(result)}"
    return "None" if result is None else type(result).__name__


def outputs_with_inplace(module, inputs: list, mutates: tuple[str, ...]) -> tuple[list, dict[int, Any]]:
    """Call a reference; return its outputs as a list, and the inputs it names in MUTATES after the call."""
    import inspect
    names = list(inspect.signature(module.reference).parameters)
    result = module.reference(*inputs)
    _SHAPES["ours"] = _structure(result) + (f" (+ in place: {', '.join(mutates)})" if mutates else "")
    returned = [] if result is None else list(result) if isinstance(result, (tuple, list)) else [result]
    updated = {names.index(name): inputs[names.index(name)] for name in mutates}
    return returned, updated


def match_outputs(orig_out: list, orig_inputs: list, ours_returned: list, ours_updated: dict[int, Any],
                  names: list[str]) -> list[tuple[int, str, Any, Any]]:
    """Pair each original output with ours: an alias of an original input pairs with our updated input."""
    pairs, next_returned = [], 0
    for i, out in enumerate(orig_out):
        alias = next((j for j, x in enumerate(orig_inputs) if isinstance(x, torch.Tensor) and x is out), None)
        if alias is not None and alias in ours_updated:
            pairs.append((i, f"input:{names[alias]}", out, ours_updated[alias]))
        elif next_returned < len(ours_returned):
            pairs.append((i, f"returned[{next_returned}]", out, ours_returned[next_returned]))
            next_returned += 1
        else:
            pairs.append((i, "missing", out, None))
    for extra in ours_returned[next_returned:]:
        pairs.append((-1, "extra output of ours", None, extra))
    return pairs


def scaled_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over max(max |a|, tiny): the error relative to the output's scale (exact dtypes: 0 or 1)."""
    if not (a.dtype.is_floating_point or a.dtype.is_complex):
        return 0.0 if torch.equal(a, b) else 1.0
    x, y = a.double(), b.double()
    if not torch.equal(torch.isfinite(x), torch.isfinite(y)) or not torch.equal(x[~torch.isfinite(x)],
                                                                                 y[~torch.isfinite(y)]):
        return float("inf")
    finite = torch.isfinite(x)
    if not bool(finite.any()):
        return 0.0
    scale = max(float(x[finite].abs().max()), 1e-30)
    return float((x[finite] - y[finite]).abs().max()) / scale


def run_pair(orig, ours, inputs: list) -> tuple[list, list, list, dict[int, Any], list[str]]:
    """Both references on their own copies of the same inputs."""
    import inspect
    names = list(inspect.signature(ours.reference).parameters)
    orig_inputs = clone(inputs)
    orig_out = orig.reference(*orig_inputs)
    _SHAPES["original"] = _structure(orig_out)
    orig_out = list(orig_out) if isinstance(orig_out, (tuple, list)) else [orig_out]
    ours_returned, ours_updated = outputs_with_inplace(ours, clone(inputs), getattr(ours, "MUTATES", ()))
    return orig_out, orig_inputs, ours_returned, ours_updated, names


def compare_slot(orig, ours, inputs: list, record: SlotRecord) -> None:
    """Run both references natively and on the fp64 anchor, and fill record.outputs."""
    native = run_pair(orig, ours, inputs)
    record.returns = f"original: {_SHAPES['original']}; ours: {_SHAPES['ours']}"
    anchor = run_pair(orig, ours, to_anchor(inputs))
    pairs_native = match_outputs(*native)
    pairs_anchor = match_outputs(*anchor)
    for (i, source, o, u), (_, _, o64, u64) in zip(pairs_native, pairs_anchor):
        if o is None or u is None:
            record.outputs.append(OutputCheck(i, source, "", [], False, None, None,
                                              "only in ours" if o is None else "not produced by ours"))
            continue
        note = []
        if tuple(o.shape) != tuple(u.shape):
            note.append(f"shape original {tuple(o.shape)} vs ours {tuple(u.shape)}")
        if o.dtype != u.dtype:
            note.append(f"dtype original {o.dtype} vs ours {u.dtype}")
        if o64.dtype != u64.dtype:
            note.append(f"fp64-anchor dtype original {o64.dtype} vs ours {u64.dtype}")
        if note and tuple(o.shape) != tuple(u.shape):
            record.outputs.append(OutputCheck(i, source, str(o.dtype), list(o.shape), False, None, None,
                                              "; ".join(note)))
            continue
        err = scaled_error(o, u.to(o.dtype))
        err64 = scaled_error(o64, u64.to(o64.dtype))
        allowance = (0.0 if not o.dtype.is_floating_point else FP32_NATIVE_REL_TOL if o.dtype.itemsize >= 4
                     else NATIVE_ULPS * eps(o.dtype))
        ok = not note and err <= allowance and err64 <= (FP64_REL_TOL if o64.dtype.is_floating_point else 0.0)
        record.outputs.append(OutputCheck(i, source, str(o.dtype).removeprefix("torch."), list(o.shape), ok,
                                          err, err64, "; ".join(note)))


class _DeviceMap(TorchFunctionMode):
    """Sends every tensor the original's make_inputs creates on 'cuda' to another device instead."""

    def __init__(self, target: str):
        super().__init__()
        self.target = torch.device(target)

    def _map(self, value):
        if isinstance(value, torch.device) and value.type == "cuda":
            return self.target
        if isinstance(value, str) and value.startswith("cuda"):
            return self.target
        return value

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = {k: self._map(v) for k, v in (kwargs or {}).items()}
        args = tuple(self._map(a) for a in args)
        return func(*args, **kwargs)


def draw_full(draw: Callable[[str], list]) -> tuple[list, str]:
    """A full-scale draw on the meta device, else on the CPU (code that reads values needs real tensors)."""
    try:
        return draw("meta"), "meta"
    except (NotImplementedError, RuntimeError, ValueError, TypeError):
        return draw("cpu"), "cpu"


def compare_full_scale(orig, ours, slot: int, record: SlotRecord) -> None:
    """Compare the full-scale argument lists: count, then per position type, shape, dtype or value."""
    def draw_orig(device):
        torch.manual_seed(slot)
        with _DeviceMap(device):
            return orig.make_inputs()

    def draw_ours(device):
        torch.manual_seed(slot)
        return ours.make_inputs(device=device, scale="full")

    start = time.perf_counter()
    orig_full, orig_dev = draw_full(draw_orig)
    orig_s = time.perf_counter() - start
    ours_full, ours_dev = draw_full(draw_ours)
    if orig_s < 10.0:  # a second draw shows shapes the original redraws (p24's block-table width)
        for seed in range(1, 9):
            torch.manual_seed(slot + 100 * seed)
            with _DeviceMap(orig_dev):
                other = orig.make_inputs()
            for i, (a, b) in enumerate(zip(orig_full, other)):
                if isinstance(a, torch.Tensor) and tuple(a.shape) != tuple(b.shape):
                    record.notes.append(f"full scale, original arg {i}: shape varies per draw "
                                        f"({tuple(a.shape)} and {tuple(b.shape)} seen); ours {tuple(ours_full[i].shape)}")
    record.full_scale_devices = f"original on {orig_dev}, ours on {ours_dev}"
    if len(orig_full) != len(ours_full):
        record.full_scale.append(f"argument count: original {len(orig_full)}, ours {len(ours_full)}")
    for i, (o, u) in enumerate(zip(orig_full, ours_full)):
        if isinstance(o, torch.Tensor) and isinstance(u, torch.Tensor):
            if tuple(o.shape) != tuple(u.shape) or o.dtype != u.dtype:
                record.full_scale.append(f"arg {i}: original {o.dtype} {tuple(o.shape)}, ours {u.dtype} {tuple(u.shape)}")
        elif isinstance(o, torch.Tensor) != isinstance(u, torch.Tensor):
            record.full_scale.append(f"arg {i}: original {type(o).__name__}, ours {type(u).__name__}")
        else:
            record.constants.append(f"arg {i}: {'same' if o == u else 'DIFFERS'} (original {o!r}, ours {u!r})")


def compare_constants(orig, ours, record: SlotRecord) -> None:
    """Module constants both files define under the same name (workload tuples, scales, eps, dims)."""
    def constants(module):
        return {k: v for k, v in vars(module).items()
                if k.isupper() and isinstance(v, (int, float, str, tuple, list)) and not isinstance(v, bool)}
    mine, theirs = constants(ours), constants(orig)
    for name in sorted(theirs.keys() & mine.keys()):
        same = theirs[name] == mine[name]
        shown = theirs[name] if len(repr(theirs[name])) < 60 else f"{repr(theirs[name])[:56]}..."
        record.constants.append(f"{name}: {'same' if same else 'DIFFERS'} (original {shown}"
                                + ("" if same else f", ours {mine[name]!r}") + ")")


def check_slot(original_root: Path, slot: int) -> SlotRecord:
    """One slot: the side-by-side run, the output comparison and the full-scale comparison."""
    start = time.perf_counter()
    orig_path, ours_path = find(original_root, slot), find(ROOT, slot)
    orig, ours = load(orig_path, f"orig_p{slot:02d}"), load(ours_path, f"ours_p{slot:02d}")
    inputs, how = draw_ours(ours, slot)
    record = SlotRecord(slot, str(ours_path.relative_to(ROOT)), str(orig_path.relative_to(original_root)),
                        "not comparable", how)
    import inspect
    n_orig = len(inspect.signature(orig.reference).parameters)
    n_ours = len(inspect.signature(ours.reference).parameters)
    if n_orig != n_ours:
        record.notes.append(f"reference arity: original {n_orig}, ours {n_ours}")
    else:
        try:
            compare_slot(orig, ours, inputs, record)
        except Exception as exc:  # the original rejected our inputs: recorded, not raised
            record.notes.append(f"side-by-side run failed: {type(exc).__name__}: {exc}")
    compare_constants(orig, ours, record)
    try:
        compare_full_scale(orig, ours, slot, record)
    except Exception as exc:
        record.notes.append(f"full-scale comparison failed: {type(exc).__name__}: {exc}")
    errors = [o for o in record.outputs if o.max_error_native is not None]
    if errors:
        record.max_error_native = max(o.max_error_native for o in errors)
        record.max_error_fp64 = max(o.max_error_fp64 for o in errors)
    if record.outputs:
        diff = record.full_scale or any("DIFFERS" in c for c in record.constants)
        record.verdict = "match" if all(o.ok for o in record.outputs) and not diff else "mismatch"
    record.wall_s = round(time.perf_counter() - start, 2)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("original", type=Path, help="checkout of the original (holds problems/<family>/NN_*.py)")
    parser.add_argument("--slots", default=",".join(map(str, SLOTS)))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)
    records = []
    for slot in (int(s) for s in args.slots.split(",")):
        record = check_slot(args.original, slot)
        worst = max((o.max_error_native or 0.0 for o in record.outputs), default=None)
        print(f"p{slot:02d} {record.verdict:15s} {record.wall_s:7.1f}s outputs={len(record.outputs)} "
              f"worst_native={worst} notes={record.notes} full={record.full_scale}", file=sys.stderr)
        records.append(asdict(record))
    text = json.dumps({"torch": torch.__version__, "slots": records}, indent=1, allow_nan=True)
    if args.out:
        args.out.write_text(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
