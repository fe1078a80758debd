"""CPU model of p49's numerics: how the router logits are accumulated, and how close the weights come.

p49's second output (the routing weights, scale * s_j / sum of the 8 chosen sigmoid scores) is judged
against the fp64 anchor with an allowance of 3 x the fp32 reference's own error (mkb.tensortree.compare).
The reference's logits come from a cuBLAS fp32 GEMM (a round-to-nearest FMA chain over K); the
solutions' from bf16 WGMMA, whose tensor-core accumulation is not an IEEE fp32 sum. This module
re-computes, in float64 torch on the CPU, the logits of the chosen (token, expert) pairs:

* ``fma_chain``: fl32(acc + a_k * b_k) for k = 0..K-1 (bf16 x bf16 products are exact): the reference.
* ``wgmma``: a Hopper bf16 MMA model. Per step, the accumulator and ``group`` exact products are
  aligned to the largest exponent, each cut (towards zero) to ``24 + extra`` bits, summed exactly and
  the sum cut (towards zero, or rounded to nearest) to fp32. ``promote`` = 0 keeps one accumulator
  over all of K (the shipped solutions); ``promote`` = B zeroes a scratch accumulator every B of K and
  adds it to the main one with an ordinary fp32 (or, ``main="fp64"``, fp64) addition.

and then the weights the way each solution computes them. The hardware's exact parameters are not
documented (they differ between GPU generations); a design is sound when it keeps its margin for
every plausible parameter set, which is what tests/test_p49_numerics.py checks.

Run ``python tests/p49_model.py [tokens]`` for the full-scale measurement (16,384 tokens: minutes).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

import numerics  # noqa: E402  (tests/: the replays' shared loader and tolerance ratio)

F64 = torch.float64
FP32_EPS = torch.finfo(torch.float32).eps


def load_problem():
    return numerics.load_problem("p49")


@dataclass(frozen=True)
class Accumulation:
    """How a solution accumulates a logit over K on the tensor cores (see the module docstring)."""

    group: int = 16           # products per hardware step (one k16 WGMMA = 16, or two steps of 8)
    extra: int = 0            # alignment bits beyond fp32's 24
    final: str = "rz"         # the step's sum to fp32: "rz" (truncate) or "rn"
    promote: int = 0          # 0: one accumulator over K; B: a fresh scratch accumulator every B of K
    main: str = "fp32"        # the promoted accumulator: "fp32" (round to nearest) or "fp64"


def round32(x: torch.Tensor) -> torch.Tensor:
    """Round to nearest fp32, back in fp64."""
    return x.to(torch.float32).to(F64)


def _cut(x: torch.Tensor, unit: torch.Tensor) -> torch.Tensor:
    """x cut towards zero to a multiple of unit."""
    return torch.trunc(x / unit) * unit


def _exponent(x: torch.Tensor) -> torch.Tensor:
    """floor(log2 |x|) (x != 0), exactly, from frexp."""
    return torch.frexp(x)[1].to(F64) - 1


def _to_fp32(s: torch.Tensor, final: str) -> torch.Tensor:
    if final == "rn":
        return round32(s)
    nz = s != 0
    unit = torch.ldexp(torch.ones_like(s), (_exponent(torch.where(nz, s, 1.0)) - 23).to(torch.int32))
    return torch.where(nz, _cut(s, unit), s)


def mma_step(acc: torch.Tensor, products: torch.Tensor, acc_model: Accumulation) -> torch.Tensor:
    """One tensor-core step: acc [P] + the row sums of products [P, g], under acc_model."""
    terms = torch.cat([acc[:, None], products], dim=1)
    top = terms.abs().amax(dim=1)
    nz = top != 0
    e = _exponent(torch.where(nz, top, 1.0))
    unit = torch.ldexp(torch.ones_like(top), (e - 23 - acc_model.extra).to(torch.int32))
    s = _cut(terms, unit[:, None]).sum(dim=1)
    return torch.where(nz, _to_fp32(s, acc_model.final), acc)


def wgmma(a: torch.Tensor, b: torch.Tensor, acc_model: Accumulation) -> torch.Tensor:
    """Logits of P pairs (rows a [P, K] . rows b [P, K], bf16 values in fp64) under acc_model (fp64 result)."""
    pairs, k = a.shape
    block = acc_model.promote or k
    total = torch.zeros(pairs, dtype=F64)
    for k0 in range(0, k, block):
        part = torch.zeros(pairs, dtype=F64)
        for g0 in range(k0, min(k0 + block, k), acc_model.group):
            part = mma_step(part, a[:, g0:g0 + acc_model.group] * b[:, g0:g0 + acc_model.group], acc_model)
        if not acc_model.promote:
            return part
        total = total + part if acc_model.main == "fp64" else round32(total + part)
    return total


def fma_chain(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The reference's fp32 GEMM: a round-to-nearest FMA chain over K (fp64 result)."""
    acc = torch.zeros(a.shape[0], dtype=F64)
    for k in range(a.shape[1]):
        acc = round32(acc + a[:, k] * b[:, k])
    return acc


def sigmoid64(x: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + torch.exp(-x))


def weights_reference(logits: torch.Tensor, scale: float) -> torch.Tensor:
    """The problem's reference on fp32 logits [T, 8] of the chosen experts (fp32 torch ops)."""
    s = torch.sigmoid(logits.to(torch.float32))
    return (s / (s.sum(dim=-1, keepdim=True) + 1e-20) * scale).to(F64)


def weights_shipped(logits: torch.Tensor, scale: float) -> torch.Tensor:
    """The shipped kernels: s rounded to fp32, fp64 sum in choice order and division, fp32 x scale."""
    s = round32(sigmoid64(round32(logits)))
    ssum = torch.zeros(s.shape[0], dtype=F64)
    for j in range(s.shape[1]):
        ssum = ssum + s[:, j]
    return round32(round32(s / ssum[:, None]) * scale)


def weights_fp64(logits: torch.Tensor, scale: float) -> torch.Tensor:
    """The pending kernels: sigmoid, sum (choice order), division and x scale in fp64, one rounding."""
    s = sigmoid64(logits)
    ssum = torch.zeros(s.shape[0], dtype=F64)
    for j in range(s.shape[1]):
        ssum = ssum + s[:, j]
    return round32(s / (ssum[:, None] + 1e-20) * scale)


def route_kernel(logits: torch.Tensor, bias: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The pending router kernel on fp32 logits [T, E] (fp64 tensor): (int64 indices [T, 8], weights [T, 8]).

    s = fl32(sigmoid64(logit)); b = fl32(s + bias); group score fl32(top1 + top2); groups ranked by
    (score desc, group asc), the 4 best kept, the others' experts 0.0; 8 winners by (b desc, index asc);
    weights in fp64 from the winners' logits (sum in choice order), x scale, one rounding.
    """
    tokens, experts = logits.shape
    val = round32(round32(sigmoid64(logits)) + bias.to(F64))
    top2 = val.view(tokens, 8, experts // 8).topk(2, dim=-1).values
    gs = round32(top2[..., 0] + top2[..., 1])
    g = torch.arange(8)
    beats = (gs[:, None, :] > gs[:, :, None]) | ((gs[:, None, :] == gs[:, :, None]) & (g[None, :] < g[:, None]))
    keep = (beats.sum(dim=-1) < 4).repeat_interleave(experts // 8, dim=1)
    val = torch.where(keep, val, 0.0)
    idx = torch.sort(val, dim=1, descending=True, stable=True).indices[:, :8]
    return idx, weights_fp64(logits.gather(1, idx), scale)


def route_epilogue(logits: torch.Tensor, bias: torch.Tensor, scale: float, ulps: float = 4.0,
                   seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused GEMM-epilogue router (pending p49 replacements): (indices [T, 8], weights [T, 8], candidates [T]).

    Selection scores with an approximate fp32 sigmoid (ex2.approx, rcp.approx: each score off by up to
    `ulps` fp32 ulps, drawn at random), + bias; group score = top-2 sum; the 4 best groups (ties: lower
    group); candidates = kept values >= lo, lo = the smallest 2nd-best of the kept groups; winners ranked
    by (score desc, index asc) among the candidates; dropped groups' experts are never candidates.
    Weights as route_kernel (fp64 from the winners' logits).
    """
    tokens, experts = logits.shape
    gen = torch.Generator().manual_seed(seed)
    noise = (torch.rand(logits.shape, generator=gen, dtype=F64) * 2 - 1) * ulps * 2.0 ** -24
    val = round32(round32(round32(sigmoid64(logits)) * (1 + noise)) + bias.to(F64))
    top2 = val.view(tokens, 8, experts // 8).topk(2, dim=-1).values
    gs = round32(top2[..., 0] + top2[..., 1])
    g = torch.arange(8)
    beats = (gs[:, None, :] > gs[:, :, None]) | ((gs[:, None, :] == gs[:, :, None]) & (g[None, :] < g[:, None]))
    kept = beats.sum(dim=-1) < 4
    lo = torch.where(kept, top2[..., 1], torch.inf).min(dim=1).values
    cand = kept.repeat_interleave(experts // 8, dim=1) & (val >= lo[:, None])
    idx = torch.sort(torch.where(cand, val, -torch.inf), dim=1, descending=True, stable=True).indices[:, :8]
    return idx, weights_fp64(logits.gather(1, idx), scale), cand.sum(dim=1)


def draw(tokens: int, seed: int = 0):
    """p49's full-scale inputs restricted to `tokens` tokens (same distributions and redraw rule)."""
    problem = load_problem()
    torch.manual_seed(seed)
    if tokens == 16384:
        return problem, problem.make_inputs(device="cpu", scale="full")
    hidden, experts, bf = 4096, 256, torch.bfloat16
    x = torch.randn(tokens, hidden, dtype=bf)
    w = (torch.randn(experts, hidden) / hidden ** 0.5).to(bf)
    bias = torch.randn(experts, dtype=bf)
    for _ in range(16):
        bad = problem._route(x, w, bias, F64)[2] < problem.MARGIN
        if not bool(bad.any()):
            break
        x[bad] = torch.randn(int(bad.sum()), hidden, dtype=bf)
    return problem, [x, w, bias, problem.ROUTED_SCALING]


@dataclass
class Outcome:
    """Max errors of the routing weights against the fp64 anchor, and the judge's allowance."""

    allowance: float
    ref_error: float
    errors: dict[str, float]

    def ratio(self, name: str) -> float:
        return self.errors[name] / self.allowance


def _chunked(fn, x64, w64, tok, flat, chunk=8192):
    """fn(a, b) over the (token, expert) pairs, `chunk` pairs at a time (a, b: [chunk, K] fp64)."""
    return torch.cat([fn(x64[tok[i:i + chunk]], w64[flat[i:i + chunk]]) for i in range(0, len(tok), chunk)])


def evaluate(problem, inputs, designs: dict[str, tuple[Accumulation | None, object]], factor: float = 3.0) -> Outcome:
    """Every design's (accumulation, weight function) max error vs the anchor, and the allowance.

    The chosen experts are the anchor's (the problem's margin rule makes every decision identical).
    The reference is the problem's own fp32 reference with an FMA-chain GEMM; a design whose
    accumulation is None uses the exact logits (rounded to fp32).
    """
    x, w, bias, scale = inputs
    x64, w64 = x.to(F64), w.to(F64)
    idx, _, _ = problem._route(x64, w64, bias.to(F64), F64)
    flat = idx.reshape(-1)
    tok = torch.arange(x.shape[0]).repeat_interleave(idx.shape[1])
    shape = idx.shape
    anchor = problem.reference(x64, w64, bias.to(F64), scale)[1]
    ref = weights_reference(_chunked(fma_chain, x64, w64, tok, flat).view(shape), scale)
    ref_error = float((ref - anchor).abs().max())
    allowance = factor * max(ref_error, FP32_EPS * float(anchor.abs().max()))
    errors, logits_of = {}, {}
    for name, (acc_model, weigh) in designs.items():
        if acc_model not in logits_of:
            if acc_model is None:
                logits = round32(_chunked(lambda a, b: (a * b).sum(dim=1), x64, w64, tok, flat))
            else:
                logits = _chunked(lambda a, b: wgmma(a, b, acc_model), x64, w64, tok, flat)
                logits = logits if acc_model.main == "fp64" else round32(logits)
            logits_of[acc_model] = logits.view(shape)
        errors[name] = float((weigh(logits_of[acc_model], scale) - anchor).abs().max())
    return Outcome(allowance, ref_error, errors)


HARDWARE = {f"g{g}x{x}{f}": Accumulation(group=g, extra=x, final=f)
            for g in (16, 8) for x in (0, 1, 3) for f in ("rz", "rn")}
"""Plausible tensor-core parameter sets (products per step, extra alignment bits, final rounding)."""


def designs_for(hw: Accumulation) -> dict[str, tuple[Accumulation | None, object]]:
    """The shipped scheme and the candidate fixes on hardware model hw."""
    def on(promote, main="fp32"):
        return Accumulation(hw.group, hw.extra, hw.final, promote, main)
    return {
        "shipped": (on(0), weights_shipped),
        "shipped_acc+fp64_weights": (on(0), weights_fp64),
        "promote64_fp32_weights_shipped": (on(64), weights_shipped),
        "promote64": (on(64), weights_fp64),
        "promote16": (on(16), weights_fp64),
        "promote64_fp64_main": (on(64, "fp64"), weights_fp64),
        "exact_logits": (None, weights_fp64),
    }


def main(argv: list[str]) -> int:
    tokens = int(argv[1]) if len(argv) > 1 else 16384
    hws = argv[2].split(",") if len(argv) > 2 else list(HARDWARE)
    torch.set_num_threads(2)
    problem, inputs = draw(tokens)
    for name in hws:
        out = evaluate(problem, inputs, designs_for(HARDWARE[name]))
        cells = "  ".join(f"{k} {v / out.allowance:.2f}x" for k, v in out.errors.items())
        print(f"{tokens} tokens, hw {name}: allowance {out.allowance:.3g} (ref error {out.ref_error:.3g})  {cells}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
