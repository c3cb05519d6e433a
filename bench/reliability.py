"""Reliability campaigns (issue: reliability campaign). Writes bench/results/reliability.json and .png.

Campaign 1, kill-anywhere publish, on a local store and on a real S3-protocol server (moto's server mode on
loopback). A real deployment is compiled, profiled and planned here twice: revision content A (tiny_cnn) and
content B (tiny_cnn and spatial_chain, so that B brings blobs A lacks). Each trial is an independent run of
the publisher in its own process (forked from this one after the bundles are built: ``bundle.publish.publish``
on a store the child opens), over a fresh store (key prefix) that is either empty ("first": B is the first
revision) or holds A as revision 1 ("next": B becomes revision 2). The publisher is SIGKILLed
- at a call boundary: just before its Nth store call (the store layer's fault hook, ``EDGEPLAN_STORE_KILL_AT``),
  for every N from 1 to the calls a whole publish makes; or
- at a uniformly random time in [0, the publish's measured duration], the rest of the trials.
Then the promise is judged without edgeplan's own reading code (plain file reads or boto3, the ed25519
signatures checked with ``cryptography`` over the canonical JSON, every blob hashed):
- ``latest`` names a complete, verifiable revision (signed pointer, manifest with the sha256 it names, signed,
  every blob present with its size and sha256), or is absent on a first publish, or still names A;
- a rerun (not killed) completes, ``latest`` names B, and it uploads exactly the bytes the store lacked
  before it (counted by the judge: the distinct blobs of B that were missing).

Keys: publish_kill_trials (trials over both stores), publish_kill_violations (trials that broke a promise, each
listed with its seed and what broke), and per store: trials, violations, boundary and random-time trials, the
store calls of one publish, its duration.

`--trials N` random-time trials per store and kind (default 70: with the boundary trials, over 200 per store);
`--quick` 3 (the test suite runs a subset through ``run_trials``).
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, publish, pyplot

REPO = Path(__file__).resolve().parents[1]
EDGEPLAN = [sys.executable, "-m", "edgeplan.cli"]
DEPLOYMENT = "solo"
CLASS = "coral-usb-emulated"
DEVICE = "edge-7"


# ---------------------------------------------------------------------------------------------- the deployment
def _run(cmd: list[str], env: dict) -> None:
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{' '.join(cmd[3:6])} failed: {' | '.join(tail)}")


def _params(models: list[str]) -> dict:
    from edgeplan.pipeline import params as params_mod

    p = params_mod.load(None)
    p["deployments"] = [{"name": DEPLOYMENT, "device_class": CLASS,
                         "models": [{"name": m, "version": "1", "rate": 20.0} for m in models]}]
    p["fleet"]["devices"] = [{"id": DEVICE, "device_class": CLASS, "deployment": DEPLOYMENT, "work_pool": CLASS}]
    return p


def bundles(work: Path) -> tuple[dict, dict]:
    """Bundles A and B of deployment ``solo`` (compiled, profiled and planned by the CLI in child processes, so
    that this process, which forks the publishers, never imports TensorFlow), and the params of B."""
    import yaml

    from edgeplan.bundle.build import build

    arts = work / "artifacts"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    for zoo in ("tiny_cnn", "spatial_chain"):
        d = arts / zoo / "1"
        if not (d / "verify.json").is_file():
            _run([*EDGEPLAN, "compile", f"zoo:{zoo}", "--name", zoo, "--version", "1", "--out", str(arts)], env)
        if not (d / "profiles" / f"{CLASS}.json").is_file():
            _run([*EDGEPLAN, "profile", "run", str(d), "--device-class", CLASS, "--repeats", "3", "--budget-s", "1"],
                 env)
    out = {}
    for label, models in (("A", ["tiny_cnn"]), ("B", ["tiny_cnn", "spatial_chain"])):
        p = _params(models)
        path = work / f"params_{label}.yaml"
        path.write_text(yaml.safe_dump(p))
        _run([*EDGEPLAN, "--params", str(path), "plan", "swapless", "--deployment", DEPLOYMENT, "--out", str(arts)],
             env)
        out[label] = build(arts, DEPLOYMENT, p)
    return out, _params(["tiny_cnn", "spatial_chain"])


# ---------------------------------------------------------------------------------------------- the judge
class Reader:
    """Plain reads of a store's objects: files under a directory, or boto3 against the S3 server."""

    def __init__(self, uri: str, endpoint: str | None):
        self.uri = uri
        if uri.startswith("s3://"):
            import boto3

            bucket, _, prefix = uri[len("s3://"):].partition("/")
            self.s3, self.bucket, self.prefix = boto3.client("s3", endpoint_url=endpoint), bucket, prefix
        else:
            self.s3, self.root = None, Path(uri)

    def get(self, key: str) -> bytes | None:
        if self.s3 is None:
            path = self.root / key
            return path.read_bytes() if path.is_file() else None
        try:
            return self.s3.get_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}")["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return None


def _signed(doc: dict, public) -> bool:
    """The ed25519 signature over the canonical JSON (sorted keys, no whitespace) of ``doc`` without it."""
    from cryptography.exceptions import InvalidSignature

    rest = {k: v for k, v in doc.items() if k != "signature"}
    payload = json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    try:
        public.verify(base64.b64decode(doc["signature"]), payload)
    except (InvalidSignature, KeyError, ValueError, TypeError):
        return False
    return True


def judge(reader: Reader, public) -> tuple[int | None, list[str]]:
    """(revision ``latest`` names or None when absent, what is wrong with it)."""
    raw = reader.get(f"deployments/{DEPLOYMENT}/latest")
    if raw is None:
        return None, []
    try:
        latest = json.loads(raw)
    except ValueError:
        return -1, ["latest is not JSON"]
    if not _signed(latest, public):
        return -1, ["latest's signature does not verify"]
    rev = latest.get("revision")
    mraw = reader.get(f"deployments/{DEPLOYMENT}/{rev}/manifest.json")
    if mraw is None:
        return rev, [f"latest names revision {rev}, whose manifest is absent"]
    if hashlib.sha256(mraw).hexdigest() != latest.get("manifest_sha256"):
        return rev, [f"revision {rev}'s manifest is not the one latest names"]
    manifest = json.loads(mraw)
    if not _signed(manifest, public):
        return rev, [f"revision {rev}'s manifest signature does not verify"]
    wrong = []
    for b in manifest.get("blobs", []):
        data = reader.get(f"blobs/sha256/{b['sha256']}")
        if data is None:
            wrong.append(f"blob {b['name']} absent")
        elif len(data) != b["size"] or hashlib.sha256(data).hexdigest() != b["sha256"]:
            wrong.append(f"blob {b['name']} differs from the manifest")
    return rev, wrong


def missing_bytes(reader: Reader, bundle) -> int:
    """Bytes of ``bundle``'s distinct blobs the store lacks."""
    return sum(r.size for r in {r.sha256: r for r in bundle.refs}.values()
               if reader.get(f"blobs/sha256/{r.sha256}") is None)


# ---------------------------------------------------------------------------------------------- the publisher
def publisher(uri: str, endpoint: str | None, bundle, key_path: Path, params: dict, kill_at: int | None,
              report: Path) -> int:
    """Fork a publisher of ``bundle`` to ``uri``; its pid. It writes its result (and its store calls) to
    ``report`` when it finishes."""
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: nothing of the parent's store clients, its own store
        from edgeplan.bundle import keys
        from edgeplan.bundle.publish import publish as publish_bundle
        from edgeplan.profile import fleet
        from edgeplan.store import KILL_AT_ENV, faults, open_store

        if kill_at is not None:
            os.environ[KILL_AT_ENV] = str(kill_at)

        store = open_store(uri, **({"endpoint_url": endpoint} if endpoint else {}))
        devices = [d for d in fleet.load(params, {DEPLOYMENT}).devices if d.deployment == DEPLOYMENT]
        r = publish_bundle(store, bundle, keys.load_signing_key(key_path), devices=devices)
        report.write_text(json.dumps({"revision": r.revision, "uploaded_bytes": r.uploaded_bytes,
                                      "calls": faults.calls()}))
        os._exit(0)
    except BaseException as e:  # noqa: BLE001 (a forked child must never return into the harness) say why, go
        report.write_text(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        os._exit(1)


def _wait(pid: int, limit_s: float = 120.0) -> int:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.002)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise RuntimeError(f"publisher {pid} did not finish in {limit_s:.0f} s")


def run_trials(store_kind: str, base_uri: str, endpoint: str | None, bundles_: dict, key_path: Path,
               public, params: dict, trials: int, seed: int, work: Path, kinds=("first", "next")) -> dict:
    """Every call boundary of a first and of a next publish, then ``trials`` random-time kills of each kind
    (``kinds``: "first" alone needs no bundle A)."""
    rng = random.Random(seed)
    counter = [0]

    def fresh(kind: str) -> str:  # a store no other trial touched, holding A as revision 1 for "next"
        counter[0] += 1
        uri = f"{base_uri}/t{counter[0]:05d}" if store_kind == "s3" else str(Path(base_uri) / f"t{counter[0]:05d}")
        if kind == "next":
            status = _wait(publisher(uri, endpoint, bundles_["A"], key_path, params, None, work / "report.json"))
            if status != 0:
                raise RuntimeError(f"publishing A to {uri} failed: {(work / 'report.json').read_text()}")
        return uri

    def publish_b(uri: str, kill_at: int | None = None, after_s: float | None = None) -> dict | None:
        report = work / "report.json"
        report.unlink(missing_ok=True)
        t0 = time.perf_counter()
        pid = publisher(uri, endpoint, bundles_["B"], key_path, params, kill_at, report)
        if after_s is not None:
            time.sleep(max(0.0, after_s - (time.perf_counter() - t0)))
            os.kill(pid, signal.SIGKILL)
        status = _wait(pid)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            return {**json.loads(report.read_text()), "seconds": time.perf_counter() - t0}
        return None

    # one whole publish of each kind: its store calls and duration
    full = {}
    for kind in kinds:
        runs = [publish_b(fresh(kind), kill_at=10**9) for _ in range(3)]
        if any(r is None for r in runs):
            raise RuntimeError(f"an unkilled {kind} publish to {store_kind} failed")
        full[kind] = {"calls": runs[0]["calls"], "seconds": sorted(r["seconds"] for r in runs)[1]}
    plan = [(kind, "boundary", n) for kind in kinds for n in range(1, full[kind]["calls"] + 1)]
    plan += [(kind, "random", rng.uniform(0, full[kind]["seconds"])) for kind in kinds for _ in range(trials)]
    rows, violations = [], []
    for i, (kind, how, at) in enumerate(plan):
        uri = fresh(kind)
        before = judge(Reader(uri, endpoint), public)[0]
        finished = publish_b(uri, kill_at=at if how == "boundary" else None,
                             after_s=at if how == "random" else None)
        reader = Reader(uri, endpoint)
        rev, wrong = judge(reader, public)
        broke = [f"after the kill: {w}" for w in wrong]
        allowed = {None, 1} if kind == "first" else {1, 2}
        if rev not in allowed:
            broke.append(f"after the kill latest names {rev} (allowed: {sorted(allowed, key=str)})")
        lacking = missing_bytes(reader, bundles_["B"])
        again = publish_b(uri)
        rev2, wrong2 = judge(Reader(uri, endpoint), public)
        want = 1 if kind == "first" else 2
        if again is None:
            broke.append("the rerun failed")
        else:
            if again["uploaded_bytes"] != lacking:
                broke.append(f"the rerun uploaded {again['uploaded_bytes']} B; the store lacked {lacking} B")
        broke += [f"after the rerun: {w}" for w in wrong2]
        if rev2 != want:
            broke.append(f"after the rerun latest names {rev2}, not {want}")
        row = {"trial": i, "seed": seed, "store": store_kind, "kind": kind, "kill": how,
               "at": at if how == "boundary" else round(at, 6), "latest_before": before, "killed": finished is None,
               "latest_after_kill": rev, "lacking_bytes": lacking, "violations": broke}
        rows.append(row)
        if broke:
            violations.append(row)
    return {"trials": len(rows), "violations": len(violations), "boundary_trials": sum(r["kill"] == "boundary"
                                                                                      for r in rows),
            "random_trials": sum(r["kill"] == "random" for r in rows),
            "killed": sum(r["killed"] for r in rows), "publish": full, "violated": violations, "rows": rows}


# ---------------------------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, help="random-time trials per store and kind (default 70; --quick 3)")
    ap.add_argument("--quick", action="store_true", help="3 random-time trials per store and kind")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--work", type=Path, default=REPO / ".edgeplan" / "bench" / "reliability",
                    help="compiled models are kept here between runs")
    args = ap.parse_args()
    trials = args.trials if args.trials is not None else (3 if args.quick else 70)
    from edgeplan.bundle import keys
    from edgeplan.store.moto_server import moto_server

    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    built, params = bundles(args.work)
    key_dir = args.work / "keys"
    if not key_dir.is_dir():
        keys.generate(key_dir)
    key_path = next(key_dir.glob("*.key"))
    public = keys.load_signing_key(key_path).public
    result: dict = {"machine": machine(), "quick": args.quick, "seed": args.seed, "stores": {}}
    scratch = Path(tempfile.mkdtemp(prefix="edgeplan-reliability-"))
    try:
        print("[reliability] publish kills, local store ...", flush=True)
        result["stores"]["local"] = run_trials("local", str(scratch / "store"), None, built, key_path, public,
                                               params, trials, args.seed, scratch)
        print("[reliability] publish kills, S3 (moto server) ...", flush=True)
        with moto_server(log=scratch / "moto.log") as server:
            result["stores"]["s3"] = run_trials("s3", "s3://edgeplan/reliability", server.url, built, key_path,
                                                public, params, trials, args.seed + 1, scratch)
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    stores = result["stores"].values()
    result["publish_kill_trials"] = sum(s["trials"] for s in stores)
    result["publish_kill_violations"] = sum(s["violations"] for s in stores)
    result["publish_kill_violated"] = [v for s in stores for v in s["violated"]]
    result["duration_s"] = time.perf_counter() - t0
    for name, s in result["stores"].items():
        print(f"[reliability] {name}: {s['trials']} trials ({s['boundary_trials']} at call boundaries, "
              f"{s['random_trials']} at random times, {s['killed']} killed before finishing), "
              f"{s['violations']} violations", flush=True)
    publish("reliability", result, plot, ("publish_kill_trials", "publish_kill_violations"))
    return 0


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(result["stores"]), figsize=(6 * len(result["stores"]), 4), squeeze=False)
    for ax, (name, s) in zip(axes[0], result["stores"].items()):
        for kind, colour in (("first", "tab:blue"), ("next", "tab:orange")):
            rows = [r for r in s["rows"] if r["kind"] == kind and r["kill"] == "boundary"]
            ax.scatter([r["at"] for r in rows], [0 if r["latest_after_kill"] is None else r["latest_after_kill"]
                                                 for r in rows], c=colour, label=f"{kind}: latest after the kill")
        bad = [r for r in s["rows"] if r["violations"]]
        ax.set_xlabel("killed before store call N")
        ax.set_ylabel("revision latest names (0: none)")
        ax.set_yticks([0, 1, 2])
        ax.set_title(f"{name}: {s['trials']} trials, {len(bad)} violations")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
