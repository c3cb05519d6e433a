"""Branch-parallel execution of a Parallax plan (numpy + ai-edge-litert): the model as a sequence of stages, each
either one sub-model on the XNNPACK threads the plan gives it, or a parallel layer's worker sub-models, one per
thread (LiteRT releases the GIL in ``invoke``, so they overlap). Tensors pass between stages by name.

Threads come from one pool per process, shared by every runner in it: a parallel stage takes the idle threads it
can and runs the sub-models it got none for in order on the calling thread — the same interpreters, no second
copy of the weights. Every interpreter is built once, at load: its arena lives as long as it does.

A sub-model with an offload time is an Edge TPU region (``plan/parallax/offload``): given a ``device``, the runner
hands it over first (the device takes it on its clock) and runs the stage's CPU sub-models meanwhile; without one
it is a CPU sub-model like the others.
"""
from __future__ import annotations

import hashlib
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from edgeplan.errors import EdgeplanError
from edgeplan.quantize import litert
from edgeplan.runtime.stream import invoke_named


class ParallelError(EdgeplanError):
    """A sub-model failed while serving a request (names the stage's layer and the branches it runs)."""


@dataclass(frozen=True)
class SubModel:
    name: str
    data: bytes
    threads: int  # XNNPACK threads of its interpreter
    offload_s: float | None = None  # an Edge TPU region: how long the accelerator holds it (EMULATED)


# ``device(sub-model, interpreter, live tensors, compute) -> finish``: an accelerator takes an Edge TPU region
# (``compute()`` gives its outputs on the CPU); ``finish()`` returns them once the device is done with it.
Device = Callable[[SubModel, object, dict, Callable[[], dict]], Callable[[], dict]]


@dataclass(frozen=True)
class Stage:
    layer: int | None  # the structure layer a parallel stage runs; None for a sequential run
    submodels: tuple[SubModel, ...]  # several: run at once, one per thread

    @property
    def parallel(self) -> bool:
        return len(self.submodels) > 1


def interpreter_for(deterministic: bool) -> Callable[[bytes, int], object]:
    """``(bytes, threads) -> allocated interpreter``: reference kernels (``deterministic``) or XNNPACK."""
    return lambda data, threads: litert.interpreter(data, deterministic=deterministic, threads=threads)


class Pool:
    """Worker threads that run one callable at a time each; ``take(n)`` reserves up to n idle ones."""

    def __init__(self, threads: int):
        self._idle = threads
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"parallax-{k}", daemon=True) for k in range(threads)]
        for t in self._threads:
            t.start()

    def take(self, n: int) -> int:
        with self._lock:
            got = min(n, self._idle)
            self._idle -= got
            return got

    def submit(self, work: Callable[[], object]) -> Future:
        """Run ``work`` on a thread reserved by ``take``; the thread is idle again when it returns."""
        done: Future = Future()
        self._jobs.put((work, done))
        return done

    def _work(self) -> None:
        while True:
            work, done = self._jobs.get()
            try:
                result, error = work(), None
            except BaseException as e:  # noqa: BLE001 — handed to the caller, who names the stage
                result, error = None, e
            with self._lock:  # idle again before the caller hears: its next stage may take this thread
                self._idle += 1
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(result)


_pools: dict[int, Pool] = {}
_pools_lock = threading.Lock()


def pool(threads: int) -> Pool:
    """The process's pool of ``threads`` helper threads (one per extra worker), created once."""
    with _pools_lock:
        if threads not in _pools:
            _pools[threads] = Pool(threads)
        return _pools[threads]


class ParallelRunner:
    """Runs the stages on one request at a time per caller; ``interpreter(bytes, threads)`` builds an
    allocated LiteRT interpreter (the caller picks the kernels)."""

    def __init__(self, stages: list[Stage], interpreter: Callable[[bytes, int], object], *, workers: int,
                 pool_: Pool | None = None, device: Device | None = None):
        self.stages = stages
        self.workers = workers
        self.device = device
        self.pool = pool_ if pool_ is not None else (pool(workers - 1) if workers > 1 else None)
        self.interpreters = [[interpreter(s.data, s.threads) for s in st.submodels] for st in stages]

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model's outputs (what the last stage returns) for ``inputs`` by name."""
        live = dict(inputs)
        out: dict[str, np.ndarray] = {}
        for stage, its in zip(self.stages, self.interpreters):
            out = self._stage(stage, its, live)
            live.update(out)
        return out

    def _stage(self, stage: Stage, its: list, live: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        error: BaseException | None = None
        held, cpu = [], list(range(len(its)))
        if self.device is not None:  # Edge TPU regions first: the device works while the CPU sub-models run
            cpu = [k for k in cpu if stage.submodels[k].offload_s is None]
            for k in (k for k in range(len(its)) if k not in cpu):
                try:
                    held.append(self.device(stage.submodels[k], its[k], live, _named(stage, k, its[k], live)))
                except ParallelError as e:
                    error = error or e
        helpers = self.pool.take(len(cpu) - 1) if len(cpu) > 1 and self.pool is not None else 0
        futures = [self.pool.submit(_named(stage, k, its[k], live)) for k in cpu[1:1 + helpers]]
        for k in [*cpu[:1], *cpu[1 + helpers:]]:  # the caller's share, in order
            try:
                out.update(_named(stage, k, its[k], live)())
            except ParallelError as e:
                error = error or e
        for f in [*futures, *held]:  # every helper and region finishes before the stage returns, failed or not
            try:
                out.update(f.result() if isinstance(f, Future) else f())
            except ParallelError as e:
                error = error or e
        if error is not None:
            raise error
        return out


def _named(stage: Stage, k: int, it, live: dict[str, np.ndarray]) -> Callable[[], dict[str, np.ndarray]]:
    def run() -> dict[str, np.ndarray]:
        try:
            return invoke_named(it, live)
        except Exception as e:  # noqa: BLE001 — LiteRT raises RuntimeError/ValueError/KeyError: one line instead
            where = f"layer {stage.layer}" if stage.layer is not None else "sequential stage"
            raise ParallelError(f"{where}, sub-model {stage.submodels[k].name}: {type(e).__name__}: {e}") from None
    return run


@dataclass(frozen=True)
class SubModelFile:
    """A sub-model as a revision holds it: its blob's path and hash, read (and checked) when a runner is built."""

    path: Path
    sha256: str
    threads: int
    offload_ms: float | None = None  # an Edge TPU region's EMULATED hold


@dataclass(frozen=True)
class PointStages:
    """A point's suffix as a Parallax plan runs it: its stages (layer, sub-model files) and the tensor names it
    takes and gives."""

    workers: int
    input: str
    output: str
    stages: tuple[tuple[int | None, tuple[SubModelFile, ...]], ...]

    @property
    def offloads(self) -> bool:
        """Whether any sub-model is an Edge TPU region."""
        return any(f.offload_ms is not None for _, files in self.stages for f in files)

    def read(self) -> list[Stage]:
        """The stages with their sub-models' bytes, each checked against the hash the plan names (a corrupt blob
        fails here, naming it)."""
        out = []
        for layer, files in self.stages:
            subs = []
            for f in files:
                data = f.path.read_bytes()
                if hashlib.sha256(data).hexdigest() != f.sha256:
                    raise ParallelError(f"sub-model {f.path}: not the blob the revision names (sha256 differs)")
                subs.append(SubModel(f.path.stem, data, f.threads,
                                     None if f.offload_ms is None else f.offload_ms / 1e3))
            out.append(Stage(layer, tuple(subs)))
        return out


class SuffixRunner:
    """A point's suffix branch-parallel, called like ``litert.Runner``: the suffix input in, its output out."""

    def __init__(self, plan: PointStages, interpreter: Callable[[bytes, int], object], device: Device | None = None):
        self.plan = plan
        self.runner = ParallelRunner(plan.read(), interpreter, workers=plan.workers, device=device)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.runner.run({self.plan.input: x})[self.plan.output]


def load_plans(rev_dir, manifest) -> dict[str, dict[int, PointStages]]:
    """model name -> point -> its branch-parallel stages, from a revision's Parallax plan (empty without one).
    The plan is signed with the manifest, but what it names is still validated: each sub-model must be a blob
    of this revision with the hash and size the plan gives, each planned suffix the blob it was planned for, and
    a stage's inputs must be tensors an earlier stage (or the suffix input) made. The sub-models are read when
    a runner is built (``PointStages.read``), not here."""
    from edgeplan.bundle.validate import integer, plan_record, relpath
    from edgeplan.errors import BundleVerificationError
    from edgeplan.plan.parallax.deployment import ParallaxDeploymentPlan

    found = plan_record(rev_dir, manifest, "parallax", ParallaxDeploymentPlan)
    if found is None:
        return {}
    plan, where = found
    blobs = {b.name: b for b in manifest.blobs}
    entries = {e.name: e for e in manifest.models}
    out: dict[str, dict[int, PointStages]] = {}
    for m in plan.models:
        entry = entries.get(m.name)
        if entry is None or entry.version != m.version:
            raise BundleVerificationError(f"{where}: plans {m.name} {m.version}, which the revision does not serve")
        integer(m.workers, where, f"{m.name} workers", 1, 256)
        points: dict[int, PointStages] = {}
        for pp in m.points:
            integer(pp.point, where, f"{m.name} point", 0, entry.points - 1)
            suffix = blobs.get(f"models/{m.name}/{m.version}/segments/p{pp.point}/suffix_int8.tflite")
            if suffix is None or suffix.sha256 != pp.suffix_sha256 or pp.point in points or not pp.stages:
                raise BundleVerificationError(f"{where}: {m.name} point {pp.point} is planned for a suffix this "
                                              "revision does not have (or twice, or with no stage); refused")
            made, stages = {pp.input}, []
            for k, st in enumerate(pp.stages):
                subs = []
                for s in st.submodels:
                    what = f"{m.name} point {pp.point} stage {k} sub-model {s.file!r}"
                    blob = f"deployments/{manifest.deployment}/{relpath(s.file, where, what)}"
                    ref = blobs.get(blob)
                    if ref is None or ref.sha256 != s.sha256 or ref.size != s.size:
                        raise BundleVerificationError(f"{where}: {what} is not a blob of this revision with the hash "
                                                      "and size the plan names; refused")
                    integer(s.threads, where, f"{what} threads", 1, 256)
                    if s.offload_ms is not None and not (isinstance(s.offload_ms, (int, float))
                                                         and 0 <= s.offload_ms <= 60_000):
                        raise BundleVerificationError(f"{where}: {what} offload_ms {s.offload_ms!r} is not a time "
                                                      "in [0, 60000] ms; refused")
                    if not set(s.inputs) <= made:
                        raise BundleVerificationError(f"{where}: {what} takes {sorted(set(s.inputs) - made)}, which "
                                                      "no earlier stage makes; refused")
                    subs.append(SubModelFile(Path(rev_dir) / blob, s.sha256, s.threads,
                                             None if s.offload_ms is None else float(s.offload_ms)))
                made |= {o for s in st.submodels for o in s.outputs}
                stages.append((st.layer, tuple(subs)))
            if pp.output not in {o for s in pp.stages[-1].submodels for o in s.outputs}:
                raise BundleVerificationError(f"{where}: {m.name} point {pp.point}'s last stage does not give the "
                                              f"suffix output {pp.output!r}; refused")
            points[pp.point] = PointStages(m.workers, pp.input, pp.output, tuple(stages))
        out[m.name] = points
    return out
