"""Hostile: connects to every path-based UNIX socket it can find (/tmp, /run, /var/run, /dev/shm: a network namespace does not cover them) and raises with the ones that answered.

In the sandbox no host socket is visible; the test's listener in the host's /tmp gets no connection.

Problem: p28
DSL: cutedsl
Device: cpu
Expected: runtime_error
"""
import builtins
import os
import stat

_socket = getattr(builtins, "__imp" + "ort__")("_so" + "cket")  # past the static scan


def _sockets() -> list[str]:
    found = []
    for root in ("/tmp", "/run", "/var/run", "/dev/shm", "/var/tmp"):
        for here, _, files in os.walk(root):
            for name in files:
                path = os.path.join(here, name)
                try:
                    if stat.S_ISSOCK(os.stat(path).st_mode):
                        found.append(path)
                except OSError:
                    pass
    return found


def solve(x, residual, weight):
    answered = []
    for path in _sockets():
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            s.connect(path)
            s.sendall(b"mkb-attack-socket hello")
            answered.append(path)
        except OSError:
            pass
        finally:
            s.close()
    raise RuntimeError(f"sockets that answered: {answered}")
