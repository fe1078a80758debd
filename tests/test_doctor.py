"""`mkb doctor`: real toolchain compiles, real database file, a real local HTTP endpoint."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from mkb.cli import main
from mkb.doctor import _endpoint


class _Models(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server API)
        code = 200 if self.path == "/v1/models" else 404
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b'{"data": []}')

    def log_message(self, *args):
        pass


@pytest.fixture
def endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_endpoint_reachability(endpoint):
    assert _endpoint(endpoint + "/v1").state == "ok"
    assert _endpoint(endpoint + "/nope").state == "fail"
    assert _endpoint(None).state == "skip"
    closed = _endpoint("http://127.0.0.1:9/v1")
    assert closed.state == "fail" and "unreachable" in closed.detail


def test_doctor_compiles_both_dsls_and_reports_every_component(endpoint, tmp_path):
    corrupt = tmp_path / "bad.duckdb"
    corrupt.write_bytes(b"junk" * 100)
    result = CliRunner().invoke(main, ["--db", str(corrupt), "doctor", "--base-url", endpoint + "/v1", "--json"])
    rows = {r["component"]: r for r in json.loads(result.stdout)}
    assert {"python", "torch", "gpu", "cutedsl", "tirx", "database", "model endpoint"} <= set(rows)
    assert rows["cutedsl"]["state"] == "ok" and "compiled for sm_" in rows["cutedsl"]["detail"]
    assert rows["tirx"]["state"] == "ok" and "compiled for sm_" in rows["tirx"]["detail"]
    assert rows["model endpoint"]["state"] == "ok"
    assert rows["database"]["state"] == "fail" and rows["database"]["fix"]
    assert result.exit_code == 1  # the corrupt database is a failure
