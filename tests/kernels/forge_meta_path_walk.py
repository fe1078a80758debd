"""Forgery: no DSL at all. From getattr(sys, "meta_path") it walks every object reachable through __dict__, slots, closures and __globals__ (no name the source scan forbids) and bumps or rewrites every counter, mode, plan and tally it finds, hoping to fake the DSL evidence.

Problem: p28
DSL: tirx
Device: cpu
Expected: policy_violation
"""
import sys

import torch

_TAMPER = {"solve_calls": 99, "mode": 0, "in_solve": False, "depth": 0, "compiling": 0, "plan": {}, "written": {}}


def _children(obj):
    found = []
    for name in ("__dict__", "__closure__", "__globals__", "__self__", "__func__", "__wrapped__"):
        try:
            value = getattr(obj, name)
        except Exception:
            continue
        if isinstance(value, dict):
            found += list(value.values())
        elif isinstance(value, tuple):
            found += [getattr(cell, "cell_contents", cell) for cell in value]
        elif value is not None:
            found.append(value)
    for name in getattr(type(obj), "__slots__", ()):
        try:
            found.append(getattr(obj, name))
        except Exception:
            continue
    return found


def _tamper(obj):
    for name, value in _TAMPER.items():
        try:
            if hasattr(obj, name) and not isinstance(obj, type):
                setattr(obj, name, value)
        except Exception:
            pass
    if isinstance(obj, dict):
        for key in list(obj):
            if key in ("calls", "solve_calls", "built", "called"):
                obj[key] = {"tirx": 99}


def _walk(roots, limit=20000):
    seen, stack = set(), list(roots)
    while stack and len(seen) < limit:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (int, float, str, bytes, torch.Tensor)):
            continue
        seen.add(id(obj))
        _tamper(obj)
        stack.extend(_children(obj))


_walk(list(getattr(sys, "meta_" + "path")))


def solve(x, residual, weight):
    _walk(list(getattr(sys, "meta_" + "path")))
    s = x.float() + residual.float()
    return (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)
