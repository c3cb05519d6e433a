"""The plan of a large model's int8 conversion in pieces: a chain of sub-graphs, each holding at most a budget of
float parameter and activation bytes, converted one at a time so that the converter's memory follows the piece,
not the model. A model goes in pieces when its float parameters alone pass the budget; its activations count in
the size of a piece because the converter's memory follows them too (``node_activation_bytes``): by parameters
alone, ResNet152V2 at 299 made a first piece of 126 MB of parameters and 452 MB of activations, whose conversion
held 8.2 times the model's parameter bytes.

The whole-model conversion (onnx2tf, then the TFLite quantizer) holds 10-13 copies of the float weights at its peak
(VGG16, 553 MB: 7.0 GB in onnx2tf, 7.4 GB in the quantizer, measured). A piece is the run of nodes between two
single-tensor cuts (``graph/cuts``), so the chain of pieces computes the model and each boundary is one tensor;
the pieces are grown greedily along the chain up to the budget. A run between two cuts that alone exceeds the
budget and is one fully-connected layer (MatMul/Gemm with a constant weight, then per-channel bias and activation
ops) is split along its output channels into parts, converted separately and merged back into one int8 op
(``quantize/stitch``); any other over-budget run is converted whole and flagged (``Piece.over_budget``).

A cut is only taken where the int8 model would also have the tensor: not before an activation (the converter fuses
it into whatever makes the tensor), a batch normalization, or a layout op onnx2tf rewrites together with its
producer (Transpose, Reshape, ...), nor after a Transpose, Squeeze or Unsqueeze (rewritten with its consumer: a cut
after ResNet50V2's Squeeze gave the int8 model a RESHAPE the whole conversion has not); and not before an
element-wise op with a constant operand (a bias Add, a batch-norm Mul) when the tensor comes from a convolution or
fully-connected layer, directly or through such ops: the converter folds those constants into its weights. The
same op after anything else stays an op of its own: a ResNetV2 block's output (a residual Add) feeds the next
block's batch-norm Mul, and refusing every Mul after any producer left ResNet152V2's 36 conv4 blocks one 162 MB
piece, over the 128 MiB budget. At such a boundary the int8 models differ in one scale, the known difference of
``quantize/piecewise``: TFLite's calibrator logs an op's inputs after it ran, so the whole model's calibration
records the input an ADD overwrote in place with the sum's range, a piece (which ends at the ADD) the input's own
(ResNet50V2, 24 MiB pieces: three such convolution outputs, the same ops, logits within 4 int8 steps of the whole
conversion's, cosine to the float model 0.98552 vs 0.98548 over 16 samples).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from edgeplan.graph.cuts import single_tensor_cuts
from edgeplan.graph.model import GraphView

# Consumers a cut must not feed, whatever makes the tensor: the converter fuses them into the op that makes it, or
# onnx2tf rewrites them with it (a piece boundary would keep them apart and change the int8 model).
NOT_AFTER_CUT = frozenset({
    "Relu", "Clip", "LeakyRelu", "PRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish",
    "BatchNormalization", "Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
})
# Producers a cut must not follow: onnx2tf rewrites them with their consumer (a Flatten before a fully-connected
# layer stays a RESHAPE of its own: VGG's and zoo:wide_fc's first dense layer is split after it).
NOT_BEFORE_CUT = frozenset({"Transpose", "Squeeze", "Unsqueeze"})
# Element-wise ops that, with a constant operand, the converter folds into a weighted producer's weights or bias.
FOLDED = frozenset({"Add", "Sub", "Mul", "Div"})
WEIGHTED = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "BatchNormalization"})
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
    activation_bytes: int = 0  # float32 bytes of the tensors its nodes make (batch of one)

    @property
    def cost(self) -> int:
        """What the budget bounds: parameter and activation bytes."""
        return self.float_bytes + self.activation_bytes

    def child(self) -> tuple[int, int]:
        """(parameter bytes, activation bytes) one conversion child of this piece converts: a split node's parts
        go to children of their own."""
        return self.float_bytes // self.parts, self.activation_bytes // self.parts

    def to_json(self) -> dict:
        return {"index": self.index, "start": self.start, "end": self.end, "nodes": len(self.nodes),
                "float_bytes": self.float_bytes, "activation_bytes": self.activation_bytes, "parts": self.parts,
                "over_budget": self.over_budget}


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


def node_activation_bytes(view: GraphView) -> list[int]:
    """Float32 bytes of the tensors each node makes, at the model's batch of one: what the converter's calibration
    holds as it runs a piece (ResNet152V2 at 299: 229 MB of parameters, 542 MB of activations; a piece of 126 MB
    of parameters and 452 MB of activations held 1.98 GB above a TensorFlow child's baseline, one of 62 and 325 MB
    1.04 GB)."""
    return [sum(math.prod(view.shapes.get(o, ())) * 4 for o in n.output if o) for n in view.graph.node]


def cut_allowed(view: GraphView, tensor: str) -> bool:
    """Whether a piece may end at ``tensor`` (see the module docstring)."""
    p = view.producer.get(tensor)
    if p is not None and view.graph.node[p].op_type in NOT_BEFORE_CUT:
        return False
    for j in view.consumers.get(tensor, ()):
        n = view.graph.node[j]
        if n.op_type in NOT_AFTER_CUT:
            return False
        if n.op_type in FOLDED and _constant_operand(view, n) is not None and _from_weights(view, tensor):
            return False
    return True


def _constant_operand(view: GraphView, n) -> int | None:
    """The input position of a two-input node's constant operand (None: both computed)."""
    if len(n.input) != 2:
        return None
    return next((k for k, x in enumerate(n.input) if x in view.initializers), None)


def _from_weights(view: GraphView, tensor: str) -> bool:
    """Whether ``tensor`` is made by a weighted op, directly or through element-wise ops with a constant operand
    (what the converter folds into that op's weights and bias)."""
    while (p := view.producer.get(tensor)) is not None:
        n = view.graph.node[p]
        if n.op_type in WEIGHTED:
            return True
        k = _constant_operand(view, n) if n.op_type in FOLDED else None
        if k is None:
            return False
        tensor = n.input[1 - k]
    return False


def plan(view: GraphView, budget: int) -> list[Piece]:
    """The pieces of the model for a budget: one piece when its float parameters fit, else pieces of at most the
    budget of float parameter and activation bytes each (``node_activation_bytes``)."""
    sizes = node_float_bytes(view)
    acts = node_activation_bytes(view)
    if sum(sizes) <= budget:
        return [Piece(0, None, None, tuple(range(len(sizes))), sum(sizes), activation_bytes=sum(acts))]
    cuts = [c for c in single_tensor_cuts(view) if cut_allowed(view, c.tensor)]
    names = [None, *(c.tensor for c in cuts), None]  # the model's input, the cuts in topological order, its output
    masks = [0, *(view.ancestors[c.node_index] for c in cuts), view.ancestors[view.producer[view.output.name]]]
    runs = []
    for k in range(len(names) - 1):
        bits = masks[k + 1] & ~masks[k]
        runs.append((names[k], names[k + 1], tuple(i for i in range(len(sizes)) if (bits >> i) & 1)))
    pieces: list[Piece] = []
    start, acc, acc_cost = None, [], 0

    def piece(start: str | None, end: str | None, nodes, **kw) -> Piece:
        return Piece(len(pieces), start, end, tuple(nodes), sum(sizes[i] for i in nodes),
                     activation_bytes=sum(acts[i] for i in nodes), **kw)

    def close(end: str | None) -> None:
        nonlocal start, acc, acc_cost
        if acc:
            pieces.append(piece(start, end, acc))
        start, acc, acc_cost = end, [], 0

    for a, b, nodes in runs:
        cost = sum(sizes[i] + acts[i] for i in nodes)
        if acc and acc_cost + cost > budget:
            close(a)
        if cost > budget:  # alone over the budget: split it, or convert it whole
            parts = math.ceil(cost / budget) if splittable(view, nodes, a) else 1
            pieces.append(piece(a, b, nodes, parts=parts, over_budget=parts == 1))
            start = b
            continue
        acc += nodes
        acc_cost += cost
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
