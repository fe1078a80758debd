"""RWKV-4 WKV recurrence with running-max stabilisation, from a carried state: fp32 time_decay/time_first [C], k/v [B,T,C] and state (aa, bb, pp) [B,C] in; returns fp32 wkv [B,T,C] and the final aa, bb, pp."""
# Source: RWKV-4 (Peng et al., 2023, "RWKV: Reinventing RNNs for the Transformer Era"),
# RWKV-4-Pile-1B5: n_embd 2048. Its time mixing computes, per channel c with w = -exp(time_decay)
# and u = time_first,
#   wkv_t = (sum_{i<t} e^{(t-1-i) w + k_i} v_i + e^{u + k_t} v_t) / (same with v = 1),
# evaluated in RNN form with the numerator and denominator stored as (aa, bb) times e^{pp}, pp a
# running maximum of exponents so nothing overflows. Per step:
#   ww = u + k_t; p = max(pp, ww); e1 = exp(pp - p); e2 = exp(ww - p)
#   wkv_t = (e1 aa + e2 v_t) / (e1 bb + e2)
#   ww = pp + w; p = max(ww, k_t); e1 = exp(ww - p); e2 = exp(k_t - p)
#   aa = e1 aa + e2 v_t; bb = e1 bb + e2; pp = p
# The returned state (aa, bb, pp) is defined by exactly this stabilisation.
# Workload: 64 sequences x 1721 tokens x 2048 channels, continuing from a previous segment's state.
# Reference: a loop over the 1721 time steps (the recurrence is the definition), each step
# vectorised over batch and channels, fp32.
# Fixed: shapes. Redrawn per draw: time_decay ~ U(-6, 2) (per channel), time_first ~ N(0, 0.5^2);
# k ~ N(0,1), v ~ N(0,1); state: pp ~ N(0,1), aa ~ N(0,1), bb ~ U(0.5, 2) (fp32).
import torch

DTYPE = "fp32"
SOL = {
    "flops": 20 * 64 * 1721 * 2048,
    "bytes": 4 * (2 * 2048 + 2 * 64 * 1721 * 2048 + 3 * 64 * 2048) + 4 * (64 * 1721 * 2048 + 3 * 64 * 2048),
}


def make_inputs(device="cuda", scale="full"):
    batch, seq, ch = (64, 1721, 2048) if scale == "full" else (2, 19, 32)
    time_decay = torch.empty(ch, device=device).uniform_(-6, 2)
    time_first = 0.5 * torch.randn(ch, device=device)
    k = torch.randn(batch, seq, ch, device=device)
    v = torch.randn(batch, seq, ch, device=device)
    aa = torch.randn(batch, ch, device=device)
    bb = torch.empty(batch, ch, device=device).uniform_(0.5, 2)
    pp = torch.randn(batch, ch, device=device)
    return [time_decay, time_first, k, v, aa, bb, pp]


def reference(time_decay, time_first, k, v, aa, bb, pp):
    w = -torch.exp(time_decay)
    uk = time_first + k  # the bonus exponent u + k_t for every step at once
    out = torch.empty_like(k)
    for t in range(k.shape[1]):
        kt, vt = k[:, t], v[:, t]
        p = torch.maximum(pp, uk[:, t])
        e1, e2 = torch.exp(pp - p), torch.exp(uk[:, t] - p)
        torch.div(torch.addcmul(e2 * vt, e1, aa), torch.addcmul(e2, e1, bb), out=out[:, t])
        ww = pp + w
        p = torch.maximum(ww, kt)
        e1, e2 = torch.exp(ww - p), torch.exp(kt - p)
        aa = torch.addcmul(e2 * vt, e1, aa)
        bb = torch.addcmul(e2, e1, bb)
        pp = p
    return out, aa, bb, pp
