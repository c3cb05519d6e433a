"""A local Prefect server that ``edgeplan run`` starts once and reuses, stopping itself when idle.

Prefect's ephemeral server starts with every command (5-7 s here, migrations on a fresh home first), so a
rerun served wholly from the cache spent most of its time waiting for it. The local server is what Prefect
users run by hand (``prefect server start``), minus the chores: on loopback, API only (``--no-services
--no-ui``: no scheduler or event triggers, like the ephemeral one), its database in its own home
(``.edgeplan/prefect/``), and a supervisor that stops it after ``idle_s`` without a run.

Files in HOME: ``server.json`` ({url, pid, port, started}: written by the supervisor once the API answers,
removed when it stops), ``server.log``, ``start.lock`` (one starter at a time), ``lease`` (every run holds
a shared lock on it; the supervisor stops only when it gets the lock exclusively and the lease's time is
older than ``idle_s``). Kill the supervisor and the server follows it (PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from edgeplan.errors import EdgeplanError

POLL_S = 2.0


def _healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def alive(pid: int) -> bool:
    """Running: a zombie (exited, not yet reaped by a parent or subreaper that never waits) is not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def _record(home: Path) -> dict | None:
    """``server.json`` as written by a supervisor ({url, pid, port, started, idle_s}), None if absent or bad."""
    try:
        rec = json.loads((Path(home) / "server.json").read_text())
        rec["url"], rec["pid"] = str(rec["url"]), int(rec["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return rec


def _supervisor_pid(home: Path) -> int | None:
    try:
        return int((Path(home) / "supervisor.pid").read_text())
    except (OSError, ValueError):
        return None


def info(home: Path) -> dict | None:
    """The running server's record ({url, pid, port, started}), None when none answers."""
    rec = _record(home)
    return rec if rec is not None and alive(rec["pid"]) and _healthy(rec["url"]) else None


@contextlib.contextmanager
def _flock(path: Path, mode: int):
    with open(path, "a") as f:
        fcntl.flock(f, mode)
        try:
            yield f
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def lease(home: Path):
    """Held for a run: the supervisor does not stop the server under it; its end restarts the idle clock."""
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    with _flock(home / "lease", fcntl.LOCK_SH):
        try:
            yield
        finally:
            os.utime(home / "lease")


def ensure(home: Path, idle_s: float, timeout_s: float = 180.0, progress=None) -> str:
    """The API URL of the local server in ``home``, started (detached) when none answers. Hold ``lease``
    around this call and the run, so the server cannot stop in between."""
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    with _flock(home / "start.lock", fcntl.LOCK_EX):
        rec = _record(home)
        if rec is not None and alive(rec["pid"]):  # its supervisor restarts a server that died: wait for it
            deadline = time.monotonic() + min(timeout_s, 60.0)  # a restart takes ~10 s
            while time.monotonic() < deadline and alive(rec["pid"]):
                if _healthy(rec["url"]):
                    return rec["url"]
                time.sleep(0.25)
        (home / "server.json").unlink(missing_ok=True)
        if progress:
            progress(f"starting a local Prefect server in {home} (reused by later runs; stops after "
                     f"{idle_s / 60:g} min idle; `edgeplan server stop` stops it now)")
        with open(home / "server.log", "w") as log:
            proc = subprocess.Popen([sys.executable, "-m", "edgeplan.pipeline.local_server", str(home), str(idle_s)],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=home,
                                    start_new_session=True)  # cwd: no ./edgeplan of the caller's shadows ours
        proc.wait()  # the launcher exits at once; the supervisor it forked is nobody's child (no zombie here)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            rec = info(home)
            if rec is not None:
                return rec["url"]
            pid = _supervisor_pid(home)
            if proc.returncode != 0 or (pid is not None and not alive(pid)):
                break
            time.sleep(0.25)
        pid = _supervisor_pid(home)
        running = pid is not None and alive(pid)
        why = f"did not answer within {timeout_s:.0f} s" if running else "exited"
        if running:
            os.kill(pid, signal.SIGTERM)
        tail = (home / "server.log").read_text(errors="replace")[-2000:]
        raise EdgeplanError(f"the local Prefect server in {home} {why} (log {home / 'server.log'}):\n{tail}\nSet orchestration.prefect_server: ephemeral "
                            "(or EDGEPLAN_PREFECT_SERVER=ephemeral) to use Prefect's ephemeral server instead")


def stop(home: Path, timeout_s: float = 60.0) -> bool:
    """Stop the local server in ``home`` once running ``edgeplan run``s have finished (waits up to
    ``timeout_s`` for it); False when none was running."""
    home = Path(home)
    rec = _record(home)
    if rec is None:
        return False
    pid = rec["pid"]
    if not alive(pid):
        (home / "server.json").unlink(missing_ok=True)
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def supervise(home: Path, idle_s: float) -> int:
    """The supervisor: start the server, publish ``server.json`` once its API answers, restart it (same port
    and database) when it dies after answering, and stop it after ``idle_s`` without a run, or on SIGTERM
    once running runs have finished (their leases released)."""
    home = Path(home)
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_API_URL": url}
    prefect = Path(sys.executable).with_name("prefect")

    def start() -> subprocess.Popen:
        return subprocess.Popen([str(prefect), "server", "start", "--host", "127.0.0.1", "--port", str(port),
                                 "--no-services", "--no-ui"], env=env, stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent)

    server = start()
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    started = time.time()
    published = answered = False  # answered: the current server process has answered since it started
    lease_path = home / "lease"
    lease_path.touch()
    try:
        while True:
            if server.poll() is not None:
                if stopping or not answered:  # one that never answered would only fail again
                    break
                print(f"the server exited ({server.returncode}); restarting it on {url}", flush=True)
                server, answered = start(), False  # same port and database: runs' clients retry meanwhile
                continue
            if not answered and _healthy(url):
                answered = True
            if answered and not published:
                tmp = home / f".server.json.{os.getpid()}"
                tmp.write_text(json.dumps({"url": url, "pid": os.getpid(), "port": port, "started": started,
                                           "idle_s": idle_s}))
                tmp.replace(home / "server.json")
                published = True
                print(f"serving {url}; stops after {idle_s:.0f} s without a run", flush=True)
            idle = time.time() - max(lease_path.stat().st_mtime, started) > idle_s
            if stopping or (published and idle):
                with open(lease_path, "a") as f:
                    try:  # SIGTERM waits for running runs; idleness does not wait, it checks again later
                        fcntl.flock(f, fcntl.LOCK_EX | (0 if stopping else fcntl.LOCK_NB))
                    except BlockingIOError:
                        pass
                    else:  # under the lock: no run can see the record or use the server meanwhile
                        print("stopping: " + ("asked to" if stopping else "idle"), flush=True)
                        _unpublish(home)
                        _terminate(server)
                        return 0
            time.sleep(POLL_S)
        print(f"the server exited ({server.returncode})" + ("" if answered else " before it answered"), flush=True)
        return 1
    finally:
        _unpublish(home)
        _terminate(server)
        (home / "supervisor.pid").unlink(missing_ok=True)


def _unpublish(home: Path) -> None:
    rec = _record(home)
    if rec is not None and rec["pid"] == os.getpid():
        (home / "server.json").unlink(missing_ok=True)


def _terminate(server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


if __name__ == "__main__":
    if os.fork() > 0:  # the launcher's child returns at once; the supervisor goes on, reparented to init
        os._exit(0)
    (Path(sys.argv[1]) / "supervisor.pid").write_text(str(os.getpid()))
    sys.exit(supervise(Path(sys.argv[1]), float(sys.argv[2])))
