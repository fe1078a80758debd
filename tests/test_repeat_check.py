"""scripts/gpu_repeat_check.py's comparison on the CPU (the script itself runs solutions on a GPU)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_repeat_check.py"
spec = importlib.util.spec_from_file_location("gpu_repeat_check", SCRIPT)
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def test_a_deterministic_solve_gives_the_same_bits_and_a_racy_one_is_caught():
    sets = [[torch.arange(8, dtype=torch.float32)], [torch.ones(8, dtype=torch.float32)]]
    assert check.repeat(lambda x: (x * 2, x.sum()), sets, 20) == {"differing_calls": 0, "first_differing": [],
                                                                    "max_abs_diff": None}
    calls = [0]

    def racy(x):  # every 7th call reads a stale element, as a pipeline race would
        calls[0] += 1
        out = x * 2
        if calls[0] % 7 == 0:
            out[3] = float("nan") if calls[0] == 14 else out[3] + 0.5
        return out

    found = check.repeat(racy, sets, 20)
    assert found["first_differing"] == [7, 14] and found["max_abs_diff"] == float("inf")

    def mutating(x):  # a solve that writes its input: each call still starts from the drawn content
        x.add_(1)
        return x.clone()

    assert check.repeat(mutating, sets, 6)["differing_calls"] == 0


def test_without_a_gpu_it_says_so():
    if torch.cuda.is_available():
        return
    proc = subprocess.run([sys.executable, str(SCRIPT), "/tmp/unused.json", "p61:cutedsl"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == "no GPU: this check runs solutions on one"
