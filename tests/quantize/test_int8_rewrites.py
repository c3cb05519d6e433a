"""What the int8 conversion rewrites in the copy onnx2tf is given (``quantize/convert._int8_rewrites``): the
rewritten model computes what the original does (onnxruntime), and a Reshape that changes nothing is gone."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from edgeplan.quantize.convert import _int8_rewrites


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


def test_a_noop_reshape_is_dropped_and_a_real_one_kept(tmp_path):
    """ConvNeXt's LayerNorm as tf2onnx leaves it: the channel mean [1, 1, 6, 6] reshaped to the shape it has
    (dropped), the negated mean reshaped to NHWC [1, 6, 6, 1] (a real reshape, kept), a no-op Reshape between the
    variance and its 1/sqrt (dropped: the power reads the variance), and the graph's output a no-op Reshape too
    (kept: a graph output keeps its name)."""
    shape = lambda *d: numpy_helper.from_array(np.array(d, np.int64))  # noqa: E731
    inits = [shape(-1, 1, 6, 6), shape(-1, 6, 6, 1), shape(1, 6, 6, 1), numpy_helper.from_array(
        np.array(-1.0, np.float32), "minus")]
    for t, name in zip(inits, ("same", "nhwc", "out_shape")):
        t.name = name
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[1], keepdims=1, name="mean"),
             helper.make_node("Reshape", ["mean", "same"], ["mean_r"], name="noop"),
             helper.make_node("Sub", ["x", "mean_r"], ["d"], name="sub"),
             helper.make_node("Neg", ["mean"], ["neg"], name="neg"),
             helper.make_node("Reshape", ["neg", "nhwc"], ["neg_r"], name="real"),
             helper.make_node("Reshape", ["neg_r", "out_shape"], ["neg_out"], name="noop_out"),
             helper.make_node("Mul", ["d", "d"], ["d2"], name="square"),
             helper.make_node("ReduceMean", ["d2"], ["var"], axes=[1], keepdims=1, name="var"),
             helper.make_node("Reshape", ["var", "same"], ["var_r"], name="noop_var"),
             helper.make_node("Sqrt", ["var_r"], ["std"], name="sqrt"),
             helper.make_node("Reciprocal", ["std"], ["inv"], name="reciprocal"),
             helper.make_node("Mul", ["d", "inv"], ["normed"], name="normed"),
             helper.make_node("ReduceSum", ["normed"], ["s"], axes=[1], keepdims=1, name="sum"),
             helper.make_node("Reshape", ["s", "same"], ["y"], name="noop_y")]
    graph = helper.make_graph(nodes, "ln", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 6, 6]),
                               helper.make_tensor_value_info("neg_out", TensorProto.FLOAT, [1, 6, 6, 1])], inits)
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)]))
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    _int8_rewrites(path)
    rewritten = onnx.load(str(path))
    names = {n.name for n in rewritten.graph.node}
    assert not {"noop", "noop_var", "sqrt"} & names and {"real", "noop_out", "noop_y"} <= names
    assert next(n for n in rewritten.graph.node if n.name == "reciprocal").input[0] == "var"  # Pow(var, -0.5)
    assert next(n for n in rewritten.graph.node if n.name == "sub").input[1] == "mean"
    assert next(n for n in rewritten.graph.node if n.name == "neg").op_type == "Mul"
    x = np.random.default_rng(0).normal(size=(1, 8, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(_run(rewritten, x), _run(model, x), rtol=1e-5, atol=1e-5)
