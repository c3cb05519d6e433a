"""``edgeplan run``: the compile-model flow on Prefect (its ephemeral server unless PREFECT_API_URL names
one), a local store and key by default."""
from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from edgeplan.errors import SigningKeyError

out = Console()


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


def cmd_run(args, params) -> int:
    import os

    started = time.time()
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING" if not args.verbose else "INFO")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # offline; and its sqlite insert races
    # a fresh Prefect home migrates its database at the first start: on a busy 2-core machine that can take
    # longer than Prefect's 20 s default
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    if args.model is not None and (args.name is None or args.version is None):
        raise SystemExit("edgeplan run MODEL needs --name and --version (without MODEL it builds params.yaml's models)")
    key = ensure_key(params, args.key)
    from flows.compile_model import compile_model, compile_models

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
    summary = flow(**kwargs)
    summary["wall_seconds"] = time.perf_counter() - t0
    summary["before_flow_seconds"] = summary["flow_started"] - started  # imports + Prefect server start-up
    print_summary(summary, summary["flow_seconds"])
    if args.device_check_s > 0:
        summary["device_check"] = device_check(summary, params, args.store, Path(args.out).parent / ".edgeplan" /
                                               "device", args.device_check_s)
    if args.summary_json:
        import json

        Path(args.summary_json).write_text(json.dumps(summary, indent=2, default=str))
    return 0


def device_check(summary: dict, params: dict, store_uri: str | None, base: Path, seconds: float) -> list[dict]:
    """What a device does with each published deployment: `edgeplan-runtime pull` (verify, fetch, activate,
    self-tests), `serve` on a free loopback port, a few seconds of Poisson requests at the planned rates over
    HTTP; predicted against measured mean latency (the Edge TPU EMULATED, the CPU suffixes real)."""
    import threading

    from edgeplan.cli_store import trusted_keys
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
        finally:
            server.shutdown()
            rt.stop()
        for m in rt.plan.models:
            rows.append({"deployment": dep, "revision": res.revision, "model": m.name, "rate": m.rate,
                         "point": m.point, "cores": m.cores, "predicted_ms": m.predicted_latency_ms,
                         "measured_ms": stats.get(m.name, {}).get("mean_ms"),
                         "requests": stats.get(m.name, {}).get("requests", 0),
                         "failed": stats.get(m.name, {}).get("failed", 0)})
    t = Table(title=f"device check: edgeplan-runtime pull + serve ({base}), {seconds:.0f} s of Poisson requests "
                    "over HTTP at the planned rates — Edge TPU EMULATED, CPU suffixes real")
    for col in ("deployment", "rev", "model", "rate/s", "point", "cores", "predicted ms", "measured ms", "requests"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["deployment"], str(r["revision"]), r["model"], f"{r['rate']:g}", str(r["point"]), str(r["cores"]),
                  f"{r['predicted_ms']:.2f}", "-" if r["measured_ms"] is None else f"{r['measured_ms']:.2f}",
                  f"{r['requests']} ({r['failed']} failed)")
    out.print(t)
    return rows


def print_summary(summary: dict, seconds: float) -> None:
    t = Table(title=f"compile-model {summary['model']} {summary['version']}: {summary['cache_hits']} of "
                    f"{len(summary['tasks'])} task runs from the cache, flow {seconds:.1f} s "
                    f"(+{summary['before_flow_seconds']:.1f} s start-up)")
    for col in ("task", "state", "seconds", "on"):
        t.add_column(col)
    for r in summary["tasks"]:
        t.add_row(r["task"], "[green]cached[/]" if r["cached"] else r["state"], f"{r['seconds']:.2f}", r["args"])
    out.print(t)
    if summary["plans"]:
        p = Table(title="SwapLess plans (Edge TPU times EMULATED where marked)")
        for col in ("deployment", "model", "point", "cores", "predicted ms"):
            p.add_column(col)
        for r in summary["plans"]:
            p.add_row(r["deployment"], f"{r['model']}:{r['version']}", f"{r['point']}/{r['of']}", str(r["cores"]),
                      f"{r['predicted_ms']:.2f}" + (" (EMULATED TPU)" if r["tpu"] == "emulated" else ""))
        out.print(p)
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
    key, digest, new = upload(store, args.model, args.name, args.version, args.input_shape)
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
                        "unchanged model re-runs nothing. With nothing configured it uses Prefect's ephemeral "
                        "server (set PREFECT_API_URL for a real one), the local store of params.yaml publish.store "
                        "and a development signing key.")
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
