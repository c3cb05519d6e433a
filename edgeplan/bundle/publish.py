"""Publishing a deployment revision to a store: blobs first (If-None-Match: idempotent, a rerun uploads
only what is missing), then the signed manifest, then the signed ``latest`` pointer last, so a reader never
sees a half-published revision; ``devices/<id>.json`` from the fleet registry.

The signing key is checked before anything is uploaded: it must load, be ed25519 and, when trusted keys are
configured, be one of them (devices would refuse anything else). A revision whose content equals the
latest one is not published again (same model version submitted twice: idempotent).
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgeplan.bundle import keys, validate
from edgeplan.bundle.manifest import (
    Latest,
    Manifest,
    blob_key,
    canonical,
    latest_key,
    manifest_key,
    sha256,
)
from edgeplan.errors import (
    BundleVerificationError,
    PublishConflictError,
    SigningKeyError,
    StoreError,
    StoreKeyNotFound,
)

if TYPE_CHECKING:  # devices read bundles with this module: nothing of the build side at run time
    from edgeplan.bundle.build import Bundle

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublishResult:
    deployment: str
    revision: int
    new_revision: bool  # False: the latest revision already serves exactly this content
    blobs: int
    uploaded_blobs: int  # distinct contents uploaded (equal files are one blob)
    uploaded_bytes: int
    skipped_bytes: int  # already in the store
    manifest_sha256: str
    devices: tuple[str, ...]


def retrying(what: str, fn, attempts: int = 4, backoff_s: float = 0.5):
    """``fn()`` with retries and exponential backoff on store failures (not on a missing key)."""
    for k in range(attempts):
        try:
            return fn()
        except StoreKeyNotFound:
            raise
        except StoreError as e:
            if k == attempts - 1:
                raise StoreError(f"{e} — gave up after {attempts} attempts ({what})") from e
            log.warning("%s failed (%s); retrying in %.1f s", what, e, backoff_s * 2**k)
            time.sleep(backoff_s * 2**k)
    raise AssertionError("unreachable")


def check_signing_key(key: keys.SigningKey, trusted: dict) -> None:
    if trusted and key.key_id not in trusted:
        raise SigningKeyError(f"signing key {key.source} has id {key.key_id}, which the devices do not trust "
                              f"(trusted: {', '.join(sorted(trusted))}); nothing was uploaded. Use a trusted "
                              "key, or add its .pub to publish.trusted_keys")


def read_latest(store, deployment: str, trusted: dict) -> tuple[Latest, Manifest] | None:
    """The verified latest revision of ``deployment`` and its manifest (signatures checked, then every name,
    size and type, see ``validate``), None when never published."""
    validate.component(deployment, "deployment", "name")
    key = latest_key(deployment)
    try:
        data = retrying(f"read {key}", lambda: store.get(key))
    except StoreKeyNotFound:
        return None
    latest = Latest.parse(data, trusted, f"{store.uri}/{key}")
    validate.latest(latest, f"{store.uri}/{key}", deployment)
    mkey = manifest_key(deployment, latest.revision)
    raw = retrying(f"read {mkey}", lambda: store.get(mkey))
    if sha256(raw) != latest.manifest_sha256:
        raise BundleVerificationError(f"{store.uri}/{mkey}: sha256 differs from what {key} names")
    manifest = Manifest.parse(raw, trusted, f"{store.uri}/{mkey}")
    validate.manifest(manifest, f"{store.uri}/{mkey}", deployment, latest.revision)
    return latest, manifest


def publish(store, bundle: Bundle, key: keys.SigningKey, trusted: dict | None = None, devices=(),
            progress=None) -> PublishResult:
    """Publish ``bundle`` as the next revision of its deployment (see the module docstring).
    ``devices``: the registry's devices of this deployment (their ``devices/<id>.json`` are written);
    ``progress(bytes)`` is called as blobs go up. A store that fails past the retries: a StoreError that says
    what stays published."""
    try:
        return _publish(store, bundle, key, trusted, devices, progress)
    except StoreKeyNotFound:
        raise
    except StoreError as e:  # latest is written last: it still names what it named
        raise StoreError(f"{e}; nothing after it was written and `latest` still names the previous revision; "
                         "re-run to publish the rest") from e


def _publish(store, bundle: Bundle, key: keys.SigningKey, trusted: dict | None, devices, progress) -> PublishResult:
    trusted = dict(trusted or {})
    check_signing_key(key, trusted)
    trusted.setdefault(key.key_id, key.public)
    current = read_latest(store, bundle.deployment, trusted)
    device_ids = _write_devices(store, bundle, key, devices)
    if current is not None and current[1].content_sha256 == bundle.content_sha256:
        latest, manifest = current
        return PublishResult(bundle.deployment, latest.revision, False, len(bundle.refs), 0, 0, bundle.size,
                             latest.manifest_sha256, device_ids)
    uploaded = up_bytes = skipped = 0
    unique = {ref.sha256: ref for ref in bundle.refs}  # content-addressed: equal files are one blob
    for ref in unique.values():
        k = blob_key(ref.sha256)
        data = bundle.blobs[ref.name]
        if retrying(f"upload {ref.name}", lambda k=k, data=data: store.put(k, data, if_absent=True)):
            uploaded += 1
            up_bytes += ref.size
        else:
            skipped += ref.size
        if progress:
            progress(ref.size)
    revision = current[0].revision + 1 if current else 1
    manifest = Manifest(bundle.deployment, revision, bundle.device_class, bundle.accelerator, bundle.compiler,
                        bundle.code_version, dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                        bundle.content_sha256, key.key_id, bundle.models, bundle.plan, bundle.refs,
                        plans=bundle.plans).signed(key)
    raw = manifest.encoded()
    mkey = manifest_key(bundle.deployment, revision)
    if not retrying(f"write {mkey}", lambda: store.put(mkey, raw, if_absent=True)):
        other = Manifest.parse(store.get(mkey), trusted, f"{store.uri}/{mkey}")
        if other.content_sha256 != bundle.content_sha256:
            raise PublishConflictError(f"{store.uri}/{mkey}: revision {revision} was published meanwhile with "
                                       "other content (two publishers at once?); re-run to publish after it")
        raw = store.get(mkey)
    latest = Latest(bundle.deployment, revision, sha256(raw)).signed(key)
    retrying(f"write {latest_key(bundle.deployment)}",
             lambda: store.put(latest_key(bundle.deployment), latest.encoded()))  # last
    return PublishResult(bundle.deployment, revision, True, len(bundle.refs), uploaded, up_bytes, skipped,
                         sha256(raw), device_ids)


def _write_devices(store, bundle: Bundle, key: keys.SigningKey, devices) -> tuple[str, ...]:
    """``devices/<id>.json``: {device_id, deployment, device_class}, signed like a manifest."""
    ids = []
    for d in devices:
        doc = {"device_id": d.id, "deployment": bundle.deployment, "device_class": d.device_class,
               "key_id": key.key_id}
        doc["signature"] = key.sign(canonical(doc))
        k = f"devices/{d.id}.json"
        retrying(f"write {k}", lambda k=k, doc=doc: store.put(k, json.dumps(doc, indent=2).encode()))
        ids.append(d.id)
    return tuple(ids)


def listing(store, trusted: dict | None = None) -> list[dict]:
    """Every deployment in the store: its revisions, the latest (verified when ``trusted`` is given),
    its size and models."""
    out = []
    keys = [k.split("/") for k in store.list("deployments/")]
    for name in sorted({parts[1] for parts in keys if len(parts) >= 3}):
        revisions = sorted({int(parts[2]) for parts in keys if parts[1] == name and len(parts) == 4
                            and parts[3] == "manifest.json" and parts[2].isdigit()})
        row = {"deployment": name, "revisions": revisions, "latest": None}
        if trusted:
            found = read_latest(store, name, trusted)  # raises on a bad signature
        else:
            try:
                latest = Latest.from_json(json.loads(store.get(latest_key(name))))
            except StoreKeyNotFound:
                found = None
            else:
                mkey = manifest_key(name, latest.revision)
                found = latest, Manifest.from_json(json.loads(store.get(mkey)), source=f"{store.uri}/{mkey}")
        if found is not None:
            latest, m = found
            row.update(latest=latest.revision, device_class=m.device_class, created=m.created, key_id=m.key_id,
                       models=[f"{x.name}:{x.version}" for x in m.models], blobs=len(m.blobs),
                       bytes=sum(b.size for b in m.blobs), compiler=m.compiler)
            if trusted:
                row["verified"] = True
        out.append(row)
    return out
