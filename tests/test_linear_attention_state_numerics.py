"""CPU replays of the pending p66 (RWKV-4 WKV) and p72/p73 (gated DeltaNet decode / MTP) kernels' arithmetic.

Each kernel's exact order is replayed in torch fp32 on the CPU (every `a + b * c` the compilers contract
as one FMA rounding) and judged the referee's way: against the problem's reference and fp64 anchor
under its tolerance factor (tests/numerics.py).

p66 (both DSLs, one thread per channel): per step d = exp(-|max - (u + k)|), the output
(num + d v) / (den + d) or (d num + v) / (d den + 1) by which argument holds the max, then the state
update with d2 = exp(-|max + w - k|).  The exponential is the CUDA math library's expf (CuTe DSL's
cute.math.exp; the TIRx kernel spells out the same algorithm): within 2 ulp of exp, so the replay
rounds the fp64 exp to fp32 and then perturbs it by up to +-2 ulp at random (a worst case for the
hardware ex2.approx inside); the division is IEEE (div.rn).

p72/p73 (both DSLs, 8 lanes per state row): lane l of a row holds the float4s l, l + 8, l + 16, l + 24
of the row's 128 keys; a dot product is 4 partial sums (one per float4 component, FMA over the lane's
float4s in order), combined (p0 + p1) + (p2 + p3), then a butterfly over the row's 8 lanes (xor 1, 2, 4);
the gates in fp64 rounded once; the new row alpha S + k delta with delta = (v - k.(alpha S)) beta;
o = (q.S_new) * scale rounded to bf16.
"""

from __future__ import annotations

import pytest
import torch

from mkb import tensortree as tt

import numerics  # noqa: E402  (tests/: the replays' shared loader and tolerance ratio)

LANES = 8       # p72/p73: lanes per state row


def _fma(a, b, c):
    """fp32 a * b + c with one rounding (the fp64 product of two fp32 values is exact)."""
    return (a.double() * b.double() + c.double()).float()


def _expf(x: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """exp of fp32 x: the fp64 exp rounded to fp32, then (with gen) perturbed by up to 2 ulp."""
    e = torch.exp(x.double()).float()
    if gen is None:
        return e
    ulps = torch.randint(-2, 3, e.shape, generator=gen).float()
    return (e.double() * (1 + ulps.double() * 2.0 ** -23)).float()


def p66_model(time_decay, key, time_first, value, num, mx, den, gen=None):
    """The p66 kernels' arithmetic: (wkv, num, max, den) fp32."""
    w = -_expf(time_decay, gen)
    u = time_first
    out = torch.empty_like(key)
    one = torch.ones_like(num)
    for t in range(key.shape[1]):
        kt, vt = key[:, t], value[:, t]
        uk = u + kt
        d = _expf(-(mx - uk).abs(), gen)
        first = mx >= uk
        out[:, t] = torch.where(first, _fma(d, vt, num) / (den + d), _fma(d, num, vt) / _fma(d, den, one))
        ww = mx + w
        d2 = _expf(-(ww - kt).abs(), gen)
        keep = ww >= kt
        num = torch.where(keep, _fma(d2, vt, num), _fma(d2, num, vt))
        den = torch.where(keep, den + d2, _fma(d2, den, one))
        mx = torch.where(keep, ww, kt)
    return out, num, mx, den


def _ratios(problem, inputs, out) -> list[float]:
    ref = problem.reference(*inputs)
    anchor = problem.reference(*numerics.fp64(inputs))
    return [numerics.ratio(f"out[{i}]", o, r, a, numerics.factor(problem))
            for i, (o, r, a) in enumerate(zip(out, ref, anchor))]


@pytest.mark.parametrize("exp_error", ["rounded", "2ulp"])
@pytest.mark.parametrize("scale", ["smoke", "slice"])
def test_p66_kernel_arithmetic_is_inside_the_tolerance(scale, exp_error):
    problem = numerics.load_problem("p66")
    torch.manual_seed(66)
    inputs = problem.make_inputs(device="cpu", scale="smoke" if scale == "smoke" else "full")
    if scale == "slice":  # 2 of the 64 sequences, every step, 512 of the 2048 channels
        td, key, tf, value, num, mx, den = inputs
        ch = slice(0, 512)
        inputs = [td[ch], key[:2, :, ch], tf[ch], value[:2, :, ch], num[:2, ch], mx[:2, ch], den[:2, ch]]
    gen = torch.Generator().manual_seed(1) if exp_error == "2ulp" else None
    ratios = _ratios(problem, inputs, p66_model(*inputs, gen=gen))
    assert max(ratios) < 0.6, ratios


def test_a_p66_replay_with_a_small_error_in_the_exponents_is_caught():
    """The check can fail: time_first off by 2^-12 relative (a bonus exponent u + k slightly wrong) is caught."""
    problem = numerics.load_problem("p66")
    torch.manual_seed(67)
    inputs = problem.make_inputs(device="cpu", scale="smoke")
    td, key, tf, value, num, mx, den = inputs
    out = p66_model(td, key, tf * (1 + 2.0 ** -12), value, num, mx, den)
    ref = problem.reference(*inputs)
    anchor = problem.reference(*numerics.fp64(inputs))
    assert not tt.compare("out[0]", out[0], ref[0], anchor[0], numerics.factor(problem)).ok
