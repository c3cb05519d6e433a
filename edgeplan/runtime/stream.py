"""Streamed int8 execution (FlashMem §4, the CPU analogue): reader threads (``READERS``) read the segments'
blobs in their planned pieces (``pread``: the GIL is released), every piece in the plan's order (by planned
position, whatever segment it belongs to) once the compute thread reaches its position, and check each blob's
sha256 when its last piece is in; a preloader thread reads the preloaded segments
as the request starts; a builder thread builds each interpreter (which holds the GIL) at its planned position
(a preloaded one in the first shadow it can take), in the shadow of an invoke, while the readers go on; the
compute thread invokes the segments in order and drops each after use. numpy + ai-edge-litert + the standard
library.

Modes (``schedule``): ``serial`` (each segment read and built when its turn comes: no overlap),
``always-next`` (segment k+1 read and built while k runs), ``same-op-type`` (read ahead to the next segment
whose lead op has the same kind as the running one, FlashMem Fig. 9's baseline), ``eager`` (every segment read
from the request's start, in order, and built as soon as it is in: no plan and no memory budget — what this
runtime does at best for latency), ``plan`` (the overlap plan's reads and builds). ``preload`` (the whole model
in one interpreter) is ``run_preloaded``.
"""
from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgeplan.errors import EdgeplanError
from edgeplan.plan.flashmem.plan import OverlapPlan, run_loads

MODES = ("serial", "always-next", "same-op-type", "eager", "plan")
# how a segment is built (its plan's ``StreamSegment.kernels``): XNNPACK, packing its weights at build (LiteRT's
# default), or LiteRT's reference kernels, which read them where they lie (``litert.unpacked``)
KERNELS = ("xnnpack", "unpacked")
SWITCH_INTERVAL_S = 0.001
READERS = 2  # reader threads (``Streamer(readers=)``): 1 reads the planned pieces strictly one after another


class StreamError(EdgeplanError):
    """A streamed segment cannot run: its blob is missing, short, or not the bytes its hash names."""


@dataclass(frozen=True)
class Segment:
    """One streaming segment: its blob, hash, size and kind, and the layers of the plan it runs."""

    path: Path
    sha256: str
    size: int
    op: str
    first_layer: int
    last_layer: int
    inputs: tuple[str, ...] = ()  # the activations it reads (boundary tensor names)
    kernels: str = "xnnpack"  # one of KERNELS


def segment_of(base: Path, s) -> Segment:
    """The runtime's view of a plan's ``StreamSegment`` ``s`` whose file is relative to ``base``."""
    return Segment(Path(base) / s.file, s.sha256, s.size, s.op, s.first_layer, s.last_layer, tuple(s.inputs),
                   s.kernels)


def _unpacked(blob: bytes):
    from edgeplan.quantize import litert

    return litert.unpacked(blob)


@dataclass(frozen=True)
class Step:
    """What the loader does for one segment: ``reads`` = (position, bytes) pieces in order, and the position
    whose invoke shadows the build (-1: before the run starts, i.e. preloaded)."""

    reads: tuple[tuple[int, int], ...]
    build: int


@dataclass
class SegmentLog:
    planned_build: int
    built_at: int = -2  # the compute position when its build began (-1: before the first invoke)
    read_at: list[int] = field(default_factory=list)  # the compute position as each planned piece's read began
    read_ms: float = 0.0
    build_ms: float = 0.0
    stall_ms: float = 0.0
    invoke_ms: float = 0.0


@dataclass
class RunLog:
    mode: str
    segments: list[SegmentLog] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def stall_ms(self) -> float:
        return sum(s.stall_ms for s in self.segments)


def schedule(segments: list[Segment], mode: str, plan: OverlapPlan | None = None) -> list[Step]:
    """The loader's steps for ``mode`` (positions are segment indices)."""
    if mode not in MODES:
        raise StreamError(f"unknown stream mode {mode!r}; choose one of {', '.join(MODES)} (or preload)")
    if mode == "serial":
        return [Step(((k, s.size),), k if k else -1) for k, s in enumerate(segments)]
    if mode == "always-next":
        return [Step(((max(0, k - 1), s.size),), k - 1) for k, s in enumerate(segments)]
    if mode == "eager":
        return [Step(((0, s.size),), 0) for s in segments]
    if mode == "same-op-type":
        steps = []
        for k, s in enumerate(segments):
            prev = [j for j in range(k) if segments[j].op == s.op]
            at = prev[-1] if prev else max(0, k - 1)
            steps.append(Step(((at, s.size),), at if k else -1))
        return steps
    if plan is None:
        raise StreamError("stream mode 'plan' needs the model's overlap plan")
    return _from_plan(segments, plan)


def _from_plan(segments: list[Segment], plan: OverlapPlan) -> list[Step]:
    """Each segment's reads and build as ``run_loads`` carries the plan out; a segment's bytes split over its
    read positions in proportion to the chunks read there."""
    steps = []
    for s, run in zip(segments, run_loads(plan, [(s.first_layer, s.last_layer) for s in segments])):
        if run is None:
            steps.append(Step(((0, s.size),), -1))
            continue
        pieces: dict[int, int] = {}
        for at in run.reads.values():
            for pos, chunks in at.items():
                pieces[pos] = pieces.get(pos, 0) + chunks
        reads, done = [], 0
        for pos in sorted(pieces):
            nbytes = s.size * pieces[pos] // run.chunks if pos != max(pieces) else s.size - done
            reads.append((pos, nbytes))
            done += nbytes
        steps.append(Step(tuple(reads), run.build))
    return steps


def pieces(steps: list[Step]) -> list[tuple[int, int, int, int]]:
    """The streamed segments' planned pieces as (position, segment, offset, bytes), in the order the readers take
    them: by planned position, then segment (the one needed first), then offset. The preloaded segments (build
    -1) are the preloader's."""
    out = []
    for k, step in enumerate(steps):
        if step.build >= 0:
            offset = 0
            for pos, nbytes in step.reads:
                out.append((pos, k, offset, nbytes))
                offset += nbytes
    return sorted(out)


Ports = tuple[tuple[tuple[int, str], ...], tuple[tuple[int, str], ...]]  # (inputs, outputs) as (index, name)


def ports(it) -> Ports:
    """An interpreter's input and output tensors as (index, name) pairs: the same for every interpreter built
    from the same model bytes, so a caller that builds one model again and again asks once
    (``get_input_details`` builds a dict per tensor: 4 ms a request over DenseNet201's 199 segments)."""
    return (tuple((d["index"], d["name"]) for d in it.get_input_details()),
            tuple((d["index"], d["name"]) for d in it.get_output_details()))


def invoke_named(it, tensors: dict[str, np.ndarray], io: Ports | None = None) -> dict[str, np.ndarray]:
    """Set an interpreter's inputs from ``tensors`` by name, invoke, return its outputs by name (``io``: its
    ``ports``, when known). ``get_tensor`` returns a copy that outlives the interpreter, so nothing is copied
    again (a second copy cost DenseNet201 streamed 20 ms a request: fresh pages, each faulted in)."""
    inputs, outputs = io or ports(it)
    for index, name in inputs:
        it.set_tensor(index, tensors[name])
    it.invoke()
    return {name: it.get_tensor(index) for index, name in outputs}


def run_chain(segs: list[bytes], x: dict[str, np.ndarray], interpreter: Callable[[bytes], object]
              ) -> dict[str, np.ndarray]:
    """Run segments in turn, tensors passed by name; returns every tensor the last segment outputs.
    ``interpreter(bytes)`` builds an allocated LiteRT interpreter (the caller picks the kernels)."""
    live = dict(x)
    out: dict[str, np.ndarray] = {}
    for seg in segs:
        out = invoke_named(interpreter(seg), live)
        live.update(out)
    return out


def run_preloaded(model: Path, inputs: dict[str, np.ndarray], interpreter: Callable[[bytes], object]
                  ) -> dict[str, np.ndarray]:
    """The ``preload`` baseline: the whole model read, built and run as one interpreter."""
    return run_chain([Path(model).read_bytes()], inputs, interpreter)


def return_freed_memory() -> bool:
    """Make glibc hand freed large blocks back to the kernel (a fixed 128 KiB mmap threshold). By default the
    threshold rises to the largest block freed, so a dropped segment's buffers stay in the heap and the resident
    set never falls: measured on ResNet50 int8 streamed FIFO, 42-56 MB peak above the start with the default,
    21-22 MB with this (the whole model preloaded: 63-64 MB either way). What the heap already holds free is
    handed back too (``trim_heap``): else new buffers reuse those resident pages and a build's resident-set delta
    reads 0 (the load-capacity profile after the CPU timings: ResNet50V2's stem measured 4 KiB, 6.5 MiB alone).
    And every thread allocates from the one heap (``M_ARENA_MAX`` 1): a streamed request's reader and builder
    threads, each with an arena of its own, left freed blocks resident in four heaps, so a request's peak
    depended on which thread had freed what — DenseNet201 streamed, cold, seven processes: 13.5-22.0 MiB above
    the start with an arena per thread, 14.8-15.0 MiB with one (InceptionV3 18.2-19.2 vs 15.4-16.2; request times
    within the host's noise). Threads that already have an arena keep it. Process-wide; False off glibc."""
    libc = _libc()
    if libc is None:
        return False
    fixed = bool(libc.mallopt(-3, 128 * 1024))  # M_MMAP_THRESHOLD
    libc.mallopt(-8, 1)  # M_ARENA_MAX
    libc.malloc_trim(0)
    return fixed


def trim_heap() -> None:
    """Hand the free pages of every malloc arena back to the kernel (glibc's ``malloc_trim``; nothing off glibc).
    A request ends with it: the blocks under the mmap threshold that its threads freed stay resident in their
    arenas, and request after request the resident set crept up — DenseNet201 streamed, cold, 12 requests:
    +4 to +7 MiB over the first, the whole model preloaded +7.4 MiB; with a trim after each, within 2 MiB and
    flat. A trim costs 0.3-1.6 ms here."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


_LIBC: list = []


def _libc():
    """glibc through ctypes, or None (another C library: its allocator is left as it is)."""
    if not _LIBC:
        import ctypes
        import ctypes.util

        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.append(libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None)
        except OSError:
            _LIBC.append(None)
    return _LIBC[0]


def _bytes_buffer(n: int) -> tuple[bytes, memoryview]:
    """A new ``bytes`` of ``n`` bytes and a writable view of its storage, to be filled before anything else sees
    it (CPython's ``PyBytes_FromStringAndSize(NULL, n)`` idiom). LiteRT takes a model only as ``bytes`` and keeps
    them, so reading straight into them saves the copy a ``bytearray`` would need: one segment's size less at
    every build."""
    import ctypes

    if n < 2:  # CPython shares its empty and one-byte objects
        raise StreamError(f"a segment of {n} bytes is not a model")
    api = ctypes.pythonapi
    api.PyBytes_FromStringAndSize.restype = ctypes.py_object
    api.PyBytes_FromStringAndSize.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)
    api.PyBytes_AsString.restype = ctypes.c_void_p
    api.PyBytes_AsString.argtypes = (ctypes.py_object,)
    data = api.PyBytes_FromStringAndSize(None, n)
    return data, memoryview((ctypes.c_char * n).from_address(api.PyBytes_AsString(data))).cast("B")


class Streamer:
    """Runs ``segments`` on one request as ``steps`` say; ``interpreter(bytes)`` builds an allocated
    interpreter (the caller picks kernels and threads), ``unpacked(bytes)`` a segment planned with ``unpacked``
    kernels (default: LiteRT's reference kernels; a caller that checks outputs bit for bit against one kernel set
    passes its ``interpreter`` again). Sets ``return_freed_memory`` for the process."""

    def __init__(self, segments: list[Segment], steps: list[Step], interpreter: Callable[[bytes], object],
                 mode: str = "plan", readers: int | None = None,
                 unpacked: Callable[[bytes], object] | None = None):
        if len(segments) != len(steps):
            raise StreamError(f"{len(steps)} loader steps for {len(segments)} segments")
        self.readers = READERS if readers is None else readers
        if self.readers < 1:
            raise StreamError(f"a streamer needs at least one reader thread, got {self.readers}")
        return_freed_memory()
        # the loader hands each built segment to the compute thread through a condition: at Python's default
        # 5 ms switch interval a waiting thread can sit out a whole interval per handoff (ResNet50V2, 54
        # segments, cold, medians of 5 on a busy host: 238 ms a request; at 1 ms 205 ms). Process-wide, like the
        # allocator setting.
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self.segments, self.steps, self.interpreter, self.mode = segments, steps, interpreter, mode
        self.unpacked = unpacked or _unpacked
        self._ports: dict[int, Ports] = {}  # segment -> its tensors, from its first build (checked bytes)
        self._pieces = pieces(steps)

    def run(self, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], RunLog]:
        log = RunLog(self.mode, [SegmentLog(s.build) for s in self.steps])
        t0 = time.perf_counter()
        cond = threading.Condition()
        state = {"at": -1, "read": {}, "ready": {}, "error": None, "next_piece": 0, "lead": self._lead(),
                 "filling": {}}
        for k in range(state["lead"]):  # the preloaded segments the run starts with: read and built first
            data = self._read(k, self.steps[k], log.segments[k], lambda pos: True)
            state["ready"][k] = self._build(k, data, log.segments[k], -1)
        loaders = [self._preloader, *[self._reader] * self.readers, self._builder]
        workers = [threading.Thread(target=fn, args=(cond, state, log), name=f"edgeplan-stream-{fn.__name__[1:]}",
                                    daemon=True) for fn in loaders]
        for w in workers:
            w.start()
        live = dict(inputs)
        last_use = self._last_use()
        out: dict[str, np.ndarray] = {}
        try:
            for k in range(len(self.segments)):
                t = time.perf_counter()
                with cond:
                    state["at"] = k
                    cond.notify_all()
                    while k not in state["ready"] and state["error"] is None:
                        cond.wait()
                    if state["error"] is not None:
                        raise state["error"]
                    it = state["ready"].pop(k)
                log.segments[k].stall_ms = (time.perf_counter() - t) * 1000
                io = self._ports.get(k) or self._ports.setdefault(k, ports(it))
                t = time.perf_counter()
                out = invoke_named(it, live, io)
                log.segments[k].invoke_ms = (time.perf_counter() - t) * 1000
                del it  # the segment's interpreter, packed weights and blob bytes go now
                live.update(out)
                for name in [n for n, last in last_use.items() if last == k and n in live]:
                    del live[name]
        finally:
            with cond:
                state["at"] = len(self.segments)
                cond.notify_all()
            for w in workers:
                w.join()
            trim_heap()
        log.seconds = time.perf_counter() - t0
        return out, log

    def _lead(self) -> int:
        """How many preloaded segments the run starts with (the first runs before any other is read)."""
        return next((k for k, step in enumerate(self.steps) if step.build >= 0), len(self.steps))

    def _last_use(self) -> dict[str, int]:
        """Activation name -> the last position that reads it (dropped from the live set after it)."""
        last: dict[str, int] = {}
        for k, seg in enumerate(self.segments):
            for name in seg.inputs:
                last[name] = k
        return last

    # Reader threads and a builder, so the reads (``pread`` and sha256: the GIL released) overlap the builds
    # (which hold the GIL): the readers take the planned pieces one at a time in the plan's order (``pieces``),
    # each once the compute thread reaches its position, and whoever reads a blob's last piece checks its hash;
    # the builder builds at the planned position once the bytes are in. Taken a segment at a time instead, a
    # reader waiting for one segment's late piece held back every later segment's early ones: VGG19's fc1 parts,
    # planned to be read beside the first convolutions, were read from position 9 on. Two readers keep two
    # pieces in flight: a cold read of a small blob waits on the disk more than it copies (DenseNet201's 199
    # blobs, 21 MB, cold: 47-53 ms in turn, 36 ms two at once).
    def read_only(self) -> float:
        """Every segment read and checked by this streamer's reader threads along the request's read path, with no
        wait for a position and nothing built or run: the least time a streamed request can take (its read
        floor). Returns the seconds taken; a segment that fails its check raises."""
        turn = iter(range(len(self.segments)))
        lock = threading.Lock()
        errors: list[BaseException] = []

        def reader() -> None:
            while not errors:
                with lock:
                    k = next(turn, None)
                if k is None:
                    return
                try:
                    self._read(k, self.steps[k], SegmentLog(self.steps[k].build), lambda pos: True)
                except BaseException as e:  # noqa: BLE001 — raised in the calling thread below
                    errors.append(e)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=reader, daemon=True) for _ in range(self.readers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return time.perf_counter() - t0

    def _preloader(self, cond: threading.Condition, state: dict, log: RunLog) -> None:
        """Reads the preloaded segments (build -1: resident from the start in the plan's arithmetic) after the
        ones the run starts with in turn as the request starts, beside the first invokes. Read and built by the
        compute thread before its first invoke, as the leading ones are, VGG19's two preloaded fc1 parts (29 MB)
        held it 52 ms (cold) while the conv layers they are not needed before ran for 125 ms."""
        def read_all():
            for k, step in enumerate(self.steps):
                if step.build < 0 and k >= state["lead"]:
                    self._hand(cond, state, "read", k,
                               self._read(k, step, log.segments[k], lambda pos: self._running(state)))

        self._guard(cond, state, read_all)

    def _running(self, state: dict) -> bool:
        return state["error"] is None and state["at"] < len(self.segments)

    def _reader(self, cond: threading.Condition, state: dict, log: RunLog) -> None:
        def read_all():  # the planned pieces in order, shared with the other readers
            while True:
                with cond:
                    j = state["next_piece"]
                    state["next_piece"] += 1
                    if j >= len(self._pieces):
                        return
                    pos, k, offset, nbytes = self._pieces[j]
                    while state["at"] < pos and self._running(state):
                        cond.wait()
                    if not self._running(state):
                        return
                    entry = log.segments[k]
                    entry.read_at.append(state["at"])
                    if k not in state["filling"]:
                        state["filling"][k] = [*_bytes_buffer(self.segments[k].size), len(self.steps[k].reads)]
                    data, view, _ = state["filling"][k]
                t = time.perf_counter()
                self._read_piece(k, view, offset, nbytes)
                with cond:
                    entry.read_ms += (time.perf_counter() - t) * 1000
                    state["filling"][k][2] -= 1
                    done = state["filling"][k][2] == 0
                    if done:
                        del state["filling"][k]
                if done:
                    view.release()
                    self._check(k, data)
                    self._hand(cond, state, "read", k, data)
                del data, view  # else the blob outlives its interpreter while this reader waits for a position

        self._guard(cond, state, read_all)

    def _builder(self, cond: threading.Condition, state: dict, log: RunLog) -> None:
        """Builds, of the segments read and at or past their planned position, the one the compute thread needs
        first: a preloaded segment (due from the start) is built in whatever shadow comes before its turn."""
        def build_all():
            todo = list(range(state["lead"], len(self.steps)))
            while todo:
                with cond:
                    while self._running(state) and (k := next((k for k in todo if k in state["read"] and
                                                               state["at"] >= self.steps[k].build), None)) is None:
                        cond.wait()
                    if not self._running(state):
                        return
                    todo.remove(k)
                    data = state["read"].pop(k)
                    at = state["at"]
                it = self._build(k, data, log.segments[k], at)
                del data  # the interpreter holds the bytes while it lives; nothing here outlives it
                self._hand(cond, state, "ready", k, it)
                del it

        self._guard(cond, state, build_all)

    @staticmethod
    def _guard(cond: threading.Condition, state: dict, work: Callable[[], object]) -> None:
        try:
            work()
        except _Stopped:
            return
        except Exception as e:  # handed to the compute thread, which fails the request with it
            with cond:
                state["error"] = e
                cond.notify_all()

    @staticmethod
    def _hand(cond: threading.Condition, state: dict, where: str, k: int, value) -> None:
        with cond:
            state[where][k] = value
            cond.notify_all()

    def _read(self, k: int, step: Step, entry: SegmentLog, reached: Callable[[int], bool]) -> bytes:
        """Segment k's bytes, each piece read once ``reached(position)`` (False: the run is over), checked."""
        data, view = _bytes_buffer(self.segments[k].size)
        try:
            offset = 0
            for pos, nbytes in step.reads:
                if not reached(pos):
                    raise _Stopped
                t = time.perf_counter()
                self._read_piece(k, view, offset, nbytes)
                entry.read_ms += (time.perf_counter() - t) * 1000
                offset += nbytes
        finally:
            view.release()
        self._check(k, data)
        return data

    def _read_piece(self, k: int, view: memoryview, offset: int, nbytes: int) -> None:
        """Bytes [offset, offset + nbytes) of segment k's blob into ``view`` at the same offset."""
        seg = self.segments[k]
        try:
            fd = os.open(seg.path, os.O_RDONLY)
        except OSError as e:
            raise StreamError(f"segment {k} ({seg.path.name}): cannot open its blob: {e.strerror}") from e
        try:
            got = os.preadv(fd, [view[offset:offset + nbytes]], offset)
        finally:
            os.close(fd)
        if got != nbytes:
            raise StreamError(f"segment {k} ({seg.path.name}): blob is shorter than its {seg.size} bytes")

    def _check(self, k: int, data: bytes) -> None:
        seg = self.segments[k]
        if hashlib.sha256(data).hexdigest() != seg.sha256:
            raise StreamError(f"segment {k} ({seg.path.name}): its bytes do not match sha256 {seg.sha256[:12]}...; "
                              "the blob is corrupt: pull the revision again")

    def _build(self, k: int, data: bytes, entry: SegmentLog, at: int):
        t = time.perf_counter()
        it = (self.unpacked if self.segments[k].kernels == "unpacked" else self.interpreter)(data)
        entry.build_ms = (time.perf_counter() - t) * 1000
        entry.built_at = at
        return it


class _Stopped(Exception):
    """The request ended (failed) before a loader thread's next planned position."""


def load_plans(rev_dir: Path, manifest) -> dict:
    """model name -> (``ModelStreamPlan``, its ``Segment`` list) from a revision's FlashMem plan, every name
    and hash checked against the manifest's blobs (a plan is signed with the manifest, but what it names is
    still validated: a segment that is not the blob of that name and hash is refused). Empty without one."""
    from edgeplan.bundle.validate import plan_record, relpath
    from edgeplan.errors import BundleVerificationError
    from edgeplan.plan.flashmem.plan import FlashMemPlan

    found = plan_record(rev_dir, manifest, "flashmem", FlashMemPlan)
    if found is None:
        return {}
    plan, where = found
    blobs = {b.name: b for b in manifest.blobs}
    served = {e.name: e.version for e in manifest.models}
    out = {}
    for m in plan.models:
        if served.get(m.name) != m.version:
            raise BundleVerificationError(f"{where}: plans {m.name} {m.version}, which the revision does not serve")
        segs = []
        for k, s in enumerate(m.segments):
            blob = f"deployments/{manifest.deployment}/{relpath(s.file, where, f'{m.name} segment {k}')}"
            ref = blobs.get(blob)
            if ref is None or ref.sha256 != s.sha256 or ref.size != s.size:
                raise BundleVerificationError(f"{where}: {m.name} segment {k} ({s.file}) is not a blob of this "
                                              "revision with the hash and size the plan names; refused")
            if s.kernels not in KERNELS:
                raise BundleVerificationError(f"{where}: {m.name} segment {k} ({s.file}) names kernels "
                                              f"{s.kernels!r}, not one of {', '.join(KERNELS)}; refused")
            segs.append(Segment(Path(rev_dir) / blob, s.sha256, s.size, s.op, s.first_layer, s.last_layer, s.inputs,
                                s.kernels))
        if [w.layer for w in m.plan.weights] != sorted({w.layer for w in m.plan.weights}) or any(
                not 0 <= s.first_layer <= s.last_layer for s in segs):
            raise BundleVerificationError(f"{where}: {m.name}'s plan is not ordered by layer; refused")
        _check_layers(segs, m.plan, f"{where}: {m.name}'s plan")
        out[m.name] = (m, segs)
    return out


def _check_layers(segs: list[Segment], plan: OverlapPlan, what: str) -> None:
    """The segments run layers 0..n-1 in turn, and every layer the plan names (a weight's, a read's, a build's)
    is one of them; else ``BundleVerificationError`` naming what is wrong."""
    from edgeplan.errors import BundleVerificationError

    n = segs[-1].last_layer + 1 if segs else 0
    if [s.first_layer for s in segs] != [0, *(s.last_layer + 1 for s in segs[:-1])]:
        raise BundleVerificationError(f"{what}: its segments do not run its layers in turn from 0; refused")
    for w in plan.weights:
        for layer in (w.layer, *(ld.layer for ld in w.loads), *(() if w.build_layer is None else (w.build_layer,))):
            if not 0 <= layer < n:
                raise BundleVerificationError(f"{what} names layer {layer}, which its {n} layers do not hold; "
                                              "refused")
