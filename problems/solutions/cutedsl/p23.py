"""p23 paged FP8 MLA cache gather + dequantize in CuTe DSL: one kernel writes the dense fp32 buffer.

Output row i belongs to the request whose token range holds it (a scan of seq_lens, 8 entries);
its token position p reads cache row block_table[r, p // 16] * 16 + p % 16.  144 threads per row
each load 4 e4m3 bytes (one 32-bit access), convert them to fp32, multiply by the fp32 scale and
store one float4.  Only the gathered entries are read: the SOL traffic.  The row count
sum(seq_lens) is needed on the host to allocate the output (one 32-byte device-to-host copy).
"""
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

VEC = 4                # fp8 bytes per thread -> one float4 out
ROWS_PER_CTA = 4


class GatherDequant:
    def __init__(self, block_size: int, width: int, scale: float):
        self.BS, self.D, self.scale = block_size, width, scale
        self.lanes = width // VEC
        self.threads = self.lanes * ROWS_PER_CTA

    @cute.jit
    def __call__(self, src: cute.Tensor, table: cute.Tensor, lens: cute.Tensor, out: cute.Tensor, stream):
        codes = cute.make_tensor(cute.recast_ptr(src.iterator, dtype=cutlass.Float8E4M3FN), src.layout)
        grid = (out.shape[0] + ROWS_PER_CTA - 1) // ROWS_PER_CTA
        self.kernel(codes, table, lens, out).launch(grid=[grid, 1, 1], block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, codes: cute.Tensor, table: cute.Tensor, lens: cute.Tensor, out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        row = bidx * ROWS_PER_CTA + tidx // self.lanes
        j = tidx % self.lanes
        if row < out.shape[0]:
            end = Int32(0)
            start = Int32(0)
            req = Int32(0)
            for q in range(lens.shape[0]):          # requests whose tokens all lie before this row
                end = end + lens[q]
                if row >= end:
                    req = Int32(q) + 1
                    start = end
            pos = row - start
            srow = table[req, pos // self.BS] * self.BS + pos % self.BS
            rin = cute.make_rmem_tensor((VEC,), cutlass.Float8E4M3FN)
            cute.autovec_copy(cute.zipped_divide(codes[srow, None], (VEC,))[None, j], rin)
            ro = cute.make_rmem_tensor((VEC,), Float32)
            ro.store(rin.load().to(Float32) * Float32(self.scale))
            cute.autovec_copy(ro, cute.zipped_divide(out[row, None], (VEC,))[None, j])


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(src_cache, block_table, seq_lens, scale, arch=None):
    _, block_size, width = src_cache.shape
    key = (block_size, width, float(scale))
    if key not in _COMPILED:
        assert width % VEC == 0, width
        fs = make_fake_compact_tensor(cutlass.Uint8, (cute.sym_int(), width), stride_order=(1, 0), assumed_align=4)
        reqs = cute.sym_int()
        ft = make_fake_compact_tensor(cutlass.Int32, (reqs, cute.sym_int()), stride_order=(1, 0))
        fl = make_fake_compact_tensor(cutlass.Int32, (reqs,))
        fo = make_fake_compact_tensor(cutlass.Float32, (cute.sym_int(), width), stride_order=(1, 0), assumed_align=16)
        _COMPILED[key] = cute.compile(GatherDequant(*key), fs, ft, fl, fo, make_fake_stream(use_tvm_ffi_env_stream=True),
                                      options=f"--gpu-arch {arch or _arch()} --enable-tvm-ffi")
    return [_COMPILED[key]]


def solve(src_cache, block_table, seq_lens, scale):
    (fn,) = _prepare(src_cache, block_table, seq_lens, scale)
    width = src_cache.shape[-1]
    total = sum(seq_lens.tolist())                  # the output's row count
    out = torch.empty(total, width, dtype=torch.float32, device=src_cache.device)
    if total:
        fn(src_cache.contiguous().view(-1, width), block_table.contiguous(), seq_lens.contiguous(), out)
    return out
