"""Joint partitioning and core allocation (SwapLess §III-C).

- ``propalloc`` and ``greedy`` — PROPALLOC and Algorithm 1 exactly as the paper gives them;
- ``refined`` — without Algorithm 1's dead ends: a climb over partitionings in both directions (a move puts one
  model at any of its points), each partitioning scored with its best core allocation (a DP over cores: with
  more models than cores, constraint (8) simply forces some suffixes away), unstable partitionings ranked by
  their distance to stability so the climb first reaches a stable one; started from every model at a quarter
  of its points, at its first point, and each model alone on the TPU, the climbs in lockstep (a climb that
  steps where another has been stops) and each round's neighbours scored in numpy batches
  (``batch.BatchScorer``), then trades (two models moved in opposite directions) from the best; online, from
  the configuration in use and the plan's nearest rate regime, and every model at its first point (warm);
- ``exact`` — the optimum, as oracle: for each partitioning the objective separates into the TPU part
  (fixed by the partitioning) and per-model CPU parts, so the cores are placed by a small dynamic program.

numpy and the standard library only (the device runtime runs ``refined`` online).
"""
from __future__ import annotations

import itertools
import math
import threading
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from edgeplan.plan.swapless.batch import UNSTABLE, BatchScorer
from edgeplan.plan.swapless.instance import Config, Instance
from edgeplan.plan.swapless.queueing import INF, cpu_part, evaluate, tpu_state

# A batch scores at most this many partitionings: larger ones cross glibc's mmap and trim thresholds, and every
# batch then pays fresh page faults (864 partitionings: 0.66 ms in one batch, 0.34 ms in four of 216). 320 holds
# a first round at 4 models x 12 points (seven starts' neighbourhoods, 306 partitionings): at 256 the first round
# (then six starts) took two batches, and the search 7-10% longer (interleaved, 60 instances; 10 page faults per
# search instead of 24).
CHUNK = 320


_scratch = threading.local()  # per thread, the search's tables, reused (see _tables)


def _tables(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tables of ``size`` partitionings, this thread's own, reused from search to search (fresh, 12^4
    partitionings' tables, 166 kB each, are mapped anew and page-faulted on every search): a float table of
    nan, a bool table of False and an int scratch table."""
    seen, visited, slot = getattr(_scratch, "tables", (np.empty(0), np.empty(0, bool), np.empty(0, np.int64)))
    if len(seen) < size:
        seen, visited, slot = np.empty(size), np.empty(size, dtype=bool), np.empty(size, dtype=np.int64)
        _scratch.tables = seen, visited, slot
    seen, visited = seen[:size], visited[:size]
    seen.fill(np.nan)
    visited.fill(False)
    return seen, visited, slot[:size]


@dataclass(frozen=True)
class _Layout:
    """What a search over models with these numbers of points needs beyond the instance (``_layout``)."""

    starts: np.ndarray  # (starts, n): the default starts, every model at its first point among them
    first: tuple[int, ...]  # every model at its first point
    radix: np.ndarray  # a partitioning's mixed-radix code is points @ radix
    size: int  # the number of partitionings
    model_of: np.ndarray  # column j of a neighbourhood: model model_of[j] moved to point point_of[j]
    point_of: np.ndarray
    step: np.ndarray  # what column j adds to the code of a partitioning with that model at point 0


@lru_cache(maxsize=64)
def _layout(lasts: tuple[int, ...]) -> _Layout:
    """``refined``'s starts and codes for models with points 0..lasts[i]: every model at a quarter of its
    points, each model alone on the TPU, and every model at its first point. (A start with every model at its
    middle point too: as good on 399 of 400 decisions of 4 models x 12 points, 6-8% more time.)"""
    n = len(lasts)
    top = np.array(lasts)
    starts = {tuple(top // 4)}
    if n > 1:  # one model wholly on the TPU, the others on the CPU
        starts |= {tuple(int(top[j]) if j == i else 0 for j in range(n)) for i in range(n)}
    # and every model at its first point: the optimum can lie several models at once towards the CPU from where
    # the other climbs end, which no single move or trade reaches (99 benchmark decisions within 2% of the
    # optimum, warm: 93 -> 97, for ~35% more time; cold: 95 -> 98, 98 -> 99 and 98 -> 99 on two other draws of
    # 99, for 2-3%)
    first = tuple(int(min(1, last)) for last in lasts)
    radix = np.cumprod([1, *(top[:-1] + 1)])
    model_of = np.repeat(np.arange(n), top + 1)
    point_of = np.concatenate([np.arange(last + 1) for last in lasts])
    out = _Layout(np.array(sorted(starts | {first}), dtype=np.int64), first, radix, int(np.prod(top + 1)),
                  model_of, point_of, point_of * radix[model_of])
    for array in (out.starts, out.radix, out.model_of, out.point_of, out.step):
        array.setflags(write=False)  # shared by every search over such models
    return out


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


@lru_cache(maxsize=64)
def _pairs(lasts: tuple[int, ...]) -> np.ndarray:
    """Every pair of models (a < b) at every pair of their points, as four flat arrays: a, b, a's point, b's."""
    out = []
    for a, b in zip(*np.triu_indices(len(lasts), 1)):
        pa, pb = np.meshgrid(np.arange(lasts[a] + 1), np.arange(lasts[b] + 1), indexing="ij")
        out.append(np.stack([np.full(pa.size, a), np.full(pa.size, b), pa.ravel(), pb.ravel()]))
    return np.concatenate(out, axis=1)


def refined(inst: Instance, variant: str = "refined", use_alpha: bool = True, starts=None) -> Allocation:
    """Steepest descent over partitionings, each scored with its best core allocation (a DP over cores),
    from several starts climbing in lockstep: every model at a quarter of its points, every model at its first
    point, and each model alone on the TPU (``_layout``; climbs from all-CPU and all-TPU, and from each model
    alone on the CPU, ended no better on 100 instances of 4 models x 12 points and cost time); or, warm, from
    ``starts`` (the partitioning in use and the plan's nearest rate regime, the online case, where rates drift
    and the best partitioning is rarely far) and every model at its first point. A move puts one model at any of
    its points; unstable partitionings are ranked by how far they are from stability, so a climb first walks to
    a stable one; a climb that steps where another has been stops there (from there it would follow the other:
    steepest descent is deterministic). Then trades from the best climb: two models moved at once in opposite
    directions, the climb resumed after each that improves it (single moves alone ended within 2% of the
    optimum on 86 of those 100 instances, with trades on 98; on the benchmark's 99, 95 with the quarter start,
    93 without). Each round scores the not-yet-seen neighbours of every live climb in batches (``BatchScorer``,
    at most ``CHUNK`` partitionings each); a start is its own neighbour, scored in the first round; the best
    partitioning's cores are read from the batch that scored it."""
    n = len(inst.models)
    lasts = tuple(m.last for m in inst.models)
    scorer = BatchScorer(inst, variant, use_alpha)
    layout = _layout(lasts)
    if starts is not None:
        starts = {tuple(int(p) for p in s) for s in starts}
        for s in starts:
            if len(s) != n or any(not 0 <= p <= last for p, last in zip(s, lasts)):
                raise ValueError(f"start {s} is not a partitioning of these {n} models")
        if not starts:
            raise ValueError("no start given")
        # and every model at its first point (``_layout``)
        current = np.array(sorted(starts | {layout.first}), dtype=np.int64)
    else:
        current = layout.starts.copy()
    radix, model_of, point_of, step = layout.radix, layout.model_of, layout.point_of, layout.step
    # every partitioning by its mixed-radix code: its key once scored (nan: not yet), whether a climb has been
    # there; slot: scratch
    seen, visited, slot = _tables(layout.size)
    code = current @ radix
    visited[code] = True
    key = np.full(len(current), np.inf)  # a start is its own neighbour, scored with the first round's
    batches = []  # (codes scored, BatchScorer.Scored)

    def score(cand: np.ndarray, codes: np.ndarray) -> None:
        """Score the candidates (rows of ``cand``, their ``codes``), none seen before, each code once (two climbs
        can share a neighbour; a start is its own neighbour once per model)."""
        order = np.arange(len(codes))
        slot[codes] = order  # one of equal codes takes the slot
        first = (slot[codes] == order).nonzero()[0]
        if len(first) < len(codes):
            cand, codes = cand[first], codes[first]
        size = -(-len(codes) // -(-len(codes) // CHUNK))  # equal parts of at most CHUNK
        for at in range(0, len(codes), size):
            part = slice(at, at + size)
            scored = scorer.evaluate(cand[part])
            seen[codes[part]] = scored.key
            batches.append((codes[part], scored))

    def climb(live: np.ndarray) -> None:
        while len(live):
            base = current[live]
            codes = (code[live, None] + step) - (base * radix)[:, model_of]  # (live, columns)
            values = seen[codes]
            todo = np.isnan(values)
            if np.logical_or.reduce(todo, axis=None):
                rows, cols = todo.nonzero()
                cand = base[rows]
                cand[np.arange(len(rows)), model_of[cols]] = point_of[cols]
                score(cand, codes[rows, cols])
                values = seen[codes]
            pick = values.argmin(axis=1)
            best = np.minimum.reduce(values, axis=1)
            better = best < key[live]
            live, pick, moved = live[better], pick[better], codes[better, pick[better]]
            current[live, model_of[pick]] = point_of[pick]
            code[live] = moved
            key[live] = best[better]
            # a climb that steps where another has been follows it from there (steepest descent is deterministic):
            # it stops, the other's end is at least as good
            merged = visited[moved]
            visited[moved] = True
            if np.logical_or.reduce(merged):
                live = live[~merged]

    def trades() -> None:
        """Two models moved at once in opposite directions (one takes more of the TPU as the other gives some up,
        or a core changes hands), from the best climb, until no trade improves it; after each, the climb goes on
        with single moves. A single move cannot make a trade whose halves are each worse."""
        pa_model, pb_model, pa, pb = _pairs(lasts)
        rows = np.arange(len(pa))
        while True:
            top = int(np.argmin(key))
            here = current[top]
            trade = (pa - here[pa_model]) * (pb - here[pb_model]) < 0
            if not np.logical_or.reduce(trade):  # no two models can move in opposite directions (all at 0, or all at P)
                return
            cand = np.repeat(here[None, :], np.count_nonzero(trade), axis=0)
            picked = rows[: len(cand)]
            cand[picked, pa_model[trade]] = pa[trade]
            cand[picked, pb_model[trade]] = pb[trade]
            codes = cand @ radix
            values = seen[codes]
            todo = np.isnan(values)
            if np.logical_or.reduce(todo):
                score(cand[todo], codes[todo])
                values = seen[codes]
            pick = int(values.argmin())
            if not values[pick] < key[top]:
                return
            current[top], code[top], key[top] = cand[pick], codes[pick], values[pick]
            climb(np.array([top]))

    with np.errstate(invalid="ignore"):  # for every batch (``BatchScorer.evaluate``)
        climb(np.arange(len(current)))
        if n > 1:
            trades()
    top = int(np.argmin(key))
    evaluations = sum(len(codes) for codes, _ in batches)
    if key[top] >= UNSTABLE:
        return Allocation(None, INF, evaluations)
    fresh, scored = next((f, s) for f, s in batches if code[top] in f)
    cores = scored.cores(np.flatnonzero(fresh == code[top])[:1])[:, 0]
    config = Config(tuple(int(p) for p in current[top]), tuple(int(k) for k in cores))
    return Allocation(config, float(key[top]), evaluations)


def best_cores(inst: Instance, points, tpu, variant: str = "refined") -> tuple[float, tuple[int, ...] | None]:
    """The core allocation minimising sum lambda_i (E[W^CPU] + s^CPU) for a partitioning whose TPU state is
    ``tpu``, under (8) and (9): a dynamic program over models and cores used. (cost, cores) or (inf, None)."""
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
            return INF, None
    cost, ks = min(dp.values(), key=lambda x: x[0])
    return cost, ks


def exact(inst: Instance, variant: str = "refined", use_alpha: bool = True) -> Allocation:
    """The optimum of eq. (5) under (6)-(9), by enumeration of partitionings and a DP over cores."""
    best, best_config, evals = INF, None, 0
    for points in itertools.product(*(range(m.last + 1) for m in inst.models)):
        tpu = tpu_state(inst, points, variant, use_alpha)
        evals += 1
        if not tpu.feasible:
            continue
        base = sum(m.rate * t for m, t in zip(inst.models, tpu.part))
        if base >= best:
            continue
        cost, ks = best_cores(inst, points, tpu, variant)
        if ks is not None and base + cost < best:
            best, best_config = base + cost, Config(tuple(points), ks)
    if best_config is None:
        return Allocation(None, INF, evals)
    return Allocation(best_config, best, evals)
