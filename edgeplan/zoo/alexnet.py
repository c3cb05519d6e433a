"""AlexNet as torchvision lays it out (one tower, 224x224, 1000 logits), built node by node with seeded
He-normal weights: the chain CNN ADaPS evaluates beside VGG16, which Keras applications does not ship."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgeplan.zoo.onnx_build import finish, save_once

# (name, out channels, kernel, stride, pad), "pool" for a 3x3 stride-2 max pool
LAYERS = [("conv1", 64, 11, 4, 2), "pool", ("conv2", 192, 5, 1, 2), "pool", ("conv3", 384, 3, 1, 1),
          ("conv4", 256, 3, 1, 1), ("conv5", 256, 3, 1, 1), "pool"]


def model(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    x, cin, pools = "input", 3, 0
    for spec in LAYERS:
        if spec == "pool":
            pools += 1
            nodes.append(helper.make_node("MaxPool", [x], [f"pool{pools}.out"], name=f"pool{pools}",
                                          kernel_shape=[3, 3], strides=[2, 2]))
            x = f"pool{pools}.out"
            continue
        name, cout, k, stride, pad = spec
        w = rng.normal(0, math.sqrt(2.0 / (cin * k * k)), (cout, cin, k, k)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"{name}.w"),
                  numpy_helper.from_array(rng.normal(0, 0.05, (cout,)).astype(np.float32), f"{name}.b")]
        nodes.append(helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [f"{name}.conv"], name=name,
                                      kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4))
        nodes.append(helper.make_node("Relu", [f"{name}.conv"], [f"{name}.out"], name=f"{name}.relu"))
        x, cin = f"{name}.out", cout
    nodes.append(helper.make_node("Flatten", [x], ["flat"], name="flatten"))
    x, fan_in = "flat", 256 * 6 * 6
    for i, width in enumerate((4096, 4096, 1000), start=6):
        w = rng.normal(0, math.sqrt(2.0 / fan_in), (fan_in, width)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"fc{i}.w"), numpy_helper.from_array(np.zeros(width, np.float32),
                                                                                 f"fc{i}.b")]
        out = "logits" if width == 1000 else f"fc{i}.out"
        nodes.append(helper.make_node("Gemm", [x, f"fc{i}.w", f"fc{i}.b"], [f"fc{i}.gemm" if width != 1000 else out],
                                      name=f"fc{i}"))
        if width != 1000:
            nodes.append(helper.make_node("Relu", [f"fc{i}.gemm"], [out], name=f"fc{i}.relu"))
        x, fan_in = out, width
    graph = helper.make_graph(nodes, "alexnet", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                               [1, 3, 224, 224])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1000])], inits)
    return finish(graph)


def build(out: Path) -> Path:
    return save_once(out, model)
