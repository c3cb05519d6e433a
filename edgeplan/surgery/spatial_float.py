"""Float ONNX tiles of an ADaPS tiling (issue 16, item 6): the verification that the float model, cut the way the
int8 tiles are cut, gives the whole float model's values exactly.

Each group of ``surgery/spatial.tiling`` (a device's consecutive layers, its input rows, the rows it gets right)
becomes a sub-model of the canonical float ONNX: the region's nodes of those layers (``plan/spatial/blocks``, layer
for layer the int8 chain's), its input the tile's rows of the tensor before them. A tile pads as the int8 tile
does: where the int8 op pads SAME, the float window's pads along the axis are TF's SAME pads for the height the
tile gives it (``ChainOp.pads``), so the tile's rows fall where ``simulate`` put them; a fixed pad (a ``Pad``
node, a VALID window with explicit pads) is the same on a tile as on the tensor. The tiles then run in the
tiling's order, each reading its input rows from what the groups before it computed (never from the whole model),
and every row a tile keeps is compared with the whole float model's value of that tensor: 0 difference on the
test models; up to rounding (``TOLERANCE``) where onnxruntime's convolution rounds a tile differently.

Pipeline side (onnx, onnxruntime); nothing is written.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from edgeplan.errors import PlanError
from edgeplan.graph.costs import attr
from edgeplan.graph.model import GraphView
from edgeplan.plan.spatial.blocks import AXES, Region, window
from edgeplan.plan.spatial.ops import TYPE1, onnx_type, tflite_type
from edgeplan.quantize.tflite_graph import TfliteGraph
from edgeplan.surgery.spatial import ChainLayer, Group, Tiling

DIMS = {1: "H", 2: "W"}  # the int8 (NHWC) axis -> the dimension
# what a tiling may differ by, relative to the largest value compared: float rounding. onnxruntime's convolution
# does not always round the same on a tile as on the whole tensor (AlexNet, 4 devices: conv3 on tiles of 3-6 of
# its 13 rows differed by 2.9e-6 with values up to 11.3, at 1 thread and with no graph optimization too); a tile
# misplaced by a row differs by the values themselves
TOLERANCE = 1e-5


@dataclass(frozen=True)
class FloatRegion:
    """The float model's region (``blocks.region``), indexed once: its nodes by name, each layer's output."""

    view: GraphView
    region: Region

    @cached_property
    def named(self) -> dict[str, onnx.NodeProto]:
        return {n.name: n for n in self.view.graph.node}

    @cached_property
    def outputs(self) -> list[str]:
        """Per layer, the tensor it outputs (its last node's)."""
        return [self.named[nodes[-1]].output[0] for nodes in self.region.nodes]

    def before(self, k: int) -> str:
        """The tensor layer ``k`` reads."""
        return self.view.input.name if k == 0 else self.outputs[k - 1]

    def windowed(self, k: int) -> onnx.NodeProto | None:
        """The Type 1 node of layer ``k`` (None for a leading layer of Type 2 ops)."""
        return next((self.named[n] for n in self.region.nodes[k] if onnx_type(self.named[n].op_type) == TYPE1),
                    None)


def tile_pads(graph: TfliteGraph, layers: tuple[ChainLayer, ...], g: Group) -> dict[int, tuple[int, int]]:
    """Per layer of the group whose int8 window pads SAME: the pads (before, after) the tile gives it along the
    axis, from the height the tile has there."""
    h = g.tile.rows[1] - g.tile.rows[0]
    out = {}
    for k in range(g.first, g.last + 1):
        for c in layers[k].ops:
            if c.same and tflite_type(graph.ops[c.op].name) == TYPE1:
                out[k] = c.pads(h)
            h = c.out(h)
    return out


def _rewritten(node: onnx.NodeProto, view: GraphView, dim: str, pads: tuple[int, int]) -> onnx.NodeProto:
    """A copy of the window ``node`` with explicit pads: along ``dim`` the tile's, along the other axis the
    whole tensor's."""
    if attr(node, "ceil_mode", 0):
        raise PlanError(f"{node.op_type} {node.name!r}: ceil_mode windows cannot be tiled with SAME pads")
    other = "W" if dim == "H" else "H"
    w = window(node, view, other)
    i, j = AXES[dim] - 2, AXES[other] - 2
    explicit = [0, 0, 0, 0]
    explicit[i], explicit[i + 2] = pads
    explicit[j], explicit[j + 2] = w.pad_begin, w.pad_end
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    keep = [a for a in copy.attribute if a.name not in ("pads", "auto_pad")]
    del copy.attribute[:]
    copy.attribute.extend(keep)
    copy.attribute.append(helper.make_attribute("pads", explicit))
    return copy


def tile_model(f: FloatRegion, t: Tiling, graph: TfliteGraph, g: Group) -> tuple[onnx.ModelProto, str, list[str]]:
    """The group's float tile: (model, its input, its outputs — the tensors of the layers the group outputs, in
    layer order). Its initializers are the model's own (external data stays where the model keeps it)."""
    view, region = f.view, f.region
    dim = DIMS[t.axis]
    pads = tile_pads(graph, t.layers, g)
    nodes = []
    for k in range(g.first, g.last + 1):
        windowed = f.windowed(k)
        c = t.layers[k]
        if windowed is not None:
            w = window(windowed, view, dim)
            if (w.kernel, w.stride) != (c.kernel, c.stride):
                raise PlanError(f"layer {k}: float {windowed.op_type} {windowed.name!r} has kernel {w.kernel} "
                                f"stride {w.stride} along {dim}, the int8 layer {c.kernel} and {c.stride}")
        elif k in pads:
            raise PlanError(f"layer {k}: the int8 layer has a window, the float one (nodes {region.nodes[k]}) none")
        for name in region.nodes[k]:
            node = f.named[name]
            nodes.append(_rewritten(node, view, dim, pads[k]) if node is windowed and k in pads else node)
    source = f.before(g.first)
    outputs = [f.outputs[k] for k in sorted(g.outputs)]
    shape = list(view.shape(source))
    shape[AXES[dim]] = g.tile.rows[1] - g.tile.rows[0]
    reads = dict.fromkeys(x for n in nodes for x in n.input if x in view.initializers)
    graph_ = helper.make_graph(nodes, f"tile{g.index}",
                               [helper.make_tensor_value_info(source, onnx.TensorProto.FLOAT, shape)],
                               [helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, None) for x in outputs],
                               initializer=[view.initializers[x] for x in reads])
    m = view.model
    return helper.make_model(graph_, opset_imports=list(m.opset_import), ir_version=m.ir_version), source, outputs


def verify(path: Path, region: Region, t: Tiling, graph: TfliteGraph, *, samples: int = 2, seed: int = 0) -> dict:
    """The float tiles of the model at ``path`` (model.onnx, its external data read by onnxruntime from beside
    it) run in the tiling's order on seeded inputs in [-1, 1], each from the rows the groups before it computed:
    the largest |difference| of any row a tile keeps from the whole float model's value (``float_max_abs_diff``),
    and how many values were compared."""
    from edgeplan.graph.evaluate import session, tensor_values_each
    from edgeplan.graph.model import load_stored

    path = Path(path)
    view = GraphView(load_stored(path))
    f = FloatRegion(view, region)
    if len(region.layers) != len(t.layers):
        raise PlanError(f"the float region has {len(region.layers)} layers, the int8 tiling {len(t.layers)}")
    axis = AXES[DIMS[t.axis]]
    tiles = [(g, *tile_model(f, t, graph, g)) for g in t.groups]
    sessions = [session(m, folder=path.parent) for _, m, _, _ in tiles]
    kept = sorted({f.outputs[k] for g in t.groups for k in g.outputs})
    rng = np.random.default_rng(seed)
    xs = rng.uniform(-1, 1, (samples, *view.shape(view.input.name)[1:])).astype(np.float32)
    worst, compared, scale = 0.0, 0, 0.0
    by_layer: dict[int, float] = {}
    for x, whole in zip(xs, tensor_values_each(path, kept, xs)):
        rows: dict[str, np.ndarray] = {view.input.name: x[None]}
        have: dict[str, np.ndarray] = {view.input.name: np.ones(x.shape[axis - 1], bool)}
        for (g, _, source, outputs), sess in zip(tiles, sessions):
            a, b = g.tile.rows
            if source not in have or not have[source][a:b].all():
                raise PlanError(f"tile {g.index} reads rows [{a}, {b}) of {source!r}, not all computed before it")
            got = sess.run(outputs, {source: np.take(rows[source], range(a, b), axis=axis)})
            for k, name, value in zip(sorted(g.outputs), outputs, got):
                off, (s, e) = g.tile.offsets[k - g.first], g.tile.valid[k - g.first]
                part = np.take(value, range(s - off, e - off), axis=axis)
                want = np.take(whole[name], range(s, e), axis=axis)
                if part.shape != want.shape:
                    raise PlanError(f"tile {g.index}: rows [{s}, {e}) of {name!r} came out {part.shape}, the whole "
                                    f"model's are {want.shape}")
                diff = float(np.max(np.abs(part - want))) if part.size else 0.0
                worst = max(worst, diff)
                by_layer[k] = max(by_layer.get(k, 0.0), diff)
                scale = max(scale, float(np.max(np.abs(want))) if want.size else 0.0)
                compared += part.size
                if name not in rows:
                    rows[name] = np.zeros_like(whole[name])
                    have[name] = np.zeros(whole[name].shape[axis], bool)
                index = [slice(None)] * part.ndim
                index[axis] = slice(s, e)
                rows[name][tuple(index)] = part
                have[name][s:e] = True
    return {"float_max_abs_diff": worst, "float_values_compared": compared, "float_max_abs_value": scale,
            "float_max_abs_diff_by_layer": {k: by_layer[k] for k in sorted(by_layer)}}
