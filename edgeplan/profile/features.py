"""What a segment asks of a device, read from its int8 graph: the emulated Edge TPU's workload and the
latency predictor's features."""
from __future__ import annotations

import math
from collections import Counter

from edgeplan.artifacts import CompileReport
from edgeplan.profile.tpu_model import TpuWorkload
from edgeplan.compile.emulated import DEFAULT_ONCHIP_BYTES, fill_cache
from edgeplan.quantize.tflite_graph import TfliteGraph, itemsize

# Op families the predictor tells apart (one per kernel whose cost per byte differs); everything else is "other".
# Lumped together (ADD with MUL, LOGISTIC with HARD_SWISH, MEAN with the pools), one network's slow kernel priced
# another's fast one (MobileNetV3's hard-swish and EfficientNet's LOGISTIC): held-out EfficientNetB0 39 % off,
# EfficientNetB1 left out 169 %; apart (and with the predictor's additive base), 6 % and 14 % (bench/profiling.py,
# 2026-11-28). AVERAGE_POOL_2D apart from MAX_POOL_2D: timed layer by layer, InceptionV3's layers holding a 3x3
# stride-1 average pool ran 1.06-1.14x faster on 2 threads than on 1 (the int8 average pool does not parallelise
# here), its other layers 1.6-1.8x; its output elements (what it costs by) and window reads are features of their
# own (``avgpool_outputs``, ``avgpool_window``).
FAMILIES = {
    "CONV_2D": "conv", "DEPTHWISE_CONV_2D": "dwconv", "FULLY_CONNECTED": "fc", "TRANSPOSE_CONV": "conv",
    "ADD": "add", "SUB": "add", "MUL": "mul", "LOGISTIC": "logistic", "HARD_SWISH": "hswish", "RELU": "relu",
    "RELU6": "relu", "TANH": "tanh", "AVERAGE_POOL_2D": "avgpool", "MAX_POOL_2D": "maxpool", "MEAN": "mean",
    "CONCATENATION": "concat", "PAD": "pad", "RESHAPE": "reshape", "QUANTIZE": "quant", "DEQUANTIZE": "quant",
    "RSQRT": "rsqrt", "STRIDED_SLICE": "slice", "SLICE": "slice",
}
FAMILY_NAMES = tuple(sorted(set(FAMILIES.values()) | {"other"}))
CONV_KINDS = ("1x1", "kxk", "kx1", "dw")  # pointwise, square kernel, asymmetric (1x7, 7x1), depthwise


def _nbytes(graph: TfliteGraph, ix: int) -> int:
    t = graph.tensors[ix]
    return math.prod(t.shape) * itemsize(t)


def io_bytes(graph: TfliteGraph) -> tuple[int, int]:
    return sum(_nbytes(graph, i) for i in graph.inputs), sum(_nbytes(graph, o) for o in graph.outputs)


def tpu_workload(graph: TfliteGraph, report: CompileReport | None,
                 onchip_bytes: int = DEFAULT_ONCHIP_BYTES) -> TpuWorkload:
    """The ops the compile report puts on the Edge TPU (all of them when ``report`` is None): their MACs (the
    depthwise ones apart), parameter bytes on chip and streamed, the bytes of the activation tensors they
    read or write (each tensor once), and those of ops whose activations (inputs and outputs) exceed the
    on-chip memory, which cross the link (``act_offchip_bytes``)."""
    end = len(graph.ops)
    if report is not None and report.first_unmapped is not None:
        end = int(report.first_unmapped.get("index", end))
    ins, outs = io_bytes(graph)
    if report is None:
        sizes = graph.op_param_bytes[:end]
        cached, _, _ = fill_cache(sizes, onchip_bytes)
        onchip = sum(b for b, c in zip(sizes, cached) if c)
        offchip = sum(sizes) - onchip
    else:
        onchip, offchip = report.onchip_param_bytes, report.offchip_param_bytes
    ops = graph.ops[:end]
    per_op = [(*graph.activations(op), *op.outputs) for op in ops]
    acts = [sum(_nbytes(graph, x) for x in ts) for ts in per_op]
    tensors = set().union(*per_op)  # each written or read once
    return TpuWorkload(macs=sum(graph.op_macs[:end]), onchip_param_bytes=onchip, offchip_param_bytes=offchip,
                       input_bytes=ins, output_bytes=outs, ops=end,
                       activation_bytes=sum(_nbytes(graph, x) for x in tensors),
                       dw_macs=sum(graph.op_macs[op.index] for op in ops if op.name == "DEPTHWISE_CONV_2D"),
                       act_offchip_bytes=sum(a for a in acts if a > onchip_bytes))


def _conv_shape(graph: TfliteGraph, op) -> tuple[int, int, int, int, int] | None:
    """(kh, kw, Cin per output, Cout, output H*W) of a convolution-like op, else None."""
    t = graph.tensors
    if op.name in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        w = t[op.inputs[1]].shape  # conv (Cout, kh, kw, Cin); depthwise (1, kh, kw, Cout)
        out = t[op.outputs[0]].shape
        cin = w[3] if op.name == "CONV_2D" else 1
        return w[1], w[2], cin, out[-1], math.prod(out[1:-1])
    if op.name == "FULLY_CONNECTED":
        w = t[op.inputs[1]].shape
        return 1, 1, w[-1], w[0], 1
    return None


def segment_features(graph: TfliteGraph) -> dict:
    """Graph features of a segment: MACs, op counts and activation bytes by op family, parameter bytes, and
    the MAC-weighted shape of its convolutions (kernel kind, channels, spatial size)."""
    macs: Counter = Counter()
    counts: Counter = Counter()
    act: Counter = Counter()
    shape_sums: Counter = Counter()
    for op in graph.ops:
        fam = FAMILIES.get(op.name, "other")
        m = graph.op_macs[op.index]
        macs[fam] += m
        counts[fam] += 1
        in_bytes = sum(_nbytes(graph, x) for x in graph.activations(op))
        out_bytes = sum(_nbytes(graph, o) for o in op.outputs)
        act[fam] += in_bytes + out_bytes
        if op.name == "AVERAGE_POOL_2D":  # its window's reads: an averaging window of k x k costs k^2 per output
            o = op.builtin_options
            outputs = math.prod(graph.tensors[op.outputs[0]].shape)
            macs["avgpool_window"] += outputs * o.filterHeight * o.filterWidth
            macs["avgpool_outputs"] += outputs
        shape = _conv_shape(graph, op)
        if shape and m:
            kh, kw, cin, cout, hw = shape
            kind = "dw" if op.name == "DEPTHWISE_CONV_2D" else ("1x1" if kh * kw == 1 else ("kxk" if kh == kw else "kx1"))
            macs[f"kind_{kind}"] += m
            shape_sums["log2_cin"] += m * math.log2(max(1, cin))
            shape_sums["log2_cout"] += m * math.log2(max(1, cout))
            shape_sums["log2_hw"] += m * math.log2(max(1, hw))
            shape_sums["log2_in_bytes"] += m * math.log2(max(1, in_bytes))
            shape_sums["log2_out_bytes"] += m * math.log2(max(1, out_bytes))
    ins, outs = io_bytes(graph)
    total = sum(macs[f] for f in FAMILY_NAMES)
    feats = {"macs": int(total), "ops": len(graph.ops), "param_bytes": int(graph.param_bytes()),
             "input_bytes": ins, "output_bytes": outs, "activation_bytes": int(sum(act.values()))}
    for kind in CONV_KINDS:
        feats[f"macs_kind_{kind}"] = int(macs[f"kind_{kind}"])
    feats["avgpool_window"] = int(macs["avgpool_window"])
    feats["avgpool_outputs"] = int(macs["avgpool_outputs"])
    for key in ("log2_cin", "log2_cout", "log2_hw", "log2_in_bytes", "log2_out_bytes"):
        feats[f"wavg_{key}"] = shape_sums[key] / total if total else 0.0
    for fam in FAMILY_NAMES:
        feats[f"macs_{fam}"] = int(macs[fam])
        feats[f"ops_{fam}"] = int(counts[fam])
        feats[f"act_{fam}"] = int(act[fam])
    return feats
