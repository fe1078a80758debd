"""Backward of the SwiGLU MLP y = W_down(SiLU(W_gate h) * W_up h): given h and dL/dy, return (dL/dh, dL/dW_gate, dL/dW_up, dL/dW_down) (bf16 in, bf16 out)."""
# Source: Hermes-3-Llama-3.1-405B config.json (Llama-3.1-405B architecture): hidden_size 16384,
# intermediate_size 53248, hidden_act silu, no MLP biases.
# Workload: batch 64 x 128 tokens = 8,192 tokens through one unsharded MLP layer (~114 TFLOP:
# gate/up recomputation, 3 weight-gradient GEMMs, 3 input-gradient GEMMs).
# The gate/up activations are recomputed from h (activation checkpointing); GEMMs run in the
# activation dtype, the SiLU/product elementwise math in at least fp32.
# Fixed: shapes. Redrawn per draw: h, grad_y (N(0,1)), weights (N(0,1)/sqrt(fan_in)).
import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {"flops": 8 * 2 * 8192 * 16384 * 53248 + 12 * 8192 * 53248,
       "bytes": 2 * (2 * 8192 * 16384 + 3 * 16384 * 53248 + 8192 * 16384 + 3 * 16384 * 53248)}


def make_inputs(device="cuda", scale="full"):
    if scale == "smoke":
        t, d, f = 16, 64, 208
    else:
        t, d, f = 8192, 16384, 53248
    bf = torch.bfloat16
    h = torch.randn(t, d, device=device, dtype=bf)
    w_gate = (torch.randn(f, d, device=device) / d ** 0.5).to(bf)
    w_up = (torch.randn(f, d, device=device) / d ** 0.5).to(bf)
    w_down = (torch.randn(d, f, device=device) / f ** 0.5).to(bf)
    grad_y = torch.randn(t, d, device=device, dtype=bf)
    return [h, w_gate, w_up, w_down, grad_y]


def reference(h, w_gate, w_up, w_down, grad_y):
    ct = torch.promote_types(h.dtype, torch.float32)
    dt = h.dtype
    g = F.linear(h, w_gate).to(ct)
    u = F.linear(h, w_up).to(ct)
    s = torch.sigmoid(g)
    a = g * s                                        # SiLU(g)
    grad_w_down = grad_y.t() @ (a * u).to(dt)
    d_act = (grad_y @ w_down).to(ct)
    du = (d_act * a).to(dt)
    del a
    dg = (d_act * u * s * (1 + g * (1 - s))).to(dt)
    del g, u, s, d_act
    grad_w_gate = dg.t() @ h
    grad_w_up = du.t() @ h
    grad_h = dg @ w_gate + du @ w_up
    return grad_h, grad_w_gate, grad_w_up, grad_w_down
