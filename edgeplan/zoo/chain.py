"""A small chain CNN for spatial tiles (3x45x45 in, 10 logits): odd heights, stride-2 convolutions with SAME
and with explicit pads, a dilated 5x5, max and average pooling — the windows whose padding a tile must track.
Built node by node with seeded He-normal weights."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgeplan.zoo.onnx_build import finish, save_once

# (name, out channels, kernel, stride, dilation, pads or "SAME"); ("maxpool"|"avgpool", kernel, stride, pad)
LAYERS = [("conv1", 8, 3, 1, 1, 1), ("conv2", 16, 3, 2, 1, "SAME"), ("conv3", 16, 5, 1, 2, 4),
          ("maxpool", 3, 2, 1), ("conv4", 24, 3, 2, 1, 1), ("avgpool", 3, 1, 1), ("conv5", 32, 3, 1, 1, "SAME")]


def model(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    x, cin = "input", 3
    for i, spec in enumerate(LAYERS):
        if spec[0] in ("maxpool", "avgpool"):
            kind, k, stride, pad = spec
            op = "MaxPool" if kind == "maxpool" else "AveragePool"
            extra = {} if op == "MaxPool" else {"count_include_pad": 0}
            nodes.append(helper.make_node(op, [x], [f"{kind}{i}.out"], name=f"{kind}{i}", kernel_shape=[k, k],
                                          strides=[stride, stride], pads=[pad] * 4, **extra))
            x = f"{kind}{i}.out"
            continue
        name, cout, k, stride, dilation, pads = spec
        w = rng.normal(0, math.sqrt(2.0 / (cin * k * k)), (cout, cin, k, k)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"{name}.w"),
                  numpy_helper.from_array(rng.normal(0, 0.05, (cout,)).astype(np.float32), f"{name}.b")]
        padding = {"auto_pad": "SAME_UPPER"} if pads == "SAME" else {"pads": [pads] * 4}
        nodes.append(helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [f"{name}.conv"], name=name,
                                      kernel_shape=[k, k], strides=[stride, stride], dilations=[dilation] * 2,
                                      **padding))
        nodes.append(helper.make_node("Relu", [f"{name}.conv"], [f"{name}.out"], name=f"{name}.relu"))
        x, cin = f"{name}.out", cout
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap.out"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap.out"], ["flat.out"], name="flatten"))
    w = rng.normal(0, math.sqrt(2.0 / cin), (cin, 10)).astype(np.float32)
    inits += [numpy_helper.from_array(w, "fc.w"), numpy_helper.from_array(np.zeros(10, np.float32), "fc.b")]
    nodes.append(helper.make_node("Gemm", ["flat.out", "fc.w", "fc.b"], ["logits"], name="fc"))
    graph = helper.make_graph(nodes, "spatial_chain",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 45, 45])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], inits)
    return finish(graph)


def build(out: Path) -> Path:
    return save_once(out, model)
