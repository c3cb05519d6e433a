"""Branches and layers of an operator DAG (Parallax §3.1, Algorithms 3-4 of Appendix C), in O(|V| + |E|).

The DAG's edges are the non-constant tensors between operators (a weight is not a dependency). Each node is
classified by its in- and out-degree over distinct neighbours: Sequential (at most one of each), Splitter
(one in, several out), Merger (several in, at most one out), Split-Merge (several of both). Control-flow
operators (If, Loop, Scan, While) are Split-Merge units whatever their degree: they run alone. An indivisible
region (an Edge TPU region: the compiler runs it as one custom op) is contracted to one unit first and is a
branch of its own.

A *branch* is a maximal chain of Sequential units, each the only successor of the one before; Algorithm 3 as
printed never places Splitter, Merger or Split-Merge nodes in any branch, so each becomes a one-node
synchronisation branch here (``kind`` says which). *Layers* group branches by dependency depth (Algorithm 4's
waves of Kahn's topological sort): every branch of a layer depends only on branches of earlier layers, so the
branches of one layer can run at once.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass

from edgeplan.errors import EdgeplanError

CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "IF", "WHILE", "CALL_ONCE"})  # ONNX and TFLite names


class GraphStructureError(EdgeplanError):
    """The graph cannot be split into branches (a region that is not convex, an edge against the order)."""


@dataclass(frozen=True)
class Dag:
    """Operators in a topological order: name, op type, distinct predecessors over non-constant tensors, and
    the indivisible region each belongs to (None: a CPU operator of its own)."""

    names: tuple[str, ...]
    ops: tuple[str, ...]
    preds: tuple[tuple[int, ...], ...]
    regions: tuple[int | None, ...]

    def __post_init__(self):
        for v, ps in enumerate(self.preds):
            bad = [p for p in ps if not 0 <= p < v]
            if bad:
                raise GraphStructureError(f"node {v} ({self.names[v]}) depends on {bad}, not earlier nodes: "
                                          "the operators are not in a topological order")


@dataclass(frozen=True)
class Branch:
    index: int
    nodes: tuple[int, ...]  # DAG nodes, in order
    kind: str  # chain | splitter | merger | split-merge | control | region
    preds: tuple[int, ...]  # branches it depends on


@dataclass(frozen=True)
class Structure:
    branches: tuple[Branch, ...]
    layers: tuple[tuple[int, ...], ...]  # branch indices per layer

    @property
    def parallel_layers(self) -> int:
        return sum(1 for layer in self.layers if len(layer) > 1)

    @property
    def max_branches(self) -> int:
        return max((len(layer) for layer in self.layers), default=0)


def from_tflite(graph, regions: dict[int, int] | None = None) -> Dag:
    """A ``TfliteGraph``'s operators (``regions``: op index -> region id, e.g. ops inside an Edge TPU custom op)."""
    producer = graph.producer
    preds = tuple(tuple(sorted({producer[t] for t in graph.activations(op) if t in producer})) for op in graph.ops)
    return Dag(tuple(graph.tensors[op.outputs[0]].name if op.outputs else f"op{op.index}" for op in graph.ops),
               tuple(op.name for op in graph.ops), preds,
               tuple((regions or {}).get(op.index) for op in graph.ops))


def from_onnx(view) -> Dag:
    """A ``GraphView``'s nodes (ONNX keeps them in a topological order); initializers are not dependencies."""
    nodes = list(view.graph.node)
    consts = set(view.initializers)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    preds = tuple(tuple(sorted({producer[x] for x in n.input if x and x not in consts and x in producer}))
                  for n in nodes)
    return Dag(tuple(n.name or n.output[0] for n in nodes), tuple(n.op_type for n in nodes), preds,
               (None,) * len(nodes))


def structure(dag: Dag) -> Structure:
    units, upreds = _units(dag)
    n = len(units)
    usuccs: list[set[int]] = [set() for _ in range(n)]
    for u, ps in enumerate(upreds):
        for p in ps:
            usuccs[p].add(u)
    kinds = [_kind(dag, units[u], len(upreds[u]), len(usuccs[u])) for u in range(n)]
    branch_of = [0] * n
    members: list[list[int]] = []
    for u in range(n):  # units in a topological order: a chain's predecessor is already placed
        (p,) = upreds[u] if len(upreds[u]) == 1 else (None,)
        if kinds[u] == "chain" and p is not None and kinds[p] == "chain" and len(usuccs[p]) == 1:
            branch_of[u] = branch_of[p]
            members[branch_of[u]].append(u)
        else:
            branch_of[u] = len(members)
            members.append([u])
    bpreds = [sorted({branch_of[p] for u in us for p in upreds[u]} - {b}) for b, us in enumerate(members)]
    depth = [0] * len(members)
    for b, ps in enumerate(bpreds):  # branches are numbered in a topological order too
        depth[b] = 1 + max((depth[p] for p in ps), default=-1)
    layers: list[list[int]] = [[] for _ in range(max(depth, default=-1) + 1)]
    for b, d in enumerate(depth):
        layers[d].append(b)
    branches = tuple(Branch(b, tuple(v for u in us for v in units[u]), kinds[us[0]], tuple(bpreds[b]))
                     for b, us in enumerate(members))
    return Structure(branches, tuple(tuple(layer) for layer in layers))


def _units(dag: Dag) -> tuple[list[list[int]], list[set[int]]]:
    """Nodes grouped into units — one per region, else one per node — in a topological order of the
    contracted graph, with each unit's predecessor units. A region that a path leaves and re-enters makes a
    cycle: refused, naming it."""
    groups: list[list[int]] = []
    group_of = [0] * len(dag.names)
    first: dict[int, int] = {}
    for v, r in enumerate(dag.regions):
        if r is not None and r in first:
            group_of[v] = first[r]
            groups[first[r]].append(v)
            continue
        if r is not None:
            first[r] = len(groups)
        group_of[v] = len(groups)
        groups.append([v])
    preds: list[set[int]] = [set() for _ in groups]
    for v, ps in enumerate(dag.preds):
        preds[group_of[v]] |= {group_of[p] for p in ps} - {group_of[v]}
    succs: list[list[int]] = [[] for _ in groups]
    for g, ps in enumerate(preds):
        for p in ps:
            succs[p].append(g)
    waiting = [len(ps) for ps in preds]
    ready = collections.deque(g for g, w in enumerate(waiting) if w == 0)
    order: list[int] = []
    while ready:  # Kahn's algorithm
        g = ready.popleft()
        order.append(g)
        for h in succs[g]:
            waiting[h] -= 1
            if waiting[h] == 0:
                ready.append(h)
    if len(order) != len(groups):
        stuck = next(g for g in range(len(groups)) if waiting[g])
        raise GraphStructureError(f"region of {dag.names[groups[stuck][0]]} is not convex: a path leaves it and "
                                  "comes back, so it cannot run as one unit")
    rank = {g: k for k, g in enumerate(order)}
    return [groups[g] for g in order], [{rank[p] for p in preds[g]} for g in order]


def _kind(dag: Dag, nodes: list[int], d_in: int, d_out: int) -> str:
    if dag.regions[nodes[0]] is not None:
        return "region"
    if dag.ops[nodes[0]] in CONTROL_FLOW:
        return "control"
    if d_in <= 1 and d_out <= 1:
        return "chain"
    if d_in <= 1:
        return "splitter"
    return "merger" if d_out <= 1 else "split-merge"


def tflite_flops(graph) -> list[int]:
    """FLOPs per operator of a ``TfliteGraph`` by Parallax's Table 8 (Appendix A): convolutions and matrix
    products 2 x MACs (a depthwise convolution's MACs, not the table's C_in x C_out); pooling H_out x W_out x
    K_h x K_w (x channels); reductions their input size; reshapes, slices, transposes, concatenations 0;
    every other operator (element-wise) its output size."""
    out = []
    for op, macs in zip(graph.ops, graph.op_macs):
        size = sum(_numel(graph.tensors[o].shape) for o in op.outputs)
        if macs:
            out.append(2 * macs)
        elif op.name in ("AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D"):
            opts = op.builtin_options
            out.append(size * getattr(opts, "filterHeight", 1) * getattr(opts, "filterWidth", 1))
        elif op.name in ("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD"):
            out.append(_numel(graph.tensors[op.inputs[0]].shape))
        elif op.name in _NO_FLOPS:
            out.append(0)
        else:
            out.append(size)
    return out


_NO_FLOPS = frozenset({"RESHAPE", "SQUEEZE", "EXPAND_DIMS", "SLICE", "STRIDED_SLICE", "TRANSPOSE", "CONCATENATION",
                       "PACK", "UNPACK", "SPLIT", "SPLIT_V", "GATHER", "PAD", "PADV2", "QUANTIZE", "DEQUANTIZE"})


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= max(1, d)
    return n


def refine(s: Structure, flops: list[int], min_nodes: int = 3, beta: float = 1.5
           ) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Parallax's refinement (§3.1): per layer, the tasks its branches run as — branch groups, one worker each —
    so that every task has more than ``min_nodes - 1`` operators and the heaviest task has at most ``beta`` x the
    FLOPs of the lightest. A failing branch is never dropped: the lightest failing task joins the lightest other
    task until every task passes or one is left (the layer then runs as one task, in order)."""
    out = []
    for layer in s.layers:
        tasks = [[b] for b in layer]
        work = [sum(flops[v] for v in s.branches[b].nodes) for b in layer]
        nodes = [len(s.branches[b].nodes) for b in layer]
        while len(tasks) > 1:
            heaviest = max(work)
            failing = [t for t in range(len(tasks)) if nodes[t] < min_nodes or work[t] * beta < heaviest]
            if not failing:
                break
            a = min(failing, key=lambda t: (work[t], nodes[t]))
            b = min((t for t in range(len(tasks)) if t != a), key=lambda t: (work[t], nodes[t]))
            tasks[b] += tasks[a]
            work[b] += work[a]
            nodes[b] += nodes[a]
            del tasks[a], work[a], nodes[a]
        out.append(tuple(tuple(sorted(t)) for t in tasks))
    return tuple(out)
