"""A small vision-transformer encoder built node by node with onnx.helper, each attention head its own branch.

3x224x224 in (ViT-Tiny's shape, fewer blocks); a 16x16 stride-16 patch embedding (196 tokens of ``dim``), a
learned position embedding, ``blocks`` pre-norm encoder blocks and a mean-pooled linear head (10 logits). In each
block every head has its own query/key/value projections (MatMul + bias), its scores ``q k^T`` (the 1/sqrt(d)
scale folded into the query weights), a softmax and ``p v``; the heads meet in one Concat before the output
projection. So the heads are parallel branches of the graph (Parallax's Table 7), and in the int8 model each head
mixes ops the Edge TPU maps (FULLY_CONNECTED, SOFTMAX) with BATCH_MATMUL, which it does not (two activation
operands): with multiple subgraphs allowed, a head is Edge TPU regions and CPU ops in turn. LayerNorm is written
out (ReduceMean, Sub, Mul, Sqrt, Div), the feed-forward is MatMul-ReLU-MatMul, weights are seeded.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgeplan.zoo.onnx_build import finish, save_once

PATCH = 16
SIZE = 224


def model(dim: int = 192, heads: int = 4, blocks: int = 4, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    tokens = (SIZE // PATCH) ** 2
    head_dim = dim // heads
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(name: str, a: np.ndarray, dtype=np.float32) -> str:
        inits.append(numpy_helper.from_array(np.asarray(a, dtype=dtype), name))
        return name

    def node(op: str, inputs: list[str], name: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def linear(name: str, x: str, cin: int, cout: int, scale: float = 1.0) -> str:
        w = const(f"{name}.w", rng.normal(0, scale * math.sqrt(1.0 / cin), (cin, cout)))
        b = const(f"{name}.b", rng.normal(0, 0.02, (cout,)))
        return node("Add", [node("MatMul", [x, w], f"{name}.matmul"), b], f"{name}.out")

    def layer_norm(name: str, x: str) -> str:
        mean = node("ReduceMean", [x], f"{name}.mean", axes=[-1], keepdims=1)
        d = node("Sub", [x, mean], f"{name}.centred")
        var = node("ReduceMean", [node("Mul", [d, d], f"{name}.square")], f"{name}.var", axes=[-1], keepdims=1)
        std = node("Sqrt", [node("Add", [var, const(f"{name}.eps", [1e-5])], f"{name}.var_eps")], f"{name}.std")
        y = node("Div", [d, std], f"{name}.normed")
        gamma = const(f"{name}.gamma", 1 + rng.normal(0, 0.05, (dim,)))
        return node("Add", [node("Mul", [y, gamma], f"{name}.scaled"), const(f"{name}.beta",
                                                                            rng.normal(0, 0.02, (dim,)))],
                    f"{name}.out")

    def attention(name: str, x: str) -> str:
        outs = []
        for h in range(heads):
            p = f"{name}.head{h}"
            q = linear(f"{p}.q", x, dim, head_dim, scale=1 / math.sqrt(head_dim))
            k = linear(f"{p}.k", x, dim, head_dim)
            v = linear(f"{p}.v", x, dim, head_dim)
            scores = node("MatMul", [q, node("Transpose", [k], f"{p}.kT", perm=[0, 2, 1])], f"{p}.scores")
            probs = node("Softmax", [scores], f"{p}.softmax", axis=-1)
            outs.append(node("MatMul", [probs, v], f"{p}.context"))
        return linear(f"{name}.proj", node("Concat", outs, f"{name}.concat", axis=-1), dim, dim)

    w = const("patch.w", rng.normal(0, math.sqrt(2.0 / (3 * PATCH * PATCH)), (dim, 3, PATCH, PATCH)))
    x = node("Conv", ["input", w, const("patch.b", rng.normal(0, 0.02, (dim,)))], "patch.out",
             kernel_shape=[PATCH, PATCH], strides=[PATCH, PATCH])
    x = node("Reshape", [x, const("patch.shape", [1, dim, tokens], np.int64)], "patch.flat")
    x = node("Transpose", [x], "tokens", perm=[0, 2, 1])
    x = node("Add", [x, const("pos", rng.normal(0, 0.02, (1, tokens, dim)))], "tokens.pos")
    for b in range(blocks):
        p = f"block{b}"
        x = node("Add", [x, attention(f"{p}.attn", layer_norm(f"{p}.ln1", x))], f"{p}.res1")
        ffn = linear(f"{p}.fc1", layer_norm(f"{p}.ln2", x), dim, 2 * dim, scale=math.sqrt(2.0))
        ffn = linear(f"{p}.fc2", node("Relu", [ffn], f"{p}.fc1.relu"), 2 * dim, dim)
        x = node("Add", [x, ffn], f"{p}.res2")
    pooled = node("ReduceMean", [layer_norm("final_ln", x)], "pool", axes=[1], keepdims=0)
    logits = linear("logits", pooled, dim, 10)
    graph = helper.make_graph(
        nodes, f"vit_encoder_{dim}x{heads}x{blocks}",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
        [helper.make_tensor_value_info(logits, TensorProto.FLOAT, [1, 10])],
        inits,
    )
    return finish(graph)


def build(out: Path, dim: int = 192, heads: int = 4, blocks: int = 4) -> Path:
    return save_once(out, lambda: model(dim, heads, blocks))
