"""The runtime's local HTTP API (standard library http.server):

- ``POST /infer/{model}``: the float input as ``.npy`` bytes (Content-Type application/x-npy) or JSON
  (``{"input": [...]}`` or a bare nested list); the answer in the same format (JSON adds the model, revision
  and latency; a 200's Server-Timing header has it too: ``infer;dur=<ms>``, decoding, queueing and
  inference). 400 with a message for a malformed request, 404 for an unknown model, 503 with Retry-After
  (whole seconds until the queue ahead should have drained) when the bounded queue is full or the latency
  expected behind it is over the model's budget (latency-aware admission, ``engine.Runtime``), 413 for a body
  over the limit.
- ``GET /healthz``: the active revision and current configuration (JSON).
- ``GET /metrics``: Prometheus text format.

A malformed request gets a 4xx and one JSON line saying why, never a 5xx: 400 for a body that is not a
finite real array of the model's shape (NaN, infinities, complex or text refused; a ``.npy`` header claiming
more data than was sent refused before anything is allocated), or a Content-Length that is not a number; 405
for another method on a known route; 408 when the body does not arrive within ``REQUEST_TIMEOUT_S`` (a slow
sender holds one thread that long, no longer); 411 for a body without a Content-Length (chunked); 413 over
``MAX_BODY``.
"""
from __future__ import annotations

import io
import json
import math
import select
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from edgeplan.runtime.engine import Overloaded, Runtime, refreeze
from edgeplan.runtime.model import BadRequest

NPY = "application/x-npy"
MAX_BODY = 64 << 20
REQUEST_TIMEOUT_S = 10.0  # a request's body must arrive within this (and an idle keep-alive connection closes)
MAX_JSON_DEPTH = 64


def decode(body: bytes, content_type: str) -> tuple[np.ndarray, str]:
    """A request body -> (array, the format to answer in)."""
    if content_type.startswith((NPY, "application/octet-stream")) or body[:6] == b"\x93NUMPY":
        return _npy(body), "npy"
    if _depth(body) > MAX_JSON_DEPTH:
        raise BadRequest(f"JSON nested deeper than {MAX_JSON_DEPTH}")
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
    except (ValueError, TypeError, OverflowError) as e:
        raise BadRequest(f'"input" is not a rectangular array of numbers: {e}') from None


def _npy(body: bytes) -> np.ndarray:
    """A ``.npy`` body whose header is checked first: a real numeric dtype (no objects, text or complex), and
    no more data claimed than the body holds (a header is not an allocation the sender chooses)."""
    from numpy.lib import format as npy

    f = io.BytesIO(body)
    try:
        version = npy.read_magic(f)
        shape, _, dtype = (npy.read_array_header_1_0(f) if version == (1, 0) else npy.read_array_header_2_0(f))
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as e:
        raise BadRequest(f"body is not a .npy array: {e}") from None
    if dtype.kind not in "iuf" or dtype.hasobject:
        raise BadRequest(f".npy dtype {dtype}; send real numbers (float32)")
    count = math.prod(shape)
    if count * dtype.itemsize != len(body) - f.tell():
        raise BadRequest(f".npy header says shape {shape} of {dtype} ({count * dtype.itemsize} bytes); the body "
                         f"holds {len(body) - f.tell()} after it")
    try:
        return np.load(io.BytesIO(body), allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise BadRequest(f"body is not a .npy array: {e}") from None


def _depth(body: bytes) -> int:
    """How deep the JSON in ``body`` nests (brackets counted outside strings, roughly: enough to refuse a body
    that would take the decoder's recursion limit)."""
    depth = most = 0
    for c in body.replace(b'\\"', b"").split(b'"')[::2]:  # outside string literals
        for b in c:
            if b in (0x5B, 0x7B):
                depth += 1
                most = max(most, depth)
            elif b in (0x5D, 0x7D):
                depth -= 1
    return most


def encode(y: np.ndarray, fmt: str, extra: dict) -> tuple[bytes, str]:
    if fmt == "npy":
        buf = io.BytesIO()
        np.save(buf, y, allow_pickle=False)
        return buf.getvalue(), NPY
    return json.dumps({**extra, "output": y.tolist()}).encode(), "application/json"


def drain(rt: Runtime, timeout_s: float, server: _Server | None = None) -> int:
    """Wait up to ``timeout_s`` for the requests ``rt`` has in flight to finish (and, with ``server``, for its
    connections to close: answered, or idle past the request timeout); returns how many are left."""
    deadline = time.monotonic() + timeout_s

    def left() -> int:
        return max(rt.inflight, server.busy if server is not None else 0)

    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    return left()


class Current:
    """The runtime the server answers with; ``swap`` replaces it (a newly pulled revision) and retires the
    old one once its requests in flight have finished."""

    def __init__(self, rt: Runtime):
        self.rt = rt

    def swap(self, new: Runtime, drain_s: float = 60.0) -> None:
        old, self.rt = self.rt, new
        drain(old, drain_s)
        old.stop()
        del old
        refreeze()


def make_handler(current: Current, request_timeout_s: float = REQUEST_TIMEOUT_S):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "edgeplan-runtime"
        timeout = request_timeout_s  # each read on the connection (an idle keep-alive one closes after it)
        default_request_version = "HTTP/1.0"  # a line that is not HTTP still gets a status line, not a bare body

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

        def send_error(self, code, message=None, explain=None):
            """http.server's own refusals; an HTTP version it does not speak is the sender's mistake (400)."""
            if code == 505:
                code, message = 400, f"{self.requestline[:80]!r}: speak HTTP/1.1 or HTTP/1.0"
            super().send_error(code, message, explain)

        def _refuse(self, code: int, msg: str) -> None:
            """Answer, and close the connection: what is left of the request on it cannot be trusted."""
            self.close_connection = True
            self._error(code, msg, {"Connection": "close"})

        def _not_allowed(self):
            routes = {"/healthz": "GET", "/metrics": "GET"}
            allow = routes.get(self.path, "POST" if self.path.startswith("/infer/") else None)
            if allow is None:
                self._refuse(404, f"no route {self.path}; POST /infer/<model>, GET /healthz, GET /metrics")
            else:
                self.close_connection = True
                self._error(405, f"{self.command} {self.path}: use {allow}", {"Allow": allow, "Connection": "close"})

        do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = _not_allowed

        def _body(self) -> bytes | None:
            """The request body within the limits, or None after answering 4xx."""
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                self._refuse(411, "send the body with a Content-Length (chunked transfer is not accepted)")
                return None
            text = self.headers.get("Content-Length") or "0"
            if not text.isdigit():
                self._refuse(400, f"Content-Length {text[:40]!r} is not a number of bytes")
                return None
            length = int(text)
            if length > MAX_BODY:
                self._refuse(413, f"body of {length} bytes; the limit is {MAX_BODY}")
                return None
            chunks, got, deadline = [], 0, time.monotonic() + request_timeout_s
            try:
                while got < length:
                    if time.monotonic() > deadline:
                        raise TimeoutError
                    chunk = self.rfile.read1(min(length - got, 1 << 20))
                    if not chunk:
                        self.close_connection = True  # the sender went away: nobody to answer
                        return None
                    chunks.append(chunk)
                    got += len(chunk)
            except TimeoutError:
                self._refuse(408, f"{got} of {length} body bytes in {request_timeout_s:g} s; send it faster")
                return None
            return b"".join(chunks)

        def do_POST(self):
            rt = current.rt
            parts = self.path.strip("/").split("/")
            body = self._body()
            if body is None:
                return
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
                self._error(503, str(e), {"Retry-After": str(max(1, math.ceil(e.retry_after_s)))})
                return
            except Exception as e:  # noqa: BLE001
                self._error(500, f"{type(e).__name__}: {e}")
                return
            took_ms = round(1e3 * (time.perf_counter() - t0), 3)
            out, ctype = encode(y, fmt, {"model": parts[1], "revision": rt.manifest.revision, "latency_ms": took_ms})
            self._send(200, out, ctype, {"Server-Timing": f"infer;dur={took_ms}"})

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # connections the kernel holds until accepted: socketserver's 5 overflowed at ~190 new connections a second
    # (reliability campaign 5, overload: 3 of 11,693 clients reset) while handler threads held the GIL
    request_queue_size = 1024

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lock = threading.Lock()
        self.busy = 0  # connections accepted and not yet closed: a stop waits for them (``drain``)

    def process_request_thread(self, request, client_address):
        with self.lock:
            self.busy += 1
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.lock:
                self.busy -= 1

    def stop_accepting(self) -> None:
        """Accept the connections already waiting in the kernel's queue (their clients have connected: closing
        would reset them), then close the listening socket; what connects after is refused."""
        while select.select([self.socket], [], [], 0)[0]:
            self._handle_request_noblock()
        self.server_close()


def serve(rt: Runtime | Current, host: str = "127.0.0.1", port: int = 8080,
          request_timeout_s: float = REQUEST_TIMEOUT_S) -> ThreadingHTTPServer:
    """An HTTP server for ``rt`` (not yet serving: call ``serve_forever``); ``server.current`` holds it."""
    current = rt if isinstance(rt, Current) else Current(rt)
    server = _Server((host, port), make_handler(current, request_timeout_s))
    server.current = current
    return server
