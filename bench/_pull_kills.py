"""Campaign 2 of bench/reliability.py: kill-anywhere pull and activation, and a full disk mid-pull.

A local store holds revision 1 (content A) and revision 2 (content B, which brings blobs A lacks) of the
deployment. Each trial is an independent ``edgeplan-runtime pull --device-id`` process (forked from the harness,
which imported the runtime once: ``_faults.Forked``) into a device directory
that is either empty ("first": nothing active) or holds revision 1 active ("next": a copy of a device that
pulled revision 1 when it was the latest). The pull is SIGKILLed
- just before its Nth step (the fault hook, ``EDGEPLAN_KILL_AT``: every store call — the device record, latest,
  the manifest, each blob's size and download — and every marked file-system step: each hard link, the
  manifest and latest written into staging, the health check, the staging rename, each symlink made and
  renamed, the state write), for every N a whole pull takes; or
- at a uniformly random time within a whole pull's measured duration (process start included).
Then, judged without edgeplan's reading code (plain reads, ``cryptography`` for the signatures, every file
hashed): ``current`` is absent ("first" only) or names a revision directory whose signed ``latest`` names the
signed manifest it holds, every file present with its size and sha256, revision 1 or 2;
``edgeplan-runtime status`` reports it (or, with nothing active, says so and exits 1), and
``edgeplan-runtime serve`` answers a self-test input with 200 (nothing on stderr that looks like a traceback
anywhere); then a pull that is not killed finishes, activates revision 2 (judged the same way) and leaves
``state.json`` recording revision 2 as the highest run (the anti-rollback floor).

Full disk: the device directory on a small tmpfs (mounted here; root needed, else skipped and said so),
filled by a filler file to leave F bytes free, F swept from 0 to what the pull needs; the pull must either
finish or fail with one line that says the disk is full (never a traceback, never "failed unexpectedly"),
leave the active revision as it was (judged), and finish once the filler is removed.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path

from _faults import DEVICE, REPO, Forked, preload, publisher, record, signed, wait

STORE_CALLS = {"get", "put", "exists", "size", "list", "read_range", "read_from", "put_file"}  # faults.KillAt's


@dataclass(frozen=True)
class Setup:
    store: str  # holds revisions 1 (A) and 2 (B)
    template: Path  # a device directory with revision 1 active
    trusted: Path  # the public key file
    public: object  # its ed25519 key, for the judge
    env: dict
    logs: Path  # the commands' stdout and stderr


def prepare(work: Path, bundles_: dict, key_path: Path, params: dict, public) -> Setup:
    """Publish A to a fresh local store, pull it into the template device directory, publish B."""
    preload()
    for d in ("pull-store", "pull-template"):
        shutil.rmtree(work / d, ignore_errors=True)
    store, template = work / "pull-store", work / "pull-template"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3", "EDGEPLAN_ACCELERATOR": "none"}
    env.pop("EDGEPLAN_KILL_AT", None)
    trusted = next(key_path.parent.glob("*.pub"))
    for label in ("A", "B"):
        if wait(publisher(str(store), None, bundles_[label], key_path, params, None, work / "report.json")) != 0:
            raise RuntimeError(f"publishing {label} failed: {(work / 'report.json').read_text()}")
        if label == "A":
            res = _pull(Setup(str(store), template, trusted, public, env, work), template)
            if res["rc"] != 0:
                raise RuntimeError(f"pulling revision 1 failed: {res['stderr']}")
    return Setup(str(store), template, trusted, public, env, work)


# ---------------------------------------------------------------------------------------------- the processes
def _pull(s: Setup, dest: Path, kill_at: int | None = None, after_s: float | None = None,
          trace: Path | None = None) -> dict:
    """One ``edgeplan-runtime pull`` process: {rc (negative: killed), stdout, stderr, seconds}."""
    env = dict(s.env)
    if kill_at is not None:
        env["EDGEPLAN_KILL_AT"] = str(kill_at)
    if trace is not None:
        env["EDGEPLAN_FAULT_TRACE"] = str(trace)
    proc = Forked(["pull", s.store, "--device-id", DEVICE, "--dest", str(dest), "--trusted", str(s.trusted),
                   "--retries", "0"], env, s.logs, "pull")
    if after_s is not None:
        while proc.poll() is None and time.perf_counter() - proc.t0 < after_s:
            time.sleep(0.0005)
        proc.kill()
    proc.wait()
    return {"rc": proc.rc, "stdout": proc.stdout(), "stderr": proc.stderr(), "seconds": proc.seconds,
            "forked": proc.proc is None}


def untidy(stderr: str) -> list[str]:
    """What is wrong with a command's stderr: a traceback, an unexpected failure, more than one line."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    wrong = []
    if "Traceback" in stderr:
        wrong.append("a traceback on stderr")
    if "unexpectedly" in stderr:
        wrong.append(f"an unexpected failure: {lines[-1][:200]}")
    if len(lines) > 1:
        wrong.append(f"{len(lines)} lines on stderr")
    return wrong


def status(s: Setup, dest: Path, rev: int | None) -> list[str]:
    """``edgeplan-runtime status`` names revision ``rev`` (None: says nothing is active, exit 1)."""
    proc = Forked(["status", "--dest", str(dest)], s.env, s.logs, "status")
    rc, out = proc.wait(120), proc.stdout()
    wrong = [f"status: {w}" for w in untidy(proc.stderr())]
    if rev is None:
        if rc != 1 or "nothing pulled yet" not in out:
            wrong.append(f"status with nothing active: exit {rc}, {out.strip()[:120]!r}")
        return wrong
    try:
        said = json.loads(out)["revision"]
    except (ValueError, KeyError, TypeError):
        said = None
    if rc != 0 or said != rev:
        wrong.append(f"status: exit {rc}, revision {said} (the judge found {rev})")
    return wrong


def serve(s: Setup, dest: Path, manifest: dict) -> list[str]:
    """``edgeplan-runtime serve`` on a free loopback port answers a self-test input of the first model with 200."""
    entry = manifest["models"][0]
    body = (dest / "current" / entry["selftests"][0]["input"]).read_bytes()
    proc = Forked(["serve", str(dest), "--port", "0", "--mode", "cpu", "--no-adapt", "--inputs", "1"], s.env,
                  s.logs, "serve")
    try:
        end = time.monotonic() + 120
        while " on http://" not in proc.stdout():  # "serving <deployment> revision <n> on http://host:port (...)"
            if proc.poll() is not None or time.monotonic() > end:
                return [f"serve did not start (exit {proc.poll()}): {proc.stderr().strip()[-300:]!r}"]
            time.sleep(0.01)
        url = proc.stdout().split(" on ", 1)[1].split()[0]
        req = urllib.request.Request(f"{url}/infer/{entry['name']}", data=body,
                                     headers={"Content-Type": "application/x-npy"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                code = r.status
        except urllib.error.HTTPError as e:
            code = e.code
        return [] if code == 200 else [f"serve answered a self-test input with {code}"]
    finally:
        proc.kill(signal.SIGTERM)


# ---------------------------------------------------------------------------------------------- the judge
def judge(dest: Path, public) -> tuple[int | None, dict | None, list[str]]:
    """(revision ``current`` names or None, its manifest, what is wrong with it)."""
    cur = dest / "current"
    if not cur.is_symlink():
        return (None, None, []) if not cur.exists() else (-1, None, ["current is not a symlink"])
    target, revisions = cur.resolve(), (dest / "revisions").resolve()
    if revisions not in target.parents:
        return -1, None, [f"current points outside revisions/: {target}"]
    try:
        latest = json.loads((target / "latest").read_bytes())
        manifest = json.loads((target / "manifest.json").read_bytes())
    except (OSError, ValueError) as e:
        return -1, None, [f"current's revision cannot be read: {e}"]
    if not signed(latest, public):
        return -1, None, ["current's latest does not verify"]
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    if sha256(canonical).hexdigest() != latest.get("manifest_sha256") or not signed(manifest, public):
        return -1, None, ["current's manifest is not the signed one its latest names"]
    rev = manifest.get("revision")
    wrong = [] if rev == latest.get("revision") else [f"latest names {latest.get('revision')}, manifest {rev}"]
    for b in manifest["blobs"]:
        path = target / b["name"]
        if target not in path.resolve().parents:
            wrong.append(f"{b['name']} resolves outside the revision")
        elif not path.is_file():
            wrong.append(f"{b['name']} absent")
        elif path.stat().st_size != b["size"] or sha256(path.read_bytes()).hexdigest() != b["sha256"]:
            wrong.append(f"{b['name']} differs from the manifest")
    return rev, manifest, wrong


def _highest(dest: Path) -> int | None:
    try:
        return json.loads((dest / "state.json").read_text())["highest"]["solo"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def verdict(s: Setup, dest: Path, allowed: set, serving: bool = True) -> tuple[int | None, list[str]]:
    """Judge the device directory, then status, then serve (when something is active and ``serving``)."""
    rev, manifest, wrong = judge(dest, s.public)
    if rev not in allowed:
        wrong.append(f"current names {rev} (allowed: {sorted(allowed, key=str)})")
    if wrong:
        return rev, wrong
    wrong += status(s, dest, rev)
    if serving and rev is not None:
        wrong += serve(s, dest, manifest)
    return rev, wrong


def after_rerun(s: Setup, dest: Path) -> list[str]:
    """A pull that is not killed finishes, activates revision 2, and state.json records 2 as the highest."""
    res = _pull(s, dest)
    broke = [] if res["rc"] == 0 else [f"the rerun failed (exit {res['rc']}): {res['stderr'].strip()[-200:]}"]
    broke += [f"the rerun: {w}" for w in untidy(res["stderr"])]
    _, wrong = verdict(s, dest, {2}, serving=False)
    broke += [f"after the rerun: {w}" for w in wrong]
    if _highest(dest) != 2:
        broke.append(f"after the rerun state.json's highest revision is {_highest(dest)}, not 2")
    return broke


# ---------------------------------------------------------------------------------------------- kill trials
def run_pull_trials(s: Setup, trials: int, seed: int, work: Path, kinds=("first", "next"), stride: int = 1) -> dict:
    """Every step boundary of a first and of a next pull (with ``stride`` > 1: every file-system step and every
    stride-th store call), then ``trials`` random-time kills of each kind."""
    rng = random.Random(seed)

    def fresh(kind: str) -> Path:
        dest = work / "device"
        shutil.rmtree(dest, ignore_errors=True)
        if kind == "next":
            shutil.copytree(s.template, dest, symlinks=True)
        return dest

    full = {}
    for kind in kinds:  # one whole pull of each kind, traced: its steps and duration (median of 3)
        runs = []
        for _ in range(3):
            trace = work / "trace.txt"
            trace.unlink(missing_ok=True)
            res = _pull(s, fresh(kind), trace=trace)
            if res["rc"] != 0:
                raise RuntimeError(f"an unkilled {kind} pull failed: {res['stderr'].strip()[-300:]}")
            runs.append((res["seconds"], trace.read_text().splitlines(), res["forked"]))
        full[kind] = {"steps": runs[0][1], "seconds": sorted(r[0] for r in runs)[1], "forked": runs[0][2]}
    plan = [(kind, "boundary", n) for kind in kinds for n, label in enumerate(full[kind]["steps"], 1)
            if n % stride == 0 or label.split()[0] not in STORE_CALLS]
    plan += [(kind, "random", rng.uniform(0, full[kind]["seconds"])) for kind in kinds for _ in range(trials)]
    rows, violations = [], []
    for i, (kind, how, at) in enumerate(plan):
        dest, trace = fresh(kind), work / "trace.txt"
        trace.unlink(missing_ok=True)
        res = _pull(s, dest, kill_at=at if how == "boundary" else None, after_s=at if how == "random" else None,
                    trace=trace)
        steps = trace.read_text().splitlines() if trace.is_file() else []
        killed = res["rc"] == -signal.SIGKILL
        failed = f"the pull failed (exit {res['rc']}): {res['stderr'].strip()[-200:]}"
        broke = [] if killed or res["rc"] == 0 else [failed]
        rev, wrong = verdict(s, dest, {None, 2} if kind == "first" else {1, 2})
        broke += [f"after the kill: {w}" for w in wrong] + after_rerun(s, dest)
        row = {"trial": i, "seed": seed, "kind": kind, "kill": how,
               "at": at if how == "boundary" else round(at, 4), "killed": killed, "steps_taken": len(steps),
               "last_step": steps[-1] if steps else None, "current_after_kill": rev, "violations": broke}
        record(rows, violations, row, "pull kills, trials", len(plan))
    print(file=sys.stderr)
    return {"trials": len(rows), "violations": len(violations),
            "boundary_trials": sum(r["kill"] == "boundary" for r in rows),
            "random_trials": sum(r["kill"] == "random" for r in rows), "killed": sum(r["killed"] for r in rows),
            "pull": {k: {"steps": len(v["steps"]), "step_labels": v["steps"], "seconds": v["seconds"],
                         "forked": v["forked"]}
                     for k, v in full.items()},
            "violated": violations, "rows": rows}


# ---------------------------------------------------------------------------------------------- a full disk
@contextlib.contextmanager
def tmpfs(path: Path, size: int):
    """A tmpfs of ``size`` bytes mounted at ``path`` (removed after); raises PermissionError without root."""
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                         text=True, check=False)
    if res.returncode != 0:
        raise PermissionError(f"cannot mount a tmpfs at {path}: {res.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
        shutil.rmtree(path, ignore_errors=True)


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _fill(path: Path, leave: int) -> None:
    """A filler file that leaves ``leave`` bytes free on ``path``'s file system."""
    size = max(0, _free(path) - leave)
    with open(path / "filler", "wb") as f:
        while size > 0:
            n = min(size, 1 << 20)
            try:
                f.write(b"\0" * n)
                f.flush()
            except OSError:
                break
            size -= n


def run_disk_full(s: Setup, trials: int, work: Path, kinds=("first", "next")) -> dict:
    """``trials`` pulls of each kind into a tmpfs left with 0 .. (what a pull needs + 10%) bytes free."""
    need = sum(f.stat().st_size for f in (s.template / "blobs").rglob("*") if f.is_file())
    need += sum(f.stat().st_size for f in Path(s.store, "blobs").rglob("*") if f.is_file())  # generous
    mount = work / "small-disk"
    rows, violations = [], []
    try:
        with tmpfs(mount, 4 * need + (16 << 20)):
            for kind in kinds:
                for i in range(trials):
                    leave = int(need * 1.1 * i / max(1, trials - 1))
                    dest = mount / "device"
                    shutil.rmtree(dest, ignore_errors=True)
                    Path(mount / "filler").unlink(missing_ok=True)
                    if kind == "next":
                        shutil.copytree(s.template, dest, symlinks=True)
                    _fill(mount, leave)
                    res = _pull(s, dest)
                    broke = []
                    if res["rc"] != 0:
                        broke += [f"the failed pull: {w}" for w in untidy(res["stderr"])]
                        if "space" not in res["stderr"]:
                            broke.append(f"the failure does not say the disk is full: {res['stderr'].strip()[:200]}")
                    rev, wrong = verdict(s, dest, ({None} if kind == "first" else {1}) | ({2} if res["rc"] == 0
                                                                                          else set()))
                    broke += [f"after the full disk: {w}" for w in wrong]
                    (mount / "filler").unlink(missing_ok=True)
                    broke += after_rerun(s, dest)
                    row = {"kind": kind, "free_bytes": leave, "pull_exit": res["rc"],
                           "message": res["stderr"].strip()[:300], "current_after": rev, "violations": broke}
                    record(rows, violations, row, "full disk, trials", trials * len(kinds))
            print(file=sys.stderr)
    except PermissionError as e:
        return {"trials": 0, "violations": 0, "skipped": str(e), "rows": [], "violated": []}
    return {"trials": len(rows), "violations": len(violations), "need_bytes": need,
            "failed_pulls": sum(r["pull_exit"] != 0 for r in rows), "violated": violations, "rows": rows}
