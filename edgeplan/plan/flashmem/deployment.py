"""``edgeplan plan flashmem``: the overlap plan of every model of a deployment, pipeline-side.

Per model: its streaming layers (``stream/stream.json``), their measured load capacity and times
(``profiles/<class>.json``), M_peak from the device class (``flashmem.m_peak_ram_share`` of its RAM, less the
partitions SwapLess preloads for fast switching when its plan exists), LC-OPG within ``flashmem.solve_share`` of
M_peak, then the segments the plan runs — runs of layers (``plan.groups``, then merged while shorter than
``flashmem.min_segment_ms``: ``merge``) cut from ``stream/model_split.tflite`` into
``deployments/<name>/flashmem/<model>/`` — each named in the plan by its sha256. The plan recorded is the solver's
shifted to what the runtime does over those segments, its reads then given up to ``flashmem.read_lead`` segments of
lead within M_peak (``lead.hoist``) — with ``flashmem.read_in_time``, more where the readers, reading in turn at
their measured rate, would not have a segment in before its measured invokes reach it (``lead.in_time``) —, its
predicted residency from what the cut segments hold, measured here once
built (``profile.footprint``), and the activations the runtime keeps between them (from the graph), less what the
runtime has not loaded yet while a segment shorter than its loads runs (``merge.expected``, at the readers' cold
rate measured with them); the layers' own figures when that measuring fails (the plan's ``footprint`` says which).
"""
from __future__ import annotations

import hashlib
import logging
import math
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from edgeplan.artifacts import StreamInfo, write_bytes_atomic
from edgeplan.bundle.validate import PLANNERS
from edgeplan.errors import ArtifactError, PlanError, ProfileError
from edgeplan.pipeline.planning import deployment, resolve_version
from edgeplan.plan.flashmem import lcopg
from edgeplan.plan.flashmem.lead import hoist
from edgeplan.plan.flashmem.merge import expected, footprints_of, measured, merge, shifted
from edgeplan.plan.flashmem.plan import (
    FlashMemPlan,
    ModelStreamPlan,
    OverlapPlan,
    StreamSegment,
    groups,
)
from edgeplan.plan.flashmem.problem import Layer, Problem, check_budget, min_m_peak
from edgeplan.profile import capacity as cap
from edgeplan.profile import fleet as fleet_mod
from edgeplan.profile import footprint
from edgeplan.profile.schema import Profile

log = logging.getLogger(__name__)


def m_peak_bytes(root: Path, name: str, ram_bytes: int, settings: dict) -> int:
    explicit = settings.get("m_peak_bytes")
    if explicit:
        return int(explicit)
    budget = int(ram_bytes * float(settings["m_peak_ram_share"]))
    swapless = Path(root) / "deployments" / name / "plans" / "swapless.json"
    if swapless.is_file():
        from edgeplan.plan.swapless.plan import SwapLessPlan

        budget -= sum(p.bytes for p in SwapLessPlan.load(swapless).preload)
    if budget <= 0:
        raise PlanError(f"deployment {name!r}: no memory left for streaming (M_peak {budget} bytes after SwapLess's "
                        "preloaded partitions); raise flashmem.m_peak_ram_share or set flashmem.m_peak_bytes")
    return budget


def problem(info: StreamInfo, load: cap.LoadCapacity, settings: dict, m_peak: int) -> Problem:
    if [x.name for x in load.layers] != [x.name for x in info.layers]:
        raise ArtifactError("the profile's load capacity was measured on other streaming layers than stream.json's; "
                            "run `edgeplan profile run` again")
    chunk = int(settings["chunk_bytes"])
    layers = []
    for layer in load.layers:
        chunks, build = cap.capacity(layer, load.rates_mb_s, chunk)
        layers.append(Layer(layer.name, layer.weight_bytes, layer.alone_ms, layer.op_class, chunks, build,
                            layer.build_ms, layer.built_bytes or None, layer.arena_bytes))
    return Problem(tuple(layers), chunk, m_peak, lam=float(settings["lambda"]), objective=settings["objective"],
                   window=int(settings["window"]), lookback=int(settings["lookback"]),
                   time_limit_s=float(settings["time_limit_s"]))


def plan_flashmem(root: Path, name: str, params: dict, m_peak: int | None = None,
                  progress=lambda model, done, total: None, variants: dict[str, dict] | None = None
                  ) -> tuple[FlashMemPlan, Path]:
    """Plans every model of deployment ``name`` and writes ``plans/flashmem.json``; returns the plan and its path.
    ``variants`` ({file stem: flashmem settings overriding ``segment_kernels``, ``read_lead``, ``read_in_time``}):
    more plans from the same solve, cut and measured segments, written beside it as ``plans/<stem>.json`` — what
    a comparison of those settings needs without two CP-SAT solves' difference mixed in (the bench)."""
    settings = params["flashmem"]
    dep = deployment(params, name)
    dc = fleet_mod.load(params, {d["name"] for d in params.get("deployments") or []}).device_class(dep["device_class"])
    budget = m_peak if m_peak is not None else m_peak_bytes(root, name, dc.ram_bytes, settings)
    out_dir = Path(root) / "deployments" / name
    share = float(settings["solve_share"])
    if not 0.0 < share <= 1.0:
        raise PlanError(f"flashmem.solve_share must be in (0, 1], got {share}")
    finishes = {"flashmem": _finishing(settings)}
    for stem, override in (variants or {}).items():
        if stem in PLANNERS or not stem.replace("-", "").replace("_", "").isalnum():
            raise PlanError(f"a plan variant named {stem!r}: use letters, digits, - and _, and no planner's name "
                            f"({', '.join(PLANNERS)})")
        finishes[stem] = _finishing({**settings, **override})
    measure_unpacked = any(f.kernels != "xnnpack" for f in finishes.values())
    models: dict[str, list[ModelStreamPlan]] = {stem: [] for stem in finishes}
    for m in dep["models"]:
        version = resolve_version(root, m["name"], str(m.get("version", "latest")))
        d = Path(root) / m["name"] / version
        if not (d / "stream" / "stream.json").is_file():
            raise ArtifactError(f"{d / 'stream' / 'stream.json'}: missing; run `edgeplan stream {d}` first")
        info = StreamInfo.load(d / "stream" / "stream.json")
        path = d / "profiles" / f"{dc.name}.json"
        if not path.is_file():
            raise ProfileError(f"{path}: missing; run `edgeplan profile run {d} --device-class {dc.name}` first")
        load = Profile.load(path).load_capacity
        if load is None:
            raise ProfileError(f"{path}: no load capacity measured (the class's CPU is not measured here, or "
                               "flashmem.capacity_rounds is 0); FlashMem plans from measured load capacity")
        prob = problem(info, load, settings, budget)
        check_budget(prob)
        # the solver plans within a share of M_peak; the reads take the rest as lead (``lead``)
        room = replace(prob, m_peak=min(budget, max(int(share * budget), int(min_m_peak(prob) * 1.05))))
        solved = lcopg.plan(room, lambda done, total, n=m["name"]: progress(n, done, total))
        runs, merged = merge(room, solved, groups(solved, len(info.layers)), float(settings["min_segment_ms"]))
        segments, live = _cut(d, info, runs, out_dir, f"flashmem/{m['name']}")
        try:
            held = footprint.measure([out_dir / s.file for s in segments], unpacked=measure_unpacked)
        except ProfileError as e:
            log.warning("%s: predicted residency from its layers' figures: %s", m["name"], e)
            held = None
        preload_peak = sum(prob.full_kib(i) for i in range(prob.n)) * 1024
        cut = _Cut(prob, solved, runs, merged, tuple(segments), tuple(live), held)
        for stem, finish in finishes.items():
            segs, overlap, source, read_mb_s = finish.of(cut)
            models[stem].append(ModelStreamPlan(m["name"], version, info.split_sha256, "measured", segs, overlap,
                                                preload_peak, source, read_mb_s))
    written = {}
    for stem, plans in models.items():
        written[stem] = FlashMemPlan(name, dc.name, budget, tuple(plans))
        written[stem].save(out_dir / "plans" / f"{stem}.json")
    return written["flashmem"], out_dir / "plans" / "flashmem.json"


@dataclass(frozen=True)
class _Cut:
    """One model solved, merged into segments, cut and (``held`` None: not) measured once built."""

    problem: Problem
    solved: OverlapPlan
    runs: list[tuple[int, int]]
    merged: OverlapPlan  # the solver's placement shifted over ``runs``, the layers' own figures
    segments: tuple[StreamSegment, ...]
    live: tuple[int, ...]
    held: footprint.Held | None


@dataclass(frozen=True)
class _Finishing:
    """What is made of a ``_Cut``: the segments' kernels and the reads' lead (``flashmem`` settings)."""

    kernels: str
    lead: int
    in_time: bool

    def of(self, cut: _Cut) -> tuple[tuple[StreamSegment, ...], OverlapPlan, str, float]:
        """(The segments with their kernels and figures, the plan the runtime carries out, what its residency
        was predicted from, the readers' rate)."""
        prob, runs = cut.problem, cut.runs
        if cut.held is None:
            return cut.segments, hoist(prob, cut.merged, runs, self.lead), "layers", 0.0
        picked = pick_kernels(cut.held, self.kernels)
        segments = tuple(replace(s, built_bytes=built, arena_bytes=arena, live_bytes=n, build_ms=ms, invoke_ms=run,
                                 kernels=k)
                         for s, (k, (built, arena, ms, run)), n in zip(cut.segments, picked, cut.live, strict=True))
        fps = footprints_of(segments)
        prices, read_mb_s = measured(prob, runs, fps), round(cut.held.read_mb_s, 1)
        timing = None
        if self.in_time:
            timing = ([fp.invoke_ms or sum(prices.layers[x].invoke_ms for x in range(a, b + 1))
                       for fp, (a, b) in zip(fps, runs, strict=True)], [fp.build_ms for fp in fps], read_mb_s)
        led = hoist(prices, shifted(prices, cut.solved, runs), runs, self.lead, timing)
        return segments, expected(prices, led, runs, fps, read_mb_s), "segments", read_mb_s


def _finishing(settings: dict) -> _Finishing:
    lead, kernels, in_time = settings["read_lead"], settings.get("segment_kernels", "fastest"), \
        settings.get("read_in_time", False)
    if isinstance(lead, bool) or not isinstance(lead, int | float) or not math.isfinite(lead) or lead != int(lead) \
            or lead < 1:
        raise PlanError(f"flashmem.read_lead must be a whole number of segments, at least 1, got {lead!r}")
    if kernels not in SEGMENT_KERNELS:
        raise PlanError(f"flashmem.segment_kernels must be one of {', '.join(SEGMENT_KERNELS)}, got {kernels!r}")
    if not isinstance(in_time, bool):
        raise PlanError(f"flashmem.read_in_time must be true or false, got {in_time!r}")
    return _Finishing(kernels, int(lead), in_time)


SEGMENT_KERNELS = ("fastest", "xnnpack")


def pick_kernels(held: footprint.Held, how: str) -> list[tuple[str, tuple[int, int, float, float]]]:
    """Per segment, its kernels and their measured figures: ``unpacked`` (nothing packed at build) where ``how`` is
    ``fastest`` and that build and first invoke together took less than XNNPACK's and held no more, else
    ``xnnpack``. VGG19's fc1 parts here: 16-31 ms + 1.3-2.2 ms packed, 0.25 + 4.7 ms unpacked."""
    out = []
    for x, u in zip(held.segments, held.unpacked or [None] * len(held.segments), strict=True):
        faster = u is not None and u[2] + u[3] < x[2] + x[3] and u[0] + u[1] <= x[0] + x[1]
        out.append(("unpacked", u) if how == "fastest" and faster else ("xnnpack", x))
    return out


def _cut(d: Path, info: StreamInfo, runs: list[tuple[int, int]], out_dir: Path, rel: str
         ) -> tuple[list[StreamSegment], list[int]]:
    """The segments, written, and the activation bytes the runtime holds while each runs (``Streamer.run``'s live
    set: the model's inputs and every output kept until the last segment reading it has run, and its outputs)."""
    from edgeplan.quantize import stream as cutting
    from edgeplan.quantize.tflite_graph import TfliteGraph

    split = (d / info.split_file).read_bytes()
    if hashlib.sha256(split).hexdigest() != info.split_sha256:
        raise ArtifactError(f"{d / info.split_file}: not the model stream.json names; run `edgeplan stream {d}`")
    g = TfliteGraph(split)
    target = out_dir / rel
    if target.exists():
        shutil.rmtree(target)
    segments, ports = [], []
    for k, ((a, b), blob) in enumerate(zip(runs, cutting.segments(g, runs))):
        file = f"{rel}/s{k:04d}.tflite"
        write_bytes_atomic(out_dir / file, blob)
        first = info.layers[a]
        inputs, outputs = cutting.boundary(g, first.first_op, info.layers[b].last_op)
        segments.append(StreamSegment(file, hashlib.sha256(blob).hexdigest(), len(blob), first.op, a, b,
                                      tuple(g.tensors[i].name for i in inputs)))
        ports.append((inputs, outputs))
    return segments, _live_bytes(g, ports)


def _live_bytes(g, ports: list[tuple[list[int], list[int]]]) -> list[int]:
    def size(i: int) -> int:
        t = g.tensors[i]
        return math.prod(t.shape) * np.dtype(t.dtype.lower()).itemsize

    last = {i: k for k, (inputs, _) in enumerate(ports) for i in inputs}
    live = set(ports[0][0]) if ports else set()
    out = []
    for k, (_, outputs) in enumerate(ports):
        out.append(sum(size(i) for i in live | set(outputs)))
        live = {i for i in live | set(outputs) if last.get(i, len(ports)) > k}
    return out
