"""The Edge TPU's supported operations and their documented limitations, one rule per op.

Source: the Coral "TensorFlow models on the Edge TPU" supported-operations table (reproduced in vendor
docs for Edge TPU SoCs). A rule returns ``None`` when the op maps, or the reason it does not. Every
op must also be fully int8/uint8 quantized with static shapes, and tensors may have at most three
dimensions larger than one (checked for all ops before the op's own rule).
"""
from __future__ import annotations

from typing import Callable

from edgeplan.quantize.tflite_graph import TfliteGraph, TfliteOp

NOT_SUPPORTED = "Operation not supported"
UNSUPPORTED_TYPE = "Operation is working on an unsupported data type"
LIMITATION = "Operation is otherwise supported, but not mapped due to some unspecified limitation"
MORE_THAN_ONE_SUBGRAPH = "More than one subgraph is not supported"
MAPPED = "Mapped to Edge TPU"

SHORT = {  # for tables that have no room for the compiler's sentences
    NOT_SUPPORTED: "unsupported op",
    UNSUPPORTED_TYPE: "unsupported data type",
    LIMITATION: "limitation",
    MORE_THAN_ONE_SUBGRAPH: "after the TPU part",
    MAPPED: "mapped",
}

Rule = Callable[[TfliteGraph, TfliteOp], str | None]


def _ok(graph: TfliteGraph, op: TfliteOp) -> str | None:
    return None


def _no_fused_activation(graph: TfliteGraph, op: TfliteOp) -> str | None:
    act = getattr(op.builtin_options, "fusedActivationFunction", 0) or 0
    return "fused activation function is not supported on this op" if act else None


def _same_dilation(graph: TfliteGraph, op: TfliteOp) -> str | None:
    o = op.builtin_options
    if o is not None and getattr(o, "dilationHFactor", 1) != getattr(o, "dilationWFactor", 1):
        return "dilation differs in x and y"
    return None


def _pad(graph: TfliteGraph, op: TfliteOp) -> str | None:
    """No padding in the batch dimension."""
    pads = graph.constant_value(op.inputs[1])
    if pads is not None and pads.ndim == 2 and pads.shape[0] >= 1 and pads[0].any():
        return "padding in the batch dimension"
    return None


def _axes(graph: TfliteGraph, op: TfliteOp):
    axes = graph.constant_value(op.inputs[1])
    rank = len(graph.tensors[op.inputs[0]].shape)
    return None if axes is None else {int(a) % rank for a in axes.ravel()}, rank


def _reduction(graph: TfliteGraph, op: TfliteOp) -> str | None:
    """Cannot operate on the batch dimension."""
    axes, _ = _axes(graph, op)
    return "reduction over the batch dimension" if axes and 0 in axes else None


def _mean(graph: TfliteGraph, op: TfliteOp) -> str | None:
    """No reduction in the batch dimension; a z-reduction needs a z-dimension that is a multiple of 4."""
    axes, rank = _axes(graph, op)
    if not axes:
        return None
    if 0 in axes:
        return "reduction over the batch dimension"
    z = graph.tensors[op.inputs[0]].shape[-1]
    if rank - 1 in axes and z % 4:
        return f"z-reduction over {z} channels (not a multiple of 4)"
    return None


def _pack(graph: TfliteGraph, op: TfliteOp) -> str | None:
    """No packing in the batch dimension."""
    return "packing in the batch dimension" if getattr(op.builtin_options, "axis", 1) == 0 else None


def _fully_connected(graph: TfliteGraph, op: TfliteOp) -> str | None:
    fmt = getattr(op.builtin_options, "weightsFormat", 0) or 0
    return "only the default weights format is supported" if fmt else None


RULES: dict[str, Rule] = {
    "ADD": _ok,
    "AVERAGE_POOL_2D": _no_fused_activation,
    "CONCATENATION": _no_fused_activation,
    "CONV_2D": _same_dilation,
    "DEPTHWISE_CONV_2D": _same_dilation,
    "EXPAND_DIMS": _ok,
    "FULLY_CONNECTED": _fully_connected,
    "HARD_SWISH": _ok,
    "L2_NORMALIZATION": _ok,
    "LOGISTIC": _ok,
    "LSTM": _ok,
    "MAXIMUM": _ok,
    "MAX_POOL_2D": _no_fused_activation,
    "MEAN": _mean,
    "MINIMUM": _ok,
    "MUL": _ok,
    "PACK": _pack,
    "PAD": _pad,
    "PADV2": _pad,
    "PRELU": _ok,
    "QUANTIZE": _ok,
    "REDUCE_MAX": _reduction,
    "REDUCE_MIN": _reduction,
    "RELU": _ok,
    "RELU6": _ok,
    "RELU_N1_TO_1": _ok,
    "RESHAPE": _ok,
    "RESIZE_BILINEAR": _ok,
    "RESIZE_NEAREST_NEIGHBOR": _ok,
    "RSQRT": _ok,
    "SLICE": _ok,
    "SOFTMAX": _ok,
    "SPACE_TO_DEPTH": _ok,
    "SPLIT": _ok,
    "SQUARED_DIFFERENCE": _ok,
    "SQUEEZE": _ok,
    "STRIDED_SLICE": _ok,
    "SUB": _ok,
    "SUM": _reduction,
    "TANH": _ok,
    "TRANSPOSE": _ok,
    "TRANSPOSE_CONV": _ok,
}

_QUANTIZED = {"INT8", "UINT8"}


def check(graph: TfliteGraph, op: TfliteOp) -> tuple[str, str | None]:
    """``(status, reason)`` of one op taken alone: MAPPED, or the compiler's status and our reason."""
    for ix in list(op.inputs) + list(op.outputs):
        if ix < 0:
            continue
        t = graph.tensors[ix]
        if t.constant and t.dtype == "INT32":  # biases and shape operands
            continue
        if t.dtype not in _QUANTIZED:
            return UNSUPPORTED_TYPE, f"tensor {t.name!r} is {t.dtype}, not int8{_island(graph, op)}"
        if not t.constant and sum(1 for d in t.shape if d > 1) > 3:
            return LIMITATION, f"tensor {t.name!r} has more than three dimensions larger than one"
    rule = RULES.get(op.name)
    if rule is None:
        return NOT_SUPPORTED, f"{op.name} is not in the Edge TPU's supported operations"
    reason = rule(graph, op)
    return (LIMITATION, reason) if reason else (MAPPED, None)


def _island(graph: TfliteGraph, op: TfliteOp) -> str:
    """For a DEQUANTIZE that opens a float island: the float op(s) it feeds, which have no int8 kernel."""
    if op.name != "DEQUANTIZE":
        return ""
    out = op.outputs[0]
    fed = sorted({o.name for o in graph.ops if out in o.inputs})
    return f" (float island: {', '.join(fed)} has no int8 kernel)" if fed else ""
