"""p46's pending GEMM replacements (dx = dl @ W, dW = dl^T @ x in 8 token chunks), replayed on the CPU.

The pending kernels keep the shipped prep (dl = bf16(dlogits)) and the fixed-order sum of fp32 partials;
only the dW chunking changes (8 chunks of 8192 tokens instead of 32 or 16). The replay takes the full token
count and a slice of the hidden columns (dW[:, cols] depends on x[:, cols] only, dx[:, cols] on W[:, cols]),
computes each chunk's partial in fp32, sums the partials in chunk order in fp32, rounds once to bf16, and
judges both outputs with the referee's rule against the reference and the fp64 anchor on the same slice.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numerics  # noqa: E402

SPLITS = 8


def _kernels_on_cpu(inputs):
    x, w, probs, ids, top_sum, grad_w, grad_mask, grad_logits = inputs
    ct = torch.float32
    gw = grad_w.to(ct)
    top_p = probs.gather(1, ids)
    d_top = gw / top_sum - (gw * top_p).sum(dim=-1, keepdim=True) / top_sum.pow(2)
    dp = torch.zeros_like(probs).scatter_add_(1, ids, d_top) + grad_mask.to(ct).sum(dim=1).t()
    dl = (probs * (dp - (dp * probs).sum(dim=-1, keepdim=True)) + grad_logits.to(ct)).to(torch.bfloat16)
    dx = (dl.float() @ w.float()).to(torch.bfloat16)
    chunk = -(-x.shape[0] // SPLITS)
    acc = torch.zeros(w.shape[0], x.shape[1], dtype=torch.float32)
    for z in range(SPLITS):
        rows = slice(z * chunk, (z + 1) * chunk)
        acc = acc + dl[rows].float().t() @ x[rows].float()
    return dx, acc.to(torch.bfloat16)


def test_dw_in_eight_chunks_passes_the_judges_rule_on_a_full_token_slice():
    problem = numerics.load_problem("p46")
    torch.manual_seed(0)
    inputs = problem.make_inputs(device="cpu", scale="full")
    cols = slice(0, 32)
    inputs[0] = inputs[0][:, cols].contiguous()
    inputs[1] = inputs[1][:, cols].contiguous()
    out = _kernels_on_cpu(inputs)
    ref = problem.reference(*inputs)
    anchor = problem.reference(*numerics.fp64(inputs))
    ratios = [numerics.ratio(f"out[{i}]", o, r, a, numerics.factor(problem)) for i, (o, r, a)
              in enumerate(zip(out, ref, anchor))]
    print("p46 replay ratios (dx, dW):", ratios)
    assert max(ratios) <= 0.5
