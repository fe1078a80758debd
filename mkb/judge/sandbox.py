"""The OS sandbox of a grading: one namespace for the grading, a cell of its own for each harness.

A grading runs in two layers, both built with bubblewrap:

- the grading's namespace (the *jail*): a mount namespace (and, where possible, a user namespace)
  with the host's files as they are, except /dev/shm, which is a fresh tmpfs capped at
  `judge_tmpfs_mb`. The trusted referee runs here. The referee and the harnesses share this one
  (CPU gradings' tensors are files there), and nothing else on the host sees it. Across cells the
  GPU side uses CUDA IPC memory only (CUDA IPC event handles do not open in a cell: wire.Signal).
- a *cell* per harness process (candidate, eager), entered from the jail with nsenter: new user,
  mount, PID, network, IPC, UTS and cgroup namespaces; uid 65534 without capabilities and with
  no_new_privs; further user namespaces disabled where bwrap can. It sees, read-only, only the
  interpreter, the site-packages and system libraries it needs (view.py), the judge's harness
  modules at /judge and kernel.py at /kernel (the eager harness: the problem at /problem); a
  private /tmp tmpfs capped at `judge_tmpfs_mb`; the jail's /dev/shm; a /dev with the basic nodes
  and the GPU's; its own /proc. Its processes die with its PID namespace.

find() probes once per process which construction this machine allows (a user-namespace jail,
else a privileged one as root), by running a cell for real; when none works the judge says why
and grades nothing (unless the user asked for no sandbox; see grading.py).
"""

from __future__ import annotations

import functools
import os
import select
import shutil
import subprocess
import sys
from dataclasses import dataclass

from mkb.judge.view import KERNEL_ROOT, View

CELL_UID = 65534
FIX = ("install bubblewrap (apt-get install bubblewrap) on a kernel that allows user namespaces; in Docker, "
       "run the container with --security-opt seccomp=unconfined --security-opt systempaths=unconfined (and "
       "--security-opt apparmor=unconfined where AppArmor is on). Or set MKB_JUDGE_UNSAFE_NO_SANDBOX=1 to grade "
       "in plain processes that see the host (unsafe)")
"""What to do when no sandbox can start (the end of every such message)."""


@dataclass(frozen=True)
class Sandbox:
    """How this machine builds the grading's namespaces (found by find())."""

    bwrap: str
    nsenter: str
    userns: bool
    """The jail is a user namespace (unprivileged users, and root too); False: root's privileged mounts."""
    disable_userns: bool
    """This bwrap can forbid user namespaces inside a cell (--disable-userns, bubblewrap >= 0.8)."""
    version: str

    def jail_argv(self, shm_bytes: int) -> list[str]:
        """The prefix that starts a command (the referee) in a fresh grading namespace."""
        return [self.bwrap, "--die-with-parent", *(["--unshare-user"] if self.userns else []),
                "--dev-bind", "/", "/", "--size", str(shm_bytes), "--perms", "1777", "--tmpfs", "/dev/shm", "--"]

    def cell_argv(self, jail_pid: int, view: View, as_pid_1: bool = False) -> list[str]:
        """The prefix that starts a command in a cell of the grading whose namespace jail_pid holds.

        as_pid_1 makes the command its PID namespace's first process (no bwrap init above it). The eager
        harness runs so, the candidate under bwrap's init (pid 2): no two processes that share the grading's
        /dev/shm then have the same pid (CUDA names IPC state after processes; ROCm's IPC events were
        seen to collide across PID namespaces that shared /dev/shm). A candidate as pid 1 could not even
        crash itself with a signal.
        """
        enter = [self.nsenter, "--target", str(jail_pid), "--mount"]
        if self.userns:
            enter += ["--user", "--preserve-credentials"]
        user = ["--unshare-user", "--uid", str(CELL_UID), "--gid", str(CELL_UID)] if self.userns else []
        if self.userns and self.disable_userns:
            user.append("--disable-userns")
        return [*enter, "--", self.bwrap, "--die-with-parent", *user, "--unshare-pid",
                *(["--as-pid-1"] if as_pid_1 else []), "--unshare-net",
                "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "mkb-judge",
                "--cap-drop", "ALL", *view.bwrap_args(), "--"]

    def describe(self, tmpfs_mb: int) -> dict:
        """What a cell is, for every record's details.isolation and for `mkb doctor`."""
        host_uid = os.getuid()
        return {"sandbox": f"bubblewrap {self.version}: the grading in a {'user + ' if self.userns else ''}mount "
                           f"namespace of its own, each harness in a cell",
                "namespaces": "user, mount, PID, network, IPC, UTS, cgroup" if self.userns
                              else "mount, PID, network, IPC, UTS, cgroup",
                "uid": (f"{CELL_UID} in its own user namespace (host uid {host_uid}), no capabilities, no_new_privs"
                        if self.userns else f"host uid {host_uid}, no capabilities, no_new_privs"),
                "files": f"read-only toolchain, harness and kernel only; private /tmp tmpfs of {tmpfs_mb} MiB; "
                         f"/dev/shm: the grading's own tmpfs of {tmpfs_mb} MiB"}


def _version(bwrap: str) -> tuple[str, bool]:
    out = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10)
    helptext = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10)
    return out.stdout.strip().split()[-1] if out.stdout.strip() else "?", "--disable-userns" in helptext.stdout


@functools.lru_cache(maxsize=1)
def find() -> tuple[Sandbox | None, str]:
    """The sandbox this machine allows and its description, or None and why not (probed once)."""
    bwrap, nsenter = shutil.which("bwrap"), shutil.which("nsenter")
    if bwrap is None:
        return None, "bubblewrap (bwrap) is not installed"
    if nsenter is None:
        return None, "nsenter (util-linux) is not installed"
    try:
        version, disable_userns = _version(bwrap)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"bwrap does not run: {exc}"
    failures = []
    for userns in (True, False):
        if not userns and os.geteuid() != 0:
            continue
        candidate = Sandbox(bwrap, nsenter, userns, disable_userns, version)
        problem = probe(candidate)
        if problem is None:
            return candidate, candidate.describe(0)["sandbox"]
        failures.append(f"{'user-namespace' if userns else 'privileged'} sandbox: {problem}")
    return None, "; ".join(failures)


def probe(sandbox: Sandbox, timeout_s: float = 30.0) -> str | None:
    """Why this construction fails here, or None: a jail with a marker in its /dev/shm, and a cell that
    starts this interpreter, reads the marker and does not see the host's /tmp."""
    code = ("import os, sys; sys.stdout.write(open('/dev/shm/mkb-probe').read()); "
            "sys.stdout.write(' host-tmp-visible' if os.path.exists(sys.argv[1]) else '')")
    marker = f"/tmp/mkb-sandbox-probe-{os.getpid()}"
    open(marker, "w").close()
    jail = subprocess.Popen([*sandbox.jail_argv(1 << 20), "sh", "-c",
                             "echo ok > /dev/shm/mkb-probe && echo $$ && exec sleep 60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        ready, _, _ = select.select([jail.stdout], [], [], timeout_s)
        line = jail.stdout.readline().decode().strip() if ready else ""
        if not line.isdigit():
            jail.kill()
            return f"the grading namespace did not start: {jail.communicate(timeout=10)[1].decode()[-300:].strip()}"
        view = View.for_harness(harness_dir=None, stage=None, stage_root=KERNEL_ROOT, gpu=False,
                                visible_devices=None, tmp_bytes=1 << 20, private=())
        cell = subprocess.run([*sandbox.cell_argv(int(line), view), sys.executable, "-S", "-c", code, marker],
                              capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        jail.kill()
        jail.wait()
        os.unlink(marker)
    if cell.returncode != 0 or cell.stdout.strip() != "ok":
        return f"a cell did not work (exit {cell.returncode}): {(cell.stderr or cell.stdout).strip()[-300:]}"
    return None
