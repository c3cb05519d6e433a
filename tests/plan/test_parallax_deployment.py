"""`edgeplan plan parallax` end to end on a model with branches (light_inception_v1): the model stage measured
here (every candidate layer kept: ``parallax.force``), the deployment's plan after SwapLess, the plan and its
sub-models in a signed bundle, pulled (health-checked branch-parallel) and served by the runtime, which gives the
bits of the suffixes run whole. A plan naming a sub-model that is not its blob is refused at pull."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time

import numpy as np
import pytest
import yaml

from edgeplan.bundle import keys
from edgeplan.bundle.build import build
from edgeplan.bundle.manifest import BlobRef, sha256
from edgeplan.bundle.publish import publish
from edgeplan.cli import main
from edgeplan.errors import ArtifactError, PlanError
from edgeplan.pipeline import params as params_mod
from edgeplan.pipeline import stages
from edgeplan.pipeline.planning import plan_swapless
from edgeplan.plan.parallax.deployment import ParallaxDeploymentPlan, plan_parallax
from edgeplan.profile import cpu, fleet, run
from edgeplan.runtime import HealthCheckFailed, active, pull
from edgeplan.runtime.engine import Runtime
from edgeplan.runtime.model import load_inputs
from edgeplan.runtime.parallel import ParallelError
from edgeplan.store import open_store

DEP = "inc-solo"


@pytest.fixture(scope="module")
def planned(compiled, tmp_path_factory):
    root = tmp_path_factory.mktemp("parallax-deployment")
    src, _, _ = compiled("light_inception_v1")
    d = root / "inc" / "1"
    shutil.copytree(src, d)
    p = params_mod.load(None)
    p["parallax"].update(min_nodes=1, beta=100.0, repeats=3, force=True)
    stages.parallax(d, p)
    run.profile(d, fleet.load(p).device_class("coral-usb-emulated"),
                cpu.Settings(repeats=5, min_repeats=2, span_s=0.2, budget_s=0.5))
    p["deployments"] = [{"name": DEP, "device_class": "coral-usb-emulated",
                         "models": [{"name": "inc", "version": "1", "rate": 5.0}]}]
    p["fleet"]["devices"] = [{"id": "edge-px", "device_class": "coral-usb-emulated", "deployment": DEP,
                              "work_pool": "coral-usb-emulated"}]
    plan_swapless(root, DEP, p)
    plan, path = plan_parallax(root, DEP, p)
    return root, d, p, plan, path


def test_the_plan_names_the_branch_parallel_suffixes_and_their_sub_models(planned, tmp_path, capsys):
    root, d, p, plan, path = planned
    assert ParallaxDeploymentPlan.load(path) == plan
    (m,) = plan.models
    assert m.workers == 2 and m.points, m.why  # SwapLess gives the one model both cores in some regime
    record = json.loads((d / "parallax" / "parallax.json").read_text())
    for pp in m.points:
        suffix = (d / "segments" / f"p{pp.point}" / "suffix_int8.tflite").read_bytes()
        assert pp.suffix_sha256 == hashlib.sha256(suffix).hexdigest() and pp.parallel_layers > 0
        target = record["targets"][f"p{pp.point}"]
        target = record["targets"][target["same_as"]] if "same_as" in target else target
        assert len(pp.stages) == len(target["stages"])
        for st in pp.stages:
            for s in st.submodels:
                blob = (root / "deployments" / DEP / s.file).read_bytes()
                assert hashlib.sha256(blob).hexdigest() == s.sha256 and len(blob) == s.size
    # the command prints the table and writes the same plan
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(p))
    assert main(["--params", str(params_file), "plan", "parallax", "--deployment", DEP, "--out", str(root)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "Parallax plan for inc-solo" in shown and "branch-parallel at points" in shown
    assert [x.point for x in ParallaxDeploymentPlan.load(path).models[0].points] == [x.point for x in m.points]


def test_bad_inputs_say_what_to_run(planned, tmp_path):
    root, _, p, *_ = planned
    predicted = json.loads(json.dumps(p))
    predicted["fleet"]["device_classes"]["coral-usb-emulated"].update(cpu="predicted", cores=2)
    with pytest.raises(PlanError, match="models another host"):
        plan_parallax(root, DEP, predicted)
    # a device class whose memory cannot hold a point's sub-models: that point runs uncut, and the plan says so
    small = json.loads(json.dumps(p))
    small["fleet"]["device_classes"]["coral-usb-emulated"]["ram_bytes"] = 2 ** 20
    copy = tmp_path / "small"
    shutil.copytree(root, copy)
    (m,) = plan_parallax(copy, DEP, small)[0].models
    budget = int(2 ** 20 * (1 - p["parallax"]["margin"]))
    arenas = {x.point: sum(s.estimated_arena_bytes for st in x.stages for s in st.submodels)
              for x in planned[3].models[0].points}
    over = sorted(k for k, v in arenas.items() if v > budget)
    assert over and [x.point for x in m.points] == sorted(k for k in arenas if k not in over)
    assert f"points {over} run uncut" in m.why and "exceed the class's budget 0.6 MiB" in m.why
    empty = tmp_path / "empty"
    shutil.copytree(root / "deployments", empty / "deployments")
    before = {f: f.read_bytes() for f in (empty / "deployments").rglob("*") if f.is_file()}
    with pytest.raises(ArtifactError, match=r"edgeplan parallax .*inc/1"):
        plan_parallax(empty, DEP, p)  # a model whose stage has not run
    # the previous plan and its sub-models are as they were
    assert {f: f.read_bytes() for f in (empty / "deployments").rglob("*") if f.is_file()} == before
    assert any(f.parent.name.startswith("p") and f.suffix == ".tflite" for f in before)


def _bundle_with(bundle, name: str, data: bytes):
    blobs = {**bundle.blobs, name: data}
    refs = tuple(BlobRef(r.name, r.media_type, len(blobs[r.name]), sha256(blobs[r.name])) for r in bundle.refs)
    return dataclasses.replace(bundle, blobs=blobs, refs=refs)


def test_pulled_and_served_branch_parallel_with_the_suffixes_bits(planned, tmp_path):
    root, _, p, plan, _ = planned
    (m,) = plan.models
    _, key_path, _ = keys.generate(tmp_path / "keys")
    key, trusted = keys.load_signing_key(key_path), keys.load_trusted([tmp_path / "keys"])
    store = open_store(tmp_path / "store")
    bundle = build(root, DEP, p)
    assert bundle.plans["parallax"] == f"deployments/{DEP}/plans/parallax.json"
    publish(store, bundle, key, trusted, fleet.load(p).devices)
    dest = tmp_path / "dev"
    assert pull(store, dest, trusted, device_id="edge-px").activated  # health check ran every planned suffix
    rev_dir, manifest = active(dest)
    entry = manifest.models[0]
    xs = load_inputs(rev_dir, entry, 3)
    cores = {"inc": 2}
    with Runtime(dest, mode="cpu", adapt=False) as px, Runtime(dest, mode="cpu", adapt=False, parallax=False) as whole:
        assert px.status()["models"]["inc"]["branch_parallel_points"] == [x.point for x in m.points]
        assert whole.status()["models"]["inc"]["branch_parallel_points"] == []
        for point in [x.point for x in m.points][:3]:
            for rt in (px, whole):
                rt.configure({"inc": point}, cores)
            for x in xs:
                np.testing.assert_array_equal(px.infer("inc", x), whole.infer("inc", x))
        want = whole.infer("inc", xs[0])  # every point gives the whole int8 model's bits

    # a sub-model corrupted on the device after the pull: that point's request fails naming it, others still serve
    first = m.points[0]
    bad = rev_dir / "deployments" / DEP / first.stages[0].submodels[0].file
    bad.write_bytes(bad.read_bytes()[:-1] + b"\0")
    other = next(x.point for x in m.points if x.point != first.point)
    with Runtime(dest, mode="cpu", adapt=False) as px:
        px.configure({"inc": first.point}, cores)
        with pytest.raises(ParallelError, match=rf"{bad.stem}.*not the blob the revision names"):
            px.infer("inc", xs[0])
        px.configure({"inc": other}, cores)
        np.testing.assert_array_equal(px.infer("inc", xs[0]), want)

    # a signed plan naming a sub-model that is not its blob: refused, the active revision stays
    name = bundle.plans["parallax"]
    doc = json.loads(bundle.blobs[name])
    sub = doc["models"][0]["points"][0]["stages"][0]["submodels"][0]
    sub["sha256"] = hashlib.sha256(b"another").hexdigest()
    assert publish(store, _bundle_with(bundle, name, json.dumps(doc).encode()), key, trusted,
                   fleet.load(p).devices).revision == 2
    with pytest.raises(HealthCheckFailed, match="is not a blob of this revision"):
        pull(store, dest, trusted, device_id="edge-px")
    assert active(dest)[1].revision == 1
    # and a stage reading a tensor no earlier stage makes
    doc = json.loads(bundle.blobs[name])
    doc["models"][0]["points"][0]["stages"][0]["submodels"][0]["inputs"] = ["../../etc/passwd"]
    publish(store, _bundle_with(bundle, name, json.dumps(doc).encode()), key, trusted, fleet.load(p).devices)
    with pytest.raises(HealthCheckFailed, match="which no earlier stage makes"):
        pull(store, dest, trusted, device_id="edge-px")
    assert active(dest)[1].revision == 1
    # and an Edge TPU region's hold that is not a time: out of [0, 60000] ms, or not a finite number (JSON's true
    # is an int to Python; the plan's field types are checked first)
    for bad in (-1, 1e9, "2.5", float("nan"), True):
        doc = json.loads(bundle.blobs[name])
        doc["models"][0]["points"][0]["stages"][0]["submodels"][0]["offload_ms"] = bad
        publish(store, _bundle_with(bundle, name, json.dumps(doc).encode()), key, trusted, fleet.load(p).devices)
        with pytest.raises(HealthCheckFailed, match=r"offload_ms .*(is not a time in \[0, 60000\] ms|wrong type)"):
            pull(store, dest, trusted, device_id="edge-px")
        assert active(dest)[1].revision == 1


def test_the_bundle_refuses_a_plan_made_for_other_sub_models(planned):
    root, _, p, *_ = planned
    (m,) = ParallaxDeploymentPlan.load(root / "deployments" / DEP / "plans" / "parallax.json").models
    sub = root / "deployments" / DEP / m.points[0].stages[0].submodels[0].file
    kept = sub.read_bytes()
    try:
        sub.write_bytes(kept + b"\0")
        with pytest.raises(ArtifactError, match="not the sub-model the plan names"):
            build(root, DEP, p)
    finally:
        sub.write_bytes(kept)


def test_edge_tpu_regions_inside_a_suffix_go_to_the_emulated_accelerator(planned, tmp_path, capsys):
    """With ``compile.allow_multiple_subgraphs``: point 0's suffix (the whole model) has two runs the compiler maps
    only with several subgraphs (after the LRN ops); pruning keeps the large one, so that suffix runs as a CPU stage
    then the region, which the emulated accelerator holds on its clock. Served, the bits are the uncut suffix's."""
    src, _, p, *_ = planned
    root = tmp_path / "art"
    shutil.copytree(src, root)
    multi = json.loads(json.dumps(p))
    multi["compile"]["allow_multiple_subgraphs"] = True
    plan, _ = plan_parallax(root, DEP, multi)
    (m,) = plan.models
    (p0,) = [x for x in m.points if x.regions]
    assert p0.point == 0 and "Edge TPU regions (EMULATED) inside the suffixes of points [0]" in m.why
    kept = [r for r in p0.regions if r.keep]
    assert len(kept) == 1 and kept[0].offload_ms < kept[0].cpu_ms
    assert [r.why for r in p0.regions if not r.keep] == ["2 ops (< 3)"]
    held = [s for st in p0.stages for s in st.submodels if s.offload_ms is not None]
    assert [s.offload_ms for s in held] == [kept[0].offload_ms]
    # the other points keep their branch-parallel stages, with no region
    assert [x.point for x in m.points if not x.regions] == [x.point for x in planned[3].models[0].points if x.point]
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(multi))
    assert main(["--params", str(params_file), "plan", "parallax", "--deployment", DEP, "--out", str(root)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "point 0: Edge TPU region of" in shown and "kept (offload" in shown and "back to the CPU (2 ops" in shown

    _, key_path, _ = keys.generate(tmp_path / "keys")
    key, trusted = keys.load_signing_key(key_path), keys.load_trusted([tmp_path / "keys"])
    store = open_store(tmp_path / "store")
    publish(store, build(root, DEP, multi), key, trusted, fleet.load(multi).devices)
    dest = tmp_path / "dev"
    assert pull(store, dest, trusted, device_id="edge-px").activated  # health check: the regions on the CPU
    rev_dir, manifest = active(dest)
    xs = load_inputs(rev_dir, manifest.models[0], 3)
    with Runtime(dest, mode="emulated", adapt=False) as em, Runtime(dest, mode="cpu", adapt=False,
                                                                    parallax=False) as whole:
        for rt in (em, whole):
            rt.configure({"inc": 0}, {"inc": 2})
        assert em.status()["models"]["inc"]["edgetpu_region_points"] == [0]
        em.precompute("inc", xs[:2], points=[0])
        for x in xs[:2]:
            t0 = time.perf_counter()
            got = em.infer("inc", x)
            assert time.perf_counter() - t0 >= kept[0].offload_ms / 1e3  # the device's clock held it
            np.testing.assert_array_equal(got, whole.infer("inc", x))
        assert em.status()["edgetpu_regions"] == {"held": 2, "computed_on_cpu": 0}
        np.testing.assert_array_equal(em.infer("inc", xs[2]), whole.infer("inc", xs[2]))  # not computed ahead
        assert em.status()["edgetpu_regions"] == {"held": 3, "computed_on_cpu": 1}
