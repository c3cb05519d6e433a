"""The overlap-plan problem of one CPU model (FlashMem §3.1–3.2, Table 2), in the CPU analogue.

Paper: disk -> unified memory -> texture memory. Here: a bundle blob -> process memory (``pread``) -> a
built LiteRT interpreter holding XNNPACK-packed weights. A *layer* is one weighted int8 op with the
weight-free ops after it, run as (part of) one segment; its *weight* w is its constant bytes, T(w) chunks of
S bytes; i_w is the layer that consumes it (Table 2). Loading a chunk "at layer l" means the loader thread
reads it while layer l runs; the layer's segment is *built* (interpreter construction, which holds the GIL)
at one layer in the shadow of that layer's invoke, after all its chunks are read.

Departures from the paper, each because the CPU differs:
- M_peak bounds *everything* resident for the model's weights at a layer, preloaded weights included
  (the paper's M_peak excludes the persistent preloaded set W; here a preloaded segment is dropped after
  its use like any other, and the device class's RAM budget is one number). A weight counts from its first
  chunk read (or from the start, when preloaded) until its layer has run; once built, its packed copy
  (``packed_factor`` x its bytes) counts too.
- C3 has two capacities per layer: bytes read (``capacity_chunks`` x S) and build time
  (``capacity_build_ms``), because a build, not a read, is what slows the compute thread here.

Units inside the solver are integers: memory and reads in KiB, build time in microseconds, so CP-SAT
works on exact integer coefficients; chunks are per weight (``chunk_kib``: a small weight is one chunk of
its own size, not a full S).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from edgeplan.errors import MemoryBudgetError, PlanError

OP_CLASSES = ("elemental", "reusable", "hierarchical")  # FlashMem Table 5
OBJECTIVES = ("paper", "resident")
KIB = 1024


@dataclass(frozen=True)
class Layer:
    """One layer l of the execution order: its weight and what it can absorb while it runs (C_l)."""

    name: str
    weight_bytes: int
    invoke_ms: float  # its time alone
    op_class: str  # elemental | reusable | hierarchical
    capacity_chunks: int  # C_l: chunks of S bytes it can read beside itself within its class threshold
    capacity_build_ms: float  # interpreter build time it can shadow (0 for hierarchical layers)
    build_ms: float = 0.0  # building this layer's own segment
    built_bytes: int | None = None  # measured resident set of its built segment beyond the blob (else packed_factor)
    arena_bytes: int = 0  # its segment's arena, resident while it runs (the runtime drops a segment after it runs)


@dataclass(frozen=True)
class Problem:
    layers: tuple[Layer, ...]
    chunk_bytes: int  # S
    m_peak: int  # bytes
    lam: float = 0.9  # λ: preload against distance (FlashMem §3.2 "λ close to 0.9" for memory priority)
    objective: str = "resident"
    window: int = 100  # rolling window (§3.2 "Implementation Considerations"): layers placed per solve
    lookback: int = 100  # L(w): how many layers before its use a weight may be read
    packed_factor: float = 1.0  # bytes of a built segment beyond its read weights, per weight byte
    time_limit_s: float = 10.0  # per CP-SAT solve
    workers: int = 2

    def __post_init__(self) -> None:
        if self.chunk_bytes <= 0:
            raise PlanError(f"flashmem.chunk_bytes must be positive, got {self.chunk_bytes}")
        if not 0.0 <= self.lam <= 1.0:
            raise PlanError(f"flashmem.lambda must be in [0, 1], got {self.lam}")
        if self.objective not in OBJECTIVES:
            raise PlanError(f"flashmem.objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.window < 1 or self.lookback < 1:
            raise PlanError(f"flashmem.window and flashmem.lookback must be at least 1 layer, got "
                            f"{self.window} and {self.lookback}")
        for i, layer in enumerate(self.layers):
            if layer.op_class not in OP_CLASSES:
                raise PlanError(f"layer {i} ({layer.name}): op class {layer.op_class!r} is not one of {OP_CLASSES}")
            if layer.weight_bytes < 0 or layer.capacity_chunks < 0 or layer.capacity_build_ms < 0:
                raise PlanError(f"layer {i} ({layer.name}): negative weight bytes or capacity")

    @property
    def n(self) -> int:
        return len(self.layers)

    def chunks(self, i: int) -> int:
        """T(w) of layer i's weight (0 for a weight-free layer)."""
        return math.ceil(self.layers[i].weight_bytes / self.chunk_bytes)

    def chunk_kib(self, i: int) -> int:
        """KiB one chunk of layer i's weight occupies (its bytes spread evenly over its chunks)."""
        t = self.chunks(i)
        return math.ceil(self.layers[i].weight_bytes / t / KIB) if t else 0

    def packed_kib(self, i: int) -> int:
        """KiB a built segment holds beyond its read weights: measured (packed weights, arena, interpreter) when
        the profile has it, else ``packed_factor`` x its weights."""
        built = self.layers[i].built_bytes
        return math.ceil((built if built is not None else self.packed_factor * self.layers[i].weight_bytes) / KIB)

    def full_kib(self, i: int) -> int:
        """KiB layer i's weight occupies once read and built."""
        return self.chunks(i) * self.chunk_kib(i) + self.packed_kib(i)

    def arena_kib(self, i: int) -> int:
        return math.ceil(self.layers[i].arena_bytes / KIB)

    def capacity_kib(self, i: int) -> int:
        return self.layers[i].capacity_chunks * math.ceil(self.chunk_bytes / KIB)

    def build_us(self, i: int) -> int:
        return round(self.layers[i].build_ms * 1000)

    def capacity_build_us(self, i: int) -> int:
        return round(self.layers[i].capacity_build_ms * 1000)

    @property
    def m_peak_kib(self) -> int:
        return self.m_peak // KIB

    def load_layers(self, i: int) -> range:
        """L(w) for layer i's weight: the ``lookback`` layers before it (§3.1.2)."""
        return range(max(0, i - self.lookback), i)

    def weights(self) -> list[int]:
        return [i for i in range(self.n) if self.layers[i].weight_bytes > 0]


def _pair_kib(problem: Problem, i: int) -> tuple[int, int]:
    """Layer i's weight (with its arena: it runs) and the next one's, read and built."""
    return problem.full_kib(i) + problem.arena_kib(i), problem.full_kib(i + 1) if i + 1 < problem.n else 0


def min_m_peak(problem: Problem) -> int:
    """The smallest M_peak (bytes) ``check_budget`` accepts: the largest two consecutive weights read and built,
    the first running."""
    return max((sum(_pair_kib(problem, i)) for i in range(problem.n)), default=0) * KIB


def check_budget(problem: Problem) -> None:
    """Refuse an M_peak no plan can meet: a layer runs (its arena resident) with its weight built while the next
    one's is read and built, so every two consecutive weights must fit together. Names the layer and the split
    that fits."""
    m = problem.m_peak_kib
    for i in range(problem.n):
        here, nxt = _pair_kib(problem, i)
        if here + nxt <= m:
            continue
        big = i if here >= nxt else i + 1
        layer = problem.layers[big]
        other = nxt if big == i else here
        room = m - other
        blob = problem.chunks(big) * problem.chunk_kib(big)
        parts = math.ceil(problem.full_kib(big) / room) if room > 0 else None
        # splitting along output channels divides the weights and what grows with them; not an arena or buffers
        # sized by the activations
        if blob * 2 < problem.full_kib(big) + (problem.arena_kib(big) if big == i else 0):
            split = "most of it is activations and buffers, which a split does not shrink"
        elif parts and parts < 1024:
            split = (f"splitting {layer.name} along output channels into {parts} parts (flashmem.max_segment_bytes "
                     f"<= {room * KIB // (1 + problem.packed_factor):.0f}) fits")
        else:
            split = "no split fits beside its neighbour"
        raise MemoryBudgetError(
            f"M_peak {problem.m_peak / 2**20:.1f} MiB is below what layers {i} and {i + 1} need at once "
            f"({(here + nxt) / 1024:.1f} MiB read, built and running): layer {big} ({layer.name}) holds "
            f"{layer.weight_bytes / 2**20:.1f} MiB of weights, {problem.full_kib(big) / 1024:.1f} MiB read and "
            f"built, a {problem.arena_kib(big) / 1024:.1f} MiB arena; {split}; or raise M_peak "
            f"(at least {min_m_peak(problem) / 2**20:.1f} MiB).")
