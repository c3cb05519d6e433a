"""The plan of a large model's int8 conversion in pieces: a chain of sub-graphs, each holding at most a budget of
float parameter bytes, converted one at a time so that the converter's memory follows the piece, not the model.

The whole-model conversion (onnx2tf, then the TFLite quantizer) holds 10-13 copies of the float weights at its peak
(VGG16, 553 MB: 7.0 GB in onnx2tf, 7.4 GB in the quantizer, measured). A piece is the run of nodes between two
single-tensor cuts (``graph/cuts``), so the chain of pieces computes the model and each boundary is one tensor;
the pieces are grown greedily along the chain up to the budget. A run between two cuts that alone exceeds the
budget and is one fully-connected layer (MatMul/Gemm with a constant weight, then per-channel bias and activation
ops) is split along its output channels into parts, converted separately and merged back into one int8 op
(``quantize/stitch``); any other over-budget run is converted whole and flagged (``Piece.over_budget``).

A cut is only taken where the int8 model would also have the tensor: not before an op the TFLite converter fuses
into its producer (a bias Add, an activation, a batch-norm Mul), and not before a layout op onnx2tf rewrites
together with its producer (Transpose, Reshape, ...).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from edgeplan.graph.cuts import single_tensor_cuts
from edgeplan.graph.model import GraphView

# Consumers a cut must not feed: the converter fuses them into the op that makes the tensor, or onnx2tf rewrites
# them with it (a piece boundary would keep them apart and change the int8 model).
NOT_AFTER_CUT = frozenset({
    "Add", "Sub", "Mul", "Div", "Relu", "Clip", "LeakyRelu", "PRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish",
    "BatchNormalization", "Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
})
# What may follow the one weighted node of a run that is split into parts: element-wise ops whose constant, if any,
# runs along the output channels (the last axis), so that slicing it with the weight gives the same values.
PART_UNARY = frozenset({"Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish"})
PART_BINARY = frozenset({"Add", "Sub", "Mul", "Div"})


@dataclass(frozen=True)
class Piece:
    index: int
    start: str | None  # the tensor it reads (None: the model's input)
    end: str | None  # the tensor it makes (None: the model's output)
    nodes: tuple[int, ...]  # node indices, in the model's (topological) order
    float_bytes: int  # float32 parameter bytes of its nodes
    parts: int = 1  # > 1: its one weighted node is split along its output channels into this many parts
    over_budget: bool = False  # above the budget and not splittable: converted whole

    def to_json(self) -> dict:
        return {"index": self.index, "start": self.start, "end": self.end, "nodes": len(self.nodes),
                "float_bytes": self.float_bytes, "parts": self.parts, "over_budget": self.over_budget}


def node_float_bytes(view: GraphView) -> list[int]:
    """Float32 bytes of the constants each node reads (what the converter copies), a shared constant counted once,
    at its first reader."""
    seen: set[str] = set()
    out = []
    for n in view.graph.node:
        b = 0
        for x in n.input:
            t = view.initializers.get(x)
            if t is not None and x not in seen:
                seen.add(x)
                b += math.prod(t.dims) * 4
        out.append(b)
    return out


def cut_allowed(view: GraphView, tensor: str) -> bool:
    """Whether a piece may end at ``tensor`` (see the module docstring)."""
    return not any(view.graph.node[j].op_type in NOT_AFTER_CUT for j in view.consumers.get(tensor, ()))


def plan(view: GraphView, budget: int) -> list[Piece]:
    """The pieces of the model for a budget of float parameter bytes: one piece when the model fits."""
    sizes = node_float_bytes(view)
    cuts = [c for c in single_tensor_cuts(view) if cut_allowed(view, c.tensor)]
    names = [None, *(c.tensor for c in cuts), None]  # the model's input, the cuts in topological order, its output
    masks = [0, *(view.ancestors[c.node_index] for c in cuts), view.ancestors[view.producer[view.output.name]]]
    runs = []
    for k in range(len(names) - 1):
        bits = masks[k + 1] & ~masks[k]
        runs.append((names[k], names[k + 1], tuple(i for i in range(len(sizes)) if (bits >> i) & 1)))
    pieces: list[Piece] = []
    start, acc, acc_bytes = None, [], 0

    def close(end: str | None) -> None:
        nonlocal start, acc, acc_bytes
        if acc:
            pieces.append(Piece(len(pieces), start, end, tuple(acc), acc_bytes))
        start, acc, acc_bytes = end, [], 0

    for a, b, nodes in runs:
        size = sum(sizes[i] for i in nodes)
        if acc and acc_bytes + size > budget:
            close(a)
        if size > budget:  # alone over the budget: split it, or convert it whole
            parts = math.ceil(size / budget) if splittable(view, nodes, a) else 1
            pieces.append(Piece(len(pieces), a, b, nodes, size, parts, over_budget=parts == 1))
            start = b
            continue
        acc += nodes
        acc_bytes += size
    close(None)
    return pieces


def splittable(view: GraphView, nodes: tuple[int, ...], start: str | None) -> bool:
    """A run that is one fully-connected layer reading ``start``: a MatMul (or Gemm) with a constant 2-D weight,
    then only per-output-channel element-wise ops in a chain."""
    if not nodes or start is None:
        return False
    g = view.graph
    first = g.node[nodes[0]]
    if first.op_type not in ("MatMul", "Gemm") or list(first.input[:1]) != [start]:
        return False
    w = view.initializers.get(first.input[1]) if len(first.input) > 1 else None
    if w is None or len(w.dims) != 2 or len(view.shape(start)) != 2:
        return False
    channels = view.shape(first.output[0])[-1]
    if first.op_type == "Gemm":
        if any(a.name == "transA" and a.i for a in first.attribute):
            return False
        c = view.initializers.get(first.input[2]) if len(first.input) > 2 and first.input[2] else None
        if len(first.input) > 2 and first.input[2] and (c is None or math.prod(c.dims) not in (1, channels)):
            return False
    prev = first.output[0]
    for i in nodes[1:]:
        n = g.node[i]
        if n.op_type in PART_UNARY and n.input[0] == prev:
            pass
        elif n.op_type in PART_BINARY and prev in n.input and len(n.input) == 2:
            const = view.initializers.get(n.input[1 - list(n.input).index(prev)])
            if const is None or math.prod(const.dims) not in (1, channels) or (
                    math.prod(const.dims) == channels and const.dims[-1] != channels):
                return False
        else:
            return False
        prev = n.output[0]
    return True
