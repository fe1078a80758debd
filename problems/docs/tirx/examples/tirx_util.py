"""Helpers shared by the TIRx examples: CUDA setup, target, compile, CUDA C source, nvcc, a CUDA-event timer.

Every example has `build(arch)` (compile without a GPU; returns the Executable, which takes torch
tensors) and `check(fn)` (run on CUDA tensors, compare with torch, return a zero-argument launch for
timing). Run an example as a script: with no GPU it compiles to CUDA C (and, with nvcc on PATH, to
PTX and a cubin); with a GPU it also checks and times. Import this module before tvm.
"""

import os
import shutil
import sys
import time

import torch  # first: TVM's CUDA runtime then finds the libcudart torch already loaded

if torch.cuda.is_available():
    torch.cuda.init()
    try:  # libtvm_runtime_cuda.so needs libcudart.so.13 on the loader path
        from cuda.pathfinder import load_nvidia_dynamic_lib

        load_nvidia_dynamic_lib("cudart")
    except Exception:
        pass
if shutil.which("nvcc") and "TVM_CUDA_COMPILE_MODE" not in os.environ:
    os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"  # on a GPU machine: nvcc instead of NVRTC

import tvm  # noqa: E402
from tvm.script import tirx as T  # noqa: E402,F401


def target_arch() -> str:
    """$ARCH, else the visible GPU's arch (with the 'a' suffix on sm_90/sm_100), else sm_90a."""
    if os.environ.get("ARCH"):
        return os.environ["ARCH"]
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}" + ("a" if major in (9, 10) else "")
    return "sm_90a"


def target(arch: str) -> tvm.target.Target:
    """The CUDA target in dict form; Target("cuda") with no arch silently means an old GPU."""
    return tvm.target.Target({"kind": "cuda", "arch": arch})


def compile_tirx(func, arch: str):
    """tvm.compile one @T.prim_func with the TIRx pipeline. Without a GPU the device part stays CUDA C."""
    tgt = target(arch)
    with tgt:  # the CUDA compile step reads the arch (with its 'a') from the current target
        return tvm.compile(tvm.IRModule({"main": func}), target=tgt, tir_pipeline="tirx")


def cuda_source(exe) -> str:
    """The generated CUDA C of a compiled module (works with and without a GPU)."""
    return exe.mod.imports[0].inspect_source()


def nvcc(source: str, arch: str, fmt: str = "cubin") -> bytes:
    """CUDA C -> 'ptx' or 'cubin' for arch with the system nvcc (no GPU needed)."""
    from tvm.support import nvcc as tvm_nvcc

    with target(arch):
        return bytes(tvm_nvcc.compile_cuda(source, target_format=fmt, arch=arch, compiler="nvcc"))


def patch_wgmma_noop_barrier() -> None:
    """Work around apache-tvm 0.27.0.post1: T.cuda.wgmma.noop_barrier(acc[i]) on a buffer element fails in
    codegen ("'TensorLoad' object has no attribute 'dtype'"). Re-register its codegen to read the type."""
    from tvm.backend.cuda.codegen.registry import CODEGEN_REGISTRY, register_codegen

    @register_codegen("cuda_wgmma_noop_barrier")
    def _noop_barrier(reg):
        dtype = str(getattr(reg, "dtype", None) or reg.ty.dtype)
        res = CODEGEN_REGISTRY[f"tirx.cuda_wgmma_noop_barrier_{dtype}"]([reg])
        return res[0] if isinstance(res, tuple) else res


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
    """Script entry of an example: compile for target_arch(), save the CUDA C (and PTX/cubin with nvcc);
    on a GPU, check and time."""
    arch = target_arch()
    out = os.path.join(os.getcwd(), "build_" + os.path.basename(sys.argv[0]).removesuffix(".py"))
    os.makedirs(out, exist_ok=True)
    t0 = time.perf_counter()
    exe = build(arch)
    print(f"compiled for {arch} in {time.perf_counter() - t0:.2f} s")
    if not torch.cuda.is_available():
        src = cuda_source(exe)
        with open(os.path.join(out, "kernel.cu"), "w") as f:
            f.write(src)
        if shutil.which("nvcc"):
            for fmt in ("ptx", "cubin"):
                with open(os.path.join(out, f"kernel.{fmt}"), "wb") as f:
                    f.write(nvcc(src, arch, fmt))
        print(f"no GPU here: CUDA C{' + PTX + cubin' if shutil.which('nvcc') else ''} written to {out}")
        return 0
    if not tvm.runtime.enabled("cuda"):
        print("TVM's CUDA runtime did not load: it needs a CUDA 13 driver (>= 580) and libcudart.so.13")
        return 2
    launch = check(exe)
    print(f"PASS on {torch.cuda.get_device_name()}: {time_us(launch):.1f} us per launch")
    return 0
