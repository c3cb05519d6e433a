"""AutoDiCE's front end: units the int8 model fuses, platform and mapping specs, and the split (stages per rank,
communication tables, rankfile) verified in process before anything is written."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from edgeplan.cli import main
from edgeplan.errors import SpecError
from edgeplan.graph.model import GraphView
from edgeplan.pipeline import multidevice as pipeline
from edgeplan.plan.multidevice import spec
from edgeplan.quantize.tflite_graph import TfliteGraph
from edgeplan.surgery import multidevice

PLATFORM = """# name, arch, cores, where MPI reaches it, and the extended fields
edge01, arm, slots=0-3, host=127.0.0.1, net=1.25e8, power=2.5/6.0
edge02, arm, slots=0,1, host=127.0.0.1
edge03, x86, slots=0-1, host=localhost, quota=0.5
"""


@pytest.fixture(scope="module")
def tiny(compiled, params):
    d, _, _ = compiled("tiny_cnn")
    return d, pipeline.find_units(d, params)


@pytest.fixture(scope="module")
def inception(compiled, params):
    d, _, _ = compiled("light_inception_v1")
    return d, pipeline.find_units(d, params)


def test_units_cover_every_node_and_op_once(tiny, inception):
    for d, us in (tiny, inception):
        graph = TfliteGraph((d / "model_int8.tflite").read_bytes())
        model = onnx.load(str(d / "model.onnx"), load_external_data=False)
        assert sorted(i for u in us.units for i in u.nodes) == list(range(len(model.graph.node)))
        assert sorted(o for u in us.units for o in u.ops) == list(range(len(graph.ops)))
        assert len(us.units) < len(model.graph.node)  # the converter fused some
    _, us = tiny
    of = {n: us.of_node[n] for n in ("conv1", "relu1", "conv4", "add", "relu4")}
    assert of["conv1"] == of["relu1"]  # a convolution and its activation: one CONV_2D
    assert of["add"] == of["relu4"] != of["conv4"]  # the residual's projection is its own op


def test_platform_text_and_json(tmp_path):
    p = spec.parse_text(PLATFORM, "platform.txt")
    assert [d.name for d in p.devices] == ["edge01", "edge02", "edge03"]
    assert p.devices[0].slots == (0, 1, 2, 3) and p.devices[1].slots == (0, 1)
    assert p.devices[0].power_w == {"idle": 2.5, "active": 6.0} and p.devices[0].net_bytes_per_s == 1.25e8
    assert p.devices[2].cpu_quota == 0.5 and p.devices[1].host == "127.0.0.1"
    assert spec.parse_text(p.to_text(), "again") == p
    (tmp_path / "p.json").write_text(json.dumps(p.to_json()))
    assert spec.load_platform(tmp_path / "p.json") == p
    for bad, says in (("edge01, arm, slots=0-1\nedge01, arm, slots=0", "appears twice"),
                      ("edge01, arm, slots=a-b", "slots 'a-b'"),
                      ("edge01, arm, slots=0, speed=3", "unknown field 'speed'"),
                      ("edge_01, arm, slots=0", "no '_'"),
                      ("edge01, arm, slots=0, net=-1", "net_bytes_per_s must be positive"),
                      ("edge01, arm", "expected 'name, arch")):
        with pytest.raises(SpecError, match=says):
            spec.parse_text(bad, "p.txt")


def test_mapping_errors_name_the_layer_and_key(tiny):
    _, us = tiny
    p = spec.parse_text(PLATFORM, "platform.txt")
    layers = [n for u in us.units for n in u.names]
    good = {"edge01_arm01": layers[:6], "edge03_x86": layers[6:]}
    m = spec.parse_mapping(good, p, us)
    assert [k.slots for k in m.keys] == [(0, 1), (0, 1)] and m.keys[1].device == "edge03"
    cases = [
        ({"edge01_arm": layers[:6] + ["conv9"], "edge02_arm": layers[6:]}, "layer 'conv9' is not a node"),
        ({"edge01_arm": layers, "edge02_arm": ["conv1"]}, "'conv1' is mapped twice"),
        ({"edge01_arm": layers[1:]}, "'conv1'.* mapped to no key"),
        ({"edge01_arm": ["conv1"], "edge02_arm": layers[1:]}, "'conv1' \\(edge01_arm\\) and 'relu1' \\(edge02_arm\\) are one int8 op"),
        ({"edge09_arm": layers}, "device 'edge09' is not in the platform"),
        ({"edge02_arm3": layers}, "device 'edge02' has no core 3"),
        ({"edge03_arm": layers}, "device 'edge03' is x86"),
        ({"edge01": layers}, "expected <device>_<arch><cores>"),
    ]
    for doc, says in cases:
        with pytest.raises(SpecError, match=says):
            spec.parse_mapping(doc, p, us)


def _interleaved(us, keys):
    """Unit i on key i mod k: branches and neighbours on different ranks, so ranks wait between their stages."""
    doc = {k: [] for k in keys}
    for u in us.units:
        doc[keys[u.index % len(keys)]] += list(u.names)
    return doc


def test_split_verifies_and_tables_agree(inception, tmp_path, params):
    d, us = inception
    p = spec.parse_text(PLATFORM, "platform.txt")
    m = spec.parse_mapping(_interleaved(us, ["edge01_arm0", "edge02_arm", "edge03_x861"]), p, us)
    view = GraphView(onnx.load(str(d / "model.onnx")))
    xs = np.random.default_rng(0).normal(size=(2, *view.shape(view.input.name)[1:])).astype(np.float32)
    summary = multidevice.split(d, us, m, p, tmp_path / "md", xs=xs)
    v = summary["verify"]
    assert v["ok"] and v["int8_identical_reference"] == v["int8_identical_xnnpack"] == 1.0
    assert v["float_max_abs_diff"] <= v["float_bound"]
    t = json.loads((tmp_path / "md" / "tables.json").read_text())
    assert summary["stages"] > summary["ranks"] == 3  # ranks wait for remote data between their layers
    stages = t["stages"]
    made = {o: s["rank"] for s in stages for o in s["outputs"]}
    made[t["input"]["name"]] = 0
    for name, b in t["buffers"].items():
        assert made[name] == b["sender"] and b["sender"] not in b["receivers"]
        for r in b["receivers"]:
            assert name in t["receiver"][str(r)] and t["sender"][str(b["sender"])][name] == [str(x) for x in b["receivers"]]
            assert any(name in s["inputs"] for s in stages if s["rank"] == r) or (r == 0 and name == t["output"]["name"])
    for s in stages:  # every stage reads only what earlier stages (or the input) made
        earlier = {t["input"]["name"]} | {o for e in stages[:s["index"]] for o in e["outputs"]}
        assert set(s["inputs"]) <= earlier
    assert (tmp_path / "md" / "rankfile").read_text().splitlines() == [
        "rank 0=127.0.0.1 slot=0", "rank 1=127.0.0.1 slot=0,1", "rank 2=localhost slot=1"]
    assert (tmp_path / "md" / "hostfile").read_text().splitlines() == ["127.0.0.1 slots=6", "localhost slots=2"]
    assert json.loads((tmp_path / "md" / "mapping.json").read_text()) == _interleaved(us, [k.name for k in m.keys])
    # the float stages' weights are the model's own file, linked (not copied) beside them
    linked = tmp_path / "md" / "float" / "model.onnx"
    assert linked.stat().st_ino == (d / "model.onnx").stat().st_ino
    assert not list((tmp_path / "md" / "float").glob("*.weights"))


def test_a_failed_verification_writes_nothing(tiny, tmp_path):
    d, us = tiny
    p = spec.parse_text(PLATFORM, "platform.txt")
    layers = [n for u in us.units for n in u.names]
    m = spec.parse_mapping({"edge01_arm": layers[:6], "edge02_arm": layers[6:]}, p, us)
    out = tmp_path / "md"
    out.mkdir()
    (out / "tables.json").write_text("the previous split")
    xs = np.zeros((1, 3, 32, 32), np.float32)
    with pytest.raises(SpecError, match="does not verify: float chain differs"):
        multidevice.split(d, us, m, p, out, xs=xs, tolerance=-1.0)
    assert [f.name for f in tmp_path.iterdir()] == ["md"] and (out / "tables.json").read_text() == "the previous split"


def test_cli_split_and_bad_mapping(tiny, tmp_path, capsys):
    d, us = tiny
    (tmp_path / "p.txt").write_text(PLATFORM)
    layers = [n for u in us.units for n in u.names]
    (tmp_path / "m.json").write_text(json.dumps({"edge01_arm": layers[:4], "edge03_x86": layers[4:]}))
    assert main(["split", str(d), "--mapping", str(tmp_path / "m.json"), "--platform", str(tmp_path / "p.txt"),
                 "--out", str(tmp_path / "out")]) == 0
    assert "int8 chain identical" in capsys.readouterr().out
    assert (tmp_path / "out" / "int8" / "s1.tflite").is_file()
    (tmp_path / "m.json").write_text(json.dumps({"edge01_arm": layers[:4], "edge03_x86": layers[5:]}))
    assert main(["split", str(d), "--mapping", str(tmp_path / "m.json"), "--platform", str(tmp_path / "p.txt"),
                 "--out", str(tmp_path / "out")]) == 2
    e = capsys.readouterr().err
    assert "mapped to no key" in e and "Traceback" not in e and len(e.strip().splitlines()) <= 2
    assert (tmp_path / "out" / "int8" / "s1.tflite").is_file()  # the earlier split stays


def test_a_model_file_reached_by_a_symbolic_link_is_split_from_the_file_it_leads_to(inception, tmp_path, params):
    """A deployment's artifact directory may link model.onnx to where it was compiled: the float stages point into
    (a hard link of) the real file, and onnxruntime, which refuses weights outside the folder it is given, reads
    them from there."""
    d, _ = inception
    linked = tmp_path / "art"
    linked.mkdir()
    for f in d.iterdir():
        (linked / f.name).symlink_to(f)
    us = pipeline.find_units(linked, params)
    p = spec.parse_text(PLATFORM, "platform.txt")
    m = spec.parse_mapping(_interleaved(us, ["edge01_arm0", "edge02_arm"]), p, us)
    summary = multidevice.split(linked, us, m, p, tmp_path / "md", loaded=pipeline.load(linked, params)[:2])
    assert summary["verify"]["ok"] and summary["verify"]["float_max_abs_diff"] == 0.0
    assert (tmp_path / "md" / "float" / "model.onnx").stat().st_ino == (d / "model.onnx").stat().st_ino
