"""Int8 tiles of an ADaPS plan (issue 16, item 6): what each device runs, receives and sends.

The plan gives, per layer of the partitioned region, the output rows ``[s, e)`` of each device. A device runs
a *group* of consecutive layers as one segment cut from the one int8 model (``quantize/stream.cut_ops``) with
its input resized to the tile's rows (``resize_tensor_input``): it needs no conversion. A device's group ends
where it must receive rows it did not compute (eqs. (6)–(7)); between, it computes every row it needs itself
(the overlap ADaPS buys).

A tile is not the model on fewer rows: each windowed op pads the tile as it pads a whole tensor — SAME padding
puts ``pad_total // 2`` rows before, and ``pad_total`` depends on the tile's height — so a tile's output row
``o'`` lies at global row ``(a - pad_tile + pad_model) / stride + o'`` (a tile starting at row ``a``), which
must be whole, and a row is right only where every row it reads is a right row of the tile, or padding where
the whole tensor is padded too. ``simulate`` follows both through the chain; a tile whose alignment fails is
widened a row at a time until every layer's valid rows hold that layer's rows of the plan. The extra rows are
received like the others, from whichever device computed them, never zero-filled.

At the region's end each device sends its rows (those the device before it does not) to the head, which runs
the rest of the model (the Type 3 suffix). The head holds the input and sends each device the rows its first
tile reads. Everything is written as the multi-device tables (``distributed/rank`` runs them): stages with a
``tile`` (axis, input rows, output offset and kept rows), buffers with ``tensor`` and ``rows``.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from functools import cached_property
from itertools import pairwise
from pathlib import Path

import numpy as np

from edgeplan.artifacts import staged_dir, write_json_atomic
from edgeplan.errors import PlanError
from edgeplan.plan.multidevice.spec import Device
from edgeplan.plan.spatial.intervals import Window
from edgeplan.plan.spatial.ops import TYPE1, TYPE2, tflite_type
from edgeplan.quantize.stream import cut_ops
from edgeplan.quantize.tflite_graph import TfliteGraph
from edgeplan.surgery.multidevice import tensor_detail

Interval = tuple[int, int]
AXES = {"H": 1, "W": 2}  # NHWC
HEAD = 0
MAX_WIDEN = 64  # rows a tile may grow by, in all, to align its windows


# ------------------------------------------------------------------------------------------------ the chain
@dataclass(frozen=True)
class ChainOp:
    """One op of the region along the partitioned axis: a window (``same``: TF SAME pads from the height it
    gets; else the fixed pads of a VALID op or of PAD) or the identity."""

    op: int
    in_size: int
    out_size: int
    kernel: int = 1
    stride: int = 1
    dilation: int = 1
    same: bool = False
    fixed: tuple[int, int] = (0, 0)

    def pads(self, h: int) -> tuple[int, int]:
        if not self.same:
            return self.fixed
        w = Window.same(self.kernel, self.stride, h, self.dilation)
        return w.pad_begin, w.pad_end

    def out(self, h: int) -> int:
        begin, end = self.pads(h)
        return (h + begin + end - (self.kernel - 1) * self.dilation - 1) // self.stride + 1

    @cached_property
    def pad_begin(self) -> int:
        """The whole tensor's padding before its first row (read for every tap a tile simulation checks)."""
        return self.pads(self.in_size)[0]


@dataclass(frozen=True)
class ChainLayer:
    ops: tuple[ChainOp, ...]
    tensor: int  # the int8 tensor the layer outputs
    kernel: int  # its Type 1 op's window, checked against the plan's layer
    stride: int


def _chain_op(graph: TfliteGraph, op, axis: int) -> ChainOp:
    x, y = graph.activations(op)[0], op.outputs[0]
    h_in, h_out = graph.tensors[x].shape[axis], graph.tensors[y].shape[axis]
    o = op.builtin_options
    if op.name == "PAD":
        pads = graph.constant_value(op.inputs[1])
        return ChainOp(op.index, h_in, h_out, fixed=(int(pads[axis][0]), int(pads[axis][1])))
    if tflite_type(op.name) == TYPE2:
        return ChainOp(op.index, h_in, h_out)
    hw = "H" if axis == 1 else "W"
    if op.name in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        kernel = graph.tensors[op.inputs[1]].shape[axis]
        dilation = getattr(o, f"dilation{hw}Factor")
    else:
        kernel = getattr(o, f"filter{'Height' if axis == 1 else 'Width'}")
        dilation = 1
    stride = getattr(o, f"stride{hw}")
    c = ChainOp(op.index, h_in, h_out, kernel, stride, dilation, same=o.padding == 0)
    if c.out(h_in) != h_out:
        raise PlanError(f"{op.name} op {op.index}: its window gives {c.out(h_in)} rows, the model {h_out}")
    return c


def chain(graph: TfliteGraph, axis: int, layers: int) -> list[ChainLayer]:
    """The first ``layers`` layers of the int8 model along one path from its input: a layer is an optional PAD,
    one Type 1 op and the Type 2 ops after it (leading Type 2 ops join the first layer)."""
    consumers: dict[int, list[int]] = {}
    for op in graph.ops:
        for x in graph.activations(op):
            consumers.setdefault(x, []).append(op.index)
    tensor = graph.inputs[0]
    out: list[ChainLayer] = []
    ops: list[ChainOp] = []
    windowed = None
    while True:
        readers = consumers.get(tensor, [])
        op = graph.ops[readers[0]] if len(readers) == 1 else None
        kind = tflite_type(op.name) if op is not None else None
        starts = op is not None and (op.name == "PAD" or kind == TYPE1)
        if windowed is not None and (op is None or starts or kind != TYPE2):
            out.append(ChainLayer(tuple(ops), tensor, windowed.kernel, windowed.stride))
            ops, windowed = [], None
            if len(out) == layers:
                return out
        if op is None or not (starts or kind == TYPE2) or len(graph.activations(op)) != 1:
            what = f"{op.name} op {op.index}" if op is not None else f"tensor {graph.tensors[tensor].name!r}"
            raise PlanError(f"the int8 model has {len(out)} partitionable layers, the plan {layers}: it stops at "
                            f"{what}")
        c = _chain_op(graph, op, axis)
        ops.append(c)
        if kind == TYPE1:
            windowed = c
        tensor = op.outputs[0]


# ------------------------------------------------------------------------------------------------ one tile
@dataclass(frozen=True)
class Tile:
    rows: Interval  # input rows the tile reads
    offsets: tuple[int, ...]  # per layer of the group: the global row of the tile's output row 0
    valid: tuple[Interval, ...]  # per layer: the global rows the tile gets right
    heights: tuple[int, ...]  # per layer: the tile's output rows


def simulate(layers: list[ChainLayer], rows: Interval) -> Tile | None:
    """Run a tile of input ``rows`` through ``layers`` on paper: None when a window is misaligned."""
    start, h = rows[0], rows[1] - rows[0]
    vs, ve = rows
    offsets, valid, heights = [], [], []
    for layer in layers:
        for c in layer.ops:
            pad_tile = c.pads(h)[0]
            num = start - pad_tile + c.pad_begin
            if num % c.stride:
                return None
            off, oh = num // c.stride, c.out(h)
            first = last = None
            for o in range(max(off, 0), min(off + oh, c.out_size)):
                if _right(c, o, start, h, vs, ve):
                    first = o if first is None else first
                    last = o
                elif first is not None:
                    break
            if first is None:
                return Tile(rows, (), (), ())
            start, h, vs, ve = off, oh, first, last + 1
        offsets.append(start)
        valid.append((vs, ve))
        heights.append(h)
    return Tile(rows, tuple(offsets), tuple(valid), tuple(heights))


def _right(c: ChainOp, o: int, start: int, h: int, vs: int, ve: int) -> bool:
    """Output row ``o`` (global) reads only right rows of the tile, or padding the whole tensor has too."""
    for j in range(c.kernel):
        g = o * c.stride - c.pad_begin + j * c.dilation
        inside_tensor = 0 <= g < c.in_size
        inside_tile = start <= g < start + h
        if inside_tensor and not (inside_tile and vs <= g < ve):
            return False
        if not inside_tensor and inside_tile:
            return False
    return True


def needs(layers: list[ChainLayer], out: Interval) -> Interval:
    """Input rows of the first layer that rows ``out`` of the last one read (hull, inside the tensors)."""
    s, e = out
    for layer in reversed(layers):
        for c in reversed(layer.ops):
            lo = s * c.stride - c.pad_begin
            hi = (e - 1) * c.stride - c.pad_begin + (c.kernel - 1) * c.dilation + 1
            s, e = max(lo, 0), min(hi, c.in_size)
    return s, e


def fit(layers: list[ChainLayer], targets: list[Interval]) -> Tile:
    """The smallest tile whose valid rows hold ``targets[k]`` at each layer ``k``, its windows aligned."""
    reads = [needs(layers[:k + 1], t) for k, t in enumerate(targets)]
    a, b = min(r[0] for r in reads), max(r[1] for r in reads)
    size = layers[0].ops[0].in_size
    for grow in range(MAX_WIDEN + 1):
        for up in range(grow + 1):
            rows = (a - up, b + grow - up)
            if rows[0] < 0 or rows[1] > size:
                continue
            t = simulate(layers, rows)
            if t is not None and t.valid and all(v[0] <= s and e <= v[1] for v, (s, e) in zip(t.valid, targets)):
                return t
    raise PlanError(f"no tile of input rows near [{a}, {b}) computes rows {targets} (windows misaligned beyond "
                    f"{MAX_WIDEN} rows)")


# ------------------------------------------------------------------------------------------------ the tiling
@dataclass
class Group:
    device: int
    first: int  # layers, inclusive
    last: int
    tile: Tile
    outputs: set[int] = field(default_factory=set)  # layers whose tensor the segment outputs
    index: int = -1

    @property
    def layers(self) -> tuple[int, ...]:
        """The layers it runs, in order (as ``spatial_paths.PathGroup`` names its own)."""
        return tuple(range(self.first, self.last + 1))


@dataclass(frozen=True)
class Message:
    layer: int  # -1: the model's input; else the tensor of this layer
    rows: Interval
    sender: int
    receiver: int


@dataclass(frozen=True)
class Tiling:
    axis: int
    layers: tuple[ChainLayer, ...]
    groups: tuple[Group, ...]  # in an order they can run
    messages: tuple[Message, ...]
    suffix: tuple[int, ...]  # int8 ops after the region, on the head

    @property
    def chains(self) -> tuple[ChainLayer, ...]:
        """Per layer, its int8 ops (as ``spatial_paths.PathTiling`` gives its own)."""
        return self.layers


def groups_of(layers: list[ChainLayer], plan: list[tuple[Interval, ...]], d: int) -> list[tuple[int, int]]:
    """Device ``d``'s groups: a new one starts at each layer whose input rows it needs and did not compute."""
    def computed(k: int) -> bool:
        (s, e), (hs, he) = needs([layers[k]], plan[k][d]), plan[k - 1][d]
        return hs <= s and e <= he

    cuts = [k for k in range(1, len(layers)) if not computed(k)]
    bounds = [0, *cuts, len(layers)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(len(bounds) - 1)]


def tiling(graph: TfliteGraph, plan: list[tuple[Interval, ...]], axis: int = 1) -> Tiling:
    """Tiles, groups and messages for ``plan`` (per layer of the region, each device's output rows)."""
    layers = chain(graph, axis, len(plan))
    for k, (layer, p) in enumerate(zip(layers, plan)):
        size = layer.ops[-1].out_size
        if p[0][0] != 0 or p[-1][1] != size or any(s >= e for s, e in p) or any(
                not a[0] < b[0] <= a[1] < b[1] for a, b in pairwise(p)):
            raise PlanError(f"layer {k}: the partition {p} does not cover rows [0, {size}) in order")
    n = len(plan[0])
    groups = []
    for d in range(n):
        for first, last in groups_of(layers, plan, d):
            groups.append(Group(d, first, last, fit(layers[first:last + 1], [plan[k][d] for k in
                                                                            range(first, last + 1)])))
    groups.sort(key=lambda g: (g.first, g.device))
    for i, g in enumerate(groups):
        g.index = i
        g.outputs.add(g.last)

    def holding(d: int, k: int) -> tuple[Group, Interval]:
        g = next(g for g in groups if g.device == d and g.first <= k <= g.last)
        return g, g.tile.valid[k - g.first]

    messages = []
    for g in groups:
        need = g.tile.rows
        if g.first == 0:
            if g.device != HEAD:
                messages.append(Message(-1, need, HEAD, g.device))
            continue
        k = g.first - 1
        held = holding(g.device, k)[1]
        for gap in _minus(need, held):
            for sender, rows in _sources(gap, [holding(d, k) if d != g.device else (None, None) for d in range(n)],
                                         g.device):
                holding(sender, k)[0].outputs.add(k)
                messages.append(Message(k, rows, sender, g.device))
    last = len(layers) - 1
    end = 0
    for d in range(n):
        s, e = max(plan[last][d][0], end), plan[last][d][1]
        if s < e and d != HEAD:
            messages.append(Message(last, (s, e), d, HEAD))
        end = max(end, e)
    region_ops = {c.op for layer in layers for c in layer.ops}
    suffix = tuple(op.index for op in graph.ops if op.index not in region_ops)
    return Tiling(axis, tuple(layers), tuple(groups), tuple(messages), suffix)


def _minus(need: Interval, held: Interval) -> list[Interval]:
    out = []
    if need[0] < held[0]:
        out.append((need[0], min(need[1], held[0])))
    if need[1] > held[1]:
        out.append((max(need[0], held[1]), need[1]))
    return [x for x in out if x[0] < x[1]]


def _sources(gap: Interval, holds: list, receiver: int) -> list[tuple[int, Interval]]:
    """Who sends the rows ``gap``: at each row still missing, the device holding it furthest on (the nearest
    to the receiver on a tie)."""
    out, pos = [], gap[0]
    while pos < gap[1]:
        best = None
        for d, (_, v) in enumerate(holds):
            if v is not None and v[0] <= pos < v[1]:
                key = (min(v[1], gap[1]), -abs(d - receiver))
                if best is None or key > best[0]:
                    best = (key, d)
        if best is None:
            raise PlanError(f"row {pos} is needed by device {receiver} and no device computed it")
        end = best[0][0]
        out.append((best[1], (pos, end)))
        pos = end
    return out


# ------------------------------------------------------------------------------------------------ tables
def segments(graph: TfliteGraph, t: Tiling) -> dict[str, bytes]:
    """The int8 segments: ``int8/s<k>.tflite`` per group, then one for the rest of the model (on the head)."""
    out = {}
    for g in t.groups:
        ops = [c.op for layer in t.layers[g.first:g.last + 1] for c in layer.ops]
        outputs = [t.layers[k].tensor for k in sorted(g.outputs)]
        out[f"int8/s{g.index}.tflite"] = cut_ops(graph, ops, f"t{g.index}", outputs)
    if t.suffix:
        out[f"int8/s{len(t.groups)}.tflite"] = cut_ops(graph, list(t.suffix), "suffix")
    return out


def rows_detail(graph: TfliteGraph, axis: int, ix: int, rows: int | None = None) -> dict:
    """The tensor as the multi-device tables describe it, or ``rows`` of it along the axis."""
    out = tensor_detail(graph, ix)
    if rows is not None:
        out["nbytes"] = out["nbytes"] // out["shape"][axis] * rows
        out["shape"][axis] = rows
    return out


def assemble(graph: TfliteGraph, axis: int, stages: list[dict], messages: list[tuple[int, Interval, int, int]],
             devices: list[dict], blobs: dict[str, str]) -> dict:
    """The tables from the ``stages`` and the ``messages`` (int8 tensor, rows, sender, receiver): one buffer per
    message, each stage's segment hash, the ranks' stages."""
    name = {ix: graph.tensors[ix].name for ix in range(len(graph.tensors))}
    for s in stages:
        s["int8_sha256"] = blobs[s["int8"]]
    buffers = {}
    for ix, rows, sender, receiver in messages:
        key = f"{name[ix]}@{rows[0]}:{rows[1]}>{receiver}"
        buffers[key] = {"tag": len(buffers), "tensor": name[ix], "rows": list(rows),
                        **rows_detail(graph, axis, ix, rows[1] - rows[0]), "sender": sender, "receivers": [receiver]}
    ranks = [{"rank": r, **dev, "stages": [s["index"] for s in stages if s["rank"] == r]}
             for r, dev in enumerate(devices)]
    model_in, model_out = graph.inputs[0], graph.outputs[0]
    return {
        "head": HEAD, "axis": axis,
        "input": {"name": name[model_in], **rows_detail(graph, axis, model_in)},
        "output": {"name": name[model_out], **rows_detail(graph, axis, model_out), "rank": HEAD},
        "ranks": ranks, "stages": stages, "buffers": buffers,
    }


def tables(graph: TfliteGraph, t: Tiling, devices: list[dict], blobs: dict[str, str]) -> dict:
    """The rank program's tables (``distributed/rank``): ``devices`` per rank ``{key, device, host, slots}``,
    ``blobs`` the sha256 of each segment file."""
    name = {ix: graph.tensors[ix].name for ix in range(len(graph.tensors))}
    model_in, model_out = graph.inputs[0], graph.outputs[0]

    def detail(ix: int, rows: int | None = None) -> dict:
        return rows_detail(graph, t.axis, ix, rows)

    def tensor_of(layer: int) -> int:
        return model_in if layer < 0 else t.layers[layer].tensor

    stages = []
    for g in t.groups:
        x = tensor_of(g.first - 1)
        stages.append({
            "index": g.index, "rank": g.device, "int8": f"int8/s{g.index}.tflite", "inputs": [name[x]],
            "outputs": [name[t.layers[k].tensor] for k in sorted(g.outputs)],
            "layers": [g.first, g.last],
            "tile": {"inputs": {name[x]: {"rows": list(g.tile.rows),
                                          "shape": detail(x, g.tile.rows[1] - g.tile.rows[0])["shape"]}},
                     "outputs": {name[t.layers[k].tensor]: {
                         "offset": g.tile.offsets[k - g.first], "keep": list(g.tile.valid[k - g.first]),
                         "shape": detail(t.layers[k].tensor, g.tile.heights[k - g.first])["shape"]}
                         for k in sorted(g.outputs)}},
        })
    end = t.layers[-1].tensor
    if t.suffix:
        stages.append({"index": len(stages), "rank": HEAD, "int8": f"int8/s{len(stages)}.tflite", "inputs": [name[end]],
                       "outputs": [name[model_out]], "layers": [],
                       "tile": {"inputs": {name[end]: {"rows": [0, graph.tensors[end].shape[t.axis]],
                                                       "shape": detail(end)["shape"]}}, "outputs": {}}})
    return assemble(graph, t.axis, stages, [(tensor_of(m.layer), m.rows, m.sender, m.receiver) for m in t.messages],
                    devices, blobs)


def bytes_moved(table: dict) -> dict:
    """Application bytes by kind: the input scattered, rows exchanged inside the region, the region gathered."""
    first = table["input"]["name"]
    ends = next((set(s["inputs"]) for s in table["stages"] if not s["layers"]), set())  # the rest's inputs
    out = {"scatter": 0, "exchange": 0, "gather": 0}
    for b in table["buffers"].values():
        kind = "scatter" if b["tensor"] == first else "gather" if b["tensor"] in ends and b["receivers"] == [HEAD] \
            else "exchange"
        out[kind] += b["nbytes"]
    return out


def run_tables(table: dict, blob: dict[str, bytes], x: np.ndarray, interpreter) -> np.ndarray:
    """Every rank's stages in one process, in order, rows passed as the ranks pass them (verification only:
    ``interpreter(bytes)`` gives a LiteRT interpreter of a segment; its input is resized here)."""
    from edgeplan.distributed.rows import Rows, keep

    axis = table["axis"]
    store = [Rows(axis) for _ in table["ranks"]]
    store[table["head"]].add(table["input"]["name"], 0, x)
    waiting = list(table["buffers"].values())

    def deliver(rank: int, tensors) -> None:
        for b in [b for b in waiting if b["receivers"][0] == rank and b["tensor"] in tensors]:
            store[rank].add(b["tensor"], b["rows"][0], store[b["sender"]].take(b["tensor"], *b["rows"]))
            waiting.remove(b)

    result = None
    for s in table["stages"]:
        me = store[s["rank"]]
        deliver(s["rank"], s["inputs"])
        it = interpreter(blob[s["int8"]])
        tile = s["tile"]
        for d in it.get_input_details():
            it.resize_tensor_input(d["index"], tile["inputs"][d["name"]]["shape"])
        it.allocate_tensors()
        for d in it.get_input_details():
            it.set_tensor(d["index"], me.take(d["name"], *tile["inputs"][d["name"]]["rows"]))
        it.invoke()
        for d in it.get_output_details():
            v = it.get_tensor(d["index"]).copy()
            if d["name"] in tile["outputs"]:
                o = tile["outputs"][d["name"]]
                me.add(d["name"], o["keep"][0], keep(v, o, axis))
            elif d["name"] == table["output"]["name"]:
                result = v
    if result is None:  # no suffix: the head assembles the region's output
        name = table["output"]["name"]
        deliver(table["head"], [name])
        result = store[table["head"]].take(name, 0, table["output"]["shape"][axis])
    return result


def _built_once(deterministic: bool):
    """A segment -> interpreter factory that builds each segment once, for every sample (building is the cost)."""
    from edgeplan.quantize import litert

    built: dict[bytes, object] = {}

    def get(data: bytes) -> object:
        if data not in built:
            built[data] = litert.interpreter(data, deterministic=deterministic)
        return built[data]

    return get


def verify(table: dict, blob: dict[str, bytes], model: bytes, *, samples: int = 2, seed: int = 0) -> dict:
    """The tiles run as the ranks run them (``run_tables``) against the whole int8 model, on seeded random
    inputs, with the builtin kernels and with XNNPACK: the fraction of outputs identical, per kernel set."""
    from edgeplan.quantize import litert

    rng = np.random.default_rng(seed)
    dt = np.dtype(table["input"]["dtype"].lower())
    xs = [litert.random_value(table["input"]["shape"], dt, rng) for _ in range(samples)]
    out = {}
    for kernels, deterministic in (("builtin", True), ("xnnpack", False)):
        whole = litert.interpreter(model, deterministic=deterministic)
        segment = _built_once(deterministic)
        same = sum(bool(np.array_equal(run_tables(table, blob, x, segment), litert.run(whole, x))) for x in xs)
        out[f"int8_identical_{kernels}"] = same / samples
    return out


def split(root: Path, plan: list[tuple[Interval, ...]], devices: list[Device], out: Path, *, axis: int = 1,
          samples: int = 2, seed: int = 0, extra: dict | None = None, region=None, paths=None) -> dict:
    """Write the tiles of ``plan`` for the artifact ``root`` (``model_int8.tflite``) to ``out``: one MPI rank per
    platform device in ``devices`` (the order of the plan's partitions; the first is the head). ``plan`` is per
    layer of the chain region, or, given ``paths`` (``plan/spatial/paths``), per layer of that multi-path region
    (``surgery/spatial_paths``). Verified first in process — the tiles as the ranks run them identical to the whole
    int8 model with both kernel sets, and, given the float ``region`` the plan was made on (``plan/spatial/blocks``)
    or ``paths``, the float tiles equal to the whole float model up to rounding (``surgery/spatial_float.TOLERANCE``)
    — and nothing is written when they are not. Returns spatial.json's content (``extra`` merged in)."""
    t0 = time.perf_counter()
    int8 = (Path(root) / "model_int8.tflite").read_bytes()
    graph = TfliteGraph(int8)
    if len(devices) != len(plan[0]):
        raise PlanError(f"the plan splits each layer {len(plan[0])} ways, {len(devices)} devices given")
    if paths is not None:
        from edgeplan.surgery import spatial_paths as tiler
        t = tiler.tiling(graph, paths, plan, axis)
    else:
        tiler, t = None, tiling(graph, plan, axis)
    blob = (tiler.segments if tiler else segments)(graph, t)
    ranks = [{"key": f"{d.name}_{d.arch}", "device": d.name, "host": d.host, "slots": list(d.slots)} for d in devices]
    table = (tiler.tables if tiler else tables)(graph, t, ranks, {k: hashlib.sha256(v).hexdigest()
                                                                  for k, v in blob.items()})
    t_tiles = time.perf_counter() - t0
    check = verify(table, blob, int8, samples=samples, seed=seed)
    if min(check.values()) < 1.0:
        raise PlanError(f"the tiles do not give the int8 model's outputs ({check}); nothing written to {out}")
    if region is not None or paths is not None:
        from edgeplan.surgery import spatial_float

        floats = spatial_float.verify(Path(root) / "model.onnx", paths if paths is not None else region, t, graph,
                                      samples=samples, seed=seed)
        if floats["float_max_abs_diff"] > spatial_float.TOLERANCE * floats["float_max_abs_value"]:
            raise PlanError(f"the float tiles differ from the whole float model by up to "
                            f"{floats['float_max_abs_diff']:.3g} (values up to {floats['float_max_abs_value']:.3g}): "
                            f"more than rounding; nothing written to {out}")
        check = {**check, **floats}
    with staged_dir(out) as scratch:
        (scratch / "int8").mkdir()
        for name, data in blob.items():
            (scratch / name).write_bytes(data)
        write_json_atomic(scratch / "tables.json", table)
        (scratch / "rankfile").write_text("".join(f"rank {r}={d.host} slot={','.join(map(str, d.slots))}\n"
                                                  for r, d in enumerate(devices)))
        slots: dict[str, int] = {}
        for d in devices:
            slots[d.host] = slots.get(d.host, 0) + len(d.slots)
        (scratch / "hostfile").write_text("".join(f"{h} slots={n}\n" for h, n in slots.items()))
        summary = {
            "model": {"int8_sha256": hashlib.sha256(int8).hexdigest()}, "axis": "H" if axis == 1 else "W",
            "plan": [[list(x) for x in p] for p in plan], "ranks": len(devices), "stages": len(table["stages"]),
            "groups_per_rank": [sum(1 for g in t.groups if g.device == r) for r in range(len(devices))],
            "buffers": len(table["buffers"]), "bytes": bytes_moved(table), "verify": check,
            "tiles_s": round(t_tiles, 3), "total_s": round(time.perf_counter() - t0, 3), **(extra or {}),
        }
        write_json_atomic(scratch / "spatial.json", summary)
    return summary
