"""Int8 tiles of a multi-path ADaPS plan (path analysis, §4.2): ``surgery/spatial``'s tiles, per sub-block.

The int8 model's region is found as ``plan/spatial/paths`` finds the float one (same rules, TFLite ops: a PAD
joins the window that alone reads it, a Type 2 op the layer whose output only it reads, a residual ADD of two
computed tensors of one shape is a layer of its own), and its layers are matched to the float plan's layer for
layer: the same inputs (already matched), kernel, stride, rows and row bytes.

Each sub-block is a chain, tiled as ``surgery/spatial`` tiles a chain: a device's group of layers ends where it
must receive rows it did not compute, and never crosses a sub-block's boundary. A group's first layer reads
one tensor, or a merge's several (the same rows of each); every row it lacks comes from whichever device
computed it (the head holds the model's input). At the region's end each tensor the rest of the model reads is
gathered on the head, which runs the rest. The tables are ``surgery/spatial``'s (stages with several inputs),
run by ``distributed/rank`` and verified by ``spatial.verify`` the same way.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from edgeplan.errors import PlanError
from edgeplan.plan.spatial.ops import TYPE1, TYPE2, tflite_type
from edgeplan.plan.spatial.paths import Paths
from edgeplan.quantize.stream import cut_ops
from edgeplan.quantize.tflite_graph import TfliteGraph
from edgeplan.surgery.spatial import (
    HEAD,
    ChainLayer,
    ChainOp,
    Interval,
    Tile,
    _chain_op,
    _minus,
    _sources,
    assemble,
    fit,
    groups_of,
    rows_detail,
)


@dataclass(frozen=True)
class PathLayer8:
    chain: ChainLayer  # its ops (a leading PAD, the windowed op, the Type 2 ops after it) and output tensor
    inputs: tuple[int, ...]  # the int8 tensors it reads


def int8_layers(graph: TfliteGraph, axis: int) -> list[PathLayer8]:
    """The int8 model's region, layer by layer (module docstring), in the model's op order."""
    readers: dict[int, list[int]] = {}
    for op in graph.ops:
        for x in graph.activations(op):
            readers.setdefault(x, []).append(op.index)
    inside = {graph.inputs[0]}
    padded: dict[int, tuple[ChainOp, int]] = {}  # a joining PAD's output -> (its op, its input)
    layers: list[dict] = []
    open_at: dict[int, int] = {}
    for op in graph.ops:
        acts = graph.activations(op)
        if not acts or any(x not in inside for x in acts) or len(op.outputs) != 1:
            continue
        out = op.outputs[0]
        kind = tflite_type(op.name)
        if op.name == "PAD" and acts[0] not in padded:
            after = readers.get(out, [])
            if len(after) == 1 and tflite_type(graph.ops[after[0]].name) == TYPE1:
                padded[out] = (_chain_op(graph, op, axis), acts[0])
                inside.add(out)
            continue
        if kind not in (TYPE1, TYPE2) or len(graph.tensors[out].shape) != 4:
            continue
        if any(x in padded for x in acts) and kind != TYPE1:
            continue
        if len(acts) > 1 and any(graph.tensors[x].shape != graph.tensors[out].shape for x in acts):
            continue
        c = _chain_op(graph, op, axis)
        x = acts[0]
        if kind == TYPE2 and len(acts) == 1 and x in open_at and len(readers.get(x, [])) == 1:
            k = open_at.pop(x)
            layers[k]["ops"].append(c)
            layers[k]["tensor"] = out
        else:
            lead, ins = [], acts
            if kind == TYPE1 and x in padded:
                pad, source = padded[x]
                lead, ins = [pad], [source]
            layers.append({"ops": [*lead, c], "inputs": tuple(ins), "tensor": out,
                           "kernel": c.kernel, "stride": c.stride})
            k = len(layers) - 1
        open_at[out] = k
        inside.add(out)
    return [PathLayer8(ChainLayer(tuple(x["ops"]), x["tensor"], x["kernel"], x["stride"]), x["inputs"])
            for x in layers]


def match(paths: Paths, layers: list[PathLayer8], graph: TfliteGraph, axis: int) -> list[int]:
    """For each float layer of ``paths``, the int8 layer that computes it: its inputs matched already, the same
    kernel, stride, output rows and row bytes. A float layer with no such int8 layer is an error naming it."""
    tensor_of = {paths.input: graph.inputs[0]}  # float tensor -> int8 tensor
    used: set[int] = set()
    out = []
    for f in paths.layers:
        want = sorted(tensor_of.get(t, -1) for t in f.inputs)
        rows = graph.tensors
        hit = None
        for j, q in enumerate(layers):
            shape = rows[q.chain.tensor].shape
            if j in used or sorted(q.inputs) != want:
                continue
            row_bytes = shape[1] * shape[2] * shape[3] // shape[axis]
            if (q.chain.kernel, q.chain.stride, shape[axis], row_bytes) == (
                    f.layer.window.kernel, f.layer.window.stride, f.layer.out_size, f.layer.out_row_bytes):
                hit = j
                break
        if hit is None:
            raise PlanError(f"layer {f.layer.name!r} (reading {', '.join(f.inputs)}): no int8 layer of the same "
                            "window and size reads the same tensors")
        used.add(hit)
        tensor_of[f.output] = layers[hit].chain.tensor
        out.append(hit)
    return out


@dataclass
class PathGroup:
    device: int
    layers: tuple[int, ...]  # the plan's layer indices, a run of one sub-block
    tile: Tile
    outputs: set[int] = field(default_factory=set)  # plan layers whose tensor the segment outputs
    index: int = -1


@dataclass(frozen=True)
class PathMessage:
    tensor: int  # int8 tensor
    rows: Interval
    sender: int
    receiver: int


@dataclass(frozen=True)
class PathTiling:
    axis: int
    layers: tuple[PathLayer8, ...]  # per plan layer, its int8 layer
    groups: tuple[PathGroup, ...]  # in an order they can run
    messages: tuple[PathMessage, ...]
    gathered: tuple[int, ...]  # int8 tensors the head gathers at the region's end
    suffix: tuple[int, ...]  # int8 ops after the region, on the head

    @property
    def chains(self) -> tuple[ChainLayer, ...]:
        """Per layer, its int8 ops."""
        return tuple(x.chain for x in self.layers)


def tiling(graph: TfliteGraph, paths: Paths, plan: list[tuple[Interval, ...]], axis: int = 1) -> PathTiling:
    """Groups, tiles and messages of ``plan`` (per layer of ``paths``, each device's output rows)."""
    found = int8_layers(graph, axis)
    layers = [found[j] for j in match(paths, found, graph, axis)]
    chains = [x.chain for x in layers]
    n = len(plan[0])
    groups: list[PathGroup] = []
    for block in paths.blocks:
        ids = list(block.layers)
        part = [plan[i] for i in ids]
        for d in range(n):
            for first, last in groups_of([chains[i] for i in ids], part, d):
                run = ids[first:last + 1]
                groups.append(PathGroup(d, tuple(run), fit([chains[i] for i in run], [plan[i][d] for i in run])))
    order = {i: k for k, i in enumerate(i for b in paths.blocks for i in b.layers)}
    groups.sort(key=lambda g: (order[g.layers[0]], g.device))
    for k, g in enumerate(groups):
        g.index = k
        g.outputs.add(g.layers[-1])
    made_by = {x.chain.tensor: i for i, x in enumerate(layers)}
    model_in = graph.inputs[0]

    def holdings(tensor: int) -> list:
        """Per device, (its group, the rows of ``tensor`` it holds) or (None, None)."""
        if tensor == model_in:
            return [(None, (0, graph.tensors[tensor].shape[axis])) if d == HEAD else (None, None) for d in range(n)]
        i = made_by[tensor]
        out = []
        for d in range(n):
            g = next((g for g in groups if g.device == d and i in g.layers), None)
            out.append((g, g.tile.valid[g.layers.index(i)]) if g is not None else (None, None))
        return out

    messages = []
    for g in groups:
        for t in layers[g.layers[0]].inputs:
            held = holdings(t)
            mine = held[g.device][1] or (0, 0)
            for gap in _minus(g.tile.rows, mine):
                for sender, rows in _sources(gap, [h if d != g.device else (None, None) for d, h in enumerate(held)],
                                             g.device):
                    if held[sender][0] is not None:
                        held[sender][0].outputs.add(made_by[t])
                    messages.append(PathMessage(t, rows, sender, g.device))
    region_ops = {c.op for x in layers for c in x.chain.ops}
    suffix = tuple(op.index for op in graph.ops if op.index not in region_ops)
    read_after = {x for i in suffix for x in graph.activations(graph.ops[i])} | set(graph.outputs)
    gathered = tuple(x.chain.tensor for x in layers if x.chain.tensor in read_after)
    for t in gathered:
        i, end = made_by[t], 0
        for d in range(n):
            s, e = max(plan[i][d][0], end), plan[i][d][1]
            if s < e and d != HEAD:
                next(g for g in groups if g.device == d and i in g.layers).outputs.add(i)
                messages.append(PathMessage(t, (s, e), d, HEAD))
            end = max(end, e)
    return PathTiling(axis, tuple(layers), tuple(groups), tuple(messages), gathered, suffix)


def segments(graph: TfliteGraph, t: PathTiling) -> dict[str, bytes]:
    """``int8/s<k>.tflite`` per group, then one for the rest of the model (on the head)."""
    out = {}
    for g in t.groups:
        ops = [c.op for i in g.layers for c in t.layers[i].chain.ops]
        out[f"int8/s{g.index}.tflite"] = cut_ops(graph, ops, f"t{g.index}",
                                                 [t.layers[i].chain.tensor for i in sorted(g.outputs)])
    if t.suffix:
        out[f"int8/s{len(t.groups)}.tflite"] = cut_ops(graph, list(t.suffix), "suffix")
    return out


def tables(graph: TfliteGraph, t: PathTiling, devices: list[dict], blobs: dict[str, str]) -> dict:
    """The rank program's tables, as ``surgery/spatial.tables`` writes them, with a merge's several inputs."""
    name = {ix: graph.tensors[ix].name for ix in range(len(graph.tensors))}

    def shape(ix: int, rows: int | None = None) -> list[int]:
        return rows_detail(graph, t.axis, ix, rows)["shape"]

    stages = []
    for g in t.groups:
        ins = t.layers[g.layers[0]].inputs
        h = g.tile.rows[1] - g.tile.rows[0]
        where = {i: g.layers.index(i) for i in g.outputs}
        stages.append({
            "index": g.index, "rank": g.device, "int8": f"int8/s{g.index}.tflite", "inputs": [name[x] for x in ins],
            "outputs": [name[t.layers[i].chain.tensor] for i in sorted(g.outputs)], "layers": list(g.layers),
            "tile": {"inputs": {name[x]: {"rows": list(g.tile.rows), "shape": shape(x, h)} for x in ins},
                     "outputs": {name[t.layers[i].chain.tensor]: {
                         "offset": g.tile.offsets[k], "keep": list(g.tile.valid[k]),
                         "shape": shape(t.layers[i].chain.tensor, g.tile.heights[k])}
                         for i, k in sorted(where.items())}},
        })
    if t.suffix:
        stages.append({"index": len(stages), "rank": HEAD, "int8": f"int8/s{len(stages)}.tflite",
                       "inputs": [name[x] for x in t.gathered], "outputs": [name[graph.outputs[0]]], "layers": [],
                       "tile": {"inputs": {name[x]: {"rows": [0, graph.tensors[x].shape[t.axis]], "shape": shape(x)}
                                           for x in t.gathered}, "outputs": {}}})
    return assemble(graph, t.axis, stages, [(m.tensor, m.rows, m.sender, m.receiver) for m in t.messages], devices,
                    blobs)
