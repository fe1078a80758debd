"""p26 hybrid KV-cache block-table update (in place) + slot mapping in TIRx: one single-CTA kernel.

Phase 1, a thread per (group, request): scan the 128 staged writes in write order, apply the ones
for its request (start at 0 on overwrite, else at the running num_blocks; manager block m becomes
kernel blocks m * ratio + t), and store the final num_blocks.  Writes for one (group, request) only
ever touch that row, so the rows are independent and the write order is kept within each.
Phase 2, after a CTA barrier (the updated rows are visible to every thread of the CTA): a thread per
token finds its batch row (the count of query_start_loc[1:] <= token), reads the request's updated
table entry and writes the int64 slot of each group, -1 past the scheduled tokens.  Everything stays
in one kernel: no torch work on the data path.
"""
import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

BLOCK_SIZES = (16, 32, 8)
KERNEL_BLOCK_SIZES = (16, 16, 8)
RATIOS = tuple(b // k for b, k in zip(BLOCK_SIZES, KERNEL_BLOCK_SIZES))
THREADS = 1024


def _make(CAP: int):
    R0, R1, R2 = RATIOS
    K0, K1, K2 = KERNEL_BLOCK_SIZES

    @T.prim_func
    def table_update(t0_h: T.handle, t1_h: T.handle, t2_h: T.handle, nb_h: T.handle, wr_h: T.handle,
                     ov_h: T.handle, si_h: T.handle, sc_h: T.handle, im_h: T.handle, qs_h: T.handle,
                     pos_h: T.handle, out_h: T.handle):
        nreq = T.int32()
        w0 = T.int32()
        w1 = T.int32()
        w2 = T.int32()
        nw = T.int32()
        nq = T.int32()
        ntok = T.int32()
        TB0 = T.match_buffer(t0_h, (nreq, w0), "int32")
        TB1 = T.match_buffer(t1_h, (nreq, w1), "int32")
        TB2 = T.match_buffer(t2_h, (nreq, w2), "int32")
        NB = T.match_buffer(nb_h, (3, nreq), "int32")
        WR = T.match_buffer(wr_h, (nw,), "int32")
        OV = T.match_buffer(ov_h, (nw,), "uint8")
        SI = T.match_buffer(si_h, (3, nw, CAP), "int32")
        SC = T.match_buffer(sc_h, (3, nw), "int32")
        IM = T.match_buffer(im_h, (nreq,), "int32")
        QS = T.match_buffer(qs_h, (nq,), "int32")
        POS = T.match_buffer(pos_h, (ntok,), "int64")
        OUT = T.match_buffer(out_h, (3, ntok), "int64")
        T.device_entry()
        tx = T.thread_id([THREADS])
        st = T.alloc_local((3,), "int32")            # running num_blocks, start, batch row
        for it in T.serial(T.ceildiv(3 * nreq, THREADS)):
            gr = T.meta_var(it * THREADS + tx)
            if gr < 3 * nreq:
                for g in T.unroll(3):
                    if gr // nreq == g:
                        r = T.meta_var(gr - g * nreq)
                        st[0] = NB[g, r]
                        for w in T.serial(nw):       # write order
                            if WR[w] == r:
                                st[1] = st[0]
                                if OV[w] != T.uint8(0):
                                    st[1] = 0
                                for m in T.unroll(CAP):
                                    if m < SC[g, w]:
                                        if g == 0:
                                            for t in T.unroll(R0):
                                                if st[1] + m * R0 + t < w0:   # the reference's slice stops at the row's end
                                                    TB0[r, st[1] + m * R0 + t] = SI[g, w, m] * R0 + t
                                        elif g == 1:
                                            for t in T.unroll(R1):
                                                if st[1] + m * R1 + t < w1:
                                                    TB1[r, st[1] + m * R1 + t] = SI[g, w, m] * R1 + t
                                        else:
                                            for t in T.unroll(R2):
                                                if st[1] + m * R2 + t < w2:
                                                    TB2[r, st[1] + m * R2 + t] = SI[g, w, m] * R2 + t
                                st[0] = st[1] + SC[g, w] * T.if_then_else(g == 0, R0, T.if_then_else(g == 1, R1, R2))
                        NB[g, r] = st[0]
        T.cuda.cta_sync()                              # phase 2 reads rows other threads wrote
        for it in T.serial(T.ceildiv(ntok, THREADS)):
            i = T.meta_var(it * THREADS + tx)
            if i < ntok:
                if i < QS[nreq]:
                    st[2] = 0
                    for k in T.serial(nreq):
                        if QS[k + 1] <= i:
                            st[2] = st[2] + 1
                    req: T.let = IM[T.min(st[2], nreq - 1)]
                    p: T.let = POS[i]
                    OUT[0, i] = T.Cast("int64", TB0[req, T.Cast("int32", p // K0)]) * K0 + p % K0
                    OUT[1, i] = T.Cast("int64", TB1[req, T.Cast("int32", p // K1)]) * K1 + p % K1
                    OUT[2, i] = T.Cast("int64", TB2[req, T.Cast("int32", p // K2)]) * K2 + p % K2
                else:
                    OUT[0, i] = T.int64(-1)
                    OUT[1, i] = T.int64(-1)
                    OUT[2, i] = T.int64(-1)

    return table_update


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(block_table_0, block_table_1, block_table_2, num_blocks, write_requests, overwrite, staged_ids,
             staged_counts, idx_mapping, query_start_loc, positions, arch=None):
    cap = staged_ids.shape[2]
    if cap not in _COMPILED:
        _COMPILED[cap] = _build(_make(cap), arch or _arch())
    return [_COMPILED[cap]]


def solve(block_table_0, block_table_1, block_table_2, num_blocks, write_requests, overwrite, staged_ids,
          staged_counts, idx_mapping, query_start_loc, positions):
    (exe,) = _prepare(block_table_0, block_table_1, block_table_2, num_blocks, write_requests, overwrite, staged_ids,
                      staged_counts, idx_mapping, query_start_loc, positions)
    out = torch.empty(3, positions.shape[0], dtype=torch.int64, device=positions.device)
    exe(block_table_0, block_table_1, block_table_2, num_blocks, write_requests.contiguous(),
        overwrite.contiguous().view(torch.uint8), staged_ids.contiguous(), staged_counts.contiguous(),
        idx_mapping.contiguous(), query_start_loc.contiguous(), positions.contiguous(), out)
    return out
