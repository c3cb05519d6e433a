"""Read lead: each streamed read moved to at least ``lead`` segments before the segment that needs it, where the
plan still fits M_peak (the CPU's departure from FlashMem's placement, measured here).

The solver places a weight's chunks as late as the layers' load capacity allows (the ``resident`` objective
prices every layer a chunk waits), and the runtime reads a piece once the compute thread reaches its position:
so the last pieces of a segment's blob are in flight while the segment before it runs, and the segment waits.
Measured on the bench's plans (cold, fresh processes, interleaved): every streamed read moved 1-2 segments
earlier took ResNet50V2 from 1.23 to 0.98-1.00 of its preloaded request, DenseNet201 from 1.18 to 0.83-0.91,
InceptionV3 0.98 -> 0.88, VGG19 0.91 -> 0.78 — at a higher peak, beyond M_peak when the solver had already
used it. Here the solver plans within a share of M_peak (``flashmem.solve_share``) and the reads then take the
rest, the ledger pricing them at their new place: ``hoist`` moves the pieces of every streamed segment up to a
lead of 2 segments, then 3, ... up to ``lead``, each move kept only while every layer's residency stays within
M_peak. Builds stay where the plan put them (a build holds the GIL; moved earlier it slows the segments it
shadows). Reads beyond a layer's capacity C_l are recounted in the plan's ``over_capacity_bytes``. Stdlib only.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import replace

from edgeplan.plan.flashmem.plan import Ledger, Load, OverlapPlan, WeightPlan
from edgeplan.plan.flashmem.problem import KIB, Problem


def hoist(problem: Problem, plan: OverlapPlan, runs: list[tuple[int, int]], lead: int,
          timing: tuple[list[float], list[float], float] | None = None) -> OverlapPlan:
    """``plan`` (as the runtime carries it out over ``runs``: ``merge.shifted``, its loads at the first layer of
    a run) with every streamed segment's pieces read at least ``lead`` segments before it where M_peak allows
    (``lead`` 1: ``plan`` unchanged — the runtime reads a segment's pieces before it anyway); then, given
    ``timing`` (each segment's invoke and build ms and the readers' MB/s, measured), earlier still where the
    readers would not otherwise have it in time (``in_time``). A plan already above M_peak is held to its own
    peak."""
    if lead < 1:
        raise ValueError(f"a read lead of {lead} segments")
    seg = {layer: k for k, (a, b) in enumerate(runs) for layer in range(a, b + 1)}
    weights = {w.layer: w for w in plan.weights}
    ledger = Ledger(problem)
    for w in plan.weights:
        ledger.commit(w)
    ledger.mem = [m // KIB for m in plan.resident_bytes]  # the plan's residency (arenas of merged runs included)
    limit = max(problem.m_peak_kib, max(ledger.mem, default=0))
    streamed = [i for i in sorted(weights) if not weights[i].preload and weights[i].loads]

    def move(i: int, positions: range) -> None:
        """Weight i's pieces after the first of ``positions`` where the ledger stays within the limit read there."""
        w = weights[i]
        for at in positions:
            moved = _moved(w, seg, runs, at)
            if moved == w:
                return
            ledger.commit(w, -1)
            ledger.commit(moved)
            if max(ledger.mem[runs[at][0]:i + 1]) <= limit:
                weights[i] = moved
                return
            ledger.commit(moved, -1)
            ledger.commit(w)

    for target in range(2, lead + 1):
        for i in streamed:
            move(i, range(max(0, seg[i] - target), seg[i] - 1))  # the longest lead that fits, up to target
    if timing is not None:
        due = in_time(problem, plan, runs, *timing)
        for i in streamed:
            first = min(seg[load.layer] for load in weights[i].loads)
            move(i, range(due.get(seg[i], first), first))  # the earliest that fits, from when it is due
    out = tuple(weights[i] for i in sorted(weights))
    over_read, _ = ledger.over_capacity()
    return replace(plan, weights=out, resident_bytes=tuple(m * KIB for m in ledger.mem), m_peak=problem.m_peak,
                   over_capacity_bytes=over_read * KIB, solve_m_peak=plan.solve_m_peak or plan.m_peak,
                   read_lead=lead, read_in_time=timing is not None)


def in_time(problem: Problem, plan: OverlapPlan, runs: list[tuple[int, int]], invoke_ms: list[float],
            build_ms: list[float], read_mb_s: float) -> dict[int, int]:
    """Per streamed segment, the last position from which its reads give the readers time to have it in, built,
    before its turn: the request played backwards, the compute thread reaching position k after segments 0..k-1's
    invokes (measured), the readers reading the streamed segments one after another, in order, at ``read_mb_s``,
    each done before the next one's reads begin and before its own build (measured ms) must start. Measured
    (``flashmem.read_in_time``, off by default): VGG19's fully-connected parts then read beside its convolutions,
    its peak at M_peak (74 MiB against 53 led by segments only), its request no faster on this host in the
    bench's 11 interleaved rounds (324 against 327 ms; 337 against 368 in 5 rounds before)."""
    if read_mb_s <= 0:
        raise ValueError(f"a read rate of {read_mb_s} MB/s")
    seg = {layer: k for k, (a, b) in enumerate(runs) for layer in range(a, b + 1)}
    kib = [0] * len(runs)
    for w in plan.weights:
        if not w.preload and w.loads:
            kib[seg[w.layer]] += w.chunks * problem.chunk_kib(w.layer)
    reach = [0.0]  # when the compute thread reaches each position
    for ms in invoke_ms:
        reach.append(reach[-1] + ms)
    due, nxt = {}, math.inf
    for k in reversed(range(len(runs))):
        if kib[k]:
            nxt = min(nxt, reach[k] - build_ms[k]) - kib[k] * KIB / (read_mb_s * 1e3)
            due[k] = max(0, bisect.bisect_right(reach, nxt, 0, k) - 1)  # reach is non-decreasing
    return due


def _moved(w: WeightPlan, seg: dict[int, int], runs: list[tuple[int, int]], at: int) -> WeightPlan:
    """``w`` with its pieces planned after position ``at`` read at ``at`` instead (the earlier ones stay)."""
    chunks: dict[int, int] = {}
    for load in w.loads:
        pos = min(seg[load.layer], at)
        chunks[pos] = chunks.get(pos, 0) + load.chunks
    return replace(w, loads=tuple(Load(runs[pos][0], c) for pos, c in sorted(chunks.items())))
