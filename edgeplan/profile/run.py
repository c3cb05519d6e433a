"""``edgeplan profile run``: every segment of a model version on one device class -> ``profiles/<class>.json``.

Prefixes get Edge TPU times (the emulated Edge TPU for ``*-emulated`` accelerators), suffixes CPU times per
thread count (measured on this machine when the class's CPU is ``measured``; a sample measured and the rest
``predicted`` when a predictor and a sample size are given; all predicted for classes modelling another host).
"""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from edgeplan.artifacts import Analysis, CompileReport, ModelInfo
from edgeplan.errors import ArtifactError, ProfileError
from edgeplan.profile import cpu as cpu_mod
from edgeplan.profile import tpu_model
from edgeplan.profile.capacity import LoadCapacity
from edgeplan.profile.capacity import measure as measure_capacity
from edgeplan.profile.features import segment_features, tpu_workload
from edgeplan.profile.fleet import DeviceClass
from edgeplan.profile.schema import (
    ConvSpeed,
    CpuTiming,
    Host,
    Profile,
    SegmentProfile,
    TpuTiming,
    median_at,
)
from edgeplan.quantize.tflite_graph import TfliteGraph

log = logging.getLogger(__name__)
PROFILER_VERSION = "edgeplan-profiler-1"
Progress = Callable[[str, int, int], None]


def _noop(stage: str, done: int, total: int) -> None:
    pass


@dataclass(frozen=True)
class Segment:
    point: int
    role: str
    path: Path
    rel: str


def segments(root: Path, analysis: Analysis) -> list[Segment]:
    """Prefixes of points 1..P and suffixes of points 0..P-1, in point order."""
    out = []
    for p in analysis.points:
        if p.index > 0:
            out.append(Segment(p.index, "prefix", root / f"segments/p{p.index}/prefix_int8.tflite",
                               f"segments/p{p.index}/prefix_int8.tflite"))
        if p.index < analysis.last:
            out.append(Segment(p.index, "suffix", root / f"segments/p{p.index}/suffix_int8.tflite",
                               f"segments/p{p.index}/suffix_int8.tflite"))
    return out


def emulator(device_class: DeviceClass) -> tpu_model.EmulatedEdgeTpu | None:
    acc = device_class.accelerator
    if acc.kind == "none":
        return None
    if not acc.emulated:
        raise ProfileError(
            f"device class {device_class.name!r} has a real Edge TPU ({acc.kind}): its prefixes are timed on one of "
            f"its devices (edgeplan-runtime profile), not on this machine, which has none")
    try:
        return tpu_model.for_host(acc.calibration_host, link_bytes_per_s=acc.link_bytes_per_s,
                                  onchip_param_bytes=acc.onchip_param_bytes)
    except ValueError as e:
        raise ProfileError(f"device class {device_class.name!r}: {e}") from e


def sample_points(points: list[int], n: int) -> set[int]:
    """``n`` of ``points`` spread evenly from first to last (all of them when n >= len)."""
    if n >= len(points):
        return set(points)
    if n <= 1:
        return {points[0]}
    return {points[round(i * (len(points) - 1) / (n - 1))] for i in range(n)}


def profile(root: Path, device_class: DeviceClass, settings: cpu_mod.Settings, progress: Progress = _noop, *,
            predictor=None, sample: int | None = None, cpu_prefixes: bool = False,
            capacity_rounds: int = 0, conv_speed: bool = False) -> Profile:
    """Profile the artifact directory ``root``; writes ``root/profiles/<class>.json`` and returns it.

    ``cpu_prefixes`` also times prefixes on the CPU (training data for the predictor). ``capacity_rounds`` > 0
    also measures the load capacity of the streaming layers (``stream/``, when the stream stage has run) on
    a class whose CPU is measured here. ``conv_speed`` also fits the class's seconds per MAC on its conv times
    (ADaPS speed_d; under the class's ``cpu_quota`` when it has one); without it, a fit the previous profile of
    the same model holds is kept."""
    root = Path(root)
    analysis = Analysis.load(root / "analysis.json")
    if not analysis.complete:
        raise ArtifactError(f"{root / 'analysis.json'}: not completed by the build stage; run `edgeplan compile`.")
    info = ModelInfo.load(root / "model.json")
    if conv_speed and device_class.cpu != "measured":
        raise ProfileError(f"device class {device_class.name!r} models another host (cpu: {device_class.cpu}): its conv "
                           "speed can only be measured on it")
    if (device_class.cpu == "predicted" or sample is not None) and predictor is None:
        raise ProfileError(f"device class {device_class.name!r}: CPU times to predict "
                           f"({'the class models another host' if device_class.cpu == 'predicted' else '--sample'}) "
                           f"but no predictor was given (--predictor FILE, from `edgeplan profile train`)")
    tpu = emulator(device_class)
    segs = segments(root, analysis)
    suffix_points = [s.point for s in segs if s.role == "suffix"]
    measured_points = set() if device_class.cpu == "predicted" else (
        sample_points(suffix_points, sample) if sample is not None else set(suffix_points))
    threads = list(device_class.threads)

    results = [_static(seg, root, tpu) for seg in segs]
    progress("segments", len(segs), len(segs))
    to_measure = [i for i, (seg, r) in enumerate(zip(segs, results)) if r.status == "ok" and (
        (seg.role == "suffix" and seg.point in measured_points)
        or (seg.role == "prefix" and cpu_prefixes and device_class.cpu == "measured"))]
    probe: tuple[CpuTiming, ...] = ()
    if to_measure:
        with cpu_mod.Profiler(settings) as profiler:
            found, probe_m = profiler.measure_many([str(segs[i].path) for i in to_measure], threads, progress)
        if probe_m is not None:
            probe = tuple(CpuTiming.from_samples(n, v) for n, v in sorted(probe_m.samples_ms.items()))
        scale = {n: _scale(device_class, probe, n) for n in threads}
        for i, m in zip(to_measure, found):
            if m.status != "ok":
                log.warning("%s", m.error)
            cpu = tuple(CpuTiming.from_samples(n, m.samples_ms[n], scale=scale[n]) for n in threads if n in m.samples_ms)
            results[i] = replace(results[i], status=m.status, error=m.error, cpu=cpu)
    for i, (seg, r) in enumerate(zip(segs, results)):
        if r.status == "ok" and seg.role == "suffix" and seg.point not in measured_points:
            results[i] = replace(r, cpu=tuple(
                predictor.timing(r.features, n, device_class, _reference(device_class, probe, n)) for n in threads))
    load = None
    if capacity_rounds > 0 and device_class.cpu == "measured" and (root / "stream" / "stream.json").is_file():
        load = load_capacity(root, capacity_rounds, progress)
    speed = _conv_speed(root, device_class) if conv_speed else _kept_conv_speed(root, device_class, info.sha256)
    prof = Profile(
        device_class=device_class.name,
        model=f"{info.name}/{info.version}",
        model_sha256=info.sha256,
        profiler_version=PROFILER_VERSION,
        host=Host(**cpu_mod.host()),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        last_point=analysis.last,
        threads=tuple(threads),
        kernels=settings.kernels,
        settings=dict(settings.__dict__),
        tpu_model=tpu.describe() if tpu else {},
        segments=tuple(results),
        probe=probe,
        load_capacity=load,
        conv_speed=speed,
    )
    prof.save(root / "profiles" / f"{device_class.name}.json")
    return prof


def _conv_speed(root: Path, device_class: DeviceClass) -> ConvSpeed:
    from edgeplan.plan.spatial import speed

    fit = speed.measure(root / "model_int8.tflite", device_class.cpu_quota)
    return ConvSpeed(fit["s_per_mac"], fit["s_per_layer"], fit["quota"], tuple(int(m) for m, _ in fit["points"]),
                     tuple(float(t) for _, t in fit["points"]))


def _kept_conv_speed(root: Path, device_class: DeviceClass, model_sha256: str) -> ConvSpeed | None:
    """The fit of the profile being replaced, when it was made for this model and under the same quota."""
    path = root / "profiles" / f"{device_class.name}.json"
    try:
        old = Profile.load(path) if path.is_file() else None
    except (ArtifactError, ValueError, TypeError, KeyError):
        return None
    if old is None or old.model_sha256 != model_sha256 or old.conv_speed is None or \
            old.conv_speed.quota != device_class.cpu_quota:
        return None
    return old.conv_speed


def _reference(device_class: DeviceClass, probe: tuple[CpuTiming, ...], threads: int) -> float | None:
    """The probe time the profile's CPU figures are expressed at: the class's reference, else this run's."""
    ref = (device_class.cpu_probe_ms or {}).get(threads)
    return ref if ref is not None else median_at(probe, threads)


def _scale(device_class: DeviceClass, probe: tuple[CpuTiming, ...], threads: int) -> float:
    ref, run = (device_class.cpu_probe_ms or {}).get(threads), median_at(probe, threads)
    return ref / run if ref and run else 1.0


def _static(seg: Segment, root: Path, tpu) -> SegmentProfile:
    """Everything but the CPU times: file digest, graph features, Edge TPU times of a prefix."""
    if not seg.path.is_file():
        err = root / f"segments/p{seg.point}/error.json"
        why = f" (the build stage failed there: see {err})" if err.is_file() else ""
        return SegmentProfile(seg.point, seg.role, seg.rel, "", 0, 0, status="failed",
                              error=f"{seg.path}: missing{why}")
    data = seg.path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    try:
        graph = TfliteGraph(data)
        feats = segment_features(graph)
    except Exception as e:  # noqa: BLE001 - a segment that cannot be parsed is recorded, the others go on
        return SegmentProfile(seg.point, seg.role, seg.rel, sha, 0, 0, status="failed",
                              error=f"{seg.path}: cannot read the model ({type(e).__name__}: {e})")
    tpu_timing = None
    if seg.role == "prefix" and tpu is not None:
        report = CompileReport.load(seg.path.parent / "compile.json")
        w = tpu_workload(graph, report, tpu.onchip_param_bytes)
        t = tpu.times(w)
        tpu_timing = TpuTiming("emulated", round(t.tpu_compute_ms, 5), round(t.io_ms, 5), round(t.load_ms, 5),
                               round(t.tpu_ms, 5), w.onchip_param_bytes, w.offchip_param_bytes, w.macs,
                               report.tpu_ops, report.total_ops, (round(t.tpu_ms, 5),))
    return SegmentProfile(seg.point, seg.role, seg.rel, sha, feats["input_bytes"], feats["output_bytes"],
                          tpu=tpu_timing, features=feats)


def load_capacity(root: Path, rounds: int, progress: Progress = _noop) -> LoadCapacity:
    """The streaming layers of ``root/stream`` timed alone, beside a paced loader and beside a build
    (``profile.capacity``); the loader reads a scratch file of random bytes, removed afterwards."""
    import os

    from edgeplan.artifacts import StreamInfo
    from edgeplan.scratch import scratch

    info = StreamInfo.load(root / "stream" / "stream.json")
    segs = []
    for layer in info.layers:
        data = (root / layer.file).read_bytes()
        if hashlib.sha256(data).hexdigest() != layer.sha256:
            raise ArtifactError(f"{root / layer.file}: not the bytes stream.json names; run `edgeplan stream {root}`")
        segs.append((layer.name, layer.op, layer.weight_bytes, data))
    with scratch("capacity") as tmp:
        loader_file = tmp / "scratch.bin"
        loader_file.write_bytes(os.urandom(32 << 20))
        return measure_capacity(segs, loader_file, cpu_mod.PROBE, rounds=rounds,
                                report=lambda done, total: progress("load capacity", done, total))
