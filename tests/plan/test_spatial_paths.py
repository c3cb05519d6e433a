"""Path analysis (ADaPS §4.2): multi-path regions decomposed into single-entry, single-exit chains of layers,
checked against a brute-force decomposition of random residual graphs and on real ones."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeplan.graph.ingest import canonicalise
from edgeplan.graph.model import GraphView
from edgeplan.plan.spatial.blocks import region
from edgeplan.plan.spatial.cost import Device, Joined, LayerCost
from edgeplan.plan.spatial.intervals import missing
from edgeplan.plan.spatial.paths import Paths, analyse, entry, search_paths
from edgeplan.plan.spatial.search import search_network
from edgeplan.zoo import alexnet, tiny


def _model(nodes, inits, out: str, shape=(1, 4, 8, 8)) -> GraphView:
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return GraphView(canonicalise(m, source="g"))


def _conv(rng, name: str, x: str, y: str, inits: list, k: int = 3, c: int = 4):
    inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (c, 4, k, k)).astype(np.float32), f"{name}.w"))
    return helper.make_node("Conv", [x, f"{name}.w"], [y], name=name, pads=[k // 2] * 4)


def _oracle(p: Paths, readers) -> set[tuple[int, ...]]:
    """Sub-blocks by their definition: cut every edge between layers where the producer's output has more than
    one reader or is gathered, or the consumer reads more than one tensor; the chains left are the sub-blocks."""
    out_of = {x.output: i for i, x in enumerate(p.layers)}
    succ: dict[int, int] = {}
    for i, x in enumerate(p.layers):
        if len(x.inputs) == 1 and x.inputs[0] in out_of:
            src = x.inputs[0]
            if len(readers(src)) == 1 and src not in p.outputs:
                succ[out_of[src]] = i
    heads = set(range(len(p.layers))) - set(succ.values())
    chains = set()
    for h in heads:
        chain = [h]
        while chain[-1] in succ:
            chain.append(succ[chain[-1]])
        chains.add(tuple(chain))
    return chains


def _check_rules(p: Paths, view: GraphView) -> None:
    """Every layer in exactly one sub-block; inside a sub-block each layer reads only the one before, which
    nothing else reads; the decomposition is the oracle's."""
    readers = lambda t: view.consumers.get(t, [])  # noqa: E731
    assert sorted(i for b in p.blocks for i in b.layers) == list(range(len(p.layers)))
    for b in p.blocks:
        for a, c in zip(b.layers, b.layers[1:]):
            assert p.layers[c].inputs == (p.layers[a].output,) and len(readers(p.layers[a].output)) == 1
    assert {b.layers for b in p.blocks} == _oracle(p, readers)


def test_a_chain_is_one_sub_block_and_the_chain_region():
    view = GraphView(canonicalise(alexnet.model(), source="alexnet"))
    p, r = analyse(view, "H"), region(view, "H")
    assert [x.layer for x in p.layers] == list(r.layers) and [x.nodes for x in p.layers] == list(r.nodes)
    assert [b.layers for b in p.blocks] == [tuple(range(8))] and p.outputs == (r.output,) and p.reason == r.reason


def test_a_residual_block_splits_at_the_fork_and_the_merge():
    view = GraphView(canonicalise(tiny.model(), source="tiny"))
    p = analyse(view, "H")
    assert [x.layer.name for x in p.layers] == ["conv1", "conv2", "conv3", "conv4", "add", "pool", "conv5"]
    assert [b.layers for b in p.blocks] == [(0, 1), (2, 3), (4, 5, 6)]  # fork after conv2; the add merges
    add = p.layers[4]
    assert add.inputs == ("relu2.out", "conv4.out") and add.nodes == ("add", "relu4")
    assert add.layer.window.kernel == 1 and add.layer.window.in_size == 16  # a merge: the identity window
    assert p.outputs == ("relu5.out",) and "GlobalAveragePool 'gap' is Type 3" in p.reason
    assert p.blocks[1].entry(p) == ("relu2.out",) and p.blocks[2].entry(p) == ("relu2.out", "conv4.out")
    _check_rules(p, view)


def test_branches_meeting_a_type_3_op_are_gathered_each():
    """Inception-like: three branches from one tensor, joined by a Concat (Type 3): the region keeps every branch
    and gathers each branch's output; a fourth branch through a global pool ends at once."""
    rng, inits = np.random.default_rng(0), []
    nodes = [_conv(rng, "stem", "x", "s", inits), helper.make_node("Relu", ["s"], ["r"], name="stem.relu"),
             _conv(rng, "b1", "r", "b1", inits, k=1),
             _conv(rng, "b2a", "r", "b2a", inits, k=1), _conv(rng, "b2b", "b2a", "b2", inits),
             helper.make_node("MaxPool", ["r"], ["b3a"], name="b3a", kernel_shape=[3, 3], pads=[1] * 4),
             _conv(rng, "b3b", "b3a", "b3", inits, k=1),
             helper.make_node("GlobalAveragePool", ["r"], ["g"], name="gap"),
             helper.make_node("Mul", ["b3", "g"], ["b3g"], name="gate"),
             helper.make_node("Concat", ["b1", "b2", "b3", "b3g"], ["y"], name="cat", axis=1)]
    view = _model(nodes, inits, "y")
    p = analyse(view, "H")
    named = {tuple(p.layers[i].layer.name for i in b.layers) for b in p.blocks}
    assert named == {("stem",), ("b1",), ("b2a", "b2b"), ("b3a", "b3b")}  # (in canonical topological order)
    # the global pool (outside) reads the stem's output, so it is gathered too; the gate reads the pool's output:
    # outside, like the Concat
    assert set(p.outputs) == {"r", "b1", "b2", "b3"}
    assert "GlobalAveragePool 'gap' is Type 3" in p.reason  # the first op left out, in topological order
    _check_rules(p, view)


@pytest.mark.parametrize("seed", range(40))
def test_random_residual_graphs_decompose_as_the_brute_force_oracle(seed):
    """Random DAGs of 3x3 convs, ReLUs and residual Adds over earlier tensors (one shape), sometimes ending in a
    global pool: the sub-blocks are the oracle's, every layer in one, chains inside."""
    rng, inits = np.random.default_rng(seed), []
    tensors, nodes = ["x"], []
    for i in range(int(rng.integers(4, 16))):
        op = rng.choice(["conv", "conv", "relu", "add"])
        src = tensors[int(rng.integers(max(0, len(tensors) - 4), len(tensors)))]
        y = f"t{i}"
        if op == "conv":
            nodes.append(_conv(rng, f"c{i}", src, y, inits))
        elif op == "relu":
            nodes.append(helper.make_node("Relu", [src], [y], name=f"r{i}"))
        else:
            other = tensors[int(rng.integers(0, len(tensors)))]
            nodes.append(helper.make_node("Add", [src, other] if other != src else [src, src], [y], name=f"a{i}"))
        tensors.append(y)
    # every tensor nobody reads joins the output, so the graph has one output
    unread = [t for t in tensors[1:] if not any(t in n.input for n in nodes)]
    out = unread[0]
    for k, t in enumerate(unread[1:]):
        nodes.append(helper.make_node("Add", [out, t], [f"o{k}"], name=f"o{k}"))
        out = f"o{k}"
    if rng.random() < 0.3:
        nodes.append(helper.make_node("GlobalAveragePool", [out], ["gp"], name="gp"))
        out = "gp"
    view = _model(nodes, inits, out)
    p = analyse(view, "H")
    _check_rules(p, view)
    region_nodes = {n for x in p.layers for n in x.nodes}
    assert all(n.name in region_nodes for n in view.graph.node if n.op_type != "GlobalAveragePool")
    assert len(p.outputs) == 1


DEVICES = (Device("fast", 4e-12, 1.25e6, 1e-4), Device("slow", 9e-12, 1.25e6, 3e-4))


def test_sub_blocks_are_searched_in_order_each_from_what_the_ones_before_it_hold():
    """tiny_cnn's three sub-blocks, each a chain search whose first layer reads the partitions its inputs were
    given (the merge: both); the total is every layer's eq. (11) with those holders, recomputed here."""
    view = GraphView(canonicalise(tiny.model(), source="tiny"))
    p = analyse(view, "H")
    plan = search_paths(p, DEVICES, 0.15)
    for b in p.blocks:
        got = tuple(plan.partitions[i] for i in b.layers)
        holder = entry(p, b, dict(enumerate(plan.partitions)), DEVICES)
        alone = search_network([p.layers[i].layer for i in b.layers], DEVICES, 0.15, entry=holder)
        assert got == alone.partitions
    merge = entry(p, p.blocks[2], dict(enumerate(plan.partitions)), DEVICES)
    assert isinstance(merge, Joined) and list(merge) == [plan.partitions[1], plan.partitions[3]]
    total = 0.0
    for i, x in enumerate(p.layers):
        holders = [plan.partitions[p.producer(t)] if p.producer(t) is not None
                   else ((0, x.layer.window.in_size), (0, 0)) for t in x.inputs]
        cost = LayerCost(x.layer, DEVICES)
        part = plan.partitions[i]
        t_comp = max(cost.comp(d, s, e) for d, (s, e) in enumerate(part))
        t_ov = sum(cost.shared(d, max(part[d - 1][1] - part[d][0], 0)) for d in range(1, len(part)))
        t_data = sum(sum(missing(x.layer.window.needs(part[d]), h[d])) * x.layer.in_row_bytes
                     / DEVICES[d].bytes_per_s for d in range(2) for h in holders)
        total += t_comp + t_ov + t_data
    assert plan.score == pytest.approx(total, rel=1e-12)
    assert plan.counters.scored > 0


def test_a_chain_is_searched_as_before():
    view = GraphView(canonicalise(alexnet.model(), source="alexnet"))
    p = analyse(view, "H")
    plan = search_paths(p, DEVICES, 0.15)
    chain = search_network(list(region(view, "H").layers), DEVICES, 0.15)
    assert plan.partitions == chain.partitions and plan.score == pytest.approx(chain.score, rel=1e-12)


def test_the_baselines_go_sub_block_by_sub_block():
    """On tiny_cnn's multi-path region: BBGraP-like splits every layer equally, EdgeFlow-like never overlaps
    neighbours; each scored with the same sub-block holders as ADaPS, and on a chain each is its chain self."""
    from edgeplan.plan.spatial import baselines
    from edgeplan.plan.spatial.cost import equal, network_score
    from edgeplan.plan.spatial.search import costs_of

    view = GraphView(canonicalise(tiny.model(), source="tiny"))
    p = analyse(view, "H")
    bb, ef = baselines.bbgrap_paths(p, DEVICES), baselines.edgeflow_paths(p, DEVICES, 0.15)
    assert bb.partitions == tuple(equal(x.layer.out_size, 2) for x in p.layers)
    assert all(part[0][1] <= part[1][0] for part in ef.partitions)  # no row computed twice
    for plan in (bb, ef):
        total = 0.0
        for b in p.blocks:
            layers = [p.layers[i].layer for i in b.layers]
            total += network_score(costs_of(layers, DEVICES), [plan.partitions[i] for i in b.layers],
                                   entry(p, b, dict(enumerate(plan.partitions)), DEVICES))
        assert plan.score == pytest.approx(total, rel=1e-12)
    assert search_paths(p, DEVICES, 0.15).score <= min(bb.score, ef.score)
    chain = list(region(GraphView(canonicalise(alexnet.model(), source="alexnet")), "H").layers)
    a = analyse(GraphView(canonicalise(alexnet.model(), source="alexnet")), "H")
    assert baselines.bbgrap_paths(a, DEVICES).partitions == baselines.bbgrap(chain, DEVICES).partitions
    assert baselines.edgeflow_paths(a, DEVICES, 0.15).partitions == baselines.edgeflow(chain, DEVICES, 0.15).partitions
