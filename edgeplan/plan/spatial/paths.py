"""Path analysis (ADaPS §4.2, Fig. 3): a multi-path partitionable region decomposed into single-entry, single-exit
sub-blocks, each one path of layers.

The region is every op, in the graph's topological order, that Table 2 partitions (Type 1 or 2, keeping the NCHW
layout) and whose computed inputs are the model's input or tensors the region computes; a constant ``Pad`` of the
spatial axes joins the Type 1 op that alone reads it (as in ``blocks.region``). Everything else — a Type 3 op, an
op the table does not know, and every op after one of them — runs on one device once the region's outputs (the
tensors it computes that something outside reads) are gathered. A branch that meets a Type 3 op ends there while
the other branches go on.

Layers are as in ``blocks``: a Type 1 op and the single-input Type 2 ops after it, along a tensor only they read.
A Type 2 op that joins several computed tensors of one shape (a residual ``Add``) is a layer of its own with the
identity window, reading each of them, and so is a Type 2 op whose input another layer's op reads too.

Sub-blocks follow §4.2's rules: a layer whose output several ops read (or the region gathers) ends its sub-block,
and each reader begins one (one per outgoing path); a layer reading several tensors (a merge) ends the sub-blocks
that lead to it and begins a new one. What is left are chains: within a sub-block each layer reads only the one
before it, which nothing else reads, so a sub-block is partitioned as ``search`` partitions a chain, with layer
fusion anywhere inside it and never across its boundary.

``search_paths`` plans the sub-blocks in topological order, each by ``search.search_network`` with its first
layer reading the partitions of the layers it reads (``cost.Joined`` for a merge), or the head's whole input. As in
the paper, the boundaries themselves are not optimised: a sub-block is planned given what the ones before it chose.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from edgeplan.errors import PlanError
from edgeplan.graph.model import GraphView
from edgeplan.plan.spatial.blocks import AXES, _pad, _work, window
from edgeplan.plan.spatial.cost import Device, Joined, Layer, LayerCost, Partition, source
from edgeplan.plan.spatial.intervals import Window
from edgeplan.plan.spatial.ops import TYPE1, TYPE2, onnx_type
from edgeplan.plan.spatial.search import Counters, search_network


@dataclass(frozen=True)
class PathLayer:
    layer: Layer
    nodes: tuple[str, ...]  # the ONNX nodes it runs, in order
    inputs: tuple[str, ...]  # the computed tensors it reads: the model's input or other layers' outputs
    output: str


@dataclass(frozen=True)
class SubBlock:
    layers: tuple[int, ...]  # indices into ``Paths.layers``: a chain, each reading the one before

    def entry(self, paths: Paths) -> tuple[str, ...]:
        return paths.layers[self.layers[0]].inputs

    def exit(self, paths: Paths) -> str:
        return paths.layers[self.layers[-1]].output


@dataclass(frozen=True)
class Paths:
    dim: str
    input: str  # the model's input, which the head holds
    layers: tuple[PathLayer, ...]  # in topological order
    blocks: tuple[SubBlock, ...]  # in topological order
    outputs: tuple[str, ...]  # the tensors gathered at the region's end
    reason: str  # what ends the region (the first op it leaves out, in topological order)

    def producer(self, tensor: str) -> int | None:
        """The layer that outputs ``tensor`` (None: the model's input)."""
        return next((i for i, x in enumerate(self.layers) if x.output == tensor), None)


def analyse(view: GraphView, dim: str = "H") -> Paths:
    """The region's layers and sub-blocks (module docstring)."""
    if dim not in AXES:
        raise PlanError(f"dimension {dim!r}: partition along H or W")
    first = view.input.name
    if len(view.shape(first)) != 4:
        raise PlanError(f"input {first!r} has shape {view.shape(first)}: spatial partitioning needs NCHW")
    if view.shape(first)[AXES[dim]] == 1:
        raise PlanError(f"input {first!r} is 1 wide along {dim}: nothing to split")
    nodes = view.graph.node

    def readers(tensor: str) -> list[int]:
        return view.consumers.get(tensor, [])

    def row_bytes(name: str) -> int:
        shape = view.shape(name)
        return math.prod(shape) // shape[AXES[dim]]

    inside = {first}  # tensors the region holds
    padded: dict[str, tuple[str, str, tuple[int, int]]] = {}  # a joining Pad's output -> (node, its input, pads)
    layers: list[dict] = []
    open_at: dict[str, int] = {}  # a layer's current output -> the layer (a Type 2 op reading it may join it)
    reason = "the model's output"

    def leave(label: str, why: str) -> None:
        nonlocal reason
        if reason == "the model's output":
            reason = f"{label} {why}"

    for j, node in enumerate(nodes):
        computed = [x for x in node.input if x and x not in view.initializers]
        if not computed or any(x not in inside for x in computed):
            continue  # reads something the region does not compute: outside, like all after it
        label = f"{node.op_type} {node.name!r}"
        kind = onnx_type(node.op_type)
        if node.op_type == "Pad" and (pads := _pad(node, view, dim)) is not None and computed[0] not in padded:
            after = readers(node.output[0])
            if len(after) == 1 and onnx_type(nodes[after[0]].op_type) == TYPE1:
                padded[node.output[0]] = (node.name, computed[0], pads)
                inside.add(node.output[0])
                continue
        if kind is None:
            leave(label, "is not in ADaPS Table 2")
            continue
        if kind not in (TYPE1, TYPE2):
            leave(label, "is Type 3")
            continue
        out = node.output[0]
        if len(view.shape(out)) != 4:
            leave(label, "does not keep the NCHW layout")
            continue
        if any(x in padded for x in computed) and kind != TYPE1:
            leave(label, f"follows Pad {padded[computed[0]][0]!r}")
            continue
        if len(computed) > 1 and any(view.shape(x) != view.shape(out) for x in computed):
            leave(label, "joins tensors of different shapes")
            continue
        work = _work(node, view, view.node_macs[j])
        x = computed[0]
        joins = (kind == TYPE2 and len(computed) == 1 and x in open_at and len(readers(x)) == 1)
        if joins:
            k = open_at.pop(x)
            layers[k]["macs"] += work
            layers[k]["nodes"].append(node.name)
            layers[k]["output"] = out
        else:
            if kind == TYPE1:
                w, source, lead = window(node, view, dim), x, []
                if x in padded:  # the Pad's rows become the window's padding
                    name, source, (begin, end) = padded[x]
                    w = Window(w.kernel, w.stride, w.dilation, w.pad_begin + begin, w.pad_end + end,
                               w.in_size - begin - end, w.out_size)
                    lead = [name]
                ins = [source]
            else:
                w, source, lead, ins = Window.identity(view.shape(x)[AXES[dim]]), x, [], computed
            layers.append({"name": node.name or out, "window": w, "macs": work, "in_row": row_bytes(source),
                           "nodes": [*lead, node.name], "inputs": tuple(ins), "output": out})
            k = len(layers) - 1
        open_at[out] = k
        inside.add(out)
    if not layers:
        raise PlanError(f"no layer of the model can be partitioned along {dim}: {reason}")
    made = [PathLayer(Layer(x["name"], x["window"], x["macs"], x["in_row"], row_bytes(x["output"])),
                      tuple(x["nodes"]), x["inputs"], x["output"]) for x in layers]
    for x in made:
        if x.layer.out_size < 2:
            raise PlanError(f"layer {x.layer.name!r} is {x.layer.out_size} wide along {dim}: nothing to split")
    region_nodes = {n for x in made for n in x.nodes}
    outputs = tuple(t for t in (x.output for x in made)
                    if t == view.output.name or any(nodes[r].name not in region_nodes for r in readers(t)))
    return Paths(dim, first, tuple(made), _sub_blocks(made, set(outputs), readers), outputs, reason)


def _sub_blocks(layers: list[PathLayer], gathered: set[str], readers) -> tuple[SubBlock, ...]:
    """§4.2's decomposition: a layer continues the sub-block of the layer it reads when it reads only that one,
    and nothing else reads it (nor gathers it)."""
    where: dict[str, int] = {}  # a layer's output -> the sub-block it ends
    blocks: list[list[int]] = []
    for i, x in enumerate(layers):
        (src,) = x.inputs if len(x.inputs) == 1 else (None,)
        b = where.get(src) if src is not None else None
        if b is not None and len(readers(src)) == 1 and src not in gathered:
            blocks[b].append(i)
            del where[src]
        else:
            blocks.append([i])
            b = len(blocks) - 1
        where[x.output] = b
    return tuple(SubBlock(tuple(b)) for b in blocks)


@dataclass(frozen=True)
class PathPlan:
    partitions: tuple[Partition, ...]  # per layer of ``Paths.layers``
    score: float  # eq. (12) summed over the sub-blocks, seconds
    counters: Counters
    seconds: float  # search time (process CPU)


def entry(paths: Paths, block: SubBlock, planned: dict[int, Partition], devices: tuple[Device, ...]) -> Partition:
    """Who holds what ``block``'s first layer reads: each input's producing layer's partition (planned before it),
    or the head, which holds the model's input; a merge's several, ``Joined``."""
    first = paths.layers[block.layers[0]]
    held = []
    for t in first.inputs:
        k = paths.producer(t)
        held.append(source(LayerCost(first.layer, devices)) if k is None else planned[k])
    return held[0] if len(held) == 1 else Joined(held)


def search_paths(paths: Paths, devices: tuple[Device, ...], threshold: float, **options) -> PathPlan:
    """Every sub-block searched as a chain (``search_network`` with ``options``), in topological order."""
    t0 = time.process_time()
    planned: dict[int, Partition] = {}
    score, counters = 0.0, Counters()
    for block in paths.blocks:
        plan = search_network([paths.layers[i].layer for i in block.layers], devices, threshold,
                              entry=entry(paths, block, planned, devices), **options)
        planned.update(zip(block.layers, plan.partitions))
        score += plan.score
        for k in ("scored", "memo_hits", "pruned"):
            setattr(counters, k, getattr(counters, k) + getattr(plan.counters, k))
    return PathPlan(tuple(planned[i] for i in range(len(paths.layers))), score, counters,
                    time.process_time() - t0)
