"""Candidate partition points (SwapLess §IV): tensors whose ancestors form a prefix that is joined to the
rest of the graph by that one tensor alone ("separate the graph along a single edge").

A cut at tensor t puts every node that t depends on (its ancestors) in the prefix and every other node
in the suffix. It is a single-tensor cut when t is the only non-constant tensor that crosses from the
prefix to the suffix or to the graph outputs. Such cuts are totally ordered by ancestry, so the list
is a chain in topological order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from edgeplan.graph.model import GraphView


@dataclass(frozen=True)
class Candidate:
    tensor: str
    node_index: int  # producer node, -1 for the graph input
    node_name: str
    shape: tuple[int, ...]
    prefix_macs: int
    prefix_param_bytes: int
    boundary_bytes: int  # int8: one byte per element


def single_tensor_cuts(view: GraphView) -> list[Candidate]:
    """Interior single-tensor cuts of the graph, in topological order (input and output excluded)."""
    g = view.graph
    out_name = view.output.name
    edges: list[tuple[int, int, str]] = []  # (producer, consumer, tensor); producer -1 is the input
    for j, n in enumerate(g.node):
        for x in n.input:
            if not x or x in view.initializers:
                continue
            edges.append((view.producer.get(x, -1), j, x))
    node_macs = view.node_macs
    node_params = view.node_param_bytes
    result = []
    for t, p in sorted(view.producer.items(), key=lambda kv: kv[1]):
        if t == out_name:
            continue
        a = view.ancestors[p]
        if any(((a >> u) & 1 if u >= 0 else True) and not (a >> v) & 1 and x != t for u, v, x in edges):
            continue
        # No graph output other than t may be produced inside the prefix.
        if (a >> view.producer[out_name]) & 1:
            continue
        members = [i for i in range(len(g.node)) if (a >> i) & 1]
        shape = view.shape(t)
        result.append(
            Candidate(
                tensor=t,
                node_index=p,
                node_name=g.node[p].name,
                shape=shape,
                prefix_macs=sum(node_macs[i] for i in members),
                prefix_param_bytes=sum(node_params[i] for i in members),
                boundary_bytes=math.prod(shape),
            )
        )
    return result


def endpoints(view: GraphView) -> tuple[Candidate, Candidate]:
    """Point 0 (all-CPU: the cut at the model input) and point P (all-TPU: the cut at its output)."""
    in_shape = view.shape(view.input.name)
    out_shape = view.shape(view.output.name)
    first = Candidate(view.input.name, -1, "", in_shape, 0, 0, math.prod(in_shape))
    last = Candidate(
        view.output.name,
        view.producer[view.output.name],
        view.graph.node[view.producer[view.output.name]].name,
        out_shape,
        sum(view.node_macs),
        sum(view.node_param_bytes),
        math.prod(out_shape),
    )
    return first, last


def choose_evenly(candidates: list[Candidate], max_points: int | None, total_param_bytes: int) -> list[Candidate]:
    """At most ``max_points`` candidates, spread evenly by cumulative parameter bytes (DESIGN.md).

    Target k of m sits at k/(m+1) of the model's parameter bytes; each target takes the nearest
    candidate not yet taken. The result keeps topological order.
    """
    if max_points is None or len(candidates) <= max_points:
        return list(candidates)
    if max_points <= 0:
        return []
    chosen: set[int] = set()
    for k in range(1, max_points + 1):
        target = total_param_bytes * k / (max_points + 1)
        best = min(
            (i for i in range(len(candidates)) if i not in chosen),
            key=lambda i: (abs(candidates[i].prefix_param_bytes - target), i),
        )
        chosen.add(best)
    return [candidates[i] for i in sorted(chosen)]
