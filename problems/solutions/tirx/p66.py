"""p66 RWKV-4 WKV recurrence with running-max stabilisation in TIRx: a thread per (sequence, channel).

Each thread carries its channel's (num, max, den) state in registers through all time steps, reading
key[b, t, c] and value[b, t, c] (a warp reads 128 contiguous bytes per step) and writing wkv[b, t, c]:
one read of key/value and one write of wkv, the SOL traffic.  Steps are processed 8 at a time with
the 16 loads issued first.  One of each step's two exponentials is exp(0) = 1 (the running max is one
of its two arguments), so a step needs two exponentials, not four.  TVM compiles with fast math
(`__expf`, approximate division), so the kernel spells out the accurate fp32 arithmetic the CuTe DSL
variant gets from its compiler, with CUDA intrinsics that fast math leaves alone: the exponential is
the CUDA math library's expf algorithm (fma range reduction with `__fmaf_rn`/`__fmaf_rd`, `exp2f`'s
`ex2.approx.ftz` on the reduced argument, the power of two put back through the exponent bits), the
division `__fdiv_rn` (IEEE round to nearest).  No fp64 on the data path.
"""
import torch  # before tvm, so TVM's CUDA runtime finds the already-loaded CUDA libraries

import tvm
from tvm.script import tirx as T

THREADS = 256
UNROLL = 8


def _f32(bits: int):
    """The fp32 constant with these bits (exactly; no decimal round trip)."""
    return T.reinterpret("float32", T.uint32(bits))


def _fma(a, b, c, rnd="rn"):
    return T.call_pure_extern("float32", f"__fmaf_{rnd}", a, b, c)


def _expf(x):
    """exp(x) for an fp32 x: the CUDA math library's expf (max error 2 ulp), not fast math's __expf.

    j = 2^23-biased integer part of x log2(e) (x clamped to the fp32 exponent range through a saturated
    fma), r = x log2(e) - j in two fma steps (log2(e) split hi + lo), exp(x) = 2^r * 2^j with 2^r
    from ex2.approx.ftz and 2^j built in the exponent bits of j.
    """
    t = T.call_pure_extern("float32", "__saturatef", _fma(x, _f32(0x3BBB989D), T.float32(0.5)))
    j = _fma(t, _f32(0x437C0000), _f32(0x4B400001), "rd")
    jf = T.call_pure_extern("float32", "__fadd_rn", j, _f32(0xCB40007F))
    r = _fma(x, _f32(0x32A57060), _fma(x, _f32(0x3FB8AA3B), -jf))
    scale = T.reinterpret("float32", T.shift_left(T.reinterpret("int32", j), 23))
    return T.call_pure_extern("float32", "__fmul_rn", T.call_pure_extern("float32", "exp2f", r), scale)


def _exp_neg_abs(x):
    """exp(-|x|) for an fp32 x."""
    return _expf(-T.max(x, -x))


def _div(a, b):
    """a / b for fp32 a, b, correctly rounded (IEEE division, untouched by fast math)."""
    return T.call_pure_extern("float32", "__fdiv_rn", a, b)


def _make():
    @T.prim_func
    def wkv(td_h: T.handle, k_h: T.handle, tf_h: T.handle, v_h: T.handle, n_h: T.handle, m_h: T.handle,
            d_h: T.handle, o_h: T.handle, no_h: T.handle, mo_h: T.handle, do_h: T.handle):
        nb = T.int32()
        steps = T.int32()
        nc = T.int32()
        TD = T.match_buffer(td_h, (nc,), "float32")
        K = T.match_buffer(k_h, (nb, steps, nc), "float32")
        TF = T.match_buffer(tf_h, (nc,), "float32")
        V = T.match_buffer(v_h, (nb, steps, nc), "float32")
        N = T.match_buffer(n_h, (nb, nc), "float32")
        M = T.match_buffer(m_h, (nb, nc), "float32")
        D = T.match_buffer(d_h, (nb, nc), "float32")
        O = T.match_buffer(o_h, (nb, steps, nc), "float32")
        NO = T.match_buffer(no_h, (nb, nc), "float32")
        MO = T.match_buffer(mo_h, (nb, nc), "float32")
        DO = T.match_buffer(do_h, (nb, nc), "float32")
        T.device_entry()
        bx = T.cta_id([T.ceildiv(nb * nc, THREADS)])
        tx = T.thread_id([THREADS])
        kr = T.alloc_local((UNROLL,), "float32")
        vr = T.alloc_local((UNROLL,), "float32")
        st = T.alloc_local((3,), "float32")         # num, max, den
        base = T.alloc_local((1,), "int32")         # b * steps * nc + c, computed once (not per step)
        Kf = T.decl_buffer((nb * steps * nc,), "float32", data=K.data)
        Vf = T.decl_buffer((nb * steps * nc,), "float32", data=V.data)
        Of = T.decl_buffer((nb * steps * nc,), "float32", data=O.data)
        gid: T.let = bx * THREADS + tx
        if gid < nb * nc:
            b: T.let = gid // nc
            c: T.let = gid % nc
            base[0] = b * steps * nc + c
            w: T.float32 = -_expf(TD[c])
            u: T.float32 = TF[c]
            st[0] = N[b, c]
            st[1] = M[b, c]
            st[2] = D[b, c]
            for chunk in T.serial(T.ceildiv(steps, UNROLL)):
                for i in T.unroll(UNROLL):
                    kr[i] = T.float32(0)
                    vr[i] = T.float32(0)
                    if chunk * UNROLL + i < steps:
                        kr[i] = Kf[base[0] + (chunk * UNROLL + i) * nc]
                        vr[i] = Vf[base[0] + (chunk * UNROLL + i) * nc]
                for i in T.unroll(UNROLL):
                    if chunk * UNROLL + i < steps:
                        uk: T.float32 = u + kr[i]
                        # p = max(max, u + k): e1 = exp(max - p), e2 = exp(u + k - p); one of them is exp(0)
                        d: T.float32 = _exp_neg_abs(st[1] - uk)
                        if st[1] >= uk:
                            Of[base[0] + (chunk * UNROLL + i) * nc] = _div(st[0] + d * vr[i], st[2] + d)
                        else:
                            Of[base[0] + (chunk * UNROLL + i) * nc] = _div(d * st[0] + vr[i], d * st[2] + T.float32(1))
                        ww: T.float32 = st[1] + w
                        d2: T.float32 = _exp_neg_abs(ww - kr[i])
                        if ww >= kr[i]:
                            st[0] = st[0] + d2 * vr[i]
                            st[2] = st[2] + d2
                            st[1] = ww
                        else:
                            st[0] = d2 * st[0] + vr[i]
                            st[2] = d2 * st[2] + T.float32(1)
                            st[1] = kr[i]
            NO[b, c] = st[0]
            MO[b, c] = st[1]
            DO[b, c] = st[2]

    return wkv


_COMPILED = {}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _build(func, arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch})
    with target:
        return tvm.compile(tvm.IRModule({"main": func}), target=target, tir_pipeline="tirx")


def _prepare(time_decay, key, time_first, value, num, mx, den, arch=None):
    if "wkv" not in _COMPILED:
        _COMPILED["wkv"] = _build(_make(), arch or _arch())
    return [_COMPILED["wkv"]]


def solve(time_decay, key, time_first, value, num, mx, den):
    (exe,) = _prepare(time_decay, key, time_first, value, num, mx, den)
    out = torch.empty_like(key)
    num_o, mx_o, den_o = torch.empty_like(num), torch.empty_like(mx), torch.empty_like(den)
    if num.numel():
        exe(time_decay.contiguous(), key.contiguous(), time_first.contiguous(), value.contiguous(), num.contiguous(),
            mx.contiguous(), den.contiguous(), out, num_o, mx_o, den_o)
    return out, num_o, mx_o, den_o
