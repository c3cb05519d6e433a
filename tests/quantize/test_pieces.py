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
from edgeplan.quantize.pieces import NOT_AFTER_CUT, node_float_bytes, plan, splittable
from edgeplan.surgery.pieces import part_channels, piece_model
from edgeplan.zoo import tiny, wide


def _canonical(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(model)


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x})[0]


def _check_plan(view: GraphView, pieces, budget: int) -> None:
    sizes = node_float_bytes(view)
    covered = [i for p in pieces for i in p.nodes]
    assert covered == sorted(covered) and sorted(covered) == list(range(len(view.graph.node)))
    assert pieces[0].start is None and pieces[-1].end is None
    for a, b in itertools.pairwise(pieces):
        assert a.end == b.start and a.end in {c.tensor for c in single_tensor_cuts(view)}
        assert not any(view.graph.node[j].op_type in NOT_AFTER_CUT for j in view.consumers[a.end])
    for p in pieces:
        assert p.float_bytes == sum(sizes[i] for i in p.nodes)
        if p.parts > 1:
            assert splittable(view, p.nodes, p.start) and p.parts == math.ceil(p.float_bytes / budget)
        elif not p.over_budget:
            assert p.float_bytes <= budget
    # greedy: no two neighbouring unsplit pieces would fit the budget together
    for a, b in itertools.pairwise(pieces):
        if a.parts == b.parts == 1 and not (a.over_budget or b.over_budget):
            assert a.float_bytes + b.float_bytes > budget


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
