"""Per-op cost rules for ONNX nodes: multiply-accumulates (MACs). One rule per op, read from one table.

A rule takes the node and a ``shape(name)`` lookup and returns the node's MACs for batch 1 as the graph
states it. Ops without a rule cost 0 MACs (element-wise ops, pooling, reshapes: memory-bound work the
planners account for through bytes, not MACs).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import onnx

ShapeOf = Callable[[str], tuple[int, ...]]


def attr(node: onnx.NodeProto, name: str, default=None):
    """The value of the node's attribute ``name``, or ``default``."""
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _conv(node: onnx.NodeProto, shape: ShapeOf) -> int:
    out = shape(node.output[0])
    w = shape(node.input[1])  # (Cout, Cin/group, kh, kw)
    return math.prod(out) * math.prod(w[1:])


def _conv_transpose(node: onnx.NodeProto, shape: ShapeOf) -> int:
    x = shape(node.input[0])
    w = shape(node.input[1])  # (Cin, Cout/group, kh, kw)
    return math.prod(x) * math.prod(w[1:])


def _gemm(node: onnx.NodeProto, shape: ShapeOf) -> int:
    a = shape(node.input[0])
    k = a[0] if attr(node, "transA", 0) else a[-1]
    return math.prod(shape(node.output[0])) * k


def _matmul(node: onnx.NodeProto, shape: ShapeOf) -> int:
    return math.prod(shape(node.output[0])) * shape(node.input[0])[-1]


MAC_RULES: dict[str, Callable[[onnx.NodeProto, ShapeOf], int]] = {
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "Gemm": _gemm,
    "MatMul": _matmul,
}


def node_macs(node: onnx.NodeProto, shape: ShapeOf) -> int:
    rule = MAC_RULES.get(node.op_type)
    return int(rule(node, shape)) if rule else 0
