"""Joint partitioning and core allocation (SwapLess §III-C).

- ``propalloc`` and ``greedy`` — PROPALLOC and Algorithm 1 exactly as the paper gives them;
- ``refined`` — Algorithm 1's speed, without its dead ends: it starts from the best of all-CPU, all-TPU
  and (with more models than cores, where constraint (8) forces some models wholly onto the TPU) the
  lightest CPU loads on the TPU, ranks unstable configurations by their worst utilisation so the climb first
  walks to a stable one, then climbs with moves in both directions (layers to the TPU and back), moves
  of one core between models, and swaps (a model takes the core of one that moves wholly to the TPU);
- ``exact`` — the optimum, as oracle: for each partitioning the objective separates into the TPU part
  (fixed by the partitioning) and per-model CPU parts, so the cores are placed by a small dynamic program.

Standard library only (the device runtime runs ``refined`` online).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from edgeplan.plan.swapless.instance import Config, Instance
from edgeplan.plan.swapless.queueing import INF, cpu_part, evaluate, tpu_state


@dataclass(frozen=True)
class Allocation:
    config: Config | None  # None: no feasible configuration found
    objective: float
    evaluations: int


def propalloc(inst: Instance, points) -> tuple[int, ...] | None:
    """PROPALLOC: the K_max cores shared in proportion to each suffix's CPU load (lambda_i s^CPU_i), at least
    one per model with a suffix (8), none for a model wholly on the TPU; largest remainders get the rest.
    None when there are more suffixes than cores."""
    need = [i for i, (m, p) in enumerate(zip(inst.models, points)) if p < m.last]
    cores = [0] * len(points)
    if not need:
        return tuple(cores)
    if len(need) > inst.cores:
        return None
    load = {i: inst.models[i].rate * inst.models[i].s_cpu[points[i]] for i in need}
    total = sum(load.values())
    shares = {i: (inst.cores * load[i] / total if total > 0 else inst.cores / len(need)) for i in need}
    for i in need:
        cores[i] = max(1, int(math.floor(shares[i])))
    while sum(cores) > inst.cores:  # the minimum of one core pushed the sum over: take from the largest
        j = max(need, key=lambda i: (cores[i], -shares[i]))
        cores[j] -= 1
    left = inst.cores - sum(cores)
    for i in sorted(need, key=lambda i: shares[i] - cores[i], reverse=True)[:left]:
        cores[i] += 1
    return tuple(cores)


def greedy(inst: Instance, variant: str = "paper", use_alpha: bool = True) -> Allocation:
    """Algorithm 1 (greedy hill-climbing), line by line."""
    n = len(inst.models)
    points = [0] * n  # line 1
    cores = propalloc(inst, points)  # line 2
    evals = 0

    def score(pts, ks):
        nonlocal evals
        if ks is None:
            return INF
        evals += 1
        return evaluate(inst, Config(tuple(pts), ks), variant, use_alpha).objective

    current = score(points, cores)  # line 3
    while True:  # line 4
        best, best_move, best_cores = INF, None, None  # line 5
        for m in range(n):  # line 6
            for h in (1, 2):  # line 7
                if points[m] + h <= inst.models[m].last:  # line 8
                    trial = points.copy()
                    trial[m] += h  # line 9
                    ks = propalloc(inst, trial)  # line 10
                    value = score(trial, ks)  # line 11
                    if value < best:  # line 12
                        best, best_move, best_cores = value, (m, h), ks
        if best < current:  # line 13
            m, h = best_move  # line 14
            points[m] += h  # line 15
            current, cores = best, best_cores
        else:
            break  # line 17
    if current == INF:
        return Allocation(None, INF, evals)
    return Allocation(Config(tuple(points), cores), current, evals)


def refined(inst: Instance, variant: str = "refined", use_alpha: bool = True) -> Allocation:
    """Feasibility first, then steepest descent over point moves (+-1, +-2) and single-core moves."""
    n = len(inst.models)
    evals = 0

    tpu_cache: dict[tuple, object] = {}
    seen: dict[tuple, tuple[float, float]] = {}

    def score(points, cores) -> tuple[float, float]:
        """(0, objective) when feasible, else (1, the worst utilisation): infeasible configurations are
        ranked by how far they are from stability, so the climb first walks towards a feasible one.
        The TPU state is computed once per partitioning, each configuration once."""
        nonlocal evals
        if cores is None:
            return (2.0, INF)
        key = (tuple(points), tuple(cores))
        if key in seen:
            return seen[key]
        evals += 1
        tpu = tpu_cache.get(key[0])
        if tpu is None:
            tpu = tpu_cache[key[0]] = tpu_state(inst, key[0], variant, use_alpha)
        if not tpu.feasible:
            value = (1.0, tpu.rho)
        else:
            total, worst = 0.0, 0.0
            for m, p, k, part in zip(inst.models, key[0], key[1], tpu.part):
                c = cpu_part(m, p, k, tpu, variant)
                if c == INF:
                    worst = max(worst, m.rate * m.s_cpu[p] / k if k else INF)
                total += m.rate * (part + c)
            value = (0.0, total) if worst == 0.0 else (1.0, worst)
        seen[key] = value
        return value

    lasts = [m.last for m in inst.models]
    starts = [[0] * n, list(lasts)]
    if n > inst.cores:  # (8) forces some models wholly onto the TPU: the lightest CPU loads go first
        order = sorted(range(n), key=lambda i: inst.models[i].rate * inst.models[i].s_cpu[0])
        mixed = [0] * n
        for i in order[: n - inst.cores]:
            mixed[i] = lasts[i]
        starts.append(mixed)
    if n > 1:  # one model on the CPU with every core, the others wholly on the TPU
        starts += [[0 if j == i else lasts[j] for j in range(n)] for i in range(n)]
    best = (None, None, (3.0, INF))
    for start in starts:
        cores = propalloc(inst, start)
        if cores is None:
            continue
        found = _climb(inst, list(start), list(cores), score(start, cores), score)
        if found[2] < best[2]:
            best = found
    points, cores, current = best
    if points is None or current[0] != 0.0:
        return Allocation(None, INF, evals)
    return Allocation(Config(tuple(points), tuple(cores)), current[1], evals)


def _climb(inst: Instance, points: list[int], cores: list[int], current, score):
    """Steepest descent from (points, cores) over the neighbourhood of ``refined``."""
    n = len(inst.models)
    while True:
        candidates = []
        for m in range(n):
            last = inst.models[m].last
            for h in (1, 2, -1, -2):
                p = points[m] + h
                if not 0 <= p <= last:
                    continue
                trial = points.copy()
                trial[m] = p
                ks = _fix_cores(inst, trial, cores)
                if ks is not None:
                    candidates.append((trial, ks))
                elif p < last:  # no core to spare: another model gives up its suffix (moves wholly to the TPU)
                    for d in range(n):
                        if d != m and trial[d] < inst.models[d].last:
                            swap = trial.copy()
                            swap[d] = inst.models[d].last
                            ks = _fix_cores(inst, swap, cores)
                            if ks is not None:
                                candidates.append((swap, ks))
        for a, b in itertools.permutations(range(n), 2):  # one core from a to b
            if cores[a] > (1 if points[a] < inst.models[a].last else 0) and points[b] < inst.models[b].last:
                ks = cores.copy()
                ks[a] -= 1
                ks[b] += 1
                candidates.append((points, ks))
        for b in range(n):
            if points[b] < inst.models[b].last:
                if sum(cores) < inst.cores:  # take a free core
                    ks = cores.copy()
                    ks[b] += 1
                    candidates.append((points, ks))
                if cores[b] > 1:  # give one back
                    ks = cores.copy()
                    ks[b] -= 1
                    candidates.append((points, ks))
        if not candidates:
            return points, cores, current
        value, p, k = min(((score(p, k), p, k) for p, k in candidates), key=lambda x: x[0])
        if value < current:
            points, cores, current = list(p), list(k), value
        else:
            return points, cores, current


def _fix_cores(inst: Instance, points, cores) -> list[int] | None:
    """Cores after a point move: a model that lost its suffix frees its cores; one that gained a suffix
    takes every free core, else one from the model with the most; None when no core can be found."""
    ks = list(cores)
    for i, (m, p) in enumerate(zip(inst.models, points)):
        if p >= m.last:
            ks[i] = 0
    for i, (m, p) in enumerate(zip(inst.models, points)):
        if p < m.last and ks[i] == 0:
            if sum(ks) < inst.cores:
                ks[i] = inst.cores - sum(ks)  # every free core (single-core moves give some back)
            else:
                donor = max(range(len(ks)), key=lambda j: ks[j])
                if ks[donor] <= 1:
                    return None
                ks[donor] -= 1
                ks[i] = 1
    return ks


def exact(inst: Instance, variant: str = "refined", use_alpha: bool = True) -> Allocation:
    """The optimum of eq. (5) under (6)-(9), by enumeration of partitionings and a DP over cores."""
    n = len(inst.models)
    best, best_config, evals = INF, None, 0
    for points in itertools.product(*(range(m.last + 1) for m in inst.models)):
        tpu = tpu_state(inst, points, variant, use_alpha)
        evals += 1
        if not tpu.feasible:
            continue
        base = sum(m.rate * t for m, t in zip(inst.models, tpu.part))
        if base >= best:
            continue
        # dp[j] = (cost, cores) using j cores over the models seen so far
        dp: dict[int, tuple[float, tuple[int, ...]]] = {0: (0.0, ())}
        for m, p in zip(inst.models, points):
            options = [(0, 0.0)] if p >= m.last else [
                (k, m.rate * cpu_part(m, p, k, tpu, variant)) for k in range(1, inst.cores + 1)]
            nxt: dict[int, tuple[float, tuple[int, ...]]] = {}
            for used, (cost, ks) in dp.items():
                for k, c in options:
                    if used + k > inst.cores or c == INF:
                        continue
                    value = cost + c
                    if value < nxt.get(used + k, (INF,))[0]:
                        nxt[used + k] = (value, ks + (k,))
            dp = nxt
        if not dp:
            continue
        cost, ks = min(dp.values(), key=lambda x: x[0])
        if base + cost < best:
            best, best_config = base + cost, Config(tuple(points), ks)
    if best_config is None:
        return Allocation(None, INF, evals)
    assert len(best_config.cores) == n
    return Allocation(best_config, best, evals)
