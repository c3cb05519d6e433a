"""The runtime's local HTTP API (standard library http.server):

- ``POST /infer/{model}``: the float input as ``.npy`` bytes (Content-Type application/x-npy) or JSON
  (``{"input": [...]}`` or a bare nested list); the answer in the same format (JSON adds the model, revision
  and latency). 400 with a message for a malformed request, 404 for an unknown model, 503 with Retry-After
  when the bounded queue is full, 413 for a body over the limit.
- ``GET /healthz``: the active revision and current configuration (JSON).
- ``GET /metrics``: Prometheus text format.
"""
from __future__ import annotations

import io
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from edgeplan.runtime.engine import Overloaded, Runtime, refreeze
from edgeplan.runtime.model import BadRequest

NPY = "application/x-npy"
MAX_BODY = 64 << 20


def decode(body: bytes, content_type: str) -> tuple[np.ndarray, str]:
    """A request body -> (array, the format to answer in)."""
    if content_type.startswith((NPY, "application/octet-stream")) or body[:6] == b"\x93NUMPY":
        try:
            return np.load(io.BytesIO(body), allow_pickle=False), "npy"
        except (ValueError, OSError, EOFError) as e:
            raise BadRequest(f"body is not a .npy array: {e}") from None
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"body is neither .npy (Content-Type {NPY}) nor JSON: {e}") from None
    if isinstance(data, dict):
        if "input" not in data:
            raise BadRequest('JSON body needs an "input" field (a nested list of numbers)')
        data = data["input"]
    try:
        return np.asarray(data, dtype=np.float32), "json"
    except (ValueError, TypeError) as e:
        raise BadRequest(f'"input" is not a rectangular array of numbers: {e}') from None


def encode(y: np.ndarray, fmt: str, extra: dict) -> tuple[bytes, str]:
    if fmt == "npy":
        buf = io.BytesIO()
        np.save(buf, y, allow_pickle=False)
        return buf.getvalue(), NPY
    return json.dumps({**extra, "output": y.tolist()}).encode(), "application/json"


class Current:
    """The runtime the server answers with; ``swap`` replaces it (a newly pulled revision) and retires the
    old one once its requests in flight have finished."""

    def __init__(self, rt: Runtime):
        self.rt = rt

    def swap(self, new: Runtime, drain_s: float = 60.0) -> None:
        old, self.rt = self.rt, new
        deadline = time.monotonic() + drain_s
        while old.inflight and time.monotonic() < deadline:
            time.sleep(0.05)
        old.stop()
        del old
        refreeze()


def make_handler(current: Current):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "edgeplan-runtime"

        def log_message(self, *args):  # quiet: /metrics says what happened
            pass

        def _send(self, code: int, body: bytes, ctype: str = "application/json", headers: dict | None = None):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def _error(self, code: int, msg: str, headers: dict | None = None):
            self._send(code, json.dumps({"error": msg}).encode(), headers=headers)

        def do_GET(self):
            rt = current.rt
            if self.path == "/healthz":
                self._send(200, json.dumps({"status": "ok", **rt.status()}).encode())
            elif self.path == "/metrics":
                self._send(200, rt.metrics_text().encode(), "text/plain; version=0.0.4")
            else:
                self._error(404, f"no route {self.path}; try POST /infer/<model>, GET /healthz, GET /metrics")

        def do_POST(self):
            rt = current.rt
            parts = self.path.strip("/").split("/")
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._error(413, f"body of {length} bytes; the limit is {MAX_BODY}")
                self.close_connection = True
                return
            body = self.rfile.read(length)
            if len(parts) != 2 or parts[0] != "infer":
                self._error(404, f"no route {self.path}; POST /infer/<model>")
                return
            if parts[1] not in rt.models:
                self._error(404, f"no model {parts[1]!r}; serving {', '.join(rt.order)}")
                return
            t0 = time.perf_counter()
            try:
                x, fmt = decode(body, self.headers.get("Content-Type", ""))
                y = rt.submit(parts[1], x).result(timeout=120)
            except BadRequest as e:
                self._error(400, str(e))
                return
            except Overloaded as e:
                self._error(503, str(e), {"Retry-After": "1"})
                return
            except Exception as e:  # noqa: BLE001
                self._error(500, f"{type(e).__name__}: {e}")
                return
            out, ctype = encode(y, fmt, {"model": parts[1], "revision": rt.manifest.revision,
                                         "latency_ms": round(1e3 * (time.perf_counter() - t0), 3)})
            self._send(200, out, ctype)

    return Handler


def serve(rt: Runtime | Current, host: str = "127.0.0.1", port: int = 8080) -> ThreadingHTTPServer:
    """An HTTP server for ``rt`` (not yet serving: call ``serve_forever``); ``server.current`` holds it."""
    current = rt if isinstance(rt, Current) else Current(rt)
    server = ThreadingHTTPServer((host, port), make_handler(current))
    server.daemon_threads = True
    server.current = current
    return server
