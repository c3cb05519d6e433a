"""AutoDiCE's design-space exploration (§IV): NSGA-II (pymoo) over vertical mappings of a model onto a platform.

Genome: D − 1 cuts over the units in dependency order (sorted; equal cuts leave a device out) and, per device's
segment, one resource: 1 core or all its cores. Objectives, all minimised:

- **period**: the pipelined frame period, the slowest device's max(compute, bytes out / its link, bytes in /
  its link) — compute from the measured unit times (× how much slower a rank's invokes ran) plus what its rank costs beyond
  them (``costs.rank_overhead``, measured over MPI by ``overhead.measure``: per frame, per byte moved, and a
  polling share of the quota), ÷ its
  cpu_quota; bytes from the int8 tensors crossing segments (each sent once per reading segment; frames enter and
  leave at the first segment's device); throughput is its inverse;
- **memory**: the largest device's int8 weights + the activations its units touch (predicted; runs measure RSS);
- **energy** per frame, the largest device's: busy × P_active + (period − busy) × P_idle — *modelled*, from the
  platform's ``power_w``, never measured.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from edgeplan.plan.multidevice.costs import Costs
from edgeplan.plan.multidevice.spec import Platform

DEFAULT_POWER = {"idle": 2.0, "active": 6.0}  # W, a Raspberry-Pi-class board, when the platform names none


@dataclass(frozen=True)
class Point:
    cuts: tuple[int, ...]  # D - 1 positions, sorted
    resources: tuple[int, ...]  # per device: 0 one core, 1 all cores
    period_s: float
    memory_bytes: int
    energy_j: float  # modelled
    mapping: dict  # the mapping spec: {key: [layer, ...]} over the non-empty segments

    @property
    def throughput(self) -> float:
        return 1.0 / self.period_s


def resources_of(platform: Platform, genes) -> tuple[int, ...]:
    """Per device, 1 if its segment takes all of several cores, else 0 (one core; a one-core device has no choice)."""
    return tuple(int(r) if len(dev.slots) > 1 else 0 for dev, r in zip(platform.devices, genes))


def evaluate(costs: Costs, platform: Platform, cuts, resources) -> tuple[float, int, float, list[int]]:
    """(period s, memory bytes, energy J, segment of each position)."""
    devs = platform.devices
    d = len(devs)
    cuts = np.sort(np.asarray(cuts, int))
    u = len(costs.order)
    seg = np.searchsorted(cuts, np.arange(u), side="right")  # position -> device index
    cpu = np.zeros(d)
    mem = np.zeros(d)
    quota = np.array([x.cpu_quota or 1.0 for x in devs])  # the cgroup gives quota x the cores it uses
    resources = resources_of(platform, resources)
    for k in range(d):
        mask = seg == k
        if not mask.any():
            continue
        cpu[k] = costs.ms[mask, resources[k]].sum() / 1e3
        mem[k] = costs.param_bytes[mask].sum() + costs.act_bytes[mask].max()
    prod, tid, reader, nbytes = costs.edges
    src = seg[prod]  # per tensor, the device making it
    dst = seg[reader]  # per (tensor, reader), the device reading it
    cross = dst != src[tid]
    pairs = np.unique(tid[cross] * d + dst[cross])  # each tensor sent once to each device reading it
    t, r = pairs // d, pairs % d
    tx = np.bincount(src[t], weights=nbytes[t], minlength=d).astype(float)
    rx = np.bincount(r, weights=nbytes[t], minlength=d).astype(float)
    head, last = int(seg[0]), int(seg[-1])
    if head != last:
        tx[last] += costs.output_bytes
        rx[head] += costs.output_bytes
    used = np.bincount(seg, minlength=d) > 0
    ov = costs.rank_overhead  # a rank's CPU beyond its invokes; its polling takes a share of the quota
    cpu = np.where(used, cpu * ov.invoke_scale + ov.frame_s + ov.byte_s * (tx + rx), 0.0)
    busy = cpu / np.maximum(quota - ov.poll, 1e-3 * quota)
    net = np.array([x.net_bytes_per_s or np.inf for x in devs])
    period = float(np.max(np.maximum(busy, np.maximum(tx / net, rx / net))))
    power = [x.power_w or DEFAULT_POWER for x in devs]
    energy = max(busy[k] * power[k]["active"] + (period - busy[k]) * power[k]["idle"] for k in range(d) if used[k])
    return period, int(mem.max()), float(energy), seg.tolist()


def mapping_of(costs: Costs, units, platform: Platform, seg: list[int], resources) -> dict:
    doc: dict[str, list[str]] = {}
    for k, dev in enumerate(platform.devices):
        names = [n for pos, s in enumerate(seg) if s == k for n in units.units[costs.order[pos]].names]
        if not names:
            continue
        allc = int(resources[k]) == 1 or len(dev.slots) == 1
        doc[f"{dev.name}_{dev.arch}" if allc else f"{dev.name}_{dev.arch}{dev.slots[0]}"] = names
    return doc


def explore(costs: Costs, units, platform: Platform, *, population: int = 100, generations: int = 400,
            mutation: float = 0.1, crossover: float = 0.5, seed: int = 0) -> tuple[list[Point], dict]:
    """The Pareto front (distinct mappings, fastest first) and the run's statistics."""
    from pymoo.algorithms.moo.nsga2 import NSGA2
    from pymoo.core.problem import ElementwiseProblem
    from pymoo.operators.crossover.sbx import SBX
    from pymoo.operators.mutation.pm import PM
    from pymoo.operators.repair.rounding import RoundingRepair
    from pymoo.operators.sampling.rnd import IntegerRandomSampling
    from pymoo.optimize import minimize

    d, u = len(platform.devices), len(costs.order)

    class Mapping(ElementwiseProblem):
        def __init__(self):
            super().__init__(n_var=d - 1 + d, n_obj=3, xl=np.zeros(2 * d - 1), xu=np.array([u] * (d - 1) + [1] * d),
                             vtype=int)

        def _evaluate(self, x, out, *args, **kwargs):
            period, mem, energy, _ = evaluate(costs, platform, x[: d - 1], x[d - 1:])
            out["F"] = [period, mem, energy]

    algo = NSGA2(pop_size=population, sampling=IntegerRandomSampling(),
                 crossover=SBX(prob=crossover, eta=15, vtype=float, repair=RoundingRepair()),
                 mutation=PM(prob=mutation, eta=20, vtype=float, repair=RoundingRepair()),
                 eliminate_duplicates=True)
    t0 = time.perf_counter()
    res = minimize(Mapping(), algo, ("n_gen", generations), seed=seed, verbose=False)
    seconds = time.perf_counter() - t0
    points: dict[tuple, Point] = {}
    for x in np.atleast_2d(res.X):
        cuts = tuple(int(c) for c in np.sort(x[: d - 1]))
        period, mem, energy, seg = evaluate(costs, platform, cuts, x[d - 1:])
        res_k = resources_of(platform, x[d - 1:])
        doc = mapping_of(costs, units, platform, seg, res_k)
        key = (round(period, 9), mem, round(energy, 9))  # devices alike: one mapping per objective vector
        if key not in points:
            points[key] = Point(cuts, res_k, period, mem, energy, doc)
    front = sorted(points.values(), key=lambda p: p.period_s)
    return front, {"seconds": seconds, "evaluations": int(res.algorithm.evaluator.n_eval), "population": population,
                   "generations": generations, "mutation": mutation, "crossover": crossover}


def single_device(costs: Costs, units, platform: Platform, device: int = 0, all_cores: bool = False) -> Point:
    """Every unit on one device (the baseline a split is compared with)."""
    d = len(platform.devices)
    cuts = [len(costs.order) if k >= device else 0 for k in range(d - 1)]
    res = [1 if all_cores else 0] * d
    period, mem, energy, seg = evaluate(costs, platform, cuts, res)
    return Point(tuple(cuts), tuple(res), period, mem, energy, mapping_of(costs, units, platform, seg, res))
