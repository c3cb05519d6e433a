"""Campaign 5 of bench/reliability.py, its bad-request half (the 10-minute overload half is not built): a real
``edgeplan-runtime serve`` process (the device directory of campaign 2 with revision 1 active, loopback only)
sent seeded malformed requests over raw sockets — bodies of the wrong dtype (complex, bool, text, objects,
dates, records), shape (random ranks and dimensions, zero-size), with NaN and infinities, truncated ``.npy``,
``.npy`` headers claiming far more (or less) data than sent, malformed JSON (deep nesting, text, ragged lists,
1e999, 10**400, not UTF-8), Content-Length that is not a number or is over 100 MB, chunked bodies, other
methods, unknown paths, 70 KB paths and header lines, 200 headers, bytes that are not HTTP, and slow senders
(bodies that never finish, four at once) — with a good request after every ten, during the slow senders too.

Promise: every bad request gets a 4xx answer (none a 5xx, none left unanswered), every good one a 200, the
server never dies, and its resident set grows by less than 50 MB over the run (VmRSS from /proc, after a
warm-up).
"""
from __future__ import annotations

import io
import json
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from _faults import record

from edgeplan.pipeline import local_server

READ_TIMEOUT_S = 30.0


def exchange(port: int, head: bytes, body: bytes = b"", trickle_s: float | None = None) -> int | None:
    """Send ``head`` (request line and headers) and ``body`` on a new connection; the answer's status code (None:
    the connection closed without one). The body is sent only if no answer came within 0.2 s of the head (a
    server refusing a 100 MB body answers before it is sent); with ``trickle_s``, one byte every that many s."""
    with socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT_S) as s:
        try:
            s.sendall(head)
            s.settimeout(0.2)
            try:
                first = s.recv(65536)
            except TimeoutError:
                first = b""
            s.settimeout(READ_TIMEOUT_S)
            if not first and body:
                if trickle_s is None:
                    s.sendall(body)
                else:
                    for i in range(len(body)):
                        s.sendall(body[i:i + 1])
                        time.sleep(trickle_s)
                        if _readable(s):
                            break
        except (BrokenPipeError, ConnectionResetError):
            first = b""
        data = first
        try:
            while b"\r\n" not in data:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    line = data.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) >= 2 and line[0].startswith(b"HTTP/") and line[1].isdigit() else None


def _readable(s: socket.socket) -> bool:
    import select

    return bool(select.select([s], [], [], 0)[0])


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=True)
    return buf.getvalue()


def _post(path: str, body: bytes, ctype: str = "application/x-npy", extra: str = "",
          length: str | None = None) -> bytes:
    n = str(len(body)) if length is None else length
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {ctype}\r\nContent-Length: {n}\r\n{extra}"
            "Connection: close\r\n\r\n").encode()


class Cases:
    """Seeded bad requests for a model taking float input of ``shape``."""

    def __init__(self, model: str, shape: tuple[int, ...], rng: random.Random):
        self.model, self.shape, self.rng = model, tuple(shape), rng
        self.path = f"/infer/{model}"

    def good(self) -> tuple[bytes, bytes]:
        body = _npy(np.random.default_rng(self.rng.randrange(2**32)).random(self.shape, np.float32))
        return _post(self.path, body), body

    def make(self) -> tuple[str, bytes, bytes]:
        """(category, head, body)."""
        kind = self.rng.choice(["dtype", "shape", "nonfinite", "truncated", "header", "json", "json", "length",
                                "large", "chunked", "method", "path", "headers", "garbage"])
        return (kind, *getattr(self, f"_{kind}")())

    def _npy_case(self, body: bytes) -> tuple[bytes, bytes]:
        return _post(self.path, body), body

    def _dtype(self):
        rng, shape = self.rng, self.shape
        a = rng.choice([np.zeros(shape, np.complex64), np.ones(shape, np.complex128), np.zeros(shape, bool),
                        np.full(shape, "x", "U3"), np.array([{"a": 1}], object),
                        np.zeros(shape, "datetime64[s]"), np.zeros(3, [("a", "i4"), ("b", "f4")])])
        return self._npy_case(_npy(a))

    def _shape(self):
        rng = self.rng
        while True:
            shape = tuple(rng.choice([0, 1, 2, 3, 7, 32, 40]) for _ in range(rng.randrange(0, 6)))
            if shape not in (self.shape, self.shape[1:]):
                return self._npy_case(_npy(np.zeros(shape, np.float32)))

    def _nonfinite(self):
        a = np.zeros(self.shape, np.float32)
        flat = a.reshape(-1)
        for _ in range(self.rng.randrange(1, 5)):
            flat[self.rng.randrange(flat.size)] = self.rng.choice([np.nan, np.inf, -np.inf])
        return self._npy_case(_npy(a))

    def _truncated(self):
        good = _npy(np.zeros(self.shape, np.float32))
        return self._npy_case(good[:self.rng.randrange(1, len(good))])

    def _header(self):
        claim = self.rng.choice([(1, 3, 100000, 100000), (10**9,), (2**40, 2**20), (1, 1), self.shape[:-1]])
        header = {"descr": "<f4", "fortran_order": False, "shape": claim}
        text = repr(header).encode()
        pad = 64 - (10 + len(text) + 1) % 64
        return self._npy_case(b"\x93NUMPY\x01\x00" + (len(text) + pad + 1).to_bytes(2, "little") + text
                              + b" " * pad + b"\n" + b"\0" * 64)

    def _json(self):
        rng = self.rng
        body = rng.choice([b"{", b"[1, 2", b'{"input": "x"}', b'{"input": null}', b"{}", b"[]", b"[" * 100000,
                           b'{"input": ' + b"[" * 5000 + b"]" * 5000 + b"}", b'{"input": [[1, 2], [3]]}',
                           b'{"input": [1e999]}', b'{"input": [' + b"1" * 400 + b"]}", b"\xff\xfe\x00",
                           b'{"input": [["a", "b"]]}', b'{"inputs": [1]}', json.dumps({"input": [0.0] * 7}).encode()])
        return _post(self.path, body, "application/json"), body

    def _length(self):
        body = b"\x93NUMPY"
        return _post(self.path, body, length=self.rng.choice(["abc", "-5", "1e3", "0x10", " 12", "+6", "6.0"])), body

    def _large(self):
        return _post(self.path, b"", length=str(self.rng.choice([100 << 20, 10**12, (64 << 20) + 1]))), b""

    def _chunked(self):
        body = b"5\r\nhello\r\n0\r\n\r\n"
        head = (f"POST {self.path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                .encode())
        return head, body

    def _method(self):
        m = self.rng.choice(["PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"])
        p = self.rng.choice([self.path, "/healthz", "/metrics"])
        return f"{m} {p} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode(), b""

    def _path(self):
        body = _npy(np.zeros(self.shape, np.float32))
        p = self.rng.choice(["/infer", "/infer/", "/infer/nope", f"{self.path}/extra", "/%2e%2e/etc/passwd",
                             "/", "/" + "a" * 10000, "/infer/" + "\u00e9".encode().decode("latin-1")])
        if self.rng.random() < 0.2:
            return f"GET {'/' + 'b' * 70000} HTTP/1.1\r\nHost: x\r\n\r\n".encode(), b""
        return _post(p, body), body

    def _headers(self):
        if self.rng.random() < 0.5:
            extra = "".join(f"X-H{i}: {i}\r\n" for i in range(200))
        else:
            extra = f"X-Big: {'v' * 70000}\r\n"
        body = _npy(np.zeros(self.shape, np.float32))
        return _post(self.path, body, extra=extra), body

    def _garbage(self):
        return self.rng.choice([b"HELLO\r\n\r\n", bytes(self.rng.randrange(256) for _ in range(64)) + b"\r\n\r\n",
                                b"POST /infer/x HTTP/9.9\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\r\n\r\n"]), b""


def rss_mb(pid: int) -> float:
    """The process's VmRSS (MB), read from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def start_serve(dest: Path, env: dict, log: Path, *options: str) -> tuple[subprocess.Popen, int]:
    """A real ``edgeplan-runtime serve`` process of ``dest`` with ``options`` on a free loopback port; (process,
    port)."""
    err = open(log, "wb")  # noqa: SIM115 (the process's stderr for its lifetime)
    proc = subprocess.Popen([sys.executable, "-m", "edgeplan.runtime.cli", "serve", str(dest), "--port", "0",
                             *options], env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    line = proc.stdout.readline()
    if " on http://" not in line:
        proc.kill()
        raise RuntimeError(f"serve did not start: {line!r} {log.read_text()[-500:]}")
    return proc, int(line.split(" on http://", 1)[1].split()[0].rsplit(":", 1)[1])


def run_bad_requests(dest: Path, env: dict, model: str, shape, n: int, seed: int, work: Path,
                     slow: int = 4, request_timeout_s: float = 3.0) -> dict:
    """``n`` bad requests (and a good one after every ten) to a real serve of ``dest``, then ``slow`` slow
    senders at once with good requests beside them."""
    rng = random.Random(seed)
    cases = Cases(model, shape, rng)
    proc, port = start_serve(dest, env, work / "serve-bad.stderr", "--mode", "cpu", "--no-adapt", "--inputs", "1",
                             "--request-timeout", str(request_timeout_s))
    rows, violations, good_failed = [], [], []
    try:
        for _ in range(20):  # warm-up: interpreters built, buffers grown
            exchange(port, *cases.good())
        rss0 = rss_mb(proc.pid)
        for i in range(n):
            kind, head, body = cases.make()
            code = exchange(port, head, body)
            broke = [] if code is not None and 400 <= code < 500 else [f"answered {code}"]
            if proc.poll() is not None:
                broke.append(f"the server died (exit {proc.returncode})")
            record(rows, violations, {"trial": i, "seed": seed, "kind": kind, "head": head[:120].decode("latin-1"),
                                      "status": code, "violations": broke}, "bad requests", n)
            if proc.poll() is not None:
                break
            if i % 10 == 9 and (c := exchange(port, *cases.good())) != 200:
                good_failed.append({"after": i, "status": c})
        print(file=sys.stderr)
        # slow senders: bodies that never finish, several at once, while good requests go on
        results: list = [None] * slow
        senders = []
        for k in range(slow):
            head, body = cases.good()
            t = threading.Thread(target=lambda k=k, head=head, body=body: results.__setitem__(
                k, exchange(port, head, body, trickle_s=0.5)), daemon=True)
            t.start()
            senders.append(t)
        t0 = time.monotonic()
        while any(t.is_alive() for t in senders) and time.monotonic() - t0 < 4 * request_timeout_s + 30:
            if (c := exchange(port, *cases.good())) != 200:
                good_failed.append({"during": "slow senders", "status": c})
            time.sleep(0.2)
        for k, code in enumerate(results):
            broke = [] if code == 408 else [f"a slow sender got {code}, not 408"]
            record(rows, violations, {"trial": n + k, "seed": seed, "kind": "slow", "status": code,
                                      "violations": broke}, "bad requests", n + slow)
        print(file=sys.stderr)
        rss1 = rss_mb(proc.pid)
        alive = proc.poll() is None and exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close"
                                                       b"\r\n\r\n") == 200
    finally:
        local_server._terminate(proc)  # SIGTERM, SIGKILL after 20 s
    by: dict = {}
    for r in rows:
        by.setdefault(r["kind"], {"sent": 0, "statuses": {}})
        by[r["kind"]]["sent"] += 1
        by[r["kind"]]["statuses"][str(r["status"])] = by[r["kind"]]["statuses"].get(str(r["status"]), 0) + 1
    return {"sent": len(rows), "violations": len(violations),
            "five_xx": sum(r["status"] is not None and r["status"] >= 500 for r in rows),
            "unanswered": sum(r["status"] is None for r in rows), "crashed": not alive,
            "good_failed": len(good_failed), "good_failures": good_failed, "rss_mb": [rss0, rss1],
            "rss_growth_mb": rss1 - rss0, "by_kind": by, "violated": violations, "rows": rows}
