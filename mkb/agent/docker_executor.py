"""The Docker workspace executor: one container per attempt, no network, the sandbox limits, read-only system."""

from __future__ import annotations

import io
import logging
import posixpath
import tarfile
import threading
import time
import uuid
from pathlib import Path

from mkb.agent.executor import MAX_FILE_BYTES, WORKDIR, ExecResult, OutputCapture, child_env, relative_path
from mkb.agent.limits import MIB, SandboxLimits, capped_cpus
from mkb.errors import ConfigError

log = logging.getLogger(__name__)

_DIR_BIT, _LINK_BIT = 1 << 31, 1 << 27  # Go's os.FileMode bits, as the engine reports them
# Runs the command as its own process group (job control) and, when it exits, kills every other process in
# the container but its keep-alive (PID 1): background jobs and those that left with setsid end with their
# command, as under bubblewrap (exec then kills them again from outside, in case the command killed this). The command's stderr joins its stdout on one pipe (Docker would reorder two
# streams); the shell's own job notices go to /dev/null.
_GROUP_WRAPPER = 'exec 2>/dev/null; set -m; bash -c "$1" 2>&1 & pid=$!; wait $pid; rc=$?; kill -9 -1; exit $rc'


def engine(client=None):
    """A Docker client whose engine answers.

    Raises:
        ConfigError: no engine answers.
    """
    import docker

    try:
        client = client or docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise ConfigError(f"no Docker engine answers ({str(exc)[:160]}). Start one with "
                          f"'scripts/dockerd.sh start', or use --sandbox local.") from None
    return client


def check_image(image: str, client=None) -> None:
    """Raise ConfigError now, before any attempt starts, when the engine or the image is missing."""
    import docker

    try:
        engine(client).images.get(image)
    except docker.errors.ImageNotFound:
        raise ConfigError(f"Docker image '{image}' not found. Build it (make image), or choose another with "
                          f"--image.") from None


class DockerExecutor:
    """Runs the agent's commands with `docker exec` in a container made for this attempt.

    The container's own filesystem is read-only; the workspace (WORKDIR) and /tmp are tmpfs volumes of the
    disk limit's size, made for the attempt and removed with it, and /dev/shm is capped. The workspace is
    copied in when the container starts; afterwards the container holds the only copy (read kernel.py and
    SKILL.md through read_file). Nothing from the host is mounted.
    """

    def __init__(self, workspace: Path, image: str, *, limits: SandboxLimits = SandboxLimits(), client=None):
        """Raises:
            ConfigError: no engine, no such image, or the engine refuses the container (the reason is named).
        """
        import docker

        self.client = engine(client)
        self.isolation, self.workdir = f"docker:{image}", WORKDIR
        self._env = child_env(home="/tmp")
        cpus, cpus_note = capped_cpus(limits, int(self.client.info().get("NCPU") or 1))
        self.limits = {"memory": f"{limits.memory_mb} MiB for all processes (container)", "pids": str(limits.pids),
                       "cpus": cpus_note, "disk": f"workspace and /tmp {limits.disk_mb} MiB and {limits.files} files "
                                                 f"each (tmpfs volumes), files up to {limits.disk_mb} MiB",
                       "shm": f"{limits.shm_mb} MiB", "strays": "killed with the command (kill -1)"}
        self.volumes: list = []
        try:
            self.volumes += [self._volume(limits) for _ in range(2)]
            self.container = self.client.containers.run(
                image, ["sleep", "infinity"], detach=True, network_mode="none", read_only=True,
                volumes={self.volumes[0].name: {"bind": WORKDIR, "mode": "rw"},
                         self.volumes[1].name: {"bind": "/tmp", "mode": "rw"}},
                mem_limit=f"{limits.memory_mb}m", memswap_limit=f"{limits.memory_mb}m", nano_cpus=int(cpus * 1e9),
                pids_limit=limits.pids, shm_size=f"{limits.shm_mb}m", working_dir=WORKDIR, environment=self._env,
                ulimits=[docker.types.Ulimit(name="fsize", soft=limits.disk_mb * MIB, hard=limits.disk_mb * MIB),
                         docker.types.Ulimit(name="core", soft=0, hard=0)],
                cap_drop=["ALL"], security_opt=["no-new-privileges"], labels={"mkb.role": "attempt"})
        except docker.errors.ImageNotFound:
            self._remove_volumes()
            raise ConfigError(f"Docker image '{image}' not found. Build it (make image), or choose another with "
                              f"--image.") from None
        except docker.errors.APIError as exc:
            self._remove_volumes()
            raise ConfigError(f"the Docker engine refused the attempt's container: "
                              f"{str(exc.explanation or exc)[:200]}. Fix the engine, or use --sandbox local.") from None
        self._owner = self._user()
        self._upload(Path(workspace))

    def _volume(self, limits: SandboxLimits):
        return self.client.volumes.create(
            name=f"mkb-attempt-{uuid.uuid4().hex[:12]}", driver="local", labels={"mkb.role": "attempt"},
            driver_opts={"type": "tmpfs", "device": "tmpfs",
                         "o": f"size={limits.disk_mb}m,nr_inodes={limits.files},mode=1777"})

    def _user(self) -> tuple[int, int]:
        """The uid and gid commands run as: files put into the container are theirs."""
        out = self.container.exec_run(["sh", "-c", "id -u; id -g"]).output.decode().split()
        return (int(out[0]), int(out[1])) if len(out) == 2 and all(x.isdigit() for x in out) else (0, 0)

    def _owned(self, info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid, info.gid = self._owner
        info.uname = info.gname = ""
        return info

    def _upload(self, workspace: Path) -> None:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for child in sorted(workspace.iterdir()):
                tar.add(str(child), arcname=child.name, filter=self._owned)
        self.client.api.put_archive(self.container.id, WORKDIR, buffer.getvalue())

    def exec(self, command: str, timeout_s: float, output_limit: int = 20_000) -> ExecResult:
        started = time.monotonic()
        api = self.client.api
        exec_id = api.exec_create(self.container.id, ["bash", "-c", _GROUP_WRAPPER, "_", command], workdir=WORKDIR,
                                  environment=self._env)["Id"]
        capture = OutputCapture(output_limit)
        reader = threading.Thread(target=capture.drain, args=(api.exec_start(exec_id, stream=True),), daemon=True)
        reader.start()
        reader.join(timeout=max(0.01, timeout_s))
        timed_out = reader.is_alive()
        self._kill_all()  # also when the command killed its wrapper before the wrapper's own kill -1
        reader.join(timeout=5.0)
        exit_code = None if timed_out else api.exec_inspect(exec_id)["ExitCode"]
        output, omitted = capture.result()
        return ExecResult(exit_code, output, timed_out, omitted, time.monotonic() - started)

    def _kill_all(self) -> None:
        # kill(-1) reaches every process but PID 1 (the container's keep-alive) and the caller.
        self.container.exec_run(["bash", "-c", "kill -9 -1"])

    def _inside(self, path: str) -> str:
        return posixpath.join(WORKDIR, relative_path(path, WORKDIR))

    def read_file(self, path: str) -> str:
        import docker

        target = self._inside(path)
        for _ in range(8):
            try:
                chunks, stat = self.client.api.get_archive(self.container.id, target)
            except docker.errors.NotFound:
                raise FileNotFoundError(f"{path}: no such file") from None
            if stat["mode"] & _DIR_BIT:
                raise IsADirectoryError(f"{path} is a directory")
            if stat["mode"] & _LINK_BIT:
                link = posixpath.normpath(posixpath.join(posixpath.dirname(target), stat["linkTarget"]))
                target = self._inside(link)
                continue
            if stat["size"] > MAX_FILE_BYTES:
                raise ValueError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
            with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
                return tar.extractfile(tar.next()).read().decode("utf-8", "replace")
        raise OSError(f"{path}: too many levels of symbolic links")

    def write_file(self, path: str, text: str) -> None:
        import docker

        target = self._inside(path)
        parent, name = posixpath.split(target)
        made = self.container.exec_run(["bash", "-c", 'test ! -d "$1" || exit 21; mkdir -p "$2"', "_", target, parent])
        if made.exit_code == 21:
            raise IsADirectoryError(f"{path} is a directory")
        if made.exit_code != 0:
            raise OSError(f"cannot create {posixpath.relpath(parent, WORKDIR)}: {made.output.decode()[:200]}")
        data = text.encode("utf-8")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = self._owned(tarfile.TarInfo(name))
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        try:
            self.client.api.put_archive(self.container.id, parent, buffer.getvalue())
        except docker.errors.APIError as exc:
            raise OSError(f"writing {path} failed: {str(exc.explanation or exc)[:200]}") from None

    def close(self) -> None:
        import docker

        try:
            self.container.remove(force=True)
        except docker.errors.NotFound:
            pass
        self._remove_volumes()

    def _remove_volumes(self) -> None:
        import docker

        for volume in self.volumes:
            try:
                volume.remove(force=True)
            except docker.errors.NotFound:
                pass
