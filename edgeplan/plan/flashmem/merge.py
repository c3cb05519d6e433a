"""Merging streaming segments (FlashMem §4.3, kernel merging, the CPU analogue) under the plan's M_peak.

Every segment is an interpreter of its own, and here that has a fixed price however small its layers: a build,
and fresh pages for its packed weights, arena and boundary tensors (glibc hands a dropped segment's memory back,
so the next one faults its own in). Measured on the bench's plans, cold: ResNet50V2's 55 segments build in 31 ms
(the whole model in 28) and pay 19-21 ms to pass tensors; DenseNet201's 199 run 2.2x its preloaded request while
invoking no slower. The overlap plan acts between almost every pair of layers, so ``plan.groups`` merges
little. Here a run of layers shorter than ``min_segment_ms`` (the layers' measured times alone) takes the next
run in, as long as the plan, shifted to what the runtime then does, still fits M_peak:

- the merged run's weights are all read and built before it starts: a read the plan placed inside the run, or
  its build, moves to the segment before it (``plan.run_loads``, the rule the runtime's loader follows);
- a read the plan placed at a layer inside the run, for a later segment, happens when the run starts;
- the run's arena is the largest of its layers', held while any of them runs;
- a preloaded weight inside a run that streams is read with the run (the runtime reads the segment whole).

The shifted plan replaces the solver's: its loads and builds are where the runtime acts, its ``resident_bytes``
the prediction set beside the measured peak, its over-capacity recounted. Once the segments are cut, ``measured``
puts what each holds in that prediction (``profile.footprint``: built and arena as measured, and the activations
the runtime keeps while it runs) in place of its layers' figures, and ``expected`` leaves out what the runtime
has not loaded yet when a segment's invoke is shorter than the loads beside it. Stdlib only.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from edgeplan.plan.flashmem.plan import Ledger, Load, OverlapPlan, run_loads
from edgeplan.plan.flashmem.problem import KIB, Problem


def shifted(problem: Problem, plan: OverlapPlan, runs: list[tuple[int, int]]) -> OverlapPlan:
    """``plan`` as the runtime carries it out over the segments ``runs`` (``plan.run_loads``; see the module
    docstring)."""
    by_layer = {w.layer: w for w in plan.weights}
    weights = []
    for (a, b), run in zip(runs, run_loads(plan, runs)):
        ws = [by_layer[i] for i in range(a, b + 1) if i in by_layer]
        if run is None:  # read and built before the first invoke
            weights += [replace(w, preload=True, loads=(), build_layer=None) for w in ws]
            continue
        first = min(pos for at in run.reads.values() for pos in at)
        for w in ws:  # a preloaded weight is read with the run, at its first read
            at = run.reads.get(w.layer, {first: w.chunks})
            weights.append(replace(w, preload=False, loads=tuple(Load(runs[pos][0], c) for pos, c in sorted(at.items())),
                                   build_layer=runs[run.build][0]))
    ledger = Ledger(problem)
    for a, b in runs:  # a segment's arena: its largest layer's, while any of its layers runs
        top = max(problem.arena_kib(layer) for layer in range(a, b + 1))
        for layer in range(a, b + 1):
            ledger.mem[layer] += top - problem.arena_kib(layer)
    for w in weights:
        ledger.commit(w)
    over_read, over_build = ledger.over_capacity()
    return replace(plan, weights=tuple(weights), resident_bytes=tuple(m * KIB for m in ledger.mem),
                   preload_bytes=sum(w.bytes for w in weights if w.preload), over_capacity_bytes=over_read * KIB,
                   over_build_ms=over_build / 1000)


@dataclass(frozen=True)
class Footprint:
    """One cut segment: the resident set its build adds, its arena's span and its build time (measured), and the
    activations the runtime holds while it runs (its inputs, what earlier segments made for later ones, its
    outputs)."""

    built_bytes: int
    arena_bytes: int
    live_bytes: int
    build_ms: float = 0.0
    invoke_ms: float = 0.0  # its first invoke once built (0: unmeasured; its layers' times alone stand in)


def footprints_of(segments) -> list[Footprint]:
    """What each recorded segment (``plan.StreamSegment``) holds, as measured when it was cut."""
    return [Footprint(s.built_bytes, s.arena_bytes, s.live_bytes, s.build_ms, s.invoke_ms) for s in segments]


def measured(problem: Problem, runs: list[tuple[int, int]], footprints: list[Footprint]) -> Problem:
    """``problem`` with each run's layers carrying its segment's footprint, for ``shifted``: the built bytes spread
    over the run's weighted layers in proportion to their own (a run's weights are built together and all stay
    until it has run: only the total matters; a run of weight-free layers holds no weight the ledger follows, and
    its few built KiB stay out as before), the arena and live activations on its first layer (``shifted`` holds
    a run's largest arena through all its layers)."""
    layers = list(problem.layers)
    for (a, b), fp in zip(runs, footprints, strict=True):
        weighted = [i for i in range(a, b + 1) if layers[i].weight_bytes > 0]
        own = sum(problem.packed_kib(i) for i in weighted)
        for i in range(a, b + 1):
            share = problem.packed_kib(i) / own if i in weighted and own else 0.0
            layers[i] = replace(layers[i], built_bytes=round(fp.built_bytes * share),
                                arena_bytes=fp.arena_bytes + fp.live_bytes if i == a else 0)
    return replace(problem, layers=tuple(layers))


def expected(problem: Problem, plan: OverlapPlan, runs: list[tuple[int, int]], footprints: list[Footprint],
             read_mb_s: float) -> OverlapPlan:
    """``plan`` (``shifted`` over ``runs``) with the residency the runtime meets when its loads run late. The
    ledger holds every load planned at a segment's position beside the segment; the runtime drops the segment as
    soon as it has run, whatever its loaders have done by then. So the request is played out in time as
    ``runtime.stream`` carries it out: the compute thread reaches position k when segment k-1 has run and invokes
    segment k once it is built (its measured first invoke: a fresh interpreter's pages are touched then; its
    layers' times alone, warm, when unmeasured — ResNet50V2's sum to 12 ms, its streamed invokes to 20-23); the
    readers take the planned pieces in order, each from its position on, at ``read_mb_s`` (the runtime's
    readers, cold, measured); the builder builds each streamed segment, in turn, once its bytes are in and its
    build position is reached (its measured ms), and a build holds the GIL, so a segment whose invoke ends during
    one is dropped when the build ends. What a load has not done when segment k is dropped (a piece's bytes not
    read, a segment's build not finished, in proportion) is left out of k's layers. Preloaded segments stay
    resident from the start, as in the ledger. ResNet50V2 streamed, its 1-ms segment 15 with a 6.3 MiB segment
    loaded beside it: the ledger's 15.6 MiB there, measured 3.2-3.6 during the invoke."""
    if read_mb_s <= 0:
        raise ValueError(f"a read rate of {read_mb_s} MB/s")
    seg = {layer: k for k, (a, b) in enumerate(runs) for layer in range(a, b + 1)}
    n = len(runs)
    pieces: dict[int, dict[int, int]] = {}  # position -> segment -> KiB read there
    built_kib, build_at = [0] * n, [None] * n
    for w in plan.weights:
        if w.preload:
            continue
        j = seg[w.layer]
        for load in w.loads:
            at = pieces.setdefault(seg[load.layer], {})
            at[j] = at.get(j, 0) + load.chunks * problem.chunk_kib(w.layer)
        if w.build_layer is not None:
            built_kib[j] += problem.packed_kib(w.layer)
            build_at[j] = seg[w.build_layer]
    due: dict[int, list[int]] = {}  # position -> the segments whose builds are planned there, in order
    for j, at in enumerate(build_at):
        if at is not None:
            due.setdefault(at, []).append(j)
    reads: list[tuple[int, int, float, float]] = []  # (position, segment, start ms, end ms), KiB below
    read_kib: list[int] = []
    read_done: dict[int, float] = {}
    builds: dict[int, tuple[float, float]] = {}
    drop = [0.0] * n
    disk = builder = 0.0
    for k, (a, b) in enumerate(runs):
        reached = drop[k - 1] if k else 0.0
        for j, kib in sorted(pieces.get(k, {}).items()):
            start = max(disk, reached)
            disk = start + kib * KIB / (read_mb_s * 1e3)
            reads.append((k, j, start, disk))
            read_kib.append(kib)
            read_done[j] = disk
        for j in due.get(k, ()):
            start = max(builder, read_done.get(j, 0.0), reached)
            builder = start + footprints[j].build_ms
            builds[j] = (start, builder)
        ready = builds[k][1] if k in builds else 0.0
        end = max(reached, ready) + (footprints[k].invoke_ms or
                                     sum(problem.layers[layer].invoke_ms for layer in range(a, b + 1)))
        # a build holds the GIL: the compute thread, its invoke done, drops the segment once the build ends
        drop[k] = max([end, *(stop for start, stop in builds.values() if start < end < stop)])

    def undone(t: float, start: float, stop: float) -> float:
        return 1.0 if t <= start else 0.0 if t >= stop else (stop - t) / (stop - start)

    mem = [m // KIB for m in plan.resident_bytes]
    for k, (a, b) in enumerate(runs):
        late = sum(undone(drop[k], s0, s1) * kib for (p, j, s0, s1), kib in zip(reads, read_kib) if p <= k < j)
        late += sum(undone(drop[k], *builds[j]) * built_kib[j] for j in builds if build_at[j] <= k < j)
        for layer in range(a, b + 1):
            mem[layer] -= round(late)
    return replace(plan, resident_bytes=tuple(m * KIB for m in mem))


def merge(problem: Problem, plan: OverlapPlan, runs: list[tuple[int, int]], min_segment_ms: float
          ) -> tuple[list[tuple[int, int]], OverlapPlan]:
    """Runs merged left to right while a run is shorter than ``min_segment_ms`` and the shifted plan's peak
    stays within M_peak (and no higher than the solver's, when that was already above it); returns the runs
    and the shifted plan. ``min_segment_ms`` 0 keeps ``runs``."""
    best = shifted(problem, plan, runs)
    if min_segment_ms <= 0 or len(runs) < 2:
        return runs, best
    limit = max(problem.m_peak, best.peak_resident_bytes)
    out = [runs[0]]
    for k in range(1, len(runs)):
        a, b = out[-1]
        if sum(problem.layers[layer].invoke_ms for layer in range(a, b + 1)) < min_segment_ms:
            trial = [*out[:-1], (a, runs[k][1]), *runs[k + 1:]]
            candidate = shifted(problem, plan, trial)
            if candidate.peak_resident_bytes <= limit:
                out[-1] = (a, runs[k][1])
                best = candidate
                continue
        out.append(runs[k])
    return out, best
