"""Does CUDA IPC (torch storage sharing) work between two processes, with and without `unshare -n`?

Run on a GPU machine: python scripts/gpu_ipc_probe.py. Prints one line per variant.
"""

import subprocess
import sys

import torch
import torch.multiprocessing.reductions as red

CHILD = """
import sys, torch, torch.multiprocessing.reductions as red, pickle, base64
fn, args = pickle.loads(base64.b64decode(sys.argv[1]))
t = fn(*args)
print("ok", float(t.sum()))
"""

if __name__ == "__main__":
    import base64
    import pickle

    x = torch.arange(1024, device="cuda", dtype=torch.float32)
    payload = base64.b64encode(pickle.dumps(red.reduce_tensor(x))).decode()
    for name, prefix in (("plain", []), ("unshare -n", ["unshare", "-n"])):
        out = subprocess.run(prefix + [sys.executable, "-c", CHILD, payload], capture_output=True, text=True, timeout=120)
        print(f"IPC {name}: rc={out.returncode} {out.stdout.strip()} {out.stderr.strip()[-300:]}", flush=True)
