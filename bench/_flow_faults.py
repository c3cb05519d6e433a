"""Campaign 7 of bench/reliability.py: flow faults. One real ``edgeplan run zoo:tiny_cnn --name m --version 1`` (the
compile-model flow: ingest, build with its int8 conversion, verify, stream, Parallax, profile, DVC version, plan,
publish to a local store) per trial, in a fresh working directory with its own Prefect result storage and DVC
remote, reporting to one Prefect server the campaign runs (``pipeline.local_server``: ``prefect server start`` under
edgeplan's supervisor, on loopback). The clean run is made twice (the second must equal the first); "the clean
run's duration" below is the faster of the two. Each trial injects one fault at a uniformly random time:
- ``worker``: the process running the flow's tasks (``edgeplan run``, with every child it started: the converter,
  the profilers, DVC) SIGKILLed at a time in [0, the clean run's duration]; then the same command again;
- ``server``: the Prefect server process SIGKILLed or SIGTERMed (alternately) at a time in [10 %, 80 %] of the
  clean run; its supervisor starts it again on the same port and database (~10 s) while the run goes on;
  a run that fails is followed by the same command again;
- ``dask``: the run's tasks on a Dask cluster (``dask scheduler`` and two ``dask worker`` processes, started for
  the trial), one worker (its nanny and itself) SIGKILLed at a time in [10 %, 80 %] of the clean run; the run
  goes on with the other; a run that fails is followed by the same command again (on the worker left).
The promise, judged by reading files (never edgeplan's code), after the last command of the trial:
- it exits 0; a failed run before it says so in error lines, never a traceback;
- no conversion is redone: ``model_int8.tflite`` (written once per conversion, by rename) is seen in at most one
  version over the whole trial (a watcher polls it every 50 ms), and no task's persisted Prefect result is
  written twice (a task that completed is taken from the cache, never run again);
- the artifacts are identical: every file the deterministic stages make (all of ``artifacts/m/1`` but the measured
  profiles and Parallax plans and the DVC pointer; the FlashMem segments) is byte-identical to a clean run's,
  and the measured ones are present and parse;
- ``latest`` names revision 1, complete and signed (``cryptography`` over the canonical JSON, every blob hashed);
- no process of the trial is left running (15 s after its last command ended: a SIGKILLed process group's
  members take a moment to exit).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from _faults import REPO, Popened, record

KINDS = ("worker", "server", "dask")
MODEL = ("zoo:tiny_cnn", "m", "1")
DEPLOYMENT = "m-solo"
MEASURED = ("profiles", "parallax", "1.dvc")  # timed on this host: not byte-identical between runs
LOGS = "logs"  # what the converters printed (edgeplan/childlog): no artifact
RUN_LIMIT_S = 600.0


def _files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def deterministic(work: Path) -> dict[str, str]:
    """sha256 of what the deterministic stages made (the model version's files but the measured ones, and the
    FlashMem segments of its deployment)."""
    arts = work / "artifacts"
    out = {k: v for k, v in _files(arts / "m").items() if k.split("/")[0] not in MEASURED
           and (k.split("/") + [""])[1] not in (*MEASURED, LOGS)}
    out.update({f"flashmem/{k}": v for k, v in _files(arts / "deployments" / DEPLOYMENT / "flashmem").items()})
    return out


def measured_missing(work: Path) -> list[str]:
    wrong = []
    for rel in ("artifacts/m/1/profiles/coral-usb-emulated.json", "artifacts/m/1/parallax/parallax.json",
                f"artifacts/deployments/{DEPLOYMENT}/plans/swapless.json"):
        try:
            json.loads((work / rel).read_text())
        except (OSError, ValueError) as e:
            wrong.append(f"{rel}: {type(e).__name__}")
    return wrong


class Watcher:
    """Polls the int8 model and the Prefect result files every 50 ms: how many versions of each were seen.

    A result file counts a version only when it is whole (its bytes parse as JSON, as every Prefect result record
    does): Prefect writes a record in place (open, write, close), so a poll can land between the open and the
    write and see an empty or partial file that is not a second write. (A CI run failed 'completed tasks ran again'
    in the worker trial; whether by such a poll or by a record the kill tore, which the rerun rewrote, is not
    known.)"""

    def __init__(self, work: Path):
        self.tflite, self.storage = work / "artifacts/m/1/model_int8.tflite", work / ".prefect" / "storage"
        self.seen: dict[str, set] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _look(self) -> None:
        try:
            st = self.tflite.stat()  # written once per conversion, by rename: every version is whole
            self.seen.setdefault(self.tflite.name, set()).add((st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            pass
        for p in self.storage.iterdir() if self.storage.is_dir() else ():
            try:
                with open(p, "rb") as f:
                    data = f.read()
                    st = os.fstat(f.fileno())
                if len(data) != st.st_size:
                    continue  # written to while read
                json.loads(data)
            except (OSError, ValueError):
                continue  # gone, or not whole yet
            self.seen.setdefault(p.name, set()).add((st.st_ino, st.st_mtime_ns, st.st_size))

    def _poll(self) -> None:
        while not self._stop.wait(0.05):
            self._look()

    def stop(self) -> tuple[int, int]:
        """(versions of the int8 model, result files written whole more than once)."""
        self._stop.set()
        self._thread.join()
        self._look()
        return (len(self.seen.get(self.tflite.name, ())),
                sum(len(v) > 1 for k, v in self.seen.items() if k != self.tflite.name))


def leftovers(home: Path) -> list[str]:
    """Processes whose environment names the trial's Prefect home (everything a trial's commands started)."""
    mark = f"PREFECT_HOME={home}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if mark in (d / "environ").read_bytes().split(b"\0") and "State:\tZ" not in (d / "status").read_text():
                    cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    found.append(f"{d.name} {cmd[:120]}")
            except OSError:
                continue
    return found


class Cluster:
    """A Dask scheduler and two workers (each a nanny and its worker), every one in its own session."""

    def __init__(self, env: dict, logs: Path):
        from edgeplan.pipeline.local_server import _free_port

        self.address = f"tcp://127.0.0.1:{_free_port()}"
        dask = str(Path(sys.executable).with_name("dask"))
        port = self.address.rsplit(":", 1)[1]
        self.scheduler = Popened([dask, "scheduler", "--host", "127.0.0.1", "--port", port, "--no-dashboard"],
                                 logs, env, logs, "dask-scheduler")
        self.workers = [Popened([dask, "worker", self.address, "--nthreads", "1", "--no-dashboard",
                                 "--name", f"w{i}", "--host", "127.0.0.1"], logs, env, logs, f"dask-worker{i}")
                        for i in range(2)]
        from distributed import Client

        with Client(self.address, timeout=60) as client:
            client.wait_for_workers(2, timeout=120)

    def close(self) -> None:
        for p in (*self.workers, self.scheduler):
            p.kill()


class Campaign:
    """The campaign's Prefect server and signing key, and the clean run every trial is compared with."""

    def __init__(self, work: Path, server_home: Path, url: str):
        self.work, self.server_home, self.url = work, server_home, url
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.keys = work / "keys"
        if not self.keys.is_dir():
            subprocess.run([sys.executable, "-m", "edgeplan.cli", "keys", "generate", "--out", str(self.keys)], check=True,
                           capture_output=True)
        from cryptography.hazmat.primitives.serialization import load_pem_public_key

        self.public = load_pem_public_key(next(self.keys.glob("*.pub")).read_bytes())
        self.counter = 0
        self.reference: dict[str, str] = {}
        times = [self._clean() for _ in range(2)]
        self.clean_s = min(times)
        self.clean_runs_s = [round(t, 2) for t in times]

    def _clean(self) -> float:
        """One clean run, timed. The first is the reference; the second must equal it and is usually the faster:
        the first run after the server started also pays cold imports and the server's first requests, and a
        fault drawn on its duration fell after some trial runs had ended."""
        d = self.trial_dir()
        t0 = time.perf_counter()
        proc = self.run(d)
        if proc.wait(RUN_LIMIT_S) != 0:
            raise RuntimeError(f"the clean run failed: {proc.stderr().strip()[-600:]}")
        seconds = time.perf_counter() - t0
        if not self.reference:
            self.reference = deterministic(d)
        elif wrong := self.judge(d):
            raise RuntimeError(f"two clean runs differ: {'; '.join(wrong)[:600]}")
        return seconds

    def trial_dir(self) -> Path:
        self.counter += 1
        d = self.work / f"t{self.counter:03d}"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        import yaml

        (d / "params.yaml").write_text(yaml.safe_dump({
            "profile": {"repeats": 10, "span_s": 0.5, "budget_s": 1.0},
            "publish": {"store": str(d / "store"), "trusted_keys": [str(self.keys)]}}))
        return d

    def env(self, d: Path) -> dict:
        env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_API_URL": self.url, "PREFECT_HOME": str(d / ".prefect"),
               "PREFECT_LOCAL_STORAGE_PATH": str(d / ".prefect" / "storage"), "TF_CPP_MIN_LOG_LEVEL": "3",
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        env.pop("EDGEPLAN_KILL_AT", None)
        return env

    def run(self, d: Path, dask: str | None = None, tag: str = "run") -> Popened:
        source, name, version = MODEL
        argv = [sys.executable, "-m", "edgeplan.cli", "run", source, "--name", name, "--version", version,
                "--key", str(next(self.keys.glob("*.key"))), "--device-check-s", "0"]
        return Popened(argv + (["--dask", dask] if dask else []), d, self.env(d), d, tag)

    def server_pid(self) -> int:
        sup = json.loads((self.server_home / "server.json").read_text())["pid"]
        children = Path(f"/proc/{sup}/task/{sup}/children").read_text().split()
        if len(children) != 1:
            raise RuntimeError(f"the Prefect server's supervisor has children {children}")
        return int(children[0])

    def judge(self, d: Path) -> list[str]:
        from reliability import Reader, judge

        wrong = []
        got = deterministic(d)
        differ = sorted(k for k in set(got) | set(self.reference) if got.get(k) != self.reference.get(k))
        if differ:
            wrong.append(f"{len(differ)} artifacts differ from the clean run's: {', '.join(differ[:5])}")
        wrong += measured_missing(d)
        rev, bad = judge(Reader(str(d / "store"), None), self.public, DEPLOYMENT)
        if rev != 1:
            wrong.append(f"latest names revision {rev}, not 1")
        return wrong + bad


@contextmanager
def started(work: Path):
    """The campaign's Prefect server (stopped at the end) and its clean run."""
    from edgeplan.pipeline import local_server

    home = work / "prefect-server"
    with local_server.lease(home):
        url = local_server.ensure(home, 3600)
    try:
        yield Campaign(work, home, url)
    finally:
        local_server.stop(home)


def _clear(proc: Popened) -> list[str]:
    text = proc.stdout() + proc.stderr()
    if "Traceback" in text:
        return ["a traceback"]
    if "error" not in text.lower():
        return [f"failed without an error line: {text.strip()[-200:]}"]
    return []


def run_flow_faults(c: Campaign, per_kind: int, seed: int, kinds=KINDS) -> dict:
    rng = random.Random(seed)
    plan = [kind for _ in range(per_kind) for kind in kinds]
    rows, violations = [], []
    for i, kind in enumerate(plan):
        d = c.trial_dir()
        watcher = Watcher(d)
        cluster = Cluster(c.env(d), d) if kind == "dask" else None
        lo, hi = (0.0, 1.0) if kind == "worker" else (0.1, 0.8)
        at = rng.uniform(lo * c.clean_s, hi * c.clean_s)
        what = {"kill": "SIGKILL"}
        proc = c.run(d, cluster.address if cluster else None)
        t0 = time.perf_counter()
        while proc.poll() is None and time.perf_counter() - t0 < at:
            time.sleep(0.01)
        ended_before = proc.poll() is not None
        storage = d / ".prefect" / "storage"
        done = len(list(storage.iterdir())) if storage.is_dir() else 0  # task results persisted so far
        if not ended_before:
            if kind == "worker":
                proc.kill()
            elif kind == "server":
                sig = (signal.SIGKILL, signal.SIGTERM)[i // len(kinds) % 2]
                what = {"kill": sig.name}
                os.kill(c.server_pid(), sig)
            else:
                victim = rng.randrange(2)
                what["worker"] = victim
                cluster.workers[victim].kill()
        rc = proc.wait(RUN_LIMIT_S)
        broke = [] if rc == 0 or kind == "worker" else _clear(proc)
        runs = 1
        if rc != 0:
            again = c.run(d, cluster.address if cluster else None, tag="rerun")
            runs, rc = 2, again.wait(RUN_LIMIT_S)
            if rc != 0:
                broke.append(f"the rerun failed (exit {rc}): {(again.stderr() or again.stdout()).strip()[-300:]}")
        if cluster:
            cluster.close()
        conversions, rewritten = watcher.stop()
        if conversions > 1:
            broke.append(f"the int8 conversion was done {conversions} times")
        if rewritten:
            broke.append(f"{rewritten} completed tasks ran again (their results written twice)")
        if rc == 0:
            broke += c.judge(d)
        deadline = time.monotonic() + 15.0  # a killed process group's members take a moment to exit
        while (left := leftovers(d / ".prefect")) and time.monotonic() < deadline:
            time.sleep(0.2)
        if left:
            broke.append(f"processes left running: {left[:3]}")
            for line in left:
                os.kill(int(line.split()[0]), signal.SIGKILL)
        row = {"trial": i, "seed": seed, "kind": kind, "at_s": round(at, 3), "ended_before_fault": ended_before,
               "tasks_done_at_fault": done, **what, "first_exit": proc.rc, "runs": runs, "exit": rc, "conversions": conversions,
               "seconds": round(time.perf_counter() - t0, 2), "violations": broke}
        record(rows, violations, row, "flow faults, trials", len(plan))
        if not broke:
            shutil.rmtree(d, ignore_errors=True)
    print(file=sys.stderr)
    return {"trials": len(rows), "violations": len(violations), "clean_seconds": round(c.clean_s, 2),
            "clean_runs_seconds": c.clean_runs_s,
            "by_kind": {k: {"trials": sum(r["kind"] == k for r in rows),
                            "resumed_by_rerun": sum(r["runs"] == 2 for r in rows if r["kind"] == k),
                            "ended_before_fault": sum(r["ended_before_fault"] for r in rows if r["kind"] == k)}
                        for k in kinds},
            "conversions_max": max((r["conversions"] for r in rows), default=0),
            "violated": violations, "rows": rows}
