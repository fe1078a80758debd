"""Hostile: a thread bomb: ten thousand sleeping threads (each one a task, that is a pid, of the host's), which no process count sees.

Small stacks keep it under the address-space limit; the judge's watchdog kills the candidate once
its tree holds more than 4096 threads (crashed). Where the machine caps pids lower (Docker's
--pids-limit), starting a thread fails first and solve() raises (runtime_error).

Problem: p28
DSL: cutedsl
Device: cpu
Expected: crashed
Also: runtime_error
"""
import threading
import time


def solve(x, residual, weight):
    threading.stack_size(64 << 10)
    for _ in range(10000):
        threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
    time.sleep(600)
    return x
