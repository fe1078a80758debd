"""A CPU model of p69 (GLA) in the chunked form a tensor-core kernel would compute: is its rounding inside the tolerance?

Per chunk of C tokens and per key channel, b_t = gk_1 + ... + gk_t (fp32, in token order; b_0 = 0 at the chunk's
start); with q~_t = q_t K^-0.5 exp(b_t), k~_s = k_s exp(-b_s), k^_s = k_s exp(b_C - b_s):
  o_t = q~_t S_0 + sum_{s <= t} (q~_t . k~_s) v_s,      S_C = Diag(exp(b_C)) S_0 + sum_s k^_s v_s^T.
GEMM operands are rounded to bf16 (q~, k~, k^, v as given, the fp32 state S_0 and the masked chunk scores A),
products accumulate in fp32 (tensor cores; their internal order is not modelled, it is far below bf16's rounding),
the state carried between chunks stays fp32.
"""

from __future__ import annotations

import torch

BF = torch.bfloat16


def _bf(x: torch.Tensor) -> torch.Tensor:
    return x.to(BF).float()


def chunked_gla(q, k, v, gk, chunk: int = 64, fold: bool = False) -> torch.Tensor:
    """o bf16 [B, T, H, V] of problem p69 computed chunk by chunk (see the module docstring).

    fold: the state update as S_C = Diag(exp(b_C)) (S_0 + sum_s k~_s v_s^T), which needs no k^ operand (the
    state GEMM accumulates onto S_0 with the scores' k~, then its rows are scaled).
    """
    q, k, v, gk = (x.float().transpose(1, 2) for x in (q, k, v, gk))     # [B, H, T, D]
    b, h, t, dk = q.shape
    scale = dk ** -0.5
    s = torch.zeros(b, h, dk, v.shape[-1])
    o = torch.empty(b, h, t, v.shape[-1])
    causal = torch.ones(chunk, chunk).tril().bool()
    for c0 in range(0, t, chunk):
        sl = slice(c0, c0 + chunk)
        cum = torch.cumsum(gk[:, :, sl], dim=2)                            # fp32, token order
        last = cum[:, :, -1:]
        qt = _bf(q[:, :, sl] * scale * torch.exp(cum))
        kt = _bf(k[:, :, sl] * torch.exp(-cum))
        kh = _bf(k[:, :, sl] * torch.exp(last - cum))
        vc = v[:, :, sl]
        a = _bf((qt @ kt.transpose(-1, -2)).masked_fill(~causal[:qt.shape[2], :qt.shape[2]], 0.0))
        o[:, :, sl] = qt @ _bf(s) + a @ vc
        if fold:
            s = (s + kt.transpose(-1, -2) @ vc) * torch.exp(last[:, :, 0, :, None])
        else:
            s = s * torch.exp(last[:, :, 0, :, None]) + kh.transpose(-1, -2) @ vc
    return o.transpose(1, 2).to(BF)
