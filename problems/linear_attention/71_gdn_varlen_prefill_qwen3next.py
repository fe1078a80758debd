"""Variable-length Gated DeltaNet prefill: 4 packed sequences (cu_seqlens), gates computed from raw a/b (g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)), in-kernel L2 norm of q/k, 8 q/k heads shared by 16 v heads, one fp32 initial state per sequence; returns bf16 o [1,959,16,128] and the fp32 final states [4,16,128,128]."""
# Source: Qwen3-Next-80B-A3B config.json: linear_num_key_heads 16, linear_num_value_heads 32,
# linear_key_head_dim 128, linear_value_head_dim 128; its Gated DeltaNet computes
# g = -exp(A_log) * softplus(a + dt_bias) and beta = sigmoid(b) per v head and token, L2-normalises
# q and k (eps 1e-6), scales q by 128^-0.5, and shares each q/k head among 2 consecutive v heads
# (v head h reads q/k head h // 2). 2-way tensor-parallel shard: 8 q/k heads, 16 v heads.
# Recurrence per sequence and v head (S is [K, V], alpha_t = exp(g_t)):
#   S_t = alpha_t S_{t-1} + beta_t k_t (v_t - alpha_t S_{t-1}^T k_t)^T,   o_t = S_t^T q_t,
# starting from that sequence's initial state; the final states are returned.
# Workload: 959 tokens packed as 4 sequences of 19, 31, 890 and 19 tokens (cu_seqlens
# [0, 19, 50, 940, 959]), as in a mixed prefill batch; chunk size 64.
# Precision (part of the definition): accumulation and the carried state are fp32; the operands
# a chunked tensor-core kernel feeds in bf16 are rounded to the input dtype, as in production
# kernels: normalised q/k, the inverted intra-chunk matrix (I + A)^-1, the WY factors w and u, the
# state when it multiplies w and q, the new values v - w S, the intra-chunk q k^T scores and the
# decayed new values added to the state. This sets the accuracy the fp32 final states are held
# to; a kernel that keeps everything in fp32 is more accurate and passes too.
# Fixed: shapes, sequence lengths. Redrawn per draw: q, k, v, a, b (N(0,1), bf16); A_log =
# log U(1, 16) and dt_bias = softplus^-1 of a log-uniform dt in [1e-3, 1e-1] (fp32); initial states
# N(0, 0.5^2) fp32.
import torch
import torch.nn.functional as F

DTYPE = "bf16"
SOL = {
    "flops": 16 * 959 * (8 * 128 * 128 + 4 * 64 * 128 + 2 * 64 * 64 + 20),
    "bytes": 2 * (2 * 959 * 8 * 128 + 959 * 16 * 128 + 2 * 959 * 16) + 4 * 2 * 16 + 4 * 5
    + 2 * 4 * 4 * 16 * 128 * 128 + 2 * 959 * 16 * 128,
}

CHUNK, EPS = 64, 1e-6
SEQ_LENS = (19, 31, 890, 19)


def _l2norm(x):
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + EPS)


def _chunk_gated_delta_rule(q, k, v, g, beta, state, chunk, lp):
    """q, k [B,H,T,K]; v [B,H,T,V]; g, beta [B,H,T]; state [B,H,K,V]; T a multiple of chunk.

    Returns (o [B,H,T,V], final state). Everything is in the compute dtype; lp is the dtype that
    kernel-side bf16 operands are rounded to.
    """
    def r(t):
        return t.to(lp).to(t.dtype)

    b, h, t, dk = k.shape
    n = t // chunk
    q, k, v = (x.reshape(b, h, n, chunk, x.shape[-1]) for x in (q, k, v))
    g, beta = g.reshape(b, h, n, chunk), beta.reshape(b, h, n, chunk)
    gam = g.cumsum(-1)
    diff = gam[..., :, None] - gam[..., None, :]
    ones = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device)
    strict, incl = ones.tril(-1), ones.tril()
    decay_strict = diff.masked_fill(~strict, float("-inf")).exp()
    decay_incl = diff.masked_fill(~incl, float("-inf")).exp()
    a_kk = beta[..., None] * (k @ k.transpose(-1, -2)) * decay_strict
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    t_inv = r(torch.linalg.solve_triangular(eye + a_kk, eye.expand_as(a_kk), upper=False, unitriangular=True))
    w = r(t_inv @ r(k * (beta * gam.exp())[..., None]))
    u = r(t_inv @ r(v * beta[..., None]))
    a_qk = r((q @ k.transpose(-1, -2)) * decay_incl)
    o = torch.empty_like(v)
    for i in range(n):
        s_lp = r(state)
        v_new = r(u[:, :, i] - w[:, :, i] @ s_lp)
        o[:, :, i] = gam[:, :, i, :, None].exp() * (q[:, :, i] @ s_lp) + a_qk[:, :, i] @ v_new
        last = gam[:, :, i, -1]
        tail = r(v_new * (last[..., None] - gam[:, :, i]).exp()[..., None])
        state = last.exp()[..., None, None] * state + k[:, :, i].transpose(-1, -2) @ tail
    return o.reshape(b, h, t, -1), state


def make_inputs(device="cuda", scale="full"):
    lens, hk, hv, d = (SEQ_LENS, 8, 16, 128) if scale == "full" else ((3, 5, 21, 3), 2, 4, 16)
    total = sum(lens)
    cu_seqlens = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    q = torch.randn(1, total, hk, d, device=device).to(torch.bfloat16)
    k = torch.randn(1, total, hk, d, device=device).to(torch.bfloat16)
    v = torch.randn(1, total, hv, d, device=device).to(torch.bfloat16)
    a = torch.randn(1, total, hv, device=device).to(torch.bfloat16)
    b = torch.randn(1, total, hv, device=device).to(torch.bfloat16)
    a_log = torch.log(torch.empty(hv, device=device).uniform_(1, 16))
    dt = torch.exp(torch.empty(hv, device=device).uniform_(-6.9, -2.3))
    dt_bias = dt + torch.log(-torch.expm1(-dt))
    initial_state = 0.5 * torch.randn(len(lens), hv, d, d, device=device)
    return [q, k, v, a, b, a_log, dt_bias, cu_seqlens, initial_state]


def reference(q, k, v, a, b, a_log, dt_bias, cu_seqlens, initial_state):
    cdt = torch.promote_types(q.dtype, torch.float32)
    lp = q.dtype
    hk, dk = q.shape[2:]
    hv = v.shape[2]
    chunk = CHUNK if dk == 128 else 8  # smoke shapes (head dim 16) use chunks of 8
    g = -a_log.to(cdt).exp() * F.softplus(a.to(cdt) + dt_bias.to(cdt))
    beta = torch.sigmoid(b.to(cdt))

    def heads(x):  # [1,T,Hk,D] -> normalised, rounded like a kernel, repeated to v heads: [1,Hv,T,D]
        x = _l2norm(x.to(cdt)).to(lp).to(cdt)
        return x.repeat_interleave(hv // hk, dim=2).transpose(1, 2)

    qh, kh = heads(q) * dk ** -0.5, heads(k)
    vh, gh, bh = v.to(cdt).transpose(1, 2), g.transpose(1, 2), beta.transpose(1, 2)
    o = torch.empty_like(vh)
    final = []
    bounds = cu_seqlens.tolist()
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        pad = -(end - start) % chunk  # zero k, v, beta and g leave the state and outputs unchanged

        def seg(x):
            return F.pad(x[:, :, start:end].transpose(-1, -2), (0, pad)).transpose(-1, -2)

        o_i, s_i = _chunk_gated_delta_rule(
            seg(qh), seg(kh), seg(vh), F.pad(gh[:, :, start:end], (0, pad)),
            F.pad(bh[:, :, start:end], (0, pad)), initial_state[i:i + 1].to(cdt), chunk, lp)
        o[:, :, start:end] = o_i[:, :, : end - start]
        final.append(s_i)
    return o.transpose(1, 2).to(v.dtype), torch.cat(final).to(initial_state.dtype)
