"""HyenaDNA-small residual block in fp32: LayerNorm -> Hyena operator (in_proj to 3 streams, width-3 causal depthwise short conv, implicit long filter from a sine-activated MLP over positional features with exponential decay, gate * causal FFT long convolution + bias skip, gate, out_proj) -> residual -> LayerNorm -> GELU MLP -> residual; x [32,256,256] in and out."""
# Source: HyenaDNA (Nguyen et al., 2023) hyenadna-small: d_model 256, d_inner 1024, Hyena layer
# with order 2, filter_order 64, emb_dim 5, short (local) filter order 3, modulate true, w 10;
# Hyena operator (Poli et al., 2023): u -> in_proj (d -> 3d) -> short depthwise causal conv ->
# split into x0, x1, v; v = x1 * v; v = causal_conv(v, h) + bias * v (via FFT, length 2L);
# y = x0 * v -> out_proj. The long filter h (one per channel) is implicit: positional features
# z(t) = [t, Re e^{-i f w_t}, Im e^{-i f w_t}] (t = linspace(0, 1, L), w_t = 2 pi t_idx / L,
# f = linspace(1e-4, 1, 2)) pass through Linear(5, 64) -> sin(per-channel freq * .) ->
# Linear(64, 64) -> sin -> Linear(64, 64) -> sin -> Linear(64, 256, no bias), and are
# multiplied by exp(-t |delta_c|) + shift, delta_c = linspace(ln(1e-2) / 1.5, ln(1e-2) / 0.3, 256).
# Block: h1 = x + Hyena(LN1(x)); out = h1 + fc2(gelu(fc1(LN2(h1)))), LayerNorm eps given, exact GELU.
# Original (MetaKernelBench p67): 27 inputs in the order (x, norm1 weight/bias, norm2 weight/bias,
# in_proj weight/bias, short filter weight/bias, filter Linear(5, 64) weight/bias, sine frequencies
# [1, 64], filter Linears (64, 64) x 2 with biases, filter output Linear(64, 256) weight, filter
# bias, modulation deltas [256], out_proj weight/bias, fc1 weight/bias, fc2 weight/bias, eps 1e-5,
# modulation shift 0.0).
# Workload: 32 sequences x 256 tokens; the filter's positional grid is the workload length (256).
# Fixed: shapes, positional grid, decay rates (an input), eps, shift. Redrawn per draw: x (N(0,1))
# and all parameters (linear weights N(0, 1/fan_in), biases 0.02 N, norm weights 1 + 0.1 N and
# biases 0.1 N, conv weights N(0, 1/3), sine frequencies 1 + 0.1 N(0,1) as the original draws them,
# filter skip bias N(0,1)).
import math

import torch
import torch.nn.functional as F

DTYPE = "fp32"
SOL = {
    "flops": 2 * 8192 * 256 * (768 + 256 + 2 * 1024) + 6 * 8192 * 768 + 32 * 256 * 3 * 5 * 512 * 9
    + 30 * 8192 * 256,
    "bytes": 4 * (2 * 8192 * 256 + 768 * 256 + 768 + 768 * 3 + 768 + 5 * 64 + 3 * 64 + 2 * 64 * 64
                  + 2 * 64 + 256 * 64 + 2 * 256 + 256 * 256 + 256 + 4 * 256 + 2 * 1024 * 256 + 1024 + 256),
}

EMB_DIM, FILTER_ORDER, SHORT = 5, 64, 3
EPS, SHIFT = 1e-5, 0.0


def _positional(seq, cdt, device):
    """[L, 5] features and the [L, 1] time grid t in [0, 1]."""
    t = torch.linspace(0, 1, seq, dtype=cdt, device=device)[:, None]
    w = 2 * math.pi * torch.arange(seq, dtype=cdt, device=device)[:, None] / seq
    f = torch.linspace(1e-4, (EMB_DIM - 1) // 2 - 1, (EMB_DIM - 1) // 2, dtype=cdt, device=device)
    return torch.cat([t, torch.cos(f * w), -torch.sin(f * w)], dim=-1), t


def make_inputs(device="cuda", scale="full"):
    batch, seq, d, inner = (32, 256, 256, 1024) if scale == "full" else (2, 24, 16, 64)

    def linear(n_out, n_in, bias=True):
        w = torch.randn(n_out, n_in, device=device) / n_in ** 0.5
        return [w, 0.02 * torch.randn(n_out, device=device)] if bias else [w]

    def norm():
        return [1 + 0.1 * torch.randn(d, device=device), 0.1 * torch.randn(d, device=device)]

    x = torch.randn(batch, seq, d, device=device)
    short = [torch.randn(3 * d, 1, SHORT, device=device) / SHORT ** 0.5, 0.02 * torch.randn(3 * d, device=device)]
    freq = 1 + 0.1 * torch.randn(1, FILTER_ORDER, device=device)
    deltas = torch.linspace(math.log(1e-2) / 1.5, math.log(1e-2) / 0.3, d, device=device)
    return [x, *norm(), *norm(), *linear(3 * d, d), *short, *linear(FILTER_ORDER, EMB_DIM), freq,
            *linear(FILTER_ORDER, FILTER_ORDER), *linear(FILTER_ORDER, FILTER_ORDER), *linear(d, FILTER_ORDER, False),
            torch.randn(d, device=device), deltas, *linear(d, d), *linear(inner, d), *linear(d, inner), EPS, SHIFT]


def _implicit_filter(seq, device, f1_w, f1_b, freq, f2_w, f2_b, f3_w, f3_b, f4_w, deltas, shift):
    z, t = _positional(seq, f1_w.dtype, device)
    h = torch.sin(freq * F.linear(z, f1_w, f1_b))
    h = torch.sin(freq * F.linear(h, f2_w, f2_b))
    h = torch.sin(freq * F.linear(h, f3_w, f3_b))
    return (F.linear(h, f4_w) * (torch.exp(-t * deltas.abs()) + shift)).T  # [D, L]


def reference(x, ln1_w, ln1_b, ln2_w, ln2_b, in_w, in_b, short_w, short_b, f1_w, f1_b, freq, f2_w, f2_b, f3_w,
              f3_b, f4_w, filt_bias, deltas, out_w, out_b, fc1_w, fc1_b, fc2_w, fc2_b, eps, shift):
    b, seq, d = x.shape
    u = F.layer_norm(x, (d,), ln1_w, ln1_b, eps=eps)
    z = F.linear(u, in_w, in_b).transpose(1, 2)  # [B, 3D, L]
    z = F.conv1d(z, short_w, short_b, padding=SHORT - 1, groups=3 * d)[..., :seq]
    x0, x1, v = z.split(d, dim=1)
    h = _implicit_filter(seq, x.device, f1_w, f1_b, freq, f2_w, f2_b, f3_w, f3_b, f4_w, deltas, shift)
    v = v * x1
    n_fft = 2 * seq
    conv = torch.fft.irfft(torch.fft.rfft(v, n=n_fft) * torch.fft.rfft(h, n=n_fft), n=n_fft)[..., :seq]
    y = (conv + v * filt_bias[:, None]) * x0
    h1 = x + F.linear(y.transpose(1, 2), out_w, out_b)
    m = F.layer_norm(h1, (d,), ln2_w, ln2_b, eps=eps)
    return h1 + F.linear(F.gelu(F.linear(m, fc1_w, fc1_b)), fc2_w, fc2_b)
