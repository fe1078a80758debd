"""A headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe): standard
library only, no driver binary, no port. Enough to open a page, evaluate JavaScript in it, collect its
console errors and take a screenshot."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

BINARIES = ("chromium", "chromium-browser", "google-chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-quic", "--disable-extensions",
         "--remote-debugging-pipe", "--window-size=1400,1000")
"""Chromium as root in a closed network: no sandbox (root), no GPU, and none of its background connections."""
TIMEOUT_S = 60.0


def find_chromium() -> str | None:
    """The first Chromium on PATH, or None."""
    return next((path for name in BINARIES if (path := shutil.which(name))), None)


class BrowserError(RuntimeError):
    """Chromium answered a command with an error, or went away."""


def _high_fd(fd: int) -> int:
    """fd moved to 10 or above (close-on-exec), so that placing the child's fds 3 and 4 cannot clobber it."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


class Chromium:
    """One headless Chromium with a fresh profile, and one page in it.

    The pipe protocol: Chromium reads commands on its fd 3 and writes replies and events on its fd 4,
    each a JSON object followed by a NUL byte.
    """

    def __init__(self, binary: str, profile: Path):
        to_child, self._to_chrome = os.pipe()
        self._from_chrome, from_child = os.pipe()
        read, write = _high_fd(to_child), _high_fd(from_child)
        self._stderr = open(profile.with_suffix(".stderr"), "wb")
        # bash places the pipe ends at 3 and 4 and execs Chromium (no preexec_fn in a threaded test process;
        # dash cannot name fds above 9).
        self.process = subprocess.Popen(
            ["bash", "-c", f'exec "$@" 3<&{read} 4>&{write} {read}<&- {write}>&-', "bash", binary, *FLAGS,
             f"--user-data-dir={profile}", "about:blank"],
            pass_fds=(read, write), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr)
        os.close(read)
        os.close(write)
        self._inbox: queue.Queue = queue.Queue()
        self.events: list[dict] = []
        self._next_id = 0
        threading.Thread(target=self._read, daemon=True).start()
        target = self._send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self._send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.command(f"{domain}.enable")

    def _read(self) -> None:
        buffer = b""
        with os.fdopen(self._from_chrome, "rb", buffering=0) as pipe:
            while chunk := pipe.read(1 << 16):
                buffer += chunk
                *messages, buffer = buffer.split(b"\0")
                for message in messages:
                    self._inbox.put(json.loads(message))
        self._inbox.put(None)

    def _receive(self) -> dict:
        message = self._inbox.get(timeout=TIMEOUT_S)
        if message is None:
            raise BrowserError(f"Chromium exited (code {self.process.poll()}); see {self._stderr.name}")
        return message

    def _send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._receive()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def command(self, method: str, params: dict | None = None) -> dict:
        """Send a DevTools command to the page; returns its result."""
        return self._send(method, params, self._session)

    def open(self, url: str) -> None:
        """Navigate and wait for the load event (every image and stylesheet loaded or failed)."""
        self.events.clear()
        self.command("Page.navigate", {"url": url})
        while True:
            event = self._receive()
            self.events.append(event)
            if event.get("method") == "Page.loadEventFired":
                return

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (DevTools evaluation, not subject to the page's CSP)."""
        result = self.command("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def console_errors(self) -> list[str]:
        """Errors and warnings the page produced since it was opened: console calls, uncaught exceptions,
        failed loads and Content-Security-Policy violations."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
                found.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                found.append(str(params.get("exceptionDetails", {}).get("text")))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") in ("error", "warning"):
                found.append(params["entry"].get("text", ""))
        return found

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        """Save a PNG of the page (the whole page, up to 12,000 px tall, unless full_page is False)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.command("Page.getLayoutMetrics")["cssContentSize"]
            params |= {"captureBeyondViewport": True,
                       "clip": {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 12_000),
                                "scale": 1}}
        path.write_bytes(base64.b64decode(self.command("Page.captureScreenshot", params)["data"]))
        return path

    def close(self) -> None:
        try:
            self._send("Browser.close")
        except (BrowserError, OSError, queue.Empty):
            pass
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_chrome)
        self._stderr.close()
