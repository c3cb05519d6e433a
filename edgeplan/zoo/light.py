"""The onnx package's model-zoo graphs, re-weighted so their outputs depend on their inputs."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from edgeplan.graph.evaluate import tensor_values
from edgeplan.graph.ingest import canonicalise


def source_path(name: str) -> Path:
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"


def build(name: str, out: Path, seed: int = 0) -> Path:
    path = out.with_name(f"{out.name}.onnx")
    if path.is_file():
        return path
    model = canonicalise(onnx.load(str(source_path(name))), source=str(source_path(name)))
    model = reweight(_drop_softmax(model), seed)
    tmp = path.with_name(f".{path.name}.tmp")
    onnx.save(model, str(tmp))
    tmp.replace(path)
    return path


def _drop_softmax(model: onnx.ModelProto) -> onnx.ModelProto:
    """Logits as the output: a softmax over random weights saturates and hides differences."""
    g = model.graph
    last = g.node[-1]
    if last.op_type != "Softmax" or last.output[0] != g.output[0].name:
        return model
    logits = last.input[0]
    vi = next(v for v in g.value_info if v.name == logits)
    del g.node[len(g.node) - 1]
    g.output[0].CopyFrom(vi)
    return model


def reweight(model: onnx.ModelProto, seed: int, samples: int = 4) -> onnx.ModelProto:
    """He-normal convolution and dense weights, zero biases, batch-norm statistics from random inputs."""
    rng = np.random.default_rng(seed)
    g = model.graph
    inits = {t.name: t for t in g.initializer}

    def put(name: str, value: np.ndarray) -> None:
        inits[name].CopyFrom(numpy_helper.from_array(value.astype(np.float32), name))

    bns = []
    for n in g.node:
        if n.op_type in ("Conv", "Gemm", "MatMul") and n.input[1] in inits:
            w = numpy_helper.to_array(inits[n.input[1]])
            fan_in = math.prod(w.shape[1:]) if n.op_type == "Conv" else (w.shape[0] if n.op_type == "MatMul" else w.shape[1])
            if n.op_type == "Gemm" and not any(a.name == "transB" and a.i for a in n.attribute):
                fan_in = w.shape[0]
            put(n.input[1], rng.normal(0.0, math.sqrt(2.0 / fan_in), w.shape))
            if len(n.input) > 2 and n.input[2] in inits:
                put(n.input[2], np.zeros(numpy_helper.to_array(inits[n.input[2]]).shape))
        elif n.op_type == "BatchNormalization":
            c = numpy_helper.to_array(inits[n.input[1]]).shape
            put(n.input[1], np.ones(c))
            put(n.input[2], np.zeros(c))
            put(n.input[3], np.zeros(c))
            put(n.input[4], np.ones(c))
            bns.append(n)
    # Batch-norm statistics in topological order, each measured with every earlier one already set, so
    # every layer sees normalised inputs (what training would have given it).
    shape = [d.dim_value for d in g.input[0].type.tensor_type.shape.dim][1:]
    xs = rng.uniform(-1.0, 1.0, (samples, *shape)).astype(np.float32)
    for n in bns:
        mean, var = _bn_input_stats(model, n.input[0], xs)
        put(n.input[3], mean)
        put(n.input[4], var)
    return model


def _bn_input_stats(model: onnx.ModelProto, tensor: str, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = tensor_values(model, [tensor], xs)[tensor].astype(np.float64)  # (N, C, H, W)
    axes = (0, 2, 3) if v.ndim == 4 else (0,)
    return v.mean(axis=axes), v.var(axis=axes) + 1e-5
