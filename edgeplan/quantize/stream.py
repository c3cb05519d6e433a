"""Streaming segments (FlashMem §4.3, adapted to the CPU): the int8 model as layers, cut into the
segments one invoke each runs, with any op above a size split along its output channels.

A *layer* is one weighted op (convolution, fully connected, ...) with the weight-free ops after it, in the
model's execution order; its weight is the constant bytes of its ops. A *segment* is a run of consecutive
layers: a TFLite model of those ops whose inputs are every activation it reads from before it (or the
model's input) and whose outputs are every activation it produces that later ops (or the model's output)
read — so a boundary may carry several tensors (a residual branch). Segments are cut from the one int8
model, so chaining them gives the model's own bits.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
from tensorflow.lite.python import schema_py_generated as schema

from edgeplan.errors import CutError
from edgeplan.quantize.cut import _submodel
from edgeplan.quantize.tflite_graph import TfliteGraph
from edgeplan.runtime.stream import run_chain  # noqa: F401  (the pipeline checks the chain the device runs)

WEIGHTED = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV", "BATCH_MATMUL", "CONV_3D")
SPLITTABLE = ("CONV_2D", "FULLY_CONNECTED")  # output channel = weight dim 0, output's last dim


@dataclass(frozen=True)
class StreamLayer:
    index: int
    first_op: int
    last_op: int  # inclusive
    name: str  # the output tensor of its weighted op (of its first op for a leading weight-free run)
    op: str
    weight_bytes: int


def layers(graph: TfliteGraph) -> list[StreamLayer]:
    """The model's layers in execution order (TFLite stores operators in it)."""
    starts = [0] + [op.index for op in graph.ops[1:] if op.name in WEIGHTED and graph.op_param_bytes[op.index]]
    out = []
    for k, first in enumerate(starts):
        last = (starts[k + 1] if k + 1 < len(starts) else len(graph.ops)) - 1
        lead = graph.ops[first]
        out.append(StreamLayer(k, first, last, graph.tensors[lead.outputs[0]].name, lead.name,
                               sum(graph.op_param_bytes[i] for i in range(first, last + 1))))
    return out


def boundary(graph: TfliteGraph, first_op: int, last_op: int) -> tuple[list[int], list[int]]:
    """(inputs, outputs) of the op range [first_op, last_op]: tensor indices, ascending."""
    return ops_boundary(graph, range(first_op, last_op + 1))


def ops_boundary(graph: TfliteGraph, ops) -> tuple[list[int], list[int]]:
    """(inputs, outputs) of a set of ops (a range, or a Parallax branch): the activations they read and do not
    make, and those they make that another op or the model's output reads; tensor indices, ascending."""
    inside = set(ops)
    produced = {o for i in inside for o in graph.ops[i].outputs}
    inputs = sorted({x for i in inside for x in graph.activations(graph.ops[i]) if x not in produced})
    elsewhere = {x for op in graph.ops if op.index not in inside for x in graph.activations(op)}
    outputs = sorted(produced & (elsewhere | set(graph.outputs)))
    return inputs, outputs


def cut_ops(graph: TfliteGraph, ops: list[int], tag: str, outputs: list[int] | None = None) -> bytes:
    """The ops (in the model's order) as a TFLite model whose inputs are the activations they read and do not
    make and whose outputs are ``outputs`` (default: every tensor they make that another op reads)."""
    inputs, boundary_outputs = ops_boundary(graph, ops)
    return _submodel(graph.model, sorted(ops), inputs, boundary_outputs if outputs is None else list(outputs), tag)


def cut_range(graph: TfliteGraph, first_op: int, last_op: int, tag: str) -> bytes:
    """The segment of ops [first_op, last_op] as a TFLite model (every boundary tensor keeps its name and
    quantization)."""
    if not 0 <= first_op <= last_op < len(graph.ops):
        raise CutError(f"op range {first_op}..{last_op} is outside the model's {len(graph.ops)} ops")
    inputs, outputs = boundary(graph, first_op, last_op)
    return _submodel(graph.model, list(range(first_op, last_op + 1)), inputs, outputs, tag)


def segments(graph: TfliteGraph, groups: list[tuple[int, int]]) -> list[bytes]:
    """Cut consecutive layer groups ``[(first_layer, last_layer), ...]`` covering every layer, in order."""
    ls = layers(graph)
    if not groups or groups[0][0] != 0 or groups[-1][1] != len(ls) - 1 or any(
            b[0] != a[1] + 1 or b[0] > b[1] for a, b in zip(groups, groups[1:])):
        raise CutError(f"segment groups {groups} do not cover the {len(ls)} layers in order")
    return [cut_range(graph, ls[a].first_op, ls[b].last_op, f"s{k}") for k, (a, b) in enumerate(groups)]


def split_large_ops(data: bytes, max_bytes: int) -> bytes:
    """Split every CONV_2D / FULLY_CONNECTED whose weight exceeds ``max_bytes`` along its output channels
    into k ops of at most ``max_bytes`` each plus one CONCATENATION (per-channel scales split with them; the
    parts keep the output's quantization, so the concatenation copies bytes). Returns the model unchanged
    when nothing is that large."""
    graph = TfliteGraph(data)
    big = [op for op in graph.ops if op.name in SPLITTABLE and graph.tensors[op.inputs[1]].nbytes > max_bytes]
    if not big:
        return bytes(data)
    m = copy.deepcopy(graph.model)
    sg = m.subgraphs[0]
    concat = _opcode(m, schema.BuiltinOperator.CONCATENATION)
    new_ops = []
    for i, op in enumerate(sg.operators):
        if i not in {b.index for b in big}:
            new_ops.append(op)
            continue
        new_ops += _split(m, graph, op, graph.tensors[op.inputs[1]].nbytes, max_bytes, concat)
    sg.operators = new_ops
    # rebuild tensor and buffer tables so the unsplit weights are gone
    return _submodel(m, list(range(len(new_ops))), [int(x) for x in sg.inputs], [int(x) for x in sg.outputs],
                     "split")


def _opcode(m: schema.ModelT, builtin: int) -> int:
    for k, code in enumerate(m.operatorCodes):
        if max(code.builtinCode, code.deprecatedBuiltinCode) == builtin:
            return k
    code = schema.OperatorCodeT()
    code.builtinCode = builtin
    code.deprecatedBuiltinCode = min(builtin, 127)
    code.version = 1
    m.operatorCodes.append(code)
    return len(m.operatorCodes) - 1


def _split(m: schema.ModelT, graph: TfliteGraph, op: schema.OperatorT, nbytes: int, max_bytes: int,
           concat: int) -> list[schema.OperatorT]:
    sg = m.subgraphs[0]
    w_ix, b_ix, out_ix = int(op.inputs[1]), int(op.inputs[2]) if len(op.inputs) > 2 else -1, int(op.outputs[0])
    channels = graph.tensors[w_ix].shape[0]
    k = min(channels, -(-nbytes // max_bytes))
    edges = np.linspace(0, channels, k + 1).round().astype(int)
    parts, outs = [], []
    for j in range(k):
        lo, hi = int(edges[j]), int(edges[j + 1])
        piece = copy.deepcopy(op)
        piece.inputs = list(op.inputs)
        piece.inputs[1] = _slice_constant(m, graph, w_ix, lo, hi, f"_part{j}")
        if b_ix >= 0:
            piece.inputs[2] = _slice_constant(m, graph, b_ix, lo, hi, f"_part{j}")
        t = copy.deepcopy(sg.tensors[out_ix])
        t.shape = list(sg.tensors[out_ix].shape[:-1]) + [hi - lo]
        if t.shapeSignature is not None:
            t.shapeSignature = list(t.shapeSignature[:-1]) + [hi - lo]
        t.name = _name(sg.tensors[out_ix].name, f"_part{j}")
        sg.tensors.append(t)
        piece.outputs = [len(sg.tensors) - 1]
        outs.append(len(sg.tensors) - 1)
        parts.append(piece)
    join = schema.OperatorT()
    join.opcodeIndex = concat
    join.inputs = outs
    join.outputs = [out_ix]
    join.builtinOptionsType = schema.BuiltinOptions.ConcatenationOptions
    join.builtinOptions = schema.ConcatenationOptionsT()
    join.builtinOptions.axis = len(sg.tensors[out_ix].shape) - 1
    return parts + [join]


def _name(name, suffix: str) -> str:
    return (name.decode() if isinstance(name, bytes) else str(name)) + suffix


def _slice_constant(m: schema.ModelT, graph: TfliteGraph, ix: int, lo: int, hi: int, suffix: str) -> int:
    """A new constant tensor holding rows [lo, hi) of constant ``ix`` (dim 0 = output channel)."""
    sg = m.subgraphs[0]
    value = graph.constant_value(ix)[lo:hi]
    t = copy.deepcopy(sg.tensors[ix])
    t.shape = list(value.shape)
    t.shapeSignature = None
    t.name = _name(t.name, suffix)
    q = t.quantization
    if q is not None and q.scale is not None and len(q.scale) > 1:  # per-channel: its own channels' scales
        if q.quantizedDimension not in (0, None):
            raise CutError(f"{graph.tensors[ix].name}: per-channel quantization on dimension "
                           f"{q.quantizedDimension}, not the output channel; cannot split it")
        q.scale = list(q.scale[lo:hi])
        q.zeroPoint = list(q.zeroPoint[lo:hi])
    buf = schema.BufferT()
    buf.data = np.frombuffer(value.tobytes(), dtype=np.uint8).copy()
    m.buffers.append(buf)
    t.buffer = len(m.buffers) - 1
    sg.tensors.append(t)
    return len(sg.tensors) - 1
