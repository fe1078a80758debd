"""p25 paged KV-cache block copy (uint8, in place) in CuTe DSL: one kernel copies both caches' blocks.

One CTA per (src, dst) pair of block_mapping copies block src of src_k and src_v into block dst of
dst_k and dst_v with 128-bit vectorized loads and stores: only the mapped blocks are read and written
(the SOL traffic); every other destination block is left as it is.
"""
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Int32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

THREADS = 256
VEC = 4            # int32 per 128-bit access


class BlockCopy:
    def __init__(self, words: int):
        self.E = words                      # int32 words per block (static)
        self.nvec = words // VEC
        self.iters = (self.nvec + THREADS - 1) // THREADS

    @cute.jit
    def __call__(self, ks: cute.Tensor, vs: cute.Tensor, mapping: cute.Tensor, kd: cute.Tensor,
                 vd: cute.Tensor, stream):
        self.kernel(ks, vs, mapping, kd, vd).launch(grid=[mapping.shape[0], 1, 1], block=[THREADS, 1, 1],
                                                    stream=stream)

    @cute.kernel
    def kernel(self, ks: cute.Tensor, vs: cute.Tensor, mapping: cute.Tensor, kd: cute.Tensor,
               vd: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        p, _, _ = cute.arch.block_idx()
        src = Int32(mapping[p, 0])
        dst = Int32(mapping[p, 1])
        kS = cute.zipped_divide(ks[src, None], (VEC,))
        vS = cute.zipped_divide(vs[src, None], (VEC,))
        kD = cute.zipped_divide(kd[dst, None], (VEC,))
        vD = cute.zipped_divide(vd[dst, None], (VEC,))
        rk = cute.make_rmem_tensor((VEC, self.iters), Int32)
        rv = cute.make_rmem_tensor((VEC, self.iters), Int32)
        for i in cutlass.range_constexpr(self.iters):
            idx = i * THREADS + tidx
            if idx < self.nvec:
                cute.autovec_copy(kS[None, idx], rk[None, i])
                cute.autovec_copy(vS[None, idx], rv[None, i])
        for i in cutlass.range_constexpr(self.iters):
            idx = i * THREADS + tidx
            if idx < self.nvec:
                cute.autovec_copy(rk[None, i], kD[None, idx])
                cute.autovec_copy(rv[None, i], vD[None, idx])


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(src_k, src_v, dst_k, dst_v, block_mapping, arch=None):
    block_bytes = src_k[0].numel()
    assert block_bytes % 16 == 0
    words = block_bytes // 4
    if words not in _COMPILED:
        nb, npairs = cute.sym_int(), cute.sym_int()
        fc = make_fake_compact_tensor(cutlass.Int32, (nb, words), stride_order=(1, 0), assumed_align=16)
        fm = make_fake_compact_tensor(cutlass.Int64, (npairs, 2), stride_order=(1, 0), assumed_align=16)
        _COMPILED[words] = cute.compile(BlockCopy(words), fc, fc, fm, fc, fc,
                                        make_fake_stream(use_tvm_ffi_env_stream=True),
                                        options=f"--gpu-arch {arch or _arch()} --enable-tvm-ffi")
    return [_COMPILED[words]]


def solve(src_k, src_v, dst_k, dst_v, block_mapping):
    (fn,) = _prepare(src_k, src_v, dst_k, dst_v, block_mapping)
    nb = src_k.shape[0]
    as_words = lambda t: t.view(nb, -1).view(torch.int32)  # noqa: E731  (zero-copy reinterpret, in place)
    fn(as_words(src_k.contiguous()), as_words(src_v.contiguous()), block_mapping.to(torch.int64).contiguous(),
       as_words(dst_k), as_words(dst_v))
