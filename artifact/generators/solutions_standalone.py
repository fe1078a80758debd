#!/usr/bin/env python3
"""Check the shipped reference solutions (problems/solutions/<dsl>/pNN.py), standalone.

Two modes:

* ``--compile-only`` (no GPU needed; CI-like): import each solution, build its kernels for an explicit
  arch (default sm_90a) from smoke-scale CPU inputs through the solution's ``_prepare(*inputs,
  arch=...)`` hook; CuTe DSL compiles to a cubin inside the wheel, TIRx stops at CUDA C, which is
  then compiled to a cubin with nvcc (``-arch=sm_90a -cubin``).
  Where make_inputs also works on the meta device, the full-scale shapes are built too.
* GPU (default): one child process per problem (a CUDA fault cannot poison the next one; --jobs N run
  in parallel, timing serialised by a lock) runs both DSL variants on
  ``make_inputs(device="cuda", scale="full")`` for --seeds, compares every output with the fp64 anchor
  (DESIGN §5 rule: max|out-anchor| <= factor*max(max|ref-anchor|, eps*max|anchor|), integers exact;
  for problems above --anchor-max-flops the costly fp64 anchor is skipped and only the eps term is
  checked against the reference), and times solve and the eager reference with CUDA events (median
  of --reps after warm-up, same inputs).

Writes a JSON summary (a list of records) to --out.  This is a development tool; the judge records
that count are produced by artifact/generators/validate_solutions.py through mkb.judge.
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

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "problems" / "solutions"
DEVICE = os.environ.get("MKB_CHECK_DEVICE", "cuda")    # "cpu" only to test this harness with torch-only stand-ins
SCALE = os.environ.get("MKB_CHECK_SCALE", "full")
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
        built = list(sol._prepare(*inputs, arch=arch))
        try:        # full-scale shapes too, where make_inputs works on the meta device (no data needed)
            full = prob.make_inputs(device="meta", scale="full")
        except Exception:  # noqa: BLE001  (data-dependent input generation: smoke shapes only)
            full = None
        if full is not None:
            built += [b for b in sol._prepare(*full, arch=arch) if all(b is not o for o in built)]
        rec["full_shapes"] = full is not None
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
def _sync():
    import torch
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def cuda_ms(fn, reps: int, warmup: int) -> list[float]:
    import torch
    for _ in range(warmup):
        fn()
    if DEVICE != "cuda":
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return times
    _sync()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        _sync()
        s.record()
        fn()
        e.record()
        _sync()
        times.append(s.elapsed_time(e))
    return times


def run_problem(pid: str, dsls: list[str], seeds: list[int], reps: int, anchor_max_flops: float,
                lock_path: str | None) -> list[dict]:
    """Both DSL variants of one problem in this process: inputs, reference and anchor made once per seed."""
    import fcntl
    import torch
    sys.path.insert(0, str(ROOT))
    from mkb import inplace
    from mkb import tensortree as tt
    from mkb.problems import mutated_positions, parse_problem

    ppath = problem_path(pid)
    meta = literal_meta(ppath)
    prob = load_module(ppath, f"prob_{pid}")
    positions = mutated_positions(parse_problem(ppath), prob.reference)  # MUTATES inputs, graded after the call
    allowed = {f"in[{i}]" for i, _ in positions}
    recs, sols = {}, {}
    for dsl in dsls:
        recs[dsl] = {"problem": pid, "dsl": dsl, "mode": "gpu", "device": torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE,
                     "status": "passed", "message": "", "draws": []}
        t0 = time.time()
        try:
            sols[dsl] = load_module(SOLUTIONS / dsl / f"{pid}.py", f"sol_{dsl}_{pid}")
        except Exception as exc:  # noqa: BLE001
            recs[dsl].update(status="import_error", message=f"{type(exc).__name__}: {exc}"[-3000:],
                             traceback=traceback.format_exc()[-4000:])
        recs[dsl]["import_s"] = round(time.time() - t0, 2)
    use_anchor = meta["sol_flops"] <= anchor_max_flops
    inputs = None
    for seed in seeds:
        torch.manual_seed(seed)
        inputs = prob.make_inputs(device=DEVICE, scale=SCALE)
        keep = tt.clone(inputs)
        with tt.strict_precision():
            ref = inplace.run(prob.reference, inputs, positions)
            anchor = inplace.run(prob.reference, tt.to_anchor(inputs), positions, copy=False) if use_anchor else None
        _sync()
        for dsl, sol in sols.items():
            rec = recs[dsl]
            if rec["status"] != "passed":
                continue
            try:
                t1 = time.time()
                out = sol.solve(*inputs)
                _sync()
                first_s = time.time() - t1
                out = (out, tuple(t.clone() for t in inplace.updated(inputs, positions)))
            except Exception as exc:  # noqa: BLE001
                rec.update(status="runtime_error", message=f"seed {seed}: {type(exc).__name__}: {exc}"[-3000:],
                           traceback=traceback.format_exc()[-6000:])
                if "CUDA" in str(exc) or "illegal" in str(exc).lower():
                    raise
                continue
            changed = [p for (p, a), (_, b) in zip(tt.flatten(inputs, "in"), tt.flatten(keep, "in"))
                       if p not in allowed and not tt.bitwise_equal(a, b)]
            if changed:
                rec.update(status="incorrect", message=f"solve modified its input {changed[0]}")
            inputs = tt.clone(keep)
            bad = tt.structure_mismatch(out[0], ref[0])
            if bad:
                rec.update(status="wrong_structure", message=bad)
                continue
            comps = []
            for (p, o), (_, r), (_, a) in zip(inplace.leaves(out, positions), inplace.leaves(ref, positions),
                                             inplace.leaves(anchor if anchor is not None else ref, positions)):
                if anchor is not None:
                    c = tt.compare(p, o, r, a, meta["factor"])
                    ok, err, allow, note = c.ok, c.max_error, c.allowance, c.note
                elif tt.is_exact_dtype(r.dtype):
                    c = tt.compare(p, o, r, r, meta["factor"])
                    ok, err, allow, note = c.ok, c.max_error, c.allowance, c.note
                else:   # no fp64 anchor (too costly here): the eps term of the rule, against the reference
                    o64, r64 = o.double(), r.double()
                    err = float((o64 - r64).abs().max())
                    allow = meta["factor"] * tt.eps(r.dtype) * float(r64.abs().max())
                    ok = bool(torch.isfinite(o64).all()) and err <= allow
                    note = "" if ok else f"max |out-ref| {err:.3g} > {allow:.3g} (no anchor)"
                degen = tt.degenerate(o, r)
                comps.append({"path": p, "ok": ok and not degen, "max_error": err, "allowance": allow,
                              "anchor": anchor is not None, "note": note or (degen or "")})
                if (not ok or degen) and rec["status"] == "passed":
                    rec.update(status="incorrect", message=f"seed {seed}: {p}: {note or degen}")
            rec["draws"].append({"seed": seed, "first_call_s": round(first_s, 3), "outputs": comps})
        del ref, anchor
    # timing, one process at a time (other workers may be compiling / checking meanwhile)
    lock = open(lock_path, "w") if lock_path else None
    if lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        eager_ms = None
        for dsl, sol in sols.items():
            rec = recs[dsl]
            if rec["status"] != "passed":
                continue
            try:
                kt = cuda_ms(lambda: sol.solve(*inputs), reps, 3)
                if eager_ms is None:
                    with tt.strict_precision():
                        t1 = time.time()
                        prob.reference(*inputs)
                        _sync()
                        one = time.time() - t1
                        n = 3 if one < 0.2 else 1
                        eager_ms = statistics.median(cuda_ms(lambda: prob.reference(*inputs), n, 0 if n == 1 else 1))
                rec["kernel_ms"] = statistics.median(kt)
                rec["eager_ms"] = eager_ms
                rec["speedup"] = eager_ms / rec["kernel_ms"]
                rec["sol_flops"], rec["sol_bytes"] = meta["sol_flops"], meta["sol_bytes"]
                rec["gbps"] = meta["sol_bytes"] / (rec["kernel_ms"] * 1e-3) / 1e9
                rec["tflops"] = meta["sol_flops"] / (rec["kernel_ms"] * 1e-3) / 1e12
            except Exception as exc:  # noqa: BLE001
                rec.update(status="runtime_error", message=f"timing: {type(exc).__name__}: {exc}"[-3000:],
                           traceback=traceback.format_exc()[-6000:])
    finally:
        if lock:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return list(recs.values())


def child(args) -> int:
    pid, dsl = args.one
    if args.compile_only:
        recs = [compile_one(pid, dsl, SOLUTIONS / dsl / f"{pid}.py", args.arch)]
    else:
        try:
            recs = run_problem(pid, dsl.split(","), [int(s) for s in args.seeds.split(",")], args.reps,
                               args.anchor_max_flops, args.lock)
        except Exception as exc:  # noqa: BLE001  (a CUDA fault: the process is unusable from here)
            recs = [{"problem": pid, "dsl": d, "status": "crashed", "message": f"{type(exc).__name__}: {exc}"[-2000:],
                     "traceback": traceback.format_exc()[-4000:]} for d in dsl.split(",")]
    for rec in recs:
        print("@@RESULT@@" + json.dumps(rec), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile-only", action="store_true", help="build for --arch without a GPU")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--problems", default="", help="comma list, e.g. p28,p25 (default: all shipped)")
    ap.add_argument("--dsl", default="cutedsl,tirx")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per solution")
    ap.add_argument("--out", default="", help="JSON summary path")
    ap.add_argument("--jobs", type=int, default=1, help="problems checked in parallel (timing is serialised)")
    ap.add_argument("--anchor-max-flops", type=float, default=2e11,
                    help="skip the fp64 anchor above this SOL flop count (compare with the reference's eps term)")
    ap.add_argument("--lock", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--one", nargs=2, metavar=("PID", "DSL"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return child(args)
    todo = solution_list([p for p in args.problems.split(",") if p] or None, args.dsl.split(","))
    if args.compile_only:
        units = [(pid, dsl) for pid, dsl, _ in todo]
    else:       # one child per problem, both DSLs inside (reference and anchor computed once)
        by_pid: dict[str, list[str]] = {}
        for pid, dsl, _ in todo:
            by_pid.setdefault(pid, []).append(dsl)
        units = [(pid, ",".join(d)) for pid, d in by_pid.items()]
    lock = str(Path(tempfile.gettempdir()) / "mkb-solutions-timing.lock")

    def launch(unit):
        pid, dsl = unit
        cmd = [sys.executable, __file__, "--one", pid, dsl, "--arch", args.arch, "--seeds", args.seeds,
               "--reps", str(args.reps), "--anchor-max-flops", str(args.anchor_max_flops), "--lock", lock] + \
            (["--compile-only"] if args.compile_only else [])
        t0 = time.time()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            found = [json.loads(m) for m in re.findall(r"@@RESULT@@(.*)", r.stdout)]
            if not found:
                found = [{"problem": pid, "dsl": d, "status": "crashed",
                          "message": f"rc={r.returncode}: {(r.stdout + r.stderr)[-3000:]}"} for d in dsl.split(",")]
        except subprocess.TimeoutExpired:
            found = [{"problem": pid, "dsl": d, "status": "timeout", "message": f">{args.timeout}s"}
                     for d in dsl.split(",")]
        for rec in found:
            rec.setdefault("seconds", round(time.time() - t0, 2))
        return found

    from concurrent.futures import ThreadPoolExecutor
    results = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for found in pool.map(launch, units):
            for rec in found:
                results.append(rec)
                line = f"{rec['problem']:4s} {rec['dsl']:8s} {rec['status']:14s} {rec.get('seconds', 0):7.1f}s"
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
