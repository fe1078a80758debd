"""A real OpenAI-compatible HTTP server for tests: plays scripted replies and records every request.

    server = ScriptedOpenAIServer(("127.0.0.1", 0))      # binds now: nothing to wait for
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.script([reply(calls=[call("bash", {"command": "ls"})]), error(429), reply("done")])
    ... point a client at server.base_url ...
    server.requests                                        # the JSON bodies received, in order

A step is a reply(), an error(), a raw() body (malformed replies), a hold() (blocks until released or a
timeout), or a callable taking the request body and returning one of those. When the script runs out, the
server answers 400. `server.context_chars = N` makes it a model with a small context: a request whose
messages are longer than N characters (as JSON) is answered with a context-length error and consumes no step.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


def call(name: str, arguments: dict | str) -> dict:
    """One tool call as a model would send it (arguments as a JSON string)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": f"call_{uuid.uuid4().hex[:10]}", "type": "function", "function": {"name": name, "arguments": args}}


def reply(content: str | None = None, calls: list[dict] | None = None, prompt_tokens: int = 100,
          completion_tokens: int = 20, cached_tokens: int | None = None, **message: Any) -> dict:
    """A chat.completion reply with an assistant message (cached_tokens: of the prompt, served from a cache)."""
    msg = {"role": "assistant", "content": content, **message}
    if calls:
        msg["tool_calls"] = calls
    return {"status": 200, "body": {
        "id": f"chatcmpl-{uuid.uuid4().hex[:8]}", "object": "chat.completion", "created": int(time.time()),
        "model": "scripted", "choices": [{"index": 0, "message": msg,
                                          "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens,
                  **({} if cached_tokens is None else {"prompt_tokens_details": {"cached_tokens": cached_tokens}})}}}


def error(status: int, message: str = "scripted error", retry_after: float | None = None) -> dict:
    """An HTTP error in the OpenAI error format."""
    headers = {"retry-after": str(retry_after)} if retry_after is not None else {}
    return {"status": status, "headers": headers,
            "body": {"error": {"message": message, "type": "scripted", "code": status}}}


def raw(body: str | bytes, status: int = 200, content_type: str = "application/json") -> dict:
    """A reply whose body is sent byte for byte (malformed JSON, HTML from a proxy, a cut-off stream)."""
    data = body.encode() if isinstance(body, str) else body
    return {"status": status, "raw": data, "headers": {"Content-Type": content_type}}


class Hold:
    """A step that blocks the request until release() (or timeout_s), then plays `then`."""

    def __init__(self, then: dict, timeout_s: float = 10.0):
        self.then, self.timeout_s = then, timeout_s
        self.reached = threading.Event()
        self._released = threading.Event()

    def release(self) -> None:
        self._released.set()

    def __call__(self, body: dict) -> dict:
        self.reached.set()
        self._released.wait(self.timeout_s)
        return self.then


class ScriptedOpenAIServer(ThreadingHTTPServer):
    """POST /v1/chat/completions answers from the script; GET /v1/models lists one model."""

    daemon_threads = True

    def __init__(self, address=("127.0.0.1", 0)):
        super().__init__(address, _Handler)
        self.steps: list[dict | Callable[[dict], dict]] = []
        self.requests: list[dict] = []
        self.headers_seen: list[dict] = []
        self.lock = threading.Lock()
        self.received = threading.Condition(self.lock)
        self.context_chars: int | None = None
        """Longest request (its messages as JSON) that fits the context; None for no limit."""

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/v1"

    def script(self, steps: list) -> None:
        with self.lock:
            self.steps = list(steps)
            self.requests.clear()

    def wait_for_requests(self, n: int, timeout_s: float = 30.0) -> bool:
        """Block until n requests have arrived (an event wait, not a sleep)."""
        with self.received:
            return self.received.wait_for(lambda: len(self.requests) >= n, timeout_s)

    def next_step(self, body: dict, headers: dict) -> dict:
        with self.received:
            self.requests.append(body)
            self.headers_seen.append(headers)
            self.received.notify_all()
            size = len(json.dumps(body.get("messages", [])))
            if self.context_chars is not None and size > self.context_chars:
                return error(400, f"This model's maximum context length is {self.context_chars} characters; "
                                  f"the request has {size}.")
            step = self.steps.pop(0) if self.steps else error(400, "script exhausted: no more scripted replies")
        return step(body) if callable(step) else step


class _Handler(BaseHTTPRequestHandler):
    server: ScriptedOpenAIServer

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, body: dict | None, headers: dict | None = None, data: bytes | None = None) -> None:
        data = json.dumps(body).encode() if data is None else data
        headers = dict(headers or {})
        self.send_response(status)
        self.send_header("Content-Type", headers.pop("Content-Type", "application/json"))
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self) -> None:
        self._send(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        step = self.server.next_step(body, dict(self.headers))
        self._send(step["status"], step.get("body"), step.get("headers"), step.get("raw"))
