"""``profiles/<device-class>.json``: per-segment service times on one device class (DESIGN.md
"Device classes and emulation").

- prefixes carry ``tpu``: ``tpu_compute_ms`` (compute plus per-inference streaming of the parameters that
  do not fit on chip), ``io_ms`` (input and output over the link: SwapLess d/B), ``load_ms`` (reloading
  the prefix's cached parameters after another model evicted them: SwapLess T^Load) and
  ``tpu_ms`` = compute + io;
- suffixes carry ``cpu``: one timing per thread count; threads=1 is SwapLess s^CPU (a pool of k cores runs
  k requests at once), 2..K threads per request are for other planners.

Every timing says where it came from (``measured``, ``emulated``, ``predicted``) and keeps its raw samples
(the simulator draws from them). Standard library only: the device runtime reads and writes this file.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from edgeplan.artifacts import _FIELD_TYPES, _Record
from edgeplan.profile.capacity import LayerLoad, LoadCapacity

SOURCES = ("measured", "emulated", "predicted")
STATUSES = ("ok", "failed", "timeout")
_TRUST = {"measured": 0, "emulated": 1, "predicted": 2}


def least_trusted(*sources: str | None) -> str:
    """The least trustworthy of ``sources`` (measured < emulated < predicted); None entries are skipped."""
    present = [s for s in sources if s]
    return max(present, key=_TRUST.__getitem__) if present else "measured"


@dataclass(frozen=True)
class Host:
    """The machine that ran (or is modelled by) a profile."""

    machine: str
    cpu_model: str
    cores: int
    python: str
    litert: str
    hostname: str = ""


@dataclass(frozen=True)
class CpuTiming:
    """One segment on the CPU with ``threads`` interpreter threads per request.

    ``scale`` is the factor the raw samples were multiplied by to bring them to the device class's reference
    speed (reference probe / this run's probe; 1 when the class sets no reference): every figure here,
    samples included, is at that speed, so profiles taken at different times compare."""

    threads: int
    source: str
    median_ms: float
    mean_ms: float
    p90_ms: float
    mad_ms: float  # median absolute deviation
    samples_ms: tuple[float, ...] = ()
    scale: float = 1.0

    @classmethod
    def from_samples(cls, threads: int, samples_ms: list[float], source: str = "measured",
                     scale: float = 1.0) -> CpuTiming:
        samples_ms = [x * scale for x in samples_ms]
        s = sorted(samples_ms)
        med = statistics.median(s)
        return cls(
            threads=threads,
            source=source,
            median_ms=med,
            mean_ms=statistics.fmean(s),
            p90_ms=s[min(len(s) - 1, round(0.9 * (len(s) - 1)))],
            mad_ms=statistics.median(abs(x - med) for x in s),
            samples_ms=tuple(round(x, 5) for x in samples_ms),
            scale=scale,
        )


def median_at(timings, threads: int) -> float | None:
    """The median of the timing with ``threads`` threads among ``timings``, or None."""
    return next((t.median_ms for t in timings if t.threads == threads), None)


@dataclass(frozen=True)
class TpuTiming:
    """One prefix on the (real or emulated) Edge TPU, DESIGN.md's definitions."""

    source: str
    tpu_compute_ms: float
    io_ms: float
    load_ms: float
    tpu_ms: float  # compute + io: what a published invoke time of a resident model measures
    onchip_param_bytes: int
    offchip_param_bytes: int
    macs: int  # MACs of the ops mapped to the Edge TPU
    tpu_ops: int
    total_ops: int
    samples_ms: tuple[float, ...] = ()


@dataclass(frozen=True)
class SegmentProfile:
    point: int
    role: str  # "prefix" or "suffix"
    file: str  # relative to the artifact directory
    sha256: str
    input_bytes: int
    output_bytes: int
    status: str = "ok"  # "ok", "failed" (error says why), "timeout"
    error: str | None = None
    cpu: tuple[CpuTiming, ...] = ()
    tpu: TpuTiming | None = None
    features: dict = field(default_factory=dict)  # graph features of the segment (the predictor's input)

    def cpu_ms(self, threads: int = 1) -> float | None:
        return median_at(self.cpu, threads)

    def cpu_timing(self, threads: int = 1) -> CpuTiming | None:
        return next((t for t in self.cpu if t.threads == threads), None)

    @property
    def key(self) -> tuple[int, str]:
        return self.point, self.role


@dataclass(frozen=True)
class ConvSpeed:
    """ADaPS §4.3.1 speed_d: seconds per MAC (slope) and per layer (intercept) of a line through the class's
    measured conv times — each conv of the int8 model alone on one thread at a quarter to all of its rows — run
    on the class's CPU (under its ``cpu_quota`` when it is an emulated share of a core)."""

    s_per_mac: float
    s_per_layer: float
    quota: float | None
    macs: tuple[int, ...]
    seconds: tuple[float, ...]


@dataclass(frozen=True)
class Profile(_Record):
    """Every segment of one model version on one device class."""

    device_class: str
    model: str  # "<name>/<version>"
    model_sha256: str
    profiler_version: str
    host: Host
    created: str  # ISO 8601, UTC
    last_point: int  # P
    threads: tuple[int, ...]
    kernels: str  # CPU kernels used: "xnnpack" (the LiteRT default) or "reference"
    settings: dict = field(default_factory=dict)  # warm-up, repeats, budgets, timeouts
    tpu_model: dict = field(default_factory=dict)  # the emulated Edge TPU's constants and fitted values
    segments: tuple[SegmentProfile, ...] = ()
    probe: tuple[CpuTiming, ...] = ()  # the speed probe, timed in the same rounds as the segments (raw)
    load_capacity: LoadCapacity | None = None  # FlashMem §4.2: the streaming layers beside loads, measured
    conv_speed: ConvSpeed | None = None  # ADaPS speed_d (``profile run --conv-speed``), measured

    def probe_ms(self, threads: int = 1) -> float | None:
        """The probe's median in this run, raw (the machine's speed while the segments were timed)."""
        return median_at(self.probe, threads)
    schema_version: int = 1

    def segment(self, point: int, role: str) -> SegmentProfile | None:
        return next((s for s in self.segments if s.point == point and s.role == role), None)

    def summary(self) -> list[dict]:
        """One row per point: ``tpu_ms`` of its prefix, ``cpu_ms`` of its suffix per core count, and the
        least trustworthy source among them (``tpu_source`` / ``cpu_source`` say which is which).

        Point 0 has no prefix (``tpu_ms`` 0) and point P no suffix (``cpu_ms`` 0); a segment that failed
        to profile gives null."""
        rows = []
        for k in range(self.last_point + 1):
            pre, suf = self.segment(k, "prefix"), self.segment(k, "suffix")
            if k == 0:
                tpu_ms, tpu_src = 0.0, None
            elif pre is not None and pre.tpu is not None and pre.status == "ok":
                tpu_ms, tpu_src = round(pre.tpu.tpu_ms, 4), pre.tpu.source
            else:
                tpu_ms, tpu_src = None, None
            if k == self.last_point:
                cpu_ms, cpu_src = {str(n): 0.0 for n in self.threads}, None
            elif suf is not None and suf.status == "ok":
                cpu_ms = {str(t.threads): round(t.median_ms, 4) for t in suf.cpu}
                cpu_src = least_trusted(*(t.source for t in suf.cpu))
            else:
                cpu_ms, cpu_src = {str(n): None for n in self.threads}, None
            rows.append({"point": k, "tpu_ms": tpu_ms, "cpu_ms": cpu_ms,
                         "source": least_trusted(tpu_src, cpu_src), "tpu_source": tpu_src, "cpu_source": cpu_src})
        return rows


_FIELD_TYPES.update({
    ("Profile", "host"): Host,
    ("Profile", "segments"): SegmentProfile,
    ("Profile", "probe"): CpuTiming,
    ("SegmentProfile", "cpu"): CpuTiming,
    ("SegmentProfile", "tpu"): TpuTiming,
    ("Profile", "load_capacity"): LoadCapacity,
    ("Profile", "conv_speed"): ConvSpeed,
    ("LoadCapacity", "layers"): LayerLoad,
})
