"""A multi-device split travels in the signed bundle and runs from what each device pulled (issue 16 item 8, issue
15 part 5): two emulated hosts (their own hostnames, a full and a half core, shaped links); an ADaPS split planned
from conv speeds measured under each class's quota, or an AutoDiCE split planned from unit times and NSGA-II;
published, each device pulling only its own ranks' stages, and the head running the revision's self-tests through
the ranks, each rank reading its own host's pulled revision."""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil

import numpy as np
import pytest

from edgeplan.bundle import keys
from edgeplan.bundle.build import build
from edgeplan.bundle.manifest import BlobRef, sha256
from edgeplan.bundle.publish import publish
from edgeplan.distributed import emulate
from edgeplan.errors import ArtifactError, BundleVerificationError
from edgeplan.pipeline import params as params_mod
from edgeplan.pipeline.planning import plan_swapless
from edgeplan.plan.multidevice import spec
from edgeplan.plan.multidevice.deployment import plan_autodice
from edgeplan.plan.spatial.deployment import plan_spatial
from edgeplan.profile import cpu, fleet, run
from edgeplan.runtime import HealthCheckFailed, active, pull
from edgeplan.runtime.cli import main as runtime_main
from edgeplan.runtime.split import PLANNERS, read
from edgeplan.store import open_store

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("tc") or not shutil.which("nsenter"),
                                reason="emulated hosts need root, iproute2's tc and nsenter")

NAME = "pytest-sb"
DEP = "chain-split"
PLATFORM = ("dev-a, cpu, slots=0, net=1.25e7, quota=1.0\n"   # 100 Mbit/s links
            "dev-b, cpu, slots=0, net=1.25e7, quota=0.5\n")


def _params(hosts: dict[str, str]) -> dict:
    p = params_mod.load(None)
    classes = p["fleet"]["device_classes"]
    # CPU-only boards: the head's class has no Edge TPU either (its SwapLess plan runs the model on the CPU)
    classes["fast"] = {**{k: v for k, v in classes["coral-usb-emulated"].items() if k != "cpu_probe_ms"},
                       "net_bytes_per_s": 1.25e7, "arch": "cpu", "accelerator": {"kind": "none"}}
    classes["slow"] = {**classes["fast"], "cpu_quota": 0.5}
    p["deployments"] = [{"name": DEP, "device_class": "fast", "models": [{"name": "chain", "version": "1", "rate": 1.0}]}]
    p["fleet"]["devices"] = [{"id": dev, "device_class": cls, "deployment": DEP, "work_pool": cls, "host": hosts[dev]}
                             for dev, cls in (("dev-a", "fast"), ("dev-b", "slow"))]
    return p


@pytest.fixture(scope="module")
def published(request, compiled, tmp_path_factory):
    """(root, params, plan record, bundle, store, key, trusted) of a split planned by ``request.param``."""
    planner = request.param
    emulate.down(NAME)
    plat = emulate.up(NAME, spec.parse_text(PLATFORM, "platform"))
    try:
        root = tmp_path_factory.mktemp("spatial-bundle")
        src, _, _ = compiled("spatial_chain")
        d = root / "chain" / "1"
        shutil.copytree(src, d)
        p = _params({x.name: x.host for x in plat.devices})
        settings = cpu.Settings(repeats=5, min_repeats=2, span_s=0.2, budget_s=0.5)
        for cls in ("fast", "slow"):
            run.profile(d, fleet.load(p).device_class(cls), settings, conv_speed=planner == "spatial")
        swapless, _ = plan_swapless(root, DEP, p)
        assert [m.point for m in swapless.models] == [0]  # no Edge TPU: wholly on the CPU
        if planner == "spatial":
            record, _ = plan_spatial(root, DEP, p)
        else:  # the memory objective spreads the model over both devices
            p["multidevice"].update(population=20, generations=10, repeats=3)
            record, _ = plan_autodice(root, DEP, p, objective="memory")
        _, key_path, _ = keys.generate(root / "keys")
        key, trusted = keys.load_signing_key(key_path), keys.load_trusted([root / "keys"])
        store = open_store(root / "store")
        bundle = build(root, DEP, p)
        publish(store, bundle, key, trusted, fleet.load(p).devices)
        yield root, p, record, bundle, store, key, trusted
    finally:
        emulate.down(NAME)


@pytest.mark.parametrize("published", list(PLANNERS), indirect=True)
def test_each_device_pulls_its_own_ranks_and_the_head_runs_the_selftests(published, tmp_path, capsys):
    root, p, _, bundle, store, key, trusted = published
    devices = fleet.load(p).devices
    (planner,) = set(bundle.plans) & set(PLANNERS)
    kind = PLANNERS[planner]
    assert bundle.plans[planner] == f"deployments/{DEP}/plans/{planner}.json"
    tables = json.loads(bundle.blobs[f"deployments/{DEP}/{kind.dir}/tables.json"])
    stages = {s["int8"]: s["rank"] for s in tables["stages"]}
    assert set(stages.values()) == {0, 1}
    pulls = tmp_path / "pulls"
    for dev in ("dev-a", "dev-b"):  # dev-b is of another class than the deployment's: its rank admits it
        assert runtime_main(["pull", str(store.root), "--dest", str(pulls / dev), "--device-id", dev,
                             "--trusted", str(root / "keys")]) == 0
        assert f"ranks [{0 if dev == 'dev-a' else 1}] of its {planner} split" in capsys.readouterr().out
        res = pull(store, pulls / dev, trusted, device_id=dev)  # already active: nothing fetched
        assert not res.activated and res.fetched_blobs == 0
        rev_dir, manifest = active(pulls / dev)
        share = read(rev_dir)
        rank = [r["rank"] for r in tables["ranks"] if r["device"] == dev]
        assert list(share.ranks) == rank and share.head == (rank == [0])
        split_dir = rev_dir / "deployments" / DEP / kind.dir
        held = {f"int8/{f.name}" for f in (split_dir / "int8").iterdir()}
        assert held == {f for f, r in stages.items() if r in rank}  # its own stages, never another rank's
        assert (rev_dir / "models").is_dir() == share.head  # the rest of the revision only on the head
        assert res.blobs == len([b for b in manifest.blobs if share.wants(b.name)]) < len(manifest.blobs)
    # the other device serves nothing itself
    assert runtime_main(["serve", str(pulls / "dev-b")]) == 1
    assert "serves nothing itself" in capsys.readouterr().err
    # the head runs the self-tests through the ranks, each rank on its own host reading its own pulled revision
    code = runtime_main(["mpi", "run", str(pulls / "dev-a"), "--selftest", "--emulated", NAME,
                         "--rank-dest", str(pulls / "{hostname}"), "--timeout", "120"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "self-test passed over the ranks: 2 of 2 outputs identical" in out
    assert "rank 1 on dev-b" in out
    # a tile broken on the other device after its pull: its rank refuses it, naming the file
    rev_b = active(pulls / "dev-b")[0] / "deployments" / DEP / kind.dir
    tile = next((rev_b / "int8").iterdir())
    data = tile.read_bytes()
    tile.unlink()  # a hard link into the blob store: replaced, not written through
    tile.write_bytes(data[:-1] + b"\0")
    assert runtime_main(["mpi", "run", str(pulls / "dev-a"), "--selftest", "--emulated", NAME,
                         "--rank-dest", str(pulls / "{hostname}"), "--timeout", "120"]) == 1
    assert f"{tile.name}: sha256 differs" in capsys.readouterr().err
    # a revision whose self-test fails over the ranks (the head's expected output edited after its pull): every
    # device of the split goes back to the revision it had before
    before = active(pulls / "dev-a")[1].revision
    publish(store, _with(bundle, f"deployments/{DEP}/plans/swapless.json",
                         bundle.blobs[f"deployments/{DEP}/plans/swapless.json"] + b"\n"), key, trusted, devices)
    for dev in ("dev-a", "dev-b"):
        pull(store, pulls / dev, trusted, device_id=dev)
        assert active(pulls / dev)[1].revision > before
    rev_a, manifest = active(pulls / "dev-a")
    after = manifest.revision
    expected = rev_a / manifest.models[0].selftests[0].expected
    y = np.load(expected)
    expected.unlink()  # a hard link into the blob store: replaced, not written through
    np.save(expected, y ^ 1)
    assert runtime_main(["mpi", "run", str(pulls / "dev-a"), "--selftest", "--emulated", NAME,
                         "--rank-dest", str(pulls / "{hostname}"), "--timeout", "120"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "self-test FAILED over the ranks" in err and "rolled back" in err, err
    for dev in ("dev-a", "dev-b"):
        assert active(pulls / dev)[1].revision == before, dev
        assert f"{dev} {after} -> {before}" in err, err


def _with(bundle, name: str, data: bytes):
    blobs = {**bundle.blobs, name: data}
    refs = tuple(BlobRef(r.name, r.media_type, len(blobs[r.name]), sha256(blobs[r.name])) for r in bundle.refs)
    return dataclasses.replace(bundle, blobs=blobs, refs=refs)


@pytest.mark.parametrize("published", ["spatial"], indirect=True)
def test_untrusted_tables_and_strangers_are_refused(published, tmp_path):
    root, p, _, bundle, store, key, trusted = published
    devices = fleet.load(p).devices
    dest = tmp_path / "a"
    pull(store, dest, trusted, device_id="dev-a")
    first = active(dest)[1].revision  # the store is the module's: another test may have published before
    name = f"deployments/{DEP}/spatial/tables.json"
    doc = json.loads(bundle.blobs[name])
    doc["stages"][0]["int8_sha256"] = sha256(b"another")  # names a tile the revision does not carry
    publish(store, _with(bundle, name, json.dumps(doc).encode()), key, trusted, devices)
    with pytest.raises(BundleVerificationError, match="is not a blob of the revision"):
        pull(store, dest, trusted, device_id="dev-a")
    doc = json.loads(bundle.blobs[name])
    doc["head"] = 7
    publish(store, _with(bundle, name, json.dumps(doc).encode()), key, trusted, devices)
    with pytest.raises(BundleVerificationError, match="head 7 is not one of its 2 ranks"):
        pull(store, dest, trusted, device_id="dev-a")
    assert active(dest)[1].revision == first  # nothing of those became current
    # a tile whose bytes load but are not the rank's (another stage's file under its name): the health check
    doc = json.loads(bundle.blobs[name])
    a, b = doc["stages"][0], doc["stages"][-1]
    swapped = _with(bundle, f"deployments/{DEP}/spatial/{a['int8']}", bundle.blobs[f"deployments/{DEP}/spatial/{b['int8']}"])
    doc["stages"][0]["int8_sha256"] = sha256(swapped.blobs[f"deployments/{DEP}/spatial/{a['int8']}"])
    publish(store, _with(swapped, name, json.dumps(doc).encode()), key, trusted, devices)
    with pytest.raises(HealthCheckFailed, match="stages of the split do not load"):
        pull(store, dest, trusted, device_id="dev-a")
    assert active(dest)[1].revision == first
    # a device of the deployment the split does not name (registered after the plan) is refused at pull
    p2 = copy.deepcopy(p)
    p2["fleet"]["devices"].append({"id": "dev-c", "device_class": "fast", "deployment": DEP, "work_pool": "fast"})
    publish(store, bundle, key, trusted, fleet.load(p2).devices)
    with pytest.raises(BundleVerificationError, match="device dev-c has no rank in it"):
        pull(store, tmp_path / "c", trusted, device_id="dev-c")
    # and the build refuses tiles that are not the ones the plan names
    tile = root / "deployments" / DEP / "spatial" / a["int8"]
    kept = tile.read_bytes()
    try:
        tile.write_bytes(kept + b"\0")
        with pytest.raises(ArtifactError, match="not the stage the tables name"):
            build(root, DEP, p)
    finally:
        tile.write_bytes(kept)
