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
    key = ensure_key(params, args.key)
    from flows.compile_model import compile_model

    t0 = time.perf_counter()
    kwargs = dict(source=args.model, name=args.name, version=args.version, root=args.out, params_file=args.params,
                  store=args.store, key=key, input_shape=args.input_shape, refresh=args.refresh)
    if args.dask:
        from prefect_dask import DaskTaskRunner

        flow = compile_model.with_options(task_runner=DaskTaskRunner(address=args.dask))
    else:
        flow = compile_model
    summary = flow(**kwargs)
    summary["wall_seconds"] = time.perf_counter() - t0
    summary["before_flow_seconds"] = summary["flow_started"] - started  # imports + Prefect server start-up
    print_summary(summary, summary["flow_seconds"])
    if args.summary_json:
        import json

        Path(args.summary_json).write_text(json.dumps(summary, indent=2, default=str))
    return 0


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


def cmd_deploy(args, params) -> int:
    """prefect deploy of prefect.yaml's deployments, reprofile-fleet on params.yaml's cron."""
    import os
    import subprocess
    import sys

    from edgeplan.errors import EdgeplanError

    prefect = Path(sys.executable).with_name("prefect")
    env = {**os.environ, "EDGEPLAN_WORKDIR": os.environ.get("EDGEPLAN_WORKDIR", str(Path.cwd()))}
    cron = params["orchestration"]["reprofile_cron"]
    yaml_file = Path(args.prefect_file)
    for cmd in ([str(prefect), "--no-prompt", "deploy", "--prefect-file", str(yaml_file), "--name",
                 "compile-on-new-version"],
                [str(prefect), "--no-prompt", "deploy", "--prefect-file", str(yaml_file), "--name", "reprofile-fleet",
                 "--cron", cron]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=yaml_file.parent)
        if proc.returncode != 0:
            raise EdgeplanError(f"{' '.join(cmd[2:])} failed: {(proc.stdout + proc.stderr)[-1500:]}")
    out.print(f"deployed compile-on-new-version (event edgeplan.model.submitted) and reprofile-fleet (cron "
              f"{cron!r}) to {os.environ.get('PREFECT_API_URL', 'the default Prefect server')}; flows run in "
              f"{env['EDGEPLAN_WORKDIR']}; start a worker: prefect worker start --pool edgeplan-compile")
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
    sp.add_argument("model", help="a .onnx/.keras file, a SavedModel directory, or zoo:NAME")
    sp.add_argument("--name", required=True)
    sp.add_argument("--version", required=True)
    sp.add_argument("--out", default="artifacts", help="artifact root (default: artifacts)")
    sp.add_argument("--input-shape", type=_shape, help="N,C,H,W for a model with dynamic dimensions")
    sp.add_argument("--store", help="store URI (default: params.yaml publish.store)")
    sp.add_argument("--key", help="signing key file (default: $EDGEPLAN_SIGNING_KEY, else the trusted directory's)")
    sp.add_argument("--dask", metavar="ADDRESS", help="run tasks on this Dask scheduler (prefect-dask)")
    sp.add_argument("--refresh", action="store_true", help="ignore the task cache and run every stage")
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
                        description="prefect deploy of compile-on-new-version (triggered by edgeplan.model.submitted) "
                        "and reprofile-fleet on the cron of params.yaml orchestration.reprofile_cron. Their flows "
                        "run in EDGEPLAN_WORKDIR (default: this directory). Work pool: edgeplan-compile (process).")
    sp.add_argument("--prefect-file", default=str(Path(__file__).resolve().parents[1] / "prefect.yaml"),
                    help="prefect.yaml (default: the repository's)")
    sp.set_defaults(func=cmd_deploy)
