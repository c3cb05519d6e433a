"""Campaign 6 of bench/reliability.py: store faults. The S3 server (moto's server mode on loopback) is reached
through a fault-injecting TCP proxy (bench/_proxy.py, its own process) while a real process does one of four
store operations:
- ``publish``: ``edgeplan publish`` of content B (tiny_cnn + spatial_chain) to a fresh prefix that is empty
  ("first") or holds content A as revision 1 ("next");
- ``pull``: ``edgeplan-runtime pull`` of revision 2 into a device directory that is empty or has revision 1 active;
- ``telemetry``: ``edgeplan-runtime profile JOB_URI`` on a device with revision 2 active, which reads its job and
  uploads its measurements (``jobs/<id>/result/<device>.json``: the only thing a device writes to the store);
- ``dvc``: the flow's versioning step (``pipeline.versioning.version_artifacts``, what the ``version`` task runs:
  ``dvc add`` of a model version's artifact directory, then ``dvc push``) to a fresh remote prefix.
At a uniformly random time within the first 3/4 of the operation's measured clean duration, one fault starts
and lasts d s:
- ``pause``: the S3 server SIGSTOPped, SIGCONTinued after d in [0.5, 4] s;
- ``restart``: the endpoint goes away (the proxy's listener closed, every connection reset: connections
  refused) and comes back after d in [0.5, 4] s (moto keeps its objects in memory, so its own process is not
  restarted: what a client sees of a restarting server is the endpoint's);
- ``slow``: every 64 KiB forwarded waits 20-200 ms, for d in [1, 4] s;
- ``resets``: each new connection reset (RST) after 0-256 KiB with probability 0.3-1, for d in [0.5, 3] s;
- and, once per operation, ``down``: the endpoint goes away until the operation has ended (in the first 15 % of
  the clean run, while the operation's store calls are ahead of it).
The promise, judged without edgeplan's reading code (boto3 straight to the server, the signature library,
hashes): the operation ends within the stated retry bound after the fault ends (``BOUND_S``), with exit 0 or a
failure that is one error line (after lines saying it retries), never a traceback; nothing half-written is
visible (the store's ``latest`` names a complete signed revision or the previous one, every blob object hashes
to its key; the device's ``current`` is a complete verified revision or the previous one; the result object is
absent or complete; every DVC object's md5 is its key); and a rerun without faults completes.

The stated bounds (README "Bundles and the store"): an S3 call is botocore's 5 attempts (standard mode: backoff
up to 1, 2, 4, 8 s; 10 s connect and read timeouts: 65 s at worst); publish and pull wrap each call in 4
attempts 0.5, 1, 2 s apart (263.5 s at worst), the telemetry upload does not; the versioning step's DVC commands
are stopped after ``orchestration.dvc_timeout_s`` each (60 s here: 120 s for ``dvc add`` then ``dvc push``).
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
import time
from contextlib import contextmanager
from pathlib import Path

from _faults import DEPLOYMENT, DEVICE, REPO, Forked, Popened, publisher, record, wait

from edgeplan.pipeline import versioning

BUCKET = "edgeplan"
FAULTS = ("pause", "restart", "slow", "resets")
OPS = ("publish", "pull", "telemetry", "dvc")
S3_CALL_S = 5 * 10 + (1 + 2 + 4 + 8)  # botocore: 5 attempts, 10 s timeouts, standard backoff
DVC_TIMEOUT_S = 60.0  # orchestration.dvc_timeout_s for the versioning step here (600 by default)
BOUND_S = {"publish": 4 * S3_CALL_S + 3.5, "pull": 4 * S3_CALL_S + 3.5, "telemetry": S3_CALL_S,
           "dvc": 2 * DVC_TIMEOUT_S}  # dvc add, then dvc push


class Faults:
    """The proxy process in front of the S3 server, and the server's own process (to pause it)."""

    def __init__(self, server, seed: int, logs: Path):
        self.server = server
        upstream = int(server.url.rsplit(":", 1)[1])
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("_proxy.py")), str(upstream),
                                      str(seed)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=open(logs / "proxy.log", "w"), text=True, bufsize=1)  # noqa: SIM115
        self.url = f"http://127.0.0.1:{self.proc.stdout.readline().split()[1]}"
        self.paused = False

    def say(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        answer = self.proc.stdout.readline().strip()
        if answer != "ok":
            raise RuntimeError(f"the proxy answered {answer!r} to {line!r}")

    def start(self, fault: str, rng: random.Random) -> dict:
        """Start ``fault``; what it is (its strength and duration)."""
        if fault == "pause":
            os.kill(self.server.proc.pid, signal.SIGSTOP)
            self.paused = True
            return {"seconds": rng.uniform(0.5, 4)}
        if fault in ("restart", "down"):
            self.say("down")
            return {"seconds": rng.uniform(0.5, 4)} if fault == "restart" else {}
        if fault == "slow":
            delay = rng.uniform(0.02, 0.2)
            self.say(f"slow {delay}")
            return {"seconds": rng.uniform(1, 4), "chunk_delay_s": round(delay, 4)}
        p = rng.uniform(0.3, 1.0)
        self.say(f"resets {p}")
        return {"seconds": rng.uniform(0.5, 3), "reset_probability": round(p, 3)}

    def end(self) -> None:
        if self.paused:
            os.kill(self.server.proc.pid, signal.SIGCONT)
            self.paused = False
        self.say("normal")

    def close(self) -> None:
        self.end()
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


@contextmanager
def started(work: Path, arts: Path, params_b: dict, bundles_: dict, key_path: Path, public, seed: int):
    """A ``Campaign`` over a moto server started here behind a fault proxy (both stopped after)."""
    from edgeplan.store.moto_server import moto_server

    with moto_server(log=work / "moto.log") as server:
        faults = Faults(server, seed, work)
        try:
            yield Campaign(server, faults, work, arts, params_b, bundles_, key_path, public)
        finally:
            faults.close()


# ---------------------------------------------------------------------------------------------- the operations
class Campaign:
    """What the trials share: the S3 server, the proxy, the key, the deployment's artifacts, a device template
    with revision 1 and one with revision 2 pulled from the S3 store, a DVC repository."""

    def __init__(self, server, faults: Faults, work: Path, arts: Path, params_b: dict, bundles_: dict, key_path: Path,
                 public):
        import boto3
        import yaml

        self.server, self.faults, self.work, self.arts, self.public = server, faults, work, arts, public
        self.key_path, self.trusted = key_path, next(key_path.parent.glob("*.pub"))
        self.s3 = boto3.client("s3", endpoint_url=server.url)
        self.bundles, self.params = bundles_, params_b
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.counter = 0
        self.dvc_objects = None  # what a clean push leaves in the remote (set by the first one)
        self.env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3", "EDGEPLAN_ACCELERATOR": "none",
                    "AWS_ENDPOINT_URL": faults.url}
        self.env.pop("EDGEPLAN_KILL_AT", None)
        params = {**params_b, "publish": {**params_b["publish"], "trusted_keys": [str(key_path.parent)]}}
        self.params_file = work / "params_store_faults.yaml"
        self.params_file.write_text(yaml.safe_dump(params))
        # the pull store: revisions 1 (A) and 2 (B), published straight to the server
        self.pull_store = f"s3://{BUCKET}/store-faults/pull"
        for label in ("A", "B"):
            self._publish_direct(self.pull_store, label)
        self.templates = {}
        for rev, label in ((1, "A"), (2, "B")):
            dest = work / f"device-rev{rev}"
            shutil.rmtree(dest, ignore_errors=True)
            store = f"s3://{BUCKET}/store-faults/template{rev}"
            self._publish_direct(store, label)
            if self._pull(store, dest).wait(300) != 0:
                raise RuntimeError(f"pulling revision {rev} for the device template failed")
            self.templates[rev] = dest
        self.dvc_repo = self._dvc_repo(arts)

    def _publish_direct(self, uri: str, label: str) -> None:
        report = self.work / "report.json"
        if wait(publisher(uri, self.server.url, self.bundles[label], self.key_path, self.params, None, report)) != 0:
            raise RuntimeError(f"publishing {label} to {uri} failed: {report.read_text()}")

    def _pull(self, store: str, dest: Path, env: dict | None = None) -> Forked:
        return Forked(["pull", store, "--device-id", DEVICE, "--dest", str(dest), "--trusted", str(self.trusted),
                       "--retries", "0"], env or self.env, self.logs, "pull")

    def _dvc_repo(self, arts: Path) -> Path:
        """A workspace holding one model version's artifacts (``artifacts/tiny_cnn/1``), a DVC repository."""
        repo = self.work / "dvc-workspace"
        shutil.rmtree(repo, ignore_errors=True)
        shutil.copytree(arts / "tiny_cnn" / "1", repo / "artifacts" / "tiny_cnn" / "1")
        versioning._dvc(repo, "init", "--no-scm", "-q")
        return repo

    def fresh(self, op: str, kind: str) -> dict:
        """A fresh target for one trial of ``op``: {uri or dest, what the judge needs}."""
        self.counter += 1
        tag = f"t{self.counter:04d}"
        if op == "publish":
            uri = f"s3://{BUCKET}/store-faults/publish/{tag}"
            if kind == "next":
                self._publish_direct(uri, "A")
            return {"uri": uri}
        if op == "pull":
            dest = self.work / "device"
            shutil.rmtree(dest, ignore_errors=True)
            if kind == "next":
                shutil.copytree(self.templates[1], dest, symlinks=True)
            return {"dest": dest}
        if op == "telemetry":
            dest = self.work / "device"
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(self.templates[2], dest, symlinks=True)
            job = {"id": f"store-faults-{tag}", "device_class": self.params["deployments"][0]["device_class"],
                   "models": [{"name": "tiny_cnn", "version": "1"}],
                   "settings": {**self.params["profile"], "repeats": 3, "min_repeats": 1, "span_s": 0.1,
                                "budget_s": 0.3, "warmup": 1},
                   "reference_probe_ms": {}}
            root = f"store-faults/telemetry/{tag}"
            self.s3.put_object(Bucket=BUCKET, Key=f"{root}/jobs/{job['id']}/job.json", Body=json.dumps(job).encode())
            return {"dest": dest, "job_uri": f"s3://{BUCKET}/{root}/jobs/{job['id']}/job.json",
                    "result_key": f"{root}/jobs/{job['id']}/result/{DEVICE}.json", "job": job["id"]}
        remote = f"s3://{BUCKET}/store-faults/dvc/{tag}"
        versioning._dvc(self.dvc_repo, "remote", "add", "-f", "-d", "store", remote)
        versioning._dvc(self.dvc_repo, "remote", "modify", "store", "endpointurl", self.faults.url)
        return {"prefix": f"store-faults/dvc/{tag}/"}

    def start(self, op: str, target: dict):
        """The operation's process (``Forked``, or a ``Popen`` for DVC)."""
        if op == "publish":
            return Forked(["--params", str(self.params_file), "publish", "--deployment", DEPLOYMENT, "--store",
                           target["uri"], "--key", str(self.key_path), "--artifacts", str(self.arts)], self.env,
                          self.logs, "publish", module="edgeplan.cli")
        if op == "pull":
            return self._pull(self.pull_store, target["dest"])
        if op == "telemetry":
            return Forked(["profile", target["job_uri"], "--dir", str(target["dest"]), "--device-id", DEVICE,
                           "--trusted", str(self.trusted)], self.env, self.logs, "telemetry")
        return Popened([sys.executable, "-c", VERSION, str(self.dvc_repo / "artifacts" / "tiny_cnn" / "1"),
                        str(DVC_TIMEOUT_S)],
                       self.dvc_repo, self.env, self.logs)

    # ------------------------------------------------------------------------------------------ the judge
    def objects(self, prefix: str) -> dict[str, bytes]:
        out = {}
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
            for obj in page.get("Contents", []):
                out[obj["Key"]] = self.s3.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read()
        return out

    def judge(self, op: str, kind: str, target: dict, finished: bool) -> list[str]:
        """What is wrong with what the operation left (``finished``: it exited 0)."""
        import _pull_kills
        from reliability import Reader, judge

        if op == "publish":
            rev, wrong = judge(Reader(target["uri"], self.server.url), self.public)
            allowed = ({2} if finished else {1, 2}) if kind == "next" else ({1} if finished else {None, 1})
            if rev not in allowed:
                wrong.append(f"latest names {rev} (allowed: {sorted(allowed, key=str)})")
            prefix = target["uri"][len(f"s3://{BUCKET}/"):] + "/blobs/sha256/"
            wrong += [f"blob object {k} does not hash to its name" for k, v in self.objects(prefix).items()
                      if hashlib.sha256(v).hexdigest() != k.rsplit("/", 1)[1]]
            return wrong
        if op == "pull":
            setup = _pull_kills.Setup(self.pull_store, self.templates[1], self.trusted, self.public, self.env,
                                      self.logs)
            allowed = {2} if finished else ({None, 2} if kind == "first" else {1, 2})
            return _pull_kills.verdict(setup, target["dest"], allowed, serving=False)[1]
        if op == "telemetry":
            try:
                raw = self.s3.get_object(Bucket=BUCKET, Key=target["result_key"])["Body"].read()
            except self.s3.exceptions.NoSuchKey:
                return ["the operation finished but no result is in the store"] if finished else []
            try:
                doc = json.loads(raw)
            except ValueError:
                return [f"the result object is not JSON ({len(raw)} B)"]
            ok = doc.get("job") == target["job"] and doc.get("device_id") == DEVICE and "tiny_cnn" in doc.get(
                "profiles", {})
            return [] if ok else ["the result object is incomplete"]
        wrong, remote = [], self.objects(target["prefix"])
        for key, data in remote.items():
            want = key[len(target["prefix"]):].replace("files/md5/", "").replace("/", "").removesuffix(".dir")
            if hashlib.md5(data).hexdigest() != want:
                wrong.append(f"DVC object {key} does not hash to its name")
        if finished and self.dvc_objects is not None and len(remote) != self.dvc_objects:
            wrong.append(f"dvc push finished but {len(remote)} of {self.dvc_objects} "
                         "objects are in the remote")
        return wrong


VERSION = """import sys
from pathlib import Path
from edgeplan.errors import EdgeplanError
from edgeplan.pipeline.versioning import version_artifacts
try:
    version_artifacts(Path(sys.argv[1]), {"orchestration": {"dvc_timeout_s": float(sys.argv[2])}})
except EdgeplanError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
"""  # the flow's version task, without Prefect around it


def clear_failure(proc) -> list[str]:
    """A failed operation ends with one error line (lines before it may only say that it retries), never a
    traceback."""
    text = proc.stderr() + proc.stdout()
    if "Traceback" in text:
        return ["a traceback"]
    if "unexpectedly" in text:
        return [f"an unexpected failure: {text.strip()[-200:]}"]
    lines = [ln for ln in proc.stderr().splitlines() if ln.strip()]
    if not lines or "error" not in lines[-1] or any("retrying" not in ln for ln in lines[:-1]):
        return [f"not one error line after retry notes: {text.strip()[-300:]}"]
    return []


# ---------------------------------------------------------------------------------------------- the trials
def run_store_faults(c: Campaign, per_fault: int, seed: int, ops=OPS, faults=FAULTS, down_ops=None) -> dict:
    """``per_fault`` trials of each (operation, fault), kinds alternating, then one ``down`` trial per operation
    (of ``down_ops``, default ``ops``)."""
    rng = random.Random(seed)
    clean = {}
    for op in ops:  # the clean duration (median of 3 runs through the proxy)
        runs = []
        for _ in range(3):
            target = c.fresh(op, "next")
            proc = c.start(op, target)
            if proc.wait(BOUND_S[op] + 60) != 0:
                raise RuntimeError(f"a clean {op} failed: {proc.stderr().strip()[-400:]}")
            runs.append(proc.seconds)
            if op == "dvc":
                c.dvc_objects = len(c.objects(target["prefix"]))
        clean[op] = sorted(runs)[1]
    plan = [(op, fault, ("first", "next")[i % 2]) for op in ops for fault in faults for i in range(per_fault)]
    plan += [(op, "down", "next") for op in (ops if down_ops is None else down_ops)]
    rows, violations = [], []
    for i, (op, fault, kind) in enumerate(plan):
        target = c.fresh(op, kind if op in ("publish", "pull") else "next")
        at = rng.uniform(0, 0.75 * clean[op])  # the operation's end is less regular than its start
        if fault == "down":  # early, while its store calls are ahead of it: at 66 % of the clean run a telemetry
            at *= 0.2        # job could be past its last call and succeed (seen once in CI)
        proc = c.start(op, target)
        t0 = time.perf_counter()
        while proc.poll() is None and time.perf_counter() - t0 < at:
            time.sleep(0.001)
        started, ended_before = time.perf_counter(), proc.poll() is not None
        what = c.faults.start(fault, rng)
        if fault == "down":  # until the operation gives up (or finishes): its time from the fault on
            proc.wait(BOUND_S[op] + 60)
        else:
            end = started + what["seconds"]
            while time.perf_counter() < end:
                time.sleep(0.005)
        fault_end = started if fault == "down" else time.perf_counter()
        c.faults.end()
        rc = proc.wait(BOUND_S[op] + 120)
        after_fault = time.perf_counter() - fault_end
        message = ((proc.stderr() or proc.stdout()).strip().splitlines() or [""])[-1][:300] if rc else ""
        broke = []
        if after_fault > BOUND_S[op]:
            broke.append(f"ended {after_fault:.1f} s after the fault, beyond the stated {BOUND_S[op]:.0f} s")
        if rc != 0:
            broke += clear_failure(proc)
        broke += [f"after the fault: {w}" for w in c.judge(op, kind, target, rc == 0)]
        again = c.start(op, target)  # the rerun, without faults
        if again.wait(BOUND_S[op] + 60) != 0:
            broke.append(f"the rerun failed (exit {again.rc}): {again.stderr().strip()[-200:]}")
        broke += [f"after the rerun: {w}" for w in c.judge(op, kind, target, True)]
        row = {"trial": i, "seed": seed, "op": op, "fault": fault, "kind": kind, "at_s": round(at, 4),
               "fault_at_s": round(started - t0, 4), "ended_before_fault": ended_before,
               **{k: round(v, 4) for k, v in what.items()}, "exit": rc, "failed": rc != 0,
               "seconds": round(proc.seconds or 0, 3), "after_fault_s": round(after_fault, 3),
               "message": message,
               "violations": broke}
        record(rows, violations, row, "store faults, trials", len(plan))
    print(file=sys.stderr)
    downs = [r for r in rows if r["fault"] == "down"]
    return {"trials": len(rows), "violations": len(violations), "clean_seconds": clean, "bounds_s": BOUND_S,
            "ended_before_fault": sum(r["ended_before_fault"] for r in rows),
            "failed": sum(r["failed"] for r in rows), "max_after_fault_s": max((r["after_fault_s"] for r in rows
                                                                               if r["fault"] != "down"), default=0),
            "down_give_up_s": {r["op"]: r["seconds"] for r in downs},
            "by_fault": {f: {"trials": sum(r["fault"] == f for r in rows),
                             "failed": sum(r["failed"] for r in rows if r["fault"] == f)} for f in (*faults, "down")},
            "violated": violations, "rows": rows}
