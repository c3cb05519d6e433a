"""Streamed int8 execution (FlashMem §4, the CPU analogue): reader threads (``READERS``, taking the segments
in turn) read each segment's blob in planned pieces (``pread``: the GIL is released) when the compute thread
reaches each piece's planned position and check its sha256; a preloader thread reads the preloaded segments
as the request starts; a builder thread builds each interpreter (which holds the GIL) at its planned position
(a preloaded one in the first shadow it can take), in the shadow of an invoke, while the readers go on; the
compute thread invokes the segments in order and drops each after use. numpy + ai-edge-litert + the standard
library.

Modes (``schedule``): ``serial`` (each segment read and built when its turn comes: no overlap),
``always-next`` (segment k+1 read and built while k runs), ``same-op-type`` (read ahead to the next segment
whose lead op has the same kind as the running one, FlashMem Fig. 9's baseline), ``plan`` (the overlap plan's
reads and builds). ``preload`` (the whole model in one interpreter) is ``run_preloaded``.
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

MODES = ("serial", "always-next", "same-op-type", "plan")
SWITCH_INTERVAL_S = 0.001
READERS = 2  # reader threads (``Streamer(readers=)``): 1 reads the segments strictly in turn


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
    handed back too (``malloc_trim``): else new buffers reuse those resident pages and a build's resident-set delta
    reads 0 (the load-capacity profile after the CPU timings: ResNet50V2's stem measured 4 KiB, 6.5 MiB alone).
    Process-wide; False off glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fixed = bool(libc.mallopt(-3, 128 * 1024))  # M_MMAP_THRESHOLD
        libc.malloc_trim(0)
        return fixed
    except (OSError, AttributeError):
        return False


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
    interpreter (the caller picks kernels and threads). Sets ``return_freed_memory`` for the process."""

    def __init__(self, segments: list[Segment], steps: list[Step], interpreter: Callable[[bytes], object],
                 mode: str = "plan", readers: int | None = None):
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
        self._ports: dict[int, Ports] = {}  # segment -> its tensors, from its first build (checked bytes)

    def run(self, inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], RunLog]:
        log = RunLog(self.mode, [SegmentLog(s.build) for s in self.steps])
        t0 = time.perf_counter()
        cond = threading.Condition()
        state = {"at": -1, "read": {}, "ready": {}, "error": None, "next_read": 0, "lead": self._lead()}
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

    # Reader threads and a builder, so a segment's reads (``pread`` and sha256: the GIL released) overlap the
    # build of the one before it (which holds the GIL): a reader reads each piece once the compute thread
    # reaches its planned position and checks the hash; the builder builds at the planned position once the
    # bytes are in. Two readers keep two segments' planned pieces in flight: a cold read of a small blob waits
    # on the disk more than it copies (DenseNet201's 199 blobs, 21 MB, cold: 47-53 ms in turn, 36 ms two at once).
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
        def reached(pos: int) -> bool:
            with cond:
                while state["at"] < pos:
                    cond.wait()
                return state["at"] < len(self.segments)

        def read_all():  # the segments in order, shared with the other readers
            while True:
                with cond:
                    k = state["next_read"]
                    state["next_read"] += 1
                if k >= len(self.steps):
                    return
                if self.steps[k].build >= 0:
                    self._hand(cond, state, "read", k, self._read(k, self.steps[k], log.segments[k], reached))

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
                self._hand(cond, state, "ready", k, self._build(k, data, log.segments[k], at))

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
        seg = self.segments[k]
        try:
            fd = os.open(seg.path, os.O_RDONLY)
        except OSError as e:
            raise StreamError(f"segment {k} ({seg.path.name}): cannot open its blob: {e.strerror}") from e
        data, view = _bytes_buffer(seg.size)
        try:
            offset = 0
            for pos, nbytes in step.reads:
                if not reached(pos):
                    raise _Stopped
                t = time.perf_counter()
                got = os.preadv(fd, [view[offset:offset + nbytes]], offset)
                entry.read_ms += (time.perf_counter() - t) * 1000
                if got != nbytes:
                    raise StreamError(f"segment {k} ({seg.path.name}): blob is shorter than its {seg.size} bytes")
                offset += nbytes
        finally:
            view.release()
            os.close(fd)
        if hashlib.sha256(data).hexdigest() != seg.sha256:
            raise StreamError(f"segment {k} ({seg.path.name}): its bytes do not match sha256 {seg.sha256[:12]}...; "
                              "the blob is corrupt: pull the revision again")
        return data

    def _build(self, k: int, data: bytes, entry: SegmentLog, at: int):
        t = time.perf_counter()
        it = self.interpreter(data)
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
            segs.append(Segment(Path(rev_dir) / blob, s.sha256, s.size, s.op, s.first_layer, s.last_layer, s.inputs))
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
