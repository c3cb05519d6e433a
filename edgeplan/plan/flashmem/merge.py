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
    over_read = sum(max(0, -ledger.read_room(layer)) for layer in range(problem.n))
    over_build = sum(max(0, -ledger.build_room(layer)) for layer in range(problem.n))
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
    """``plan`` (``shifted`` over ``runs``) with the residency the runtime meets where a segment's invoke is
    shorter than the loads planned beside it. The runtime drops a segment as soon as it has run, and the loads
    planned at its position go on after: the ledger holds them all beside the segment, the runtime holds only
    the share done by then. Per segment, the loads at its position take the reads' bytes at ``read_mb_s`` (the
    runtime's readers, cold, measured) and the builds' measured ms, one after the other; its invoke, its layers'
    times alone. The share of those loads beyond the invoke (their read bytes and built bytes) is left out of
    what the segment's layers hold; the stall before the next segment holds it all, and the ledger counts that
    there already. ResNet50V2 streamed: its 1-ms segment 15 has a 6.3 MiB segment read and built beside it; the
    ledger's 15.6 MiB there, measured 3.2-3.6 during the invoke and 13.4-13.8 in the stall after."""
    if read_mb_s <= 0:
        raise ValueError(f"a read rate of {read_mb_s} MB/s")
    seg = {layer: k for k, (a, b) in enumerate(runs) for layer in range(a, b + 1)}
    read_kib, built_kib, build_ms = [0] * len(runs), [0] * len(runs), [0.0] * len(runs)
    built_where: dict[int, int] = {}  # segment -> the position its build is planned at
    for w in plan.weights:
        if w.preload:
            continue
        for load in w.loads:
            read_kib[seg[load.layer]] += load.chunks * problem.chunk_kib(w.layer)
        if w.build_layer is not None:
            at = seg[w.build_layer]
            built_kib[at] += problem.packed_kib(w.layer)
            built_where[seg[w.layer]] = at
    for k, at in built_where.items():
        build_ms[at] += footprints[k].build_ms
    mem = [b // KIB for b in plan.resident_bytes]
    for k, (a, b) in enumerate(runs):
        loads_ms = read_kib[k] * KIB / (read_mb_s * 1e3) + build_ms[k]
        invoke_ms = sum(problem.layers[layer].invoke_ms for layer in range(a, b + 1))
        if loads_ms > invoke_ms:
            late = round((1 - invoke_ms / loads_ms) * (read_kib[k] + built_kib[k]))
            for layer in range(a, b + 1):
                mem[layer] -= late
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
