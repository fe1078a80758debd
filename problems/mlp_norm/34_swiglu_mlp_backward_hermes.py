"""Backward of the SwiGLU MLP y = W_down(SiLU(g) * u), g = W_gate x, u = W_up x, from saved activations (g, u, a = SiLU(g) * u): given dL/dy and x, return (dL/dx, dL/dW_gate, dL/dW_up, dL/dW_down) (bf16 in, bf16 out)."""
# Source: Hermes-3-Llama-3.1-405B config.json (Llama-3.1-405B architecture): hidden_size 16384,
# intermediate_size 53248, hidden_act silu, no MLP biases.
# Original (MetaKernelBench p34): inputs (grad_output, hidden_states, three saved [B, S, 53248]
# activations, W_gate, W_up, W_down), 4 outputs. The saved activations are taken here as the gate
# pre-activation g, the up projection u and the product a = SiLU(g) * u (their roles are not
# visible in the original's recipe; all three are drawn independently, as there).
# Semantics: dW_down = dy^T a; da = dy W_down; du = da * SiLU(g); dg = da * u * SiLU'(g) with
# SiLU'(g) = s (1 + g (1 - s)), s = sigmoid(g); dW_gate = dg^T x; dW_up = du^T x;
# dx = dg W_gate + du W_up. GEMMs run in the activation dtype (fp32 accumulate), the elementwise
# SiLU/product math in fp32; outputs bf16.
# Workload: batch 64 x 128 tokens = 8,192 tokens through one unsharded MLP layer (6 GEMMs,
# ~86 TFLOP). Fixed: shapes.
# Redrawn per draw: dy, x, g, u, a (N(0,1)), weights (N(0,1)/sqrt(fan_in)).
import torch

DTYPE = "bf16"
SOL = {"flops": 6 * 2 * 8192 * 16384 * 53248 + 10 * 8192 * 53248,
       "bytes": 2 * (2 * 8192 * 16384 + 3 * 8192 * 53248 + 3 * 16384 * 53248 + 8192 * 16384 + 3 * 16384 * 53248)}


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        b, s, d, f = 2, 8, 64, 208
    else:
        b, s, d, f = 64, 128, 16384, 53248
    bf = torch.bfloat16
    grad_y = torch.randn(b, s, d, device=device, dtype=bf)
    x = torch.randn(b, s, d, device=device, dtype=bf)
    gate = torch.randn(b, s, f, device=device, dtype=bf)
    up = torch.randn(b, s, f, device=device, dtype=bf)
    act = torch.randn(b, s, f, device=device, dtype=bf)
    w_gate = (torch.randn(f, d, device=device) / d ** 0.5).to(bf)
    w_up = (torch.randn(f, d, device=device) / d ** 0.5).to(bf)
    w_down = (torch.randn(d, f, device=device) / f ** 0.5).to(bf)
    return [grad_y, x, gate, up, act, w_gate, w_up, w_down]


def reference(grad_y, x, gate, up, act, w_gate, w_up, w_down):
    ct = torch.promote_types(x.dtype, torch.float32)
    dt = x.dtype
    d, f = x.shape[-1], gate.shape[-1]
    dy, x2 = grad_y.reshape(-1, d), x.reshape(-1, d)
    grad_w_down = dy.t() @ act.reshape(-1, f)
    d_act = (dy @ w_down).to(ct)
    g, u = gate.reshape(-1, f).to(ct), up.reshape(-1, f).to(ct)
    s = torch.sigmoid(g)
    du = (d_act * g * s).to(dt)
    dg = (d_act * u * s * (1 + g * (1 - s))).to(dt)
    del d_act, g, u, s
    grad_w_gate = dg.t() @ x2
    grad_w_up = du.t() @ x2
    grad_x = (dg @ w_gate + du @ w_up).view(x.shape)
    return grad_x, grad_w_gate, grad_w_up, grad_w_down
