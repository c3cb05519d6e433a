"""Bundles of a real compiled deployment published to both stores (local directory; S3 on a real moto
server): keys, signatures, idempotence, the verify gate, wrong keys, a store that goes down mid-publish."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal

import boto3
import pytest

from edgeplan.artifacts import VerifyReport
from edgeplan.bundle import keys
from edgeplan.bundle.build import build
from edgeplan.bundle.manifest import (
    Latest,
    Manifest,
    blob_key,
    latest_key,
    manifest_key,
)
from edgeplan.bundle.publish import listing, publish, read_latest
from edgeplan.errors import (
    ArtifactError,
    BundleVerificationError,
    SigningKeyError,
    StoreError,
)
from edgeplan.profile import fleet
from edgeplan.store import open_store
from edgeplan.store.moto_server import moto_server


@pytest.fixture(scope="module")
def signing(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    _, key_path, _ = keys.generate(d)
    return keys.load_signing_key(key_path), keys.load_trusted([d])


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return open_store(tmp_path / "store")
    url = request.getfixturevalue("s3_server")
    return open_store(f"s3://edgeplan/{request.node.name.replace('[', '-').rstrip(']')}", endpoint_url=url)


def test_key_files(tmp_path):
    kid, key_path, _ = keys.generate(tmp_path)
    assert kid.startswith("ed25519:") and key_path.stat().st_mode & 0o777 == 0o600
    assert keys.load_signing_key(key_path).key_id == kid
    assert list(keys.load_trusted([tmp_path])) == [kid]
    os.environ[keys.ENV] = key_path.read_text()
    try:
        assert keys.load_signing_key().key_id == kid  # the PEM text in the environment
        os.environ[keys.ENV] = str(key_path)
        assert keys.load_signing_key().key_id == kid  # or a path
    finally:
        del os.environ[keys.ENV]
    with pytest.raises(SigningKeyError, match="no signing key"):
        keys.load_signing_key()
    (tmp_path / "junk.key").write_text("not a key")
    with pytest.raises(SigningKeyError, match="not an unencrypted PEM"):
        keys.load_signing_key(tmp_path / "junk.key")


def test_publish_verify_and_republish(deployment_root, signing, store):
    root, params = deployment_root
    key, trusted = signing
    bundle = build(root, "solo", params)
    names = {r.name for r in bundle.refs}
    assert "deployments/solo/plans/swapless.json" in names
    assert "models/tiny_cnn/1/segments/p1/prefix_edgetpu.tflite" in names
    assert "models/tiny_cnn/1/profiles/coral-usb-emulated.json" in names
    devices = fleet.load(params).devices
    first = publish(store, bundle, key, trusted, devices)
    assert first.revision == 1 and first.new_revision and first.uploaded_blobs == len({r.sha256 for r in bundle.refs})
    # what a device does: latest -> manifest -> blobs, every signature and checksum checked
    latest, manifest = read_latest(store, "solo", trusted)
    assert latest.revision == 1 and manifest.key_id == key.key_id and manifest.compiler == "emulated"
    for ref in manifest.blobs:
        assert hashlib.sha256(store.get(blob_key(ref.sha256))).hexdigest() == ref.sha256
    if store.uri.startswith("s3://"):  # a standard client sees the same bytes
        plain = boto3.client("s3", endpoint_url=store.endpoint_url)
        ref = manifest.blob("models/tiny_cnn/1/segments/p1/prefix_edgetpu.tflite")
        body = plain.get_object(Bucket="edgeplan", Key=f"{store.prefix}/{blob_key(ref.sha256)}")["Body"].read()
        assert hashlib.sha256(body).hexdigest() == ref.sha256
    m = manifest.models[0]
    assert m.input.to_int8_layout == (0, 2, 3, 1) and m.input.dtype == "int8" and len(m.selftests) == 2
    dev = json.loads(store.get("devices/edge-7.json"))
    assert dev["deployment"] == "solo" and dev["device_class"] == "coral-usb-emulated"
    # the same content again: no new revision, nothing uploaded
    again = publish(store, build(root, "solo", params), key, trusted, devices)
    assert not again.new_revision and again.revision == 1 and again.uploaded_bytes == 0
    # a changed plan: revision 2, only the plan blob goes up
    plan = root / "deployments" / "solo" / "plans" / "swapless.json"
    saved = plan.read_bytes()
    try:
        data = json.loads(saved)
        data["notes"] = ["re-planned"]
        plan.write_text(json.dumps(data))
        second = publish(store, build(root, "solo", params), key, trusted, devices)
    finally:
        plan.write_bytes(saved)
    assert second.revision == 2 and second.uploaded_blobs == 1
    assert listing(store, trusted)[0]["revisions"] == [1, 2]


def test_tampering_is_detected(deployment_root, signing, tmp_path):
    root, params = deployment_root
    key, trusted = signing
    store = open_store(tmp_path / "store")
    publish(store, build(root, "solo", params), key, trusted)
    raw = json.loads(store.get(manifest_key("solo", 1)))
    raw["revision"] = 9
    store.put(manifest_key("solo", 1), json.dumps(raw).encode())
    with pytest.raises(BundleVerificationError, match="sha256 differs"):
        read_latest(store, "solo", trusted)
    forged = Manifest.from_json(raw)
    with pytest.raises(BundleVerificationError, match="does not match"):
        Manifest.parse(forged.encoded(), trusted, "forged")
    other = keys.load_signing_key(keys.generate(tmp_path / "other")[1])
    latest = Latest("solo", 1, "0" * 64).signed(other)
    with pytest.raises(BundleVerificationError, match="not trusted"):
        Latest.parse(latest.encoded(), trusted, "latest")


def test_wrong_key_and_failed_verify_publish_nothing(deployment_root, signing, tmp_path):
    root, params = deployment_root
    _, trusted = signing
    store = open_store(tmp_path / "store")
    stranger = keys.load_signing_key(keys.generate(tmp_path / "stranger")[1])
    with pytest.raises(SigningKeyError, match="do not trust"):
        publish(store, build(root, "solo", params), stranger, trusted)
    assert store.list() == []
    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    report = VerifyReport.load(bad / "tiny_cnn" / "1" / "verify.json")
    VerifyReport(**{**report.__dict__, "ok": False}).save(bad / "tiny_cnn" / "1" / "verify.json")
    with pytest.raises(ArtifactError, match="failed verify"):
        build(bad, "solo", params)


def test_store_down_mid_publish_then_rerun(deployment_root, signing, tmp_path):
    """A real S3 server stopped (SIGSTOP) after the first blobs: publish retries, then fails clearly with
    `latest` never written; resumed (SIGCONT), a rerun uploads only the rest."""
    root, params = deployment_root
    key, trusted = signing
    with moto_server(bucket="down") as server:
        proc = server.proc
        try:
            store = open_store("s3://down/x", endpoint_url=server.url, retries=2, timeout_s=1)
            bundle = build(root, "solo", params)
            sent = []

            def stop_after_three(n):
                sent.append(n)
                if len(sent) == 3:
                    proc.send_signal(signal.SIGSTOP)

            with pytest.raises(StoreError, match="gave up after"):
                publish(store, bundle, key, trusted, progress=stop_after_three)
            proc.send_signal(signal.SIGCONT)
            assert not store.exists(latest_key("solo")) and not store.exists(manifest_key("solo", 1))
            done = publish(store, bundle, key, trusted)
            assert done.revision == 1 and done.uploaded_blobs == len({r.sha256 for r in bundle.refs}) - 3
            assert read_latest(store, "solo", trusted)[0].revision == 1
        finally:
            proc.send_signal(signal.SIGCONT)  # a stopped server would not take the SIGTERM that stops it


def test_cli_keys_publish_ls(deployment_root, tmp_path, capsys):
    import yaml

    from edgeplan.cli import main

    root, params = deployment_root
    keydir = tmp_path / "keys"
    p = {k: params[k] for k in ("deployments", "fleet")}
    p["publish"] = {"store": str(tmp_path / "store"), "trusted_keys": [str(keydir)]}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(p))
    args = ["--params", str(tmp_path / "params.yaml")]
    assert main([*args, "publish", "--deployment", "solo", "--artifacts", str(root)]) == 2  # no key yet
    assert "no signing key" in " ".join(capsys.readouterr().err.split())
    assert main([*args, "keys", "generate"]) == 0
    assert main([*args, "publish", "--deployment", "solo", "--artifacts", str(root)]) == 0
    assert "revision 1" in " ".join(capsys.readouterr().out.split())
    assert main([*args, "publish", "--deployment", "solo", "--artifacts", str(root)]) == 0
    assert "nothing published" in " ".join(capsys.readouterr().out.split())
    assert main([*args, "ls", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["deployment"] == "solo" and rows[0]["latest"] == 1 and rows[0]["verified"]


def test_a_schema_1_manifest_is_still_read_and_schema_2_carries_the_plans_map(deployment_root, signing, tmp_path):
    import dataclasses

    from edgeplan.bundle.manifest import Manifest

    root, params = deployment_root
    key, trusted = signing
    store = open_store(tmp_path / "store")
    publish(store, build(root, "solo", params), key, trusted, fleet.load(params).devices)
    _, m2 = read_latest(store, "solo", trusted)
    assert m2.schema_version == 2 and m2.plans == {"swapless": "deployments/solo/plans/swapless.json"}
    # a revision written before schema 2: no plans map in its bytes, nor in what its signature covers
    old = dataclasses.replace(m2, schema_version=1, plans={}).signed(key)
    raw = old.encoded()
    assert b'"plans"' not in raw and b'"schema_version":1' in raw
    back = Manifest.parse(raw, trusted, "old")
    assert back.schema_version == 1 and back.plans == {} and back.blobs == m2.blobs
    # a device writes the verified manifest beside the revision's files and reads it back (read_manifest)
    assert Manifest.from_json(json.loads(json.dumps(back.to_json()))) == back
    # an unknown planner, or a plan that is not a blob, is refused
    for plans in ({"nope": m2.plan}, {"flashmem": "deployments/solo/plans/flashmem.json"}):
        bad = dataclasses.replace(m2, plans=plans).signed(key)
        from edgeplan.bundle.validate import manifest as check

        with pytest.raises(BundleVerificationError, match="plans"):
            check(Manifest.parse(bad.encoded(), trusted, "bad"), "bad")


def test_a_plan_with_an_unstable_rate_regime_builds(deployment_root, tmp_path):
    """Regression (stop 46's CI, the overload test's publish): a rate regime no configuration keeps stable has no
    points and no cores, and the build's accuracy-gate check indexed them (IndexError). How many regimes are
    unstable depends on the profile's times, so on how fast the machine was when it measured them."""
    from dataclasses import replace

    from edgeplan.plan.swapless.plan import Regime, SwapLessPlan

    root, params = deployment_root
    copy = tmp_path / "root"
    shutil.copytree(root, copy)
    path = copy / "deployments" / "solo" / "plans" / "swapless.json"
    plan = SwapLessPlan.load(path)
    unstable = Regime(tuple(1e6 for _ in plan.models), (), (), None)
    replace(plan, regimes=(*plan.regimes, unstable)).save(path)
    bundle = build(copy, "solo", params)
    assert "deployments/solo/plans/swapless.json" in {r.name for r in bundle.refs}
    assert SwapLessPlan.load(path).stable_regimes() == plan.stable_regimes()
