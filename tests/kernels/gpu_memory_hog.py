"""Hostile: keeps nearly all of the GPU's memory between its calls, so that the judge's next draw runs out; at full scale the kernel is charged (crashed), never handed a free regrading (infra_error).

After computing its answer it takes every free byte of device memory in 16 MiB pieces and holds them in a module
global, less a little for its harness's bookkeeping on the inputs. At full scale the referee's next draw needs more
than that little; it reads the device, finds the kernel's processes holding more than the allowance fixed before
kernel.py loaded (referee/memory.py), and charges the kernel: crashed (tests/test_judge_gpu.py). At smoke scale the
referee's draws fit in what is left, the grading goes on, and the torch-only kernel is a policy violation on a GPU.

Problem: p28
DSL: cutedsl
Device: gpu
Expected: policy_violation
"""
import torch

_hoard = []


def _take_all_but(spare_bytes: int) -> None:
    while True:
        try:
            _hoard.append(torch.empty(16 << 20, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            break
    del _hoard[:max(1, spare_bytes // (16 << 20))]


def solve(x, residual, weight):
    s = x.float() + residual.float()
    out = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
    del s
    if not _hoard:
        _take_all_but(2 * (x.nbytes + residual.nbytes) + (64 << 20))
    return out
