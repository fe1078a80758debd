"""p23 paged FP8 MLA cache gather + dequantize in TIRx: one kernel writes the dense fp32 buffer.

Output row i belongs to the request whose token range holds it (a scan of seq_lens, 8 entries);
its token position p reads cache row block_table[r, p // 16] * 16 + p % 16.  144 threads per row
each load 4 e4m3 bytes (one 32-bit access), convert them to fp32, multiply by the fp32 scale and
store one float4.  Only the gathered entries are read: the SOL traffic.  The row count
sum(seq_lens) is needed on the host to allocate the output (one 32-byte device-to-host copy).
"""
import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

VEC = 4
ROWS_PER_CTA = 4


def _make(BS: int, D: int, SCALE: float):
    LANES = D // VEC
    THREADS = LANES * ROWS_PER_CTA

    @T.prim_func
    def gather_dequant(s_h: T.handle, t_h: T.handle, l_h: T.handle, o_h: T.handle):
        srows = T.int32()
        reqs = T.int32()
        width = T.int32()
        total = T.int32()
        S = T.match_buffer(s_h, (srows, D), "uint8", align=4)
        TB = T.match_buffer(t_h, (reqs, width), "int32")
        L = T.match_buffer(l_h, (reqs,), "int32")
        O = T.match_buffer(o_h, (total, D), "float32", align=16)
        T.device_entry()
        bx = T.cta_id([T.ceildiv(total, ROWS_PER_CTA)])
        tx = T.thread_id([THREADS])
        S8 = T.decl_buffer((srows, D), "float8_e4m3fn", data=S.data)     # the same bytes, as e4m3
        cr = T.alloc_local((VEC,), "float8_e4m3fn")
        yr = T.alloc_local((VEC,), "float32")
        scan = T.alloc_local((3,), "int32")      # end, start, request
        row: T.let = bx * ROWS_PER_CTA + tx // LANES
        col = T.meta_var((tx % LANES) * VEC)
        if row < total:
            scan[0] = 0
            scan[1] = 0
            scan[2] = 0
            for q in T.serial(reqs):            # requests whose tokens all lie before this row
                scan[0] = scan[0] + L[q]
                if row >= scan[0]:
                    scan[2] = q + 1
                    scan[1] = scan[0]
            pos: T.let = row - scan[1]
            srow: T.let = TB[scan[2], pos // BS] * BS + pos % BS
            T.tile.copy(cr[:], S8[srow, col:col + VEC])
            for v in T.unroll(VEC):
                yr[v] = T.Cast("float32", cr[v]) * T.float32(SCALE)
            T.tile.copy(O[row, col:col + VEC], yr[:])

    return gather_dequant


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(src_cache, block_table, seq_lens, scale, arch=None):
    _, block_size, width = src_cache.shape
    key = (block_size, width, float(scale))
    if key not in _COMPILED:
        assert width % VEC == 0, width
        _COMPILED[key] = _build(_make(*key), arch or _arch())
    return [_COMPILED[key]]


def solve(src_cache, block_table, seq_lens, scale):
    (exe,) = _prepare(src_cache, block_table, seq_lens, scale)
    width = src_cache.shape[-1]
    total = sum(seq_lens.tolist())                  # the output's row count
    out = torch.empty(total, width, dtype=torch.float32, device=src_cache.device)
    if total:
        exe(src_cache.contiguous().view(-1, width), block_table.contiguous(), seq_lens.contiguous(), out)
    return out
