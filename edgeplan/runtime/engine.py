"""The serving engine (SwapLess §IV, online phase): one global accelerator worker runs prefixes FCFS; each
model has its own CPU pool of k_i threads for suffixes; a sliding-window rate monitor re-runs the SwapLess
allocator (the offline planner's numpy code) and switches partitions and cores without failing a request in
flight (a request keeps the point it arrived under; added threads serve at once, removed ones retire when
free; a pool given 0 cores keeps a thread while suffixes of an older partition remain).

Accelerator modes:
- ``emulated`` (no Edge TPU): the worker returns the prefix output computed ahead (``precompute``: at start-up,
  for the finite set of inputs a load test uses; an input not computed ahead is run on the CPU and counted)
  and holds the modelled service time — the profile's EMULATED Edge TPU time (s^TPU + d/B, plus T^Load when
  another model evicted the prefix's parameters from the on-chip cache) — so the CPU stays with the suffixes;
- ``cpu``: correctness mode, the prefix runs on the CPU (int8, LiteRT) and takes what it takes;
- ``edgetpu``: a real Edge TPU through the libedgetpu delegate (prefix_edgetpu.tflite).
numpy, ai-edge-litert and the standard library only.
"""
from __future__ import annotations

import bisect
import collections
import queue
import random
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgeplan.errors import EdgeplanError
from edgeplan.quantize import litert
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

BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


class Overloaded(EdgeplanError):
    """Too many requests in flight: the caller should retry later (HTTP 503)."""


@dataclass
class Request:
    model: str
    point: int
    x: np.ndarray  # the int8 model input
    key: int
    future: Future
    arrival: float = field(default_factory=time.perf_counter)


class RateMonitor:
    """Arrivals per model over a sliding window (s); the rate is count / window (or / the time since the
    monitor started, while that is shorter)."""

    def __init__(self, names, window_s: float):
        self.window = window_s
        self.started = time.perf_counter()
        self.arrivals = {n: collections.deque() for n in names}
        self.lock = threading.Lock()

    def arrive(self, name: str, now: float) -> None:
        with self.lock:
            self.arrivals[name].append(now)

    def rates(self, now: float | None = None) -> dict[str, float]:
        now = time.perf_counter() if now is None else now
        span = max(min(self.window, now - self.started), 1e-3)
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
                it = interps.get(req.point)
                if it is None:
                    it = interps[req.point] = litert.interpreter(self.model.segment(req.point, "suffix"),
                                                                 deterministic=False)
                self.engine.finish(req, litert.run(it, tensor))
            except Exception as e:  # noqa: BLE001 - the request fails, the pool goes on
                self.engine.fail(req, e)


class Accelerator(threading.Thread):
    """The global accelerator worker: prefixes FCFS, one at a time."""

    def __init__(self, engine: Runtime, mode: str, capacity: int, seed: int = 0):
        super().__init__(name="accelerator", daemon=True)
        self.engine, self.mode, self.capacity = engine, mode, capacity
        self.q: queue.Queue = queue.Queue()
        self.rng = random.Random(seed)
        self.cache: collections.OrderedDict = collections.OrderedDict()  # model -> (point, bytes), LRU first
        self.used = 0
        self.interps: dict = {}
        self.late_s = 0.0  # how late time.sleep wakes, estimated
        self.evictions = 0
        self.cpu_fallbacks = 0

    def _hold_until(self, deadline: float) -> None:
        """Sleep until ``deadline`` (perf_counter): the OS wakes a sleeper late (~85 us on the build VMs), so
        the sleep is cut short by a running estimate of that lateness (busy-waiting would hold the GIL)."""
        left = deadline - time.perf_counter() - self.late_s
        if left > 0:
            time.sleep(left)
            late = time.perf_counter() - (deadline - self.late_s)
            self.late_s = min(0.002, max(0.0, 0.9 * self.late_s + 0.1 * late))

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
            self.interps[key] = litert.interpreter(m.segment(p, "prefix"), deterministic=False)
        return litert.run(self.interps[key], x)

    def _prefix_on_edgetpu(self, m: ServedModel, p: int, x: np.ndarray) -> np.ndarray:
        key = (m.name, p, "edgetpu")
        if key not in self.interps:
            from ai_edge_litert.interpreter import Interpreter, load_delegate

            path = segment_dir(m.rev_dir, m.entry, p) / "prefix_edgetpu.tflite"
            it = Interpreter(model_path=str(path), experimental_delegates=[load_delegate("libedgetpu.so.1")])
            it.allocate_tensors()
            self.interps[key] = it
        return litert.run(self.interps[key], x)

    def run(self) -> None:
        while True:
            req = self.q.get()
            if req is None:
                return
            m = self.engine.models[req.model]
            t0 = time.perf_counter()
            try:
                if self.mode == "edgetpu":
                    out = self._prefix_on_edgetpu(m, req.point, req.x)
                elif self.mode == "cpu":
                    out = self._prefix_on_cpu(m, req.point, req.x)
                else:
                    hold = self._resident(m, req.point) + m.tpu_service_s(req.point, self.rng)
                    hit = self.engine.computed.get((m.name, req.point, req.key))
                    out = hit[1] if hit is not None and np.array_equal(hit[0], req.x) else None
                    if out is None:
                        self.cpu_fallbacks += 1
                        out = self._prefix_on_cpu(m, req.point, req.x)
                    self._hold_until(t0 + hold)
            except Exception as e:  # noqa: BLE001
                self.engine.fail(req, e)
                continue
            if req.point < m.last:
                self.engine.pools[req.model].submit(req, out)
            else:
                self.engine.finish(req, out)


class Runtime:
    """Serve the active revision under ``dest`` (or a revision directory). Python API: ``start()``,
    ``infer(model, x)``/``submit(model, x)`` (float input in the model's layout -> float output),
    ``precompute(model, xs)``, ``configure(points, cores)``, ``metrics_text()``, ``status()``, ``stop()``."""

    def __init__(self, dest: Path, *, mode: str = "emulated", adapt: bool = True, window_s: float = 10.0,
                 interval_s: float = 2.0, max_inflight: int = 256, hysteresis: float = 0.02, seed: int = 0,
                 rates: dict[str, float] | None = None):
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
        planned = {m.name: m for m in self.plan.models}
        preload = collections.defaultdict(set)
        for x in self.plan.preload:
            preload[x.model].add(x.point)
        self.models: dict[str, ServedModel] = {}
        for entry in self.manifest.models:
            pm = planned[entry.name]
            rate = (rates or {}).get(entry.name, pm.rate)
            self.models[entry.name] = ServedModel.load(self.rev_dir, entry, rate, preload[entry.name] | {pm.point})
        self.order = [e.name for e in self.manifest.models]
        self.points = {n: planned[n].point for n in self.order}
        self.cores = {n: planned[n].cores for n in self.order}
        self.mode, self.adapt, self.interval, self.max_inflight = mode, adapt, interval_s, max_inflight
        self.hysteresis = hysteresis
        self.monitor = RateMonitor(self.order, window_s)
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

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # requests -----------------------------------------------------------------------------------------------
    def precompute(self, model: str, xs, points=None) -> int:
        """Prefix outputs of float inputs ``xs`` at ``points`` (default: every preloaded point and the current
        one; "all": every point), so the emulated accelerator returns them without using the CPU. Returns how
        many were computed."""
        m = self._model(model)
        pts = range(1, m.last + 1) if points == "all" else sorted(points or (m.preload | {self.points[model]}))
        n, its = 0, {}
        for x in xs:
            q = quantize_input(x, m.entry.input)
            k = input_key(q)
            for p in pts:
                if 0 < p and (model, p, k) not in self.computed:
                    if (model, p) not in its:
                        its[model, p] = litert.interpreter(m.segment(p, "prefix", count=False), deterministic=False)
                    self.computed[model, p, k] = (q, litert.run(its[model, p], q))
                    n += 1
        return n

    def _model(self, name: str) -> ServedModel:
        if name not in self.models:
            raise BadRequest(f"no model {name!r} in {self.manifest.deployment} revision {self.manifest.revision} "
                             f"(serving: {', '.join(self.order)})")
        return self.models[name]

    def submit(self, model: str, x) -> Future:
        """Queue one request; the future's result is the float output (raises BadRequest / Overloaded now)."""
        m = self._model(model)
        q = quantize_input(x, m.entry.input)
        with self.lock:
            if self.inflight >= self.max_inflight:
                self.codes[model, 503] += 1
                raise Overloaded(f"{self.inflight} requests in flight (limit {self.max_inflight}); retry later")
            self.inflight += 1
        fut: Future = Future()
        req = Request(model, self.points[model], q, input_key(q), fut)
        self.monitor.arrive(model, req.arrival)
        if req.point > 0:
            self.accelerator.q.put(req)
        else:
            self.pools[model].submit(req, q)
        return fut

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
            if not 0 <= points[n] <= self.models[n].last:
                raise EdgeplanError(f"{n}: point {points[n]} outside 0..{self.models[n].last}")
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
        alloc = best(inst, self.plan.variant)
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
            except Exception:  # noqa: BLE001 - the allocator failing must not stop serving
                import logging

                logging.getLogger(__name__).exception("re-allocation failed; the configuration stays")

    # observability ------------------------------------------------------------------------------------------
    def status(self) -> dict:
        rates = self.monitor.rates()
        return {"deployment": self.manifest.deployment, "revision": self.manifest.revision, "mode": self.mode,
                "models": {n: {"point": self.points[n], "of": self.models[n].last, "cores": self.cores[n],
                               "rate_rps": round(rates[n], 3), "requests": self.hist[n].n,
                               "mean_latency_ms": round(1e3 * self.hist[n].sum / self.hist[n].n, 3)
                               if self.hist[n].n else None} for n in self.order},
                "inflight": self.inflight, "switches": self.switches}

    def metrics_text(self) -> str:
        """Prometheus text format."""
        dep = self.manifest.deployment
        lines = ["# HELP edgeplan_request_latency_seconds End-to-end latency of served requests.",
                 "# TYPE edgeplan_request_latency_seconds histogram"]
        for n in self.order:
            h, acc = self.hist[n], 0
            for b, c in zip((*BUCKETS_S, float("inf")), h.counts):
                acc += c
                le = "+Inf" if b == float("inf") else repr(b)
                lines.append(f'edgeplan_request_latency_seconds_bucket{{model="{n}",le="{le}"}} {acc}')
            lines.append(f'edgeplan_request_latency_seconds_sum{{model="{n}"}} {h.sum:.6f}')
            lines.append(f'edgeplan_request_latency_seconds_count{{model="{n}"}} {h.n}')
        lines += ["# HELP edgeplan_requests_total Requests by model and HTTP-like status.",
                  "# TYPE edgeplan_requests_total counter"]
        lines += [f'edgeplan_requests_total{{model="{n}",code="{c}"}} {v}' for (n, c), v in sorted(self.codes.items())]
        gauges = {
            "edgeplan_queue_length": ("Requests waiting, by stage.", [
                *((f'model="{n}",stage="accelerator"', sum(1 for r in list(self.accelerator.q.queue)
                                                            if r is not None and r.model == n)) for n in self.order),
                *((f'model="{n}",stage="cpu"', self.pools[n].q.qsize() if n in self.pools else 0) for n in self.order)]),
            "edgeplan_partition_point": ("Current partition point (0 = all CPU, P = all accelerator).",
                                         [(f'model="{n}"', self.points[n]) for n in self.order]),
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
            "edgeplan_active_revision": ("The active revision.", [(f'deployment="{dep}",mode="{self.mode}"',
                                                                  self.manifest.revision)]),
        }
        for name, (help_, rows) in gauges.items():
            kind = "counter" if name.endswith("_total") else "gauge"
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
            lines += [f"{name}{{{labels}}} {v}" if labels else f"{name} {v}" for labels, v in rows]
        return "\n".join(lines) + "\n"
