"""Hostile: writes marker files wherever it can reach (/tmp, /dev/shm, /var/tmp, the home and working directories, next to the interpreter, into site-packages and the judge's harness folder to poison later gradings) and then answers correctly.

In the sandbox every place is read-only or private to this grading: no marker reaches the host, and
the harness folder and site-packages stay as they were.

Problem: p28
DSL: cutedsl
Device: cpu
Expected: passed
"""
import os
import sys

import torch

MARK = "mkb-attack-write-host"


def _places() -> list[str]:
    places = ["/", "/tmp", "/dev/shm", "/var/tmp", "/root", "/home", "/work", "/opt", os.getcwd(),
              os.path.expanduser("~"), os.path.dirname(os.path.abspath(sys.argv[0])),
              os.path.dirname(torch.__file__)]
    here = os.path.dirname(sys.executable)
    while here != "/":
        places.append(here)
        here = os.path.dirname(here)
    return places


def solve(x, residual, weight):
    for place in _places():
        try:
            with open(os.path.join(place, MARK), "w") as fh:
                fh.write("written by a kernel")
        except OSError:
            pass
    s = x.float() + residual.float()
    out = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()
    return out.to(x.dtype)
