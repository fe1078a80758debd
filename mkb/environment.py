"""Facts about the machine and toolchains that every result records (DESIGN §10)."""

from __future__ import annotations

import platform
import socket
import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path

TOOL_PACKAGES = ("torch", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-cu13", "apache-tvm",
                 "apache-tvm-ffi", "mkb")


@lru_cache(maxsize=1)
def versions() -> dict[str, str]:
    """Installed versions of the toolchain packages (from package metadata; nothing is imported)."""
    found = {"python": platform.python_version()}
    for name in TOOL_PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


@lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The commit of the mkb checkout, with '+dirty' when it has local changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (sha + ("+dirty" if dirty else "")) or None


def gpus() -> list[dict]:
    """Visible CUDA GPUs: name, compute capability, arch, memory; empty without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return []
    found = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        found.append({"index": i, "name": props.name, "cc": f"{props.major}.{props.minor}",
                      "arch": gpu_arch(props.major, props.minor), "memory_gb": round(props.total_memory / 2**30, 1),
                      "sms": props.multi_processor_count})
    return found


def gpu_arch(major: int, minor: int) -> str:
    """The sm_ target for a compute capability: Hopper sm_90a, Blackwell sm_100a, else sm_XY."""
    arch = f"sm_{major}{minor}"
    return arch + "a" if major in (9, 10) else arch


def driver_version() -> str | None:
    """The NVIDIA driver version from nvidia-smi, when there is one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def describe(with_gpu: bool = True) -> dict:
    """Everything a stored result carries about where it was produced."""
    facts = {"host": socket.gethostname(), "platform": platform.platform(), "versions": versions(),
             "git_commit": git_commit()}
    if with_gpu:
        import torch

        facts["gpus"] = gpus()
        facts["cuda"] = torch.version.cuda
        facts["driver"] = driver_version() if facts["gpus"] else None
    return facts
