"""Smallest possible kernel in each DSL, to prove a toolchain imports, compiles and (on a GPU) runs.

Used by `mkb doctor` and the image build's smoke test. Both kernels compute y = x + 1 on fp32 vectors.
Run as `python -m mkb.dsl_smoke [cutedsl] [tirx] [--arch sm_90a]`: on a GPU it compiles for the GPU's own
architecture and runs; without one it compiles for --arch. TIRx compiles through nvcc when the caller sets
TVM_CUDA_COMPILE_MODE=nvcc (mkb doctor does where nvcc is on PATH), else through NVRTC.
"""

# no "from __future__ import annotations": both DSLs read the annotations as objects

import time


def cutedsl(run: bool, arch: str) -> str:
    """Compile (and with run=True launch and check) a CuTe DSL kernel; returns a one-line summary."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream


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


def tirx(run: bool, arch: str) -> str:
    """Compile (and with run=True launch and check) a TIRx kernel; returns a one-line summary."""
    import torch  # noqa: F401  (before tvm, so TVM's CUDA runtime finds torch's libcudart)
    import tvm
    from tvm.script import tirx as T


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


def main(argv: list[str]) -> int:
    """Smoke-test the named DSLs (default both); one line each on stdout."""
    import argparse

    import torch

    from mkb.environment import gpu_arch

    parser = argparse.ArgumentParser(prog="python -m mkb.dsl_smoke", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="{cutedsl,tirx}", help="the DSLs to test (default both)")
    parser.add_argument("--arch", default="sm_90a", help="target without a GPU (with one: the GPU's own)")
    args = parser.parse_args(argv)
    if unknown := set(args.names) - {"cutedsl", "tirx"}:
        parser.error(f"unknown DSL {', '.join(sorted(unknown))}: choose cutedsl or tirx")
    gpu = torch.cuda.is_available()
    arch = gpu_arch(*torch.cuda.get_device_capability()) if gpu else args.arch
    for name in args.names or ["cutedsl", "tirx"]:
        print(f"{name}: {globals()[name](gpu, arch)}", flush=True)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
