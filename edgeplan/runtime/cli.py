"""``edgeplan-runtime``: the device side. pull / rollback / status / serve / loadgen / fifo / profile / mpi run.
Standard library, numpy, ai-edge-litert and cryptography only (boto3 for s3:// stores)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from edgeplan.errors import EdgeplanError

TRUSTED_ENV = "EDGEPLAN_TRUSTED_KEYS"


class Bar:
    """A one-line transfer counter on stderr (only on a terminal)."""

    def __init__(self, label: str):
        self.label, self.done, self.last = label, 0, 0.0
        self.tty = sys.stderr.isatty()

    def __call__(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.tty and now - self.last > 0.1:
            self.last = now
            sys.stderr.write(f"\r{self.label}: {self.done / 1e6:8.2f} MB fetched")
            sys.stderr.flush()

    def close(self) -> None:
        if self.tty and self.done:
            sys.stderr.write(f"\r{self.label}: {self.done / 1e6:8.2f} MB fetched\n")


def trusted(args) -> dict:
    from edgeplan.bundle.keys import load_trusted

    paths = args.trusted or [p for p in os.environ.get(TRUSTED_ENV, "").split(os.pathsep) if p]
    if not paths:
        raise EdgeplanError(f"no trusted public keys: pass --trusted DIR|FILE.pub (or set {TRUSTED_ENV}); a device "
                            "verifies every revision against the keys it was provisioned with")
    keys = load_trusted(paths)
    if not keys:
        raise EdgeplanError(f"no .pub key found in {', '.join(paths)}")
    return keys


def cmd_pull(args) -> int:
    from edgeplan.errors import StoreError
    from edgeplan.runtime import split
    from edgeplan.runtime.pull import active, pull
    from edgeplan.store import open_store

    store, keys = open_store(args.store), trusted(args)
    bar = Bar("pull")
    for attempt in range(args.retries + 1):
        try:
            res = pull(store, Path(args.dest), keys, device_id=args.device_id, deployment=args.deployment,
                       device_class=args.device_class, allow_older=args.allow_older,
                       health_check=not args.no_health_check, progress=bar)
            break
        except StoreError as e:
            held = active(Path(args.dest))
            still = f"; revision {held[1].revision} of {held[1].deployment} stays active" if held else ""
            if attempt == args.retries:
                raise EdgeplanError(f"pull failed after {attempt + 1} attempts: {e}{still}") from None
            print(f"store unreachable ({e}){still}; retrying in {args.retry_wait:.0f} s", file=sys.stderr)
            time.sleep(args.retry_wait)
    bar.close()
    if res.activated:
        share = split.read(res.path)
        held = "" if share is None else (f"; ranks {list(share.ranks)} of its {share.planner} split"
                                         f"{' (the head)' if share.head else ''}")
        print(f"activated {res.deployment} revision {res.revision} (previous: {res.previous}) in {res.path}: "
              f"{res.blobs} blobs{held}, {res.fetched_blobs} fetched ({res.fetched_bytes:,} bytes), health check "
              f"{'skipped' if args.no_health_check else 'passed'}")
    else:
        print(f"{res.deployment} revision {res.revision} is already active; nothing fetched")
    return 0


def cmd_rollback(args) -> int:
    from edgeplan.runtime.pull import rollback

    was, now = rollback(Path(args.dest))
    print(f"rolled back {was.deployment} from revision {was.revision} to revision {now.revision}")
    return 0


def cmd_status(args) -> int:
    from edgeplan.runtime import split
    from edgeplan.runtime.pull import active

    found = active(Path(args.dest))
    if found is None:
        print(f"{args.dest}: nothing pulled yet")
        return 1
    path, m = found
    prev = Path(args.dest) / "previous"
    share = split.read(path)
    print(json.dumps({"deployment": m.deployment, "revision": m.revision, "device_class": m.device_class,
                      "compiler": m.compiler, "path": str(path), "models": [f"{e.name}:{e.version}" for e in m.models],
                      "previous": str(prev.resolve()) if prev.is_symlink() else None,
                      "split": None if share is None else {"planner": share.planner, "ranks": list(share.ranks),
                                                           "head": share.head}}, indent=2))
    return 0


def _runtime(args):
    from edgeplan.runtime import split
    from edgeplan.runtime.engine import LATENCY_BUDGET, Runtime
    from edgeplan.runtime.pull import active

    held = active(Path(args.dir))
    share = split.read(held[0] if held else Path(args.dir))
    if share is not None and not share.head:
        raise EdgeplanError(f"{args.dir}: this device holds ranks {list(share.ranks)} of a multi-device split and "
                            "serves nothing itself; its head runs the job (`edgeplan-runtime mpi run`)")

    rates = dict(args.rate or [])  # argparse made them (model, rate) pairs already
    return Runtime(Path(args.dir), mode=args.mode, adapt=not args.no_adapt, window_s=args.window,
                   interval_s=args.interval, max_inflight=args.max_inflight, rates=rates or None,
                   parallax=not args.no_parallax,
                   latency_budget=LATENCY_BUDGET if args.latency_budget is None else args.latency_budget)


def _ready(args):
    """A started runtime for the active revision, prefix outputs of the input set computed ahead (with
    --stream: the models streamed as their FlashMem plans say)."""
    from edgeplan.runtime.model import load_inputs

    if getattr(args, "stream", None):
        from edgeplan.runtime.streaming import StreamRuntime

        return StreamRuntime(Path(args.dir), mode=args.stream, max_inflight=args.max_inflight).start()
    rt = _runtime(args)
    if rt.mode == "emulated":
        n = sum(rt.precompute(e.name, load_inputs(rt.rev_dir, e, args.inputs), points="all") for e in rt.manifest.models)
        print(f"computed {n} prefix outputs ahead for the EMULATED Edge TPU ({args.inputs} inputs per model)",
              file=sys.stderr)
    return rt.start()


def _puller(args, server) -> None:
    """Every --pull-every s: pull; a new revision is served once it is active (the old one drains); a store
    that is down is logged and retried next time while the active revision keeps serving."""
    from edgeplan.runtime.pull import pull
    from edgeplan.store import open_store

    keys = trusted(args)
    while True:
        time.sleep(args.pull_every)
        try:
            res = pull(open_store(args.store), Path(args.dir), keys, device_id=args.device_id,
                       deployment=args.deployment)
        except Exception as e:  # of any kind: the puller keeps going and the active revision keeps serving
            print(f"pull failed ({type(e).__name__}: {e}); still serving revision {server.current.rt.manifest.revision}", file=sys.stderr,
                  flush=True)
            continue
        if res.activated:
            server.current.swap(_ready(args))
            print(f"now serving {res.deployment} revision {res.revision}", flush=True)


def cmd_serve(args) -> int:
    import signal
    import threading

    from edgeplan.runtime.server import drain, serve

    if args.store and not (args.device_id or args.deployment):
        raise EdgeplanError("--store needs --device-id or --deployment (what to pull)")
    rt = _ready(args)
    server = serve(rt, args.host, args.port, args.request_timeout)
    how = (f"streamed one request at a time as the FlashMem plan says, mode {args.stream}" if args.stream else
           f"{'EMULATED Edge TPU' if rt.mode == 'emulated' else rt.mode}; points {rt.points}, cores {rt.cores}; "
           f"re-allocation {'on' if rt.adapt else 'off'}"
           + "".join(f"; {n} branch-parallel at points {sorted(p)}" for n, p in getattr(rt, "parallax", {}).items() if p))
    print(f"serving {rt.manifest.deployment} revision {rt.manifest.revision} on http://{args.host}:"
          f"{server.server_address[1]} ({how})", flush=True)
    if args.store:
        threading.Thread(target=_puller, args=(args, server), daemon=True).start()
    if threading.current_thread() is threading.main_thread():
        # SIGTERM (systemd, `docker stop`) and Ctrl-C end the accept loop between two connections (an exception
        # raised into it could drop one just accepted); the requests accepted are then answered
        def stop(signum, frame):
            threading.Thread(target=server.shutdown, daemon=True).start()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop_accepting()
        left = drain(server.current.rt, args.request_timeout, server)
        server.current.rt.stop()
        print(f"stopped serving {server.current.rt.manifest.deployment} revision "
              f"{server.current.rt.manifest.revision}" + (f"; {left} requests or connections still open were cut" if left else
                                                           ""), flush=True)
    return 0


def _rate(text: str) -> tuple[str, float]:
    try:
        name, value = text.split("=", 1)
        return name, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected MODEL=RATE (requests/s)") from None


def cmd_fifo(args) -> int:
    from edgeplan.runtime import fifo
    from edgeplan.runtime.pull import read_manifest

    rev = Path(args.dir)
    rev = (rev / "current").resolve() if (rev / "current").exists() else rev
    if not (rev / "manifest.json").is_file():
        raise EdgeplanError(f"{args.dir}: no active revision (run `edgeplan-runtime pull` first)")
    manifest = read_manifest(rev)
    models = [m for m in args.models.split(",") if m] if args.models else [e.name for e in manifest.models]
    res = fifo.run(rev, manifest, models, args.iterations, args.stream_mode, cold=not args.warm)
    print(f"FIFO over {', '.join(models)} x {args.iterations} ({args.stream_mode}, "
          f"{'warm page cache' if args.warm else 'cold: pages dropped before each request'}): peak resident set "
          f"{res.peak_above_baseline_bytes / 1e6:.1f} MB above the {res.baseline_bytes / 1e6:.1f} MB before it")
    for name, ms in res.summary().items():
        stalls = [r["stall_ms"] for r in res.requests if r["model"] == name]
        print(f"  {name}: median {ms:.1f} ms per request (read + build + run), stalls median {sorted(stalls)[len(stalls) // 2]:.1f} ms")
    if args.out:
        Path(args.out).write_text(json.dumps(res.__dict__, indent=1))
        print(f"wrote {args.out} (every request, and the resident-set timeline every 2 ms)")
    return 0


def cmd_loadgen(args) -> int:
    from edgeplan.runtime import loadgen
    from edgeplan.runtime.model import load_inputs
    from edgeplan.runtime.pull import active

    found = active(Path(args.dir))
    if found is None:
        raise EdgeplanError(f"{args.dir}: no active revision (loadgen reads the models' inputs from it)")
    rev_dir, manifest = found
    rates = dict(args.rate)
    entries = {e.name: e for e in manifest.models}
    unknown = set(rates) - set(entries)
    if unknown:
        raise EdgeplanError(f"no model {', '.join(sorted(unknown))} in {manifest.deployment} (models: {', '.join(entries)})")
    inputs = {n: load_inputs(rev_dir, entries[n], args.inputs) for n in rates}
    target = args.url if args.url is not None else _ready(args)  # in-process: the same input set computed ahead
    sent = [0]
    total = len(loadgen.schedule(rates, args.duration, args.seed))

    def progress(n):
        sent[0] += n
        if sys.stderr.isatty():
            sys.stderr.write(f"\rloadgen {sent[0]}/{total} requests sent")

    records = loadgen.run(target, rates, args.duration, inputs, seed=args.seed, progress=progress)
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    if args.out:
        loadgen.write(records, args.out)
    print(json.dumps(loadgen.summary(records), indent=2))
    if args.url is None:
        target.stop()
    return 0


def cmd_profile(args) -> int:
    from edgeplan.runtime.profile_job import run_job

    result = run_job(args.job_uri, Path(args.dir), trusted(args), device_id=args.device_id)
    print(json.dumps({"job": result["job"], "device_id": result["device_id"], "drift": result["drift"],
                      "uploaded": result["key"]}, indent=2, default=str))
    return 0


def cmd_mpi_run(args) -> int:
    import tempfile

    import numpy as np

    from edgeplan.distributed import launch
    from edgeplan.runtime import split

    split_dir, extra = Path(args.dir), ["--window", str(args.window)] if args.window is not None else []
    dests = None  # where every host pulled, for a self-test's rollback
    if (split_dir / "current").is_symlink():  # a pull destination: the active revision's split, this the head
        dests = str(Path(args.rank_dest or split_dir).absolute())
        rev_dir, split_dir, share = split.head_dir(split_dir)
        if args.rank_dest:
            extra += ["--rank-dir", str(Path(args.rank_dest) / "current" / share.dir)]
    elif args.selftest or args.rank_dest:
        raise EdgeplanError(f"{args.dir}: --selftest and --rank-dest take a pull destination (where "
                            "`edgeplan-runtime pull` activated a revision with a split)")
    frames, inputs, out = args.frames, args.inputs, args.out
    scratch = tempfile.TemporaryDirectory(prefix="edgeplan-mpi-")
    if args.selftest:
        xs, want, names = split.selftests(rev_dir)
        frames, inputs, out = len(xs), str(Path(scratch.name) / "selftest.npy"), None
        np.save(inputs, xs)
        np.save(Path(scratch.name) / "expected.npy", want)
        extra += ["--builtin-kernels",  # the kernels the expected outputs were computed with
                  "--expected", str(Path(scratch.name) / "expected.npy"), "--rollback-dest", dests]
    if inputs:
        extra += ["--inputs", str(Path(inputs).resolve())]
    if out:
        extra += ["--out", str(Path(out).resolve())]
    mpi_args = []
    if args.emulated:
        from edgeplan.distributed import emulate

        mpi_args = emulate.mpi_args(args.emulated)
    with scratch:
        r = launch.run(split_dir, frames=frames, timeout_s=args.timeout, deadline_s=args.deadline, extra=extra,
                       mpi_args=mpi_args)
    s = r.summary
    print(f"{s['frames']} frames in {s['wall_s']:.3f} s: {s['fps']:.2f} frames/s over {len(s['ranks'])} ranks "
          f"(mpirun {r.seconds:.1f} s in all)")
    for k in s["ranks"]:
        print(f"  rank {k['rank']} on {k['host']}: stages {k['stages']}, busy {k['busy_s']:.3f} s, waiting "
              f"{k['wait_s']:.3f} s, CPU {k['cpu_s']:.3f} s ({k['cpu_s'] / k['wall_s']:.2f} of a core)")
    if args.summary:
        Path(args.summary).write_text(json.dumps(s, indent=2))
    if args.selftest:
        bad = [names[k] for k in s["ranks"][0]["selftest_differs"]]  # the head's verdict, every rank was sent it
        if bad:
            done = [k["rolled_back"] for k in s["ranks"] if k.get("rolled_back")]
            back = "; ".join(f"{d['device']} {d['from']} -> {d['to']}" if "to" in d else f"{d['device']} NOT rolled "
                             f"back ({d['error']})" for d in done)
            print(f"self-test FAILED over the ranks: {', '.join(bad)} give another output than the bundle expects; "
                  f"every device of the split rolled back to its previous revision: {back or 'none'}",
                  file=sys.stderr)
            return 1
        print(f"self-test passed over the ranks: {len(names)} of {len(names)} outputs identical to the whole int8 model")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="edgeplan-runtime", description="The edgeplan device runtime: pull signed "
                                 "deployment revisions, verify and activate them, serve them over local HTTP with "
                                 "a global accelerator worker and per-model CPU pools, re-allocating partition "
                                 "points and cores as request rates change.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("pull", help="fetch, verify and activate the latest revision of this device's deployment",
                        description="Resolves the deployment (devices/<id>.json, or --deployment), reads its signed "
                        "latest pointer and manifest, checks them against the trusted keys, refuses a revision older "
                        "than one already run, validates every name, size and type it lists (a name that would leave the "
                        "revision directory is refused before anything is written), fetches missing blobs (resumable, "
                        "sha256-checked), runs the self-tests on the assembled revision and only then activates it "
                        "atomically, keeping the previous one (any failure leaves the active revision as it was).")
    sp.add_argument("store", help="store root: a local path, file:///path or s3://bucket/prefix")
    sp.add_argument("--device-id", help="this device's id in the fleet registry")
    sp.add_argument("--deployment", help="pull this deployment (instead of, or checked against, --device-id)")
    sp.add_argument("--device-class", help="this device's class; a revision for another class is refused")
    sp.add_argument("--dest", required=True, help="where revisions live on the device")
    sp.add_argument("--trusted", action="append", help=f"trusted public key file or directory (repeatable; default "
                    f"${TRUSTED_ENV})")
    sp.add_argument("--allow-older", action="store_true", help="accept a latest revision older than one already run")
    sp.add_argument("--no-health-check", action="store_true", help="activate without running the self-tests")
    sp.add_argument("--retries", type=int, default=3, help="retries when the store is unreachable (default 3)")
    sp.add_argument("--retry-wait", type=float, default=5.0, help="seconds between them (default 5)")
    sp.set_defaults(func=cmd_pull)
    sp = sub.add_parser("rollback", help="make the previous revision active again")
    sp.add_argument("--dest", required=True)
    sp.set_defaults(func=cmd_rollback)
    sp = sub.add_parser("status", help="the active revision")
    sp.add_argument("--dest", required=True)
    sp.set_defaults(func=cmd_status)

    def serving(sp):
        sp.add_argument("--mode", choices=("emulated", "cpu", "edgetpu"), default="emulated",
                        help="accelerator: emulated Edge TPU (default), cpu (correctness: prefixes on the CPU), "
                        "edgetpu (a real one through libedgetpu)")
        sp.add_argument("--no-adapt", action="store_true", help="keep the plan's points and cores")
        sp.add_argument("--window", type=float, default=10.0, help="rate monitor window, s (default 10)")
        sp.add_argument("--interval", type=float, default=2.0, help="re-allocation period, s (default 2)")
        sp.add_argument("--max-inflight", type=int, default=256, help="requests in flight before 503 (default 256)")
        sp.add_argument("--latency-budget", type=float, metavar="X",
                        help="while a model is offered more requests than it can serve, turn a request away (503 "
                             "+ Retry-After) when it would wait and the latency expected for it, from the queue "
                             "ahead at the measured service times, is over X times the "
                             "plan's predicted latency (default 1.4, engine.LATENCY_BUDGET; 0: only --max-inflight)")
        sp.add_argument("--inputs", type=int, default=8, help="inputs per model in the load-test set (default 8)")
        sp.add_argument("--no-parallax", action="store_true",
                        help="run every suffix as its own interpreter, even where the revision's Parallax plan runs "
                             "it branch-parallel")

    sp = sub.add_parser("serve", help="serve the active revision over local HTTP",
                        description="POST /infer/{model} (.npy or JSON float input), GET /healthz, GET /metrics "
                        "(Prometheus). With the emulated Edge TPU the prefix outputs of the load-test input set are "
                        "computed at start-up and the worker holds the modelled (EMULATED) service time.")
    sp.add_argument("dir", help="the --dest of pull (or a revision directory)")
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=8080, help="0: any free port (printed)")
    sp.add_argument("--request-timeout", type=float, default=10.0, metavar="S",
                    help="a request body must arrive within S s, else 408; idle connections close after it (default 10)")
    sp.add_argument("--rate", action="append", type=_rate, metavar="MODEL=RATE", help=argparse.SUPPRESS)
    sp.add_argument("--store", help="also pull from this store every --pull-every s and serve new revisions")
    sp.add_argument("--device-id", help="with --store: this device's id")
    sp.add_argument("--deployment", help="with --store: the deployment to pull")
    sp.add_argument("--pull-every", type=float, default=300.0, help="seconds between pulls (default 300)")
    sp.add_argument("--trusted", action="append", help=f"with --store: trusted keys (default ${TRUSTED_ENV})")
    sp.add_argument("--stream", nargs="?", const="plan",
                    choices=("plan", "eager", "always-next", "same-op-type", "serial"),
                    help="serve the models streamed from their blobs as the revision's FlashMem plan says, one request "
                         "at a time, each model's segments dropped after use (FlashMem, models not kept resident); "
                         "eager: every segment read from the request's start and built as soon as it is in (no "
                         "memory budget: faster, more memory than plan); always-next, same-op-type, serial for "
                         "comparison")
    serving(sp)
    sp.set_defaults(func=cmd_serve)
    sp = sub.add_parser("loadgen", help="open-loop Poisson load per model; every request's latency",
                        description="Sends Poisson arrivals per model at the given rates for --duration seconds, "
                        "over the finite input set of the active revision (self-test inputs + seeded ones), to "
                        "--url (a running serve) or to an in-process runtime; writes every request (JSON lines, or "
                        "CSV for *.csv) and prints mean/p50/p99 per model.")
    sp.add_argument("dir", help="the --dest of pull")
    sp.add_argument("--rate", action="append", type=_rate, required=True, metavar="MODEL=RATE")
    sp.add_argument("--duration", type=float, default=30.0, help="seconds (default 30)")
    sp.add_argument("--url", help="a running serve, e.g. http://127.0.0.1:8080 (default: serve in this process)")
    sp.add_argument("--out", help="write every request's latency here")
    sp.add_argument("--seed", type=int, default=0)
    serving(sp)
    sp.set_defaults(func=cmd_loadgen)
    sp = sub.add_parser("fifo", help="FlashMem's FIFO workload: each model read, built, run and dropped in turn",
                        description="Runs the models one request at a time, FIFO, for --iterations rounds; each "
                        "request reads its model from the revision (page cache dropped first unless --warm), "
                        "streamed as the revision's FlashMem plan says (or --stream-mode), and drops it. Prints the "
                        "peak resident set above the one before the first request (VmHWM and a 2 ms sampler) and "
                        "the median time per request.")
    sp.add_argument("dir", help="the --dest of pull (or a revision directory)")
    sp.add_argument("--models", help="comma-separated, in FIFO order (default: every model of the revision)")
    sp.add_argument("--iterations", type=int, default=10, help="rounds (default 10)")
    sp.add_argument("--stream-mode", default="plan",
                    choices=("plan", "preload", "eager", "serial", "always-next", "same-op-type"),
                    help="plan (default), preload (the whole model as one interpreter), eager (every segment read "
                         "at once, built as soon as read: no memory budget), or a streaming baseline")
    sp.add_argument("--warm", action="store_true", help="keep the page cache (figures are then warm)")
    sp.add_argument("--out", help="write every request and the resident-set timeline as JSON")
    sp.set_defaults(func=cmd_fifo)
    sp = sub.add_parser("mpi", help="multi-device: run a split's MPI ranks from the head device")
    msub = sp.add_subparsers(dest="mpi_cmd", required=True)
    mp = msub.add_parser("run", help="start every rank of a split (mpirun with its rankfile) and run frames",
                         description="Runs mpirun with the split's hostfile and rankfile (TCP, no tree spawn, OOB "
                         "keepalive, ranks under python -m mpi4py) under a hard deadline; frames enter and leave at "
                         "rank 0. On any failure every process of the job is killed and the error names the rank, "
                         "host, stage and frame. Needs the mpi extra on every host and the split at the same path (each device pulls its "
                         "own ranks: `edgeplan-runtime pull --device-id`).")
    mp.add_argument("dir", help="the split directory (tables.json, rankfile, hostfile, int8/), or a pull destination "
                    "whose active revision carries a split this device heads")
    mp.add_argument("--selftest", action="store_true", help="with a pull destination: run the revision's self-tests "
                    "through the ranks and require the bundle's expected outputs exactly; otherwise every device of the split "
                    "(each rank's host, at --rank-dest or this path) rolls back to its previous revision and this exits 1")
    mp.add_argument("--rank-dest", metavar="TEMPLATE", help="with a pull destination: where the other hosts pulled, when "
                    "not at the same path as here; {hostname} is each host's name (emulated hosts on one filesystem)")
    mp.add_argument("--frames", type=int, default=10, help="frames to run (default 10)")
    mp.add_argument("--inputs", help="an .npy of int8 input frames (default: seeded random)")
    mp.add_argument("--out", help="write the outputs here (.npy)")
    mp.add_argument("--summary", help="write every rank's times here (JSON)")
    mp.add_argument("--timeout", type=float, default=300.0, help="hard deadline for the whole job, s (default 300)")
    mp.add_argument("--deadline", type=float, default=30.0, help="how long a rank waits for one buffer, s (default 30)")
    mp.add_argument("--window", type=int, help="frames in flight (default: twice the ranks, at least 4; fewer than the "
                    "ranks of the chain leaves ranks idle)")
    mp.add_argument("--emulated", metavar="DEPLOYMENT", help="run on the emulated hosts `edgeplan devices up` made "
                    "for DEPLOYMENT (daemons started inside each host; MPI traffic on their subnet)")
    mp.set_defaults(func=cmd_mpi_run)
    sp = sub.add_parser("profile", help="run a fleet profiling job on this device and upload the result",
                        description="Reads the job (s3://.../jobs/<id>/job.json or a local path to it), times the "
                        "active revision's suffixes on this CPU with the profiler, compares with the profiles the "
                        "bundle carries, and uploads jobs/<id>/result/<device-id>.json.")
    sp.add_argument("job_uri", help="the job.json's URI: <store root>/jobs/<id>/job.json")
    sp.add_argument("--dir", required=True, help="the --dest of pull")
    sp.add_argument("--device-id", default=None, help="default: the hostname")
    sp.add_argument("--trusted", action="append", help=f"trusted keys (default ${TRUSTED_ENV})")
    sp.set_defaults(func=cmd_profile)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except EdgeplanError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a bug, not a user's mistake: one line (EDGEPLAN_DEBUG=1 shows the traceback)
        if os.environ.get("EDGEPLAN_DEBUG"):
            raise
        print(f"error: edgeplan-runtime {args.cmd} failed unexpectedly ({type(e).__name__}: {e}); the active "
              "revision is unchanged unless this says otherwise; EDGEPLAN_DEBUG=1 shows where", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
