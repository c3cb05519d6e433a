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
