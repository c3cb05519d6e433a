"""``edgeplan-runtime fifo``: FlashMem's FIFO multi-model workload (§2.2, Fig. 6) on the active revision.

Models are run one request at a time in FIFO order, round after round; each request reads its model from the
revision's blobs (cold: their pages dropped first, as a model that is not kept resident comes from storage),
builds and runs it — streamed as its FlashMem plan says (or another stream mode), or ``preload``: the whole
int8 model as one interpreter — and drops it. A sampler thread records the process's resident set every
2 ms: the timeline, and the peak above the resident set once one unmeasured request of each model has
run (the runtime's one-time set-up is not a model's). numpy + ai-edge-litert.
"""
from __future__ import annotations

import hashlib
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from edgeplan.errors import EdgeplanError
from edgeplan.pipeline.memory import rss
from edgeplan.runtime import stream

def reset_hwm() -> bool:
    """Reset the kernel's high-water mark of the resident set (VmHWM) to the current one."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


class RssSampler:
    """The resident set every ``period_s`` on a thread, as (seconds since start, bytes)."""

    def __init__(self, period_s: float = 0.002):
        self.period_s, self.samples, self._stop = period_s, [], threading.Event()
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="edgeplan-rss", daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.perf_counter() - self._t0, rss()))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter() - self._t0, rss()))
            self._stop.wait(self.period_s)


@dataclass
class FifoResult:
    mode: str
    cold: bool
    models: list[str]
    iterations: int
    baseline_bytes: int
    peak_above_baseline_bytes: int
    requests: list[dict] = field(default_factory=list)  # {model, iteration, ms, stall_ms}
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (s, bytes above the baseline)

    def summary(self) -> dict[str, float]:
        return {m: statistics.median(r["ms"] for r in self.requests if r["model"] == m) for m in self.models}


def drop_cache(paths) -> None:
    """Drop the page cache of ``paths`` (their next read is cold)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@dataclass(frozen=True)
class Job:
    """One model's request: ``run()`` serves it and returns its stall ms; ``files`` are the blobs it reads
    (their pages are dropped before a cold request)."""

    run: Callable[[], float]
    files: tuple[Path, ...]


def preload_job(whole: Path, sha256: str, x: np.ndarray, interp: Callable[[bytes], object]) -> Job:
    """The ``preload`` baseline: the whole int8 model read, its sha256 checked (as every streamed segment's
    is), built as one interpreter, run, dropped."""
    return Job(lambda: (_preloaded(Path(whole), sha256, x, interp), 0.0)[1], (Path(whole),))


def streamed_job(segs: list[stream.Segment], mode: str, plan, x: np.ndarray,
                 interp: Callable[[bytes], object], unpacked: Callable[[bytes], object] | None = None) -> Job:
    """The model streamed in ``mode`` (``plan``: its overlap plan's reads and builds); ``unpacked`` builds the
    segments planned with unpacked kernels (``stream.Streamer``)."""
    streamer = stream.Streamer(segs, stream.schedule(segs, mode, plan), interp, mode, unpacked=unpacked)
    key = segs[0].inputs[0]
    return Job(lambda: streamer.run({key: x})[1].stall_ms, tuple(s.path for s in segs))


def revision_jobs(rev_dir: Path, manifest, models: list[str], mode: str, deterministic: bool = False
                  ) -> dict[str, Job]:
    """The requests of ``models`` on a pulled revision, each on its first self-test input."""
    from edgeplan.quantize import litert
    from edgeplan.runtime.model import quantize_input

    entries = {e.name: e for e in manifest.models}
    unknown = [m for m in models if m not in entries]
    if unknown:
        raise EdgeplanError(f"{manifest.deployment} revision {manifest.revision} serves "
                            f"{', '.join(entries)}; not {', '.join(unknown)}")
    plans = stream.load_plans(rev_dir, manifest)
    interp = partial(litert.interpreter, deterministic=deterministic)
    out = {}
    for name in models:
        e = entries[name]
        x = quantize_input(np.load(Path(rev_dir) / e.selftests[0].input, allow_pickle=False), e.input)
        if mode == "preload":
            whole = f"models/{e.name}/{e.version}/segments/p0/suffix_int8.tflite"
            ref = next((b for b in manifest.blobs if b.name == whole), None)
            if ref is None:
                raise EdgeplanError(f"{manifest.deployment} revision {manifest.revision} has no {whole} to preload")
            out[name] = preload_job(Path(rev_dir) / whole, ref.sha256, x, interp)
            continue
        if name not in plans:
            raise EdgeplanError(f"{name} has no FlashMem plan in revision {manifest.revision}: stream modes need "
                                "one (`edgeplan plan flashmem`); --stream-mode preload runs it whole")
        m, segs = plans[name]
        # deterministic: one kernel set for every segment, as the expected outputs were made
        out[name] = streamed_job(segs, mode, m.plan, x, interp, interp if deterministic else None)
    return out


def run(rev_dir: Path, manifest, models: list[str], iterations: int, mode: str = "plan", cold: bool = True,
        deterministic: bool = False) -> FifoResult:
    """Run ``models`` FIFO ``iterations`` times on the self-test inputs of each (see the module docstring)."""
    stream.return_freed_memory()  # every mode alike (Streamer sets it too): a dropped model's memory goes back
    return measure(revision_jobs(rev_dir, manifest, models, mode, deterministic), models, iterations, mode, cold)


def measure(jobs: dict[str, Job], models: list[str], iterations: int, mode: str, cold: bool = True,
            warmup: bool = True) -> FifoResult:
    """Serve ``models`` in FIFO order ``iterations`` times, sampling the resident set (the module docstring).
    Call ``stream.return_freed_memory`` first, as ``run`` does, so every mode frees alike. ``warmup``: one
    unmeasured request of each model before the baseline, so the runtime's one-time costs (LiteRT's and
    XNNPACK's first-interpreter set-up: 6-9 MiB here) count as a process that has served before, in every mode."""
    for name in models if warmup else ():
        jobs[name].run()
    hwm = reset_hwm()
    baseline = rss()
    result = FifoResult(mode, cold, list(models), iterations, baseline, 0)
    with RssSampler() as sampler:
        for it in range(iterations):
            for name in models:
                job = jobs[name]
                if cold:
                    drop_cache(job.files)
                t0 = time.perf_counter()
                stall = job.run()
                result.requests.append({"model": name, "iteration": it, "ms": (time.perf_counter() - t0) * 1e3,
                                        "stall_ms": stall})
    result.timeline = [(round(t, 4), b - baseline) for t, b in sampler.samples]
    sampled = max((b for _, b in result.timeline), default=0)
    # the kernel's high-water mark sees a peak between two samples; the sampler's maximum when it cannot be reset
    result.peak_above_baseline_bytes = max(sampled, hwm_bytes() - baseline) if hwm else sampled
    return result


def _preloaded(path: Path, sha256: str, x: np.ndarray, interp) -> np.ndarray:
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise stream.StreamError(f"{path.name}: its bytes do not match sha256 {sha256[:12]}...; the blob is corrupt: "
                                 "pull the revision again")
    it = interp(data)
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    out = it.get_tensor(it.get_output_details()[0]["index"])  # a copy already
    del it, data
    stream.trim_heap()  # as a streamed request ends (``stream.trim_heap``)
    return out
