"""A real `prefect server start` on loopback with its own home (tests, benchmarks, a local demo)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from edgeplan.errors import EdgeplanError


@contextmanager
def prefect_server(home: Path, timeout_s: float = 120.0):
    """Start the server with PREFECT_HOME=``home`` on a free port; yield (api_url, env for its clients);
    stop it (its whole process group) on exit. The server's log is ``home/server.log``."""
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_API_URL": f"http://127.0.0.1:{port}/api"}
    exe = Path(sys.executable).with_name("prefect")
    with open(home / "server.log", "w") as log:
        proc = subprocess.Popen([str(exe), "server", "start", "--host", "127.0.0.1", "--port", str(port)], env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise EdgeplanError(f"prefect server did not start: {(home / 'server.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield env["PREFECT_API_URL"], env
    finally:
        try:
            os.killpg(proc.pid, 15)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
