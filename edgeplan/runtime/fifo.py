"""``edgeplan-runtime fifo``: FlashMem's FIFO multi-model workload (§2.2, Fig. 6) on the active revision.

Models are run one request at a time in FIFO order, round after round; each request reads its model from the
revision's blobs (cold: their pages dropped first, as a model that is not kept resident comes from storage),
builds and runs it — streamed as its FlashMem plan says (or another stream mode), or ``preload``: the whole
int8 model as one interpreter — and drops it. A sampler thread records the process's resident set every
2 ms: the timeline, and the peak above the resident set before the first request. numpy + ai-edge-litert.
"""
from __future__ import annotations

import os
import statistics
import threading
import time
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


def _drop_cache(paths) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run(rev_dir: Path, manifest, models: list[str], iterations: int, mode: str = "plan", cold: bool = True,
        deterministic: bool = False) -> FifoResult:
    """Run ``models`` FIFO ``iterations`` times on the self-test inputs of each (see the module docstring)."""
    from edgeplan.quantize import litert
    from edgeplan.runtime.model import quantize_input

    entries = {e.name: e for e in manifest.models}
    unknown = [m for m in models if m not in entries]
    if unknown:
        raise EdgeplanError(f"{manifest.deployment} revision {manifest.revision} serves "
                            f"{', '.join(entries)}; not {', '.join(unknown)}")
    stream.return_freed_memory()  # every mode alike (Streamer sets it too): a dropped model's memory goes back
    plans = stream.load_plans(rev_dir, manifest)
    interp = partial(litert.interpreter, deterministic=deterministic)
    jobs = {}
    for name in models:
        e = entries[name]
        x = quantize_input(np.load(Path(rev_dir) / e.selftests[0].input, allow_pickle=False), e.input)
        if mode == "preload":
            whole = Path(rev_dir) / f"models/{e.name}/{e.version}/segments/p0/suffix_int8.tflite"
            jobs[name] = (lambda whole=whole, x=x: (_preloaded(whole, x, interp), 0.0), [whole])
            continue
        if name not in plans:
            raise EdgeplanError(f"{name} has no FlashMem plan in revision {manifest.revision}: stream modes need "
                                "one (`edgeplan plan flashmem`); --stream-mode preload runs it whole")
        m, segs = plans[name]
        streamer = stream.Streamer(segs, stream.schedule(segs, mode, m.plan), interp, mode)
        jobs[name] = (lambda s=streamer, key=segs[0].inputs[0], x=x: _streamed(s, {key: x}), [s.path for s in segs])
    hwm = reset_hwm()
    baseline = rss()
    result = FifoResult(mode, cold, list(models), iterations, baseline, 0)
    with RssSampler() as sampler:
        for it in range(iterations):
            for name in models:
                fn, files = jobs[name]
                if cold:
                    _drop_cache(files)
                t0 = time.perf_counter()
                _, stall = fn()
                result.requests.append({"model": name, "iteration": it, "ms": (time.perf_counter() - t0) * 1e3,
                                        "stall_ms": stall})
    result.timeline = [(round(t, 4), b - baseline) for t, b in sampler.samples]
    sampled = max((b for _, b in result.timeline), default=0)
    # the kernel's high-water mark sees a peak between two samples; the sampler's maximum when it cannot be reset
    result.peak_above_baseline_bytes = max(sampled, hwm_bytes() - baseline) if hwm else sampled
    return result


def _preloaded(path: Path, x: np.ndarray, interp) -> np.ndarray:
    it = interp(path.read_bytes())
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"]).copy()


def _streamed(streamer: stream.Streamer, x: dict) -> tuple[dict, float]:
    out, log = streamer.run(x)
    return out, log.stall_ms
