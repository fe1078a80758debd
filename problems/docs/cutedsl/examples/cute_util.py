"""Helpers shared by the CuTe DSL examples: target arch, compile options, fake tensors, a CUDA-event timer.

Every example has `build(arch)` (compile without a GPU; returns a function taking torch tensors) and
`check(fn)` (run on CUDA tensors, compare with torch, return a zero-argument launch for timing).
Run an example as a script: with no GPU it only compiles (and prints where the PTX went); with a GPU
it also checks and times.
"""

import os
import sys
import time

import torch

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream


def target_arch() -> str:
    """$ARCH, else the visible GPU's arch (with the 'a' suffix on sm_90/sm_100), else sm_90a."""
    if os.environ.get("ARCH"):
        return os.environ["ARCH"]
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}" + ("a" if major in (9, 10) else "")
    return "sm_90a"


def options(arch: str, keep_dir: str | None = None) -> str:
    """cute.compile options: always the arch (without it a GPU-less host builds for sm_100a) and TVM-FFI,
    so the compiled function takes torch tensors directly; keep_dir also keeps the PTX and cubin there."""
    opts = f"--gpu-arch {arch} --enable-tvm-ffi"
    if keep_dir:
        os.makedirs(keep_dir, exist_ok=True)
        opts += f" --keep-ptx --keep-cubin --dump-dir {keep_dir}"
    return opts


def fake_matrix(dtype, rows, cols, align: int = 16):
    """A row-major (rows, cols) fake tensor for compiling; rows/cols may be cute.sym_int() (dynamic)."""
    return make_fake_compact_tensor(dtype, (rows, cols), stride_order=(1, 0), assumed_align=align)


def fake_vector(dtype, n, align: int = 16):
    return make_fake_compact_tensor(dtype, (n,), assumed_align=align)


def env_stream():
    """A stream argument that, at run time, is torch's current CUDA stream (TVM-FFI environment stream)."""
    return make_fake_stream(use_tvm_ffi_env_stream=True)


def time_us(launch, iters: int = 100, warmup: int = 10) -> float:
    """Mean time of one launch in microseconds, between CUDA events (GPU only)."""
    for _ in range(warmup):
        launch()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        launch()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def main(build, check) -> int:
    """Script entry of an example: compile for target_arch(); on a GPU, check and time."""
    arch = target_arch()
    keep = os.path.join(os.getcwd(), "build_" + os.path.basename(sys.argv[0]).removesuffix(".py"))
    t0 = time.perf_counter()
    fn = build(arch, keep_dir=keep)
    print(f"compiled for {arch} in {time.perf_counter() - t0:.2f} s; PTX and cubin in {keep}")
    if not torch.cuda.is_available():
        print("no GPU here: compile-only check done")
        return 0
    launch = check(fn)
    print(f"PASS on {torch.cuda.get_device_name()}: {time_us(launch):.1f} us per launch")
    return 0


__all__ = ["cutlass", "cute", "target_arch", "options", "fake_matrix", "fake_vector", "env_stream",
           "time_us", "main"]
