"""Float ONNX tiles of an ADaPS tiling (issue 16, item 6): the verification that the float model, cut the way the
int8 tiles are cut, gives the whole float model's values exactly.

Each group of ``surgery/spatial.tiling`` or ``surgery/spatial_paths.tiling`` (a device's consecutive layers, its
input rows, the rows it gets right) becomes a sub-model of the canonical float ONNX: the region's nodes of those
layers (``plan/spatial/blocks`` or ``paths``, layer for layer the int8 tiling's), its inputs the tile's rows of
the tensors its first layer reads (one, or a merge's several). A tile pads as the int8 tile
does: where the int8 op pads SAME, the float window's pads along the axis are TF's SAME pads for the height the
tile gives it (``ChainOp.pads``), so the tile's rows fall where ``simulate`` put them; a fixed pad (a ``Pad``
node, a VALID window with explicit pads) is the same on a tile as on the tensor. The tiles then run in the
tiling's order, each reading its input rows from what the groups before it computed (never from the whole model),
and every row a tile keeps is compared with the whole float model's value of that tensor.

onnxruntime's convolution is a GEMM (MLAS SGEMM) over the output positions N = rows x width, and MLAS blocks its
sum over K = input channels x kernel by strides it picks from N and K (``sgemm_strides``): a tile of few rows
(AlexNet's conv3 on 3-4 of its 13 rows, N <= 64) sums in other chunks than the whole tensor and rounds differently
(up to 7e-6 here). So a tile's convolution whose N would be blocked otherwise than the whole tensor's gets zero
rows appended to its input (``Pad``) until it is blocked the same, and its output cut back (``Slice``): the rows
kept are the same sums in the same order, and equal the whole model's exactly (the rows added are dropped, and no
kept row's window reaches them). With several intra-op threads MLAS also splits a convolution's N into one
segment per thread, each blocked by its own size (a tiny_cnn tile differed by 2.4e-6 at 2 threads, 0 at 1): the
tiles and the whole model run on one thread (``THREADS``). ``TOLERANCE`` stays for what is left: rounding
``split`` accepts.

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
from edgeplan.plan.spatial.paths import Paths
from edgeplan.quantize.tflite_graph import TfliteGraph
from edgeplan.surgery.spatial import ChainLayer, Group, Tiling
from edgeplan.surgery.spatial_paths import PathGroup, PathTiling

DIMS = {1: "H", 2: "W"}  # the int8 (NHWC) axis -> the dimension
# what a tiling may differ by, relative to the largest value compared: float rounding (tiles are blocked as the
# whole tensor is, see the module; a tile misplaced by a row differs by the values themselves)
TOLERANCE = 1e-5
THREADS = 1  # onnxruntime intra-op threads of the tiles and the whole model (see the module)


def sgemm_strides(n: int, k: int) -> tuple[int, int]:
    """onnxruntime's MLAS SGEMM blocking for an N-column, K-deep product (``MlasSgemmOperation``): its N and K
    strides — the N stride widened while K is small, the K stride while N is (measured here: a 192 x 3 x 3
    convolution 13 wide is exact to the whole tensor's from 5 rows, N = 65, and not below)."""
    sn, sk = 128, 128
    if n >= k:
        while sk // 2 >= k:
            sn, sk = sn * 2, sk // 2
    else:
        while sn > 16 and sn // 2 >= n:
            sn, sk = sn // 2, sk * 2
    return sn, sk


@dataclass(frozen=True)
class FloatLayers:
    """The float model's partitioned layers, indexed once: per layer the ONNX nodes it runs, the computed tensors it
    reads (the model's input or other layers' outputs) and the tensor it outputs. Of a chain region
    (``blocks.region``: each layer reads the one before) or of a multi-path one (``paths.analyse``: a merge reads
    several)."""

    view: GraphView
    nodes: tuple[tuple[str, ...], ...]
    reads: tuple[tuple[str, ...], ...]
    outputs: tuple[str, ...]

    @classmethod
    def of(cls, view: GraphView, layers: Region | Paths) -> FloatLayers:
        if isinstance(layers, Paths):
            return cls(view, tuple(x.nodes for x in layers.layers), tuple(x.inputs for x in layers.layers),
                       tuple(x.output for x in layers.layers))
        named = {n.name: n for n in view.graph.node}
        outputs = tuple(named[nodes[-1]].output[0] for nodes in layers.nodes)
        return cls(view, layers.nodes, ((view.input.name,), *((o,) for o in outputs[:-1])), outputs)

    @cached_property
    def named(self) -> dict[str, onnx.NodeProto]:
        return {n.name: n for n in self.view.graph.node}

    def windowed(self, k: int) -> onnx.NodeProto | None:
        """The Type 1 node of layer ``k`` (None for a leading layer of Type 2 ops)."""
        return next((self.named[n] for n in self.nodes[k] if onnx_type(self.named[n].op_type) == TYPE1), None)


def tile_pads(graph: TfliteGraph, layers: list[ChainLayer], h: int) -> dict[int, tuple[int, int]]:
    """Per layer (position in ``layers``, a group's, from a tile ``h`` rows high) whose int8 window pads SAME: the
    pads (before, after) the tile gives it along the axis, from the height the tile has there."""
    out = {}
    for k, layer in enumerate(layers):
        for c in layer.ops:
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


def tile_model(f: FloatLayers, t: Tiling | PathTiling, graph: TfliteGraph, g: Group | PathGroup
               ) -> tuple[onnx.ModelProto, tuple[str, ...], list[str]]:
    """The group's float tile: (model, its inputs — the tensors its first layer reads, each the tile's rows —, its
    outputs — the tensors of the layers the group outputs, in layer order). Its initializers are the model's own
    (external data stays where the model keeps it)."""
    view = f.view
    dim = DIMS[t.axis]
    ids, every = g.layers, t.chains
    pads = tile_pads(graph, [every[k] for k in ids], g.tile.rows[1] - g.tile.rows[0])
    nodes = []
    for pos, k in enumerate(ids):
        windowed = f.windowed(k)
        c = every[k]
        if windowed is not None:
            w = window(windowed, view, dim)
            if (w.kernel, w.stride) != (c.kernel, c.stride):
                raise PlanError(f"layer {k}: float {windowed.op_type} {windowed.name!r} has kernel {w.kernel} "
                                f"stride {w.stride} along {dim}, the int8 layer {c.kernel} and {c.stride}")
        elif pos in pads:
            raise PlanError(f"layer {k}: the int8 layer has a window, the float one (nodes {f.nodes[k]}) none")
        for name in f.nodes[k]:
            node = f.named[name]
            nodes.append(_rewritten(node, view, dim, pads[pos]) if node is windowed and pos in pads else node)
    sources = f.reads[ids[0]]
    outputs = [f.outputs[k] for k in sorted(g.outputs)]
    inputs = []
    for source in sources:
        shape = list(view.shape(source))
        shape[AXES[dim]] = g.tile.rows[1] - g.tile.rows[0]
        inputs.append(helper.make_tensor_value_info(source, onnx.TensorProto.FLOAT, shape))
    reads = dict.fromkeys(x for n in nodes for x in n.input if x in view.initializers)
    graph_ = helper.make_graph(nodes, f"tile{g.index}", inputs,
                               [helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, None) for x in outputs],
                               initializer=[view.initializers[x] for x in reads])
    m = view.model
    tile = helper.make_model(graph_, opset_imports=list(m.opset_import), ir_version=m.ir_version)
    return blocked_as_whole(tile, view, dim), sources, outputs


def blocked_as_whole(tile: onnx.ModelProto, view: GraphView, dim: str) -> onnx.ModelProto:
    """``tile`` with every convolution that MLAS would block otherwise than on the whole tensor padded with zero
    rows (along ``dim``) until it is blocked the same, and its output cut back (see the module)."""
    from onnx import numpy_helper

    inferred = onnx.shape_inference.infer_shapes(tile).graph
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
              for vi in (*inferred.value_info, *inferred.output)}
    axis, across = AXES[dim], AXES["W" if dim == "H" else "H"]
    nodes, extra_inits = [], []
    for node in tile.graph.node:
        out = shapes.get(node.output[0]) if node.op_type == "Conv" else None
        if not out or node.input[1] not in view.initializers:
            nodes.append(node)
            continue
        k = int(np.prod(list(view.initializers[node.input[1]].dims)[1:]))
        whole = view.shape(node.output[0])
        want = sgemm_strides(whole[axis] * whole[across], k)
        rows, width = out[axis], out[across]
        more = next((r - rows for r in range(rows, whole[axis] + 1) if sgemm_strides(r * width, k) == want), 0)
        if more == 0:
            nodes.append(node)
            continue
        stride = list(attr(node, "strides", [1, 1]))[axis - 2]
        pads = [0] * (2 * len(out))
        pads[len(out) + axis] = more * stride
        tag = f"{node.name or node.output[0]}__blocked"
        extra_inits += [numpy_helper.from_array(np.array(pads, np.int64), f"{tag}_pads"),
                        numpy_helper.from_array(np.array([0], np.int64), f"{tag}_start"),
                        numpy_helper.from_array(np.array([rows], np.int64), f"{tag}_end"),
                        numpy_helper.from_array(np.array([axis], np.int64), f"{tag}_axis")]
        conv = onnx.NodeProto()
        conv.CopyFrom(node)
        conv.input[0], conv.output[0] = f"{tag}_in", f"{tag}_out"
        nodes += [helper.make_node("Pad", [node.input[0], f"{tag}_pads"], [f"{tag}_in"], name=f"{tag}_pad"), conv,
                  helper.make_node("Slice", [f"{tag}_out", f"{tag}_start", f"{tag}_end", f"{tag}_axis"],
                                   [node.output[0]], name=f"{tag}_cut")]
    if not extra_inits:
        return tile
    del tile.graph.node[:]
    tile.graph.node.extend(nodes)
    tile.graph.initializer.extend(extra_inits)
    return tile


def verify(path: Path, layers: Region | Paths, t: Tiling | PathTiling, graph: TfliteGraph, *, samples: int = 2,
           seed: int = 0) -> dict:
    """The float tiles of the model at ``path`` (model.onnx, its external data read by onnxruntime from beside
    it) run in the tiling's order on seeded inputs in [-1, 1], each from the rows the groups before it computed:
    the largest |difference| of any row a tile keeps from the whole float model's value (``float_max_abs_diff``),
    and how many values were compared. ``layers``: the float region the plan was made on, a chain
    (``blocks.region``, with a ``spatial.tiling``) or multi-path (``paths.analyse``, with a
    ``spatial_paths.tiling``)."""
    from edgeplan.graph.evaluate import session, tensor_values_each
    from edgeplan.graph.model import load_stored

    path = Path(path)
    view = GraphView(load_stored(path))
    f = FloatLayers.of(view, layers)
    if len(f.nodes) != len(t.layers):
        raise PlanError(f"the float region has {len(f.nodes)} layers, the int8 tiling {len(t.layers)}")
    axis = AXES[DIMS[t.axis]]
    tiles = [(g, *tile_model(f, t, graph, g)) for g in t.groups]
    sessions = [session(m, folder=path.parent, threads=THREADS) for _, m, _, _ in tiles]
    kept = sorted({f.outputs[k] for g in t.groups for k in g.outputs})
    rng = np.random.default_rng(seed)
    xs = rng.uniform(-1, 1, (samples, *view.shape(view.input.name)[1:])).astype(np.float32)
    worst, compared, scale = 0.0, 0, 0.0
    by_layer: dict[int, float] = {}
    for x, whole in zip(xs, tensor_values_each(path, kept, xs, threads=THREADS)):
        rows: dict[str, np.ndarray] = {view.input.name: x[None]}
        have: dict[str, np.ndarray] = {view.input.name: np.ones(x.shape[axis - 1], bool)}
        for (g, _, sources, outputs), sess in zip(tiles, sessions):
            a, b = g.tile.rows
            for source in sources:
                if source not in have or not have[source][a:b].all():
                    raise PlanError(f"tile {g.index} reads rows [{a}, {b}) of {source!r}, not all computed before it")
            got = sess.run(outputs, {source: np.take(rows[source], range(a, b), axis=axis) for source in sources})
            ids = g.layers
            for k, name, value in zip(sorted(g.outputs), outputs, got):
                off, (s, e) = g.tile.offsets[ids.index(k)], g.tile.valid[ids.index(k)]
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
