"""Shared pieces of the CPU replays of solutions (tests/test_*_numerics.py, tests/*_model.py).

A replay re-runs a solution's exact arithmetic on the CPU and is judged the referee's way: the problem's
reference and its fp64 anchor on the same inputs, compared under the problem's tolerance factor.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from mkb import problems
from mkb import tensortree as tt

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def _catalog():
    return problems.load_catalog(ROOT / "problems")


def load_problem(pid: str):
    """The problem module of pid (e.g. "p52"), imported the way the judge imports it."""
    return problems.load_module(problems.resolve(pid, _catalog()))


def fp64(inputs) -> list:
    """The anchor's inputs: every floating tensor in float64, everything else as it is."""
    return [t.double() if torch.is_tensor(t) and t.is_floating_point() else t for t in inputs]


def factor(problem) -> float:
    return getattr(problem, "TOLERANCE", {}).get("factor", 3.0)


def ratio(name: str, out, ref, anchor, tolerance: float = 3.0) -> float:
    """max error / allowance of the judge's rule for one tensor (1.0 = at the limit); fails when over it."""
    c = tt.compare(name, out, ref, anchor, tolerance)
    assert c.ok, c.note
    return c.max_error / c.allowance


def judged_ratio(problem, inputs, out, name: str = "out") -> float:
    """ratio() of a single-output replay against the problem's reference and fp64 anchor on inputs."""
    return ratio(name, out, problem.reference(*inputs), problem.reference(*fp64(inputs)), factor(problem))
