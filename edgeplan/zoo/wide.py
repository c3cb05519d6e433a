"""A small CNN with a wide fully-connected head (VGG's shape, at any size), built node by node with onnx.helper:
3x32x32 in, two conv/ReLU/max-pool stages, a flatten, ``depth`` fully-connected ReLU layers of ``width`` units and
10 logits. Most of its parameters sit in the head, as in VGG: the model for conversion in pieces (a layer larger
than the piece budget is split) and, at a large width, for models past protobuf's 2 GB (written with external
data)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

PROTOBUF_LIMIT = 2**31 - 1


def model(width: int = 512, depth: int = 2, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(name: str, a: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(a.astype(np.float32), name))
        return name

    def conv(name: str, x: str, cin: int, cout: int) -> str:
        w = const(f"{name}.w", rng.normal(0, math.sqrt(2.0 / (cin * 9)), (cout, cin, 3, 3)))
        b = const(f"{name}.b", rng.normal(0, 0.05, (cout,)))
        nodes.append(helper.make_node("Conv", [x, w, b], [f"{name}.out"], name=name, kernel_shape=[3, 3],
                                      pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"{name}.out"], [f"{name}.relu"], name=f"{name}.relu"))
        nodes.append(helper.make_node("MaxPool", [f"{name}.relu"], [f"{name}.pool"], name=f"{name}.pool",
                                      kernel_shape=[2, 2], strides=[2, 2]))
        return f"{name}.pool"

    def dense(name: str, x: str, cin: int, cout: int, relu: bool) -> str:
        w = const(f"{name}.w", rng.normal(0, math.sqrt(2.0 / cin), (cin, cout)))
        b = const(f"{name}.b", rng.normal(0, 0.05, (cout,)))
        nodes.append(helper.make_node("MatMul", [x, w], [f"{name}.mm"], name=f"{name}.matmul"))
        nodes.append(helper.make_node("Add", [f"{name}.mm", b], [f"{name}.out"], name=f"{name}.bias"))
        if not relu:
            return f"{name}.out"
        nodes.append(helper.make_node("Relu", [f"{name}.out"], [f"{name}.relu"], name=f"{name}.relu"))
        return f"{name}.relu"

    h = conv("conv2", conv("conv1", "input", 3, 16), 16, 32)
    nodes.append(helper.make_node("Flatten", [h], ["flat"], name="flatten"))
    h, cin = "flat", 32 * 8 * 8
    for k in range(depth):
        h, cin = dense(f"fc{k + 1}", h, cin, width, relu=True), width
    dense("logits", h, cin, 10, relu=False)
    graph = helper.make_graph(
        nodes, f"wide_fc_{width}x{depth}",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("logits.out", TensorProto.FLOAT, [1, 10])],
        inits,
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def build(out: Path, width: int = 512, depth: int = 2) -> Path:
    """``out.onnx``; past protobuf's limit, its weights in ``out.onnx.data`` beside it (external data)."""
    from edgeplan.artifacts import write_onnx

    path = out.with_name(f"{out.name}.onnx")
    if not path.is_file():
        m = model(width, depth)
        write_onnx(path, m, external=sum(len(t.raw_data) for t in m.graph.initializer) > PROTOBUF_LIMIT)
    return path
