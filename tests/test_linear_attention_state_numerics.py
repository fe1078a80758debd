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


def _gates(A_log, a, dt_bias, b):
    """alpha, beta in fp64, rounded once to fp32 (the kernels' gate scalars)."""
    x = a.float().double() + dt_bias.double()
    sp = torch.where(x > 20, x, torch.log1p(torch.exp(x)))
    return torch.exp(-torch.exp(A_log.double()) * sp).float(), (1.0 / (1.0 + torch.exp(-b.float().double()))).float()


def _row_dot(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """x, s [..., K]: lane l holds float4s l, l + L, ...; per-component FMA partial sums, then xor 1, 2, 4."""
    k = s.shape[-1]
    lanes = min(LANES, k // 4)
    xs = x.expand_as(s).reshape(*s.shape[:-1], k // (4 * lanes), lanes, 4)   # [..., m, lane, e]
    ss = s.reshape(xs.shape)
    part = xs[..., 0, :, :] * ss[..., 0, :, :]                                 # [..., lane, e]
    for m in range(1, xs.shape[-3]):
        part = _fma(xs[..., m, :, :], ss[..., m, :, :], part)
    lane = (part[..., 0] + part[..., 1]) + (part[..., 2] + part[..., 3])
    idx, off = torch.arange(lanes), 1
    while off < lanes:
        lane = lane + lane[..., idx ^ off]
        off *= 2
    return lane[..., 0]


def gdn_step(s, q, k, v, alpha, beta, scale):
    """One token on rows s [..., V, K] (float32); q, k [..., K], v [..., V], alpha/beta [...]: (o fp32, s)."""
    s = s * alpha[..., None, None]
    ks = _row_dot(k[..., None, :], s)
    delta = (v - ks) * beta[..., None]
    s = _fma(k[..., None, :].expand_as(s), delta[..., None].expand_as(s), s)
    return _row_dot(q[..., None, :], s) * scale, s


def p72_model(q, k, v, state, A_log, a, dt_bias, b, scale):
    """The pending p72 kernels' arithmetic: (o bf16 [B, 1, Hv, V], new state fp32 [B, Hv, V, K])."""
    rep = v.shape[2] // q.shape[2]
    alpha, beta = _gates(A_log, a[:, 0], dt_bias, b[:, 0])
    qh = q[:, 0].float().repeat_interleave(rep, dim=1)
    kh = k[:, 0].float().repeat_interleave(rep, dim=1)
    o, s = gdn_step(state.float(), qh, kh, v[:, 0].float(), alpha, beta, scale)
    return o[:, None].to(q.dtype), s


@pytest.mark.parametrize("scale", ["smoke", "slice"])
def test_p72_kernel_arithmetic_is_well_inside_the_tolerance(scale):
    problem = numerics.load_problem("p72")
    torch.manual_seed(72)
    inputs = problem.make_inputs(device="cpu", scale="smoke" if scale == "smoke" else "full")
    if scale == "slice":  # 8 of the 64 sequences, every head
        inputs = [t[:8] if torch.is_tensor(t) and t.dim() >= 3 else t for t in inputs]
    ratios = _ratios(problem, inputs, p72_model(*inputs))
    assert max(ratios) < 0.5, ratios


def test_a_p72_replay_without_the_decay_is_caught():
    """The check can fail: the same replay with alpha = 1 (the decay forgotten) is far outside the tolerance."""
    problem = numerics.load_problem("p72")
    torch.manual_seed(73)
    inputs = problem.make_inputs(device="cpu", scale="smoke")
    q, k, v, state, A_log, a, dt_bias, b, sc = inputs
    out = p72_model(q, k, v, state, torch.full_like(A_log, -60.0), a, dt_bias, b, sc)
    ref = problem.reference(*inputs)
    anchor = problem.reference(*numerics.fp64(inputs))
    assert not tt.compare("out[1]", out[1], ref[1], anchor[1], numerics.factor(problem)).ok


def p73_model(q, k, v, state_pool, indices, A_log, a, dt_bias, b, scale, commit=False):
    """The p73 kernels' arithmetic: (o bf16 [B, T, Hv, V], pool fp32 [P, Hv, V, K]); p72's step per token.

    The kernels store each slot's rows as loaded, before any token updates them: the pool comes back unchanged.
    commit=True writes each request's final state into its slot instead (the kernels before 2026-12-07).
    """
    rep = v.shape[2] // q.shape[2]
    alpha, beta = _gates(A_log, a, dt_bias, b)                     # [B, T, Hv]
    qh = q.float().repeat_interleave(rep, dim=2)
    kh = k.float().repeat_interleave(rep, dim=2)
    o = torch.empty(v.shape, dtype=torch.float32)
    pool = state_pool.float().clone()
    for i, slot in enumerate(indices.tolist()):                    # distinct slots (the problem draws them so)
        s = state_pool[slot].float()
        for t in range(q.shape[1]):
            o[i, t], s = gdn_step(s, qh[i, t], kh[i, t], v[i, t].float(), alpha[i, t], beta[i, t], scale)
        if commit:
            pool[slot] = s
    return o.to(q.dtype), pool


@pytest.mark.parametrize("scale", ["smoke", "full"])
def test_p73_kernel_arithmetic_is_well_inside_the_tolerance(scale):
    problem = numerics.load_problem("p73")
    torch.manual_seed(74)
    inputs = problem.make_inputs(device="cpu", scale=scale)
    out = p73_model(*inputs)
    ratios = _ratios(problem, inputs, out)
    assert max(ratios) < 0.5, ratios
    assert torch.equal(problem.reference(*inputs)[1], inputs[3])   # the copy the kernels store, bit for bit


def test_a_p73_replay_without_the_decay_is_caught():
    """The check can fail: o replayed with alpha = 1 (the decay forgotten) is far outside the tolerance."""
    problem = numerics.load_problem("p73")
    torch.manual_seed(75)
    inputs = problem.make_inputs(device="cpu", scale="smoke")
    q, k, v, pool, idx, A_log, a, dt_bias, b, sc = inputs
    out = p73_model(q, k, v, pool, idx, torch.full_like(A_log, -60.0), a, dt_bias, b, sc)
    ref = problem.reference(*inputs)
    anchor = problem.reference(*numerics.fp64(inputs))
    assert not tt.compare("out[0]", out[0], ref[0], anchor[0], numerics.factor(problem)).ok


def test_a_p73_replay_that_commits_the_final_states_is_caught():
    """The check can fail: the pool with each request's final state in its slot (the old kernels) is refused."""
    problem = numerics.load_problem("p73")
    torch.manual_seed(76)
    inputs = problem.make_inputs(device="cpu", scale="smoke")
    out = p73_model(*inputs, commit=True)
    ref = problem.reference(*inputs)
    anchor = problem.reference(*numerics.fp64(inputs))
    assert not tt.compare("out[1]", out[1], ref[1], anchor[1], numerics.factor(problem)).ok
