"""Matching ONNX candidates to the int8 model: fused tensors are dropped with a reason, the rest match."""
from __future__ import annotations

import json

import numpy as np
import onnx

from edgeplan.quantize import litert
from edgeplan.quantize.tflite_graph import TfliteGraph


def test_tiny_cnn_matches(compiled):
    d, result, _ = compiled("tiny_cnn")
    a = json.loads((d / "analysis.json").read_text())
    dropped = {x["tensor"]: x["reason"] for x in a["dropped"]}
    kept = [p["tensor"] for p in a["points"]]
    # Conv outputs before their ReLU are fused into CONV_2D; the post-activation tensors survive.
    assert kept == ["input", "relu1.out", "relu2.out", "relu4.out", "pool.out", "relu5.out", "gap.out", "logits"]
    for t in ("conv1.out", "conv2.out", "add.out", "conv5.out"):
        assert dropped[t].startswith("fused away by the converter")
    assert [p["index"] for p in a["points"]] == list(range(len(kept)))
    assert a["complete"] and a["onnx_candidates"] == 11


def test_matched_tensors_carry_the_same_values(compiled):
    """The int8 value of every matched tensor follows the float ONNX value (NCHW -> NHWC)."""
    d, result, _ = compiled("light_squeezenet")
    model = onnx.load(str(d / "model.onnx"))
    g = TfliteGraph((d / "model_int8.tflite").read_bytes())
    from edgeplan.graph.evaluate import tensor_values
    from edgeplan.quantize.match import tflite_values

    x = np.random.default_rng(3).uniform(-1, 1, (1, 3, 224, 224)).astype(np.float32)
    interior = result.analysis.points[1:-1]
    fvals = tensor_values(model, [p.tensor for p in interior], x)
    ivals = tflite_values(g.data, x, [g.by_name(p.tflite_tensor).index for p in interior])
    for p in interior:
        f = litert.nchw_to_nhwc(fvals[p.tensor]).ravel()
        q = ivals[g.by_name(p.tflite_tensor).index].ravel()
        assert float(f @ q / np.linalg.norm(f) / np.linalg.norm(q)) > 0.99, p.tensor
        assert g.tensors[g.by_name(p.tflite_tensor).index].shape == tuple(p.shape[i] for i in (0, 2, 3, 1))


def test_points_are_chosen_evenly_by_parameter_bytes(compiled):
    d, result, _ = compiled("light_squeezenet")
    a = result.analysis
    assert a.max_points == 8 and len(a.points) == 10
    sizes = [p.prefix_param_bytes for p in a.points]
    assert sizes == sorted(sizes) and sizes[0] == 0
    assert sizes[-1] == TfliteGraph((d / "model_int8.tflite").read_bytes()).param_bytes()
    assert any(x["reason"].startswith("not chosen: max_points=8") for x in json.loads((d / "analysis.json").read_text())["dropped"])


def test_weights_given_as_arrays_compute_what_the_inline_model_does(compiled):
    """graph/evaluate.session hands onnxruntime the weights as arrays (not serialized in the model): every
    tensor's values are bit-identical to a session of the same graph, same options, with its weights inline."""
    import onnxruntime as ort

    from edgeplan.graph.evaluate import session, session_options

    d, _, _ = compiled("tiny_cnn")
    model = onnx.load(str(d / "model.onnx"))
    vis = {v.name: v for v in model.graph.value_info}
    model.graph.output.extend([vis[n.output[0]] for n in model.graph.node if n.output[0] in vis])
    big = [i.name for i in model.graph.initializer if len(i.raw_data) >= 1024]
    assert big  # the path under test is taken
    before = model.SerializeToString()
    inline = ort.InferenceSession(before, session_options(), providers=["CPUExecutionProvider"])
    arrays = session(model)
    assert model.SerializeToString() == before  # the model given is left as it is (no copy of it is made either)
    shape = [x.dim_value for x in model.graph.input[0].type.tensor_type.shape.dim]
    for k in range(3):
        x = {model.graph.input[0].name: np.random.default_rng(k).normal(size=shape).astype(np.float32)}
        for a, b, o in zip(arrays.run(None, x), inline.run(None, x), inline.get_outputs()):
            assert np.array_equal(a, b), o.name


def test_a_model_stored_with_external_data_is_matched_from_its_file(compiled, tmp_path):
    """Given the path of a model written with external data, matching's float values come from onnxruntime reading
    the data file itself (``graph.evaluate``; wide_fc_2g's matching no longer holds a second copy of its 2.28 GB):
    the same values and the same matches as from the model held in memory. A data file cut short is refused in
    one line before onnxruntime sees it."""
    import pytest

    from edgeplan.artifacts import write_onnx
    from edgeplan.errors import CorruptModelError
    from edgeplan.graph.evaluate import tensor_values
    from edgeplan.graph.model import load as load_model
    from edgeplan.pipeline.stages import candidates
    from edgeplan.quantize.match import match_candidates

    d, result, _ = compiled("light_squeezenet")
    model = load_model(d / "model.onnx")
    path = tmp_path / "model.onnx"
    write_onnx(path, model, external=True)
    assert (tmp_path / "model.onnx.data").stat().st_size > 1_000_000 > path.stat().st_size
    interior = [p.tensor for p in result.analysis.points[1:-1]]
    x = np.random.default_rng(4).uniform(-1, 1, (2, 3, 224, 224)).astype(np.float32)
    held, stored = tensor_values(model, interior, x), tensor_values(path, interior, x)
    for t in interior:
        np.testing.assert_allclose(stored[t], held[t], rtol=1e-5, atol=1e-5 * float(np.abs(held[t]).max()))
    tfl = TfliteGraph((d / "model_int8.tflite").read_bytes())
    _, cands = candidates(model)
    a, b = (match_candidates(m, cands, tfl, x) for m in (model, path))
    assert [(m.candidate.tensor, m.tflite_index, m.reason) for m in a] == \
           [(m.candidate.tensor, m.tflite_index, m.reason) for m in b]
    assert max(abs(m.cosine - n.cosine) for m, n in zip(a, b)) < 1e-6
    data = (tmp_path / "model.onnx.data").read_bytes()
    (tmp_path / "model.onnx.data").write_bytes(data[:-10])
    with pytest.raises(CorruptModelError, match=r"model\.onnx: initializer '.*': .* bytes of external data in "
                                                r"model\.onnx\.data where its shape"):
        tensor_values(path, interior, x)
