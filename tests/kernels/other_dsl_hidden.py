"""Hack: declared CuTe DSL, but imports TVM through builtins and runs a TIRx kernel (the other DSL, caught at runtime).

Problem: p32
DSL: cutedsl
Device: cpu
Expected: policy_violation
"""
import builtins

import torch

_load = builtins.__dict__["__imp" + "ort__"]
tvm = _load("tvm")
T = _load("tvm.script.tirx", fromlist=["prim_func"])


@T.prim_func
def silu_mul(h_h: T.handle, a_h: T.handle):
    rows = T.int32()
    inter = T.int32()
    H = T.match_buffer(h_h, (rows, inter * 2), "float32")
    A = T.match_buffer(a_h, (rows, inter), "float32")
    for i in range(rows):
        for j in range(inter):
            g = T.meta_var(H[i, j])
            A[i, j] = g / (T.float32(1) + T.exp(-g)) * H[i, j + inter]


_exe = tvm.compile(tvm.IRModule({"main": silu_mul}), target="llvm", tir_pipeline="tirx")


def solve(x, w_gate_up, w_down):
    h = torch.nn.functional.linear(x, w_gate_up).reshape(-1, w_gate_up.shape[0])
    act = torch.empty(h.shape[0], h.shape[1] // 2)
    _exe(h.contiguous(), act)
    return torch.nn.functional.linear(act, w_down).reshape(*x.shape[:-1], w_down.shape[0])
