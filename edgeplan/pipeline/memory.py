"""Peak resident memory per stage, measured: a sampler thread reads the RSS of this process and of every
process it started (the onnx2tf child, profiler workers) from /proc; each stage records its peak, its
baseline at entry and its time. Linux only (/proc); elsewhere the record says the sampler was unavailable.

The figures are measurements, never the planner's arithmetic: ``peak_rss_bytes`` is the largest sum of
RSS over the process tree seen during the stage (sampled every ``interval_s``; a spike shorter than that can
be missed), ``peak_over_baseline_bytes`` subtracts what the tree held when the stage began; ``peak_self_rss_bytes``
and ``peak_children_rss_bytes`` split it into this process and the processes it started (the children's sum), so
that each process's peak can be set against its own baseline (``bench/compile_memory.py``)."""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss(pid: int | None = None) -> int:
    """Resident set of ``pid`` (default: this process), bytes; 0 when /proc cannot say."""
    pid = pid or os.getpid()
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", "rb") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def tree_rss(pid: int | None = None) -> int:
    """RSS of ``pid`` (default: this process) and all its descendants, bytes."""
    return sum(split_rss(pid))


def split_rss(pid: int | None = None) -> tuple[int, int]:
    """(RSS of ``pid`` (default: this process), RSS of all its descendants), bytes."""
    root = pid or os.getpid()
    todo, kids, seen = _children(root), 0, {root}
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        kids += rss(p)
        todo += _children(p)
    return rss(root), kids


@dataclass(frozen=True)
class StageMemory:
    stage: str
    peak_rss_bytes: int  # of the process tree
    baseline_rss_bytes: int  # of the process tree, when the stage began
    seconds: float
    peak_self_rss_bytes: int = 0  # of this process alone
    peak_children_rss_bytes: int = 0  # of the processes it started (their sum, at one sample)
    baseline_self_rss_bytes: int = 0  # of this process alone, when the stage began
    baseline_children_rss_bytes: int = 0  # of the processes it had started, when the stage began

    @property
    def peak_over_baseline_bytes(self) -> int:
        return max(0, self.peak_rss_bytes - self.baseline_rss_bytes)

    def to_json(self) -> dict:
        return {"peak_rss_bytes": self.peak_rss_bytes, "baseline_rss_bytes": self.baseline_rss_bytes,
                "peak_over_baseline_bytes": self.peak_over_baseline_bytes, "seconds": round(self.seconds, 3),
                "peak_self_rss_bytes": self.peak_self_rss_bytes,
                "peak_children_rss_bytes": self.peak_children_rss_bytes,
                "baseline_self_rss_bytes": self.baseline_self_rss_bytes,
                "baseline_children_rss_bytes": self.baseline_children_rss_bytes}


_CURRENT: list = []  # the active sampler (the innermost ``with Sampler()``), for ``stage``


@contextmanager
def stage(name: str):
    """Mark a stage in library code: measured when a ``Sampler`` is active (the CLI's), free otherwise."""
    if not _CURRENT:
        yield
        return
    with _CURRENT[-1].stage(name):
        yield


class Sampler:
    """``with Sampler() as s: with s.stage("ingest"): ...``; ``s.stages`` holds one StageMemory per stage."""

    def __init__(self, interval_s: float = 0.02):
        self.interval = interval_s
        self.available = Path(f"/proc/{os.getpid()}/statm").exists()
        self.stages: list[StageMemory] = []
        self._active: list[list[int]] = []  # the running peak of every stage in progress (stages nest)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        _CURRENT.append(self)
        if self.available:
            self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        _CURRENT.remove(self)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _sample(self, peaks: list[list[int]]) -> None:
        own, kids = split_rss()
        with self._lock:
            for peak in peaks:
                peak[0] = max(peak[0], own + kids)
                peak[1] = max(peak[1], own)
                peak[2] = max(peak[2], kids)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample(self._active)

    @contextmanager
    def stage(self, name: str):
        own, kids = split_rss() if self.available else (0, 0)
        mine = [own + kids, own, kids]  # peaks: the tree, this process, its children
        with self._lock:
            self._active.append(mine)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.available:
                self._sample([mine])
            with self._lock:
                self._active = [p for p in self._active if p is not mine]  # by identity: equal peaks differ
            self.stages.append(StageMemory(name, mine[0], own + kids, time.perf_counter() - t0, mine[1], mine[2],
                                           own, kids))

    def record(self) -> dict:
        """Per stage name (a stage run several times, e.g. compile once per point, is merged: the largest peak
        over its baseline, the total time), in the order stages first started."""
        out: dict[str, dict] = {}
        mine = ("peak_self_rss_bytes", "peak_children_rss_bytes")
        for s in self.stages:
            rec = s.to_json()
            held = out.get(s.stage)
            if held is None or rec["peak_over_baseline_bytes"] > held["peak_over_baseline_bytes"]:
                out[s.stage] = {**rec, "seconds": round(rec["seconds"] + (held["seconds"] if held else 0.0), 3),
                                "runs": (held["runs"] if held else 0) + 1,
                                **{k: max(rec[k], held[k] if held else 0) for k in mine}}
            else:
                held["seconds"] = round(held["seconds"] + rec["seconds"], 3)
                held["runs"] += 1
                held.update({k: max(rec[k], held[k]) for k in mine})
        return out
