"""Smallest possible kernel in each DSL, to prove a toolchain imports, compiles and (on a GPU) runs.

Used by `mkb doctor` and the image build's smoke test. Both kernels compute y = x + 1 on fp32 vectors.
"""

# no "from __future__ import annotations": both DSLs read the annotations as objects

import os
import shutil
import time


def _arch() -> str:
    import torch

    if torch.cuda.is_available():
        from mkb.environment import gpu_arch

        return gpu_arch(*torch.cuda.get_device_capability())
    return os.environ.get("MKB_ARCH", "sm_90a")


def cutedsl(run: bool) -> str:
    """Compile (and with run=True launch and check) a CuTe DSL kernel; returns a one-line summary."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    arch = _arch()

    @cute.kernel
    def add_one(x: cute.Tensor, y: cute.Tensor):
        t, _, _ = cute.arch.thread_idx()
        b, _, _ = cute.arch.block_idx()
        i = b * 128 + t
        if i < x.shape[0]:
            y[i] = x[i] + cutlass.Float32(1.0)

    @cute.jit
    def launch(x: cute.Tensor, y: cute.Tensor, stream):
        add_one(x, y).launch(grid=((x.shape[0] + 127) // 128, 1, 1), block=(128, 1, 1), stream=stream)

    n = cute.sym_int32()
    t0 = time.perf_counter()
    fn = cute.compile(launch, make_fake_compact_tensor(cutlass.Float32, (n,)),
                      make_fake_compact_tensor(cutlass.Float32, (n,)),
                      make_fake_stream(use_tvm_ffi_env_stream=True),
                      options=f"--gpu-arch {arch} --enable-tvm-ffi")
    summary = f"compiled for {arch} in {time.perf_counter() - t0:.2f} s"
    if run:
        summary += _check(fn)
    return summary


def tirx(run: bool) -> str:
    """Compile (and with run=True launch and check) a TIRx kernel; returns a one-line summary."""
    import torch  # noqa: F401  (before tvm, so TVM's CUDA runtime finds torch's libcudart)

    if shutil.which("nvcc") and "TVM_CUDA_COMPILE_MODE" not in os.environ:
        os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"
    import tvm
    from tvm.script import tirx as T

    arch = _arch()

    @T.prim_func
    def add_one(x_ptr: T.handle, y_ptr: T.handle):
        n = T.int32()
        X = T.match_buffer(x_ptr, (n,), "float32")
        Y = T.match_buffer(y_ptr, (n,), "float32")
        T.device_entry()
        bx = T.cta_id([T.ceildiv(n, 128)])
        tx = T.thread_id([128])
        i: T.let = bx * 128 + tx
        if i < n:
            Y[i] = X[i] + T.float32(1)

    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    t0 = time.perf_counter()
    with target:
        exe = tvm.compile(tvm.IRModule({"main": add_one}), target=target, tir_pipeline="tirx")
    source = exe.mod.imports[0].inspect_source()
    if "__global__" not in source:
        raise RuntimeError("TIRx produced no CUDA kernel source")
    summary = f"compiled for {arch} in {time.perf_counter() - t0:.2f} s"
    if run:
        if not tvm.runtime.enabled("cuda"):
            raise RuntimeError("TVM's CUDA runtime did not load (needs a CUDA 13 driver >= 580 and libcudart.so.13)")
        summary += _check(exe)
    return summary


def _check(fn) -> str:
    import torch

    x = torch.randn(1000, device="cuda")
    y = torch.empty_like(x)
    fn(x, y)
    torch.cuda.synchronize()
    if not torch.equal(y, x + 1):
        raise RuntimeError("the kernel ran but computed the wrong values")
    return "; ran and checked on the GPU"


if __name__ == "__main__":
    import sys

    import torch

    gpu = torch.cuda.is_available()
    names = sys.argv[1:] or ["cutedsl", "tirx"]
    for name in names:
        print(f"{name}: {globals()[name](gpu)}", flush=True)
