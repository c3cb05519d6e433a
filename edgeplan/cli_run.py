"""``edgeplan run``: the compile-model flow on Prefect (its ephemeral server unless PREFECT_API_URL names
one), a local store and key by default."""
from __future__ import annotations

import time
from pathlib import Path

from edgeplan.console import out, table
from edgeplan.errors import SigningKeyError


def ensure_key(params: dict, key: str | None) -> str | None:
    """The signing key to publish with, checked before anything runs; with no key anywhere, a development
    key is made beside the trusted keys (and so trusted)."""
    import os

    from edgeplan.bundle.keys import ENV
    from edgeplan.bundle.publish import check_signing_key
    from edgeplan.cli_store import signing_key, trusted_dirs, trusted_keys

    try:
        found = signing_key(key, params)
        check_signing_key(found, trusted_keys(params))  # refused now, not after the conversion
        return None if key is None and os.environ.get(ENV) else found.source  # the same key, the same name
    except SigningKeyError as e:
        if key is not None or "no signing key" not in str(e):
            raise
    from edgeplan.bundle import keys

    kid, key_path, _ = keys.generate(trusted_dirs(params)[0])
    out.print(f"[yellow]note:[/] no signing key configured: made development key {kid} in {key_path.parent} "
              "(devices trust it through publish.trusted_keys; use your own with --key or EDGEPLAN_SIGNING_KEY)")
    return str(key_path)


PREFECT_SERVERS = ("local", "ephemeral")


class QuietFailures:
    """A logging filter for the console: without --verbose, a failed task or flow is said once, in the CLI's one
    ``error:`` line, not also by Prefect's run loggers with its traceback and every downstream task's "NotReady"
    (those records still go to the Prefect server's run logs), nor by the events worker's flush at exit."""

    RUN_LOGGERS = ("prefect.task_runs", "prefect.flow_runs")

    def filter(self, record) -> bool:
        import logging

        if record.name in self.RUN_LOGGERS and record.levelno >= logging.ERROR:
            return False
        return not (record.name == "EventsWorker" and "Still processing items" in record.getMessage())


def prefect_home(args) -> Path:
    return Path(args.out).resolve().parent / ".edgeplan" / "prefect"


def cmd_run(args, params) -> int:
    import contextlib
    import os

    from edgeplan.errors import EdgeplanError
    from edgeplan.pipeline import local_server

    started = time.time()
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING" if not args.verbose else "INFO")
    if not args.verbose:
        import logging

        for handler in logging.getLogger().handlers:
            handler.addFilter(QuietFailures())
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # offline; and its sqlite insert races
    # a fresh Prefect home migrates its database at the first start: on a busy 2-core machine that can take
    # longer than Prefect's 20 s default
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    if args.model is not None and (args.name is None or args.version is None):
        raise SystemExit("edgeplan run MODEL needs --name and --version (without MODEL it builds params.yaml's models)")
    server = "external" if os.environ.get("PREFECT_API_URL") else (
        os.environ.get("EDGEPLAN_PREFECT_SERVER") or params["orchestration"]["prefect_server"])
    if server not in (*PREFECT_SERVERS, "external"):
        raise EdgeplanError(f"orchestration.prefect_server (or EDGEPLAN_PREFECT_SERVER) is {server!r}; use "
                            f"{' or '.join(PREFECT_SERVERS)}, or set PREFECT_API_URL to a server of yours")
    if server == "ephemeral" and not args.verbose:  # its process shares our stderr: a task-run event it still
        # flushes as the command ends is cancelled, and logged with two tracebacks (now and then, when a flow fails
        # at its first task); the local server logs to its own file
        os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "CRITICAL")
    key = ensure_key(params, args.key)
    with contextlib.ExitStack() as stack:
        if server == "local":
            home = prefect_home(args)
            stack.enter_context(local_server.lease(home))  # before ensure: the server cannot stop under the run
            os.environ["PREFECT_API_URL"] = local_server.ensure(
                home, params["orchestration"]["prefect_server_idle_s"],
                progress=lambda msg: out.print(f"[yellow]note:[/] {msg}"))
        from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

        from flows.compile_model import compile_model, compile_models

        if server != "external":  # heartbeats feed services neither of our servers runs; their thread's join
            # at the end of a flow cost ~1 s
            stack.enter_context(temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}))
        t0 = time.perf_counter()
        common = dict(root=args.out, params_file=args.params, store=args.store, key=key, refresh=args.refresh)
        if args.model is not None:
            flow, kwargs = compile_model, dict(source=args.model, name=args.name, version=args.version,
                                               input_shape=args.input_shape, **common)
        else:
            flow, kwargs = compile_models, common
        if args.dask:
            from prefect_dask import DaskTaskRunner

            flow = flow.with_options(task_runner=DaskTaskRunner(address=args.dask))
        try:
            summary = flow(**kwargs)
        except EdgeplanError:
            raise
        except Exception as e:  # Prefect's or Dask's own failures: one line, the traceback under -v
            if args.verbose:
                raise
            raise EdgeplanError(f"the {flow.name} flow failed: {type(e).__name__}: {str(e).strip()[:300]} (-v shows "
                                "the traceback; a rerun resumes from the cache)") from None
    summary["wall_seconds"] = time.perf_counter() - t0
    summary["before_flow_seconds"] = summary["flow_started"] - started  # imports + Prefect server start-up
    summary["prefect_server"] = server
    print_summary(summary, summary["flow_seconds"])
    if args.device_check_s > 0:
        summary["device_check"] = device_check(summary, params, args.store, Path(args.out).parent / ".edgeplan" /
                                               "device", args.device_check_s)
    summary["command_seconds"] = time.time() - started
    if args.summary_json:
        import json

        Path(args.summary_json).write_text(json.dumps(summary, indent=2, default=str))
    return 0


def cmd_server(args, params) -> int:
    """``edgeplan server status|stop``: the local Prefect server ``edgeplan run`` reuses."""
    from edgeplan.pipeline import local_server

    home = prefect_home(args)
    rec = local_server.info(home)
    if args.action == "status":
        if rec is None:
            out.print(f"no local Prefect server runs in {home} (the next `edgeplan run` starts one)")
            return 1
        out.print(f"local Prefect server {rec['url']} (supervisor pid {rec['pid']}, up "
                  f"{(time.time() - rec['started']) / 60:.1f} min, stops after {rec['idle_s'] / 60:g} min idle); "
                  f"database and log in {home}")
        return 0
    if not local_server.stop(home):
        out.print(f"no local Prefect server runs in {home}")
        return 0
    out.print(f"stopped the local Prefect server of {home}" if local_server.info(home) is None else
              f"asked the local Prefect server of {home} to stop; it stops when the running `edgeplan run` ends")
    return 0


AGREE = 0.20  # the device check flags a model whose runtime latency is further than this from the plan's


def device_check(summary: dict, params: dict, store_uri: str | None, base: Path, seconds: float) -> list[dict]:
    """What a device does with each published deployment: `edgeplan-runtime pull` (verify, fetch, self-tests,
    activate), `serve` on a free loopback port, a few seconds of Poisson requests at the planned rates over
    HTTP. Per model: the plan's predicted mean latency; the runtime's own (from a request's arrival in the
    runtime to its result: what the plan predicts); and the HTTP client's (adds HTTP, .npy encoding and the
    float -> int8 quantization of the input in the server)."""
    import threading

    from edgeplan.cli_store import trusted_keys
    from edgeplan.plan.swapless.plan import figure_sources
    from edgeplan.runtime import Runtime, loadgen, pull
    from edgeplan.runtime.model import load_inputs
    from edgeplan.runtime.server import serve
    from edgeplan.store import open_store

    store = open_store(store_uri or params["publish"]["store"])
    rows = []
    for pub in summary["published"]:
        dep = pub["deployment"]
        res = pull(store, base / dep, trusted_keys(params), deployment=dep)
        rt = Runtime(base / dep, adapt=False)
        inputs = {e.name: load_inputs(rt.rev_dir, e, 8) for e in rt.manifest.models}
        for n, xs in inputs.items():
            rt.precompute(n, xs)
        rt.start()
        server = serve(rt, "127.0.0.1", 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}"
            rates = {m.name: m.rate for m in rt.plan.models}
            stats = loadgen.summary(loadgen.run(url, rates, seconds, inputs, seed=1))
            served = rt.status()["models"]
        finally:
            server.shutdown()
            rt.stop()
        for m in rt.plan.models:
            runtime_ms = served[m.name]["mean_latency_ms"]
            rows.append({"deployment": dep, "revision": res.revision, "model": m.name, "rate": m.rate,
                         "point": m.point, "cores": m.cores, "predicted_ms": m.predicted_latency_ms,
                         "runtime_ms": runtime_ms, "measured_ms": stats.get(m.name, {}).get("mean_ms"),
                         "requests": stats.get(m.name, {}).get("requests", 0),
                         "failed": stats.get(m.name, {}).get("failed", 0),
                         "figures": figure_sources(m.point, m.last_point, rt.plan.tpu_source),
                         "agrees": runtime_ms is not None and abs(runtime_ms / m.predicted_latency_ms - 1) <= AGREE})
    print_device_check(rows, base, seconds)
    return rows


def print_device_check(rows: list[dict], base: Path, seconds: float) -> None:
    def ms(v):
        return "-" if v is None else f"{v:.2f}"

    t = table(f"device check: edgeplan-runtime pull + serve ({base}), {seconds:g} s of Poisson requests over "
              "HTTP at the planned rates",
              ("deployment", "rev", "model", "rate/s", "point", "cores", "predicted ms", "runtime ms", "client ms",
               "requests", "from"),
              right=("rev", "rate/s", "point", "cores", "predicted ms", "runtime ms", "client ms", "requests"))
    for r in rows:
        flag = " [yellow]![/]" if r["runtime_ms"] is not None and not r["agrees"] else ""
        t.add_row(r["deployment"], str(r["revision"]), r["model"], f"{r['rate']:g}", str(r["point"]), str(r["cores"]),
                  ms(r["predicted_ms"]), ms(r["runtime_ms"]) + flag, ms(r["measured_ms"]),
                  f"{r['requests']}" + (f" ({r['failed']} failed)" if r["failed"] else ""), r["figures"])
    out.print(t)
    out.print("runtime ms: the runtime's own latency, from a request's arrival in it to its result (what the plan "
              "predicts); client ms adds the HTTP round trip, .npy encoding and the float -> int8 quantization of "
              f"the input in the server ({_gap(rows)}).")
    for r in rows:
        if not r["agrees"] and r["runtime_ms"] is not None:
            out.print(f"[yellow]![/] {r['deployment']}/{r['model']}: runtime {r['runtime_ms']:.2f} ms is "
                      f"{r['runtime_ms'] / r['predicted_ms'] - 1:+.0%} off the plan's {r['predicted_ms']:.2f} ms "
                      f"(beyond ±{AGREE:.0%}). Known causes here: the profile times suffixes back to back, while at "
                      f"{r['rate']:g} requests/s the CPU idles between requests (on this kind of VM a suffix after "
                      f"an idle gap ran up to 2x slower); and {r['requests']} requests make a short sample. "
                      "`edgeplan-runtime loadgen` for longer runs.")


def _gap(rows: list[dict]) -> str:
    gaps = [r["measured_ms"] - r["runtime_ms"] for r in rows if r["measured_ms"] is not None and r["runtime_ms"]]
    if not gaps:
        return "no requests completed"
    return (f"here {min(gaps):.2f}..{max(gaps):.2f} ms per request" if len(gaps) > 1 else
            f"here {gaps[0]:.2f} ms per request")


def print_summary(summary: dict, seconds: float) -> None:
    t = table(f"compile-model {summary['model']} {summary['version']}: {summary['cache_hits']} of "
              f"{len(summary['tasks'])} task runs from the cache, flow {seconds:.1f} s "
              f"(+{summary['before_flow_seconds']:.1f} s start-up)", ("task", "state", "seconds", "on"),
              right=("seconds",))
    for r in summary["tasks"]:
        t.add_row(r["task"], "[green]cached[/]" if r["cached"] else r["state"], f"{r['seconds']:.2f}", r["args"])
    out.print(t)
    if summary["plans"]:
        p = table("SwapLess plans", ("deployment", "model", "point", "cores", "predicted ms", "from"),
                  right=("point", "cores", "predicted ms"))
        for r in summary["plans"]:
            p.add_row(r["deployment"], f"{r['model']}:{r['version']}", f"{r['point']}/{r['of']}", str(r["cores"]),
                      f"{r['predicted_ms']:.2f}", r["figures"])
        out.print(p)
    spatial = [r for r in summary.get("splits") or [] if r.get("planner", "spatial") == "spatial"]
    if spatial:
        sp = table("Spatial splits (ADaPS): the score is the cost model's, modelled", (
            "deployment", "model", "devices", "along", "score ms", "bytes/frame", "tiles identical"),
            right=("score ms", "bytes/frame", "tiles identical"))
        for r in spatial:
            sp.add_row(r["deployment"], r["model"], ", ".join(r["devices"]), r["axis"], f"{r['score_ms']:.2f}",
                       f"{r['bytes_per_frame']:,}", f"{r['identical']:.0%}")
        out.print(sp)
    layered = [r for r in summary.get("splits") or [] if r.get("planner") == "autodice"]
    if layered:
        sp = table("Layer splits (AutoDiCE): the Pareto point best on the objective, predicted", (
            "deployment", "model", "ranks", "objective", "frames/s", "largest device MB", "bytes/frame",
            "int8 identical"), right=("frames/s", "largest device MB", "bytes/frame", "int8 identical"))
        for r in layered:
            sp.add_row(r["deployment"], r["model"], ", ".join(r["devices"]), r["objective"],
                       f"{r['throughput_fps']:.1f}", f"{r['memory_bytes'] / 1e6:.2f}", f"{r['bytes_per_frame']:,}",
                       f"{r['identical']:.0%}")
        out.print(sp)
    for r in summary["published"]:
        if r["new_revision"]:
            out.print(f"published {r['deployment']} revision {r['revision']}: {r['blobs']} blobs, "
                      f"{r['uploaded_bytes']:,} B uploaded; devices: {r['devices'] or 'none'}")
        else:
            out.print(f"{r['deployment']}: revision {r['revision']} already serves this content"
                      + (" (publish from the cache)" if r.get("from_cache") else ""))
    out.print(f"artifacts in {Path(summary['artifacts'])}")


def cmd_submit(args, params) -> int:
    import os

    from edgeplan.store import open_store
    from edgeplan.submit import emit, upload

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    store_uri = args.store or params["publish"]["store"]
    if "://" not in store_uri:
        store_uri = str(Path(store_uri).resolve())
    store = open_store(store_uri)
    key, digest, new = upload(store, args.model, args.name, args.version, args.input_shape,
                              params["ingest"]["max_model_bytes"])
    out.print(f"{'uploaded' if new else 'already in the store (same model)'}: {store.uri}/{key} "
              f"(sha256 {digest[:12]}...)")
    if args.no_event:
        return 0
    if not os.environ.get("PREFECT_API_URL"):
        out.print("[yellow]note:[/] PREFECT_API_URL is not set: the event goes to an ephemeral server no deployment "
                  "listens on; point it at the Prefect server that runs compile-on-new-version")
    event = emit(args.name, args.version, store_uri, key, digest)
    out.print(f"emitted edgeplan.model.submitted ({event.id if event else 'not sent'}) for {args.name} {args.version}")
    return 0


def class_pools(params: dict) -> dict[str, str]:
    """Device class -> the work pool its profiling jobs run on: the registry's devices' ``work_pool`` for
    that class, else the class's name."""
    from edgeplan.profile import fleet as fleet_mod

    fleet = fleet_mod.load(params, {d["name"] for d in params.get("deployments") or []})
    pools = {d.device_class: d.work_pool for d in fleet.devices if d.work_pool}
    return {name: pools.get(name, name) for name in sorted(fleet.device_classes)}


def cmd_deploy(args, params) -> int:
    """prefect deploy of prefect.yaml's deployments (reprofile-fleet on params.yaml's cron) and of one
    profile-job deployment per device class on the class's work pool; missing process work pools made."""
    import os
    import subprocess
    import sys
    import tempfile

    import yaml

    from edgeplan.errors import EdgeplanError

    prefect = Path(sys.executable).with_name("prefect")
    env = {**os.environ, "EDGEPLAN_WORKDIR": os.environ.get("EDGEPLAN_WORKDIR", str(Path.cwd()))}
    cron = params["orchestration"]["reprofile_cron"]
    yaml_file = Path(args.prefect_file).resolve()
    spec = yaml.safe_load(yaml_file.read_text())
    pools = class_pools(params)
    compile_pools = {d["work_pool"]["name"] for d in spec["deployments"]}

    def sh(*cmd, check=True):
        proc = subprocess.run([str(prefect), "--no-prompt", *cmd], env=env, capture_output=True, text=True,
                              check=False, cwd=yaml_file.parent)
        if check and proc.returncode != 0:
            raise EdgeplanError(f"prefect {' '.join(cmd)} failed: {(proc.stdout + proc.stderr)[-1500:]}")
        return proc

    for pool in sorted(compile_pools | set(pools.values())):
        if sh("work-pool", "inspect", pool, check=False).returncode != 0:
            sh("work-pool", "create", pool, "--type", "process")
    spec["deployments"] += [{"name": dc, "entrypoint": "flows.reprofile_fleet:profile_job", "work_pool": {"name": pool},
                             "description": f"A fleet profiling job on device class {dc} (reprofile-fleet starts it)."}
                            for dc, pool in pools.items()]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=yaml_file.parent, prefix=".prefect-deploy-") as f:
        yaml.safe_dump(spec, f)
        f.flush()
        sh("deploy", "--prefect-file", f.name, "--name", "compile-on-new-version")
        sh("deploy", "--prefect-file", f.name, "--name", "reprofile-fleet", "--cron", cron)
        for dc in pools:
            sh("deploy", "--prefect-file", f.name, "--name", dc)
    out.print(f"deployed compile-on-new-version (event edgeplan.model.submitted), reprofile-fleet (cron {cron!r}) "
              f"and profile-job per device class ({', '.join(f'{dc} on pool {p}' for dc, p in pools.items())}) to "
              f"{os.environ.get('PREFECT_API_URL', 'the default Prefect server')}; flows run in "
              f"{env['EDGEPLAN_WORKDIR']}. Start workers: prefect worker start --pool "
              f"{' / '.join(sorted(compile_pools | set(pools.values())))}")
    return 0


def register(sub) -> None:
    from edgeplan.cli import _shape

    sp = sub.add_parser("run", help="the whole pipeline for a new model version, on Prefect (compile-model flow)",
                        description="Runs the compile-model flow: ingest, analyze, int8, cut, compile, verify, profile; "
                        "then for every deployment serving the model (a one-model deployment on coral-usb-emulated "
                        "when none does): plan, bundle, sign and publish a new revision. Cached by content: an "
                        "unchanged model re-runs nothing. With nothing configured it uses a local Prefect server it "
                        "starts once and reuses (`edgeplan server --help`; PREFECT_API_URL names a server of yours), "
                        "the local store of params.yaml publish.store and a development signing key.")
    sp.add_argument("model", nargs="?", help="a .onnx/.keras file, a SavedModel directory, or zoo:NAME; without it, "
                    "every model params.yaml lists under `models` (compile-models flow, stages fanned out)")
    sp.add_argument("--name", help="the model's name (required with MODEL)")
    sp.add_argument("--version", help="the model's version (required with MODEL)")
    sp.add_argument("--out", default="artifacts", help="artifact root (default: artifacts)")
    sp.add_argument("--input-shape", type=_shape, help="N,C,H,W for a model with dynamic dimensions")
    sp.add_argument("--store", help="store URI (default: params.yaml publish.store)")
    sp.add_argument("--key", help="signing key file (default: $EDGEPLAN_SIGNING_KEY, else the trusted directory's)")
    sp.add_argument("--dask", metavar="ADDRESS", help="run tasks on this Dask scheduler (prefect-dask)")
    sp.add_argument("--refresh", action="store_true", help="ignore the task cache and run every stage")
    sp.add_argument("--device-check-s", type=float, default=3.0, metavar="SECONDS",
                    help="then pull each published deployment with the device runtime into .edgeplan/device/, "
                    "serve it and send it this many seconds of requests at the planned rates (0: skip; default 3)")
    sp.add_argument("--summary-json", metavar="FILE", help="also write the run's summary (task runs, cache hits, "
                    "plans, revisions, timings) as JSON")
    sp.set_defaults(func=cmd_run)
    sp = sub.add_parser("server", help="the local Prefect server `edgeplan run` starts once and reuses",
                        description="With orchestration.prefect_server: local (the default) and no PREFECT_API_URL, "
                        "`edgeplan run` starts a Prefect server on loopback (API only, no services or UI; its "
                        "database in .edgeplan/prefect/ beside the artifact root), reuses it in later runs (a cached "
                        "rerun then spends no time starting one), and the server stops itself after "
                        "orchestration.prefect_server_idle_s without a run. `status` shows it, `stop` stops it (after "
                        "any running `edgeplan run`). orchestration.prefect_server: ephemeral (or "
                        "EDGEPLAN_PREFECT_SERVER=ephemeral) uses Prefect's ephemeral server, started per command (its "
                        "log shows under -v only).")
    sp.add_argument("action", choices=("status", "stop"))
    sp.add_argument("--out", default="artifacts", help="the artifact root of the runs (default: artifacts); the server "
                    "lives in .edgeplan/prefect beside it")
    sp.set_defaults(func=cmd_server)
    sp = sub.add_parser("submit", help="upload a model version to the store and emit edgeplan.model.submitted",
                        description="Canonicalises MODEL to ONNX, uploads it to models/NAME/VERSION/model.onnx in "
                        "the store (the same model again is a no-op; another under the same version is refused) "
                        "and emits the Prefect event edgeplan.model.submitted, which triggers the "
                        "compile-on-new-version deployment (prefect.yaml) on the server PREFECT_API_URL names.")
    sp.add_argument("model", help="a .onnx/.keras file, a SavedModel directory, or zoo:NAME")
    sp.add_argument("--name", required=True)
    sp.add_argument("--version", required=True)
    sp.add_argument("--store", help="store URI (default: params.yaml publish.store)")
    sp.add_argument("--input-shape", type=_shape, help="N,C,H,W for a model with dynamic dimensions")
    sp.add_argument("--no-event", action="store_true", help="upload only")
    sp.set_defaults(func=cmd_submit)
    sp = sub.add_parser("deploy", help="create the Prefect deployments of prefect.yaml on PREFECT_API_URL",
                        description="prefect deploy of compile-on-new-version (triggered by edgeplan.model.submitted), "
                        "reprofile-fleet on the cron of params.yaml orchestration.reprofile_cron (work pool "
                        "edgeplan-compile) and profile-job/<device class> for every class of the fleet registry, on "
                        "the work pool its devices name (else the class's name). Missing work pools are created "
                        "(process type). Flows run in EDGEPLAN_WORKDIR (default: this directory).")
    sp.add_argument("--prefect-file", default=str(Path(__file__).resolve().parents[1] / "prefect.yaml"),
                    help="prefect.yaml (default: the repository's)")
    sp.set_defaults(func=cmd_deploy)
