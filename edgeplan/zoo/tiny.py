"""Tiny CNNs built node by node with onnx.helper (3x32x32 in, 10 logits out), seeded He-normal weights."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def model(lrn: bool = False, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def conv(name, x, cin, cout, k=3, stride=1):
        w = rng.normal(0, math.sqrt(2.0 / (cin * k * k)), (cout, cin, k, k)).astype(np.float32)
        b = rng.normal(0, 0.05, (cout,)).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, f"{name}.w"), numpy_helper.from_array(b, f"{name}.b")])
        p = k // 2
        nodes.append(helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [f"{name}.out"], name=name,
                                      kernel_shape=[k, k], strides=[stride, stride], pads=[p, p, p, p]))
        return f"{name}.out"

    def relu(name, x):
        nodes.append(helper.make_node("Relu", [x], [f"{name}.out"], name=name))
        return f"{name}.out"

    h = relu("relu1", conv("conv1", "input", 3, 16))
    if lrn:
        nodes.append(helper.make_node("LRN", [h], ["lrn.out"], name="lrn", size=3, alpha=1e-4, beta=0.75, bias=1.0))
        h = "lrn.out"
    h = relu("relu2", conv("conv2", h, 16, 32, stride=2))
    r = relu("relu3", conv("conv3", h, 32, 32))
    r = conv("conv4", r, 32, 32)
    nodes.append(helper.make_node("Add", [h, r], ["add.out"], name="add"))
    h = relu("relu4", "add.out")
    nodes.append(helper.make_node("MaxPool", [h], ["pool.out"], name="pool", kernel_shape=[2, 2], strides=[2, 2]))
    h = relu("relu5", conv("conv5", "pool.out", 32, 64))
    nodes.append(helper.make_node("GlobalAveragePool", [h], ["gap.out"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap.out"], ["flat.out"], name="flatten"))
    w = rng.normal(0, math.sqrt(2.0 / 64), (64, 10)).astype(np.float32)
    inits.append(numpy_helper.from_array(w, "fc.w"))
    inits.append(numpy_helper.from_array(np.zeros(10, np.float32), "fc.b"))
    nodes.append(helper.make_node("Gemm", ["flat.out", "fc.w", "fc.b"], ["logits"], name="fc"))
    graph = helper.make_graph(
        nodes, "tiny_cnn_lrn" if lrn else "tiny_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        inits,
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def build(out: Path, lrn: bool = False) -> Path:
    path = out.with_name(f"{out.name}.onnx")
    if not path.is_file():
        onnx.save(model(lrn=lrn), str(path))
    return path
