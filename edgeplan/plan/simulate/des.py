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
import math
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np

from edgeplan.plan.swapless.instance import Config, Instance

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


def _sampler(rng: np.random.Generator, fixed: float, samples, stochastic: bool):
    if stochastic and samples:
        arr = np.asarray(samples, dtype=float)
        return lambda: float(arr[rng.integers(len(arr))])
    return lambda: fixed


def simulate(inst: Instance, config: Config, *, requests: int = 20000, warmup: float = 0.1, seed: int = 0,
             stochastic: bool = False, batches: int = 20) -> SimResult:
    """Simulate until about ``requests`` arrivals in total; the first ``warmup`` fraction is discarded."""
    rng = np.random.default_rng(seed)
    models = inst.models
    n = len(models)
    total_rate = sum(m.rate for m in models)
    if total_rate <= 0:
        raise ValueError("every rate is zero: nothing to simulate")
    horizon = requests / total_rate
    t_warm = warmup * horizon

    tpu_service = []
    cpu_service = []
    for m, p in zip(models, config.points):
        tpu_s = m.tpu_samples[p] if m.tpu_samples else ()
        cpu_s = m.cpu_samples[p] if m.cpu_samples else ()
        tpu_service.append(_sampler(rng, m.s_tpu[p], tpu_s, stochastic))
        cpu_service.append(_sampler(rng, m.s_cpu[p], cpu_s, stochastic))
    foot = [min(m.footprint[p], inst.capacity) for m, p in zip(models, config.points)]

    events: list = []  # (time, seq, kind, payload)
    seq = 0

    def push(t, kind, payload):
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, payload))
        seq += 1

    for i, m in enumerate(models):
        if m.rate > 0:
            push(rng.exponential(1 / m.rate), "arrive", i)

    cache: OrderedDict[int, int] = OrderedDict()  # model -> bytes, least recently used first
    used = 0
    tpu_queue: deque = deque()
    tpu_busy = False
    tpu_busy_time = 0.0
    cpu_queues = [deque() for _ in range(n)]
    cpu_free = list(config.cores)
    lat: list[list[tuple[float, float]]] = [[] for _ in range(n)]  # (arrival, latency)
    misses = [0] * n
    services = [0] * n

    def start_tpu(now):
        nonlocal tpu_busy, used, tpu_busy_time
        i, arrival = tpu_queue.popleft()
        m, p = models[i], config.points[i]
        duration = 0.0
        if i in cache:
            cache.move_to_end(i)
        else:
            while cache and used + foot[i] > inst.capacity:
                _, b = cache.popitem(last=False)
                used -= b
            cache[i] = foot[i]
            used += foot[i]
            duration += m.t_load[p]
            if now >= t_warm:
                misses[i] += 1
        if now >= t_warm:
            services[i] += 1
        duration += m.io[p] + tpu_service[i]()
        tpu_busy = True
        if now >= t_warm:
            tpu_busy_time += duration
        push(now + duration, "tpu_done", (i, arrival))

    def to_cpu(now, i, arrival):
        if cpu_free[i] > 0:
            cpu_free[i] -= 1
            push(now + cpu_service[i](), "cpu_done", (i, arrival))
        else:
            cpu_queues[i].append(arrival)

    def done(now, i, arrival):
        if arrival >= t_warm:
            lat[i].append((arrival, now - arrival))

    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "arrive":
            i = payload
            if now < horizon:
                push(now + rng.exponential(1 / models[i].rate), "arrive", i)
            else:
                continue
            if config.points[i] > 0:
                tpu_queue.append((i, now))
                if not tpu_busy:
                    start_tpu(now)
            else:
                to_cpu(now, i, now)
        elif kind == "tpu_done":
            i, arrival = payload
            tpu_busy = False
            if config.points[i] < models[i].last:
                to_cpu(now, i, arrival)
            else:
                done(now, i, arrival)
            if tpu_queue:
                start_tpu(now)
        else:  # cpu_done
            i, arrival = payload
            done(now, i, arrival)
            if cpu_queues[i]:
                push(now + cpu_service[i](), "cpu_done", (i, cpu_queues[i].popleft()))
            else:
                cpu_free[i] += 1

    stats = []
    for i, m in enumerate(models):
        xs = np.array([x for _, x in sorted(lat[i])])
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
            misses[i] / services[i] if services[i] else 0.0))
    return SimResult(tuple(stats), tpu_busy_time / (horizon - t_warm), horizon)
