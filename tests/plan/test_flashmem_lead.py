"""Read lead: the streamed reads move earlier, segment by segment, only while the ledger stays within M_peak; the
plan it returns prices what it records, and the runtime's loader reads where it says."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from edgeplan.plan.flashmem import lcopg
from edgeplan.plan.flashmem.lead import hoist
from edgeplan.plan.flashmem.merge import shifted
from edgeplan.plan.flashmem.plan import groups
from edgeplan.plan.flashmem.problem import KIB, Layer, Problem
from edgeplan.runtime import stream


def _problem(m_peak_kib: int) -> Problem:
    """16 layers of 64 KiB weights (4 chunks of 16 KiB), each able to read 2 chunks beside itself."""
    layers = tuple(Layer(f"l{k}", 64 * KIB, 1.0, "reusable", 2, 50.0, build_ms=1.0, arena_bytes=8 * KIB)
                   for k in range(16))
    return Problem(layers, chunk_bytes=16 * KIB, m_peak=m_peak_kib * KIB, window=16, lookback=8)


@pytest.fixture(scope="module")
def planned():
    """Solved within 300 KiB, carried out one segment per layer, with 600 KiB of M_peak for the lead."""
    roomy = _problem(600)
    plan = lcopg.plan(replace(roomy, m_peak=300 * KIB))
    runs = groups(plan, roomy.n)
    return roomy, runs, shifted(roomy, plan, runs)


def _positions(plan, runs) -> dict[int, list[int]]:
    seg = {layer: k for k, (a, b) in enumerate(runs) for layer in range(a, b + 1)}
    return {seg[w.layer]: [seg[load.layer] for load in w.loads] for w in plan.weights if not w.preload}


def test_reads_take_the_lead_where_memory_allows_and_the_plan_prices_them(planned):
    problem, runs, plan = planned
    led = hoist(problem, plan, runs, 3)
    before, after = _positions(plan, runs), _positions(led, runs)
    assert before.keys() == after.keys()
    assert any(max(before[k]) > k - 3 for k in before)  # the solver left reads later than a lead of 3
    for k, pos in after.items():  # 600 KiB holds every lead: each read 3 segments ahead (or at the start)
        assert max(pos) <= max(0, k - 3)
    # chunks and builds as planned; the recorded residency is the ledger's for what it records, within M_peak
    for w, v in zip(plan.weights, led.weights, strict=True):
        assert (v.layer, v.preload, v.build_layer) == (w.layer, w.preload, w.build_layer)
        assert sum(load.chunks for load in v.loads) == sum(load.chunks for load in w.loads)
    assert shifted(problem, led, runs).resident_bytes == led.resident_bytes
    assert plan.peak_resident_bytes < led.peak_resident_bytes <= problem.m_peak
    assert (led.read_lead, led.m_peak) == (3, 600 * KIB)
    # the runtime's loader reads each streamed segment's pieces where the plan now says
    segs = [stream.Segment(Path(f"s{k}"), "", 64 * KIB, "CONV_2D", a, b) for k, (a, b) in enumerate(runs)]
    for k, step in enumerate(stream.schedule(segs, "plan", led)):
        if k in after:
            assert [p for p, _ in step.reads] == sorted(set(after[k]))


def test_the_lead_stops_at_m_peak_and_a_plan_above_it_keeps_its_own_peak(planned):
    problem, runs, plan = planned

    def ahead(p) -> int:  # segments of lead summed over every streamed read
        return sum(k - q for k, pos in _positions(p, runs).items() for q in pos)

    roomy = hoist(problem, plan, runs, 4)
    tight = hoist(replace(problem, m_peak=plan.peak_resident_bytes), plan, runs, 4)
    assert tight.peak_resident_bytes <= plan.peak_resident_bytes
    assert ahead(plan) <= ahead(tight) < ahead(roomy)
    above = hoist(replace(problem, m_peak=plan.peak_resident_bytes // 2), plan, runs, 4)
    assert above.peak_resident_bytes <= plan.peak_resident_bytes


def test_a_lead_of_one_segment_is_the_plan_itself(planned):
    problem, runs, plan = planned
    assert hoist(problem, plan, runs, 1).weights == plan.weights
    with pytest.raises(ValueError, match="read lead of 0"):
        hoist(problem, plan, runs, 0)
