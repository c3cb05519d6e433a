"""Zoo models: real architectures whose outputs depend on their inputs once re-weighted."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from edgeplan import zoo
from edgeplan.graph.evaluate import tensor_values
from edgeplan.verify.checks import input_dependence
from edgeplan.zoo import light


def _dependence(path) -> float:
    m = onnx.load(str(path))
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    xs = np.random.default_rng(11).uniform(-1, 1, (3, *shape[1:])).astype(np.float32)
    out = m.graph.output[0].name
    return input_dependence(tensor_values(m, [out], xs)[out])


def test_shipped_light_graphs_ignore_their_input():
    """Why they are re-weighted: every weight is the constant 0.02, so the output is flat."""
    m = onnx.load(str(light.source_path("squeezenet")))
    assert any(n.op_type == "ConstantOfShape" for n in m.graph.node)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["light_squeezenet", "light_resnet50"])
def test_reweighted_light_graphs_depend_on_their_input(tmp_path, name):
    path = zoo.build(name, tmp_path)
    m = onnx.load(str(path))
    assert m.graph.node[-1].op_type != "Softmax"  # logits
    assert _dependence(path) > 0.01  # verify requires > 1e-3


def test_unknown_zoo_name(tmp_path):
    from edgeplan.errors import ModelNotFoundError

    with pytest.raises(ModelNotFoundError, match="light_squeezenet"):
        zoo.build("resnet9000", tmp_path)


def test_vit_encoder_heads_are_parallel_branches(tmp_path):
    """The transformer encoder for Parallax's Table 7: per block, the heads' 12 projections are one layer of 12
    branches, and each head's two activation-by-activation MatMuls (BATCH_MATMUL in the int8 model, which the
    Edge TPU does not map) are layers of 4, one branch per head."""
    from edgeplan.graph.branches import from_onnx, structure
    from edgeplan.graph.model import GraphView

    path = zoo.build("vit_encoder", tmp_path)
    m = onnx.load(str(path))
    view = GraphView(m)
    s = structure(from_onnx(view))
    blocks, heads = 4, 4
    widths = sorted(len(layer) for layer in s.layers if len(layer) > 1)
    assert widths == [heads] * (3 * blocks) + [3 * heads] * blocks
    weights = set(view.initializers)
    by_activations = [n for n in m.graph.node if n.op_type == "MatMul" and not set(n.input) & weights]
    assert len(by_activations) == 2 * heads * blocks
    assert _dependence(path) > 0.01
