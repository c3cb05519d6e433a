"""Merging streaming segments: fewer segments within M_peak, the shifted plan records exactly where the runtime
reads and builds, and the merged chain streams the int8 model's bits."""
from __future__ import annotations

import hashlib
from dataclasses import replace
from functools import partial
from itertools import pairwise

import numpy as np
import pytest

from edgeplan.plan.flashmem import lcopg
from edgeplan.plan.flashmem.merge import Footprint, expected, measured, merge, shifted
from edgeplan.plan.flashmem.plan import Load, WeightPlan, groups
from edgeplan.plan.flashmem.problem import KIB, Layer, Problem
from edgeplan.profile import footprint
from edgeplan.quantize import litert
from edgeplan.quantize import stream as cutting
from edgeplan.quantize.tflite_graph import TfliteGraph
from edgeplan.runtime import stream

INTERPRETER = partial(litert.interpreter, deterministic=False)


@pytest.fixture(scope="module")
def solved(compiled):
    """light_squeezenet int8 with its large ops split, layers of 1 ms with arenas, planned at a third of its weights."""
    d, _, _ = compiled("light_squeezenet")
    g = TfliteGraph(cutting.split_large_ops((d / "model_int8.tflite").read_bytes(), 96 * 1024))
    ls = cutting.layers(g)
    total = sum(layer.weight_bytes for layer in ls)
    problem = Problem(tuple(Layer(layer.name, layer.weight_bytes, 1.0, "reusable", 2, 50.0, build_ms=1.0,
                                  arena_bytes=(k % 3) * 8192) for k, layer in enumerate(ls)),
                      chunk_bytes=16 * 1024, m_peak=max(total // 3, 600 * 1024), window=20, lookback=6)
    return d, g, ls, problem, lcopg.plan(problem)


def _segments(g, ls, runs, root):
    out = []
    for k, ((a, b), blob) in enumerate(zip(runs, cutting.segments(g, runs))):
        path = root / f"s{k}.tflite"
        path.write_bytes(blob)
        inputs, _ = cutting.boundary(g, ls[a].first_op, ls[b].last_op)
        out.append(stream.Segment(path, hashlib.sha256(blob).hexdigest(), len(blob), ls[a].op, a, b,
                                  tuple(g.tensors[i].name for i in inputs)))
    return out


def test_short_runs_merge_within_m_peak_and_stream_the_int8_bits(solved, tmp_path):
    d, g, ls, problem, plan = solved
    first = groups(plan, problem.n)
    runs, merged = merge(problem, plan, first, min_segment_ms=3.5)
    assert len(runs) < len(first)
    assert runs[0][0] == 0 and runs[-1][1] == problem.n - 1
    assert all(b + 1 == c for (_, b), (c, _) in pairwise(runs))
    starts = {a for a, _ in first}
    for a, b in runs:  # a run took the next one in only while it was shorter than 3.5 ms
        last = max(x for x in starts if a <= x <= b)
        assert last == a or sum(problem.layers[i].invoke_ms for i in range(a, last)) < 3.5
    assert merged.peak_resident_bytes <= max(problem.m_peak, shifted(problem, plan, first).peak_resident_bytes)
    segs = _segments(g, ls, runs, tmp_path)
    # the shifted plan is what the runtime does with the solver's plan over these segments: same read
    # positions and builds, segment by segment
    as_solved, as_recorded = stream.schedule(segs, "plan", plan), stream.schedule(segs, "plan", merged)
    assert [(s.build, [p for p, _ in s.reads]) for s in as_solved] == \
           [(s.build, [p for p, _ in s.reads]) for s in as_recorded]
    rng = np.random.default_rng(3)
    x = {g.tensors[i].name: rng.integers(-128, 128, g.tensors[i].shape, dtype=np.int8) for i in g.inputs}
    want = stream.run_preloaded(d / "model_int8.tflite", x, INTERPRETER)
    got, log = stream.Streamer(segs, as_recorded, INTERPRETER).run(x)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    assert len(log.segments) == len(runs)


def test_no_merging_keeps_the_runs_and_a_tight_budget_merges_nothing_above_it(solved):
    _, _, _, problem, plan = solved
    first = groups(plan, problem.n)
    runs, same = merge(problem, plan, first, min_segment_ms=0.0)
    assert runs == first and same == shifted(problem, plan, first)
    from dataclasses import replace

    tight = replace(problem, m_peak=same.peak_resident_bytes)
    runs, merged = merge(tight, plan, first, min_segment_ms=1e9)
    assert merged.peak_resident_bytes <= same.peak_resident_bytes
    assert len(runs) <= len(first)


def test_a_merged_run_reads_its_weights_before_it_starts(solved):
    _, _, _, problem, plan = solved
    runs, merged = merge(problem, plan, groups(plan, problem.n), min_segment_ms=3.5)
    start = {a: k for k, (a, _) in enumerate(runs)}
    seg = {layer: k for k, (a, b) in enumerate(runs) for layer in range(a, b + 1)}
    for w in merged.weights:
        if w.preload:
            assert seg[w.layer] == 0 or all(problem.layers[i].weight_bytes == 0 or
                                            next(x for x in merged.weights if x.layer == i).preload
                                            for i in range(runs[seg[w.layer]][0], runs[seg[w.layer]][1] + 1))
            continue
        assert all(ld.layer in start and start[ld.layer] < seg[w.layer] for ld in w.loads)
        assert w.build_layer in start and start[w.build_layer] < seg[w.layer]
        assert w.build_layer >= max(ld.layer for ld in w.loads)


def test_measured_segments_replace_their_layers_figures_in_the_prediction(solved, tmp_path):
    """Each cut segment measured once built (a real LiteRT build in a fresh process): its built bytes are what
    its weights hold from its build until it has run, its arena and live activations held while it runs."""
    _, g, ls, problem, plan = solved
    runs, _ = merge(problem, plan, groups(plan, problem.n), min_segment_ms=3.5)
    held = footprint.measure([s.path for s in _segments(g, ls, runs, tmp_path)])
    assert len(held.segments) == len(runs) and held.read_mb_s > 0
    assert all(built > 0 and arena > 0 and ms > 0 and run > 0 for built, arena, ms, run in held.segments)
    fps = [Footprint(built, arena, 1000 * k) for k, (built, arena, _, _) in enumerate(held.segments)]
    p = measured(problem, runs, fps)
    for (a, b), fp in zip(runs, fps):
        weighted = [i for i in range(a, b + 1) if problem.layers[i].weight_bytes]
        if weighted:  # spread in proportion, rounded per layer
            assert abs(sum(p.layers[i].built_bytes for i in weighted) - fp.built_bytes) <= len(weighted)
        assert [p.layers[i].arena_bytes for i in range(a, b + 1)] == [fp.arena_bytes + fp.live_bytes] + [0] * (b - a)
    out = shifted(p, plan, runs)
    quiet = shifted(measured(problem, runs, [Footprint(f.built_bytes, f.arena_bytes, 0) for f in fps]), plan, runs)
    seg = {layer: k for k, (a, b) in enumerate(runs) for layer in range(a, b + 1)}
    # a segment's live activations count at every layer it runs, and nowhere else
    assert [x - y for x, y in zip(out.resident_bytes, quiet.resident_bytes)] == [
        -(-(fps[seg[layer]].arena_bytes + fps[seg[layer]].live_bytes) // KIB) * KIB
        - (-(-fps[seg[layer]].arena_bytes // KIB) * KIB) for layer in range(problem.n)]
    assert out.weights == shifted(problem, plan, runs).weights  # the same reads and builds, other figures


def test_segments_are_not_tried_unpacked_when_the_plan_keeps_every_segment_packed(solved, tmp_path):
    _, g, ls, problem, plan = solved
    runs, _ = merge(problem, plan, groups(plan, problem.n), min_segment_ms=3.5)
    held = footprint.measure([s.path for s in _segments(g, ls, runs, tmp_path)], unpacked=False)
    assert len(held.segments) == len(runs) and held.unpacked == [None] * len(runs)


def test_a_failed_measurement_says_what_failed(tmp_path):
    bad = tmp_path / "s0.tflite"
    bad.write_bytes(b"not a model")
    with pytest.raises(footprint.ProfileError, match=r"measuring the built segments failed \(exit 1\)"):
        footprint.measure([bad])
    assert footprint.measure([]) == footprint.Held([], 0.0)


def test_expected_leaves_out_the_loads_a_short_segment_cannot_cover():
    """Three one-layer segments (10, 4 and 1 ms alone); layer 2's weight (2 MiB) is read and built at position 1.
    Played out: position 1 is reached at 10 ms, the read takes 2 MiB at the rate, the 2-ms build follows; what
    is not done when segment 1 is dropped (its invoke ends at 14 ms, or a build under way then ends: it holds the
    GIL) is left out of its layer, and nothing else changes."""
    mib = 2**20
    layers = (Layer("a", 0, 10.0, "reusable", 0, 0.0, arena_bytes=0),
              Layer("b", 0, 4.0, "reusable", 0, 0.0, arena_bytes=0),
              Layer("c", 2 * mib, 1.0, "reusable", 0, 0.0, build_ms=2.0, built_bytes=mib))
    problem = Problem(layers, chunk_bytes=mib, m_peak=64 * mib, window=3, lookback=2)
    runs = [(0, 0), (1, 1), (2, 2)]
    w = WeightPlan(2, "c", 2 * mib, 2, False, (Load(1, 2),), 1)
    plan = shifted(problem, replace(lcopg.plan(problem), weights=(w,)), runs)
    assert [b // mib for b in plan.resident_bytes] == [0, 3, 3]  # the ledger: read and built beside layer 1
    fps = [Footprint(0, 0, 0, 0.0), Footprint(0, 0, 0, 0.0), Footprint(mib, 0, 0, 2.0)]

    def left_out(rate: float) -> float:  # KiB not done at 14 ms: the read over [10, r], then the 2-ms build
        r = 10.0 + 2 * mib / (rate * 1e3)
        if r < 14.0:  # read in time; a build under way when the invoke ends holds the GIL: done before the drop
            return 0.0
        return (r - 14.0) / (r - 10.0) * 2048 + 1024

    for rate in (1000.0, 300.0, 10.0):
        got = expected(problem, plan, runs, fps, rate)
        assert got.resident_bytes[1] == plan.resident_bytes[1] - round(left_out(rate)) * KIB
        assert got.resident_bytes[0] == plan.resident_bytes[0] and got.resident_bytes[2] == plan.resident_bytes[2]
        assert got.weights == plan.weights
    assert left_out(1000.0) == 0 and 1024 < left_out(300.0) < left_out(10.0) < 3072  # in time, part read, barely
    # a measured first invoke stands in for the layers' times alone: segment 1 running 10 ms covers the loads
    slow_invoke = [fps[0], Footprint(0, 0, 0, 0.0, 10.0), fps[2]]
    assert expected(problem, plan, runs, slow_invoke, 300.0).resident_bytes == plan.resident_bytes
    with pytest.raises(ValueError, match="read rate"):
        expected(problem, plan, runs, fps, 0.0)
