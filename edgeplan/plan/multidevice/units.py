"""Units: the groups of ONNX nodes the int8 model runs as its own ops (AutoDiCE maps layers; the converter fuses
a convolution, its batch norm and its activation into one CONV_2D, so those layers can only move together).

Every node output is matched to the int8 tensor holding it (``quantize.match.match_tensors``); a tensor with
no match was fused away, so its producer and its consumers are one unit. A unit's int8 ops are those its
matched outputs depend on and its inputs do not (the converter's own ops — a transpose before a flatten —
fall in the unit that reads their result). Every op lands in exactly one unit, or the model is refused.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from edgeplan.errors import SpecError
from edgeplan.graph.model import GraphView
from edgeplan.quantize.match import match_tensors
from edgeplan.quantize.tflite_graph import TfliteGraph


@dataclass(frozen=True)
class Unit:
    index: int
    nodes: tuple[int, ...]  # ONNX node indices, in the model's order
    names: tuple[str, ...]
    inputs: tuple[str, ...]  # ONNX tensors it reads from other units (or the model's input)
    outputs: tuple[str, ...]  # ONNX tensors other units (or the model's output) read
    ops: tuple[int, ...]  # int8 ops, ascending


@dataclass(frozen=True)
class Units:
    units: tuple[Unit, ...]
    of_node: dict[str, int]  # node name -> unit index
    int8_tensor: dict[str, int]  # ONNX tensor crossing between units -> int8 tensor index
    depends: tuple[int, ...]  # per unit, bitset of the units it reads from directly
    # (inputs, the whole float model's output for them): matching's own runs, a split's verification reference
    reference: tuple[np.ndarray, np.ndarray] | None = field(default=None, compare=False, repr=False)


def find(model: onnx.ModelProto, tflite: TfliteGraph, xs: np.ndarray, *, min_cosine: float = 0.5,
         folder: Path | None = None) -> Units:
    """The units of ``model`` (``folder``: where its external data is, as ``quantize.match.match_tensors``)."""
    view = GraphView(model)
    nodes = view.graph.node
    names = [n.name or f"node{i}" for i, n in enumerate(nodes)]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise SpecError(f"node name {dup!r} appears twice in the model: a mapping could not name it")
    matched, output = match_tensors(model, tflite, xs, min_cosine=min_cosine, folder=folder)
    parent = list(range(len(nodes)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for t, p in view.producer.items():
        if t not in matched:
            for c in view.consumers.get(t, []):
                parent[root(c)] = root(p)
    groups: dict[int, list[int]] = {}
    for i in range(len(nodes)):
        groups.setdefault(root(i), []).append(i)
    order = sorted(groups.values(), key=lambda g: g[0])
    of_index = {i: k for k, g in enumerate(order) for i in g}
    units, crossing, depends = [], {}, []
    claimed: dict[int, int] = {}
    for k, group in enumerate(order):
        members = set(group)
        ins = sorted({x for i in group for x in nodes[i].input
                      if x and x not in view.initializers and view.producer.get(x, -1) not in members},
                     key=lambda x: view.producer.get(x, -1))
        outs = sorted({o for i in group for o in nodes[i].output if o and (
            o == view.output.name or any(c not in members for c in view.consumers.get(o, [])))},
            key=lambda x: view.producer[x])
        for x in (*ins, *outs):
            if x not in matched:
                raise SpecError(f"tensor {x!r} between units (around node {names[group[0]]!r}) has no int8 tensor")
            crossing[x] = matched[x]
        bits = 0
        for o in outs:
            bits |= tflite.prefix_ops(matched[o])
        for x in ins:
            bits &= ~tflite.prefix_ops(matched[x])
        ops = tflite.members(bits)
        for op in ops:
            if op in claimed:
                raise SpecError(f"int8 op {op} ({tflite.ops[op].name}) falls in units {claimed[op]} and {k} "
                                f"(nodes {names[order[claimed[op]][0]]!r} and {names[group[0]]!r})")
            claimed[op] = k
        dep = 0
        for x in ins:
            if x in view.producer:
                dep |= 1 << of_index[view.producer[x]]
        depends.append(dep)
        units.append(Unit(k, tuple(group), tuple(names[i] for i in group), tuple(ins), tuple(outs), tuple(ops)))
    missing = [op for op in range(len(tflite.ops)) if op not in claimed]
    if missing:
        raise SpecError(f"int8 ops {missing[:5]} belong to no unit: the int8 model does not follow the ONNX graph")
    return Units(tuple(units), {names[i]: of_index[i] for i in range(len(nodes))}, crossing, tuple(depends),
                 reference=(np.asarray(xs), output))
