"""Read lead: the streamed reads move earlier, segment by segment, only while the ledger stays within M_peak; the
plan it returns prices what it records, and the runtime's loader reads where it says."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from edgeplan.plan.flashmem import lcopg
from edgeplan.plan.flashmem.lead import hoist, in_time
from edgeplan.plan.flashmem.merge import shifted
from edgeplan.plan.flashmem.plan import Load, WeightPlan, groups
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


def _streamed_one_ahead(planned):
    """The fixture's 16 layers, one segment each, every weight but the first read and built one segment before
    its own."""
    problem, runs, plan = planned
    weights = [WeightPlan(0, "l0", 64 * KIB, 4, True)] + [
        WeightPlan(k, f"l{k}", 64 * KIB, 4, False, (Load(k - 1, 4),), k - 1) for k in range(1, problem.n)]
    return shifted(problem, replace(plan, weights=tuple(weights)), runs)


def test_reads_are_due_where_the_readers_in_turn_still_have_each_segment_in_before_its_build(planned):
    """Each segment runs 1 ms and builds in 0 ms; a 64 KiB read takes 2 ms at 32.768 MB/s. Read one after
    another, backwards from segment 15 (needed at 15 ms): 15 is due at 13 ms, 14 at 11, ..., k at 2k - 17,
    so from segment 8 down the reads are due from the start."""
    problem, runs, _ = planned
    plan = _streamed_one_ahead(planned)
    due = in_time(problem, plan, runs, [1.0] * 16, [0.0] * 16, 32.768)
    assert due == {k: max(0, 2 * k - 17) for k in range(1, 16)}
    # twice the rate: a read takes what an invoke takes, each segment due one ahead
    assert in_time(problem, plan, runs, [1.0] * 16, [0.0] * 16, 65.536) == {k: k - 1 for k in range(1, 16)}
    # a build of 1 ms before each invoke: every read done a millisecond earlier
    assert in_time(problem, plan, runs, [1.0] * 16, [1.0] * 16, 32.768) == {k: max(0, 2 * k - 18) for k in range(1, 16)}
    with pytest.raises(ValueError, match="read rate of 0"):
        in_time(problem, plan, runs, [1.0] * 16, [0.0] * 16, 0.0)


def test_reads_move_to_when_they_are_due_while_m_peak_allows(planned):
    problem, runs, _ = planned
    plan = _streamed_one_ahead(planned)
    timing = ([1.0] * 16, [0.0] * 16, 32.768)
    due = in_time(problem, plan, runs, *timing)
    roomy = hoist(replace(problem, m_peak=16 * 1024 * KIB), plan, runs, 1, timing)
    assert _positions(roomy, runs) == {k: [min(k - 1, due[k])] for k in range(1, 16)}
    assert shifted(problem, roomy, runs).resident_bytes == roomy.resident_bytes
    # within a tighter M_peak the earlier segments' reads take the room first, and the plan stays within it
    limit = (plan.peak_resident_bytes + roomy.peak_resident_bytes) // 2
    tight = hoist(replace(problem, m_peak=limit), plan, runs, 1, timing)
    assert plan.peak_resident_bytes < tight.peak_resident_bytes <= limit
    late = [k for k in range(1, 16) if due[k] < k - 1]
    at = _positions(tight, runs)
    assert all(due[k] <= at[k][0] <= k - 1 for k in late)
    short = [k for k in late if at[k][0] > due[k]]  # as early as the room left allowed
    assert short and short[0] > late[0] and [at[k][0] for k in late] == sorted(at[k][0] for k in late)
    assert hoist(problem, plan, runs, 1).weights == plan.weights  # no timing: nothing moves
