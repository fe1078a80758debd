"""Anchor for p28 (fused residual add + RMSNorm, h4096): quack-kernels' CuTe DSL RMSNorm forward, graded beside ours.

Our adapter, not a solution: problems/solutions/cutedsl/p28.py is what ships. It calls the library's functional
forward, quack.rmsnorm.rmsnorm_fwd(x, weight, residual=residual, eps), which adds the residual in fp32, normalises
that fp32 sum and rounds out to bf16 once (p28's arithmetic). The public API always writes the updated residual
(residual_out, bf16) as well: p28 does not return it, so the anchor moves 4 tensors where p28's SOL counts 3.
Graded only through mkb.judge.grade(..., anchor=...) (artifact/generators/anchors.py); the agent's judge refuses
the import.
"""

import quack.cache
from quack.rmsnorm import rmsnorm_fwd

EPS = 1e-5
# The persistent compile cache writes a .o under the cell's /tmp and reloads it in later processes; each grading's
# cell starts empty, so it would only add a file lock and an export to the first call.
quack.cache.CACHE_ENABLED = False


def solve(x, residual, weight):
    out, _residual_out, _rstd = rmsnorm_fwd(x, weight, residual=residual, eps=EPS)
    return out
