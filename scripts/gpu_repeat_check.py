#!/usr/bin/env python3
"""Does a solution give the same bits every time on the same inputs? A GPU check for races (issue #20: p61 CuTe DSL).

    PYTHONPATH=. python3 scripts/gpu_repeat_check.py OUT.json p61:cutedsl p61:tirx [--calls 200] [--pending]

For each variant, outside the judge (the shipped file imported directly, as solutions_standalone.py does): two input
sets A and B of the problem at full scale, then solve() called on A, B, A, B, ... as the judge's timed calls rotate
through their pool (a stale tile of the previous call's data would show here). Every answer on A is compared bit for
bit with the first one on A, and so for B; the record keeps how many differed, the largest difference, and the
calls where it happened. A race shows as answers that differ; a kernel whose own arithmetic is deterministic (no
atomics) gives none. Exits 1 when any variant's answers differed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mkb.problems import catalog_for, load_module, resolve  # noqa: E402
from mkb.tensortree import flatten  # noqa: E402


def _tensors(obj) -> list[torch.Tensor]:
    return [t for _, t in flatten(obj) if isinstance(t, torch.Tensor)]


def _differs(a: list[torch.Tensor], b: list[torch.Tensor]) -> float | None:
    """The largest absolute difference where the bits differ (inf for a NaN on one side), or None when equal."""
    worst = None
    for x, y in zip(a, b):
        if x.shape == y.shape and torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)):
            continue
        d = (x.double() - y.double()).abs().nan_to_num(float("inf")).max().item()
        worst = d if worst is None else max(worst, d)
    return worst


def check(problem: str, dsl: str, calls: int, pending: bool) -> dict:
    catalog = catalog_for(ROOT / "problems")
    module = load_module(resolve(problem, catalog))
    base = ROOT / "problems" / "solutions"
    path = base / "pending" / dsl / f"{problem}.py" if pending and (base / "pending" / dsl / f"{problem}.py").exists() \
        else base / dsl / f"{problem}.py"
    spec = importlib.util.spec_from_file_location(f"solution_{problem}_{dsl}", path)
    solution = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(solution)
    sets = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        sets.append(module.make_inputs(device="cuda", scale="full"))
    started = time.perf_counter()
    found = repeat(solution.solve, sets, calls, torch.cuda.synchronize)
    return {"problem": problem, "dsl": dsl, "file": str(path.relative_to(ROOT)), "calls": calls, **found,
            "seconds": round(time.perf_counter() - started, 1)}


def repeat(solve, sets: list, calls: int, sync=lambda: None) -> dict:
    """solve() on sets[0], sets[1], sets[0], ... (each restored to its first content before its call); every answer
    compared bit for bit with the first answer on the same set."""
    pristine = [[t.clone() for t in _tensors(s)] for s in sets]
    first: list = [None] * len(sets)
    differing, worst = [], None
    for k in range(calls):
        which = k % len(sets)
        for t, keep in zip(_tensors(sets[which]), pristine[which]):  # inputs as drawn, as the judge's refill does
            t.copy_(keep)
        out = [t.clone() for t in _tensors(solve(*sets[which]))]
        sync()
        if first[which] is None:
            first[which] = out
            continue
        d = _differs(first[which], out)
        if d is not None:
            differing.append(k + 1)
            worst = d if worst is None else max(worst, d)
    return {"differing_calls": len(differing), "first_differing": differing[:20], "max_abs_diff": worst}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("variants", nargs="+", help="problem:dsl, e.g. p61:cutedsl")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--pending", action="store_true", help="a pending file of the same name instead of the shipped one")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no GPU: this check runs solutions on one", file=sys.stderr)
        return 2
    results = []
    for variant in args.variants:
        problem, _, dsl = variant.partition(":")
        try:
            results.append(check(problem, dsl, args.calls, args.pending))
        except Exception as exc:  # one variant's failure is recorded, the others still run
            results.append({"problem": problem, "dsl": dsl, "error": f"{type(exc).__name__}: {exc}"[:1000]})
        print(json.dumps(results[-1]), flush=True)
        torch.cuda.empty_cache()
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 1 if any(r.get("differing_calls") or r.get("error") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
