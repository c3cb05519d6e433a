"""Models past protobuf's 2 GB (issue: large models): written with ONNX external data, ingested, fingerprinted and
cut without ever being serialized whole. The real thing is built here: ``zoo:wide_fc_2g``, 2.28 GB of weights."""
from __future__ import annotations

import hashlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edgeplan.artifacts import EXTERNAL_DATA_BYTES, PROTOBUF_LIMIT, ModelInfo, write_onnx
from edgeplan.graph.model import GraphView, fingerprint
from edgeplan.graph.model import load as load_model
from edgeplan.pipeline import stages
from edgeplan.surgery import split
from edgeplan.zoo import wide


def _run(path, x) -> np.ndarray:
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x})[0]


def test_write_onnx_external_round_trip(tmp_path):
    m = onnx.shape_inference.infer_shapes(wide.model())
    inline = write_onnx(tmp_path / "inline.onnx", m)
    external = write_onnx(tmp_path / "ext.onnx", m, external=True)
    assert inline == external == fingerprint(m)
    assert inline == hashlib.sha256((tmp_path / "inline.onnx").read_bytes()).hexdigest()
    assert (tmp_path / "ext.onnx.data").is_file() and not (tmp_path / "inline.onnx.data").exists()
    assert (tmp_path / "ext.onnx").stat().st_size < 100_000 < (tmp_path / "ext.onnx.data").stat().st_size
    back = load_model(tmp_path / "ext.onnx")
    assert fingerprint(back) == fingerprint(m)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 32, 32)).astype(np.float32)
    np.testing.assert_array_equal(_run(tmp_path / "ext.onnx", x), _run(tmp_path / "inline.onnx", x))


@pytest.mark.parametrize("external", [False, True])
def test_a_mapped_model_leaves_its_weights_in_the_file_and_computes_the_same(tmp_path, external):
    """graph.model.load_mapped: each inline weight of 1 KiB or more becomes a reference to its own bytes inside the
    .onnx file (a model with external data keeps its references); the rest is the model ``load`` gives, and
    onnxruntime reading the weights from the file computes what it computes with them inline."""
    from edgeplan.graph.evaluate import tensor_values
    from edgeplan.graph.model import load_mapped

    m = onnx.shape_inference.infer_shapes(wide.model())
    path = tmp_path / "m.onnx"
    write_onnx(path, m, external=external)
    whole, mapped = load_model(path), load_mapped(path)
    assert [n for n in whole.graph.node] == [n for n in mapped.graph.node]
    assert [(t.name, list(t.dims), t.data_type) for t in whole.graph.initializer] == [
        (t.name, list(t.dims), t.data_type) for t in mapped.graph.initializer]
    held = [t for t in mapped.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert held and all(not t.HasField("raw_data") for t in held)
    location = {e.value for t in held for e in t.external_data if e.key == "location"}
    assert location == ({"m.onnx.data"} if external else {"m.onnx"})
    if not external:  # each reference is the tensor's bytes in the file
        data = path.read_bytes()
        for t in held:
            ext = {e.key: int(e.value) for e in t.external_data if e.key in ("offset", "length")}
            raw = next(w for w in whole.graph.initializer if w.name == t.name).raw_data
            assert data[ext["offset"]:ext["offset"] + ext["length"]] == raw
    out = GraphView(whole).output.name
    x = np.random.default_rng(0).uniform(-1, 1, (2, 3, 32, 32)).astype(np.float32)
    np.testing.assert_array_equal(tensor_values(mapped, [out], x, prepack=False, folder=tmp_path)[out],
                                  tensor_values(whole, [out], x, prepack=False)[out])


def test_a_truncated_model_is_refused_by_load_mapped_as_by_load(tmp_path):
    """The walk over the encoding meets a field running past the end: the file is handed to ``load``, whose
    error the callers already turn into one line."""
    from google.protobuf.message import DecodeError

    from edgeplan.graph.model import load_mapped

    path = tmp_path / "m.onnx"
    write_onnx(path, onnx.shape_inference.infer_shapes(wide.model()))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # cut inside a weight
    for loader in (load_model, load_mapped):
        with pytest.raises(DecodeError, match="onnx.ModelProto"):
            loader(path)


def test_a_segment_links_the_data_file_of_the_model_it_is_cut_from(tmp_path):
    """Cut points of a model with external data point at the model's own data file (linked beside them), not at
    copies of it; a weight whose bytes differ under the same name is written apart."""
    m = onnx.shape_inference.infer_shapes(wide.model())
    (tmp_path / "model").mkdir()
    write_onnx(tmp_path / "model" / "m.onnx", m, external=True)
    model = load_model(tmp_path / "model" / "m.onnx")
    cut = "fc1.relu"
    (tmp_path / "p").mkdir()
    for part, sub in (("prefix", split.prefix(model, cut)), ("suffix", split.suffix(model, cut))):
        assert write_onnx(tmp_path / "p" / f"{part}.onnx", sub, external=True,
                          data_from=tmp_path / "model" / "m.onnx") == fingerprint(sub)
        assert not (tmp_path / "p" / f"{part}.onnx.data").exists()
    assert (tmp_path / "p" / "m.onnx.data").samefile(tmp_path / "model" / "m.onnx.data")
    x = np.random.default_rng(1).uniform(-1, 1, (1, 3, 32, 32)).astype(np.float32)
    got = _run(tmp_path / "p" / "suffix.onnx", _run(tmp_path / "p" / "prefix.onnx", x))
    np.testing.assert_array_equal(got, _run(tmp_path / "model" / "m.onnx", x))

    sub = split.suffix(model, cut)
    w = max(sub.graph.initializer, key=lambda t: len(t.raw_data))
    w.raw_data = bytes(len(w.raw_data))  # the same name and size, other bytes
    write_onnx(tmp_path / "p" / "changed.onnx", sub, external=True, data_from=tmp_path / "model" / "m.onnx")
    write_onnx(tmp_path / "inline.onnx", sub)
    assert (tmp_path / "p" / "changed.onnx.data").stat().st_size >= len(w.raw_data)
    h = _run(tmp_path / "p" / "prefix.onnx", x)
    np.testing.assert_array_equal(_run(tmp_path / "p" / "changed.onnx", h), _run(tmp_path / "inline.onnx", h))
    # onnxruntime reads the linked file (it is what runs segments); onnx's own loader refuses any data file with
    # several hard links (its "hardlink attack" check), so edgeplan reads its own models' data itself: a built model
    # loads again (a second build, verify, profiling)
    with pytest.raises(Exception, match="hard link"):
        onnx.load(str(tmp_path / "model" / "m.onnx"))
    assert fingerprint(load_model(tmp_path / "model" / "m.onnx")) == fingerprint(model)


def test_external_data_that_is_short_or_elsewhere_is_refused_in_one_line(tmp_path):
    from edgeplan.errors import CorruptModelError

    write_onnx(tmp_path / "m.onnx", onnx.shape_inference.infer_shapes(wide.model()), external=True)
    data = (tmp_path / "m.onnx.data").read_bytes()
    (tmp_path / "m.onnx.data").write_bytes(data[:-100])
    with pytest.raises(CorruptModelError, match=r"m\.onnx: initializer '.*': .* of external data in m\.onnx\.data"):
        load_model(tmp_path / "m.onnx")
    (tmp_path / "m.onnx.data").unlink()
    with pytest.raises(CorruptModelError, match="its external data could not be read"):
        load_model(tmp_path / "m.onnx")
    stub = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    for t in stub.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../m.onnx.data"
    (tmp_path / "m.onnx").write_bytes(stub.SerializeToString())
    with pytest.raises(CorruptModelError, match="not in a file of the model's own directory"):
        load_model(tmp_path / "m.onnx")


@pytest.mark.parametrize("external", [False, True])
def test_a_split_of_the_light_copy_filled_on_write_is_the_split_of_the_model(tmp_path, external):
    """The build splits a light copy of the model (its large weights stubs) and writes the weights in the stubs'
    place (``write_onnx(fill=)``): the same files, inline or with external data, and the same fingerprints as
    splitting the model itself, whose weights the splits copied."""
    from edgeplan.graph.wire import LIGHT_BYTES, is_stub, light_copy

    m = onnx.shape_inference.infer_shapes(wide.model())
    (tmp_path / "model").mkdir()
    write_onnx(tmp_path / "model" / "m.onnx", m, external=external)
    model = load_model(tmp_path / "model" / "m.onnx")
    light = light_copy(model)
    stubs = {t.name for t in light.graph.initializer if is_stub(t)}
    assert len(stubs) >= 2 and stubs == {t.name for t in model.graph.initializer if len(t.raw_data) > LIGHT_BYTES}
    weights = {t.name: t for t in model.graph.initializer}
    for part in ("prefix", "suffix"):
        cut = getattr(split, part)
        for kind, sub, fill in (("whole", cut(model, "fc1.relu"), None), ("light", cut(light, "fc1.relu"), weights)):
            (tmp_path / kind).mkdir(exist_ok=True)
            sha = write_onnx(tmp_path / kind / f"{part}.onnx", sub, data_from=tmp_path / "model" / "m.onnx",
                             fill=fill)
            assert sha == fingerprint(cut(model, "fc1.relu"))
        assert (tmp_path / "light" / f"{part}.onnx").read_bytes() == (tmp_path / "whole" / f"{part}.onnx").read_bytes()
    names = {kind: sorted(p.name for p in (tmp_path / kind).iterdir()) for kind in ("light", "whole")}
    assert names["light"] == names["whole"]
    with pytest.raises(ValueError, match="no tensor to fill"):
        write_onnx(tmp_path / "x.onnx", split.prefix(light, "fc1.relu"), fill={})


def test_external_data_outside_the_models_directory_is_refused(tmp_path):
    from edgeplan.errors import CorruptModelError
    from edgeplan.graph.ingest import load_any

    m = wide.model()
    write_onnx(tmp_path / "a" / "m.onnx", m, external=True)
    stub = onnx.load(str(tmp_path / "a" / "m.onnx"), load_external_data=False)
    for t in stub.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../m.onnx.data"
    (tmp_path / "m.onnx.data").write_bytes((tmp_path / "a" / "m.onnx.data").read_bytes())
    (tmp_path / "a" / "evil.onnx").write_bytes(stub.SerializeToString())
    with pytest.raises(CorruptModelError, match="external data could not be read"):
        load_any(tmp_path / "a" / "evil.onnx")


@pytest.mark.slow
def test_a_model_past_2gb_is_ingested_and_cut_with_external_data(tmp_path):
    src = wide.build(tmp_path / "src" / "wide", width=16384, depth=3)
    assert (src.parent / f"{src.name}.data").stat().st_size > PROTOBUF_LIMIT
    d = stages.ingest(src, "w", "1", tmp_path / "artifacts")
    info = ModelInfo.load(d / "model.json")
    assert info.parameter_bytes > PROTOBUF_LIMIT and (d / "model.onnx.data").stat().st_size > PROTOBUF_LIMIT
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 32, 32)).astype(np.float32)
    want = _run(src, x)
    np.testing.assert_allclose(_run(d / "model.onnx", x), want, rtol=1e-4, atol=1e-4)
    model = load_model(d / "model.onnx")
    assert fingerprint(model) == info.sha256  # fingerprinted in pieces: no 2.28 GB serialization anywhere
    view = GraphView(model)
    cut = "fc2.relu"  # prefix: fc1 and fc2 (1.2 GB), suffix: fc3 and the logits (1.07 GB): both written external
    assert cut in {c.tensor for c in stages.candidates(model)[1]}
    write_onnx(tmp_path / "prefix.onnx", split.prefix(model, cut))
    write_onnx(tmp_path / "suffix.onnx", split.suffix(model, cut))
    for part in ("prefix", "suffix"):
        assert (tmp_path / f"{part}.onnx.data").stat().st_size > EXTERNAL_DATA_BYTES
    got = _run(tmp_path / "suffix.onnx", _run(tmp_path / "prefix.onnx", x))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert view.shape(cut) == (1, 16384)
