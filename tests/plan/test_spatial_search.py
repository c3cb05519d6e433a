"""ADaPS cost, space and search checked against brute force: intervals against the rows a window reads, the
space's count against enumeration, the tree against exhaustive search and the exact per-layer DP, the network
search against the exact chain DP."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeplan.errors import PlanError
from edgeplan.plan.spatial import baselines, oracle, search
from edgeplan.plan.spatial.cost import (
    Device,
    Joined,
    Layer,
    LayerCost,
    Space,
    equal,
    fit_speed,
    network_bytes,
    network_score,
    proportional,
    source,
)
from edgeplan.plan.spatial.intervals import Window, missing, overlaps


@st.composite
def windows(draw):
    k, stride, dil = draw(st.integers(1, 5)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
    in_size = draw(st.integers(max((k - 1) * dil + 1, 2), 30))
    if draw(st.booleans()):
        return Window.same(k, stride, in_size, dil, lower=draw(st.booleans()))
    pb, pe = draw(st.integers(0, k - 1)), draw(st.integers(0, k - 1))
    out = (in_size + pb + pe - (k - 1) * dil - 1) // stride + 1
    return Window(k, stride, dil, pb, pe, in_size, out)


@given(windows(), st.data())
def test_needs_is_the_rows_the_window_reads(w, data):
    s = data.draw(st.integers(0, w.out_size - 1))
    e = data.draw(st.integers(s + 1, w.out_size))
    read = {o * w.stride - w.pad_begin + j * w.dilation for o in range(s, e) for j in range(w.kernel)}
    inside = sorted(r for r in read if 0 <= r < w.in_size)
    if not inside:
        with pytest.raises(ValueError, match="only padding"):
            w.needs((s, e))
        return
    assert w.needs((s, e)) == (inside[0], inside[-1] + 1)
    assert w.pads((s, e)) == (max(-min(read), 0), max(max(read) + 1 - w.in_size, 0))


def test_same_padding_is_tensorflows():
    w = Window.same(3, 2, 224)  # TF: out 112, pad_total 1, pad_top 0
    assert (w.out_size, w.pad_begin, w.pad_end) == (112, 0, 1)
    w = Window.same(3, 2, 7)  # out 4, pad_total 2, pad_top 1
    assert (w.out_size, w.pad_begin, w.pad_end) == (4, 1, 1)


def test_dependencies_and_overlaps_follow_the_papers_examples():
    assert missing((2, 3), (3, 6)) == (1, 0)  # Example 4.2: data_s = 1, data_e = 0
    assert missing((0, 10), (3, 6)) == (3, 4)
    assert missing((4, 5), (3, 6)) == (0, 0)
    assert overlaps(((0, 5), (3, 9), (8, 12))) == [2, 3, 1]


def _devices(speeds, bw=1e6):
    return tuple(Device(f"d{i}", 1e-9 / s, bw) for i, s in enumerate(speeds))


@st.composite
def instances(draw, max_devices=3, max_size=18):
    n = draw(st.integers(2, max_devices))
    size = draw(st.integers(max(n, 4), max_size))
    speeds = draw(st.lists(st.sampled_from([1.0, 0.45, 0.22, 0.5]), min_size=n, max_size=n))
    bw = draw(st.sampled_from([2e3, 2e4, 2e6]))
    threshold = draw(st.sampled_from([0.1, 0.3, 0.6, 1.0]))
    k = draw(st.sampled_from([1, 3, 5]))
    layer = Layer("l", Window.same(k, 1, size), macs=size * 2000, in_row_bytes=16, out_row_bytes=16)
    devices = _devices(speeds, bw)
    return layer, devices, Space.of(size, devices, threshold)


@settings(max_examples=60, deadline=None)
@given(instances())
def test_the_space_is_counted_as_enumerated(inst):
    _, _, space = inst
    parts = list(space.enumerate())
    assert space.count() == len(parts) == len(set(parts)) > 0
    for p in parts:
        assert p[0][0] == 0 and p[-1][1] == space.size
        for d, (s, e) in enumerate(p):
            assert space.lo[d] <= e - s <= space.hi[d]
            if d:
                assert p[d - 1][0] < s <= p[d - 1][1] < e


@settings(max_examples=60, deadline=None)
@given(instances(), st.booleans())
def test_the_tree_finds_the_exhaustive_optimum(inst, with_next):
    layer, devices, space = inst
    cost = LayerCost(layer, devices)
    holder = proportional(space.size, devices)
    nxt = LayerCost(layer, devices) if with_next else None
    following = proportional(space.size, devices) if with_next else None
    best, arg, n = oracle.exhaustive(cost, space, holder, nxt=nxt, following=following)
    counters = search.Counters()
    value, part = search.LayerTree(cost, space, holder, nxt=nxt, following=following, counters=counters).search()
    assert value == pytest.approx(best, rel=1e-9)
    assert n == space.count()
    dp_value, dp_part = oracle.layer_dp(cost, space, holder, nxt=nxt, following=following)
    assert dp_value == pytest.approx(best, rel=1e-9)
    for p in (part, arg, dp_part):  # each partition returned scores what its search says
        local = cost.score(p, holder)
        if with_next:
            local += nxt.score(following, p) - nxt.score(following, None)
        assert local == pytest.approx(value, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(instances(), st.integers(1, 6))
def test_best_k_is_the_k_smallest_scores(inst, k):
    layer, devices, space = inst
    cost = LayerCost(layer, devices)
    holder = proportional(space.size, devices)
    scores = sorted(cost.score(p, holder) for p in space.enumerate())
    got = search.LayerTree(cost, space, holder).best_k(k)
    assert [v for v, _ in got] == pytest.approx(scores[:k], rel=1e-9)
    assert [cost.score(p, holder) for _, p in got] == pytest.approx(scores[:k], rel=1e-9)


def _holder(kind: str, cost: LayerCost, space: Space):
    return {"proportional": proportional(space.size, cost.devices), "equal": equal(space.size, space.devices),
            "source": source(cost), "none": None}[kind]


HOLDERS = st.sampled_from(["proportional", "equal", "source", "none"])


@settings(max_examples=60, deadline=None)
@given(instances(), HOLDERS)
def test_the_data_floor_bounds_every_completion(inst, holder_kind):
    # the tree cuts a node whose partial score plus the least data the devices after it can need is no better
    # than the best leaf: that least must be below what every partition of the space pays from there on
    layer, devices, space = inst
    cost = LayerCost(layer, devices)
    holder = _holder(holder_kind, cost, space)
    tree = search.LayerTree(cost, space, holder)
    least = math.inf
    for p in space.enumerate():
        paid = [cost.data(d, s, e, holder) for d, (s, e) in enumerate(p)]
        least = min(least, sum(paid))
        for d, (s, e) in enumerate(p):
            assert tree.data.floor[d] <= sum(paid[d:]) + 1e-15
            assert tree.data.after[d][p[d - 1][1] if d else 0] <= sum(paid[d:]) + 1e-15
            assert tree.data.startable[d][s]
            assert tree.data.terms[d][s][0 if d == space.devices - 1 else e - s - space.lo[d]] == pytest.approx(
                paid[d], rel=1e-12, abs=0)
    assert tree.data.after[0][0] == pytest.approx(least, rel=1e-12, abs=1e-15)  # the DP is exact on the data
    value, _ = search.LayerTree(cost, space, holder).search()
    assert value == pytest.approx(oracle.exhaustive(cost, space, holder)[0], rel=1e-9)


@settings(max_examples=80, deadline=None)
@given(windows(), st.data())
def test_data_grid_is_data_interval_by_interval(w, data):
    n = data.draw(st.integers(2, 3))
    devices = _devices([1.0, 0.45, 0.22][:n], data.draw(st.sampled_from([2e3, 2e6])))
    cost = LayerCost(Layer("l", w, w.out_size * 100, 16, 16), devices)

    def partition():
        edges = sorted(data.draw(st.lists(st.integers(0, w.in_size), min_size=2 * n, max_size=2 * n)))
        return tuple(zip(edges[::2], edges[1::2]))

    holder = data.draw(st.sampled_from([None, partition(), Joined((partition(), partition()))]))
    s, e = np.triu_indices(w.out_size + 1, 1)
    for d in range(n):
        want = []
        for a, b in zip(s, e):
            try:
                want.append(cost.data(d, int(a), int(b), holder))
            except ValueError:  # reads only padding: no partition holds it; the grid says 0 rows
                want.append(0.0)
        assert cost.data_grid(d, s, e, holder).tolist() == pytest.approx(want, rel=1e-12, abs=0)


def test_counters_are_counted_and_pruning_cuts_most_of_a_large_space():
    devices = _devices([1.0, 1.0, 0.45, 0.45], 1.25e6)
    layer = Layer("conv", Window.same(3, 1, 224), 224 * 224 * 64 * 64 * 9, 224 * 64, 224 * 64)
    space = Space.of(224, devices, 0.05)
    counters = search.Counters()
    search.LayerTree(LayerCost(layer, devices), space, proportional(224, devices), counters=counters).search()
    assert 0 < counters.pruned < counters.scored < space.count() / 1000


def _chain(sizes_kernels, row_bytes=600):
    layers, size = [], sizes_kernels[0][0]
    for i, (out, k) in enumerate(sizes_kernels):
        stride = max(size // out, 1)
        w = Window.same(k, stride, size)
        layers.append(Layer(f"l{i}", w, macs=w.out_size * 40_000 * k, in_row_bytes=row_bytes, out_row_bytes=row_bytes))
        size = w.out_size
    return layers


@pytest.mark.parametrize("bw", [2e4, 2e6])
def test_the_network_search_matches_the_exact_chain(bw):
    layers = _chain([(24, 3), (24, 3), (12, 3), (12, 5), (12, 3), (6, 3)])
    devices = _devices([1.0, 0.45], bw)
    plan = search.search_network(layers, devices, 0.5)
    costs, spaces = search.costs_of(layers, devices), search.spaces_of(layers, devices, 0.5)
    best, exact = oracle.chain_dp(costs, spaces)
    assert plan.score == pytest.approx(best, rel=1e-9)
    assert network_score(costs, list(exact)) == pytest.approx(best, rel=1e-9)
    greedy = search.search_network(layers, devices, 0.5, beam=1, revise=False, whole_below=0)
    assert greedy.score >= best - 1e-12
    # every layer's space (at most a few hundred partitions here) searched whole: the forward pass alone is the
    # chain's exact optimum, whatever the beam
    whole = search.search_network(layers, devices, 0.5, beam=1, revise=False)
    assert max(sp.count() for sp in spaces) <= 512
    assert whole.score == pytest.approx(best, rel=1e-9)
    # the baselines live in the same space or a smaller one: never better than the exact optimum
    for base in (baselines.edgeflow(layers, devices, 0.5), baselines.bbgrap(layers, devices)):
        assert base.score >= best - 1e-12
        assert network_bytes(costs, list(base.partitions)) >= 0
    ef = baselines.edgeflow(layers, devices, 0.5)
    assert all(p[0][1] == p[1][0] for p in ef.partitions)  # no overlapped outputs


def test_bad_input_is_refused_with_one_line():
    devices = _devices([1.0, 0.5, 0.5])
    with pytest.raises(PlanError, match="outside"):
        Space.of(20, devices, 0.0)
    with pytest.raises(PlanError, match="outside"):
        Space.of(20, devices, 1.5)
    with pytest.raises(PlanError, match="3 devices but layer 'pool5' has only 2 rows"):
        Space.of(2, devices, 0.1, where="layer 'pool5'")
    with pytest.raises(PlanError, match="slope"):
        fit_speed([1e6, 2e6, 3e6], [3.0, 2.0, 1.0])
    assert math.isfinite(search.search_network(_chain([(8, 3)]), devices[:2], 1.0).score)


def test_the_speed_fit_is_made_within_each_conv():
    """A small conv dear per MAC beside a large cheap one: one line through all the points falls; within each conv
    the time grows with its rows, and that slope (each conv its own intercept) is the speed."""
    macs = [1e5, 2e5, 3e5, 4e5, 1e6, 2e6, 3e6, 4e6]
    seconds = [20e-6 + 1e-10 * m for m in macs[:4]] + [2e-6 + 1e-12 * m for m in macs[4:]]
    with pytest.raises(PlanError, match="slope"):
        fit_speed(macs, seconds)
    slope, per_layer = fit_speed(macs, seconds, [0] * 4 + [1] * 4)
    # the pooled within-conv slope: weighted by each conv's spread of MACs, so the large conv's dominates
    dm = np.array([m - 2.5e5 for m in macs[:4]] + [m - 2.5e6 for m in macs[4:]])
    assert slope == pytest.approx((dm[:4] @ dm[:4] * 1e-10 + dm[4:] @ dm[4:] * 1e-12) / (dm @ dm))
    assert per_layer == pytest.approx(np.median([20e-6 + (1e-10 - slope) * 2.5e5, 2e-6 + (1e-12 - slope) * 2.5e6]))
    with pytest.raises(PlanError, match="two or more row counts"):
        fit_speed([1e5, 2e6], [1e-5, 2e-5], [0, 1])
