"""p69 (GLA): the chunked form with bf16 GEMM operands (tests/gla_chunk_model.py) stays well inside the tolerance.

This is the numerical premise of a tensor-core p69 (#20's expert bar): the output is bf16, so the allowance is at
least 3 x eps(bf16) x max|anchor|, and rounding q~, k~, k^, the state and the chunk scores to bf16 costs far less.
Measured once on a full-length slice (2 sequences x 2 heads x 1024 tokens, K 256, V 512; 64 s of reference on the
CPU): 0.18, 0.18, 0.19, 0.19 of the allowance for chunks of 16, 32, 64, 128 tokens; the same 0.19 with the state
update folded (S_C = exp(b_C) (S_0 + K~^T V), chunks of 64 and 128).  Here: smoke scale.
"""

from __future__ import annotations

import pytest
import torch

import numerics  # noqa: E402  (tests/: the replays' shared loader and tolerance ratio)
from gla_chunk_model import chunked_gla


@pytest.mark.parametrize("fold", [False, True])
@pytest.mark.parametrize("chunk", [8, 16])
def test_chunked_gla_with_bf16_operands_is_well_inside_the_tolerance(chunk, fold):
    problem = numerics.load_problem("p69")
    torch.manual_seed(69)
    inputs = problem.make_inputs(device="cpu", scale="smoke")
    assert numerics.judged_ratio(problem, inputs, chunked_gla(*inputs, chunk=chunk, fold=fold)) < 0.5


def test_a_chunked_gla_without_the_carried_state_is_caught():
    """The check can fail: dropping the state carried between chunks is far outside the tolerance."""
    problem = numerics.load_problem("p69")
    torch.manual_seed(70)
    q, k, v, gk = problem.make_inputs(device="cpu", scale="smoke")
    out = torch.cat([chunked_gla(q[:, s:s + 8], k[:, s:s + 8], v[:, s:s + 8], gk[:, s:s + 8], chunk=8)
                     for s in range(0, q.shape[1], 8)], dim=1)
    with pytest.raises(AssertionError):
        numerics.judged_ratio(problem, [q, k, v, gk], out)
