"""Parallax branches and layers (``graph/branches.py``) against a brute-force oracle on random DAGs, and on a
real int8 model."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeplan.graph.branches import Dag, GraphStructureError, from_tflite, refine, structure, tflite_flops


@st.composite
def dags(draw, max_nodes: int = 9):
    n = draw(st.integers(1, max_nodes))
    preds = tuple(tuple(sorted(draw(st.sets(st.integers(0, v - 1), max_size=3)))) if v else () for v in range(n))
    ops = tuple(draw(st.sampled_from(["CONV_2D", "ADD", "CONV_2D", "If"])) for _ in range(n))
    return Dag(tuple(f"n{v}" for v in range(n)), ops, preds, (None,) * n)


def _reaches(dag: Dag) -> list[set[int]]:
    """Every node's descendants, by brute force."""
    succ = [[w for w in range(len(dag.preds)) if v in dag.preds[w]] for v in range(len(dag.preds))]
    out = []
    for v in range(len(dag.preds)):
        seen, todo = set(), list(succ[v])
        while todo:
            w = todo.pop()
            if w not in seen:
                seen.add(w)
                todo += succ[w]
        out.append(seen)
    return out


@settings(max_examples=300, deadline=None, derandomize=True)
@given(dags())
def test_branches_partition_the_graph_into_maximal_chains_and_layers_into_independent_sets(dag):
    s = structure(dag)
    n = len(dag.names)
    succs = [{w for w in range(n) if v in dag.preds[w]} for v in range(n)]
    seq = [len(dag.preds[v]) <= 1 and len(succs[v]) <= 1 and dag.ops[v] != "If" for v in range(n)]
    # every node in exactly one branch
    assert sorted(v for b in s.branches for v in b.nodes) == list(range(n))
    for b in s.branches:
        if len(b.nodes) > 1:  # a chain: sequential nodes, each the only successor of the one before
            assert b.kind == "chain" and all(seq[v] for v in b.nodes)
            assert all(succs[a] == {c} and dag.preds[c] == (a,) for a, c in zip(b.nodes, b.nodes[1:]))
        elif not seq[b.nodes[0]]:  # Splitter / Merger / Split-Merge / control flow: a sync unit alone
            assert b.kind in ("splitter", "merger", "split-merge", "control")
    # maximal: no two chains could be joined end to start
    first = {b.nodes[0]: b for b in s.branches}
    for b in s.branches:
        end = b.nodes[-1]
        if b.kind == "chain" and len(succs[end]) == 1:
            (nxt,) = succs[end]
            other = first.get(nxt)
            assert not (other is not None and other.kind == "chain" and dag.preds[nxt] == (end,)), (b, other)
    # layers: each branch after all it depends on, as early as it can be; one layer's branches independent
    layer_of = {b: k for k, layer in enumerate(s.layers) for b in layer}
    branch_of = {v: b.index for b in s.branches for v in b.nodes}
    for b in s.branches:
        deps = {branch_of[p] for v in b.nodes for p in dag.preds[v]} - {b.index}
        assert set(b.preds) == deps
        assert layer_of[b.index] == 1 + max((layer_of[d] for d in deps), default=-1)
    reach = _reaches(dag)
    for layer in s.layers:
        for a, c in itertools.combinations(layer, 2):
            assert not any(w in reach[v] for v in s.branches[a].nodes for w in s.branches[c].nodes)
            assert not any(w in reach[v] for v in s.branches[c].nodes for w in s.branches[a].nodes)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(dags(max_nodes=12), st.lists(st.integers(0, 1000), min_size=12, max_size=12),
       st.sampled_from([1.2, 1.5, 3.0]), st.integers(1, 4))
def test_refinement_keeps_every_branch_and_leaves_balanced_tasks_or_one(dag, flops, beta, min_nodes):
    s = structure(dag)
    tasks = refine(s, flops, min_nodes, beta)
    assert len(tasks) == len(s.layers)
    for layer, ts in zip(s.layers, tasks):
        assert sorted(b for t in ts for b in t) == sorted(layer)  # a failing branch shares a task, never dropped
        if len(ts) > 1:
            work = [sum(flops[v] for b in t for v in s.branches[b].nodes) for t in ts]
            assert all(sum(len(s.branches[b].nodes) for b in t) >= min_nodes for t in ts)
            assert max(work) <= beta * min(work)


def test_refinement_joins_a_light_branch_to_the_lightest_other():
    # one splitter feeding three chains of 3 operators each, merged at the end
    preds = ((), (0,), (1,), (2,), (0,), (4,), (5,), (0,), (7,), (8,), (3, 6, 9))
    dag = Dag(tuple(f"n{v}" for v in range(11)), ("CONV_2D",) * 11, preds, (None,) * 11)
    s = structure(dag)
    assert [len(layer) for layer in s.layers] == [1, 3, 1]
    flops = [0, 40, 30, 30, 30, 30, 30, 4, 3, 3, 0]  # chains of 100, 90 and 10 FLOPs
    assert refine(s, flops)[1] == ((1,), (2, 3))
    assert refine(s, flops, beta=20.0)[1] == ((1,), (2,), (3,))
    assert refine(s, flops, min_nodes=4)[1] == ((1, 2, 3),)


def test_a_region_is_one_branch_and_a_non_convex_one_is_refused():
    # 0 -> {1, 2} -> 3; region {1, 2}? not connected to each other, but nothing leaves and re-enters: fine
    dag = Dag(("a", "b", "c", "d"), ("CONV_2D",) * 4, ((), (0,), (0,), (1, 2)), (None, 7, 7, None))
    s = structure(dag)
    assert [(b.nodes, b.kind) for b in s.branches] == [((0,), "chain"), ((1, 2), "region"), ((3,), "chain")]
    assert s.layers == ((0,), (1,), (2,))
    # 0 -> 1 -> 2 with 0 and 2 in one region: the path leaves it through 1 and comes back
    bad = Dag(("a", "b", "c"), ("CONV_2D",) * 3, ((), (0,), (1,)), (5, None, 5))
    with pytest.raises(GraphStructureError, match="region of a is not convex"):
        structure(bad)


def test_operators_out_of_order_are_refused():
    with pytest.raises(GraphStructureError, match=r"node 0 \(a\) depends on \[1\]"):
        Dag(("a", "b"), ("ADD", "ADD"), ((1,), ()), (None, None))


def test_squeezenet_fire_modules_are_parallel_layers_of_two_branches(compiled):
    """SqueezeNet int8: each of its 8 fire modules expands a squeeze into a 1x1 and a 3x3 path side by side."""
    from edgeplan.quantize.tflite_graph import TfliteGraph

    d, _, _ = compiled("light_squeezenet")
    g = TfliteGraph((d / "model_int8.tflite").read_bytes())
    s = structure(from_tflite(g))
    assert sum(len(b.nodes) for b in s.branches) == len(g.ops)
    assert s.max_branches == 2 and s.parallel_layers == 8
    assert {b.kind for b in s.branches} >= {"chain", "splitter", "merger"}
    flops = tflite_flops(g)
    assert sum(flops) > 2 * sum(g.op_macs) - 1 and all(f >= 0 for f in flops)
    tasks = refine(s, flops)
    assert sum(1 for ts in tasks if len(ts) > 1) <= s.parallel_layers
