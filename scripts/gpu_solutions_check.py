#!/usr/bin/env python3
"""Check the shipped reference solutions (problems/solutions/<dsl>/pNN.py), standalone.

Two modes:

* ``--compile-only`` (no GPU needed; CI-like): import each solution, build its kernels for an explicit
  arch (default sm_90a) from smoke-scale CPU inputs through the solution's ``_prepare(*inputs,
  arch=...)`` hook; CuTe DSL compiles to a cubin inside the wheel, TIRx stops at CUDA C, which is
  then compiled to a cubin with nvcc (``-arch=sm_90a -cubin``).
* GPU (default): for each solution, in a fresh child process (a CUDA fault cannot poison the next
  one), run it on ``make_inputs(device="cuda", scale="full")`` for a few seeds, compare every output
  with the fp64 anchor (DESIGN §5 rule: max|out-anchor| <= factor*max(max|ref-anchor|,
  eps*max|anchor|), integers exact), and time solve and the eager reference with CUDA events (median
  of --reps after warm-up, same inputs).

Writes a JSON summary (a list of records) to --out.  This is a development tool; the judge records
that count are produced by scripts/validate_solutions.py through mkb.judge.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "problems" / "solutions"
DSLS = ("cutedsl", "tirx")


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def problem_path(pid: str) -> Path | None:
    num = int(pid.lstrip("p"))
    hits = sorted(glob.glob(str(ROOT / "problems" / "*" / f"{num:02d}_*.py")))
    return Path(hits[0]) if hits else None


def literal_meta(path: Path) -> dict:
    """SOL / EXACT / TOLERANCE read without importing (same rules as mkb.problems)."""
    sys.path.insert(0, str(ROOT))
    try:
        from mkb.problems import parse_problem
        info = parse_problem(path)
        return {"sol_flops": info.sol_flops, "sol_bytes": info.sol_bytes, "factor": info.tolerance_factor,
                "dtype": info.dtype}
    except Exception:  # noqa: BLE001  (a problem file in progress: fall back to defaults)
        return {"sol_flops": 0.0, "sol_bytes": 0.0, "factor": 3.0, "dtype": "?"}


def solution_list(problems: list[str] | None, dsls: list[str]) -> list[tuple[str, str, Path]]:
    out = []
    for dsl in dsls:
        for f in sorted((SOLUTIONS / dsl).glob("p[0-9][0-9].py")):
            pid = f.stem
            if problems and pid not in problems:
                continue
            out.append((pid, dsl, f))
    return out


# ------------------------------------------------------------------------------------------ compile
def compile_one(pid: str, dsl: str, path: Path, arch: str) -> dict:
    rec = {"problem": pid, "dsl": dsl, "mode": "compile", "arch": arch}
    t0 = time.time()
    try:
        import torch
        ppath = problem_path(pid)
        if ppath is None:
            raise FileNotFoundError(f"no problem file for {pid}")
        prob = load_module(ppath, f"prob_{pid}")
        torch.manual_seed(0)
        inputs = prob.make_inputs(device="cpu", scale="smoke")
        sol = load_module(path, f"sol_{dsl}_{pid}")
        built = sol._prepare(*inputs, arch=arch)
        rec["kernels"] = len(built)
        if dsl == "tirx":
            nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
            sizes = []
            with tempfile.TemporaryDirectory() as tmp:
                for i, exe in enumerate(built):
                    src = exe.mod.imports[0].inspect_source()
                    cu, cubin = Path(tmp) / f"k{i}.cu", Path(tmp) / f"k{i}.cubin"
                    cu.write_text(src)
                    r = subprocess.run([nvcc, f"-arch={arch}", "-cubin", "-O3", "--use_fast_math", "-w",
                                        "-o", str(cubin), str(cu)], capture_output=True, text=True)
                    if r.returncode != 0:
                        raise RuntimeError(f"nvcc failed on kernel {i}:\n{r.stderr[-3000:]}")
                    sizes.append(cubin.stat().st_size)
            rec["cubin_bytes"] = sizes
        rec["status"] = "compiled"
    except Exception as exc:  # noqa: BLE001
        rec["status"] = "compile_error"
        rec["message"] = f"{type(exc).__name__}: {exc}"[-4000:]
        rec["traceback"] = traceback.format_exc()[-6000:]
    rec["seconds"] = round(time.time() - t0, 2)
    return rec


# ------------------------------------------------------------------------------------------ GPU run
def cuda_ms(fn, reps: int, warmup: int) -> list[float]:
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return times


def run_one(pid: str, dsl: str, path: Path, seeds: list[int], reps: int) -> dict:
    import torch
    sys.path.insert(0, str(ROOT))
    from mkb import tensortree as tt

    rec = {"problem": pid, "dsl": dsl, "mode": "gpu"}
    ppath = problem_path(pid)
    meta = literal_meta(ppath)
    prob = load_module(ppath, f"prob_{pid}")
    rec["device"] = torch.cuda.get_device_name()
    t0 = time.time()
    try:
        sol = load_module(path, f"sol_{dsl}_{pid}")
    except Exception as exc:  # noqa: BLE001
        rec.update(status="import_error", message=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-4000:])
        return rec
    draws = []
    status = "passed"
    message = ""
    inputs = None
    for seed in seeds:
        torch.manual_seed(seed)
        inputs = prob.make_inputs(device="cuda", scale="full")
        keep = tt.clone(inputs)
        try:
            t1 = time.time()
            out = sol.solve(*inputs)
            torch.cuda.synchronize()
            first_s = time.time() - t1
        except Exception as exc:  # noqa: BLE001
            status, message = "runtime_error", f"{type(exc).__name__}: {exc}"[-3000:]
            rec["traceback"] = traceback.format_exc()[-6000:]
            break
        if not tt.bitwise_equal(inputs, keep):
            status, message = "incorrect", "solve modified its inputs"
        with tt.strict_precision():
            ref = prob.reference(*tt.clone(inputs))
            anchor = prob.reference(*tt.to_anchor(inputs))
        torch.cuda.synchronize()
        bad = tt.structure_mismatch(out, ref)
        if bad:
            status, message = "wrong_structure", bad
            break
        comps = []
        for (p, o), (_, r), (_, a) in zip(tt.flatten(out), tt.flatten(ref), tt.flatten(anchor)):
            c = tt.compare(p, o, r, a, meta["factor"])
            degen = tt.degenerate(o, r)
            comps.append({"path": p, "ok": c.ok and not degen, "max_error": c.max_error,
                          "allowance": c.allowance, "note": c.note or (degen or "")})
            if (not c.ok or degen) and status == "passed":
                status, message = "incorrect", f"seed {seed}: {p}: {c.note or degen}"
        draws.append({"seed": seed, "first_call_s": round(first_s, 3), "outputs": comps})
    rec["draws"] = draws
    if status == "passed" and inputs is not None:
        try:
            kt = cuda_ms(lambda: sol.solve(*inputs), reps, 3)
            one = min(kt)
            with tt.strict_precision():
                eager_reps = reps if one < 50 else 3
                et = cuda_ms(lambda: prob.reference(*inputs), max(3, min(eager_reps, int(2000 / max(one, 1e-3)) + 3)), 1)
            rec["kernel_ms"] = statistics.median(kt)
            rec["eager_ms"] = statistics.median(et)
            rec["speedup"] = rec["eager_ms"] / rec["kernel_ms"]
            sol_s = max(meta["sol_bytes"] / 4.3e12, 0.0)
            rec["sol_bytes_ms"] = meta["sol_bytes"] / 4.3e12 * 1e3
            rec["sol_flops"] = meta["sol_flops"]
            rec["sol_bytes"] = meta["sol_bytes"]
            rec["gbps"] = meta["sol_bytes"] / (rec["kernel_ms"] * 1e-3) / 1e9
            rec["tflops"] = meta["sol_flops"] / (rec["kernel_ms"] * 1e-3) / 1e12
            del sol_s
        except Exception as exc:  # noqa: BLE001
            status, message = "runtime_error", f"timing: {type(exc).__name__}: {exc}"[-3000:]
            rec["traceback"] = traceback.format_exc()[-6000:]
    rec["status"] = status
    rec["message"] = message
    rec["seconds"] = round(time.time() - t0, 2)
    return rec


def child(args) -> int:
    pid, dsl = args.one
    path = SOLUTIONS / dsl / f"{pid}.py"
    if args.compile_only:
        rec = compile_one(pid, dsl, path, args.arch)
    else:
        rec = run_one(pid, dsl, path, [int(s) for s in args.seeds.split(",")], args.reps)
    print("@@RESULT@@" + json.dumps(rec), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile-only", action="store_true", help="build for --arch without a GPU")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--problems", default="", help="comma list, e.g. p28,p25 (default: all shipped)")
    ap.add_argument("--dsl", default="cutedsl,tirx")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per solution")
    ap.add_argument("--out", default="", help="JSON summary path")
    ap.add_argument("--one", nargs=2, metavar=("PID", "DSL"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return child(args)
    todo = solution_list([p for p in args.problems.split(",") if p] or None, args.dsl.split(","))
    results = []
    for pid, dsl, _ in todo:
        cmd = [sys.executable, __file__, "--one", pid, dsl, "--arch", args.arch, "--seeds", args.seeds,
               "--reps", str(args.reps)] + (["--compile-only"] if args.compile_only else [])
        t0 = time.time()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            m = re.search(r"@@RESULT@@(.*)", r.stdout)
            rec = json.loads(m.group(1)) if m else {
                "problem": pid, "dsl": dsl, "status": "crashed",
                "message": f"rc={r.returncode}: {(r.stdout + r.stderr)[-3000:]}"}
        except subprocess.TimeoutExpired:
            rec = {"problem": pid, "dsl": dsl, "status": "timeout", "message": f">{args.timeout}s"}
        rec.setdefault("seconds", round(time.time() - t0, 2))
        results.append(rec)
        line = f"{pid:4s} {dsl:8s} {rec['status']:14s} {rec.get('seconds', 0):7.1f}s"
        if "speedup" in rec:
            line += (f"  kernel {rec['kernel_ms']:.4f} ms  eager {rec['eager_ms']:.3f} ms  x{rec['speedup']:.2f}"
                     f"  {rec['gbps']:.0f} GB/s {rec['tflops']:.1f} TFLOP/s")
        if rec.get("message"):
            line += "  | " + rec["message"].replace("\n", " ")[:300]
        print(line, flush=True)
        if rec["status"] not in ("passed", "compiled") and rec.get("traceback"):
            print(rec["traceback"][-2500:], flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
    ok = sum(r["status"] in ("passed", "compiled") for r in results)
    print(f"{ok}/{len(results)} ok", flush=True)
    return 0 if ok == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
