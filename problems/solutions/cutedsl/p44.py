"""p44 DeepSeek-V3 MoE layer on one EP rank (FP8 block-scaled experts) with CuTe DSL routing.

The routing is one CuTe DSL kernel, one warp per token: sigmoid (fp64, rounded once), + bias, group
score = top-2 sum per group of 32 (shuffle merge over the 4 lanes of a group), top-4 groups, 8 rounds of
a warp arg-max for the top-8 experts, and the normalised weights (fp64 sum and division; the routed
scaling factor is applied in eager).
The experts (this rank's 32 of 256) run in eager PyTorch: block dequantization to bf16 and tensor-core
GEMMs per expert (gemm1 rows: up, then gate), SwiGLU, and an fp32 weighted scatter-add of the routed
pairs.
"""
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Float64, Int32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

N_GROUP, TOPK_GROUP, TOP_K = 8, 4, 8
BLOCK = 128
NEG_INF = float("-inf")


class Router:
    """One warp per token: sigmoid, + bias, group-limited top-k, normalised weights (lane l: experts 8l..8l+7)."""

    def __init__(self, experts: int):
        assert experts == 256
        self.E = experts

    @cute.jit
    def __call__(self, logits: cute.Tensor, bias: cute.Tensor, idx_out: cute.Tensor, w_out: cute.Tensor, stream):
        tokens = logits.shape[0]
        self.kernel(logits, bias, idx_out, w_out).launch(grid=[(tokens + 3) // 4, 1, 1], block=[128, 1, 1],
                                                         stream=stream)

    @cute.kernel
    def kernel(self, logits: cute.Tensor, bias: cute.Tensor, idx_out: cute.Tensor, w_out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        t = bidx * 4 + tidx // 32
        if t < logits.shape[0]:
            rl = cute.make_rmem_tensor((8,), Float32)
            rb = cute.make_rmem_tensor((8,), bias.element_type)
            cute.autovec_copy(cute.zipped_divide(logits[t, None], (8,))[None, lane], rl)
            cute.autovec_copy(cute.zipped_divide(bias, (8,))[None, lane], rb)
            sc = cute.make_rmem_tensor((8,), Float32)
            val = cute.make_rmem_tensor((8,), Float32)
            t1 = Float32(NEG_INF)
            t2 = Float32(NEG_INF)
            for e in cutlass.range_constexpr(8):
                sc[e] = Float32(1.0 / (1.0 + cute.math.exp(-Float64(rl[e]))))
                val[e] = sc[e] + rb[e].to(Float32)
                t2 = cutlass.max(t2, cutlass.min(t1, val[e]))
                t1 = cutlass.max(t1, val[e])
            for sh in cutlass.range_constexpr(2):                # merge top-2 over the 4 lanes of a group
                o1 = cute.arch.shuffle_sync_bfly(t1, offset=1 << sh)
                o2 = cute.arch.shuffle_sync_bfly(t2, offset=1 << sh)
                t2 = cutlass.max(cutlass.min(t1, o1), cutlass.max(t2, o2))
                t1 = cutlass.max(t1, o1)
            gs = t1 + t2
            mygroup = lane // 4
            rank = Int32(0)
            for g in cutlass.range_constexpr(N_GROUP):
                other = cute.arch.shuffle_sync(gs, offset=4 * g)
                if other > gs:
                    rank = rank + 1
                elif other == gs and g < mygroup:
                    rank = rank + 1
            if rank >= TOPK_GROUP:
                for e in cutlass.range_constexpr(8):
                    val[e] = Float32(NEG_INF)
            my_idx = Int32(0)
            my_s = Float32(0.0)
            ssum = Float64(0.0)
            for k in cutlass.range_constexpr(TOP_K):
                bv = Float32(NEG_INF)
                bi = Int32(1 << 30)
                bs = Float32(0.0)
                for e in cutlass.range_constexpr(8):
                    if val[e] > bv:
                        bv = val[e]
                        bi = lane * 8 + e
                        bs = sc[e]
                for sh in cutlass.range_constexpr(5):
                    ov = cute.arch.shuffle_sync_bfly(bv, offset=1 << sh)
                    oi = cute.arch.shuffle_sync_bfly(bi, offset=1 << sh)
                    os_ = cute.arch.shuffle_sync_bfly(bs, offset=1 << sh)
                    if ov > bv or (ov == bv and oi < bi):
                        bv = ov
                        bi = oi
                        bs = os_
                for e in cutlass.range_constexpr(8):
                    if bi == lane * 8 + e:
                        val[e] = Float32(NEG_INF)
                ssum = ssum + Float64(bs)
                if lane == k:
                    my_idx = bi
                    my_s = bs
            if lane < TOP_K:
                idx_out[t, lane] = my_idx
                w_out[t, lane] = Float32(Float64(my_s) / ssum)


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _prepare(routing_logits, routing_bias, *rest, arch=None):
    experts = routing_logits.shape[1]
    if experts not in _COMPILED:
        m = cute.sym_int()
        _COMPILED[experts] = cute.compile(
            Router(experts), make_fake_compact_tensor(Float32, (m, experts), stride_order=(1, 0), assumed_align=16),
            make_fake_compact_tensor(Float32, (experts,), assumed_align=16),
            make_fake_compact_tensor(Int32, (m, TOP_K), stride_order=(1, 0)),
            make_fake_compact_tensor(Float32, (m, TOP_K), stride_order=(1, 0)),
            make_fake_stream(use_tvm_ffi_env_stream=True), options=f"--gpu-arch {arch or _arch()} --enable-tvm-ffi")
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
