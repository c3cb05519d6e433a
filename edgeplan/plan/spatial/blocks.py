"""The partitionable region of a model: its layers from the input along one path, as ADaPS partitions them.

A layer is one Type 1 op (Table 2) and the single-input Type 2 ops after it (a leading Type 2 op is a layer
of its own with the identity window). A constant-mode ``Pad`` of the spatial axes that only a Type 1 op reads
(Keras ``ZeroPadding2D``, or the pads canonicalisation moves out of a pooling op) joins that op's layer: its
rows are padding of the op's window. The region ends — everything after runs on one device once the
partitions are gathered — at the first Type 3 op, at an op the table does not know, and at the first tensor read
by more than one op or op reading two computed tensors, where ``paths`` (path analysis, §4.2: single-entry,
single-exit sub-blocks) goes on. ``Region.reason`` says which, naming the op. The float tiles
(``surgery/spatial_float``) are made on this chain region.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import onnx

from edgeplan.errors import PlanError
from edgeplan.graph.costs import attr
from edgeplan.graph.model import GraphView
from edgeplan.plan.spatial.cost import Layer
from edgeplan.plan.spatial.intervals import Window
from edgeplan.plan.spatial.ops import TYPE1, TYPE2, onnx_type

AXES = {"H": 2, "W": 3}  # NCHW


@dataclass(frozen=True)
class Region:
    dim: str
    layers: tuple[Layer, ...]
    nodes: tuple[tuple[str, ...], ...]  # per layer, the ONNX nodes it runs
    output: str  # the tensor gathered at the region's end
    reason: str  # why the region ends there


def window(node: onnx.NodeProto, view: GraphView, dim: str) -> Window:
    """The node's window along ``dim`` (explicit pads or SAME/VALID auto_pad, strides, dilations)."""
    i = AXES[dim] - 2
    in_size = view.shape(node.input[0])[AXES[dim]]
    out_size = view.shape(node.output[0])[AXES[dim]]
    if node.op_type == "Conv":
        kernel = view.shape(node.input[1])[AXES[dim]]
    else:
        kernel = attr(node, "kernel_shape")[i]
    stride = (attr(node, "strides") or [1, 1])[i]
    dilation = (attr(node, "dilations") or [1, 1])[i]
    auto_pad = attr(node, "auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return Window.same(kernel, stride, in_size, dilation, lower=auto_pad == "SAME_LOWER")
    pads = attr(node, "pads") or [0, 0, 0, 0]
    begin, end = pads[i], pads[i + 2]
    if attr(node, "ceil_mode", 0):  # the last window may start inside the end padding
        end += stride - 1
    return Window(kernel, stride, dilation, begin, end, in_size, out_size)


def _pad(node: onnx.NodeProto, view: GraphView, dim: str) -> tuple[int, int] | None:
    """A Pad node's (begin, end) along ``dim`` when it pads with a constant and only the spatial axes."""
    mode = attr(node, "mode", b"constant")
    if (mode.decode() if isinstance(mode, bytes) else mode) != "constant":
        return None
    if len(node.input) > 1 and node.input[1] in view.initializers:
        pads = [int(v) for v in onnx.numpy_helper.to_array(view.initializers[node.input[1]]).ravel()]
    else:
        pads = list(attr(node, "pads") or [])
    if len(pads) != 8 or any(pads[i] or pads[i + 4] for i in (0, 1)) or any(v < 0 for v in pads):
        return None
    a = AXES[dim]
    return pads[a], pads[a + 4]


def _work(node: onnx.NodeProto, view: GraphView, macs: int) -> int:
    """A node's work in MACs: its multiply-accumulates, or one per output element per window tap (pooling),
    or one per output element (element-wise)."""
    if macs:
        return macs
    out = math.prod(view.shape(node.output[0]))
    if node.op_type in ("MaxPool", "AveragePool"):
        return out * math.prod(attr(node, "kernel_shape"))
    return out


def region(view: GraphView, dim: str = "H") -> Region:
    """The partitionable layers from the model's input (see the module docstring)."""
    if dim not in AXES:
        raise PlanError(f"dimension {dim!r}: partition along H or W")
    nodes = view.graph.node
    tensor = view.input.name
    if len(view.shape(tensor)) != 4:
        raise PlanError(f"input {tensor!r} has shape {view.shape(tensor)}: spatial partitioning needs NCHW")
    if view.shape(tensor)[AXES[dim]] == 1:
        raise PlanError(f"input {tensor!r} is 1 wide along {dim}: nothing to split")
    layers: list[Layer] = []
    groups: list[list[str]] = []
    current: dict | None = None
    padded: tuple[str, str, tuple[int, int]] | None = None  # (node, tensor before it, pads) of a pending Pad
    reason = "the model's output"

    def close() -> None:
        if current is not None:  # the layer's output: the tensor a pending Pad reads, not the padded one
            layers.append(Layer(current["name"], current["window"], current["macs"], current["in_row"],
                                current["out_row"](padded[1] if padded is not None else tensor)))
            groups.append(current["nodes"])

    def row_bytes(name: str) -> int:
        shape = view.shape(name)
        return math.prod(shape) // shape[AXES[dim]]

    while tensor != view.output.name:
        readers = view.consumers.get(tensor, [])
        if len(readers) != 1:
            reason = f"{tensor!r} is read by {len(readers)} ops (the chain ends; path analysis goes on: paths.py)"
            break
        node = nodes[readers[0]]
        kind = onnx_type(node.op_type)
        label = f"{node.op_type} {node.name!r}"
        if node.op_type == "Pad" and padded is None and (pads := _pad(node, view, dim)) is not None:
            after = view.consumers.get(node.output[0], [])
            if len(after) == 1 and onnx_type(nodes[after[0]].op_type) == TYPE1:
                padded = (node.name, tensor, pads)
                tensor = node.output[0]
                continue
        if padded is not None and kind != TYPE1:
            reason = f"{label} follows Pad {padded[0]!r}"
            break
        computed = [x for x in node.input if x and x not in view.initializers]
        if kind is None:
            reason = f"{label} is not in ADaPS Table 2"
            break
        if kind not in (TYPE1, TYPE2):
            reason = f"{label} is Type 3"
            break
        if len(computed) != 1:
            reason = f"{label} joins {len(computed)} computed tensors (the chain ends; path analysis goes on)"
            break
        if len(view.shape(node.output[0])) != 4:
            reason = f"{label} does not keep the NCHW layout"
            break
        work = _work(node, view, view.node_macs[readers[0]])
        if kind == TYPE1 or current is None:
            close()
            w = window(node, view, dim) if kind == TYPE1 else Window.identity(view.shape(tensor)[AXES[dim]])
            source, lead = tensor, []
            if padded is not None:  # the Pad's rows become the window's padding
                name, source, (begin, end) = padded
                w = Window(w.kernel, w.stride, w.dilation, w.pad_begin + begin, w.pad_end + end,
                           w.in_size - begin - end, w.out_size)
                lead, padded = [name], None
            current = {"name": node.name or node.output[0], "window": w, "macs": 0, "in_row": row_bytes(source),
                       "out_row": row_bytes, "nodes": lead}
        current["macs"] += work
        current["nodes"].append(node.name)
        tensor = node.output[0]
    close()
    if not layers:
        raise PlanError(f"no layer of the model can be partitioned along {dim}: {reason}")
    for x in layers:
        if x.out_size < 2:
            raise PlanError(f"layer {x.name!r} is {x.out_size} wide along {dim}: nothing to split")
    return Region(dim, tuple(layers), tuple(tuple(g) for g in groups), tensor, reason)
