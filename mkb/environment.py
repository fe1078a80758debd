"""Facts about the machine every result records (DESIGN §10), and where the judge runs: resolve_device()."""

from __future__ import annotations

import platform
import socket
import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Literal

from mkb.errors import MkbError
from mkb.records import Record
from mkb.settings import Settings

TOOL_PACKAGES = ("torch", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-cu13", "apache-tvm",
                 "apache-tvm-ffi", "mkb")
TOOLCHAIN = ("nvidia-cutlass-dsl", "apache-tvm", "torch")
"""The packages the agent's instruction names and a trial's fingerprint records."""
CPU_MODE = "CPU (test mode: kernels are graded on the CPU at smoke scale)"
"""What the instruction names as the GPU when the judge runs on the CPU."""


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


def toolchain_versions() -> dict[str, str]:
    """The DSL toolchain's versions (TOOLCHAIN), as the instruction states them and fingerprints record them."""
    return {name: versions()[name] for name in TOOLCHAIN}


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


@lru_cache(maxsize=1)
def gpus() -> tuple[dict, ...]:
    """Visible CUDA GPUs (torch's view: CUDA_VISIBLE_DEVICES applies): name, compute capability, arch,
    memory; empty without CUDA. Probed once per process."""
    import torch

    if not torch.cuda.is_available():
        return ()
    found = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        found.append({"index": i, "name": props.name, "cc": f"{props.major}.{props.minor}",
                      "arch": gpu_arch(props.major, props.minor), "memory_gb": round(props.total_memory / 2**30, 1),
                      "sms": props.multi_processor_count})
    return tuple(found)


def gpu_arch(major: int, minor: int) -> str:
    """The sm_ target for a compute capability: Hopper sm_90a, Blackwell sm_100a, else sm_XY."""
    arch = f"sm_{major}{minor}"
    return arch + "a" if major in (9, 10) else arch


class Device(Record):
    """Where the judge runs kernels, and what the agent's instruction names."""

    kind: Literal["cuda", "cpu"]
    """cuda: GPU gradings at full scale; cpu: the judge's CPU mode at smoke scale (tests)."""
    gpus: list[dict] = []
    """The GPUs the judge uses (empty in CPU mode)."""
    arch: str
    """The architecture kernels are compiled for: the first GPU's, else the arch setting."""

    @property
    def name(self) -> str:
        """The GPU the instruction names."""
        return self.gpus[0]["name"] if self.gpus else CPU_MODE

    @property
    def scale(self) -> str:
        """The problem scale gradings use: full on a GPU; smoke on a CPU, where full scale takes minutes a draw."""
        return "full" if self.kind == "cuda" else "smoke"

    @property
    def slots(self) -> list[str]:
        """One judge worker per slot: each GPU's index (CUDA_VISIBLE_DEVICES), or 'cpu'."""
        return [str(g["index"]) for g in self.gpus] if self.kind == "cuda" else ["cpu"]


def device_kind(requested: str, n_gpus: int, where: str = "on this machine") -> Literal["cuda", "cpu"]:
    """cuda or cpu for the device setting (auto, cuda, cpu) given how many GPUs the judge would see.

    Raises:
        MkbError: cuda was asked for and there is no GPU, or the setting is unknown.
    """
    if requested not in ("auto", "cuda", "cpu"):
        raise MkbError(f"unknown device '{requested}'. Use cuda, cpu or auto.")
    if requested == "cuda" and not n_gpus:
        raise MkbError(f"--device cuda, but no CUDA GPU is visible {where}. "
                       f"Use --device cpu (the judge's CPU mode, for tests), or run on a GPU machine.")
    return "cuda" if requested == "cuda" or (requested == "auto" and n_gpus) else "cpu"


def resolve_device(settings: Settings) -> Device:
    """The judge's device on this machine: settings.device against the visible GPUs (one probe)."""
    found = list(gpus()) if settings.device != "cpu" else []
    kind = device_kind(settings.device, len(found))
    used = found if kind == "cuda" else []
    return Device(kind=kind, gpus=used, arch=used[0]["arch"] if used else settings.arch)


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

        facts["gpus"] = list(gpus())
        facts["cuda"] = torch.version.cuda
        facts["driver"] = driver_version() if facts["gpus"] else None
    return facts
