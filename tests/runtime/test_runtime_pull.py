"""`edgeplan-runtime pull` against a real published deployment: verify, fetch, activate, delta re-pull,
resume, anti-rollback, rollback, tampering, unknown keys, another device class, emulated prefixes on a real
Edge TPU, a failing health check, an unreachable store."""
from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeplan.bundle import keys
from edgeplan.bundle.build import build
from edgeplan.bundle.manifest import BlobRef, Latest, blob_key, latest_key, sha256
from edgeplan.errors import BundleVerificationError
from edgeplan.runtime import HealthCheckFailed, PullRefused, active, pull, rollback
from edgeplan.store import open_store


def _pull(published, dest, **kw):
    return pull(open_store(published.store_uri), dest, published.trusted, device_id=kw.pop("device_id", "edge-7"), **kw)


def test_pull_activates_and_health_checks(published, tmp_path):
    dest = tmp_path / "dev"
    res = _pull(published, dest)
    path, manifest = active(dest)
    assert res.activated and res.revision == 1 and res.fetched_blobs == len({b.sha256 for b in manifest.blobs}) > 10
    assert manifest.deployment == "solo" and (dest / "current").is_symlink()
    for b in manifest.blobs:  # every file is the blob the manifest names
        assert sha256((path / b.name).read_bytes()) == b.sha256
    again = _pull(published, dest)
    assert not again.activated and again.fetched_bytes == 0


def test_delta_repull_resume_rollback_and_anti_rollback(published, tmp_path):
    dest = tmp_path / "dev"
    store = open_store(published.store_uri)
    first = _pull(published, dest)
    old_latest = store.get(latest_key("solo"))
    published.second_revision()
    res = _pull(published, dest)
    _, manifest = active(dest)
    assert res.activated and res.revision == 2 and res.previous == 1
    plan_ref = manifest.blob(manifest.plan)
    assert res.fetched_blobs == 1 and res.fetched_bytes == plan_ref.size  # only the changed blob moved
    assert first.fetched_bytes > 10 * res.fetched_bytes
    # rollback and back
    was, now = rollback(dest)
    assert (was.revision, now.revision) == (2, 1) and active(dest)[1].revision == 1
    # the store replays revision 1's latest pointer (validly signed): refused, revision 1 stays active
    store.put(latest_key("solo"), old_latest)
    with pytest.raises(PullRefused, match="older than revision 2"):
        _pull(published, dest)
    assert active(dest)[1].revision == 1
    assert _pull(published, dest, allow_older=True).revision == 1  # on purpose: accepted


def test_interrupted_download_resumes(published, tmp_path):
    dest = tmp_path / "dev"
    store = open_store(published.store_uri)
    found_latest = Latest.parse(store.get(latest_key("solo")), published.trusted, "latest")
    from edgeplan.bundle.publish import read_latest

    _, manifest = read_latest(store, "solo", published.trusted)
    big = max(manifest.blobs, key=lambda b: b.size)
    data = store.get(blob_key(big.sha256))
    part = dest / (blob_key(big.sha256) + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(data[: len(data) // 2])  # a download cut off half-way
    res = _pull(published, dest)
    total = sum(b.size for b in {b.sha256: b for b in manifest.blobs}.values())
    assert res.revision == found_latest.revision
    assert res.fetched_bytes == total - len(data) // 2  # the half already there was not fetched again


def test_tampered_blob_is_refused_and_the_active_revision_stays(published, tmp_path):
    dest = tmp_path / "dev"
    _pull(published, dest)
    published.second_revision()
    store = open_store(published.store_uri)
    from edgeplan.bundle.publish import read_latest

    _, manifest = read_latest(store, "solo", published.trusted)
    plan_key = blob_key(manifest.blob(manifest.plan).sha256)
    path = Path(published.store_uri) / plan_key
    path.write_bytes(path.read_bytes().replace(b'"cores"', b'"CORES"'))
    with pytest.raises(BundleVerificationError, match="sha256"):
        _pull(published, dest)
    assert active(dest)[1].revision == 1


def test_unknown_key_other_class_and_real_edgetpu_are_refused(published, tmp_path):
    dest = tmp_path / "dev"
    # a latest pointer re-signed by a key the device does not trust
    other_dir = tmp_path / "other"
    _, other_path, _ = keys.generate(other_dir)
    store = open_store(published.store_uri)
    good = store.get(latest_key("solo"))
    latest = Latest.parse(good, published.trusted, "latest")
    store.put(latest_key("solo"), latest.signed(keys.load_signing_key(other_path)).encoded())
    with pytest.raises(BundleVerificationError, match="not trusted"):
        _pull(published, dest)
    store.put(latest_key("solo"), good)
    with pytest.raises(PullRefused, match="device class"):
        pull(store, dest, published.trusted, deployment="solo", device_class="coral-pcie")
    with pytest.raises(PullRefused, match="emulated compiler"):
        _pull(published, dest, accelerator="edgetpu-usb")
    assert active(dest) is None  # nothing was activated


def test_failing_health_check_rolls_back(published, tmp_path):
    dest = tmp_path / "dev"
    _pull(published, dest)
    bundle = build(published.root, "solo", published.params)
    entry = bundle.models[0]
    name = entry.selftests[0].expected
    y = np.load(io.BytesIO(bundle.blobs[name]))
    y.flat[0] = y.flat[0] + 1 if y.flat[0] < 127 else y.flat[0] - 1  # the bundle expects another output
    buf = io.BytesIO()
    np.save(buf, y)
    blobs = {**bundle.blobs, name: buf.getvalue()}
    refs = tuple(BlobRef(r.name, r.media_type, len(blobs[r.name]), sha256(blobs[r.name])) for r in bundle.refs)
    assert published.publish(dataclasses.replace(bundle, blobs=blobs, refs=refs)).revision == 2
    with pytest.raises(HealthCheckFailed, match="self-test"):
        _pull(published, dest)
    assert active(dest)[1].revision == 1  # never activated


def test_cli_pull_status_rollback_and_unreachable_store(published, tmp_path):
    dest = tmp_path / "dev"
    env = {**os.environ, "EDGEPLAN_TRUSTED_KEYS": str(published.trusted_dir),
           "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "1"}

    def rt(*args):
        return subprocess.run([sys.executable, "-m", "edgeplan.runtime.cli", *args], env=env, capture_output=True,
                              text=True, timeout=300)

    out = rt("pull", published.store_uri, "--device-id", "edge-7", "--dest", str(dest))
    assert out.returncode == 0 and "activated solo revision 1" in out.stdout, out.stderr
    assert json.loads(rt("status", "--dest", str(dest)).stdout)["revision"] == 1
    assert "no previous revision" in rt("rollback", "--dest", str(dest)).stderr
    # the store is down: a clear error, the active revision stays
    down = rt("pull", "s3://edgeplan/nowhere", "--deployment", "solo", "--dest", str(dest), "--retries", "1",
              "--retry-wait", "0")
    assert down.returncode == 1 and "revision 1 of solo stays active" in down.stderr, down.stderr
    assert active(dest)[1].revision == 1
    missing = subprocess.run([sys.executable, "-m", "edgeplan.runtime.cli", "pull", published.store_uri,
                              "--device-id", "edge-7", "--dest", str(dest)], env={**os.environ,
                              "EDGEPLAN_TRUSTED_KEYS": ""}, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "no trusted public keys" in missing.stderr
