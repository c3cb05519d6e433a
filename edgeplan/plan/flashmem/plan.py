"""The overlap plan of one CPU model (FlashMem §3: W, z_w, x_{w,l}) and its bookkeeping.

Stdlib only: the device runtime reads this record to schedule its loader thread; the solver (OR-Tools)
is in ``opg``/``lcopg``, on the pipeline side.
"""
from __future__ import annotations

from dataclasses import dataclass

from edgeplan.artifacts import _FIELD_TYPES, _Record
from edgeplan.plan.flashmem.problem import KIB, Problem


@dataclass(frozen=True)
class Load:
    layer: int  # the loader reads these chunks while this layer runs
    chunks: int


@dataclass(frozen=True)
class WeightPlan:
    """One weight w: preloaded (in W), or read in ``loads`` (x_{w,l}, z_w = the first) and built at
    ``build_layer``, ahead of its layer i_w = ``layer``."""

    layer: int
    name: str
    bytes: int
    chunks: int
    preload: bool
    loads: tuple[Load, ...] = ()
    build_layer: int | None = None

    @property
    def z(self) -> int | None:
        return self.loads[0].layer if self.loads else None


@dataclass(frozen=True)
class WindowStats:
    """One rolling window of LC-OPG: the tier that produced it (C4) and why, the solver's figures."""

    first: int  # layers [first, last] whose weights this window placed
    last: int
    weights: int
    tier: str  # strict | soft-capacity | incremental-preload | greedy-latest-fit
    why: str
    status: str  # CP-SAT status of the solve kept (OPTIMAL, FEASIBLE, ...) or GREEDY
    objective: float | None
    bound: float | None
    gap: float | None  # (objective - bound) / objective, a fraction
    seconds: float


@dataclass(frozen=True)
class OverlapPlan(_Record):
    objective: str
    lam: float
    chunk_bytes: int
    m_peak: int
    window: int
    packed_factor: float
    weights: tuple[WeightPlan, ...]
    windows: tuple[WindowStats, ...]
    resident_bytes: tuple[int, ...]  # predicted, per layer: a prediction beside the measured RSS
    preload_bytes: int
    over_capacity_bytes: int  # reads beyond C_l (soft tier or greedy): where a stall is expected
    over_build_ms: float  # builds beyond a layer's shadow
    schema_version: int = 1
    solve_m_peak: int = 0  # the M_peak the solver planned within (``flashmem.solve_share``; 0: m_peak)
    read_lead: int = 1  # segments a streamed read comes before its segment, at least, where M_peak allowed (``lead``)
    read_in_time: bool = False  # and earlier where the readers would not have it in time (``lead.in_time``)

    @property
    def peak_resident_bytes(self) -> int:
        return max(self.resident_bytes, default=0)


_FIELD_TYPES.update({("WeightPlan", "loads"): Load, ("OverlapPlan", "weights"): WeightPlan,
                     ("OverlapPlan", "windows"): WindowStats})


class Ledger:
    """What each layer holds: resident KiB (its own arena while it runs, and committed weights), KiB read,
    build microseconds."""

    def __init__(self, problem: Problem):
        self.problem = problem
        n = problem.n
        self.mem = [problem.arena_kib(ell) for ell in range(n)]  # the running segment's arena, then committed weights
        self.read = [0] * n
        self.build = [0] * n

    def commit(self, w: WeightPlan, sign: int = 1) -> None:
        """Add what ``w`` holds, reads and builds (``sign`` -1: take a committed ``w`` back out)."""
        p, i = self.problem, w.layer
        if w.preload:
            for ell in range(i + 1):
                self.mem[ell] += sign * p.full_kib(i)
            return
        ck = p.chunk_kib(i)
        for load in w.loads:
            self.read[load.layer] += sign * load.chunks * ck
            for ell in range(load.layer, i + 1):
                self.mem[ell] += sign * load.chunks * ck
        if w.build_layer is not None:
            self.build[w.build_layer] += sign * p.build_us(i)
            for ell in range(w.build_layer, i + 1):
                self.mem[ell] += sign * p.packed_kib(i)

    def copy(self) -> "Ledger":
        out = Ledger.__new__(Ledger)
        out.problem, out.mem, out.read, out.build = self.problem, list(self.mem), list(self.read), list(self.build)
        return out

    def mem_room(self, ell: int) -> int:
        return self.problem.m_peak_kib - self.mem[ell]

    def read_room(self, ell: int) -> int:
        return self.problem.capacity_kib(ell) - self.read[ell]

    def build_room(self, ell: int) -> int:
        return self.problem.capacity_build_us(ell) - self.build[ell]

    def over_capacity(self) -> tuple[int, int]:
        """KiB read and build microseconds beyond the layers' capacities, summed over the layers."""
        layers = range(self.problem.n)
        return (sum(max(0, -self.read_room(ell)) for ell in layers),
                sum(max(0, -self.build_room(ell)) for ell in layers))


def finish(problem: Problem, ledger: Ledger, weights: list[WeightPlan], windows: list[WindowStats]) -> OverlapPlan:
    """The plan record with its predicted residency and the over-capacity it accepted (``ledger``: every one
    of ``weights`` committed)."""
    over_read, over_build = ledger.over_capacity()
    return OverlapPlan(
        objective=problem.objective, lam=problem.lam, chunk_bytes=problem.chunk_bytes, m_peak=problem.m_peak,
        window=problem.window, packed_factor=problem.packed_factor, weights=tuple(weights),
        windows=tuple(windows), resident_bytes=tuple(m * KIB for m in ledger.mem),
        preload_bytes=sum(w.bytes for w in weights if w.preload), over_capacity_bytes=over_read * KIB,
        over_build_ms=over_build / 1000)


def groups(plan: OverlapPlan, n: int) -> list[tuple[int, int]]:
    """Streaming segments as runs of layers (§4.3 adapted): a layer joins the run before it when both hold
    only preloaded (or no) weights and nothing is read or built while it runs — the loader needs a segment
    boundary wherever it acts, and a merged run saves an invoke (~20 µs here) per layer it absorbs."""
    by_layer = {w.layer: w for w in plan.weights}
    acts = {load.layer for w in plan.weights for load in w.loads} | {
        w.build_layer for w in plan.weights if w.build_layer is not None}

    def preloaded(i: int) -> bool:
        return i not in by_layer or by_layer[i].preload

    out: list[tuple[int, int]] = []
    for i in range(n):
        if out and i not in acts and preloaded(i) and all(preloaded(j) for j in range(out[-1][0], i)):
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


@dataclass(frozen=True)
class RunLoads:
    """What the runtime does for one segment (a run of layers) that streams: ``reads`` = per streamed weight
    (its layer), the chunks it reads at each segment position; ``build`` = the position whose invoke shadows the
    segment's build; ``chunks`` = the streamed weights' chunks."""

    reads: dict[int, dict[int, int]]
    build: int
    chunks: int


def run_loads(plan: OverlapPlan, runs: list[tuple[int, int]]) -> list[RunLoads | None]:
    """``plan`` carried out over the segments ``runs`` (one per run; None: read and built before the first
    invoke, as the first segment and one with only preloaded weights are). A segment is read and built whole
    before it runs: each read the plan placed at a layer moves to the segment holding that layer, and one placed
    inside the segment itself to the segment before it; the build goes to the latest segment any of its weights
    names, no later than the one before it and no earlier than its last read. The runtime's loader schedule
    (``runtime.stream.schedule``) and the merged plan (``merge.shifted``) both follow this."""
    seg = {layer: k for k, (a, b) in enumerate(runs) for layer in range(a, b + 1)}
    streamed: dict[int, list[WeightPlan]] = {}
    for w in plan.weights:
        if not w.preload:
            streamed.setdefault(seg[w.layer], []).append(w)
    out: list[RunLoads | None] = []
    for k in range(len(runs)):
        ws = streamed.get(k, [])
        if k == 0 or not ws:
            out.append(None)
            continue
        reads: dict[int, dict[int, int]] = {}
        for w in ws:
            at = reads.setdefault(w.layer, {})
            for load in w.loads:
                pos = min(seg[load.layer], k - 1)
                at[pos] = at.get(pos, 0) + load.chunks
        build = min(max(seg[w.build_layer] for w in ws), k - 1)
        out.append(RunLoads(reads, max(build, max(pos for at in reads.values() for pos in at)),
                            sum(w.chunks for w in ws)))
    return out


@dataclass(frozen=True)
class StreamSegment:
    """One segment the device streams: a run of layers cut from the model's split int8 model."""

    file: str  # relative to the deployment directory (a blob of the bundle)
    sha256: str
    size: int
    op: str
    first_layer: int
    last_layer: int
    inputs: tuple[str, ...]
    # what it holds (``merge.Footprint``), when the plan's footprint is "segments": measured once built here, and
    # the activations the runtime keeps while it runs (its inputs, earlier outputs read later, its outputs)
    built_bytes: int = 0
    arena_bytes: int = 0
    live_bytes: int = 0
    build_ms: float = 0.0
    invoke_ms: float = 0.0  # its first invoke once built, measured with the rest
    # how the runtime builds it (``runtime.stream.KERNELS``): ``unpacked`` where that measured faster here
    # (``flashmem.segment_kernels``); the figures above are that build's
    kernels: str = "xnnpack"


@dataclass(frozen=True)
class ModelStreamPlan:
    """One model of a deployment streamed on the CPU (its whole int8 model: point 0)."""

    name: str
    version: str
    split_sha256: str  # stream/model_split.tflite the segments were cut from
    capacity_source: str  # measured | predicted
    segments: tuple[StreamSegment, ...]
    plan: OverlapPlan
    preload_peak_bytes: int  # the same weights all preloaded and built: the plan's arithmetic, for comparison
    # what plan.resident_bytes counts for each segment: "segments" (what the cut segments hold, measured once
    # built, and the activations kept between them) or "layers" (the profile's per-layer figures)
    footprint: str = "layers"
    read_mb_s: float = 0.0  # the runtime's readers, cold, measured with the segments ("segments" footprint only)


@dataclass(frozen=True)
class FlashMemPlan(_Record):
    """``deployments/<name>/plans/flashmem.json``."""

    deployment: str
    device_class: str
    m_peak: int
    models: tuple[ModelStreamPlan, ...]
    schema_version: int = 1


_FIELD_TYPES.update({("ModelStreamPlan", "segments"): StreamSegment, ("ModelStreamPlan", "plan"): OverlapPlan,
                     ("FlashMemPlan", "models"): ModelStreamPlan})
