"""The CPU profiler: LiteRT interpreter, warm-up, repeated timed runs per thread count.

Each segment is first screened alone in a worker process (``python -m edgeplan.profile.cpu``), so a segment
that crashes the interpreter or runs past its timeout is recorded as such and the others are still profiled:
the parent kills a worker that overstays and starts a new one. The segments that ran are then timed together
in interleaved rounds: on a shared machine the speed drifts by tens of percent over seconds, and rounds
spread each segment's samples over the same stretch of time.

numpy, ai-edge-litert and the standard library only: a device runs this same code for fleet profiling.
"""
from __future__ import annotations

import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
KERNELS = ("xnnpack", "reference")
# The speed probe: a fixed int8 model (the first partition-point prefix of the zoo's seeded MobileNetV2 224:
# a 3x3 convolution, depthwise and pointwise convolutions at high resolution, about 2 ms on one core) timed
# in every round beside the segments. Its time says how fast the machine was while they were timed.
PROBE = Path(__file__).parent / "data" / "probe_int8.tflite"


@dataclass(frozen=True)
class Settings:
    warmup: int = 2
    repeats: int = 300  # at most this many timed runs (rounds) per segment and thread count
    min_repeats: int = 5
    span_s: float = 20.0  # interleaved rounds go on for at least this long (after min_repeats) ...
    budget_s: float = 10.0  # ... and stop once the segments have used this much each (screening: a quarter)
    timeout_s: float = 120.0  # a segment still running after this is killed and recorded as timed out
    kernels: str = "xnnpack"
    seed: int = 0

    @classmethod
    def from_params(cls, p: dict) -> Settings:
        s = cls(**{k: p[k] for k in ("warmup", "repeats", "min_repeats", "span_s", "budget_s", "timeout_s", "kernels")
                   if k in p})
        if s.kernels not in KERNELS:
            raise ValueError(f"profile.kernels: {s.kernels!r} is not one of {', '.join(KERNELS)}")
        if s.repeats < 1 or s.min_repeats < 1 or s.warmup < 0:
            raise ValueError("profile: repeats and min_repeats must be at least 1, warmup at least 0")
        return s


@dataclass(frozen=True)
class Measurement:
    """The outcome for one segment: samples per thread count, or why there are none."""

    status: str  # "ok", "failed", "timeout"
    samples_ms: dict[int, list[float]]
    input_bytes: int = 0
    output_bytes: int = 0
    error: str | None = None


def host() -> dict:
    """This machine, as a profile records it (``edgeplan.profile.schema.Host`` fields)."""
    import platform
    import socket

    cpu_model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu_model = next((line.split(":", 1)[1].strip() for line in f
                              if line.lower().startswith(("model name", "hardware"))), cpu_model)
    except OSError:
        pass
    try:
        from importlib.metadata import version

        litert = version("ai-edge-litert")
    except Exception:  # noqa: BLE001 - informative only
        litert = "unknown"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"machine": platform.machine(), "cpu_model": cpu_model, "cores": cores,
            "python": platform.python_version(), "litert": litert, "hostname": socket.gethostname()}


def _interpreter(path: str, threads: int, settings: Settings, rng):
    """A LiteRT interpreter for ``path`` with random inputs set; (interpreter, input bytes, output bytes)."""
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    resolver = OpResolverType.AUTO if settings.kernels == "xnnpack" else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    it = Interpreter(model_path=path, num_threads=threads, experimental_op_resolver_type=resolver)
    it.allocate_tensors()
    inputs = random_inputs(it, rng)

    def size(details):
        return int(sum(np.prod(d["shape"]) * np.dtype(d["dtype"]).itemsize for d in details))

    return it, size(inputs), size(it.get_output_details())


def random_inputs(it, rng) -> list[dict]:
    """Set every input of an allocated interpreter to random values (integers over their dtype's range, floats
    in [-1, 1]); returns the input details."""
    from edgeplan.quantize.litert import random_value

    inputs = it.get_input_details()
    for d in inputs:
        it.set_tensor(d["index"], random_value(d["shape"], d["dtype"], rng))
    return inputs


def median_ms(work, repeats: int) -> float:
    """Median milliseconds of ``repeats`` calls of ``work()``."""
    import statistics

    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        work()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def _timed(it) -> float:
    t0 = time.perf_counter()
    it.invoke()
    return (time.perf_counter() - t0) * 1e3


def time_segment(path: str, threads: list[int], settings: Settings) -> dict:
    """In this process: one segment, each thread count in turn: warm up, then timed ``invoke`` calls."""
    import numpy as np

    rng = np.random.default_rng(settings.seed)
    out: dict = {"samples_ms": {}}
    for n in threads:
        it, out["input_bytes"], out["output_bytes"] = _interpreter(path, n, settings, rng)
        for _ in range(settings.warmup):
            it.invoke()
        samples: list[float] = []
        started = time.perf_counter()
        while len(samples) < settings.repeats:
            samples.append(_timed(it))
            if len(samples) >= settings.min_repeats and time.perf_counter() - started > settings.budget_s / len(threads):
                break
        out["samples_ms"][str(n)] = samples
        del it
    return out


def time_interleaved(paths: list[str], threads: list[int], settings: Settings, report=lambda r, n: None) -> list[dict]:
    """In this process: every (segment, thread count) loaded at once and timed in rounds, one ``invoke`` of
    each per round, so slow drifts of a shared machine (a noisy neighbour, a frequency change) fall on every
    segment alike instead of on whichever segment was being timed at that moment."""
    import numpy as np

    rng = np.random.default_rng(settings.seed)
    runs = []
    outs = [{"samples_ms": {}} for _ in paths]
    for i, path in enumerate(paths):
        for n in threads:
            it, outs[i]["input_bytes"], outs[i]["output_bytes"] = _interpreter(path, n, settings, rng)
            for _ in range(settings.warmup):
                it.invoke()
            outs[i]["samples_ms"][str(n)] = []
            runs.append((it, outs[i]["samples_ms"][str(n)]))
    budget = settings.budget_s * len(paths)
    started = time.perf_counter()
    for r in range(settings.repeats):
        for it, samples in runs:
            samples.append(_timed(it))
        elapsed = time.perf_counter() - started
        report(r + 1, settings.repeats)
        if r + 1 >= settings.min_repeats and (elapsed > settings.span_s or elapsed > budget):
            break
    return outs


class Profiler:
    """Profiles segments one after another in a worker process; restarts the worker after a crash or timeout."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._proc: subprocess.Popen | None = None
        self._stderr = tempfile.TemporaryFile(mode="w+")  # the worker's log (a pipe could fill and block it)

    def __enter__(self) -> Profiler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                try:
                    self._proc.stdin.close()  # the worker exits at end of input
                    self._proc.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    self._proc.kill()
                    self._proc.wait()
            self._proc = None
        self._stderr.close()

    def _worker(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "edgeplan.profile.cpu"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=self._stderr, env=env, bufsize=0,
            )
            self._pending = b""  # worker output read but not yet split into lines
            self._stderr_start = self._stderr.seek(0, os.SEEK_END)
        return self._proc

    def _request(self, request: dict, timeout_s: float, on_progress=None) -> tuple[str, dict | str]:
        """("ok", reply) | ("failed", message) | ("timeout", message) | ("crashed", message)."""
        proc = self._worker()
        request = {**request, "settings": self.settings.__dict__}
        try:
            data = memoryview((json.dumps(request) + "\n").encode())
            while data:  # an unbuffered pipe may take a long request in parts
                data = data[proc.stdin.write(data):]
        except BrokenPipeError:
            return "crashed", self._died(proc)
        deadline = time.monotonic() + timeout_s
        while True:
            line = self._read_line(proc, deadline)
            if line is None:
                proc.kill()
                proc.wait()
                self._proc = None
                return "timeout", f"still running after {timeout_s:g} s; killed (raise profile.timeout_s if it is expected)"
            if line == "":
                return "crashed", self._died(proc)
            if not line.startswith("{"):  # a library printing to stdout: not ours
                continue
            reply = json.loads(line)
            if "progress" in reply:
                if on_progress:
                    on_progress(reply["progress"], reply["of"])
                continue
            return ("ok", reply) if reply["ok"] else ("failed", reply["error"])

    def measure(self, path: str, threads: list[int]) -> Measurement:
        """One segment alone in the worker (crash and timeout isolated)."""
        status, reply = self._request({"path": str(path), "threads": list(threads)}, self.settings.timeout_s)
        if status != "ok":
            return Measurement("timeout" if status == "timeout" else "failed", {}, error=f"{path}: {reply}")
        return Measurement("ok", {int(k): v for k, v in reply["samples_ms"].items()},
                           reply["input_bytes"], reply["output_bytes"])

    def measure_many(self, paths: list[str], threads: list[int], progress=lambda stage, done, total: None,
                     group_bytes: int = 512 * 1024 * 1024) -> tuple[list[Measurement], Measurement | None]:
        """Every segment: screened alone first (a crash or a timeout costs only that segment), then the
        segments that ran timed together in interleaved rounds (``time_interleaved``) with the speed probe,
        in groups of at most ``group_bytes`` of model files. A group whose worker fails keeps its screening
        samples. Returns the measurements and the probe's (all its groups' samples pooled)."""
        full = self.settings
        screen = Settings(**{**full.__dict__, "repeats": full.min_repeats, "budget_s": min(full.budget_s, full.span_s) / 4})
        out: list[Measurement] = []
        self.settings = screen
        try:
            for i, path in enumerate(paths):
                progress("cpu: screen", i, len(paths))
                out.append(self.measure(path, threads))
            progress("cpu: screen", len(paths), len(paths))
        finally:
            self.settings = full
        groups: list[list[int]] = [[]]
        size = 0
        for i, m in enumerate(out):
            if m.status != "ok":
                continue
            b = os.path.getsize(paths[i]) * len(threads)
            if groups[-1] and size + b > group_bytes:
                groups.append([])
                size = 0
            groups[-1].append(i)
            size += b
        probe: dict[int, list[float]] = {}
        for g, members in enumerate(g for g in groups if g):
            stage = "cpu: rounds" + (f" {g + 1}" if len(groups) > 1 else "")
            status, reply = self._request(
                {"paths": [str(paths[i]) for i in members] + [str(PROBE)], "threads": list(threads)},
                full.timeout_s * (len(members) + 1), lambda r, n, stage=stage: progress(stage, r, n))
            if status != "ok":
                log.warning("interleaved timing of %d segments failed (%s); keeping their screening samples",
                            len(members), reply)
                continue
            *segs, probe_seg = reply["segments"]
            for i, seg in zip(members, segs):
                out[i] = Measurement("ok", {int(k): v for k, v in seg["samples_ms"].items()},
                                     seg["input_bytes"], seg["output_bytes"])
            for k, v in probe_seg["samples_ms"].items():
                probe.setdefault(int(k), []).extend(v)
        return out, (Measurement("ok", probe) if probe else None)

    def _died(self, proc: subprocess.Popen) -> str:
        code = proc.wait()
        self._stderr.seek(self._stderr_start)
        tail = [x for x in self._stderr.read().strip().splitlines() if not x.startswith("INFO:")][-3:]
        self._proc = None
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        return f"the interpreter crashed ({how})" + (f": {' | '.join(tail)}" if tail else "")

    def _read_line(self, proc: subprocess.Popen, deadline: float) -> str | None:
        """A line from the worker, "" when it died, None when ``deadline`` passed without one.

        Lines are split here from raw reads: a buffered reader could hold several lines already read from the
        pipe while ``select`` waits on the empty pipe for the next one."""
        fd = proc.stdout.fileno()
        while b"\n" not in self._pending:
            sel = selectors.DefaultSelector()
            sel.register(fd, selectors.EVENT_READ)
            try:
                ready = sel.select(max(0.0, deadline - time.monotonic()))
            finally:
                sel.close()
            if not ready:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return ""
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode() + "\n"


def _serve() -> None:
    """The worker: one JSON request per line on stdin; progress lines, then one JSON reply line on stdout."""
    def say(obj: dict) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    for line in sys.stdin:
        request = json.loads(line)
        settings = Settings(**request["settings"])
        try:
            if "paths" in request:
                reply = {"ok": True, "segments": time_interleaved(
                    request["paths"], request["threads"], settings, lambda r, n: say({"progress": r, "of": n}))}
            else:
                reply = {"ok": True, **time_segment(request["path"], request["threads"], settings)}
        except Exception as e:  # noqa: BLE001 - reported to the parent, which records the segment as failed
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        say(reply)


if __name__ == "__main__":
    _serve()
