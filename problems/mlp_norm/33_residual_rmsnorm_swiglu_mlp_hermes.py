"""Pre-norm SwiGLU MLP: r = x + residual (bf16); h = weight * RMSNorm(r) (eps given); y = W_down(SiLU(W_gate h) * W_up h); returns y only (bf16 in, bf16 out)."""
# Source: Hermes-3-Llama-3.1-405B config.json (Llama-3.1-405B architecture): hidden_size 16384,
# intermediate_size 53248, hidden_act silu, rms_norm_eps 1e-5, no MLP biases. RMSNorm as in Llama:
# statistics in fp32, the normalised value cast back to the activation dtype, then times weight.
# Original (MetaKernelBench p33): inputs (x, residual, norm weight, W_gate, W_up, W_down, eps);
# the residual sum is not an output.
# Workload: batch 64 x 128 tokens = 8,192 tokens (one unsharded MLP layer, ~43 TFLOP; weights
# 5.2 GB in bf16).
# Fixed: shapes, eps 1e-5. Redrawn per draw: x, residual (N(0,1)), norm weight (1 + 0.1 N),
# weights (N(0,1)/sqrt(fan_in)).
import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {"flops": 3 * 2 * 8192 * 16384 * 53248 + 4 * 8192 * 53248 + 5 * 8192 * 16384,
       "bytes": 2 * (2 * 8192 * 16384 + 16384 + 3 * 16384 * 53248 + 8192 * 16384)}

EPS = 1e-5


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        b, s, d, f = 2, 8, 64, 208
    else:
        b, s, d, f = 64, 128, 16384, 53248
    bf = torch.bfloat16
    x = torch.randn(b, s, d, device=device, dtype=bf)
    residual = torch.randn(b, s, d, device=device, dtype=bf)
    norm_w = (1 + 0.1 * torch.randn(d, device=device)).to(bf)
    w_gate = (torch.randn(f, d, device=device) / d ** 0.5).to(bf)
    w_up = (torch.randn(f, d, device=device) / d ** 0.5).to(bf)
    w_down = (torch.randn(d, f, device=device) / f ** 0.5).to(bf)
    return [x, residual, norm_w, w_gate, w_up, w_down, EPS]


def reference(x, residual, norm_w, w_gate, w_up, w_down, eps):
    ct = torch.promote_types(x.dtype, torch.float32)
    r = x + residual
    h = r.to(ct)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    h = norm_w * h.to(x.dtype)
    a = F.silu(F.linear(h, w_gate)) * F.linear(h, w_up)
    return F.linear(a, w_down)
