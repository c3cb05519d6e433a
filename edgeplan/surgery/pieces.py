"""One piece of a model's int8 conversion (``quantize/pieces``) as an ONNX model: its nodes, the constants they read,
the tensor it starts from as its input and the tensor it ends at as its output; a part of a split piece keeps the
part's slice of the output channels of the weight and of every per-channel constant after it."""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgeplan.graph.model import GraphView
from edgeplan.quantize.pieces import Piece


def part_channels(channels: int, parts: int, part: int) -> tuple[int, int]:
    """The output channels ``[lo, hi)`` of part ``part`` of ``parts`` (even shares, the first ones a channel more)."""
    lo = channels * part // parts
    return lo, channels * (part + 1) // parts


def piece_model(view: GraphView, piece: Piece, part: int = 0) -> onnx.ModelProto:
    g = view.graph
    nodes = [g.node[i] for i in piece.nodes]
    start = piece.start or view.input.name
    end = piece.end or view.output.name
    used = {x for n in nodes for x in n.input if x}
    inits = [t for t in g.initializer if t.name in used]
    inner = {o for n in nodes for o in n.output}
    value_info = [vi for vi in g.value_info if vi.name in inner and vi.name != end]
    if piece.parts > 1:
        inits, value_info = _part(view, piece, part, inits, value_info)
        end_shape = (*view.shape(end)[:-1], _part_width(view, piece, part))
    else:
        end_shape = view.shape(end)
    graph = helper.make_graph(
        nodes, f"{g.name}_piece{piece.index}" + (f"_part{part}" if piece.parts > 1 else ""),
        [_info(view, start, view.shape(start))], [_info(view, end, end_shape)], initializer=inits,
        value_info=value_info)
    model = helper.make_model(graph, opset_imports=list(view.model.opset_import))
    model.ir_version = view.model.ir_version
    return model


def _info(view: GraphView, name: str, shape) -> onnx.ValueInfoProto:
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(view.dtypes.get(name, "float32")))
    return helper.make_tensor_value_info(name, elem, list(shape))


def _part_width(view: GraphView, piece: Piece, part: int) -> int:
    channels = view.shape(view.graph.node[piece.nodes[0]].output[0])[-1]
    lo, hi = part_channels(channels, piece.parts, part)
    return hi - lo


def _part(view: GraphView, piece: Piece, part: int, inits, value_info):
    """The split layer's constants and inner shapes cut to the part's output channels."""
    g = view.graph
    first = g.node[piece.nodes[0]]
    channels = view.shape(first.output[0])[-1]
    lo, hi = part_channels(channels, piece.parts, part)
    trans_b = first.op_type == "Gemm" and any(a.name == "transB" and a.i for a in first.attribute)
    weight = first.input[1]
    out = []
    for t in inits:
        a = numpy_helper.to_array(t)
        if t.name == weight:
            a = a[lo:hi] if trans_b else a[:, lo:hi]
        elif math.prod(a.shape) == channels:  # a bias or per-channel scale (its last axis is the channels)
            a = a[..., lo:hi]
        out.append(numpy_helper.from_array(np.ascontiguousarray(a), t.name))
    sliced = []
    for vi in value_info:
        vi = onnx.ValueInfoProto.FromString(vi.SerializeToString())
        dims = vi.type.tensor_type.shape.dim
        if dims and dims[-1].dim_value == channels:
            dims[-1].dim_value = hi - lo
        sliced.append(vi)
    return out, sliced
