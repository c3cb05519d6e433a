"""Single-tensor cuts: hand-built graphs with the expected cut lists, and point selection."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from edgeplan.graph.cuts import Candidate, choose_evenly, single_tensor_cuts
from edgeplan.graph.ingest import canonicalise
from edgeplan.graph.model import GraphView
from edgeplan.pipeline.stages import onnx_analysis
from edgeplan.zoo import tiny


def _model(nodes, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(inits))
    return canonicalise(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def _cuts(model):
    return [c.tensor for c in single_tensor_cuts(GraphView(model))]


def test_chain_every_tensor_is_a_cut():
    m = _model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
                helper.make_node("Abs", ["b"], ["y"])])
    assert _cuts(m) == ["a", "b"]


def test_inside_a_residual_block_is_no_cut():
    # x -> a -> (b -> c) + a -> d -> y : b and c sit beside the skip edge carrying a.
    m = _model([
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Neg", ["a"], ["b"]),
        helper.make_node("Abs", ["b"], ["c"]),
        helper.make_node("Add", ["a", "c"], ["d"]),
        helper.make_node("Relu", ["d"], ["y"]),
    ])
    assert _cuts(m) == ["a", "d"]


def test_no_single_tensor_cut_keeps_points_0_and_P():
    # Two branches from the input meet at the output: no interior tensor alone separates the graph.
    m = _model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["x"], ["b"]),
                helper.make_node("Add", ["a", "b"], ["y"])])
    assert _cuts(m) == []
    analysis = onnx_analysis(m, max_points=8)
    assert [p.tensor for p in analysis.points] == ["x", "y"]
    assert "no single-tensor cut" in analysis.note


def test_tiny_cnn_cuts_and_costs():
    view = GraphView(canonicalise(tiny.model()))
    cuts = single_tensor_cuts(view)
    assert [c.tensor for c in cuts] == ["conv1.out", "relu1.out", "conv2.out", "relu2.out", "add.out", "relu4.out",
                                        "pool.out", "conv5.out", "relu5.out", "gap.out", "flat.out"]
    relu2 = cuts[3]
    assert relu2.shape == (1, 32, 16, 16) and relu2.boundary_bytes == 32 * 16 * 16
    assert relu2.prefix_macs == 32 * 32 * 16 * 27 + 16 * 16 * 32 * 144
    assert relu2.prefix_param_bytes == (16 * 27 + 16 * 4) + (32 * 144 + 32 * 4)  # int8 weights, int32 biases


def _cands(sizes):
    out, total = [], 0
    for i, s in enumerate(sizes):
        total += s
        out.append(Candidate(f"t{i}", i, f"n{i}", (1,), 0, total, 1))
    return out, total


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=30), st.integers(0, 12))
@settings(max_examples=200, deadline=None)
def test_choose_evenly_against_brute_force(sizes, m):
    cands, total = _cands(sizes)
    chosen = choose_evenly(cands, m, total)
    assert len(chosen) == min(m, len(cands))
    idx = [cands.index(c) for c in chosen]
    assert idx == sorted(set(idx))  # topological order, no repeats
    if len(cands) > m > 0:
        # Every target's nearest candidate (brute force over all) is at most as far as the chosen one for
        # the first target, which picks before any other target can take its best.
        target = total / (m + 1)
        best = min(abs(c.prefix_param_bytes - target) for c in cands)
        assert any(abs(c.prefix_param_bytes - target) == best for c in chosen)
    if len(cands) <= m:
        assert chosen == cands


def test_choose_evenly_spreads_by_parameter_bytes():
    cands, total = _cands([10] * 100)
    chosen = choose_evenly(cands, 4, total)
    assert [c.prefix_param_bytes for c in chosen] == [200, 400, 600, 800]
    assert np.all(np.diff([c.node_index for c in chosen]) > 0)
