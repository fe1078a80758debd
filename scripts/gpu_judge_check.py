#!/usr/bin/env python3
"""Grade every GPU judge fixture (and the valid DSL kernels) on a real GPU; write the judge records as JSON.

One call on the GPU machine, from the repository root:

    PYTHONPATH=. python3 scripts/gpu_judge_check.py results/gpu_judge_records.json [--bench 5] [--only NAME ...]

Needs torch with CUDA, nvidia-cutlass-dsl, apache-tvm and pydantic (click/rich for `mkb`). Each
fixture in tests/kernels/gpu_*.py names its expected status in its docstring; the CPU hack fixtures
are graded on the GPU too, with the statuses they must get there. Prints one line per grading on
stderr and exits 0 when every status is as expected. With --bench N it also measures the judge:
overhead per evaluation and the spread of speedup over N gradings of each valid kernel, in the
paper and flushed timing modes (this is `mkb bench judge`).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "tests" / "kernels"
sys.path.insert(0, str(ROOT))

ON_GPU = {
    "wrong_structure": "wrong_structure", "zeros": "incorrect", "constant": "incorrect", "caching": "incorrect",
    "lazy_output": "wrong_structure", "input_mutation": "incorrect", "alias_output": "incorrect",
    "nan_output": "incorrect", "runtime_error": "runtime_error", "import_error": "import_error",
    "crash_segfault": "crashed", "os_exit": "crashed", "hang": "timeout", "huge_output": "policy_violation",
    "timer_patch_hidden": "policy_violation", "valid_torch_p28": "policy_violation",
    "reference_call": "policy_violation", "inplace_wrong_slot": "incorrect", "inplace_skipped": "incorrect",
    "inplace_moves_source": "incorrect", "inplace_returns_copy": "wrong_structure",
}
"""CPU fixtures graded on the GPU as cutedsl kernels, with the status each must get there (torch-only
kernels have no DSL kernel on a GPU, so they are policy violations there)."""
VALID = ("gpu_cutedsl_p28", "gpu_cutedsl_p32", "gpu_tirx_p28", "gpu_tirx_p32")


def facts(path: Path) -> dict:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    found = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in doc.splitlines()[1:]) if v}
    return {"problem": found.get("problem"), "dsl": found.get("dsl"), "expected": found.get("expected"),
            "timeout": float(found.get("timeout", 600)), "hack": doc.splitlines()[0] if doc else ""}


def plan(only: list[str]) -> list[dict]:
    """Every grading to run, most informative first: valid kernels, GPU hacks, CPU hacks, flushed mode."""
    runs = []
    gpu = {path.stem: facts(path) for path in sorted(KERNELS.glob("gpu_*.py"))}
    for name in VALID:
        runs.append({"fixture": name, **gpu[name], "scale": "full", "timing": "paper"})
    for name, f in gpu.items():
        if name not in VALID:
            runs.append({"fixture": name, **f, "scale": "smoke", "timing": "paper"})
    for name, expected in ON_GPU.items():
        f = facts(KERNELS / f"{name}.py")
        dsl = "tirx" if f["dsl"] == "tirx" else "cutedsl"
        runs.append({"fixture": name, **f, "dsl": dsl, "expected": expected, "scale": "smoke", "timing": "paper"})
    for name in VALID:
        runs.append({"fixture": name, **gpu[name], "scale": "full", "timing": "flushed"})
    return [r for r in runs if not only or r["fixture"] in only]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="where to write the JSON records")
    parser.add_argument("--bench", type=int, default=0, help="also run N gradings per valid kernel and mode")
    parser.add_argument("--only", nargs="*", default=[], help="grade only these fixtures")
    parser.add_argument("--bench-kernels", nargs="*", default=list(VALID), help="valid kernels to benchmark")
    parser.add_argument("--no-flushed", action="store_true", help="skip the flushed-mode gradings of valid kernels")
    args = parser.parse_args()
    try:
        import torch

        from mkb.environment import describe
        from mkb.judge import grade
        from mkb.problems import catalog_for, resolve
    except ImportError as exc:
        print(f"missing a package: {exc}. Stage the toolchains (../shared/device/stage-toolchains.sh pydantic==2.14.4)",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("no CUDA GPU visible: run this on the GPU machine", file=sys.stderr)
        return 2
    catalog = catalog_for(ROOT / "problems")
    out = {"environment": describe(), "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "records": [], "bench": []}
    ok_all = True
    runs = [r for r in plan(args.only) if not (args.no_flushed and r["timing"] == "flushed")]
    for run in runs:
        started = time.monotonic()
        try:
            record = grade(resolve(run["problem"], catalog), KERNELS / f"{run['fixture']}.py", run["dsl"],
                           device="cuda", timing=run["timing"], scale=run["scale"], timeout_s=run["timeout"])
            data = record.model_dump(mode="json")
        except Exception:  # a judge bug must not hide the other fixtures' results
            data = {"status": "judge_exception", "message": traceback.format_exc()[-3000:]}
        ok = data["status"] == run["expected"]
        ok_all &= ok
        out["records"].append({**run, "ok": ok, "record": data})
        timing = (f" kernel {data['kernel_ms']:.4f} ms eager {data['eager_ms']:.4f} ms speedup {data['speedup']:.3f}"
                  if data.get("kernel_ms") else "")
        print(f"{'OK ' if ok else 'BAD'} {run['fixture']:<24} {run['timing']:<7} {run['scale']:<5} "
              f"expected {run['expected']:<16} got {data['status']:<16} {time.monotonic() - started:6.1f}s{timing} "
              f"| {data.get('message', '')[:160]}", file=sys.stderr, flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    if args.bench:
        from mkb.cli.bench_cmd import summarize

        for name in args.bench_kernels:
            f = facts(KERNELS / f"{name}.py")
            for mode in ("paper", "flushed"):
                records = [grade(resolve(f["problem"], catalog), KERNELS / f"{name}.py", f["dsl"], device="cuda",
                                 timing=mode) for _ in range(args.bench)]
                row = {"fixture": name, **summarize(mode, records)}
                out["bench"].append(row)
                print(f"BENCH {name:<18} {mode:<7} {json.dumps({k: row.get(k) for k in ('passed', 'kernel_ms', 'speedup_median', 'spread_pct', 'overhead_s')}, default=str)}",
                      file=sys.stderr, flush=True)
                Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    n_ok = sum(r["ok"] for r in out["records"])
    print(f"{n_ok}/{len(out['records'])} gradings as expected; records in {args.out}", file=sys.stderr)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
