#!/usr/bin/env python3
"""Measure a GPU's speed-of-light ceilings the way the H200's in validate_solutions.CEILINGS_BY_GPU were taken.

Usage (on the GPU): python artifact/generators/measure_ceilings.py OUT.json

  hbm_bytes_per_s   a device-to-device copy of 2 GiB (bytes read + bytes written) / time
  bf16 flops_per_s  torch.matmul of two 8192 x 8192 bf16 matrices (cuBLAS, dense tensor cores)
  fp32 flops_per_s  the same in fp32 with TF32 off (CUDA-core FMA)
  fp8 (measured)    torch._scaled_mm of e4m3 operands, recorded beside the rule the ceilings use (2 x bf16)

Each figure is the median of 20 timed runs (CUDA events) after 3 warm-up runs. The JSON holds the raw figures,
the GPU, versions and the ``ceilings`` entry to put into CEILINGS_BY_GPU under ``key`` (then
``validate_solutions.py --out problems/solutions/<key>.json --rescore <key>``).
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def timed(fn, runs: int = 20, warmup: int = 3) -> float:
    """Median seconds of fn() on the current stream."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def measure() -> dict:
    import torch

    from mkb.environment import describe
    from validate_solutions import gpu_key

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here: the ceilings are measured on the GPU they describe")
    name = torch.cuda.get_device_name()
    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_s = timed(lambda: dst.copy_(src))
    del src, dst
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    bf16_s = timed(lambda: torch.matmul(a, b))
    torch.backends.cuda.matmul.allow_tf32 = False
    a32, b32 = a.float(), b.float()
    fp32_s = timed(lambda: torch.matmul(a32, b32), runs=5)
    del a32, b32
    fp8_rate = None
    try:
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()   # column-major second operand, as _scaled_mm wants
        one = torch.ones((), device="cuda")
        fp8_rate = 2 * n**3 / timed(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one,
                                                               out_dtype=torch.bfloat16))
    except (RuntimeError, AttributeError) as exc:   # no fp8 GEMM in this torch build: the rule stands alone
        print(f"fp8 not measured: {exc}", file=sys.stderr)
    hbm = 2 * (2 << 30) / copy_s
    bf16 = 2 * n**3 / bf16_s
    fp32 = 2 * n**3 / fp32_s
    key = gpu_key(name)
    return {
        "gpu": name, "key": key, "measured_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "environment": describe(with_gpu=True),
        "raw": {"copy_2GiB_s": copy_s, "bf16_gemm_8192_s": bf16_s, "fp32_gemm_8192_s": fp32_s,
                "fp8_flops_per_s_measured": fp8_rate},
        "ceilings": {
            "hbm_bytes_per_s": float(f"{hbm:.2g}"),
            "flops_per_s": {"bf16": float(f"{bf16:.2g}"), "fp16": float(f"{bf16:.2g}"),
                            "fp8": float(f"{2 * bf16:.2g}"), "fp32": float(f"{fp32:.2g}"),
                            "uint8": float(f"{bf16:.2g}"), "int8": float(f"{2 * bf16:.2g}")},
            "note": f"{name}: HBM copy bandwidth and dense bf16 tensor-core rate as measured on it "
                    f"(artifact/generators/measure_ceilings.py); fp8 = 2x bf16; fp32 = CUDA-core FMA rate. SOL time = "
                    "max(flops / rate(problem DTYPE), bytes / bandwidth).",
        },
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python artifact/generators/measure_ceilings.py OUT.json")
    sys.path.insert(0, str(Path(__file__).parent))
    result = measure()
    Path(sys.argv[1]).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['gpu']}: HBM {result['ceilings']['hbm_bytes_per_s'] / 1e12:.2f} TB/s, bf16 "
          f"{result['ceilings']['flops_per_s']['bf16'] / 1e12:.0f} TFLOP/s, fp32 "
          f"{result['ceilings']['flops_per_s']['fp32'] / 1e12:.1f} TFLOP/s -> {sys.argv[1]}")
