"""Load capacity, measured (FlashMem §4.2, Table 5, the CPU analogue): how much loading a layer can carry
beside it before it slows past its class's threshold.

Per layer (a one-layer streaming segment, one thread, the device's kernels): its invoke time alone, beside
a loader thread reading a file at r MB/s (``pread`` in 256 KiB pieces, page cache dropped first: cold
reads, as a streamed bundle is read), and beside one LiteRT interpreter build started with the invoke (what a
streamed segment costs after its read; the build holds the GIL, so an invoke shorter than it waits). Conditions are interleaved in rounds with the speed
probe, and each timing is a batch of back-to-back invokes long enough for the loader to act (a layer may
take 50 µs). The operator classes of Table 5 are one table by op name. numpy + ai-edge-litert + the
standard library: a device runs this for fleet profiling; the XGBoost model over it is pipeline-side.
"""
from __future__ import annotations

import os
import random
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeplan.pipeline.memory import rss

# FlashMem Table 5: reusable ops reuse their data (high tolerance), hierarchical ones synchronise in steps
# (none: FlashMem does not overlap them), elemental are everything else (memory-bound, cheap).
OP_CLASS = {
    **dict.fromkeys(("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV", "BATCH_MATMUL",
                     "CONV_3D"), "reusable"),
    **dict.fromkeys(("SOFTMAX", "LOG_SOFTMAX", "L2_NORMALIZATION", "LOCAL_RESPONSE_NORMALIZATION", "MEAN", "SUM",
                     "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "ARG_MAX", "ARG_MIN", "CUMSUM"), "hierarchical"),
}
THRESHOLDS = {"elemental": 3.0, "reusable": 0.2, "hierarchical": 0.0}  # slowdown each class may take (§4.2)
RATES_MB_S = (50.0, 200.0, 800.0)
PIECE = 256 * 1024
BATCH_MS = 5.0  # each timing: back-to-back invokes for at least this long


def op_class(op: str) -> str:
    return OP_CLASS.get(op, "elemental")


@dataclass(frozen=True)
class LayerLoad:
    """One layer's measured times (medians over rounds, ms per invoke) and the build time of its segment."""

    layer: int
    name: str
    op: str
    op_class: str
    weight_bytes: int
    segment_bytes: int
    alone_ms: float
    beside_read_ms: tuple[float, ...]  # per rate of ``LoadCapacity.rates_mb_s``
    beside_build_ms: float
    build_ms: float
    built_bytes: int = 0  # the resident set its build added (packed weights, buffers; not the blob, not the arena)
    arena_bytes: int = 0  # its arena's span: resident once it runs (allocated untouched at build), gone when dropped

    def slowdown(self, k: int) -> float:
        """Fractional slowdown beside the loader at rate k (``len(rates)``: beside a build)."""
        t = self.beside_build_ms if k == len(self.beside_read_ms) else self.beside_read_ms[k]
        return max(0.0, t / self.alone_ms - 1.0)


@dataclass(frozen=True)
class LoadCapacity:
    rates_mb_s: tuple[float, ...]
    layers: tuple[LayerLoad, ...]
    probe_ms: float  # the speed probe's median in the same rounds
    rounds: int
    rss_built_bytes: int = 0  # measured: the resident set all layers' interpreters added, built at once


class _Pressure:
    """A thread that reads a file at a paced rate, or builds an interpreter over and over, while active."""

    def __init__(self, scratch: Path, build_model: bytes):
        self.scratch, self.build_model = scratch, build_model
        self.size = scratch.stat().st_size
        self.mode: tuple[str, float] | None = None
        self.lock = threading.Condition()
        self.stop = False
        self.thread = threading.Thread(target=self._loop, name="edgeplan-capacity-pressure", daemon=True)
        self.thread.start()

    def set(self, mode: tuple[str, float] | None) -> None:
        with self.lock:
            self.mode = mode
            self.lock.notify_all()

    def wait_idle(self) -> None:
        with self.lock:
            while self.mode is not None:
                self.lock.wait()

    def close(self) -> None:
        with self.lock:
            self.stop = True
            self.lock.notify_all()
        self.thread.join()

    def _loop(self) -> None:
        from ai_edge_litert.interpreter import Interpreter

        fd = os.open(self.scratch, os.O_RDONLY)
        buf = bytearray(PIECE)
        offset = 0
        try:
            while True:
                with self.lock:
                    while self.mode is None and not self.stop:
                        self.lock.wait()
                    if self.stop:
                        return
                    kind, rate = self.mode
                if kind == "build":  # one build per trigger, then idle until the next
                    Interpreter(model_content=self.build_model, num_threads=1).allocate_tensors()
                    with self.lock:
                        self.mode = None
                        self.lock.notify_all()
                    continue
                started = time.perf_counter()
                os.posix_fadvise(fd, offset, PIECE, os.POSIX_FADV_DONTNEED)
                os.preadv(fd, [buf], offset)
                offset = (offset + PIECE) % max(PIECE, self.size - PIECE)
                pause = PIECE / (rate * 1e6) - (time.perf_counter() - started)
                if pause > 0:  # pacing the reader to rate r: the loader's own rhythm, not a stand-in for work
                    time.sleep(pause)
        finally:
            os.close(fd)


def build_kept(model: bytes, unpacked: bool = False) -> tuple[object, float, int]:
    """``model`` built on one thread (XNNPACK, or ``unpacked``: LiteRT's reference kernels), its tensors
    allocated: (the interpreter, build ms, bytes the build added to the resident set). The caller keeps the
    interpreter, so that the next build's delta is that build's own."""
    from ai_edge_litert.interpreter import Interpreter

    from edgeplan.quantize import litert

    r0 = rss()
    t0 = time.perf_counter()
    if unpacked:
        it = litert.unpacked(model)
    else:
        it = Interpreter(model_content=model, num_threads=1)
        it.allocate_tensors()
    ms = (time.perf_counter() - t0) * 1e3
    return it, ms, max(0, rss() - r0)


def arena_bytes(it) -> int:
    """The span of a built interpreter's non-constant tensors in memory: its arena. Non-constant: the model's
    inputs, every op's outputs, and the tensors no op names — the temporaries kernels add at allocation (int8
    CONV_2D's im2col: ResNet50V2's stride-2 7x7 stem, 1.7 MB)."""
    ops = it._get_ops_details()
    named = {int(i) for op in ops for key in ("inputs", "outputs") for i in op[key]}
    live = {int(i) for op in ops for i in op["outputs"]} | {int(d["index"]) for d in it.get_input_details()} | {
        int(d["index"]) for d in it.get_tensor_details()} - named
    spans = []
    for i in live:
        try:
            a = it.tensor(i)()
        except ValueError:
            continue
        if a.nbytes:
            spans.append((a.ctypes.data, a.nbytes))
    return max(a + n for a, n in spans) - min(a for a, _ in spans) if spans else 0


def _batch(it, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        it.invoke()
    return (time.perf_counter() - t0) * 1e3 / reps


def _beside_build(it, pressure: _Pressure, reps: int) -> float:
    """Mean of single invokes, each with one interpreter build triggered as it starts: the build takes the
    GIL while the invoke has released it, and an invoke that ends first waits for it, as a streamed layer
    does whose shadow is too short."""
    total = 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        pressure.set(("build", 0.0))
        it.invoke()
        total += time.perf_counter() - t0
        pressure.wait_idle()
    return total * 1e3 / reps


def measure(segments: list[tuple[str, str, int, bytes]], scratch: Path, probe: Path, *, rounds: int = 7,
            rates_mb_s: tuple[float, ...] = RATES_MB_S, seed: int = 0,
            report=lambda done, total: None) -> LoadCapacity:
    """``segments``: (name, lead op, weight bytes, one-layer segment bytes) per layer, in order. ``scratch``:
    a file of at least a few MB the loader reads (its pages are dropped as it goes)."""
    from ai_edge_litert.interpreter import Interpreter

    from edgeplan.profile.cpu import random_inputs
    from edgeplan.runtime.stream import return_freed_memory

    return_freed_memory()  # the allocator as the streaming runtime sets it, so the resident set is comparable
    rng = np.random.default_rng(seed)
    probe_it = Interpreter(model_path=str(probe), num_threads=1)  # first: the one-time costs of the first build
    probe_it.allocate_tensors()
    probe_it.invoke()
    n = len(segments)
    its, builds, built = [None] * n, [0.0] * n, [0] * n
    before = rss()
    # Each layer's resident set added by its build, the layers built one after another and kept: with the
    # allocator's fixed mmap threshold a delta is its own (two passes agree within 0.1 MiB; a fit of a fixed cost +
    # a cost per weight byte missed XNNPACK's indirection buffers, sized by output pixels x kernel area: ResNet50V2's
    # 7x7 stem, 13 KiB of weights, adds 6.5 MiB). Built, not run: an arena is allocated at build but its pages
    # become resident only when the segment runs (ResNet50V2's 55 layers: +41.5 MiB built, +29.2 MiB more once
    # run, arena spans 25.7 MiB), and the runtime drops a segment right after it runs: one arena at a time.
    for i in range(n):
        its[i], builds[i], built[i] = build_kept(segments[i][3])
    rss_built = max(0, rss() - before)
    arenas = [arena_bytes(it) for it in its]
    for it in its:
        random_inputs(it, rng)
    reps = [max(1, int(BATCH_MS / max(1e-3, _batch(it, 3)))) for it in its]
    # the build beside each layer: the model's quickest segment to build (a lower bound on any streamed build)
    quickest = min(range(len(segments)), key=lambda i: builds[i])
    pressure = _Pressure(scratch, segments[quickest][3])
    conditions = [None] + [("read", r) for r in rates_mb_s] + [("build", 0.0)]
    times = [[[] for _ in conditions] for _ in segments]
    probe_times = []
    order = random.Random(seed)
    try:
        for r in range(rounds):
            probe_times.append(_batch(probe_it, 1))
            jobs = [(i, c) for i in range(len(segments)) for c in range(len(conditions))]
            order.shuffle(jobs)
            for i, c in jobs:
                if conditions[c] is not None and conditions[c][0] == "build":
                    times[i][c].append(_beside_build(its[i], pressure, min(reps[i], 5)))
                    continue
                pressure.set(conditions[c])
                if conditions[c] is not None:
                    time.sleep(0.002)  # let the reader get going before the batch is timed
                times[i][c].append(_batch(its[i], reps[i]))
                pressure.set(None)
            report(r + 1, rounds)
    finally:
        pressure.close()
    layers = []
    for i, (name, op, weight, blob) in enumerate(segments):
        med = [statistics.median(ts) for ts in times[i]]
        layers.append(LayerLoad(i, name, op, op_class(op), weight, len(blob), med[0], tuple(med[1:-1]), med[-1],
                                builds[i], built[i], arenas[i]))
    return LoadCapacity(tuple(rates_mb_s), tuple(layers), statistics.median(probe_times), rounds, rss_built)


def capacity(layer: LayerLoad, rates_mb_s: tuple[float, ...], chunk_bytes: int,
             slowdowns: list[float] | None = None, thresholds: dict[str, float] = THRESHOLDS) -> tuple[int, float]:
    """C_l: (chunks of ``chunk_bytes`` the layer absorbs, build ms it shadows) within its class threshold, from
    its slowdowns per rate and beside a build (measured, or ``slowdowns`` predicted). A build is shadowed
    only by an invoke at least as long as the build."""
    slow = slowdowns if slowdowns is not None else [layer.slowdown(k) for k in range(len(rates_mb_s) + 1)]
    limit = thresholds[layer.op_class]
    if layer.op_class == "hierarchical":
        return 0, 0.0
    best = max((r for r, s in zip(rates_mb_s, slow) if s <= limit), default=0.0)
    invoke_ms = layer.alone_ms * (1 + limit)
    chunks = int(best * 1e6 * invoke_ms / 1e3 // chunk_bytes)
    build = layer.alone_ms if slow[-1] <= limit else 0.0
    return chunks, build
