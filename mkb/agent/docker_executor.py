"""The Docker workspace executor: one container per attempt, no network, CPU/memory/pids limits."""

from __future__ import annotations

import io
import posixpath
import tarfile
import threading
import time
from pathlib import Path

from mkb.agent.executor import MAX_FILE_BYTES, WORKDIR, ExecResult, OutputCapture, child_env, relative_path
from mkb.errors import ConfigError

_DIR_BIT, _LINK_BIT = 1 << 31, 1 << 27  # Go's os.FileMode bits, as the engine reports them
# Runs the command as its own process group (job control) and kills what is left of the group when it
# exits, so background jobs end with their command, as under bubblewrap. The command's stderr joins its
# stdout on one pipe (Docker would reorder two streams); the shell's own job notices go to /dev/null.
_GROUP_WRAPPER = 'exec 2>/dev/null; set -m; bash -c "$1" 2>&1 & pid=$!; wait $pid; rc=$?; kill -9 -$pid; exit $rc'


class DockerExecutor:
    """Runs the agent's commands with `docker exec` in a container made for this attempt.

    The workspace is copied in at WORKDIR when the container starts; afterwards the container holds
    the only copy (read kernel.py and SKILL.md through read_file). Nothing from the host is mounted.
    """

    def __init__(self, workspace: Path, image: str, *, cpus: float = 4.0, memory: str = "16g",
                 pids: int = 1024, client=None):
        import docker

        try:
            self.client = client or docker.from_env()
            self.client.ping()
        except docker.errors.DockerException as exc:
            raise ConfigError(f"no Docker engine answers ({str(exc)[:160]}). Start one with "
                              f"'scripts/dockerd.sh start', or use --sandbox local.") from None
        self.isolation, self.workdir = f"docker:{image}", WORKDIR
        self._env = child_env(home="/tmp")
        try:
            self.container = self.client.containers.run(
                image, ["sleep", "infinity"], detach=True, network_mode="none", mem_limit=memory,
                memswap_limit=memory, nano_cpus=int(cpus * 1e9), pids_limit=pids, working_dir=WORKDIR,
                environment=self._env, labels={"mkb.role": "attempt"})
        except docker.errors.ImageNotFound:
            raise ConfigError(f"Docker image '{image}' not found. Build it (see README: docker build), "
                              f"or choose another with --image.") from None
        self._upload(Path(workspace))

    def _upload(self, workspace: Path) -> None:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.add(str(workspace), arcname=WORKDIR.lstrip("/"))
        self.client.api.put_archive(self.container.id, "/", buffer.getvalue())

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
        if timed_out:
            self._kill_all()
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
            info = tarfile.TarInfo(name)
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
