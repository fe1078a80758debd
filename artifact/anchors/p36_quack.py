"""Anchor for p36 (RMSNorm over rows of width 128, eps 1e-6): quack-kernels' CuTe DSL RMSNorm forward, graded beside ours.

Our adapter, not a solution: problems/solutions/cutedsl/p36.py is what ships. It calls the library's functional
forward, quack.rmsnorm.rmsnorm_fwd(x, weight, eps), which normalises in fp32 and rounds to bf16 once (p36's
arithmetic); no residual, so no extra output is written. Graded only through mkb.judge.grade(..., anchor=...)
(artifact/generators/anchors.py); the agent's judge refuses the import.
"""

import quack.cache
from quack.rmsnorm import rmsnorm_fwd

EPS = 1e-6
# The persistent compile cache writes a .o under the cell's /tmp and reloads it in later processes; each grading's
# cell starts empty, so it would only add a file lock and an export to the first call.
quack.cache.CACHE_ENABLED = False


def solve(x, weight):
    out, _residual_out, _rstd = rmsnorm_fwd(x, weight, eps=EPS)
    return out
