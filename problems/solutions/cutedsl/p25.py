"""p25 paged KV-cache block copy (uint8, in place) in CuTe DSL: one launch copies both caches' mapped blocks.

The work is cut finer than one CTA per pair: a CTA of 128 threads copies one 16 KiB chunk of one block
of one cache (grid = chunks x pairs x 2 caches = 4 x 256 x 2 at full scale), each thread issuing all
eight of its 16-byte loads before its first store. At ~50 registers a thread, about eight such CTAs sit
on an SM, so ~128 KiB of loads are in flight per SM and the stores of one CTA overlap the loads of
the next (the shipped kernel held 512 bytes a thread, one 256-thread CTA an SM, loading then storing).
Only the mapped blocks are read and written; every other destination block is left as it is.

The caches are passed as they are (uint8 [blocks, 32, 8, 256]) and the mapping as the int64 tensor it is:
solve() does no torch work before the launch; the word view is built inside the jit function.
"""
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Int32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

THREADS = 128
VEC = 4            # int32 per 16-byte access
UNROLL = 8         # 16-byte accesses per thread, all loaded before any store


class BlockCopy:
    def __init__(self, words: int):
        self.words = words                  # int32 words per block (static)
        self.nvec = words // VEC
        self.chunks = (self.nvec + THREADS * UNROLL - 1) // (THREADS * UNROLL)
        self.exact = self.nvec % (THREADS * UNROLL) == 0   # full scale: no bounds checks at all

    def _words(self, t: cute.Tensor) -> cute.Tensor:
        ptr = cute.recast_ptr(t.iterator, dtype=Int32)
        return cute.make_tensor(ptr, cute.make_layout((t.shape[0], self.words), stride=(self.words, 1)))

    @cute.jit
    def __call__(self, ks: cute.Tensor, vs: cute.Tensor, mapping: cute.Tensor, kd: cute.Tensor,
                 vd: cute.Tensor, stream):
        self.kernel(self._words(ks), self._words(vs), mapping, self._words(kd), self._words(vd)).launch(
            grid=[self.chunks, mapping.shape[0], 2], block=[THREADS, 1, 1], stream=stream)

    @cute.jit
    def _copy(self, s: cute.Tensor, d: cute.Tensor, src: Int32, dst: Int32, first: Int32, tidx: Int32):
        sv = cute.zipped_divide(s[src, None], (VEC,))
        dv = cute.zipped_divide(d[dst, None], (VEC,))
        r = cute.make_rmem_tensor((VEC, UNROLL), Int32)
        for u in cutlass.range_constexpr(UNROLL):
            if cutlass.const_expr(self.exact):
                cute.autovec_copy(sv[None, first + u * THREADS + tidx], r[None, u])
            else:
                if first + u * THREADS + tidx < self.nvec:
                    cute.autovec_copy(sv[None, first + u * THREADS + tidx], r[None, u])
        for u in cutlass.range_constexpr(UNROLL):
            if cutlass.const_expr(self.exact):
                cute.autovec_copy(r[None, u], dv[None, first + u * THREADS + tidx])
            else:
                if first + u * THREADS + tidx < self.nvec:
                    cute.autovec_copy(r[None, u], dv[None, first + u * THREADS + tidx])

    @cute.kernel
    def kernel(self, ks: cute.Tensor, vs: cute.Tensor, mapping: cute.Tensor, kd: cute.Tensor, vd: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        c, p, which = cute.arch.block_idx()
        src = Int32(mapping[p, 0])
        dst = Int32(mapping[p, 1])
        first = c * (THREADS * UNROLL)
        if which == 0:
            self._copy(ks, kd, src, dst, first, tidx)
        else:
            self._copy(vs, vd, src, dst, first, tidx)


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(src_k, src_v, dst_k, dst_v, block_mapping, arch=None):
    block_shape = tuple(src_k.shape[1:])
    block_bytes = src_k[0].numel()
    assert src_k.dtype == torch.uint8 and block_bytes % 16 == 0
    assert all(t.is_contiguous() for t in (src_k, src_v, dst_k, dst_v, block_mapping))
    if block_shape not in _COMPILED:
        nb, npairs = cute.sym_int(), cute.sym_int()
        order = tuple(range(len(block_shape), -1, -1))
        fc = make_fake_compact_tensor(cutlass.Uint8, (nb, *block_shape), stride_order=order, assumed_align=16)
        fm = make_fake_compact_tensor(cutlass.Int64, (npairs, 2), stride_order=(1, 0), assumed_align=16)
        _COMPILED[block_shape] = cute.compile(BlockCopy(block_bytes // 4), fc, fc, fm, fc, fc,
                                              make_fake_stream(use_tvm_ffi_env_stream=True),
                                              options=f"--gpu-arch {arch or _arch()} --enable-tvm-ffi")
    return [_COMPILED[block_shape]]


def solve(src_k, src_v, dst_k, dst_v, block_mapping):
    fn = _COMPILED.get(tuple(src_k.shape[1:]))
    if fn is None:
        (fn,) = _prepare(src_k, src_v, dst_k, dst_v, block_mapping)
    fn(src_k, src_v, block_mapping, dst_k, dst_v)
