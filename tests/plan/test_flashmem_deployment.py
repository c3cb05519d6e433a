"""`edgeplan plan flashmem` on a real model: stream stage, load capacity measured in the profile, LC-OPG,
segments cut; the planned segments, streamed by the runtime, give the int8 model's bits."""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import re
import shutil
from functools import partial

import numpy as np
import pytest

from edgeplan.artifacts import StreamInfo
from edgeplan.errors import ArtifactError, MemoryBudgetError, PlanError
from edgeplan.pipeline import params as params_mod
from edgeplan.pipeline import stages
from edgeplan.plan.flashmem.deployment import plan_flashmem, problem
from edgeplan.plan.flashmem.merge import expected, footprints_of, measured, shifted
from edgeplan.plan.flashmem.plan import FlashMemPlan
from edgeplan.profile import cpu, fleet, run
from edgeplan.profile.schema import Profile
from edgeplan.quantize import litert
from edgeplan.quantize.tflite_graph import TfliteGraph
from edgeplan.runtime import stream


@pytest.fixture(scope="module")
def planned(compiled, tmp_path_factory):
    root = tmp_path_factory.mktemp("flashmem-artifacts")
    src, _, _ = compiled("light_squeezenet")
    d = root / "sq" / "1"
    shutil.copytree(src, d)
    p = params_mod.load(None)
    p["flashmem"]["max_segment_bytes"] = 128 * 1024
    stages.stream(d, p)
    prof = run.profile(d, fleet.load(p).device_class("coral-usb-emulated"),
                       cpu.Settings(repeats=5, min_repeats=2, span_s=0.2, budget_s=0.5), capacity_rounds=2)
    p["deployments"] = [{"name": "sq-solo", "device_class": "coral-usb-emulated",
                         "models": [{"name": "sq", "version": "1", "rate": 5.0}]}]
    p["fleet"]["devices"] = [{"id": "edge-9", "device_class": "coral-usb-emulated", "deployment": "sq-solo",
                              "work_pool": "coral-usb-emulated"}]
    from edgeplan.plan.flashmem.problem import min_m_peak

    prob = problem(StreamInfo.load(d / "stream" / "stream.json"), prof.load_capacity, p["flashmem"], 1)
    footprint = sum(prob.full_kib(i) for i in range(prob.n)) * 1024
    # half the all-preloaded footprint, or what two neighbours need
    plan, path = plan_flashmem(root, "sq-solo", p, m_peak=max(footprint // 2, min_m_peak(prob) * 5 // 4),
                               variants={"flashmem-packed": {"segment_kernels": "xnnpack"},
                                         "flashmem-no-lead": {"read_lead": 1},
                                         "flashmem-in-time": {"read_in_time": True}})
    return root, d, p, plan, path


def test_the_plan_is_written_streams_and_names_its_segments(planned):
    root, d, _, plan, path = planned
    assert FlashMemPlan.load(path) == plan and plan.m_peak > 0
    (m,) = plan.models
    assert m.capacity_source == "measured"
    assert any(not w.preload for w in m.plan.weights)
    assert m.plan.peak_resident_bytes < m.preload_peak_bytes
    for seg in m.segments:
        blob = (root / "deployments" / "sq-solo" / seg.file).read_bytes()
        assert hashlib.sha256(blob).hexdigest() == seg.sha256 and len(blob) == seg.size


def test_variants_are_made_from_the_same_solve_and_segments(planned):
    """The bench's comparisons: the same solved and cut plan, finished with other kernels or another lead."""
    root, d, p, plan, path = planned
    (m,) = plan.models
    packed, bare, early = ((FlashMemPlan.load(path.parent / f"{stem}.json")).models[0]
                           for stem in ("flashmem-packed", "flashmem-no-lead", "flashmem-in-time"))
    for v in (packed, bare, early):
        assert [(s.file, s.sha256) for s in v.segments] == [(s.file, s.sha256) for s in m.segments]
        assert v.plan.windows == m.plan.windows and v.plan.solve_m_peak == m.plan.solve_m_peak
    assert {s.kernels for s in packed.segments} == {"xnnpack"}
    for s, x in zip(m.segments, packed.segments, strict=True):  # XNNPACK's figures where the plan picked it too
        assert s.kernels == "unpacked" or s == x
    runs = [(s.first_layer, s.last_layer) for s in m.segments]
    prob = problem(StreamInfo.load(d / "stream" / "stream.json"),
                   Profile.load(d / "profiles" / "coral-usb-emulated.json").load_capacity, p["flashmem"], plan.m_peak)
    prices = measured(prob, runs, footprints_of(bare.segments))
    # no lead: the solver's placement as the runtime carries it out, which the lead only moves earlier
    assert bare.plan.read_lead == 1 and bare.plan.weights == shifted(prices, bare.plan, runs).weights

    def first_reads(v) -> dict[int, int]:
        return {w.layer: min((ld.layer for ld in w.loads), default=-1) for w in v.plan.weights}

    # the lead reads earlier than the solver's placement, and in time earlier still (or as early), within M_peak
    assert not m.plan.read_in_time and early.plan.read_in_time and early.plan.read_lead == m.plan.read_lead
    for late, led in ((first_reads(bare), first_reads(m)), (first_reads(m), first_reads(early))):
        assert led.keys() == late.keys() and all(led[i] <= late[i] for i in late)
    # within M_peak, or the solver's own placement's peak at these prices when that is above it (``hoist``)
    limit = max(plan.m_peak, shifted(prices, bare.plan, runs).peak_resident_bytes)
    assert shifted(prices, early.plan, runs).peak_resident_bytes <= limit
    assert shifted(prices, m.plan, runs).peak_resident_bytes <= limit


def test_the_prediction_counts_what_each_cut_segment_holds(planned):
    """Measured once built (``profile.footprint``), and the activations the runtime keeps: at least the
    segment's own inputs and outputs, as its interpreter declares them."""
    root, d, p, plan, _ = planned
    (m,) = plan.models
    assert m.footprint == "segments"
    prob = problem(StreamInfo.load(d / "stream" / "stream.json"),
                   Profile.load(d / "profiles" / "coral-usb-emulated.json").load_capacity, p["flashmem"], plan.m_peak)
    runs = [(s.first_layer, s.last_layer) for s in m.segments]
    # the solver plans within solve_share of M_peak as the profile's figures price it; the read lead then takes
    # the rest as what the cut segments hold prices it (the ledger, every load beside its segment), so the plan
    # recorded keeps M_peak at those prices — unless the solver's placement, so priced, was already above it
    # (measured figures vary: then the lead keeps that peak, ``test_variants_...``); the prediction recorded also
    # leaves out what the runtime has not loaded yet (``expected``)
    assert shifted(prob, m.plan, runs).weights == m.plan.weights
    fps = footprints_of(m.segments)
    prices = measured(prob, runs, fps)
    assert m.plan.solve_m_peak < plan.m_peak and m.plan.read_lead == 4
    assert m.read_mb_s > 0 and all(s.build_ms > 0 and s.invoke_ms > 0 for s in m.segments)
    assert expected(prices, shifted(prices, m.plan, runs), runs, fps, m.read_mb_s).resident_bytes == \
        m.plan.resident_bytes
    for seg in m.segments:
        it = litert.interpreter((root / "deployments" / "sq-solo" / seg.file).read_bytes(), deterministic=False)
        ports = it.get_input_details() + it.get_output_details()
        assert seg.built_bytes > 0 and seg.arena_bytes > 0
        assert seg.live_bytes >= sum(int(np.prod(d["shape"])) * np.dtype(d["dtype"]).itemsize for d in ports)
    assert m.segments[-1].live_bytes == sum(int(np.prod(d["shape"])) * np.dtype(d["dtype"]).itemsize
                                            for d in ports)  # the last one: nothing else is left to keep


def test_the_planned_segments_stream_to_the_int8_models_bits(planned):
    root, d, _, plan, _ = planned
    (m,) = plan.models
    base = root / "deployments" / "sq-solo"
    segs = [stream.segment_of(base, s) for s in m.segments]
    g = TfliteGraph((d / "model_int8.tflite").read_bytes())
    rng = np.random.default_rng(11)
    x = {g.tensors[i].name: rng.integers(-128, 128, g.tensors[i].shape, dtype=np.int8) for i in g.inputs}
    interp = partial(litert.interpreter, deterministic=False)
    want = stream.run_preloaded(d / "model_int8.tflite", x, interp)
    got, log = stream.Streamer(segs, stream.schedule(segs, "plan", m.plan), interp).run(x)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_a_segment_planned_unpacked_is_built_on_the_reference_kernels_with_the_same_bits(planned):
    root, d, _, plan, _ = planned
    (m,) = plan.models
    base = root / "deployments" / "sq-solo"
    segs = [dataclasses.replace(stream.segment_of(base, s), kernels="unpacked") for s in m.segments]
    built = []

    def unpacked(blob):
        built.append(len(blob))
        return litert.unpacked(blob)

    g = TfliteGraph((d / "model_int8.tflite").read_bytes())
    rng = np.random.default_rng(5)
    x = {g.tensors[i].name: rng.integers(-128, 128, g.tensors[i].shape, dtype=np.int8) for i in g.inputs}
    got, _ = stream.Streamer(segs, stream.schedule(segs, "plan", m.plan), lambda blob: None, unpacked=unpacked).run(x)
    # every segment (in the builder's order), and none by the XNNPACK factory (it returns None)
    assert sorted(built) == sorted(s.size for s in segs)
    want = stream.run_chain([s.path.read_bytes() for s in segs], x, litert.unpacked)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_kernels_are_picked_per_segment_from_both_measurements():
    from edgeplan.plan.flashmem.deployment import pick_kernels
    from edgeplan.profile.footprint import Held

    fc = (1000, 10, 25.0, 2.0)  # packed: a long build
    conv = (1000, 10, 3.0, 1.0)
    held = Held([fc, conv, fc, conv], 500.0, [(0, 10, 0.3, 4.7), None, (2000, 10, 0.3, 4.7), (0, 10, 0.2, 40.0)])
    got = pick_kernels(held, "fastest")
    # faster and no larger: unpacked; not measured, larger or slower: XNNPACK, with its own figures
    assert got == [("unpacked", (0, 10, 0.3, 4.7)), ("xnnpack", conv), ("xnnpack", fc), ("xnnpack", conv)]
    assert [k for k, _ in pick_kernels(held, "xnnpack")] == ["xnnpack"] * 4


def test_bad_inputs_say_what_to_run(planned, tmp_path):
    root, d, p, plan, path = planned
    segments = sorted((path.parent.parent / "flashmem").rglob("*.tflite"))
    kept = [path.read_bytes(), *(f.read_bytes() for f in segments)]
    with pytest.raises(MemoryBudgetError, match=r"M_peak .* is below what layers"):
        plan_flashmem(root, "sq-solo", p, m_peak=64 * 1024)
    for key, value, says in (("solve_share", 0.0, r"solve_share must be in \(0, 1\], got 0.0"),
                             ("read_lead", 0, "read_lead must be a whole number of segments, at least 1, got 0"),
                             ("read_lead", 2.5, "read_lead must be a whole number .* got 2.5"),
                             ("read_lead", float("inf"), "read_lead must be a whole number .* got inf"),
                             ("read_in_time", "yes", "read_in_time must be true or false, got 'yes'"),
                             ("segment_kernels", "gpu", "segment_kernels must be one of fastest, xnnpack, got 'gpu'")):
        bad = copy.deepcopy(p)
        bad["flashmem"][key] = value
        with pytest.raises(PlanError, match=says):
            plan_flashmem(root, "sq-solo", bad)
    with pytest.raises(PlanError, match="segment_kernels must be one of fastest, xnnpack, got 'cpu'"):
        plan_flashmem(root, "sq-solo", p, variants={"other": {"segment_kernels": "cpu"}})
    for stem in ("../x", "swapless", "flashmem"):  # a path, or another plan's file: refused
        with pytest.raises(PlanError, match=f"a plan variant named '{re.escape(stem)}'"):
            plan_flashmem(root, "sq-solo", p, variants={stem: {}})
    # refused before anything is written: the plan and its segments are as they were
    assert segments and sorted((path.parent.parent / "flashmem").rglob("*.tflite")) == segments
    assert [path.read_bytes(), *(f.read_bytes() for f in segments)] == kept
    bare = tmp_path / "sq" / "1"
    shutil.copytree(d, bare)
    shutil.rmtree(bare / "stream")
    with pytest.raises(ArtifactError, match="run `edgeplan stream"):
        plan_flashmem(tmp_path, "sq-solo", copy.deepcopy(p))


def test_a_segment_measurement_that_fails_leaves_the_layers_figures_and_says_so(planned, tmp_path, monkeypatch,
                                                                               caplog):
    from edgeplan.profile import footprint

    root, _, p, plan, _ = planned
    work = tmp_path / "artifacts"
    shutil.copytree(root, work)
    monkeypatch.setattr(footprint, "TIMEOUT_S", 0.001)  # the measuring process cannot finish: a real timeout
    again, _ = plan_flashmem(work, "sq-solo", copy.deepcopy(p), m_peak=plan.m_peak)
    (m,) = again.models
    assert m.footprint == "layers" and all(s.built_bytes == 0 for s in m.segments)
    assert "predicted residency from its layers' figures: measuring" in caplog.text and "took over" in caplog.text


def test_the_bundle_carries_the_plan_and_its_segments_and_refuses_a_stale_one(planned, tmp_path):
    from edgeplan.bundle.build import build
    from edgeplan.pipeline.planning import plan_swapless

    root, _, p, plan, _ = planned
    work = tmp_path / "artifacts"
    shutil.copytree(root, work)
    plan_swapless(work, "sq-solo", p)
    bundle = build(work, "sq-solo", p)
    assert bundle.plans == {"swapless": "deployments/sq-solo/plans/swapless.json",
                            "flashmem": "deployments/sq-solo/plans/flashmem.json"}
    names = {r.name for r in bundle.refs}
    assert {f"deployments/sq-solo/{s.file}" for s in plan.models[0].segments} <= names
    seg = work / "deployments" / "sq-solo" / plan.models[0].segments[-1].file
    seg.write_bytes(seg.read_bytes()[:-1])
    with pytest.raises(ArtifactError, match="not the segment the plan names"):
        build(work, "sq-solo", p)


@pytest.fixture(scope="module")
def device(planned, tmp_path_factory):
    """sq-solo published with its FlashMem plan and pulled by a device: (pull result, what made it)."""
    from edgeplan.bundle import keys
    from edgeplan.bundle.build import build
    from edgeplan.bundle.publish import publish
    from edgeplan.pipeline.planning import plan_swapless
    from edgeplan.runtime import pull
    from edgeplan.store import open_store

    root, _, p, _, _ = planned
    tmp = tmp_path_factory.mktemp("device")
    work = tmp / "artifacts"
    shutil.copytree(root, work)
    plan_swapless(work, "sq-solo", p)
    _, key_path, _ = keys.generate(tmp / "keys")
    key, trusted = keys.load_signing_key(key_path), keys.load_trusted([tmp / "keys"])
    store = open_store(tmp / "store")
    bundle = build(work, "sq-solo", p)
    publish(store, bundle, key, trusted, fleet.load(p).devices)
    res = pull(store, tmp / "dev", trusted, device_id="edge-9", accelerator="none")
    return res, {"store": store, "key": key, "trusted": trusted, "bundle": bundle, "params": p, "dest": tmp / "dev"}


def _doctor_hash(doc):
    doc["models"][0]["segments"][0]["sha256"] = "0" * 64


def _doctor_load(doc):
    streamed = next(w for w in doc["models"][0]["plan"]["weights"] if w["loads"])
    streamed["loads"][0]["layer"] = 10**6


def _doctor_kernels(doc):
    doc["models"][0]["segments"][0]["kernels"] = "gpu"


@pytest.mark.parametrize("doctor, says", [(_doctor_hash, "not a blob of this revision with the hash"),
                                          (_doctor_load, r"names layer 1000000, which its \d+ layers"),
                                          (_doctor_kernels, r"names kernels 'gpu', not one of xnnpack, unpacked")])
def test_a_device_pulls_the_streamed_plan_checks_it_and_refuses_a_mismatched_one(device, doctor, says):
    import dataclasses
    import json

    from edgeplan.bundle.manifest import BlobRef, sha256
    from edgeplan.bundle.publish import publish
    from edgeplan.runtime import pull
    from edgeplan.runtime.pull import HealthCheckFailed, read_manifest

    res, made = device
    assert res.activated and set(stream.load_plans(res.path, read_manifest(res.path))) == {"sq"}
    # a signed revision whose plan names a segment hash that is not its blob's, or a layer its segments do not
    # run: refused, the first stays
    bundle = made["bundle"]
    name = "deployments/sq-solo/plans/flashmem.json"
    doc = json.loads(bundle.blobs[name])
    doctor(doc)
    blobs = {**bundle.blobs, name: json.dumps(doc).encode()}
    refs = tuple(BlobRef(n, "application/json" if n.endswith(".json") else "application/octet-stream", len(b),
                         sha256(b)) for n, b in sorted(blobs.items()))
    store, trusted = made["store"], made["trusted"]
    publish(store, dataclasses.replace(bundle, blobs=blobs, refs=refs), made["key"], trusted,
            fleet.load(made["params"]).devices)
    with pytest.raises(HealthCheckFailed, match=says):
        pull(store, made["dest"], trusted, device_id="edge-9", accelerator="none")
    assert (made["dest"] / "current").resolve() == res.path.resolve()


@pytest.mark.parametrize("mode", ["plan", "preload"])
def test_fifo_runs_every_request_and_measures_the_peak(device, mode, tmp_path):
    import json

    from edgeplan.runtime.cli import main

    res, made = device
    out = tmp_path / "fifo.json"
    assert main(["fifo", str(made["dest"]), "--models", "sq,sq", "--iterations", "2", "--stream-mode", mode,
                 "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["mode"] == mode and got["cold"] and len(got["requests"]) == 4
    assert got["peak_above_baseline_bytes"] > 0 and len(got["timeline"]) >= 2
    assert all(r["ms"] > 0 for r in got["requests"])


def test_serve_stream_answers_over_http_and_a_corrupt_segment_fails_only_its_request(device):
    """`serve --stream`: each request streamed as the plan says gives the whole int8 model's output (same
    kernels); a segment whose bytes changed on disk fails that request naming it, and the next one is served."""
    import io
    import json
    import threading
    import urllib.error
    import urllib.request

    from edgeplan.runtime.model import dequantize_output, quantize_input
    from edgeplan.runtime.pull import read_manifest
    from edgeplan.runtime.server import serve
    from edgeplan.runtime.streaming import StreamRuntime

    res, _ = device
    manifest = read_manifest(res.path)
    (entry,) = manifest.models
    t = entry.selftests[0]
    x = np.load(res.path / t.input, allow_pickle=False)
    _, segs = stream.load_plans(res.path, manifest)["sq"]
    whole = res.path / f"models/sq/{entry.version}/segments/p0/suffix_int8.tflite"
    (y,) = stream.run_preloaded(whole, {segs[0].inputs[0]: quantize_input(x, entry.input)},
                                partial(litert.interpreter, deterministic=False)).values()
    want = dequantize_output(y, entry.output)
    rt = StreamRuntime(res.path).start()
    server = serve(rt, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        buf = io.BytesIO()
        np.save(buf, x)
        req = urllib.request.Request(f"{url}/infer/sq", buf.getvalue(), {"Content-Type": "application/x-npy"})
        with urllib.request.urlopen(req) as r:
            np.testing.assert_array_equal(np.load(io.BytesIO(r.read())), want)
        seg = segs[-1].path
        good = seg.read_bytes()
        seg.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
        try:
            with pytest.raises(stream.StreamError, match=rf"segment \d+ \({seg.name}\): its bytes do not match"):
                rt.infer("sq", x)
        finally:
            seg.write_bytes(good)
        np.testing.assert_array_equal(rt.infer("sq", x), want)
        with urllib.request.urlopen(f"{url}/healthz") as r:
            health = json.loads(r.read())
        assert health["mode"] == "stream:plan" and health["models"]["sq"]["requests"] == 2
        with urllib.request.urlopen(f"{url}/metrics") as r:
            metrics = r.read().decode()
        assert 'edgeplan_requests_total{model="sq",code="500"} 1' in metrics
        assert 'edgeplan_stream_stall_seconds_total{model="sq"}' in metrics
    finally:
        server.shutdown()
        server.server_close()
        rt.stop()
