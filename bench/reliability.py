"""Reliability campaigns (issue: reliability campaign). Writes bench/results/reliability.json and .png.

Campaign 1, kill-anywhere publish, on a local store and on a real S3-protocol server (moto's server mode on
loopback). A real deployment is compiled, profiled and planned here twice: revision content A (tiny_cnn) and
content B (tiny_cnn and spatial_chain, so that B brings blobs A lacks). Each trial is an independent run of
the publisher in its own process (forked from this one after the bundles are built: ``bundle.publish.publish``
on a store the child opens), over a fresh store (key prefix) that is either empty ("first": B is the first
revision) or holds A as revision 1 ("next": B becomes revision 2). The publisher is SIGKILLed
- at a call boundary: just before its Nth store call (the store layer's fault hook, ``EDGEPLAN_KILL_AT``),
  for every N from 1 to the calls a whole publish makes; or
- at a uniformly random time in [0, the publish's measured duration], the rest of the trials.
Then the promise is judged without edgeplan's own reading code (plain file reads or boto3, the ed25519
signatures checked with ``cryptography`` over the canonical JSON, every blob hashed):
- ``latest`` names a complete, verifiable revision (signed pointer, manifest with the sha256 it names, signed,
  every blob present with its size and sha256), or is absent on a first publish, or still names A;
- a rerun (not killed) completes, ``latest`` names B, and it uploads exactly the bytes the store lacked
  before it (counted by the judge: the distinct blobs of B that were missing).

Campaign 2, kill-anywhere pull and activation, and a full disk mid-pull: bench/_pull_kills.py (its docstring
says how trials run and are judged). Campaign 3, bundle fuzzing: bench/_bundle_fuzz.py. Campaign 4, model
fuzzing (``edgeplan compile``, and each kind once through ``edgeplan run``): bench/_model_fuzz.py. Campaign 6,
store faults: bench/_store_faults.py (the proxy: bench/_proxy.py). Campaign 7, flow faults: bench/_flow_faults.py.
Campaign 5, its bad requests: bench/_bad_requests.py; its overload (campaign "overload"): bench/_overload.py. The
accuracy gate: ``accuracy_campaign`` below.

Keys: duration_s (the last whole run: at most 60 min without flags; duration_commit), campaign_seconds (each campaign's wall time, the
shared compiles and publishes under "setup"); publish_kill_trials (trials over both stores), publish_kill_violations (trials that broke a promise, each
listed with its seed and what broke), and per store: trials, violations, boundary and random-time trials, the
store calls of one publish, its duration; pull_kill_trials, pull_kill_violations, disk_full_trials,
disk_full_violations (with every trial under "pull" and "disk_full"); bundle_mutations,
bundle_accepted_mutations, bundle_tracebacks, bundle_unexpected_failures (refusals by the CLI's last-resort
handler: a bug said in one line), bundle_violations (with every mutation under "bundle"); bad_requests,
bad_request_5xx, bad_request_unanswered, bad_request_crashes, bad_request_good_failures,
bad_request_rss_growth_mb, bad_request_violations (with every request under "requests"); overload_p99_over_predicted
(accepted requests' p99, timed by the client, over the plan's predicted latency: the promise is <= 2),
overload_p99_server_over_predicted (the server's Server-Timing), overload_rss_growth_mb, overload_crashes,
overload_capacity_rps, overload_offered_rps, overload_goodput_over_capacity, overload_refused_fraction,
overload_other_answers (neither 200 nor a 503 with Retry-After), overload_violations (the run under "overload",
with 10 s windows and the RSS samples); model_inputs_tried,
model_tracebacks, model_collateral_damage, model_violations (compile and run together; model_inputs_tried_compile
and _run apart; every input under "models" and "models_run", with its kind, exit status and error line);
store_fault_trials, store_fault_violations (every trial under "store_faults", with its operation, fault, exit status,
time past the fault's end and last line); flow_fault_trials, flow_fault_violations (every trial under
"flow_faults", with its kind, when the fault landed, the tasks done by then, exits and conversions); accuracy_float_top1, accuracy_int8_top1_min (digits_cnn, default calibration, the worst
point), accuracy_int8_top1_min_broken_calibration, accuracy_gate_trips_on_bad_calibration (both runs under
"accuracy").

`--trials N` random-time publish kills per store and kind (default 70: with the boundary trials, over 200 per
store); `--pull-trials` random-time pull kills per kind (default 60, beside ~400 step boundaries);
`--disk-trials` full-disk pulls per kind (default 12); `--mutations` (default 1000); `--quick` a few of each
(the test suite runs subsets through ``run_trials``, ``run_pull_trials``, ``run_disk_full``, ``run_fuzz``).
`--bad-requests` (default 400). `--models` (default 300; and each of the 27 kinds once through ``edgeplan run``).
`--store-trials` per operation and fault (default 2: 32, and 4 with the store down for good). `--flow-trials` per
flow fault (default 6: 18). `--overload-seconds` (default 600; --quick 20).
`--campaigns publish,pull,...` runs some and keeps the
others' figures from the results file.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, machine, publish, pyplot
from _faults import DEPLOYMENT, REPO, bundles, publisher, signed, wait


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


def judge(reader: Reader, public, deployment: str = DEPLOYMENT) -> tuple[int | None, list[str]]:
    """(revision ``latest`` names or None when absent, what is wrong with it)."""
    raw = reader.get(f"deployments/{deployment}/latest")
    if raw is None:
        return None, []
    try:
        latest = json.loads(raw)
    except ValueError:
        return -1, ["latest is not JSON"]
    if not signed(latest, public):
        return -1, ["latest's signature does not verify"]
    rev = latest.get("revision")
    mraw = reader.get(f"deployments/{deployment}/{rev}/manifest.json")
    if mraw is None:
        return rev, [f"latest names revision {rev}, whose manifest is absent"]
    if hashlib.sha256(mraw).hexdigest() != latest.get("manifest_sha256"):
        return rev, [f"revision {rev}'s manifest is not the one latest names"]
    manifest = json.loads(mraw)
    if not signed(manifest, public):
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
            status = wait(publisher(uri, endpoint, bundles_["A"], key_path, params, None, work / "report.json"))
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
        status = wait(pid)
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
CAMPAIGNS = ("publish", "pull", "bundle", "models", "requests", "overload", "store", "flow", "accuracy")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, help="random-time trials per store and kind (default 70; --quick 3)")
    ap.add_argument("--pull-trials", type=int, help="random-time pull kills per kind (default 60; --quick 3)")
    ap.add_argument("--disk-trials", type=int, help="full-disk pulls per kind (default 12; --quick 3)")
    ap.add_argument("--mutations", type=int, help="bundle mutations (default 1000; --quick 30)")
    ap.add_argument("--bad-requests", type=int, help="malformed HTTP requests (default 400; --quick 40)")
    ap.add_argument("--models", type=int, help="broken models to edgeplan compile (default 300; --quick 26)")
    ap.add_argument("--store-trials", type=int, help="store-fault trials per operation and fault (default 2; --quick 1)")
    ap.add_argument("--flow-trials", type=int, help="flow-fault trials per kind (default 6; --quick 1)")
    ap.add_argument("--overload-seconds", type=float, help="open-loop load at 2x capacity (default 600; --quick 20)")
    ap.add_argument("--quick", action="store_true", help="3 random-time trials per store and kind")
    ap.add_argument("--campaigns", default=",".join(CAMPAIGNS),
                    help=f"comma-separated, of {', '.join(CAMPAIGNS)} (default all); the others' figures are kept "
                         "from the results file")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--work", type=Path, default=REPO / ".edgeplan" / "bench" / "reliability",
                    help="compiled models are kept here between runs")
    args = ap.parse_args()
    chosen = [c.strip() for c in args.campaigns.split(",") if c.strip()]
    if unknown := sorted(set(chosen) - set(CAMPAIGNS)):
        ap.error(f"unknown campaign(s) {', '.join(unknown)}; choose from {', '.join(CAMPAIGNS)}")
    quick = 3 if args.quick else None
    from edgeplan.bundle import keys

    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    built, params = bundles(args.work)
    key_dir = args.work / "keys"
    if not key_dir.is_dir():
        keys.generate(key_dir)
    key_path = next(key_dir.glob("*.key"))
    public = keys.load_signing_key(key_path).public
    old = RESULTS / "reliability.json"
    result = json.loads(old.read_text()) if set(chosen) != set(CAMPAIGNS) and old.is_file() else {}
    result.update({"machine": machine(), "quick": args.quick, "seed": args.seed})
    scratch = Path(tempfile.mkdtemp(prefix="edgeplan-reliability-"))
    took = result.setdefault("campaign_seconds", {})  # each campaign's wall time, its setup included
    took["setup"] = time.perf_counter() - t0

    def run(name: str, campaign) -> None:
        if name in chosen:
            t = time.perf_counter()
            result.update(campaign())
            took[name] = time.perf_counter() - t

    try:
        trials = args.trials if args.trials is not None else (quick or 70)
        run("publish", lambda: publish_campaign(built, key_path, public, params, trials, args.seed, scratch))
        if {"pull", "bundle", "requests"} & set(chosen):
            import _pull_kills

            t = time.perf_counter()
            setup = _pull_kills.prepare(scratch, built, key_path, params, public)
            took["setup"] += time.perf_counter() - t
        run("pull", lambda: pull_campaign(setup, args, quick, scratch))
        run("bundle", lambda: bundle_campaign(setup, keys.load_signing_key(key_path).key, args, quick, scratch))
        run("requests", lambda: requests_campaign(setup, args, quick, scratch))
        run("overload", lambda: overload_campaign(args, quick, scratch))
        run("models", lambda: models_campaign(args, quick, scratch))
        run("store", lambda: store_campaign(built, key_path, public, params, args, quick, scratch))
        run("flow", lambda: flow_campaign(args, quick, scratch))
        run("accuracy", lambda: accuracy_campaign(args, scratch))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if set(chosen) == set(CAMPAIGNS):  # a part run keeps the whole run's duration
        result.update(duration_s=time.perf_counter() - t0, duration_commit=machine()["commit"])
    publish("reliability", result, plot, ("publish_kill_trials", "publish_kill_violations", "pull_kill_trials",
                                          "pull_kill_violations", "disk_full_trials", "disk_full_violations",
                                          "bundle_mutations", "bundle_accepted_mutations", "bundle_tracebacks",
                                          "bad_requests", "bad_request_5xx", "bad_request_crashes",
                                          "overload_p99_over_predicted", "overload_rss_growth_mb", "overload_crashes",
                                          "model_inputs_tried", "model_tracebacks", "model_collateral_damage",
                                          "store_fault_trials", "store_fault_violations", "flow_fault_trials",
                                          "flow_fault_violations",
                                          "accuracy_float_top1", "accuracy_int8_top1_min",
                                          "accuracy_gate_trips_on_bad_calibration"))
    return 0


def publish_campaign(built, key_path, public, params, trials, seed, scratch) -> dict:
    from edgeplan.store.moto_server import moto_server

    out: dict = {"stores": {}}
    print("[reliability] publish kills, local store ...", flush=True)
    out["stores"]["local"] = run_trials("local", str(scratch / "store"), None, built, key_path, public, params,
                                        trials, seed, scratch)
    print("[reliability] publish kills, S3 (moto server) ...", flush=True)
    with moto_server(log=scratch / "moto.log") as server:
        out["stores"]["s3"] = run_trials("s3", "s3://edgeplan/reliability", server.url, built, key_path, public,
                                         params, trials, seed + 1, scratch)
    stores = out["stores"].values()
    for name, s in out["stores"].items():
        print(f"[reliability] {name}: {s['trials']} trials ({s['boundary_trials']} at call boundaries, "
              f"{s['random_trials']} at random times, {s['killed']} killed before finishing), "
              f"{s['violations']} violations", flush=True)
    return {**out, "publish_kill_trials": sum(s["trials"] for s in stores),
            "publish_kill_violations": sum(s["violations"] for s in stores),
            "publish_kill_violated": [v for s in stores for v in s["violated"]], "publish_commit": machine()["commit"]}


def pull_campaign(setup, args, quick, scratch) -> dict:
    import _pull_kills

    print("[reliability] pull kills ...", flush=True)
    pull = _pull_kills.run_pull_trials(setup, args.pull_trials if args.pull_trials is not None else (quick or 60),
                                       args.seed + 2, scratch)
    print(f"[reliability] pull: {pull['trials']} trials ({pull['boundary_trials']} at step boundaries, "
          f"{pull['random_trials']} at random times, {pull['killed']} killed), {pull['violations']} violations",
          flush=True)
    disk = _pull_kills.run_disk_full(setup, args.disk_trials if args.disk_trials is not None else (quick or 12),
                                     scratch)
    print(f"[reliability] full disk: {disk['trials']} trials, {disk.get('failed_pulls', 0)} pulls failed for "
          f"space, {disk['violations']} violations {disk.get('skipped', '')}", flush=True)
    return {"pull": pull, "disk_full": disk, "pull_kill_trials": pull["trials"],
            "pull_kill_violations": pull["violations"], "disk_full_trials": disk["trials"],
            "disk_full_violations": disk["violations"], "pull_commit": machine()["commit"]}


def bundle_campaign(setup, private, args, quick, scratch) -> dict:
    import _bundle_fuzz

    pristine = json.loads((Path(setup.store) / f"deployments/{DEPLOYMENT}/2/manifest.json").read_bytes())
    fuzz = _bundle_fuzz.run_fuzz(setup, pristine, private, args.mutations or (30 if quick else 1000),
                                 args.seed + 3, scratch)
    print(f"[reliability] bundle fuzzing: {fuzz['mutations']} mutations, {fuzz['refused']} refused, "
          f"{fuzz['activated_as_published']} activated as published, {fuzz['accepted']} accepted mutated, "
          f"{fuzz['tracebacks']} tracebacks, {fuzz['unexpected']} unexpected failures; {fuzz['violations']} "
          "violations", flush=True)
    return {"bundle": fuzz, "bundle_mutations": fuzz["mutations"], "bundle_accepted_mutations": fuzz["accepted"],
            "bundle_tracebacks": fuzz["tracebacks"], "bundle_unexpected_failures": fuzz["unexpected"],
            "bundle_violations": fuzz["violations"], "bundle_commit": machine()["commit"]}


def requests_campaign(setup, args, quick, scratch) -> dict:
    import _bad_requests

    dest = scratch / "serving"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(setup.template, dest, symlinks=True)
    manifest = json.loads((dest / "current" / "manifest.json").read_text())
    entry = manifest["models"][0]
    r = _bad_requests.run_bad_requests(dest, setup.env, entry["name"], entry["input"]["float_shape"],
                                       args.bad_requests or (40 if quick else 400), args.seed + 4, scratch)
    print(f"[reliability] bad requests: {r['sent']} sent, {r['five_xx']} answered 5xx, {r['unanswered']} "
          f"unanswered, {r['good_failed']} good requests failed, server {'died' if r['crashed'] else 'alive'}, "
          f"RSS {r['rss_mb'][0]:.0f} -> {r['rss_mb'][1]:.0f} MB; {r['violations']} violations", flush=True)
    return {"requests": r, "bad_requests": r["sent"], "bad_request_5xx": r["five_xx"],
            "bad_request_unanswered": r["unanswered"], "bad_request_crashes": int(r["crashed"]),
            "bad_request_good_failures": r["good_failed"], "bad_request_rss_growth_mb": r["rss_growth_mb"],
            "bad_request_violations": r["violations"], "requests_commit": machine()["commit"]}


def overload_campaign(args, quick, scratch) -> dict:
    import _overload

    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3", "EDGEPLAN_ACCELERATOR": "none"}
    seconds = args.overload_seconds or (20.0 if quick else 600.0)
    r = _overload.run_overload(args.work, scratch, env, seconds, args.seed + 8)
    print(f"[reliability] overload: {r['sent']} requests in {seconds:g} s at {r['offered_rps']:.1f}/s (2x capacity "
          f"{r['capacity_rps']:.1f}/s): {r['accepted']} served (p99 {r['p99_ms']:.1f} ms, client; plan "
          f"{r['predicted_ms']:.2f} ms), {r['refused_503']} refused 503, {r['other_answers']} other answers; RSS "
          f"+{r['rss_growth_mb']:.1f} MB; server {'died' if r['crashed'] else 'alive'}; "
          f"{len(r['violations'])} violations", flush=True)
    return {"overload": r, "overload_p99_over_predicted": r["p99_ms"] / r["predicted_ms"],
            "overload_p99_server_over_predicted": r["p99_server_ms"] / r["predicted_ms"],
            "overload_rss_growth_mb": r["rss_growth_mb"], "overload_crashes": int(r["crashed"]),
            "overload_capacity_rps": r["capacity_rps"], "overload_offered_rps": r["offered_rps"],
            "overload_goodput_over_capacity": r["goodput_rps"] / r["capacity_rps"],
            "overload_refused_fraction": r["refused_503"] / r["sent"],
            "overload_other_answers": r["other_answers"] + r["bad_refusals"],
            "overload_violations": len(r["violations"]), "overload_commit": machine()["commit"]}


def models_campaign(args, quick, scratch) -> dict:
    import _model_fuzz

    arts = scratch / "model-fuzz-artifacts"  # other models' and versions' results, which must survive
    shutil.rmtree(arts, ignore_errors=True)
    for zoo in ("tiny_cnn", "spatial_chain"):
        shutil.copytree(args.work / "artifacts" / zoo / "1", arts / zoo / "1")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    keras_path = _model_fuzz.small_keras(args.work / "small.keras", env)
    r = _model_fuzz.run_model_fuzz(arts / "tiny_cnn" / "1" / "model.onnx", keras_path, arts, env,
                                   args.models or (26 if quick else 300), args.seed + 5, scratch)
    print(f"[reliability] model fuzzing, edgeplan compile: {r['tried']} broken models, {r['accepted']} compiled "
          f"anyway, {r['tracebacks']} tracebacks, {r['collateral_damage']} with collateral damage; {r['violations']} "
          "violations", flush=True)
    flow = scratch / "model-fuzz-run"  # edgeplan run: the whole flow, its local Prefect server here
    flow.mkdir(exist_ok=True)
    f = _model_fuzz.run_model_fuzz(arts / "tiny_cnn" / "1" / "model.onnx", keras_path, arts, env,
                                   len(_model_fuzz.KINDS) if not quick else 4, args.seed + 7, flow, command="run")
    print(f"[reliability] model fuzzing, edgeplan run: {f['tried']} broken models, {f['accepted']} ran through, "
          f"{f['tracebacks']} tracebacks, {f['collateral_damage']} with collateral damage; {f['violations']} "
          "violations", flush=True)
    return {"models": r, "models_run": f, "model_inputs_tried": r["tried"] + f["tried"],
            "model_inputs_tried_compile": r["tried"], "model_inputs_tried_run": f["tried"],
            "model_tracebacks": r["tracebacks"] + f["tracebacks"],
            "model_collateral_damage": r["collateral_damage"] + f["collateral_damage"],
            "model_violations": r["violations"] + f["violations"], "models_commit": machine()["commit"]}


def store_campaign(built, key_path, public, params, args, quick, scratch) -> dict:
    import _store_faults

    work = scratch / "store-faults"
    work.mkdir(parents=True, exist_ok=True)
    print("[reliability] store faults (moto S3 server behind a fault-injecting proxy) ...", flush=True)
    with _store_faults.started(work, args.work / "artifacts", params, built, key_path, public, args.seed + 6) as c:
        r = _store_faults.run_store_faults(c, args.store_trials or (1 if quick else 2), args.seed + 6)
    print(f"[reliability] store faults: {r['trials']} trials, {r['failed']} operations failed (clearly or not), "
          f"latest end {r['max_after_fault_s']:.1f} s after a fault; down for good, gave up after "
          f"{', '.join(f'{op} {s:.1f} s' for op, s in r['down_give_up_s'].items())}; {r['violations']} violations",
          flush=True)
    return {"store_faults": r, "store_fault_trials": r["trials"], "store_fault_violations": r["violations"],
            "store_commit": machine()["commit"]}


def flow_campaign(args, quick, scratch) -> dict:
    import _flow_faults

    work = scratch / "flow-faults"
    work.mkdir(parents=True, exist_ok=True)
    print("[reliability] flow faults (edgeplan run; Prefect server, Dask cluster) ...", flush=True)
    with _flow_faults.started(work) as c:
        r = _flow_faults.run_flow_faults(c, args.flow_trials or (1 if quick else 6), args.seed + 7)
    kinds = ", ".join(f"{k} {v['trials']} ({v['resumed_by_rerun']} resumed by a rerun)" for k, v in r["by_kind"].items())
    print(f"[reliability] flow faults: {r['trials']} trials: {kinds}; at most {r['conversions_max']} conversion per "
          f"trial; {r['violations']} violations", flush=True)
    return {"flow_faults": r, "flow_fault_trials": r["trials"], "flow_fault_violations": r["violations"],
            "flow_commit": machine()["commit"]}


BROKEN_CALIBRATION = {"kind": "random", "low": 0.0, "high": 0.05, "samples": 64, "seed": 0}


def accuracy_campaign(args, scratch) -> dict:
    """The accuracy gate on a real trained model and real data: ``edgeplan compile zoo:digits_cnn`` (a CNN trained
    here on scikit-learn's digits, its held-out quarter as the labelled set) with the default calibration, then
    with a deliberately broken one (random inputs in [0, 0.05]; the scans reach 1.0). Judged from accuracy.json and
    the exit status."""
    import yaml

    runs = {}
    for tag, calibration in (("default", None), ("broken", BROKEN_CALIBRATION)):
        params = {"accuracy": {"dataset": "zoo:digits_cnn"}}
        if calibration:
            params["quantize"] = {"calibration": calibration}
        work = scratch / f"accuracy-{tag}"
        work.mkdir(parents=True, exist_ok=True)
        (work / "params.yaml").write_text(yaml.safe_dump(params))
        print(f"[reliability] accuracy gate: compiling digits_cnn with the {tag} calibration", flush=True)
        proc = subprocess.run([sys.executable, "-m", "edgeplan.cli", "compile", "zoo:digits_cnn", "--name",
                               "digits_cnn", "--version", "1", "--out", str(work / "artifacts")],
                              cwd=work, capture_output=True, text=True, timeout=1800, check=False)
        path = work / "artifacts" / "digits_cnn" / "1" / "accuracy.json"
        if not path.is_file():
            raise RuntimeError(f"{tag}: no accuracy.json (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
        doc = json.loads(path.read_text())
        runs[tag] = {"exit": proc.returncode, "calibration": calibration or "params.yaml default",
                     "last_line": (proc.stderr.strip().splitlines() or [""])[-1][:300],
                     "float_top1": doc["float_top1"], "samples": doc["samples"],
                     "max_top1_drop": doc["max_top1_drop"], "points": doc["points"]}
    good, bad = runs["default"], runs["broken"]
    trips = (bad["exit"] == 1 and not any(p["publishable"] for p in bad["points"]) and good["exit"] == 0
             and all(p["publishable"] for p in good["points"]))
    print(f"[reliability] accuracy gate: float top-1 {good['float_top1']:.4f}, int8 "
          f"{min(p['top1'] for p in good['points']):.4f}..{max(p['top1'] for p in good['points']):.4f}; broken "
          f"calibration {max(p['top1'] for p in bad['points']):.4f}: {'tripped' if trips else 'NOT tripped'}",
          flush=True)
    return {"accuracy": runs, "accuracy_float_top1": good["float_top1"],
            "accuracy_int8_top1_min": min(p["top1"] for p in good["points"]),
            "accuracy_int8_top1_min_broken_calibration": min(p["top1"] for p in bad["points"]),
            "accuracy_gate_trips_on_bad_calibration": trips, "accuracy_commit": machine()["commit"]}


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    panels = [(name, s) for name, s in result.get("stores", {}).items()] + ([("pull", result["pull"])]
                                                                            if "pull" in result else [])
    gate, store, over = result.get("accuracy"), result.get("store_faults"), result.get("overload")
    n = len(panels) + bool(gate) + bool(store) + bool(over)
    fig, axes = plt.subplots(1, n, figsize=(6 * n, 4), squeeze=False)
    for ax, (name, s) in zip(axes[0], panels):
        after = "current_after_kill" if name == "pull" else "latest_after_kill"
        for kind, colour in (("first", "tab:blue"), ("next", "tab:orange")):
            rows = [r for r in s["rows"] if r["kind"] == kind and r["kill"] == "boundary"]
            ax.scatter([r["at"] for r in rows], [0 if r[after] is None else r[after] for r in rows], c=colour,
                       label=f"{kind}: {after.split('_')[0]} after the kill")
        bad = [r for r in s["rows"] if r["violations"]]
        ax.set_xlabel(f"killed before {'step' if name == 'pull' else 'store call'} N")
        ax.set_ylabel(f"revision {after.split('_')[0]} names (0: none)")
        ax.set_yticks([0, 1, 2])
        ax.set_title(f"{'pull' if name == 'pull' else f'publish, {name}'}: {s['trials']} trials, {len(bad)} "
                     "violations")
        ax.legend(fontsize=8)
    if store:  # how long after its fault each operation ended, by operation and fault
        ax = axes[0][len(panels)]
        faults = list(store["by_fault"])
        for k, op in enumerate(sorted({r["op"] for r in store["rows"]})):
            rows = [r for r in store["rows"] if r["op"] == op]
            ax.scatter([faults.index(r["fault"]) + 0.15 * (k - 1.5) for r in rows],
                       [max(r["after_fault_s"], 0.01) for r in rows], label=op,
                       marker="x" if any(r["failed"] for r in rows if r["fault"] != "down") else "o")
        ax.set_xticks(range(len(faults)), faults)
        ax.set_yscale("log")
        ax.set_ylabel("s after the fault ended (down: after it began)")
        ax.set_title(f"store faults: {store['trials']} trials, {store['violations']} violations")
        ax.legend(fontsize=8)
    if over:  # offered and served rates, and the served requests' p99, over the run
        ax = axes[0][len(panels) + bool(store)]
        ws = over["windows"]
        t = [w["t"] + 5 for w in ws]
        ax.plot(t, [w["offered_rps"] for w in ws], c="tab:grey", label="offered req/s")
        ax.plot(t, [w["accepted_rps"] for w in ws], c="tab:green", label="served (200) req/s")
        ax.axhline(over["capacity_rps"], c="tab:green", ls=":", label="capacity (closed loop)")
        ax.set_xlabel("s into the overload")
        ax.set_ylabel("requests / s")
        ax.set_ylim(0, 1.2 * max(w["offered_rps"] for w in ws))
        ax.legend(fontsize=8, loc="center left")
        ax2 = ax.twinx()
        ax2.plot(t, [w["p99_ms"] for w in ws], c="tab:red", label="served p99 ms (client)")
        ax2.axhline(2 * over["predicted_ms"], c="tab:red", ls="--", label="2x the plan's prediction")
        ax2.set_ylabel("ms")
        ax2.set_ylim(0, 3 * over["predicted_ms"])
        ax2.legend(fontsize=8, loc="lower right")
        ax.set_title(f"overload: RSS +{over['rss_growth_mb']:.1f} MB, {len(over['violations'])} violations")
    if gate:  # float vs int8 top-1 per point, both calibrations
        ax = axes[0][-1]
        for tag, colour in (("default", "tab:green"), ("broken", "tab:red")):
            pts = gate[tag]["points"]
            ax.plot([p["point"] for p in pts], [p["top1"] for p in pts], "o-", c=colour,
                    label=f"int8 chain, {tag} calibration (exit {gate[tag]['exit']})")
        ax.axhline(gate["default"]["float_top1"], c="k", ls="--", label="float model")
        ax.axhline(gate["default"]["float_top1"] - gate["default"]["max_top1_drop"], c="grey", ls=":",
                   label="gate: float - max_top1_drop")
        ax.set_xlabel("partition point")
        ax.set_ylabel(f"top-1 on {gate['default']['samples']} held-out digits")
        ax.set_ylim(0, 1.02)
        ax.set_title("accuracy gate: digits_cnn")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
