"""The plan of a conversion in pieces (``quantize/pieces``) and the pieces as ONNX models (``surgery/pieces``):
the pieces partition the model's nodes in chain order, each within the budget unless split or flagged, every
boundary a single-tensor cut the converter keeps; and the chain of piece models (a split layer's parts side by
side) computes the model's own outputs in onnxruntime."""
from __future__ import annotations

import itertools
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from edgeplan.graph.cuts import single_tensor_cuts
from edgeplan.graph.model import GraphView
from edgeplan.quantize.pieces import cut_allowed, node_activation_bytes, node_float_bytes, plan, splittable
from edgeplan.surgery.pieces import part_channels, piece_model
from edgeplan.zoo import tiny, wide


def _canonical(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(model)


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x})[0]


def _check_plan(view: GraphView, pieces, budget: int) -> None:
    sizes, acts = node_float_bytes(view), node_activation_bytes(view)
    covered = [i for p in pieces for i in p.nodes]
    assert covered == sorted(covered) and sorted(covered) == list(range(len(view.graph.node)))
    assert pieces[0].start is None and pieces[-1].end is None
    for a, b in itertools.pairwise(pieces):
        assert a.end == b.start and a.end in {c.tensor for c in single_tensor_cuts(view)}
        assert cut_allowed(view, a.end)
    for p in pieces:
        assert p.float_bytes == sum(sizes[i] for i in p.nodes) and p.activation_bytes == sum(acts[i] for i in p.nodes)
        if p.parts > 1:
            assert splittable(view, p.nodes, p.start) and p.parts == math.ceil(p.cost / budget)
        elif not p.over_budget:
            assert p.cost <= budget
    # greedy: no two neighbouring unsplit pieces would fit the budget together
    for a, b in itertools.pairwise(pieces):
        if a.parts == b.parts == 1 and not (a.over_budget or b.over_budget):
            assert a.cost + b.cost > budget


@pytest.mark.parametrize("budget", [64 << 10, 512 << 10, 1200 << 10, 2 << 20, 64 << 20])
def test_pieces_cover_the_model_within_the_budget_along_allowed_cuts(budget):
    view = GraphView(_canonical(wide.model()))
    pieces = plan(view, budget)
    _check_plan(view, pieces, budget)
    if budget >= sum(node_float_bytes(view)):
        assert len(pieces) == 1 and pieces[0].parts == 1
    if budget == 512 << 10:  # fc1 (2048x512 floats, 4 MiB) alone is split into 9 parts; the convolutions share one
        fc1 = next(p for p in pieces if p.start == "flat")
        assert fc1.parts == 9 and [view.graph.node[i].op_type for i in fc1.nodes] == ["MatMul", "Add", "Relu"]


def test_a_run_that_is_no_fully_connected_layer_is_converted_whole_and_flagged():
    view = GraphView(_canonical(tiny.model()))  # no cut between its convolutions' residual branch: one run above 4 KiB
    pieces = plan(view, 4 << 10)
    _check_plan(view, pieces, 4 << 10)
    assert any(p.over_budget and p.parts == 1 for p in pieces)


@pytest.mark.parametrize("budget", [512 << 10, 1200 << 10])
def test_the_chain_of_piece_models_computes_the_model(budget):
    model = _canonical(wide.model())
    view = GraphView(model)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 32, 32)).astype(np.float32)
    want = _run(model, x)
    h = x
    pieces = plan(view, budget)
    assert len(pieces) > 2 and any(p.parts > 1 for p in pieces)
    for p in pieces:
        outs = [_run(piece_model(view, p, k), h) for k in range(p.parts)]
        h = np.concatenate(outs, axis=-1)
    np.testing.assert_allclose(h, want, rtol=1e-5, atol=1e-5)


def test_a_part_keeps_its_slice_of_the_weight_and_the_bias():
    view = GraphView(_canonical(wide.model()))
    p = next(p for p in plan(view, 512 << 10) if p.parts > 1)
    channels = 512
    got = []
    for k in range(p.parts):
        lo, hi = part_channels(channels, p.parts, k)
        inits = {t.name: numpy_helper.to_array(t) for t in piece_model(view, p, k).graph.initializer}
        assert inits["fc1.w"].shape == (2048, hi - lo) and inits["fc1.b"].shape == (hi - lo,)
        got.append((inits["fc1.w"], inits["fc1.b"]))
    whole = {t.name: numpy_helper.to_array(t) for t in view.graph.initializer}
    np.testing.assert_array_equal(np.concatenate([w for w, _ in got], axis=1), whole["fc1.w"])
    np.testing.assert_array_equal(np.concatenate([b for _, b in got]), whole["fc1.b"])
    assert [part_channels(10, 3, k) for k in range(3)] == [(0, 3), (3, 6), (6, 10)]


def _resnet_v2_block() -> GraphView:
    """conv+bias+relu, then a pre-activation block: a residual Add whose output feeds the next batch-norm Mul/Add
    and the next residual Add; a convolution scaled by a constant Mul; global pooling, Squeeze, a dense layer."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)

    def const(name, *shape):
        return numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c0", "b0"], ["c0b"]),
        helper.make_node("Relu", ["c0b"], ["r0"]),
        helper.make_node("Conv", ["r0", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c1", "r0"], ["res"]),  # residual: two computed inputs
        helper.make_node("Mul", ["res", "s"], ["bn_m"]),  # the next block's batch norm
        helper.make_node("Add", ["bn_m", "t"], ["bn_a"]),
        helper.make_node("Relu", ["bn_a"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["c2", "s2"], ["c2m"]),  # a constant scale after a convolution: folded into it
        helper.make_node("Add", ["c2m", "res"], ["res2"]),
        helper.make_node("GlobalAveragePool", ["res2"], ["gap"]),
        helper.make_node("Squeeze", ["gap", "axes"], ["sq"]),
        helper.make_node("MatMul", ["sq", "fc"], ["y"]),
    ]
    inits = [const("w0", 4, 3, 3, 3), const("b0", 1, 4, 1, 1), const("w1", 4, 4, 3, 3), const("s", 1, 4, 1, 1),
             const("t", 1, 4, 1, 1), const("w2", 4, 4, 3, 3), const("s2", 1, 4, 1, 1), const("fc", 4, 10),
             numpy_helper.from_array(np.array([2, 3], dtype=np.int64), "axes")]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return GraphView(_canonical(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])))


def test_a_cut_is_refused_where_the_converter_folds_or_fuses_and_taken_at_a_residual_add():
    view = _resnet_v2_block()
    allowed = {t: cut_allowed(view, t) for t in ("c0", "c0b", "r0", "res", "bn_m", "bn_a", "r1", "c2", "c2m",
                                                 "res2", "gap", "sq")}
    assert allowed == {
        "c0": False,  # a bias Add after a convolution
        "c0b": False,  # an activation after anything
        "r0": True,
        "res": True,  # a residual Add's output: its batch-norm Mul stays an op of its own
        "bn_m": True,  # ... and so does the Add after that Mul
        "bn_a": False,  # an activation
        "r1": True,
        "c2": False,  # a constant Mul after a convolution
        "c2m": True,  # the residual Add that reads it has no constant operand
        "res2": True,
        "gap": False,  # a Squeeze
        "sq": False,  # after a Squeeze: onnx2tf rewrites it with the dense layer
    }
