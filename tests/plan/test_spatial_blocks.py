"""The partitionable region of real graphs: AlexNet (a chain) and tiny_cnn (a residual block)."""
from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from edgeplan.errors import PlanError
from edgeplan.graph.ingest import canonicalise
from edgeplan.graph.model import GraphView
from edgeplan.plan.spatial.blocks import region
from edgeplan.plan.spatial.intervals import Window
from edgeplan.zoo import alexnet, tiny


@pytest.fixture(scope="module")
def alex() -> GraphView:
    return GraphView(canonicalise(alexnet.model(), source="alexnet"))


def test_alexnet_is_one_chain_up_to_the_flatten(alex):
    r = region(alex, "H")
    assert [x.name for x in r.layers] == ["conv1", "pool1", "conv2", "pool2", "conv3", "conv4", "conv5", "pool3"]
    assert r.nodes[0] == ("conv1", "conv1.relu")
    assert r.layers[0].window == Window(11, 4, 1, 2, 2, 224, 55)
    assert r.layers[1].window == Window(3, 2, 1, 0, 0, 55, 27)
    assert (r.layers[0].in_row_bytes, r.layers[0].out_row_bytes) == (3 * 224, 64 * 55)
    assert r.layers[2].macs == 27 * 27 * 192 * (64 * 25 + 1)  # conv2 MACs and one per ReLU output
    assert "Flatten 'flatten' is Type 3" in r.reason and r.output == "pool3.out"
    w = region(alex, "W")
    assert [x.window for x in w.layers] == [x.window for x in r.layers]  # square model, square windows


def test_a_residual_block_ends_the_region_and_says_so():
    r = region(GraphView(canonicalise(tiny.model(), source="tiny")), "H")
    assert [x.name for x in r.layers] == ["conv1", "conv2"]
    assert "read by 2 ops" in r.reason and "path analysis" in r.reason


def _flat_input(w: int) -> onnx.ModelProto:
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, w])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, w])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_a_w_split_of_a_one_wide_tensor_is_refused():
    view = GraphView(canonicalise(_flat_input(1), source="flat"))
    with pytest.raises(PlanError, match="1 wide along W"):
        region(view, "W")
    assert len(region(view, "H").layers) == 1
    with pytest.raises(PlanError, match="partition along H or W"):
        region(view, "C")


def test_a_pad_joins_the_next_window_and_the_layer_before_keeps_its_own_row_size():
    """Conv -> Pad (1 each side of H and W) -> Conv: the Pad's rows are the second window's padding, and the first
    layer's output rows are its own (8 channels x 10 wide), not the padded tensor's (8 x 12)."""
    w1 = helper.make_tensor("w1", TensorProto.FLOAT, [8, 3, 3, 3], [0.01] * 216)
    w2 = helper.make_tensor("w2", TensorProto.FLOAT, [4, 8, 3, 3], [0.01] * 288)
    pads = helper.make_tensor("pads", TensorProto.INT64, [8], [0, 0, 1, 1, 0, 0, 1, 1])
    g = helper.make_graph([helper.make_node("Conv", ["x", "w1"], ["a"], name="c1", pads=[1, 1, 1, 1]),
                           helper.make_node("Pad", ["a", "pads"], ["p"], name="pad"),
                           helper.make_node("Conv", ["p", "w2"], ["y"], name="c2", strides=[2, 2])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 10, 10])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])],
                          initializer=[w1, w2, pads])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    r = region(GraphView(canonicalise(m, source="padded")), "H")
    assert [x.name for x in r.layers] == ["c1", "c2"] and r.nodes[1] == ("pad", "c2")
    assert r.layers[0].out_row_bytes == 8 * 10 and r.layers[1].in_row_bytes == 8 * 10
    assert r.layers[1].window == Window(3, 2, 1, 1, 1, 10, 5)
