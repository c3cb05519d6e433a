"""A real S3-protocol server (moto's server mode, the ``dev`` extra) on an address of this machine, for tests and
benchmarks, as ``pipeline/prefect_server`` is for Prefect. The device runtime never imports it."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from edgeplan.errors import EdgeplanError

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass(frozen=True)
class MotoServer:
    url: str
    proc: subprocess.Popen  # to stop it under a test (SIGSTOP) and see the store go down


@contextmanager
def moto_server(address: str = "127.0.0.1", bucket: str = "edgeplan", log: Path | None = None,
                timeout_s: float = 60.0):
    """Start moto's server on ``address`` (a free port), create ``bucket``, yield a ``MotoServer``; stop it on
    exit. For its lifetime the credentials it takes are in this process's environment (boto3's standard chain,
    and every child started with ``os.environ``); they are restored after. Its log goes to ``log``."""
    import boto3

    with socket.socket() as s:
        s.bind((address, 0))
        port = s.getsockname()[1]
    old = {k: os.environ.get(k) for k in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    if log is not None:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log or os.devnull, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", address, "-p", str(port)], stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://{address}:{port}"
    try:
        deadline = time.time() + timeout_s
        while True:
            try:
                socket.create_connection((address, port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    tail = Path(log).read_text()[-2000:] if log is not None else ""
                    raise EdgeplanError(f"moto server did not start on {address}: {tail}") from None
                time.sleep(0.2)
        boto3.client("s3", endpoint_url=url).create_bucket(Bucket=bucket)
        yield MotoServer(url, proc)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
