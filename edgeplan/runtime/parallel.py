"""Branch-parallel execution of a Parallax plan (numpy + ai-edge-litert): the model as a sequence of stages, each
either one sub-model on the XNNPACK threads the plan gives it, or a parallel layer's worker sub-models, one per
thread (LiteRT releases the GIL in ``invoke``, so they overlap). Tensors pass between stages by name.

Threads come from one pool per process, shared by every runner in it: a parallel stage takes the idle threads it
can and runs the sub-models it got none for in order on the calling thread — the same interpreters, no second
copy of the weights. Every interpreter is built once, at load: its arena lives as long as it does.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
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
                 pool_: Pool | None = None):
        self.stages = stages
        self.workers = workers
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
        helpers = self.pool.take(len(its) - 1) if stage.parallel and self.pool is not None else 0
        futures = [self.pool.submit(_named(stage, k, its[k], live)) for k in range(1, 1 + helpers)]
        out: dict[str, np.ndarray] = {}
        error: BaseException | None = None
        for k in [0, *range(1 + helpers, len(its))]:  # the caller's share, in order
            try:
                out.update(_named(stage, k, its[k], live)())
            except ParallelError as e:
                error = error or e
        for f in futures:  # every helper finishes before the stage returns, failed or not
            try:
                out.update(f.result())
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
