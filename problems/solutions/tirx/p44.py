"""p44 DeepSeek-V3 MoE layer on one EP rank (FP8 block-scaled experts) with TIRx routing.

The routing is one TIRx kernel, one warp per token: sigmoid (fp64, rounded once), + bias, group
score = top-2 sum per group of 32 (shuffle merge over the 4 lanes of a group), top-4 groups, 8 rounds of
a warp arg-max for the top-8 experts, and the normalised weights (fp64 sum and division; the routed
scaling factor is applied in eager).
The experts (this rank's 32 of 256) run in eager PyTorch: block dequantization to bf16 and tensor-core
GEMMs per expert (gemm1 rows: up, then gate), SwiGLU, and an fp32 weighted scatter-add of the routed
pairs.
"""
import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

N_GROUP, TOPK_GROUP, TOP_K = 8, 4, 8
BLOCK = 128


def _make_router(E: int):
    @T.prim_func
    def router(l_h: T.handle, b_h: T.handle, i_h: T.handle, w_h: T.handle):
        ntok = T.int32()
        LG = T.match_buffer(l_h, (ntok, E), "float32", align=16)
        BIAS = T.match_buffer(b_h, (E,), "float32", align=16)
        IDX = T.match_buffer(i_h, (ntok, TOP_K), "int32")
        W = T.match_buffer(w_h, (ntok, TOP_K), "float32")
        T.device_entry()
        bx = T.cta_id([T.ceildiv(ntok, 4)])
        tx = T.thread_id([128])
        rl = T.alloc_local((8,), "float32")
        rb = T.alloc_local((8,), "float32")
        sc = T.alloc_local((8,), "float32")
        val = T.alloc_local((8,), "float32")
        tt = T.alloc_local((2,), "float32")          # top-1, top-2 of the group
        best = T.alloc_local((2,), "float32")        # value, score of the running arg-max
        bi = T.alloc_local((1,), "int32")
        rank = T.alloc_local((1,), "int32")
        mine = T.alloc_local((2,), "float32")        # this lane's chosen score (lanes < 8)
        mi = T.alloc_local((1,), "int32")
        ssum = T.alloc_local((1,), "float64")
        lane: T.let = tx % 32
        t: T.let = bx * 4 + tx // 32
        if t < ntok:
            T.tile.copy(rl[:], LG[t, lane * 8:lane * 8 + 8])
            T.tile.copy(rb[:], BIAS[lane * 8:lane * 8 + 8])
            tt[0] = T.float32("-inf")
            tt[1] = T.float32("-inf")
            for e in T.unroll(8):
                sc[e] = T.Cast("float32", T.float64(1) / (T.float64(1) + T.exp(-T.Cast("float64", rl[e]))))
                val[e] = sc[e] + rb[e]
                tt[1] = T.max(tt[1], T.min(tt[0], val[e]))
                tt[0] = T.max(tt[0], val[e])
            for sh in T.unroll(2):
                o1: T.float32 = T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), tt[0], 1 << sh, 32, 32)
                o2: T.float32 = T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), tt[1], 1 << sh, 32, 32)
                tt[1] = T.max(T.min(tt[0], o1), T.max(tt[1], o2))
                tt[0] = T.max(tt[0], o1)
            gs: T.float32 = tt[0] + tt[1]
            rank[0] = 0
            for g in T.unroll(N_GROUP):
                other: T.float32 = T.tvm_warp_shuffle(T.uint32(0xFFFFFFFF), gs, 4 * g, 32, 32)
                if other > gs or (other == gs and g < lane // 4):
                    rank[0] = rank[0] + 1
            if rank[0] >= TOPK_GROUP:
                for e in T.unroll(8):
                    val[e] = T.float32("-inf")
            ssum[0] = T.float64(0)
            mine[0] = T.float32(0)
            mi[0] = 0
            for k in T.unroll(TOP_K):
                best[0] = T.float32("-inf")
                best[1] = T.float32(0)
                bi[0] = 1 << 30
                for e in T.unroll(8):
                    if val[e] > best[0]:
                        best[0] = val[e]
                        best[1] = sc[e]
                        bi[0] = lane * 8 + e
                for sh in T.unroll(5):
                    ov: T.float32 = T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), best[0], 1 << sh, 32, 32)
                    os_: T.float32 = T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), best[1], 1 << sh, 32, 32)
                    oi: T.int32 = T.tvm_warp_shuffle_xor(T.uint32(0xFFFFFFFF), bi[0], 1 << sh, 32, 32)
                    if ov > best[0] or (ov == best[0] and oi < bi[0]):
                        best[0] = ov
                        best[1] = os_
                        bi[0] = oi
                for e in T.unroll(8):
                    if bi[0] == lane * 8 + e:
                        val[e] = T.float32("-inf")
                ssum[0] = ssum[0] + T.Cast("float64", best[1])
                if lane == k:
                    mi[0] = bi[0]
                    mine[0] = best[1]
            if lane < TOP_K:
                IDX[t, lane] = mi[0]
                W[t, lane] = T.Cast("float32", T.Cast("float64", mine[0]) / ssum[0])

    return router


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(routing_logits, routing_bias, *rest, arch=None):
    experts = routing_logits.shape[1]
    assert experts == 256
    if experts not in _COMPILED:
        _COMPILED[experts] = _build(_make_router(experts), arch or _arch())
    return [_COMPILED[experts]]


def _dequant_bf16(w, scale):
    """fp8 weight [R, C] with [R/128, C/128] block scales -> bf16 (fp32 product, one rounding)."""
    rows, cols = w.shape
    return (w.to(torch.float32).view(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK)
            * scale[:, None, :, None]).view(rows, cols).to(torch.bfloat16)


def _experts(hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale, gemm2_weights,
             gemm2_weights_scale, experts, weights, local_expert_offset):
    """Eager part: the routed (token, local expert) pairs through the FP8 block-scaled SwiGLU experts.

    Dequantized operands are rounded to bf16 and multiplied on tensor cores (fp32 accumulation);
    the weighted sum over a token's experts is kept in fp32 and rounded to bf16 once.
    """
    tokens, hidden = hidden_states.shape
    local = gemm1_weights.shape[0]
    x = (hidden_states.to(torch.float32).view(tokens, hidden // BLOCK, BLOCK)
         * hidden_states_scale.to(torch.float32).t()[:, :, None]).view(tokens, hidden).to(torch.bfloat16)
    out = torch.zeros(tokens, hidden, dtype=torch.float32, device=hidden_states.device)
    flat = experts.reshape(-1).to(torch.int64) - local_expert_offset
    mine = ((flat >= 0) & (flat < local)).nonzero().squeeze(1)
    order = mine[torch.argsort(flat[mine], stable=True)]
    counts = torch.bincount(flat[order], minlength=local).tolist()
    start = 0
    for e in range(local):
        n = counts[e]
        if n == 0:
            continue
        sel = order[start:start + n]
        start += n
        tok, slot = sel // TOP_K, sel % TOP_K
        h = x[tok] @ _dequant_bf16(gemm1_weights[e], gemm1_weights_scale[e]).T
        up, gate = h.to(torch.float32).chunk(2, dim=-1)
        a = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16)
        y = a @ _dequant_bf16(gemm2_weights[e], gemm2_weights_scale[e]).T
        out.index_add_(0, tok, y.to(torch.float32) * weights[tok, slot, None])
    return out.to(torch.bfloat16)


def solve(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale,
          gemm2_weights, gemm2_weights_scale, local_expert_offset, routed_scaling_factor):
    (router,) = _prepare(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
                         gemm1_weights_scale, gemm2_weights, gemm2_weights_scale)
    tokens = routing_logits.shape[0]
    dev = routing_logits.device
    experts = torch.empty(tokens, TOP_K, dtype=torch.int32, device=dev)
    weights = torch.empty(tokens, TOP_K, dtype=torch.float32, device=dev)
    router(routing_logits.to(torch.float32).contiguous(), routing_bias.to(torch.float32).contiguous(), experts, weights)
    return _experts(hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale, gemm2_weights,
                    gemm2_weights_scale, experts, weights * routed_scaling_factor, local_expert_offset)
