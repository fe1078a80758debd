"""p25 paged KV-cache block copy (uint8, in place) in TIRx: one launch copies both caches' mapped blocks.

The work is cut finer than one CTA per pair: a CTA of 128 threads copies one 16 KiB chunk of one block
of one cache (grid = chunks x pairs x 2 caches = 4 x 256 x 2 at full scale, flattened), each thread
issuing all eight of its 16-byte loads before its first store. At ~40 registers a thread, many such CTAs
sit on an SM, so ~128 KiB or more of loads are in flight per SM and the stores of one CTA overlap the
loads of the next (the shipped kernel held 512 bytes a thread, one 256-thread CTA an SM, loading then
storing). Only the mapped blocks are read and written; every other destination block is left as it is.

The caches are passed as they are (uint8 [blocks, 32, 8, 256]) and the mapping as the int64 tensor it is:
solve() does no torch work before the launch; the int32 word view is a buffer declared over the same data.
"""
import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

THREADS = 128
VEC = 4            # int32 per 16-byte access
UNROLL = 8         # 16-byte accesses per thread, all loaded before any store


def _make(block_shape):
    bs, heads, dim = block_shape
    words = bs * heads * dim // 4
    nvec = words // VEC
    per_cta = THREADS * UNROLL                 # vectors per CTA
    chunks = (nvec + per_cta - 1) // per_cta
    exact = nvec % per_cta == 0

    @T.prim_func
    def block_copy(ks_h: T.handle, vs_h: T.handle, mp: T.handle, kd_h: T.handle, vd_h: T.handle):
        nb = T.int32()
        npairs = T.int32()
        KS8 = T.match_buffer(ks_h, (nb, bs, heads, dim), "uint8", align=16)
        VS8 = T.match_buffer(vs_h, (nb, bs, heads, dim), "uint8", align=16)
        M = T.match_buffer(mp, (npairs, 2), "int64", align=16)
        KD8 = T.match_buffer(kd_h, (nb, bs, heads, dim), "uint8", align=16)
        VD8 = T.match_buffer(vd_h, (nb, bs, heads, dim), "uint8", align=16)
        T.device_entry()
        bid = T.cta_id([npairs * (2 * chunks)])
        tx = T.thread_id([THREADS])
        KS = T.decl_buffer((nb, words), "int32", data=KS8.data)
        VS = T.decl_buffer((nb, words), "int32", data=VS8.data)
        KD = T.decl_buffer((nb, words), "int32", data=KD8.data)
        VD = T.decl_buffer((nb, words), "int32", data=VD8.data)
        r = T.alloc_local((UNROLL * VEC,), "int32")
        p: T.let = bid // (2 * chunks)
        which: T.let = (bid // chunks) % 2
        c: T.let = bid % chunks
        src: T.let = T.Cast("int32", M[p, 0])
        dst: T.let = T.Cast("int32", M[p, 1])
        if which == 0:
            for u in T.unroll(UNROLL):
                w = T.meta_var(((c * UNROLL + u) * THREADS + tx) * VEC)
                if exact or w < words:
                    T.tile.copy(r[u * VEC:(u + 1) * VEC], KS[src, w:w + VEC])
            for u in T.unroll(UNROLL):
                w = T.meta_var(((c * UNROLL + u) * THREADS + tx) * VEC)
                if exact or w < words:
                    T.tile.copy(KD[dst, w:w + VEC], r[u * VEC:(u + 1) * VEC])
        else:
            for u in T.unroll(UNROLL):
                w = T.meta_var(((c * UNROLL + u) * THREADS + tx) * VEC)
                if exact or w < words:
                    T.tile.copy(r[u * VEC:(u + 1) * VEC], VS[src, w:w + VEC])
            for u in T.unroll(UNROLL):
                w = T.meta_var(((c * UNROLL + u) * THREADS + tx) * VEC)
                if exact or w < words:
                    T.tile.copy(VD[dst, w:w + VEC], r[u * VEC:(u + 1) * VEC])

    return block_copy


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(src_k, src_v, dst_k, dst_v, block_mapping, arch=None):
    block_shape = tuple(src_k.shape[1:])
    assert len(block_shape) == 3 and src_k.dtype == torch.uint8 and src_k[0].numel() % 16 == 0
    assert all(t.is_contiguous() for t in (src_k, src_v, dst_k, dst_v, block_mapping))
    if block_shape not in _COMPILED:
        _COMPILED[block_shape] = _build(_make(block_shape), arch or _arch())
    return [_COMPILED[block_shape]]


def solve(src_k, src_v, dst_k, dst_v, block_mapping):
    exe = _COMPILED.get(tuple(src_k.shape[1:]))
    if exe is None:
        (exe,) = _prepare(src_k, src_v, dst_k, dst_v, block_mapping)
    exe(src_k, src_v, block_mapping, dst_k, dst_v)
