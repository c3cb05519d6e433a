"""A discrete-event simulator of one Edge TPU device serving several models, built from mechanics (it
never evaluates a queueing formula, so it can judge the analytic model):

- Poisson arrivals per model;
- one accelerator serving prefixes first come, first served; its service is the prefix's compute (with
  per-inference streaming of parameters that do not fit, as profiled) plus the input and output transfer;
- an on-chip parameter cache of C bytes holding whole models' cached parameters with LRU eviction: a prefix
  whose parameters are not resident first loads them (T^Load), evicting the least recently used models
  until they fit, so inter-model misses follow from the order of requests;
- per-model CPU pools of k_i servers, FCFS, for the suffixes;
- service times deterministic, or drawn from the profiles' raw samples.

Reports per model: mean, p50, p99 latency with 95% confidence intervals (batch means), the miss rate.
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np

from edgeplan.plan.swapless.instance import Config, Instance
from edgeplan.plan.swapless.queueing import check_config

# two-sided 95% Student t quantiles by degrees of freedom (batch means use few batches)
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 15: 2.13,
        19: 2.09, 20: 2.09, 30: 2.04}


def _t95(df: int) -> float:
    return _T95.get(df) or _T95[max(k for k in _T95 if k <= df)] if df >= 1 else float("nan")


@dataclass(frozen=True)
class ModelStats:
    name: str
    requests: int
    mean: float
    mean_ci: float  # half-width of the 95% confidence interval of the mean (batch means)
    p50: float
    p99: float
    p99_ci: float
    miss_rate: float  # fraction of TPU services that reloaded the prefix's parameters


@dataclass(frozen=True)
class SimResult:
    models: tuple[ModelStats, ...]
    tpu_utilisation: float
    simulated_s: float

    def mean(self, i: int) -> float:
        return self.models[i].mean


@dataclass(frozen=True)
class Phase:
    """From ``start`` (s) on, these per-model rates and this configuration (``simulate_phases``)."""

    start: float
    rates: tuple[float, ...]
    config: Config


@dataclass(frozen=True)
class Timeline:
    """``simulate_phases``' answer: per time bin (by arrival), each model's mean latency and requests."""

    bin_s: float
    starts: tuple[float, ...]
    mean: tuple[tuple[float, ...], ...]  # [bin][model], s (nan: no request finished)
    requests: tuple[tuple[int, ...], ...]
    phase_mean: tuple[tuple[float, ...], ...]  # [phase][model], s
    completed: int  # requests that finished; every one that arrived does, switches or not
    arrived: int


class _Engine:
    """The mechanics, over phases: a request keeps the partition point it arrived under (the runtime switches
    partitions without touching requests in flight); a phase's core counts apply to suffixes started from
    then on (a pool given no core keeps one thread until the suffixes of its older partition are done); a
    model whose point changed has new cached parameters, so its next prefix reloads."""

    def __init__(self, inst: Instance, rng: np.random.Generator, stochastic: bool):
        self.inst, self.rng, self.stochastic = inst, rng, stochastic
        self.samplers: dict = {}
        self.lat: list[list[tuple[float, float]]] = [[] for _ in inst.models]  # (arrival, latency)
        self.misses = [0] * len(inst.models)
        self.services = [0] * len(inst.models)
        self.busy_time = 0.0
        self.arrived = 0

    def service(self, side: str, i: int, p: int) -> float:
        if (side, i, p) not in self.samplers:
            m = self.inst.models[i]
            fixed, samples = (m.s_tpu[p], m.tpu_samples) if side == "tpu" else (m.s_cpu[p], m.cpu_samples)
            samples = samples[p] if samples else ()
            if self.stochastic and samples:
                arr = np.asarray(samples, dtype=float)
                self.samplers[side, i, p] = lambda: float(arr[self.rng.integers(len(arr))])
            else:
                self.samplers[side, i, p] = lambda: fixed
        return self.samplers[side, i, p]()

    def run(self, phases: list[Phase], horizon: float, t_warm: float) -> None:
        inst, rng = self.inst, self.rng
        models = inst.models
        n = len(models)
        events: list = []  # (time, seq, kind, payload)
        seq = 0

        def push(t, kind, payload):
            nonlocal seq
            heapq.heappush(events, (t, seq, kind, payload))
            seq += 1

        for k, ph in enumerate(phases):
            push(ph.start, "phase", k)
        phase = -1
        points: tuple[int, ...] = ()
        cache: OrderedDict[int, tuple[int, int]] = OrderedDict()  # model -> (point, bytes), LRU first
        used = 0
        tpu_queue: deque = deque()  # (model, arrival, point)
        tpu_busy = False
        cpu_queues = [deque() for _ in range(n)]  # (arrival, point)
        cores = [0] * n  # the phase's pool sizes
        busy = [0] * n  # suffixes running per pool

        def start_cpu(now, i):
            # a pool the phase gave no core keeps one thread while suffixes of an older partition remain
            while cpu_queues[i] and busy[i] < max(cores[i], 1):
                busy[i] += 1
                arrival, p = cpu_queues[i].popleft()
                push(now + self.service("cpu", i, p), "cpu_done", (i, arrival))

        def start_tpu(now):
            nonlocal tpu_busy, used
            i, arrival, p = tpu_queue.popleft()
            m = models[i]
            foot = min(m.footprint[p], inst.capacity)
            duration = 0.0
            if i in cache and cache[i][0] == p:
                cache.move_to_end(i)
            else:
                if i in cache:  # another partition's parameters: replaced
                    used -= cache.pop(i)[1]
                while cache and used + foot > inst.capacity:
                    _, (_, b) = cache.popitem(last=False)
                    used -= b
                cache[i] = (p, foot)
                used += foot
                duration += m.t_load[p]
                if now >= t_warm:
                    self.misses[i] += 1
            if now >= t_warm:
                self.services[i] += 1
            duration += m.io[p] + self.service("tpu", i, p)
            tpu_busy = True
            if now >= t_warm:
                self.busy_time += duration
            push(now + duration, "tpu_done", (i, arrival, p))

        def to_cpu(now, i, arrival, p):
            cpu_queues[i].append((arrival, p))
            start_cpu(now, i)

        while events:
            now, _, kind, payload = heapq.heappop(events)
            if kind == "phase":
                phase = payload
                ph = phases[phase]
                for i in range(n):  # cores added serve the queue at once; cores removed retire when free
                    cores[i] = ph.config.cores[i]
                    start_cpu(now, i)
                points = ph.config.points
                for i, m in enumerate(models):  # Poisson: the next arrival is drawn afresh at the new rate
                    if ph.rates[i] > 0:
                        push(now + rng.exponential(1 / ph.rates[i]), "arrive", (i, phase))
            elif kind == "arrive":
                i, k = payload
                if k != phase:  # drawn under an earlier phase's rate
                    continue
                if now >= horizon:
                    continue
                push(now + rng.exponential(1 / phases[phase].rates[i]), "arrive", (i, phase))
                self.arrived += 1
                p = points[i]
                if p > 0:
                    tpu_queue.append((i, now, p))
                    if not tpu_busy:
                        start_tpu(now)
                else:
                    to_cpu(now, i, now, p)
            elif kind == "tpu_done":
                i, arrival, p = payload
                tpu_busy = False
                if p < models[i].last:
                    to_cpu(now, i, arrival, p)
                elif arrival >= t_warm:
                    self.lat[i].append((arrival, now - arrival))
                if tpu_queue:
                    start_tpu(now)
            else:  # cpu_done
                i, arrival = payload
                if arrival >= t_warm:
                    self.lat[i].append((arrival, now - arrival))
                busy[i] -= 1
                start_cpu(now, i)


def simulate(inst: Instance, config: Config, *, requests: int = 20000, warmup: float = 0.1, seed: int = 0,
             stochastic: bool = False, batches: int = 20) -> SimResult:
    """Simulate until about ``requests`` arrivals in total; the first ``warmup`` fraction is discarded."""
    models = inst.models
    total_rate = sum(m.rate for m in models)
    if total_rate <= 0:
        raise ValueError("every rate is zero: nothing to simulate")
    horizon = requests / total_rate
    t_warm = warmup * horizon
    engine = _Engine(inst, np.random.default_rng(seed), stochastic)
    engine.run([Phase(0.0, inst.rates, config)], horizon, t_warm)

    stats = []
    for i, m in enumerate(models):
        xs = np.array([x for _, x in sorted(engine.lat[i])])
        if len(xs) == 0:
            stats.append(ModelStats(m.name, 0, math.nan, math.nan, math.nan, math.nan, math.nan, 0.0))
            continue
        nb = min(batches, len(xs))
        parts = np.array_split(xs, nb)
        means = np.array([b.mean() for b in parts])
        p99s = np.array([np.percentile(b, 99) for b in parts])
        t = _t95(nb - 1)
        stats.append(ModelStats(
            m.name, len(xs), float(xs.mean()), float(t * means.std(ddof=1) / math.sqrt(nb)) if nb > 1 else math.nan,
            float(np.percentile(xs, 50)), float(np.percentile(xs, 99)),
            float(t * p99s.std(ddof=1) / math.sqrt(nb)) if nb > 1 else math.nan,
            engine.misses[i] / engine.services[i] if engine.services[i] else 0.0))
    return SimResult(tuple(stats), engine.busy_time / (horizon - t_warm), horizon)


def simulate_phases(inst: Instance, phases: list[Phase], end: float, *, bin_s: float = 1.0, seed: int = 0,
                    stochastic: bool = False) -> Timeline:
    """Rates and configurations that change over time (phases sorted by start, the first at 0), until
    ``end`` s; every request that arrives before ``end`` is followed to completion. Latency by arrival time
    in bins of ``bin_s``, and per phase."""
    if not phases or phases[0].start != 0 or any(b.start <= a.start for a, b in itertools.pairwise(phases)):
        raise ValueError("phases: the first starts at 0 and each later one after the one before")
    for ph in phases:
        check_config(inst, ph.config)
        if len(ph.rates) != len(inst.models):
            raise ValueError(f"phase at {ph.start} s: {len(ph.rates)} rates for {len(inst.models)} models")
    engine = _Engine(inst, np.random.default_rng(seed), stochastic)
    engine.run(phases, end, 0.0)
    bins = math.ceil(end / bin_s)
    sums = np.zeros((bins, len(inst.models)))
    counts = np.zeros((bins, len(inst.models)), dtype=int)
    bounds = [ph.start for ph in phases] + [end]
    psums = np.zeros((len(phases), len(inst.models)))
    pcounts = np.zeros((len(phases), len(inst.models)), dtype=int)
    for i, lat in enumerate(engine.lat):
        for arrival, x in lat:
            b = min(int(arrival / bin_s), bins - 1)
            sums[b, i] += x
            counts[b, i] += 1
            k = next(k for k in range(len(phases)) if bounds[k] <= arrival < bounds[k + 1])
            psums[k, i] += x
            pcounts[k, i] += 1
    with np.errstate(invalid="ignore"):
        mean = sums / counts
        pmean = psums / pcounts
    return Timeline(bin_s, tuple(b * bin_s for b in range(bins)), tuple(map(tuple, mean.tolist())),
                    tuple(map(tuple, counts.tolist())), tuple(map(tuple, pmean.tolist())),
                    int(counts.sum()), engine.arrived)
