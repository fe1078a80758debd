"""`mkb doctor`: is this machine ready? One line per component, each failure with its fix."""

from __future__ import annotations

import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass

from mkb import environment
from mkb.settings import Settings, environment as process_environment


@dataclass(frozen=True)
class Finding:
    """One component's state: ok, warn (works, with a limit), fail (needs fixing) or skip."""

    component: str
    state: str
    detail: str
    fix: str = ""


def _torch() -> list[Finding]:
    try:
        import torch
    except ImportError:
        return [Finding("torch", "fail", "not installed", "make install")]
    found = [Finding("torch", "ok", f"{torch.__version__} (CUDA build {torch.version.cuda or 'none'})")]
    gpus = environment.gpus()
    if gpus:
        g = gpus[0]
        found.append(Finding("gpu", "ok", f"{len(gpus)} x {g['name']} ({g['arch']}, {g['memory_gb']} GB)"))
        driver = environment.driver_version()
        found.append(Finding("driver", "ok" if driver else "warn", driver or "nvidia-smi not found",
                             "" if driver else "install the NVIDIA driver utilities (nvidia-smi)"))
    else:
        found.append(Finding("gpu", "warn", "no CUDA GPU visible: the judge runs in CPU mode, GPU steps are skipped",
                             "run on a machine with an NVIDIA GPU (Hopper or Blackwell) to time kernels"))
    return found


def _dsl(name: str, arch: str, timeout_s: float) -> Finding:
    """Import and compile (on a GPU also run) the smallest kernel, in a separate process."""
    env = process_environment()
    if shutil.which("nvcc"):  # TIRx compiles through nvcc where there is one (NVRTC otherwise)
        env.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")
    try:
        out = subprocess.run([sys.executable, "-m", "mkb.dsl_smoke", name, "--arch", arch], capture_output=True,
                             text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return Finding(name, "fail", f"compile smoke test ran past {timeout_s:.0f} s", "check the toolchain install")
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1][:200]
        package = "nvidia-cutlass-dsl[cu13]==4.8.1" if name == "cutedsl" else "apache-tvm==0.27.0.post1"
        return Finding(name, "fail", last, f"reinstall with 'make install' ({package})")
    version = environment.versions()["nvidia-cutlass-dsl" if name == "cutedsl" else "apache-tvm"]
    return Finding(name, "ok", f"{version}: {out.stdout.strip().split(': ', 1)[-1]}")


def _database(settings: Settings) -> Finding:
    from mkb.errors import StoreError
    from mkb.store import Store

    path = settings.db_path
    if not path.exists():
        writable = shutil.disk_usage(path.parent if path.parent.exists() else settings.home.parent)
        return Finding("database", "ok", f"{path} will be created ({writable.free / 2**30:.0f} GiB free)")
    try:
        with Store(path, read_only=True) as store:
            n = store.query("SELECT count(*) FROM trials")[1][0][0]
            return Finding("database", "ok", f"{path}: schema {store.schema_version}, {n} trials")
    except StoreError as exc:
        return Finding("database", "fail", str(exc), "move the file aside or choose another with --db")


def _sandbox() -> list[Finding]:
    from mkb.agent.bwrap import bwrap_problem

    found = []
    problem = bwrap_problem()
    found.append(Finding("sandbox (local)", "ok" if problem is None else "warn",
                         "bubblewrap isolates attempts" if problem is None else
                         f"{problem}: --sandbox local attempts are refused (unless MKB_UNSAFE_SANDBOX=1)",
                         "" if problem is None else "apt-get install bubblewrap, or use --sandbox docker"))
    docker = shutil.which("docker")
    if docker:
        ok = subprocess.run(["docker", "version"], capture_output=True, timeout=20).returncode == 0
        found.append(Finding("sandbox (docker)", "ok" if ok else "warn",
                             "Docker engine answers" if ok else "docker CLI present, no engine answers",
                             "" if ok else "start one: scripts/dockerd.sh start"))
    else:
        found.append(Finding("sandbox (docker)", "skip", "docker CLI not installed"))
    return found


def _judge_sandbox(settings: Settings) -> Finding:
    """Which isolation the judge grades kernels in (mkb.judge.sandbox), or why it has none."""
    from mkb.judge import sandbox

    found, why = sandbox.find()
    if found is not None:
        facts = found.describe(min(settings.judge_tmpfs_mb, settings.judge_memory_mb))
        return Finding("judge sandbox", "ok", f"{facts['sandbox']}; {facts['namespaces']} namespaces; "
                                             f"candidate uid {facts['uid']}")
    if settings.judge_unsafe_no_sandbox:
        return Finding("judge sandbox", "warn", f"none ({why}): kernels are graded in plain processes that see "
                                               f"the host (MKB_JUDGE_UNSAFE_NO_SANDBOX is set)", sandbox.FIX)
    return Finding("judge sandbox", "fail", f"none: {why}; every grading would be an infra_error", sandbox.FIX)


def _endpoint(base_url: str | None) -> Finding:
    if not base_url:
        return Finding("model endpoint", "skip", "none configured (pass --base-url or set MKB_BASE_URL)")
    url = base_url.rstrip("/") + "/models"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return Finding("model endpoint", "ok", f"{url} answered HTTP {response.status}")
    except urllib.error.HTTPError as exc:
        state = "ok" if exc.code in (401, 403) else "fail"
        return Finding("model endpoint", state, f"{url} answered HTTP {exc.code}",
                       "" if state == "ok" else "check the base URL")
    except (urllib.error.URLError, OSError) as exc:
        return Finding("model endpoint", "fail", f"{url} unreachable ({exc})", "check the URL and that the server runs")


def diagnose(settings: Settings, base_url: str | None = None, dsl_timeout_s: float = 300) -> list[Finding]:
    """Every check, in order."""
    versions = environment.versions()
    findings = [Finding("python", "ok", f"{versions['python']} (mkb {versions['mkb']})")]
    findings += _torch()
    nvcc = shutil.which("nvcc")
    findings.append(Finding("nvcc", "ok" if nvcc else "warn", nvcc or "not on PATH",
                            "" if nvcc else "TIRx compiles to CUDA C only; install the CUDA toolkit for cubins"))
    gpus = environment.gpus()
    arch = gpus[0]["arch"] if gpus else settings.arch
    findings += [_dsl("cutedsl", arch, dsl_timeout_s), _dsl("tirx", arch, dsl_timeout_s), _database(settings)]
    findings += [_judge_sandbox(settings), *_sandbox()]
    findings.append(_endpoint(base_url or settings.base_url))
    return findings
