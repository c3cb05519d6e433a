"""CLI commands for keys, publishing and the store (``edgeplan keys|publish|ls``)."""
from __future__ import annotations

import json
from pathlib import Path

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from edgeplan.console import out
from edgeplan.errors import SigningKeyError


def trusted_dirs(params: dict) -> list[Path]:
    return [Path(p) for p in params["publish"]["trusted_keys"]]


def signing_key(path: str | None, params: dict):
    """--key FILE, else $EDGEPLAN_SIGNING_KEY, else the only .key file among the trusted key directories."""
    import os

    from edgeplan.bundle import keys

    if path is None and not os.environ.get(keys.ENV):
        found = [f for d in trusted_dirs(params) if d.is_dir() for f in sorted(d.glob("*.key"))]
        if len(found) == 1:
            path = found[0]
        elif len(found) > 1:
            raise SigningKeyError(f"several keys in {', '.join(map(str, trusted_dirs(params)))}: "
                                  f"{', '.join(f.name for f in found)}; choose one with --key")
    return keys.load_signing_key(path)


def trusted_keys(params: dict) -> dict:
    from edgeplan.bundle import keys

    return keys.load_trusted([p for p in trusted_dirs(params) if p.exists()])


def cmd_keys_generate(args, params) -> int:
    from edgeplan.bundle import keys

    kid, key_path, pub_path = keys.generate(Path(args.out) if args.out else trusted_dirs(params)[0])
    out.print(f"key id [bold]{kid}[/]\nprivate: {key_path} (mode 0600; keep it out of git)\npublic:  {pub_path} "
              "(devices trust the directories in params.yaml publish.trusted_keys)")
    return 0


def publish_deployment(root: Path, name: str, params: dict, store_uri: str | None, key_path: str | None,
                       console: Console = out):
    """Build the bundle of ``name`` from ``root`` and publish it; the PublishResult."""
    from edgeplan.bundle.build import build
    from edgeplan.bundle.publish import check_signing_key, publish
    from edgeplan.profile import fleet as fleet_mod
    from edgeplan.store import open_store

    key = signing_key(key_path, params)
    trusted = trusted_keys(params)
    check_signing_key(key, trusted)  # before anything is built or uploaded
    bundle = build(root, name, params)
    store = open_store(store_uri or params["publish"]["store"])
    devices = [d for d in fleet_mod.load(params, {d["name"] for d in params["deployments"]}).devices
               if d.deployment == name]
    with Progress(TextColumn("publish {task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task(f"{name} -> {store.uri}", total=bundle.size)
        return publish(store, bundle, key, trusted, devices, progress=lambda n: bar.advance(task, n)), store


def cmd_publish(args, params) -> int:
    result, store = publish_deployment(Path(args.artifacts), args.deployment, params, args.store, args.key)
    if result.new_revision:
        out.print(f"published [bold]{result.deployment}[/] revision {result.revision} to {store.uri}: "
                  f"{result.blobs} blobs, {result.uploaded_blobs} uploaded ({result.uploaded_bytes:,} B), "
                  f"{result.skipped_bytes:,} B already there; devices: {', '.join(result.devices) or 'none'}")
    else:
        out.print(f"{result.deployment}: revision {result.revision} in {store.uri} already serves this content; "
                  "nothing published")
    return 0


def cmd_ls(args, params) -> int:
    from edgeplan.bundle.publish import listing
    from edgeplan.store import open_store

    store = open_store(args.store or params["publish"]["store"])
    rows = listing(store, trusted_keys(params) or None)
    if args.deployment:
        rows = [r for r in rows if r["deployment"] == args.deployment]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    t = Table(title=f"{store.uri}")
    for col in ("deployment", "latest", "revisions", "device class", "models", "blobs", "bytes", "compiler",
                "signed by", "verified"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["deployment"], str(r["latest"]), ",".join(map(str, r["revisions"])), r.get("device_class", ""),
                  " ".join(r.get("models", [])), str(r.get("blobs", "")), f"{r.get('bytes', 0):,}",
                  r.get("compiler", ""), r.get("key_id", ""), "yes" if r.get("verified") else "no trusted keys")
    out.print(t)
    if not rows:
        out.print("(no deployments published)")
    return 0


def register(sub) -> None:
    sp = sub.add_parser("keys", help="signing keys for bundles")
    ksub = sp.add_subparsers(dest="keys_cmd", required=True)
    kg = ksub.add_parser("generate", help="a new ed25519 key pair: <id>.key (private) and <id>.pub",
                         description="Writes an ed25519 key pair. The private key signs manifests (pass it with "
                         "--key, or EDGEPLAN_SIGNING_KEY); devices trust the .pub files listed in params.yaml "
                         "publish.trusted_keys. To rotate: generate, trust the new .pub, publish, drop the old.")
    kg.add_argument("--out", help="directory (default: the first of publish.trusted_keys)")
    kg.set_defaults(func=cmd_keys_generate)
    sp = sub.add_parser("publish", help="publish a deployment's bundle as a new signed revision",
                        description="Builds the bundle of a deployment (every model's verified segments at every "
                        "point, profiles, the SwapLess plan, self-tests) and publishes it: blobs (If-None-Match), "
                        "then the signed manifest, then the signed latest pointer. Unchanged content publishes "
                        "nothing; a store failure leaves latest at the previous revision (re-run to finish).")
    sp.add_argument("--deployment", required=True, help="a deployment of params.yaml (planned already)")
    sp.add_argument("--store", help="store URI (default: params.yaml publish.store)")
    sp.add_argument("--key", help="private key file (default: $EDGEPLAN_SIGNING_KEY, else the only .key "
                    "beside the trusted keys)")
    sp.add_argument("--artifacts", default="artifacts", help="artifact root (default: artifacts)")
    sp.set_defaults(func=cmd_publish)
    sp = sub.add_parser("ls", help="list the deployments and revisions in a store",
                        description="Every deployment in the store: revisions, the latest (its signature checked "
                        "against the trusted keys), models, size, compiler.")
    sp.add_argument("store", nargs="?", help="store URI (default: params.yaml publish.store)")
    sp.add_argument("--deployment", help="only this deployment")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(func=cmd_ls)
