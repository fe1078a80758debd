"""FP8 block-scaled MLP gate/up projections with SiLU gating from pre-quantized operands: gate = dequant(x) @ dequant(W_gate), up = dequant(x) @ dequant(W_up) with x e4m3 [8704, 3584] (1x128 scales) and K-major weights e4m3 [3584, 18944] (128x128 scales); out = silu(gate) * up, bf16 [8704, 18944]."""
# Source: Qwen2-VL / Qwen2.5-VL-7B MLP (hidden_size 3584, intermediate_size 18944, hidden_act silu)
# in fine-grained FP8 (e4m3 weights with one scale per 128x128 block, activations per token per
# 128 channels), as the slot names it for Qwen3-VL.
# Original (MetaKernelBench p53): inputs (qx, scale_x, qw_gate, scale_gate, qw_up, scale_up),
# quantized in make_inputs; 8704 x 3584 -> 8704 x 18944.
# Semantics: dequant(v)[i, j] = v[i, j] * scale[block of (i, j)]; the weights are stored transposed
# (K-major, [in, out]) as the original quantizes W.T; gate and up in fp32 (fp64 in the anchor),
# silu(gate) * up rounded to bf16 once.
# Quantization used to build the inputs: scale = amax(block) / 448, q = e4m3(v / scale).
# Workload: 8,704 tokens. Fixed: shapes.
# Redrawn per draw: x (N(0,1)), W_gate and W_up (N(0,1)/sqrt(3584) times a per-128x128-block gain
# U(0.5, 2)), all quantized here.
import torch

DTYPE = "fp8"
SOL = {
    "flops": 2 * 2 * 8704 * 3584 * 18944 + 4 * 8704 * 18944,
    "bytes": 8704 * 3584 + 4 * 8704 * 28 + 2 * (3584 * 18944 + 4 * 28 * 148) + 2 * 8704 * 18944,
}

BLOCK = 128
E4M3_MAX = 448.0


def _quantize(t, rows, cols):
    """Blockwise e4m3 quantization of t [R, C] in rows x cols blocks: (codes [R, C], scales [R/rows, C/cols])."""
    r, c = t.shape
    blocks = t.view(r // rows, rows, c // cols, cols)
    scale = blocks.abs().amax(dim=(1, 3), keepdim=True).clamp(min=1e-12) / E4M3_MAX
    codes = (blocks / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return codes.view(r, c), scale.view(r // rows, c // cols)


def _dequant(codes, scale, rows, cols, compute):
    r, c = codes.shape
    blocks = codes.to(compute).view(r // rows, rows, c // cols, cols) * scale.to(compute)[:, None, :, None]
    return blocks.view(r, c)


def _weight(n, k, device):
    gain = torch.rand(n // BLOCK, k // BLOCK, device=device) * 1.5 + 0.5
    w = torch.randn(n, k, device=device) / k ** 0.5
    w = w * gain.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)
    return _quantize(w.T.contiguous(), BLOCK, BLOCK)


def make_inputs(device="cuda", scale="full"):
    tokens, k, n = (8704, 3584, 18944) if scale == "full" else (40, 256, 384)
    qx, scale_x = _quantize(torch.randn(tokens, k, device=device), 1, BLOCK)
    qw_gate, scale_gate = _weight(n, k, device)
    qw_up, scale_up = _weight(n, k, device)
    return [qx, scale_x, qw_gate, scale_gate, qw_up, scale_up]


def reference(qx, scale_x, qw_gate, scale_gate, qw_up, scale_up):
    compute = torch.promote_types(scale_x.dtype, torch.float32)
    out_dtype = torch.bfloat16 if scale_x.dtype != torch.float64 else torch.float64
    x = _dequant(qx, scale_x, 1, BLOCK, compute)
    gate = x @ _dequant(qw_gate, scale_gate, BLOCK, BLOCK, compute)
    up = x @ _dequant(qw_up, scale_up, BLOCK, BLOCK, compute)
    return (torch.nn.functional.silu(gate) * up).to(out_dtype)
