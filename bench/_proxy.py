"""A loopback TCP proxy that injects store faults (campaign 6 of bench/reliability.py): it listens on 127.0.0.1
(a free port, printed as ``port N`` on its first line) and forwards every connection to ``UPSTREAM`` (the S3
server), until told otherwise on its standard input, one command a line, each answered ``ok`` once it holds:

- ``slow S``: every chunk (up to 64 KiB) forwarded in either direction waits S seconds first;
- ``resets P``: each new or open connection, with probability P, is reset (RST) after a random 0..256 KiB more;
- ``down``: the listener closes and every open connection is reset (clients see a server that went away:
  connections refused) until ``up``, which listens on the same port again;
- ``normal``: no delay, no resets (``up`` too, when down).

It runs in its own process so that the harness stays single-threaded (it forks its commands). Standard library
only. ``python bench/_proxy.py UPSTREAM_PORT [SEED]``."""
from __future__ import annotations

import random
import socket
import struct
import sys
import threading
import time

CHUNK = 64 << 10
MAX_RESET_AFTER = 256 << 10


class Proxy:
    def __init__(self, upstream: tuple[str, int], seed: int):
        self.upstream, self.rng = upstream, random.Random(seed)
        self.slow_s, self.reset_p = 0.0, 0.0
        self.lock = threading.Lock()
        # per open connection: (client socket, upstream socket, [bytes it may still forward before a reset, or None])
        self.open: list[tuple[socket.socket, socket.socket, list]] = []
        self.listener: socket.socket | None = None
        self.port = 0

    # ------------------------------------------------------------------------------------------ the listener
    def up(self) -> None:
        if self.listener is not None:
            return
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(128)
        self.port, self.listener = s.getsockname()[1], s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def down(self) -> None:
        if self.listener is not None:
            try:
                self.listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept() on it
            except OSError:
                pass
            self.listener.close()
            self.listener = None
        with self.lock:
            pairs, self.open = self.open, []
        for client, server, _ in pairs:
            _reset(client)
            _reset(server)

    def resets(self, p: float) -> None:
        """From now on, each new connection and each open one is reset with probability ``p`` after a random
        0..256 KiB more."""
        with self.lock:
            self.reset_p = p
            for _, _, budget in self.open:
                if self.rng.random() < p:
                    budget[0] = self.rng.randint(0, MAX_RESET_AFTER)

    def calm(self) -> None:
        """No delay, no resets, for open connections too."""
        with self.lock:
            self.slow_s, self.reset_p = 0.0, 0.0
            for _, _, budget in self.open:
                budget[0] = None

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed by down()
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                _reset(client)
                continue
            with self.lock:
                budget = [self.rng.randint(0, MAX_RESET_AFTER) if self.rng.random() < self.reset_p else None]
                self.open.append((client, server, budget))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b, budget), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, budget: list) -> None:
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                if self.slow_s:
                    time.sleep(self.slow_s)
                with self.lock:
                    left = budget[0]
                    if left is not None:
                        budget[0] = left - len(data)
                if left is not None and left < len(data):
                    dst.sendall(data[:left])
                    raise ConnectionResetError("injected reset")
                dst.sendall(data)
        except OSError:
            for s in (src, dst):
                _reset(s)
            with self.lock:
                self.open = [pair for pair in self.open if pair[2] is not budget]


def _reset(s: socket.socket) -> None:
    """Close with an RST (linger 0), not a FIN: the peer sees a reset connection. ``shutdown(SHUT_RD)`` first
    wakes a thread blocked in ``recv`` on it (a bare close would wait for that recv, and send nothing)."""
    for call in (lambda: s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)),
                 lambda: s.shutdown(socket.SHUT_RD), s.close):
        try:
            call()
        except OSError:
            pass


def main(argv: list[str]) -> int:
    proxy = Proxy(("127.0.0.1", int(argv[0])), int(argv[1]) if len(argv) > 1 else 0)
    proxy.up()
    print(f"port {proxy.port}", flush=True)
    for line in sys.stdin:
        cmd, *arg = line.split()
        if cmd == "slow":
            proxy.slow_s = float(arg[0])
        elif cmd == "resets":
            proxy.resets(float(arg[0]))
        elif cmd == "down":
            proxy.down()
        elif cmd in ("up", "normal"):
            proxy.up()
            if cmd == "normal":
                proxy.calm()
        else:
            print(f"unknown command {cmd!r}", flush=True)
            continue
        print("ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
