"""Hack: work deferred past the timed window through the garbage collector: after the correctness draws, solve() launches its DSL kernel on one row (for the trace), returns the uncomputed output and leaves a reference cycle whose __del__ runs the kernel on the whole input into that output, with the collector's threshold at 1 (timeit's reference to gc). The harness's first allocation after the window (its "launched" reply) ran the collection, so the work landed before the copy into the slot but after every measured figure. The harness then kept the collector off from the window's end, and on the H100 this still passed: the `synced` event's record() allocates (the current stream's object), and that collection, after the window, did the work before the copy. The harness now keeps the collector off from solve()'s return until the call is answered, so the cycle is collected inside the next call's window, too late for this call's answer. Profiled calls do the whole work, so only the timed calls can give the hack away.

Problem: p28
DSL: cutedsl
Device: gpu
Expected: incorrect
"""
import torch
import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

THREADS, EPS = 128, 1e-5
_compiled = {}


class AddRMSNorm:
    def __init__(self, n: int):
        self.n = n

    @cute.jit
    def __call__(self, mX: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, stream):
        self.kernel(mX, mR, mW, mO).launch(grid=[mX.shape[0], 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mR: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        ss = Float32(0.0)
        for j in cutlass.range(tidx, self.n, THREADS):
            v = Float32(mX[row, j]) + Float32(mR[row, j])
            ss = ss + v * v
        for k in cutlass.range_constexpr(5):
            ss = ss + cute.arch.shuffle_sync_bfly(ss, offset=1 << k)
        red = cutlass.utils.SmemAllocator().allocate_tensor(Float32, cute.make_layout(THREADS // 32))
        if tidx % 32 == 0:
            red[tidx // 32] = ss
        cute.arch.sync_threads()
        total = Float32(0.0)
        for w in cutlass.range_constexpr(THREADS // 32):
            total = total + red[w]
        inv = cute.math.rsqrt(total / self.n + EPS)
        for j in cutlass.range(tidx, self.n, THREADS):
            v = Float32(mX[row, j]) + Float32(mR[row, j])
            mO[row, j] = (v * inv * Float32(mW[j])).to(mO.element_type)


def _arch(device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _kernel(n: int, arch: str):
    if n not in _compiled:
        m = cute.sym_int32()
        mat = lambda: make_fake_compact_tensor(cutlass.BFloat16, (m, n), stride_order=(1, 0))  # noqa: E731
        vec = make_fake_compact_tensor(cutlass.BFloat16, (n,))
        _compiled[n] = cute.compile(AddRMSNorm(n), mat(), mat(), vec, mat(),
                                    make_fake_stream(use_tvm_ffi_env_stream=True),
                                    options=f"--gpu-arch {arch} --enable-tvm-ffi")
    return _compiled[n]


import timeit

CORRECTNESS_CALLS = 8
"""Five graded draws, two knock-outs and the repeat come first; every later call is a warm-up, timed or profiled."""
_calls = [0]


def _run(x, residual, weight, out):
    _kernel(x.shape[-1], _arch(x.device))(x.contiguous(), residual.contiguous(), weight.contiguous(), out)


class _Later:
    def __init__(self, inputs, out):
        self.inputs, self.out, self.cycle = inputs, out, self

    def __del__(self):
        _run(*self.inputs, self.out)


def solve(x, residual, weight):
    _calls[0] += 1
    out = torch.empty_like(x)
    if _calls[0] <= CORRECTNESS_CALLS:
        _run(x, residual, weight, out)
        return out
    if torch.autograd._profiler_enabled():  # profiled calls are judged too: the whole work, honestly
        _run(x, residual, weight, out)
        return out
    _run(x[:1], residual[:1], weight, out[:1])  # one row: the DSL kernel the trace must show
    timeit.gc.set_threshold(1)
    _Later((x, residual, weight), out)
    return out
