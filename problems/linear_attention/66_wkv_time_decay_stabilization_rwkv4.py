"""RWKV-4 WKV recurrence with running-max stabilisation, from a carried state: fp32 time_decay [C], key [B,T,C], time_first [C], value [B,T,C] and state (num, max, den) [B,C] in; returns fp32 (wkv [B,T,C], num, max, den)."""
# Source: RWKV-4 (Peng et al., 2023), RWKV-4-Pile-1B5: n_embd 2048. Its time mixing computes, per
# channel with w = -exp(time_decay) and u = time_first,
#   wkv_t = (sum_{i<t} e^{(t-1-i) w + k_i} v_i + e^{u + k_t} v_t) / (same with v = 1),
# evaluated in RNN form with numerator and denominator stored as (num, den) times e^{max}, max a
# running maximum of exponents so nothing overflows. Per step:
#   p = max(max, u + k_t); e1 = exp(max - p); e2 = exp(u + k_t - p)
#   wkv_t = (e1 num + e2 v_t) / (e1 den + e2)
#   p = max(max + w, k_t); e1 = exp(max + w - p); e2 = exp(k_t - p)
#   num = e1 num + e2 v_t; den = e1 den + e2; max = p
# Original (MetaKernelBench p66): inputs (time_decay ~ U(-6, -1), key, time_first, value, and three
# [B, C] state tensors, the first two N(0,1), the third U(a, 2)); 4 outputs. The state tensors'
# roles are not visible: we read them as (num, max, den), the only order whose draws keep the
# denominator positive, and return the final state in the same order.
# Workload: 64 sequences x 1721 tokens x 2048 channels, continuing from a previous segment's state.
# Reference: a loop over the 1721 time steps (the recurrence is the definition), each step
# vectorised over batch and channels, fp32 (fp64 in the anchor).
# Fixed: shapes. Redrawn per draw: time_decay (U(-6, -1)), key, value (N(0,1)), time_first
# (0.5 N(0,1)), num and max (N(0,1)), den (U(0.5, 2)), all fp32.
import torch

DTYPE = "fp32"
SOL = {
    "flops": 20 * 64 * 1721 * 2048,
    "bytes": 4 * (2 * 2048 + 2 * 64 * 1721 * 2048 + 3 * 64 * 2048) + 4 * (64 * 1721 * 2048 + 3 * 64 * 2048),
}


def make_inputs(device="cuda", scale="full"):
    batch, seq, ch = (64, 1721, 2048) if scale == "full" else (2, 19, 32)
    time_decay = torch.empty(ch, device=device).uniform_(-6.0, -1.0)
    key = torch.randn(batch, seq, ch, device=device)
    time_first = 0.5 * torch.randn(ch, device=device)
    value = torch.randn(batch, seq, ch, device=device)
    num = torch.randn(batch, ch, device=device)
    mx = torch.randn(batch, ch, device=device)
    den = torch.empty(batch, ch, device=device).uniform_(0.5, 2.0)
    return [time_decay, key, time_first, value, num, mx, den]


def reference(time_decay, key, time_first, value, num, mx, den):
    w = -torch.exp(time_decay)
    out = torch.empty_like(key)
    for t in range(key.shape[1]):
        kt, vt = key[:, t], value[:, t]
        uk = time_first + kt
        p = torch.maximum(mx, uk)
        e1, e2 = torch.exp(mx - p), torch.exp(uk - p)
        out[:, t] = (e1 * num + e2 * vt) / (e1 * den + e2)
        ww = mx + w
        p = torch.maximum(ww, kt)
        e1, e2 = torch.exp(ww - p), torch.exp(kt - p)
        num = e1 * num + e2 * vt
        den = e1 * den + e2
        mx = p
    return out, num, mx, den
