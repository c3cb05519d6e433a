"""The local Prefect server `edgeplan run` reuses (a real `prefect server start`): started once, found again,
kept while a run holds its lease, stopped when idle, leaving no process behind."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from edgeplan.pipeline import local_server


def _processes_of(home: Path) -> list[str]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                env = (d / "environ").read_bytes()
            except OSError:
                continue
            if str(home) in cmd or f"PREFECT_HOME={home}".encode() in env:
                found.append(f"{d.name} {cmd}")
    return found


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie init has not reaped yet (nothing of ours runs)."""
    try:
        return "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


def test_started_once_reused_kept_under_a_lease_then_stopped_when_idle(tmp_path):
    home = tmp_path / "prefect"
    idle_s = 4.0
    notes = []
    with local_server.lease(home):
        url = local_server.ensure(home, idle_s, progress=notes.append)
        assert len(notes) == 1 and local_server._healthy(url)
        rec = json.loads((home / "server.json").read_text())
        assert local_server.ensure(home, idle_s, progress=notes.append) == url and len(notes) == 1  # reused
        time.sleep(idle_s + 2 * local_server.POLL_S + 1)  # past the idle time, but a run holds the lease
        assert local_server.info(home) is not None
    # released: the idle clock starts now, and the server stops once it runs out
    deadline = time.time() + idle_s + 4 * local_server.POLL_S + 30
    while local_server.info(home) is not None and time.time() < deadline:
        time.sleep(0.5)
    assert local_server.info(home) is None and not (home / "server.json").exists()
    while _processes_of(home) and time.time() < deadline:
        time.sleep(0.5)
    assert not _processes_of(home) and _gone(rec["pid"])


def test_stop_waits_for_a_running_run_and_leaves_nothing(tmp_path):
    home = tmp_path / "prefect"
    release = threading.Event()

    def run():
        with local_server.lease(home):
            release.wait(60)

    with local_server.lease(home):
        local_server.ensure(home, 3600)
    holder = threading.Thread(target=run)
    holder.start()
    time.sleep(0.5)
    assert local_server.stop(home, timeout_s=2 * local_server.POLL_S + 1)  # asked; a run still holds the lease
    assert local_server.info(home) is not None
    release.set()
    holder.join()
    deadline = time.time() + 60
    while (local_server.info(home) is not None or _processes_of(home)) and time.time() < deadline:
        time.sleep(0.5)
    assert local_server.info(home) is None and not _processes_of(home)
    assert not local_server.stop(home)  # nothing left to stop
    assert os.path.exists(home / "server.log")


def test_a_server_that_dies_is_restarted_on_its_port_with_its_database(tmp_path):
    import signal
    import urllib.request

    home = tmp_path / "prefect"
    with local_server.lease(home):
        url = local_server.ensure(home, 3600)
        req = urllib.request.Request(f"{url}/flows/", data=json.dumps({"name": "before-the-crash"}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(req, timeout=30).read()
        supervisor = json.loads((home / "server.json").read_text())["pid"]
        children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
        assert len(children) == 1
        os.kill(int(children[0]), signal.SIGKILL)  # the server, as a crash or the OOM killer leaves it
        time.sleep(local_server.POLL_S + 0.5)
        assert local_server.ensure(home, 3600) == url  # the same server, back: not a second one
        with urllib.request.urlopen(f"{url}/flows/name/before-the-crash", timeout=30) as r:
            assert json.loads(r.read())["name"] == "before-the-crash"
        assert Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split() != children
        assert "restarting it on" in (home / "server.log").read_text()
    assert local_server.stop(home)
    deadline = time.time() + 60
    while _processes_of(home) and time.time() < deadline:
        time.sleep(0.5)
    assert not _processes_of(home)
