"""p26 hybrid KV-cache block-table update (in place) + slot mapping in CuTe DSL: one single-CTA kernel.

Phase 1, a thread per (group, request): scan the 128 staged writes in write order, apply the ones
for its request (start at 0 on overwrite, else at the running num_blocks; manager block m becomes
kernel blocks m * ratio + t), and store the final num_blocks.  Writes for one (group, request) only
ever touch that row, so the rows are independent and the write order is kept within each.
Phase 2, after a CTA barrier (the updated rows are visible to every thread of the CTA): a thread per
token finds its batch row (the count of query_start_loc[1:] <= token), reads the request's updated
table entry and writes the int64 slot of each group, -1 past the scheduled tokens.  Everything stays
in one kernel: no torch work on the data path.
"""
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

BLOCK_SIZES = (16, 32, 8)
KERNEL_BLOCK_SIZES = (16, 16, 8)
RATIOS = tuple(b // k for b, k in zip(BLOCK_SIZES, KERNEL_BLOCK_SIZES))
THREADS = 1024


class TableUpdate:
    def __init__(self, cap: int):
        self.cap = cap

    @cute.jit
    def __call__(self, t0: cute.Tensor, t1: cute.Tensor, t2: cute.Tensor, nblk: cute.Tensor, wreq: cute.Tensor,
                 ovw: cute.Tensor, sids: cute.Tensor, scnt: cute.Tensor, idxm: cute.Tensor, qsl: cute.Tensor,
                 pos: cute.Tensor, out: cute.Tensor, stream):
        self.kernel(t0, t1, t2, nblk, wreq, ovw, sids, scnt, idxm, qsl, pos, out).launch(
            grid=[1, 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.jit
    def apply(self, table: cute.Tensor, g: cutlass.Constexpr, r: Int32, nblk: cute.Tensor, wreq: cute.Tensor,
              ovw: cute.Tensor, sids: cute.Tensor, scnt: cute.Tensor):
        ratio = RATIOS[g]
        nb = nblk[g, r]
        for w in range(wreq.shape[0]):                 # write order
            if wreq[w] == r:
                start = nb
                if ovw[w] != 0:
                    start = Int32(0)
                n = scnt[g, w]
                for m in cutlass.range_constexpr(self.cap):
                    if m < n:
                        mid = sids[g, w, m]
                        for t in cutlass.range_constexpr(ratio):
                            col = start + m * ratio + t
                            if col < table.shape[1]:   # the reference's slice stops at the row's end
                                table[r, col] = mid * ratio + t
                nb = start + n * ratio
        nblk[g, r] = nb

    @cute.jit
    def slot(self, table: cute.Tensor, g: cutlass.Constexpr, req: Int32, p: Int64):
        kb = KERNEL_BLOCK_SIZES[g]
        return Int64(table[req, Int32(p // kb)]) * kb + p % kb

    @cute.kernel
    def kernel(self, t0: cute.Tensor, t1: cute.Tensor, t2: cute.Tensor, nblk: cute.Tensor, wreq: cute.Tensor,
               ovw: cute.Tensor, sids: cute.Tensor, scnt: cute.Tensor, idxm: cute.Tensor, qsl: cute.Tensor,
               pos: cute.Tensor, out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        nreq = idxm.shape[0]
        for it in range((3 * nreq + THREADS - 1) // THREADS):
            gr = Int32(it) * THREADS + tidx
            if gr < 3 * nreq:
                g = gr // nreq
                r = gr - g * nreq
                if g == 0:
                    self.apply(t0, 0, r, nblk, wreq, ovw, sids, scnt)
                elif g == 1:
                    self.apply(t1, 1, r, nblk, wreq, ovw, sids, scnt)
                else:
                    self.apply(t2, 2, r, nblk, wreq, ovw, sids, scnt)
        cute.arch.sync_threads()                       # phase 2 reads rows other threads wrote
        ntok = pos.shape[0]
        total = qsl[nreq]
        for it in range((ntok + THREADS - 1) // THREADS):
            i = Int32(it) * THREADS + tidx
            if i < ntok:
                s0 = Int64(-1)
                s1 = Int64(-1)
                s2 = Int64(-1)
                if i < total:
                    row = Int32(0)
                    for k in range(nreq):
                        if qsl[k + 1] <= i:
                            row = row + 1
                    if row > nreq - 1:
                        row = nreq - 1
                    req = idxm[row]
                    p = pos[i]
                    s0 = self.slot(t0, 0, req, p)
                    s1 = self.slot(t1, 1, req, p)
                    s2 = self.slot(t2, 2, req, p)
                out[0, i] = s0
                out[1, i] = s1
                out[2, i] = s2


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(block_table_0, block_table_1, block_table_2, num_blocks, write_requests, overwrite, staged_ids,
             staged_counts, idx_mapping, query_start_loc, positions, arch=None):
    cap = staged_ids.shape[2]
    if cap not in _COMPILED:
        i32, i64, u8 = cutlass.Int32, cutlass.Int64, cutlass.Uint8
        req, nw, req1, ntok = cute.sym_int(), cute.sym_int(), cute.sym_int(), cute.sym_int()
        tables = [make_fake_compact_tensor(i32, (req, cute.sym_int()), stride_order=(1, 0)) for _ in range(3)]
        args = [*tables,
                make_fake_compact_tensor(i32, (3, req), stride_order=(1, 0)),
                make_fake_compact_tensor(i32, (nw,)),
                make_fake_compact_tensor(u8, (nw,)),
                make_fake_compact_tensor(i32, (3, nw, cap), stride_order=(2, 1, 0)),
                make_fake_compact_tensor(i32, (3, nw), stride_order=(1, 0)),
                make_fake_compact_tensor(i32, (req,)),
                make_fake_compact_tensor(i32, (req1,)),
                make_fake_compact_tensor(i64, (ntok,)),
                make_fake_compact_tensor(i64, (3, ntok), stride_order=(1, 0)),
                make_fake_stream(use_tvm_ffi_env_stream=True)]
        _COMPILED[cap] = cute.compile(TableUpdate(cap), *args, options=f"--gpu-arch {arch or _arch()} --enable-tvm-ffi")
    return [_COMPILED[cap]]


def solve(block_table_0, block_table_1, block_table_2, num_blocks, write_requests, overwrite, staged_ids,
          staged_counts, idx_mapping, query_start_loc, positions):
    (fn,) = _prepare(block_table_0, block_table_1, block_table_2, num_blocks, write_requests, overwrite, staged_ids,
                     staged_counts, idx_mapping, query_start_loc, positions)
    out = torch.empty(3, positions.shape[0], dtype=torch.int64, device=positions.device)
    fn(block_table_0, block_table_1, block_table_2, num_blocks, write_requests.contiguous(),
       overwrite.contiguous().view(torch.uint8), staged_ids.contiguous(), staged_counts.contiguous(),
       idx_mapping.contiguous(), query_start_loc.contiguous(), positions.contiguous(), out)
    return out
