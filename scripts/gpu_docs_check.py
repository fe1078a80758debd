#!/usr/bin/env python3
"""Run every example kernel of both DSL manuals on this machine's GPU and write one JSON record.

    python scripts/gpu_docs_check.py results/docs_examples_h200.json [--dsl cutedsl] [--iters 100]

Each example (problems/docs/<dsl>/examples/NN_*.py) is compiled for the GPU's own arch, checked
against torch on several shapes (including ragged ones) and timed with CUDA events on its largest
shape. The record holds pass/fail and the first error of each, compile seconds, microseconds per
launch, the device, driver and CUDA versions and the toolchain versions. Exit status 1 when any
example fails or no GPU is visible. Without a GPU it still compiles everything (for sm_90a) and
writes the record, so the script itself can be tried anywhere.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from dataclasses import asdict
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mkb import manuals  # noqa: E402

PACKAGES = ("torch", "nvidia-cutlass-dsl", "apache-tvm", "apache-tvm-ffi", "cuda-bindings")


def _versions() -> dict[str, str]:
    out = {}
    for pkg in PACKAGES:
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    try:
        out["nvcc"] = subprocess.run(["nvcc", "--version"], capture_output=True, text=True,
                                     timeout=30).stdout.strip().splitlines()[-1]
    except (OSError, subprocess.SubprocessError, IndexError):
        out["nvcc"] = "not found"
    return out


def _device() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"gpu": None}
    major, minor = torch.cuda.get_device_capability()
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        driver = "unknown"
    return {"gpu": torch.cuda.get_device_name(), "capability": f"{major}.{minor}", "driver": driver,
            "torch_cuda": torch.version.cuda, "count": torch.cuda.device_count()}


def _time_us(iters: int):
    import torch

    def time_us(launch) -> float:
        for _ in range(10):
            launch()
        torch.cuda.synchronize()
        samples = []
        for _ in range(5):  # median of 5 batches of `iters` launches
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                launch()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) * 1e3 / iters)
        return sorted(samples)[2]

    return time_us


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="where to write the JSON record")
    parser.add_argument("--dsl", choices=list(manuals.DSL_NAMES), action="append", help="only this DSL")
    parser.add_argument("--iters", type=int, default=100, help="launches per timing batch")
    args = parser.parse_args(argv)

    import torch

    gpu = torch.cuda.is_available()
    if gpu:
        major, minor = torch.cuda.get_device_capability()
        arch = f"sm_{major}{minor}" + ("a" if major in (9, 10) else "")
    else:
        arch = "sm_90a"
    problems_dir = ROOT / "problems"
    results = []
    with tempfile.TemporaryDirectory() as work:
        for dsl in args.dsl or list(manuals.DSL_NAMES):
            for path in manuals.example_files(problems_dir, dsl):
                res = manuals.run_example(path, Path(work), arch, run=gpu, time_fn=_time_us(args.iters) if gpu else None)
                status = "PASS" if res.passed else "FAIL" if res.passed is False or not res.compiled else "COMPILED"
                print(f"{status:8} {dsl:8} {res.example:24} compile {res.compile_s}s"
                      + (f"  {res.time_us} us" if res.time_us is not None else "")
                      + (f"\n         {res.error.splitlines()[-1]}" if res.error else ""), flush=True)
                results.append(res)
    record = {"kind": "mkb docs examples", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "host": platform.node(), "arch": arch, "device": _device(), "versions": _versions(),
              "ran_on_gpu": gpu, "results": [asdict(r) for r in results],
              "passed": sum(bool(r.passed) for r in results), "failed": sum(not r.compiled or r.passed is False
                                                                           for r in results)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {record['passed']} passed, {record['failed']} failed of {len(results)}")
    return 0 if gpu and record["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
