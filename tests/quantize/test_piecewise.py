"""A conversion in pieces (``quantize/piecewise``) against the whole model's conversion, on a CNN with a wide
fully-connected head (``zoo:wide_fc``) under a budget that makes three pieces and splits the first dense layer in
two: the same int8 ops, the same int8 weights, scales equal but for the last float bits of a split layer's output
range, and the same outputs."""
from __future__ import annotations

import numpy as np
import pytest

from edgeplan.errors import ConversionError
from edgeplan.graph.ingest import load_any
from edgeplan.graph.model import GraphView
from edgeplan.quantize import convert, litert, stitch
from edgeplan.quantize.calibration import CalibrationSpec, calibration_data
from edgeplan.quantize.pieces import plan
from edgeplan.quantize.tflite_graph import TfliteGraph
from edgeplan.zoo import wide

BUDGET = 3 << 20  # fc1 (2048x512 floats, 4 MiB) in 2 parts; the convolutions, and fc2 with the logits, whole


@pytest.fixture(scope="module")
def converted(tmp_path_factory, params):
    tmp = tmp_path_factory.mktemp("piecewise")
    path = wide.build(tmp / "wide_fc")
    model = load_any(path)
    onnx_path = tmp / "model.onnx"
    onnx_path.write_bytes(model.SerializeToString())
    view = GraphView(model)
    pieces = plan(view, BUDGET)
    spec = CalibrationSpec.from_params(params["quantize"]["calibration"])
    cal = calibration_data(spec, view.shape(view.input.name))
    ticks = []
    whole = convert.to_int8_tflite(onnx_path, cal, tmp / "whole")
    parts = convert.to_int8_tflite(onnx_path, cal, tmp / "pieces", pieces=pieces, view=view,
                                   progress=lambda done, total: ticks.append((done, total)))
    return pieces, whole, parts, ticks, tmp


@pytest.mark.slow
def test_pieces_give_the_whole_conversion(converted):
    pieces, whole, parts, ticks, _ = converted
    assert [p.parts for p in pieces] == [1, 2, 1]
    assert ticks == [(1, 5), (2, 5), (3, 5), (4, 5), (5, 5)]
    a, b = TfliteGraph(whole), TfliteGraph(parts)
    assert [op.name for op in a.ops] == [op.name for op in b.ops]
    for x, y in zip(a.ops, b.ops):
        for i, j in zip((*x.inputs, *x.outputs), (*y.inputs, *y.outputs)):
            if i < 0:
                assert j < 0
                continue
            s, t = a.tensors[i], b.tensors[j]
            assert s.shape == t.shape and s.dtype == t.dtype and s.zero_point == t.zero_point
            np.testing.assert_allclose(s.scale, t.scale, rtol=1e-5)
            if s.constant:
                assert bytes(a.model.buffers[a.subgraph.tensors[i].buffer].data) == bytes(
                    b.model.buffers[b.subgraph.tensors[j].buffer].data), (x.name, s.name)
    # the boundary tensors are named after the ONNX cuts
    names = {t.name for t in b.tensors}
    assert {p.end for p in pieces[:-1]} <= names
    rng = np.random.default_rng(0)
    ia, ib = litert.interpreter(whole), litert.interpreter(parts)
    for _ in range(8):
        x = rng.integers(-128, 128, (1, 32, 32, 3), dtype=np.int8)
        outs = []
        for it in (ia, ib):
            it.set_tensor(it.get_input_details()[0]["index"], x)
            it.invoke()
            outs.append(it.get_tensor(it.get_output_details()[0]["index"]))
        np.testing.assert_array_equal(*outs)


@pytest.mark.slow
def test_a_boundary_the_pieces_disagree_on_is_refused(converted):
    parts = converted[2]
    assert TfliteGraph(parts).tensors[TfliteGraph(parts).outputs[0]].shape == (1, 10)
    with pytest.raises(ConversionError, match="the boundary 'b' between pieces 0 and 1"):
        stitch.stitch([parts, parts], ["b"])  # the model's 10 logits are not its 32x32x3 input


@pytest.mark.slow
def test_a_boundary_quantized_with_another_scale_is_requantized(converted):
    """The next piece's input took another scale (a MAX_POOL_2D first in it keeps one scale for its input and output
    and took its own range: InceptionResNetV2 with a thread count unlike the calibrator's): a QUANTIZE op goes
    between, and the stitched model still runs and gives (nearly) the same outputs."""
    from tensorflow.lite.tools import flatbuffer_utils

    from edgeplan.quantize.cut import cut

    parts = converted[2]
    g = TfliteGraph(parts)
    at = g.by_name(converted[0][0].end)  # the first boundary
    prefix, suffix = cut(g, at.index)
    m = flatbuffer_utils.convert_bytearray_to_object(bytearray(suffix))
    q = m.subgraphs[0].tensors[m.subgraphs[0].inputs[0]].quantization
    q.scale = np.array(q.scale) * (1 + 2e-7)  # a float bit or two away, as a piece's own range gave it
    requantized = []
    model = stitch.stitch([prefix, bytes(flatbuffer_utils.convert_object_to_bytearray(m))], ["b"], requantized)
    assert requantized == ["b"]
    ops = [op.name for op in TfliteGraph(model).ops]
    assert ops.count("QUANTIZE") == [op.name for op in g.ops].count("QUANTIZE") + 1
    ia, ib = litert.interpreter(parts), litert.interpreter(model)
    x = np.random.default_rng(1).integers(-128, 128, (1, 32, 32, 3), dtype=np.int8)
    outs = []
    for it in (ia, ib):
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        outs.append(it.get_tensor(it.get_output_details()[0]["index"]).astype(int))
    assert np.abs(outs[0] - outs[1]).max() <= 2
