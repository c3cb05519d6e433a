"""The serving engine (SwapLess §IV, online phase): one global accelerator worker runs prefixes FCFS; each
model has its own CPU pool of k_i threads for suffixes; a sliding-window rate monitor re-runs the SwapLess
allocator (the offline planner's numpy code) and switches partitions and cores without failing a request in
flight (a request keeps the point it arrived under; added threads serve at once, removed ones retire when
free; a pool given 0 cores keeps a thread while suffixes of an older partition remain).

Accelerator modes:
- ``emulated`` (no Edge TPU): the worker returns the prefix output computed ahead (``precompute``: at start-up,
  for the finite set of inputs a load test uses; an input not computed ahead is run on the CPU and counted)
  and holds the modelled service time — the profile's EMULATED Edge TPU time (s^TPU + d/B, plus T^Load when
  another model evicted the prefix's parameters from the on-chip cache) — so the CPU stays with the suffixes.
  The hold runs on the emulated device's own FCFS clock: a prefix starts when its request arrived or the one
  before it is done, and its suffix pool starts the suffix at that time (no worker-thread wake-up between);
- ``cpu``: correctness mode, the prefix runs on the CPU (int8, LiteRT) and takes what it takes;
- ``edgetpu``: a real Edge TPU through the libedgetpu delegate (prefix_edgetpu.tflite).
numpy, ai-edge-litert and the standard library only.
"""
from __future__ import annotations

import bisect
import collections
import gc
import heapq
import math
import queue
import random
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from edgeplan.errors import EdgeplanError
from edgeplan.quantize import litert
from edgeplan.runtime import parallel
from edgeplan.runtime.model import (
    BadRequest,
    ServedModel,
    dequantize_output,
    input_key,
    load_plan,
    quantize_input,
    segment_dir,
)
from edgeplan.runtime.pull import active, read_manifest

# How long a thread may hold the GIL while another waits for it (CPython: 5 ms). LiteRT releases the GIL while
# it invokes; coming back, a suffix thread waits for the GIL, and behind a busy Python thread (HTTP, the load
# generator, the allocator) that was up to 5 ms per request: a MobileNetV2 suffix timed 13 ms instead of 8 here.
GIL_SWITCH_S = 2e-4
SPIN_S = 4e-4  # wait_until: the last stretch before a deadline is spent yielding, not asleep
SERVICE_SAMPLES = 10_000  # suffix invoke times kept per model and point
BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
# Latency-aware admission: while a model is overloaded (requests offered over the last OVERLOAD_WINDOW_S beyond
# what it can serve at the measured service times), a request that would wait is turned away (503) when the
# latency expected for it (the work queued ahead of it) is over this multiple of the plan's predicted latency.
# Below capacity nothing is turned away for latency: the queue a burst builds drains by itself.
LATENCY_BUDGET = 1.4
OVERLOAD_WINDOW_S = 1.0
SERVICE_EWMA = 0.1  # weight of the newest suffix invoke time in a pool's running mean


class Overloaded(EdgeplanError):
    """Too many requests in flight, or too long a queue ahead: the caller should retry after ``retry_after_s``
    (HTTP 503 with Retry-After)."""

    def __init__(self, message: str, retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass
class Request:
    model: str
    point: int
    x: np.ndarray  # the int8 model input
    future: Future
    arrival: float = field(default_factory=time.perf_counter)
    ready: float = 0.0  # emulated accelerator: when its prefix is done on the device's clock (perf_counter)


def wait_until(deadline: float) -> None:
    """Return at ``deadline`` (perf_counter), within tens of microseconds: sleep until SPIN_S before it (the OS
    wakes a sleeper 85-400 us late on these VMs), then yield until it (each ``sleep(0)`` lets the GIL go)."""
    left = deadline - time.perf_counter() - SPIN_S
    if left > 0:
        time.sleep(left)
    while time.perf_counter() < deadline:
        time.sleep(0)


_PROCESS = {"running": 0, "switch": None}
_PROCESS_LOCK = threading.Lock()


def _process_enter(gil_switch_s: float | None) -> None:
    """A runtime starts: the process's GIL switch interval (while any runtime runs) and the cyclic collector.
    What is alive now (imports, segments, interpreters, prefix outputs computed ahead) stays alive, so it is
    frozen out of the collector's passes: a full pass walked it all, pausing every thread (8 ms for the
    runtime alone here, 170 ms in a process that has imported TensorFlow)."""
    with _PROCESS_LOCK:
        if _PROCESS["running"] == 0 and gil_switch_s:
            _PROCESS["switch"] = sys.getswitchinterval()
            sys.setswitchinterval(gil_switch_s)
        _PROCESS["running"] += 1
        gc.freeze()


def _process_leave() -> None:
    """A runtime stops: unfreeze, so it can be collected (``refreeze`` once it is gone, while others run)."""
    with _PROCESS_LOCK:
        _PROCESS["running"] -= 1
        gc.unfreeze()
        if _PROCESS["running"] == 0 and _PROCESS["switch"] is not None:
            sys.setswitchinterval(_PROCESS["switch"])
            _PROCESS["switch"] = None


def refreeze() -> None:
    """After a stopped runtime was dropped while another still runs (a revision swap): collect it, and freeze
    what the running one holds again."""
    with _PROCESS_LOCK:
        gc.collect()
        if _PROCESS["running"]:
            gc.freeze()


def request_metrics(order: list[str], hist: dict[str, Histogram], codes: collections.Counter,
                    what: str = "served requests") -> list[str]:
    """Prometheus lines of the request latency histograms and the request counts by model and status."""
    lines = [f"# HELP edgeplan_request_latency_seconds End-to-end latency of {what}.",
             "# TYPE edgeplan_request_latency_seconds histogram"]
    for n in order:
        h, acc = hist[n], 0
        for b, c in zip((*BUCKETS_S, float("inf")), h.counts):
            acc += c
            le = "+Inf" if b == float("inf") else repr(b)
            lines.append(f'edgeplan_request_latency_seconds_bucket{{model="{n}",le="{le}"}} {acc}')
        lines.append(f'edgeplan_request_latency_seconds_sum{{model="{n}"}} {h.sum:.6f}')
        lines.append(f'edgeplan_request_latency_seconds_count{{model="{n}"}} {h.n}')
    lines += ["# HELP edgeplan_requests_total Requests by model and HTTP-like status.",
              "# TYPE edgeplan_requests_total counter"]
    return lines + [f'edgeplan_requests_total{{model="{n}",code="{c}"}} {v}' for (n, c), v in sorted(codes.items())]


def admit(rt, model: str, refuse=None) -> None:
    """One more request in flight on runtime ``rt`` (its ``lock``, ``inflight``, ``max_inflight``, ``codes``), or
    ``Overloaded`` (HTTP 503) at the limit or when ``refuse(model)`` (called under the lock) gives a reason and
    the seconds after which to retry."""
    with rt.lock:
        if rt.inflight >= rt.max_inflight:
            rt.codes[model, 503] += 1
            raise Overloaded(f"{rt.inflight} requests in flight (limit {rt.max_inflight}); retry later")
        if refuse is not None and (why := refuse(model)) is not None:
            rt.codes[model, 503] += 1
            raise Overloaded(*why)
        rt.inflight += 1


class RateMonitor:
    """Arrivals per model over a sliding window (s); the rate is count / window (with ``ramp``, / the time since
    the monitor started while that is shorter; without, a burst just after start-up is not read as a high rate)."""

    def __init__(self, names, window_s: float, ramp: bool = True):
        self.window, self.ramp = window_s, ramp
        self.started = time.perf_counter()
        self.arrivals = {n: collections.deque() for n in names}
        self.lock = threading.Lock()

    def arrive(self, name: str, now: float) -> None:
        """Count an arrival, and drop the model's arrivals out of the window (here, not only in ``rates``: a
        monitor nobody reads, as the offered-load one below capacity, would otherwise keep every arrival)."""
        with self.lock:
            q = self.arrivals[name]
            q.append(now)
            while q[0] < now - self.window:
                q.popleft()

    def rates(self, now: float | None = None) -> dict[str, float]:
        now = time.perf_counter() if now is None else now
        span = max(min(self.window, now - self.started), 1e-3) if self.ramp else self.window
        out = {}
        with self.lock:
            for n, q in self.arrivals.items():
                while q and q[0] < now - self.window:
                    q.popleft()
                out[n] = len(q) / span
        return out


class Histogram:
    def __init__(self):
        self.counts = [0] * (len(BUCKETS_S) + 1)
        self.sum = 0.0
        self.n = 0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS_S, v)] += 1
        self.sum += v
        self.n += 1


class CpuPool:
    """A model's suffix pool: ``target`` threads (k_i), each with its own interpreter per point."""

    def __init__(self, engine: Runtime, model: ServedModel, cores: int):
        self.engine, self.model = engine, model
        self.q: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.service: dict[int, collections.deque] = {}  # point -> the last suffix invoke times (s)
        self.mean_s: dict[int, float] = {}  # point -> running mean of the suffix invoke time (s)
        self.running: dict[int, float] = {}  # thread -> when its suffix invoke started (perf_counter)
        self.target = cores
        self.alive = 0
        self.resize(cores)

    def resize(self, cores: int) -> None:
        with self.lock:
            self.target = cores
            while self.alive < cores:
                self._spawn()

    def _spawn(self) -> None:
        self.alive += 1
        threading.Thread(target=self._work, name=f"cpu-{self.model.name}", daemon=True).start()

    def submit(self, req: Request, tensor: np.ndarray) -> None:
        self.q.put((req, tensor))
        with self.lock:
            if self.alive == 0:  # no core planned, but a suffix of an older partition arrived: one thread drains
                self._spawn()

    def completion(self, point: int, now: float, ready: float) -> tuple[float, bool]:
        """When one more suffix at ``point``, queued at ``ready`` (perf_counter), would be done, and whether it
        would wait for a thread: the suffixes running finish at their start plus the running mean service time
        (the profile's one-core time until one was measured), the queued ones each take a thread for that long
        in turn (FCFS over max(k, running) threads)."""
        s = self.mean_s.get(point, self.model.spec.cpu_mean[point])
        free = [max(now, t + s) for t in list(self.running.values())]
        free += [now] * max(self.target - len(free), 0 if free else 1)
        heapq.heapify(free)
        for _ in range(self.q.qsize()):
            heapq.heapreplace(free, free[0] + s)
        return max(ready, free[0]) + s, free[0] > ready

    def _work(self) -> None:
        interps: dict[int, object] = {}
        while True:
            with self.lock:
                if self.alive > self.target and (self.target > 0 or self.q.empty()) or self.engine.stopping:
                    self.alive -= 1
                    return
            try:
                req, tensor = self.q.get(timeout=0.05)
            except queue.Empty:
                continue
            try:
                if req.ready:  # an emulated prefix: its suffix starts when the device's clock says it is done
                    wait_until(req.ready)
                run = interps.get(req.point)
                if run is None:
                    run = interps[req.point] = self.engine.suffix_runner(self.model, req.point)
                me = threading.get_ident()
                t = self.running[me] = time.perf_counter()
                try:
                    y = run(tensor)
                finally:
                    del self.running[me]
                took = time.perf_counter() - t
                self.service.setdefault(req.point, collections.deque(maxlen=SERVICE_SAMPLES)).append(took)
                old = self.mean_s.get(req.point)
                self.mean_s[req.point] = took if old is None else old + SERVICE_EWMA * (took - old)
                self.engine.finish(req, y)
            except Exception as e:  # noqa: BLE001 - the request fails, the pool goes on
                self.engine.fail(req, e)


def region_key(model: str, point: int, sub: parallel.SubModel, it, live: dict) -> tuple[list[str], tuple]:
    """An Edge TPU region's input names and the key its outputs computed ahead are kept under in
    ``Runtime.computed`` (model, point, sub-model, a fingerprint of each input: ``input_key``)."""
    names = [d["name"] for d in it.get_input_details()]
    return names, (model, point, sub.name, tuple(input_key(live[n]) for n in names))


class Accelerator(threading.Thread):
    """The global accelerator worker: prefixes FCFS, one at a time.

    A real Edge TPU (``edgetpu``) or the CPU (``cpu``): this thread runs each prefix and hands its output to the
    model's pool. EMULATED: the device is a clock — ``emulate``, in the submitting thread, gives a request its
    prefix's completion time FCFS (``free_at``: from its arrival or the previous prefix's end, plus the modelled
    service time and any reload) and the prefix output computed ahead; its suffix pool picks it up at once and
    starts it at that time, and this thread completes all-accelerator requests at theirs. So the emulated
    device's timing does not depend on when Python threads get woken (a real device's does not either; the
    hand-off from the thread that waited on a real Edge TPU to the pool is a cost emulation leaves out)."""

    def __init__(self, engine: Runtime, mode: str, capacity: int, seed: int = 0):
        super().__init__(name="accelerator", daemon=True)
        self.engine, self.mode, self.capacity = engine, mode, capacity
        self.q: queue.Queue = queue.Queue()  # (request, prefix output or None: run it here)
        self.lock = threading.Lock()  # the emulated clock and on-chip cache
        self.cpu_lock = threading.Lock()  # prefix interpreters run on the CPU (not thread-safe)
        self.rng = random.Random(seed)
        self.cache: collections.OrderedDict = collections.OrderedDict()  # model -> (point, bytes), LRU first
        self.used = 0
        self.interps: dict = {}
        self.free_at = 0.0  # emulated: when the device finishes what it was given (perf_counter)
        self.evictions = 0
        self.cpu_fallbacks = 0
        self.region_holds = 0  # Edge TPU regions inside suffixes taken on the device's clock (EMULATED)
        self.region_fallbacks = 0  # of them, computed on the CPU (not computed ahead)

    def emulate(self, req: Request) -> None:
        """EMULATED: schedule ``req``'s prefix on the device's clock and pass the request on (see the class)."""
        m = self.engine.models[req.model]
        hit = self.engine.computed.get((m.name, req.point, input_key(req.x)))
        out = hit[1] if hit is not None and np.array_equal(hit[0], req.x) else None
        fell_back = out is None
        if fell_back:  # not computed ahead: run on the CPU here, and the device is busy at least that long
            with self.cpu_lock:
                self.cpu_fallbacks += 1
                out = self._prefix_on_cpu(m, req.point, req.x)
        with self.lock:
            start = max(req.arrival, self.free_at)
            self.free_at = start + self._resident(m, req.point) + m.tpu_service_s(req.point, self.rng)
            if fell_back:
                self.free_at = max(self.free_at, time.perf_counter())
            req.ready = self.free_at
            # queued under the lock: every queue then holds its requests in the order of their ready times
            if req.point < m.last:
                self.engine.pools[req.model].submit(req, out)
            else:
                self.q.put((req, out))

    def region(self, m: ServedModel, point: int) -> parallel.Device:
        """EMULATED: the Edge TPU regions of ``point``'s suffix (a Parallax plan's offload sub-models) on the
        device's FCFS clock: a region starts when it is handed over or when what the device was given before (a
        prefix, another region) is done, and holds the device for the plan's offload time; its outputs are those
        computed ahead (``Runtime.precompute``), else computed on the CPU here (counted; the device is then busy
        at least until they are). The region's parameters do not enter the on-chip cache model."""
        def begin(sub: parallel.SubModel, it, live: dict, compute) -> Callable[[], dict]:
            names, key = region_key(m.name, point, sub, it, live)
            hit = self.engine.computed.get(key)
            asked = time.perf_counter()
            out = hit[1] if hit is not None and all(np.array_equal(a, live[n]) for a, n in zip(hit[0], names)) else None
            fell_back = out is None
            if fell_back:
                out = compute()
            with self.lock:
                start = max(asked, self.free_at)
                self.free_at = start + sub.offload_s
                if fell_back:
                    self.free_at = max(self.free_at, time.perf_counter())
                    self.region_fallbacks += 1
                self.region_holds += 1
                done = self.free_at

            def finish() -> dict:
                wait_until(done)
                return out
            return finish
        return begin

    def _resident(self, m: ServedModel, p: int) -> float:
        """Make (m, p) resident in the on-chip cache (SwapLess's LRU); the load time it costs (s)."""
        if m.name in self.cache and self.cache[m.name][0] == p:
            self.cache.move_to_end(m.name)
            return 0.0
        if m.name in self.cache:
            self.used -= self.cache.pop(m.name)[1]
        foot = min(m.footprint(p), self.capacity)
        while self.cache and self.used + foot > self.capacity:
            _, (_, b) = self.cache.popitem(last=False)
            self.used -= b
            self.evictions += 1
        self.cache[m.name] = (p, foot)
        self.used += foot
        return m.load_s(p)

    def _prefix_on_cpu(self, m: ServedModel, p: int, x: np.ndarray) -> np.ndarray:
        key = (m.name, p)
        if key not in self.interps:
            self.interps[key] = litert.Runner(litert.interpreter(m.segment(p, "prefix"), deterministic=False))
        return self.interps[key](x)

    def _prefix_on_edgetpu(self, m: ServedModel, p: int, x: np.ndarray) -> np.ndarray:
        key = (m.name, p, "edgetpu")
        if key not in self.interps:
            from ai_edge_litert.interpreter import Interpreter, load_delegate

            path = segment_dir(m.rev_dir, m.entry, p) / "prefix_edgetpu.tflite"
            it = Interpreter(model_path=str(path), experimental_delegates=[load_delegate("libedgetpu.so.1")])
            it.allocate_tensors()
            self.interps[key] = litert.Runner(it)
        return self.interps[key](x)

    def run(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            req, out = item
            m = self.engine.models[req.model]
            try:
                if out is not None:  # emulated, all on the accelerator: done at the device's time
                    wait_until(req.ready)
                elif self.mode == "edgetpu":
                    out = self._prefix_on_edgetpu(m, req.point, req.x)
                else:
                    with self.cpu_lock:
                        out = self._prefix_on_cpu(m, req.point, req.x)
            except Exception as e:  # noqa: BLE001
                self.engine.fail(req, e)
                continue
            if req.point < m.last:
                self.engine.pools[req.model].submit(req, out)
            else:
                self.engine.finish(req, out)


def _publishable(entry, point: int, which: str) -> None:
    if point in entry.excluded_points:
        raise EdgeplanError(f"{entry.name}: {which} point {point} failed the accuracy gate (its int8 top-1 fell too "
                            f"far); this revision never runs it (excluded: {list(entry.excluded_points)})")


class Runtime:
    """Serve the active revision under ``dest`` (or a revision directory). Python API: ``start()``,
    ``infer(model, x)``/``submit(model, x)`` (float input in the model's layout, or the int8 model's tensor
    as it is -> float output),
    ``precompute(model, xs)``, ``configure(points, cores)``, ``metrics_text()``, ``status()``, ``stop()``."""

    def __init__(self, dest: Path, *, mode: str = "emulated", adapt: bool = True, window_s: float = 10.0,
                 interval_s: float = 2.0, max_inflight: int = 256, hysteresis: float = 0.02, seed: int = 0,
                 rates: dict[str, float] | None = None, gil_switch_s: float | None = GIL_SWITCH_S,
                 parallax: bool = True, latency_budget: float | None = LATENCY_BUDGET):
        found = active(dest)
        if found is None:
            rev_dir = Path(dest)
            if not (rev_dir / "manifest.json").is_file():
                raise EdgeplanError(f"{dest}: no active revision (run `edgeplan-runtime pull` first)")
            found = rev_dir, read_manifest(rev_dir)
        self.rev_dir, self.manifest = found
        if mode not in ("emulated", "cpu", "edgetpu"):
            raise EdgeplanError(f"accelerator mode {mode!r}: emulated, cpu or edgetpu")
        self.plan = load_plan(self.rev_dir, self.manifest)
        # the suffixes the revision's Parallax plan runs branch-parallel: model -> point -> stages
        self.parallax = parallel.load_plans(self.rev_dir, self.manifest) if parallax else {}
        planned = {m.name: m for m in self.plan.models}
        preload = collections.defaultdict(set)
        for x in self.plan.preload:
            preload[x.model].add(x.point)
        self.models: dict[str, ServedModel] = {}
        for entry in self.manifest.models:
            pm = planned[entry.name]
            _publishable(entry, pm.point, "the plan's")
            rate = (rates or {}).get(entry.name, pm.rate)
            self.models[entry.name] = ServedModel.load(self.rev_dir, entry, rate, preload[entry.name] | {pm.point},
                                                       self.manifest.accelerator.startswith("edgetpu"))
        self.order = [e.name for e in self.manifest.models]
        self.points = {n: planned[n].point for n in self.order}
        self.cores = {n: planned[n].cores for n in self.order}
        self.mode, self.adapt, self.interval, self.max_inflight = mode, adapt, interval_s, max_inflight
        self.hysteresis = hysteresis
        # latency-aware admission: model -> the longest expected latency admitted for a request that would wait
        # (s), ``latency_budget`` times the plan's predicted latency (None or 0: only ``max_inflight`` limits)
        self.latency_budget = latency_budget or None
        self.budget_s = {n: latency_budget * planned[n].predicted_latency_ms / 1e3 for n in self.order
                         if latency_budget and math.isfinite(planned[n].predicted_latency_ms)
                         and planned[n].predicted_latency_ms > 0}
        self.gil_switch_s, self._left = gil_switch_s, False
        self.monitor = RateMonitor(self.order, window_s)
        self.offered = RateMonitor(self.order, OVERLOAD_WINDOW_S, ramp=False)  # every request, admitted or not
        self.computed: dict = {}
        self.inflight = 0
        self.lock = threading.Lock()
        self.hist = {n: Histogram() for n in self.order}
        self.codes = collections.Counter()
        self.switches = 0
        self.allocations = 0  # allocator runs
        self.switch_log: list[dict] = []
        self.stopping = False
        self.accelerator = Accelerator(self, mode, self.plan.capacity_bytes, seed)
        self.pools: dict[str, CpuPool] = {}
        self._adapter: threading.Thread | None = None
        self._stop = threading.Event()

    # life cycle ---------------------------------------------------------------------------------------------
    def start(self) -> Runtime:
        _process_enter(self.gil_switch_s)
        self.accelerator.start()
        self.pools = {n: CpuPool(self, self.models[n], self.cores[n]) for n in self.order}
        if self.adapt:
            self._adapter = threading.Thread(target=self._adapt_loop, name="allocator", daemon=True)
            self._adapter.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.stopping = True
        self.accelerator.q.put(None)
        if not self._left:
            self._left = True
            _process_leave()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # requests -----------------------------------------------------------------------------------------------
    def precompute(self, model: str, xs, points=None) -> int:
        """Prefix outputs of float inputs ``xs`` at ``points`` (default: every preloaded point and the current
        one; "all": every point the revision carries), and the outputs of the Edge TPU regions a Parallax plan puts
        inside those points' suffixes, so the emulated accelerator returns them without using the CPU. Returns how
        many prefix outputs were computed."""
        m = self._model(model)
        pts = (self.manifest.points_carried(m.entry) if points == "all"
               else sorted(points or (m.preload | {self.points[model]})))
        n, its, regions = 0, {}, {}
        for x in xs:
            q = quantize_input(x, m.entry.input)
            k = input_key(q)
            for p in pts:
                if 0 < p and (model, p, k) not in self.computed:
                    if (model, p) not in its:
                        its[model, p] = litert.Runner(litert.interpreter(m.segment(p, "prefix", count=False),
                                                                         deterministic=False))
                    self.computed[model, p, k] = (q, its[model, p](q))
                    n += 1
                staged = self.parallax.get(model, {}).get(p)
                if staged is not None and staged.offloads:  # its Edge TPU regions' outputs too
                    if p not in regions:
                        regions[p] = parallel.SuffixRunner(staged, parallel.interpreter_for(False),
                                                           self._recorder(model, p))
                    regions[p](q if p == 0 else self.computed[model, p, k][1])
        return n

    def _recorder(self, model: str, point: int) -> parallel.Device:
        """A device that computes Edge TPU regions on the CPU and keeps their outputs for the emulated one."""
        def begin(sub: parallel.SubModel, it, live: dict, compute) -> Callable[[], dict]:
            names, key = region_key(model, point, sub, it, live)
            out = compute()
            self.computed[key] = ([live[n] for n in names], out)
            return lambda: out
        return begin

    def _model(self, name: str) -> ServedModel:
        if name not in self.models:
            raise BadRequest(f"no model {name!r} in {self.manifest.deployment} revision {self.manifest.revision} "
                             f"(serving: {', '.join(self.order)})")
        return self.models[name]

    def submit(self, model: str, x) -> Future:
        """Queue one request; the future's result is the float output (raises BadRequest / Overloaded now)."""
        m = self._model(model)
        q = quantize_input(x, m.entry.input)
        self.offered.arrive(model, time.perf_counter())
        admit(self, model, self._refusal)
        fut: Future = Future()
        req = Request(model, self.points[model], q, fut)
        self.monitor.arrive(model, req.arrival)
        if req.point == 0:
            self.pools[model].submit(req, q)
        elif self.mode == "emulated":
            try:
                self.accelerator.emulate(req)
            except Exception as e:  # noqa: BLE001 - a prefix run on the CPU failed: this request fails
                self.fail(req, e)
        else:
            self.accelerator.q.put((req, None))
        return fut

    def expected_latency_s(self, model: str) -> tuple[float, bool]:
        """The latency one more request of ``model`` would see now, and whether it would wait: its prefix after
        what the accelerator holds (EMULATED: the device's clock; else the prefixes queued, at the profile's
        device time), then its suffix after the suffixes queued and running in the model's pool."""
        now = time.perf_counter()
        m, p = self.models[model], self.points[model]
        ready, waits = now, False
        if p > 0:
            device_s = m.spec.tpu_mean[p] + m.spec.io[p]
            if self.mode == "emulated":
                waits = self.accelerator.free_at > now
                ready = max(now, self.accelerator.free_at) + device_s
            else:
                waits = not self.accelerator.q.empty()
                ready = now + (self.accelerator.q.qsize() + 1) * device_s
        if p == m.last:
            return ready - now, waits
        done, queued = self.pools[model].completion(p, now, ready)
        return done - now, waits or queued

    def capacity_rps(self, model: str) -> float:
        """Requests a second ``model`` can be served at its current point and cores: the accelerator at the
        profile's device time, the pool's k threads at its measured suffix time (the profile's until measured)."""
        m, p = self.models[model], self.points[model]
        rates = []
        if p > 0:
            rates.append(1 / max(m.spec.tpu_mean[p] + m.spec.io[p], 1e-9))
        if p < m.last:
            pool = self.pools[model]
            rates.append(max(pool.target, 1) / max(pool.mean_s.get(p, m.spec.cpu_mean[p]), 1e-9))
        return min(rates)

    def _refusal(self, model: str) -> tuple[str, float] | None:
        """Latency-aware admission (under ``self.lock``): why a request is turned away, and when to retry — only
        while the model is offered more than its capacity, and only a request that would wait behind others with
        more than its budget expected. One that would start at once is always admitted, so a device slower than
        its profile still serves, one request at a time."""
        budget = self.budget_s.get(model)
        if budget is None:
            return None
        expected, waits = self.expected_latency_s(model)
        if not waits or expected <= budget or self.offered.rates()[model] <= self.capacity_rps(model):
            return None
        why = (f"{model}: {1e3 * expected:.1f} ms expected behind the requests queued, over its {1e3 * budget:.1f} "
               f"ms budget ({self.latency_budget:g}x the plan's predicted latency); retry later")
        return why, expected - budget

    def infer(self, model: str, x, timeout: float | None = 60.0) -> np.ndarray:
        return self.submit(model, x).result(timeout)

    def finish(self, req: Request, y: np.ndarray) -> None:
        latency = time.perf_counter() - req.arrival
        with self.lock:
            self.inflight -= 1
            self.hist[req.model].observe(latency)
            self.codes[req.model, 200] += 1
        req.future.set_result(dequantize_output(y, self.models[req.model].entry.output))

    def fail(self, req: Request, e: Exception) -> None:
        with self.lock:
            self.inflight -= 1
            self.codes[req.model, 500] += 1
        req.future.set_exception(e)

    # allocation ---------------------------------------------------------------------------------------------
    def configure(self, points: dict[str, int], cores: dict[str, int], why: str = "manual") -> None:
        """Switch partition points and core counts; requests in flight finish under their own."""
        for n in self.order:
            carried = self.manifest.points_carried(self.models[n].entry)
            if points[n] not in carried:
                raise EdgeplanError(f"{n}: point {points[n]} outside {carried.start}..{carried.stop - 1} (the points "
                                    f"the revision carries for a {self.manifest.accelerator!r} accelerator)")
            _publishable(self.models[n].entry, points[n], "asked")
        if sum(cores.values()) > self.plan.cores:
            raise EdgeplanError(f"{sum(cores.values())} cores asked, the device class has {self.plan.cores}")
        changed = points != self.points or cores != self.cores
        self.points, self.cores = dict(points), dict(cores)
        for n in self.order:
            if n in self.pools:
                self.pools[n].resize(cores[n])
        if changed:
            self.switches += 1
            self.switch_log.append({"t": time.time(), "why": why, "points": dict(points), "cores": dict(cores)})

    def instance(self, rates: dict[str, float]):
        from edgeplan.plan.swapless.instance import Instance

        return Instance(tuple(self.models[n].spec.with_rate(rates[n]) for n in self.order), self.plan.cores,
                        self.plan.capacity_bytes)

    def warm_starts(self, rates: dict[str, float]) -> list[tuple[int, ...]]:
        """Where the online search starts: the partitioning in use, and that of the plan's rate regime nearest
        ``rates`` (log distance) when the plan has one that names a point of every model (the bundle's
        regimes are read as untrusted: one that does not fit these models is passed over)."""
        starts = [tuple(self.points[n] for n in self.order)]
        names = [m.name for m in self.plan.models]
        if sorted(names) != sorted(self.order):
            return starts
        lasts = [self.models[n].spec.last for n in self.order]
        at = [names.index(n) for n in self.order]  # the plan's position of each served model
        fits = []
        for r in self.plan.regimes:
            if len(r.points) != len(names) or len(r.rates) != len(names):
                continue
            points, planned = tuple(r.points[i] for i in at), [r.rates[i] for i in at]
            if all(isinstance(p, int) and 0 <= p <= last for p, last in zip(points, lasts)) and all(
                    isinstance(x, (int, float)) and x > 0 for x in planned):
                gap = sum(abs(math.log(max(rates[n], 1e-9) / x)) for n, x in zip(self.order, planned))
                fits.append((gap, points))
        if fits:
            starts.append(min(fits)[1])
        return starts

    def reallocate(self, rates: dict[str, float]) -> bool:
        """The SwapLess allocator at ``rates``; switch when it predicts at least ``hysteresis`` less mean
        latency than the configuration in use. Returns whether it switched."""
        from edgeplan.plan.swapless.instance import Config
        from edgeplan.plan.swapless.plan import best
        from edgeplan.plan.swapless.queueing import evaluate

        if not any(rates.values()):
            return False
        self.allocations += 1
        inst = self.instance(rates)
        alloc = best(inst, self.plan.variant, self.warm_starts(rates))
        if alloc.config is None:
            return False
        now = evaluate(inst, Config(tuple(self.points[n] for n in self.order),
                                    tuple(self.cores[n] for n in self.order)), self.plan.variant).objective
        if not alloc.objective < now * (1 - self.hysteresis):
            return False
        self.configure(dict(zip(self.order, alloc.config.points)), dict(zip(self.order, alloc.config.cores)),
                       f"rates {', '.join(f'{n}={rates[n]:.2f}/s' for n in self.order)}")
        return True

    def _adapt_loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.reallocate(self.monitor.rates())
            except Exception:  # the allocator failing must not stop serving
                import logging

                logging.getLogger(__name__).exception("re-allocation failed; the configuration stays")

    # observability ------------------------------------------------------------------------------------------
    def suffix_runner(self, m: ServedModel, point: int):
        """A pool thread's runner of ``point``'s suffix: branch-parallel where the Parallax plan says (its
        sub-models' interpreters built now, helper threads shared by the process), else the suffix interpreter."""
        staged = self.parallax.get(m.name, {}).get(point)
        if staged is not None:
            device = self.accelerator.region(m, point) if self.mode == "emulated" else None
            return parallel.SuffixRunner(staged, parallel.interpreter_for(False), device)
        return litert.Runner(litert.interpreter(m.segment(point, "suffix"), deterministic=False))

    def status(self) -> dict:
        rates = self.monitor.rates()
        return {"deployment": self.manifest.deployment, "revision": self.manifest.revision, "mode": self.mode,
                "models": {n: {"point": self.points[n], "of": self.models[n].last, "cores": self.cores[n],
                               "rate_rps": round(rates[n], 3), "requests": self.hist[n].n,
                               "mean_latency_ms": round(1e3 * self.hist[n].sum / self.hist[n].n, 3)
                               if self.hist[n].n else None,
                               "suffix_service_ms": {p: round(1e3 * sum(v) / len(v), 3)
                                                     for p, v in sorted(self.service_times(n).items())},
                               "branch_parallel_points": sorted(self.parallax.get(n, {})),
                               "edgetpu_region_points": sorted(p for p, st in self.parallax.get(n, {}).items()
                                                               if st.offloads),
                               "latency_budget_ms": round(1e3 * self.budget_s[n], 3) if n in self.budget_s
                               else None}
                           for n in self.order},
                "inflight": self.inflight, "switches": self.switches,
                "edgetpu_regions": {"held": self.accelerator.region_holds,
                                    "computed_on_cpu": self.accelerator.region_fallbacks}}

    def _queues(self) -> list[tuple[str, int]]:
        now, acc, cpu = time.perf_counter(), collections.Counter(), collections.Counter()
        for req, _ in [x for x in list(self.accelerator.q.queue) if x is not None]:
            acc[req.model] += 1
        for n, pool in self.pools.items():
            for req, _ in list(pool.q.queue):
                (acc if req.ready > now else cpu)[n] += 1
        return [*((f'model="{n}",stage="accelerator"', acc[n]) for n in self.order),
                *((f'model="{n}",stage="cpu"', cpu[n]) for n in self.order)]

    def service_times(self, model: str) -> dict[int, list[float]]:
        """The suffix invoke times (s) the model's pool timed, per point (the last SERVICE_SAMPLES of each)."""
        pool = self.pools.get(model)
        return {p: list(v) for p, v in list(pool.service.items()) if v} if pool else {}

    def metrics_text(self) -> str:
        """Prometheus text format."""
        dep = self.manifest.deployment
        lines = request_metrics(self.order, self.hist, self.codes)
        gauges = {
            "edgeplan_queue_length": (("Requests waiting, by stage (EMULATED accelerator: until the device's "
                                        "clock says their prefix is done)."), self._queues()),
            "edgeplan_partition_point": ("Current partition point (0 = all CPU, P = all accelerator).",
                                         [(f'model="{n}"', self.points[n]) for n in self.order]),
            "edgeplan_suffix_service_seconds": ((f"Mean time of the suffix's invoke on its CPU pool, by point "
                                                 f"(the last {SERVICE_SAMPLES} of each)."), [
                (f'model="{n}",point="{p}"', round(sum(v) / len(v), 6))
                for n in self.order for p, v in sorted(self.service_times(n).items())]),
            "edgeplan_cpu_cores": ("CPU threads of the model's suffix pool (k_i).",
                                   [(f'model="{n}"', self.cores[n]) for n in self.order]),
            "edgeplan_request_rate": ("Arrival rate over the monitor's window (1/s).",
                                      [(f'model="{n}"', round(r, 4)) for n, r in self.monitor.rates().items()]),
            "edgeplan_partition_cache_misses_total": ("Partitions loaded at serving time (not preloaded).",
                                                      [(f'model="{n}"', self.models[n].misses) for n in self.order]),
            "edgeplan_onchip_evictions_total": ("Prefix parameters evicted from the (EMULATED) on-chip cache.",
                                                [("", self.accelerator.evictions)]),
            "edgeplan_prefix_cpu_fallbacks_total": ("Emulated accelerator: prefixes not computed ahead, run on the CPU.",
                                                    [("", self.accelerator.cpu_fallbacks)]),
            "edgeplan_reallocations_total": ("Switches of points or cores.", [("", self.switches)]),
            "edgeplan_inflight_requests": ("Requests in flight.", [("", self.inflight)]),
            "edgeplan_latency_budget_seconds": (
                ("Admission: a request that would wait is turned away (503) when more latency than this is "
                 "expected for it."),
                [(f'model="{n}"', round(self.budget_s[n], 6)) for n in self.order if n in self.budget_s]),
            "edgeplan_active_revision": ("The active revision.", [(f'deployment="{dep}",mode="{self.mode}"',
                                                                  self.manifest.revision)]),
        }
        for name, (help_, rows) in gauges.items():
            kind = "counter" if name.endswith("_total") else "gauge"
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
            lines += [f"{name}{{{labels}}} {v}" if labels else f"{name} {v}" for labels, v in rows]
        return "\n".join(lines) + "\n"
