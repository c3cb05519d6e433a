"""Regression tests for what a correctly signed but hostile (or buggy) revision must not do to a device:
write outside ``--dest``, or become ``current`` without passing its health check (reliability issue, first
paragraph). The signing key is the publisher's own: signatures prove who wrote a manifest, not that its
names are safe."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgeplan.bundle.manifest import BlobRef, Latest, latest_key, manifest_key, sha256
from edgeplan.bundle.publish import read_latest
from edgeplan.errors import BundleVerificationError
from edgeplan.runtime import HealthCheckFailed, active, pull
from edgeplan.store import open_store


def _republish(published, change_manifest, extra_blobs=None) -> int:
    """Sign ``change_manifest(latest manifest)`` as the next revision with the publisher's key, put any
    ``extra_blobs`` {sha256: bytes} into the store, and point ``latest`` at it. Returns the revision."""
    store = open_store(published.store_uri)
    latest, manifest = read_latest(store, "solo", published.trusted)
    for digest, data in (extra_blobs or {}).items():
        store.put(f"blobs/sha256/{digest}", data)
    revision = latest.revision + 1
    bad = change_manifest(dataclasses.replace(manifest, revision=revision)).signed(published.key)
    raw = bad.encoded()
    store.put(manifest_key("solo", revision), raw)
    store.put(latest_key("solo"), Latest("solo", revision, sha256(raw)).signed(published.key).encoded())
    return revision


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): os.readlink(p) if p.is_symlink() else "" for p in sorted(root.rglob("*"))}


CLIMB = "../../../../../../outside/NAME"


def _climbing(m):
    victim = m.blobs[0]
    return dataclasses.replace(m, blobs=m.blobs + (BlobRef(CLIMB, victim.media_type, victim.size, victim.sha256),))


@pytest.mark.parametrize("name", [CLIMB, "/etc/passwd-edgeplan", "models/../../x", "a//b", ".hidden/x",
                                  "manifest.json", "models/solo\\..\\x", "models/ok/\u2028x"])
def test_signed_manifest_with_an_unsafe_blob_name_is_refused_before_anything_is_written(published, tmp_path, name):
    dest = tmp_path / "deep" / "a" / "b" / "c" / "d" / "e" / "dev"
    pull(open_store(published.store_uri), dest, published.trusted, device_id="edge-7")
    before = _tree(tmp_path / "deep")  # the device's side: --dest and every directory a climb could reach
    victim = active(dest)[1].blobs[0]
    _republish(published, lambda m: dataclasses.replace(
        m, blobs=m.blobs + (BlobRef(name, victim.media_type, victim.size, victim.sha256),)))
    with pytest.raises(BundleVerificationError, match="blobs\\[.*\\]\\.name .* refused"):
        pull(open_store(published.store_uri), dest, published.trusted, device_id="edge-7")
    assert _tree(tmp_path / "deep") == before  # nothing written anywhere, inside --dest or out of it
    assert not (tmp_path / "deep" / "outside").exists() and active(dest)[1].revision == 1


@pytest.mark.parametrize("change, field", [
    (lambda m: dataclasses.replace(m, blobs=m.blobs[:1] + (dataclasses.replace(m.blobs[1], size=10**18),)
                                    + m.blobs[2:]), "size"),
    (lambda m: dataclasses.replace(m, blobs=(dataclasses.replace(m.blobs[0], sha256="../x"),) + m.blobs[1:]),
     "sha256"),
    (lambda m: dataclasses.replace(m, models=(dataclasses.replace(m.models[0], name="../../m"),)), "name"),
    (lambda m: dataclasses.replace(m, models=(dataclasses.replace(m.models[0], version=7),)), "version"),
    (lambda m: dataclasses.replace(m, models=(dataclasses.replace(m.models[0], points=10**9),)), "points"),
    (lambda m: dataclasses.replace(m, plan="deployments/solo/plans/elsewhere.json"), "plan"),
    (lambda m: dataclasses.replace(m, blobs=tuple(b for b in m.blobs if not b.name.endswith("p1/suffix_int8.tflite"))),
     "suffix"),
    # found by bundle fuzzing (bench/reliability.py campaign 3, seed 2029): accepted before
    (lambda m: dataclasses.replace(m, blobs=tuple(b for b in m.blobs
                                                  if not b.name.endswith("p1/prefix_edgetpu.tflite"))), "prefix_edgetpu"),
    (lambda m: dataclasses.replace(m, blobs=tuple(dataclasses.replace(b, size=b.size + 1) if b.name.endswith(
        "p1/suffix_int8.tflite") else b for b in m.blobs)), "the manifest says"),
    (lambda m: dataclasses.replace(m, blobs=tuple(dataclasses.replace(b, size=b.size - 1) if b.name.endswith(
        "selftest/input_0.npy") else b for b in m.blobs)), "the manifest says"),
])
def test_signed_manifest_with_bad_fields_is_refused(published, tmp_path, change, field):
    dest = tmp_path / "dev"
    pull(open_store(published.store_uri), dest, published.trusted, device_id="edge-7")
    _republish(published, change)
    with pytest.raises(BundleVerificationError, match=field):
        pull(open_store(published.store_uri), dest, published.trusted, device_id="edge-7")
    assert active(dest)[1].revision == 1
    assert not any(p.name.startswith(".") for p in (dest / "revisions" / "solo").iterdir())  # no staging left


def test_a_revision_failing_its_health_check_in_any_way_never_becomes_current(published, tmp_path):
    """The plan blob replaced by valid JSON that is not a plan: loading it raises something other than
    HealthCheckFailed. Before the fix, `current` already pointed at the revision when that happened."""
    dest = tmp_path / "dev"
    pull(open_store(published.store_uri), dest, published.trusted, device_id="edge-7")
    link_before = os.readlink(dest / "current")
    junk = b'{"schema_version": 1}'

    def swap_plan(m):
        blobs = tuple(dataclasses.replace(b, size=len(junk), sha256=sha256(junk)) if b.name == m.plan else b
                      for b in m.blobs)
        return dataclasses.replace(m, blobs=blobs)

    revision = _republish(published, swap_plan, {sha256(junk): junk})
    with pytest.raises(HealthCheckFailed, match=f"revision {revision}.*not activated"):
        pull(open_store(published.store_uri), dest, published.trusted, device_id="edge-7")
    assert os.readlink(dest / "current") == link_before and active(dest)[1].revision == 1
    assert sorted(p.name for p in (dest / "revisions" / "solo").iterdir()) == ["1"]  # nothing staged is left
    assert not (dest / "previous").exists()


def test_cli_refuses_a_climbing_name_in_one_line(published, tmp_path):
    dest = tmp_path / "dev"
    pull(open_store(published.store_uri), dest, published.trusted, device_id="edge-7")
    _republish(published, _climbing)
    out = subprocess.run([sys.executable, "-m", "edgeplan.runtime.cli", "pull", published.store_uri, "--device-id",
                          "edge-7", "--dest", str(dest), "--trusted", str(published.trusted_dir)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "blobs[" in lines[0] and "not a relative path" in lines[0], out.stderr
    assert active(dest)[1].revision == 1
