"""``graph/wire.chunks`` gives exactly ``SerializeToString(deterministic=True)`` in pieces, large tensors spliced
in raw: on real models (a wide fully-connected head with 4 MiB weights, tiny_cnn) and on messages with every kind
of field around the spliced ones (metadata, doc strings, external-data entries, functions after the graph)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgeplan.graph import wire
from edgeplan.graph.model import fingerprint
from edgeplan.zoo import tiny, wide


def _same(model: onnx.ModelProto) -> None:
    want = model.SerializeToString(deterministic=True)
    parts = list(wire.chunks(model))
    assert b"".join(parts) == want
    assert max(len(p) for p in parts) < len(want) or len(want) <= wire.LARGE  # never whole when large
    assert onnx.ModelProto.FromString(b"".join(parts)) == model


def test_real_models_serialize_the_same_in_pieces():
    for m in (wide.model(), wide.model(width=700, depth=1), tiny.model()):
        _same(m)
        _same(onnx.shape_inference.infer_shapes(m))


def test_fields_around_the_spliced_ones_keep_their_place():
    big = numpy_helper.from_array(np.arange(300_000, dtype=np.float32).reshape(600, 500), "w")
    big.doc_string = "after the raw data"
    entry = big.metadata_props.add()
    entry.key, entry.value = "k", "v"
    small = numpy_helper.from_array(np.ones(3, np.float32), "b")
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm", doc_string="node doc")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 600])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 500])], [small, big],
                          doc_string="graph doc")
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], doc_string="model doc")
    m.metadata_props.add(key="after", value="the graph")
    m.functions.add(name="f", domain="d")
    _same(m)
    assert fingerprint(m) == __import__("hashlib").sha256(m.SerializeToString(deterministic=True)).hexdigest()
