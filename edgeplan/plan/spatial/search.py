"""ADaPS search (§4.5): one layer's ordered tree with alpha-beta pruning and memoised sub-trees, and the layer
recursion of eq. (12) over a chain of layers.

The tree (§4.5.1, Fig. 4) has one level per device; a node picks that device's interval. Children are ordered so
that scores grow from left to right: starts from "no row shared with the previous device" towards more shared rows,
and for each start growing sizes. The search is depth first (§4.5.2). A node's bound is what its partial partition
already costs — the slowest device so far (or the least the remaining devices must take, at their minimum sizes),
plus the data and overlap terms so far, plus the least data the remaining devices need between them from where they
must start (``_data_table``, an exact dynamic programme over the data term alone; at 10 Mbit/s one halo row costs more
than a device's compute; a node's larger siblings are cut with its position-free floor, which keeps the
bound growing with the size) — and a node whose bound is no better than the best leaf found is cut with all its
larger siblings (Fig. 6): for a fixed start, the time, the input rows needed and so the bound only grow with the
size. A start from which no end of the device leads to a partition of the space is not a node. Sub-trees are
memoised (§4.5.3): what follows a device ending at row ``e`` depends only on ``e`` and the slowest time so far, so a
sub-tree met again with those values is not searched again (an exact value, or a bound no better than the one that
cut it); once the slowest so far is below what the remaining devices must take anyway, it is dropped from the key.

The counters are counted, never estimated: ``scored`` nodes (the "visited" of Table 6), memo hits, and pruned
sub-trees.

Over layers (§4.5.2, eq. (12)) each layer's tree reads the previous layer's partition (the data its input
needs). A forward beam keeps the best partial plans, each extended by the best partitions of the next layer
given its last one (``best_k``); then sweeps revisit each layer given
both neighbours — the rows it needs from the previous one, and the rows the next one would then need from it
— and keep a revision when the total score drops, until a sweep changes nothing. This is how a later layer
makes an earlier one widen its rows (overlap) to fuse with it. Like the paper's, the result is not guaranteed
optimal: ``oracle`` holds exact searches to measure the gap.
"""
from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from edgeplan.plan.spatial.cost import (
    Device,
    Layer,
    LayerCost,
    Partition,
    Space,
    holder_of,
    network_score,
    next_data,
    source,
)


@dataclass
class Counters:
    scored: int = 0
    memo_hits: int = 0
    pruned: int = 0
    bound_terms: int = 0  # intervals whose data term the bounds' dynamic programme evaluated (not tree nodes)


def _rest_floor(cost: LayerCost, space: Space) -> list[list[float]]:
    """``floor[d][r]``: the least time in which devices ``d..`` can compute ``r`` more rows — each at least its
    minimum size, at most its maximum — a bound on the slowest of them that no completion beats."""
    n, m = space.devices, space.size
    floor = [[0.0] * (m + 1) for _ in range(n + 1)]
    for d in range(n):
        devs = range(d, n)
        least = max(cost.comp(k, 0, space.lo[k]) for k in devs)
        limits = sorted({cost.comp(k, 0, rows) for k in devs for rows in range(space.lo[k], space.hi[k] + 1)})
        limits = [x for x in limits if x >= least]
        row = floor[d]
        r = 0
        for limit in limits:
            cap = sum(min(space.hi[k], int((limit - cost.fixed_s[k]) / cost.row_s[k] + 1e-9)) for k in devs)
            while r <= min(cap, m):
                row[r] = limit
                r += 1
        for rest in range(r, m + 1):
            row[rest] = math.inf  # more rows than the devices can take
    return floor


@dataclass
class _DataTable:
    """Eq. (8)'s data term of every interval of one layer's space, and two bounds made from it (``_data_table``)."""

    terms: list[list[list[float]]]  # [d][s][e - first end]: device d's data term for [s, e)
    startable: list[list[bool]]  # [d][s]: some end of device d from s leads to a partition of the space
    after: list[list[float]]  # [d][e_prev]: the least data devices d.. need after a device ending at e_prev
    floor: list[float]  # [d]: the least data devices d.. need, wherever they start (grows with nothing)
    count: int  # intervals evaluated


def _data_table(cost: LayerCost, space: Space, holder: Partition | None) -> _DataTable:
    """Every interval's data term at once (``LayerCost.data_grid``), and from them the least data devices ``d..``
    can need between them: after a device ending at ``e_prev`` — the data term alone minimised exactly over the
    space's completions by dynamic programming over (device, end), a bound no completion beats that knows where the
    remaining devices must start — and, position-free, the sum of each device's cheapest interval."""
    n, m = space.devices, space.size
    g = np.full((n + 1, m + 1), math.inf)
    g[n, m] = 0.0
    starts = np.arange(m)[:, None]
    terms: list[list[list[float]]] = [[] for _ in range(n)]
    startable: list[list[bool]] = [[] for _ in range(n)]
    least, count = [0.0] * n, 0
    for d in range(n - 1, -1, -1):
        if d == n - 1:
            ends = np.full((m, 1), m)
            valid = (space.lo[d] <= m - starts) & (m - starts <= space.hi[d])
        else:
            ends = starts + space.lo[d] + np.arange(space.hi[d] - space.lo[d] + 1)[None, :]
            valid = ends <= m - (n - 1 - d)
        ends = np.minimum(ends, m)
        after = np.where(valid, g[d + 1, ends], math.inf)
        rows = np.isfinite(after).any(axis=1)
        if d == 0:
            rows[1:] = False  # the first device starts at row 0
        data = np.full(ends.shape, math.inf)
        best = np.full(m, math.inf)  # per start, its cheapest end
        if rows.any():
            s, e = np.broadcast_arrays(starts[rows], ends[rows])
            data[rows] = cost.data_grid(d, s, e, holder)
            best[rows] = (data[rows] + after[rows]).min(axis=1)
            least[d] = float(np.where(valid[rows], data[rows], math.inf).min())
            count += s.size
        terms[d], startable[d] = data.tolist(), rows.tolist()
        if d == 0:
            g[0, 0] = best[0]
            continue
        for k in range(space.shared_max(d) + 1):  # starts(d, e_prev): e_prev - k, k shared rows
            top = min(m + k, m + 1)
            g[d, k:top] = np.minimum(g[d, k:top], best[:top - k])
    floor = [0.0] * (n + 1)
    for d in range(n - 1, -1, -1):
        floor[d] = floor[d + 1] + least[d]
    return _DataTable(terms, startable, g.tolist(), floor, count)


class LayerTree:
    """The best partition of one layer given who holds its input (``holder``) and, optionally, the next
    layer's partition (``following``, with that layer's cost ``nxt``), whose input rows this layer provides."""

    def __init__(self, cost: LayerCost, space: Space, holder: Partition | None, *,
                 nxt: LayerCost | None = None, following: Partition | None = None,
                 counters: Counters | None = None):
        self.cost, self.space, self.holder = cost, space, holder
        self.nxt, self.following = nxt, following
        self.counters = counters if counters is not None else Counters()
        self.rest_floor = _rest_floor(cost, space)
        self.data = _data_table(cost, space, holder)
        self.counters.bound_terms += self.data.count
        self.memo: dict[tuple[int, int, float], tuple[float, Partition | None]] = {}

    def search(self, beta: float = math.inf) -> tuple[float, Partition] | None:
        """The best score and partition, or None when nothing scores below ``beta``."""
        value, tail = self._best(0, 0, 0.0, beta)
        return (value, tail) if tail is not None else None

    def _best(self, d: int, e_prev: int, slowest: float, beta: float) -> tuple[float, Partition | None]:
        """Least ``max(slowest, rest) + additive rest`` over completions from device ``d``: exact with its tail when
        below ``beta``, else ``(beta, None)`` — a bound."""
        if slowest <= self.rest_floor[d][self.space.size - e_prev]:
            slowest = 0.0  # the rest is slower whatever it picks: the slowest so far no longer matters
        key = (d, e_prev, slowest)
        hit = self.memo.get(key)
        if hit is not None and (hit[1] is not None or hit[0] >= beta):
            self.counters.memo_hits += 1
            return hit
        last = d == self.space.devices - 1
        best, best_tail = math.inf, None

        def limit() -> float:  # lowers as better leaves are found
            return min(beta, best)

        for s, e, t, add in self._children(d, e_prev, slowest, 0.0, limit):
            if last:
                value, tail = add + t, ((s, e),)
            else:
                rest, rest_tail = self._best(d + 1, e, t, limit() - add)
                if rest_tail is None:
                    continue
                value, tail = add + rest, ((s, e), *rest_tail)
            if value < best:
                best, best_tail = value, tail
        result = (best, best_tail) if best < beta else (beta, None)
        self.memo[key] = result
        return result


    def _children(self, d: int, e_prev: int, slowest: float, acc: float, limit: Callable[[], float]
                  ) -> Iterator[tuple[int, int, float, float]]:
        """Device ``d``'s intervals after a device ending at ``e_prev`` whose bound is below ``limit()`` (read
        at every node: the caller lowers it as leaves are found), in tree order, each with the slowest time so
        far and the additive terms so far (``acc`` and its own). Scored and cut nodes are counted here."""
        space, cost, c, data = self.space, self.cost, self.counters, self.data
        last = space.devices - 1
        for s in space.starts(d, e_prev):
            if not data.startable[d][s]:
                continue  # no end of device d from s leads to a partition of the space: not a node of the tree
            shared = acc + (cost.shared(d, e_prev - s) if d else 0.0)
            if d:  # a start node: more shared rows only cost more, and the rows left stay at least M - e_prev
                c.scored += 1
                if shared + data.after[d][e_prev] + max(slowest, self.rest_floor[d][space.size - e_prev]) >= limit():
                    c.pruned += 1
                    break
            terms, first = data.terms[d][s], space.size if d == last else s + space.lo[d]
            for e in space.ends(d, s):
                if not space.feasible(d + 1, e):
                    continue
                c.scored += 1
                t = max(slowest, cost.comp(d, s, e))
                add = shared + terms[e - first]
                if add + data.floor[d + 1] + t >= limit():  # grows with e: cut the larger siblings too
                    c.pruned += 1
                    break
                if self.following is not None:
                    add += next_data(self.nxt, d, s, e, self.following)
                if add + data.after[d + 1][e] + max(t, self.rest_floor[d + 1][space.size - e]) >= limit():
                    c.pruned += 1
                    continue
                yield s, e, t, add

    def best_k(self, k: int) -> list[tuple[float, Partition]]:
        """The ``k`` best partitions, best first: the same tree and bounds against the k-th best so far
        (no memo: a memoised sub-tree keeps only its best completion)."""
        found: list[tuple[float, Partition]] = []  # a max-heap by negated score

        def limit() -> float:
            return -found[0][0] if len(found) == k else math.inf

        def walk(d: int, e_prev: int, slowest: float, acc: float, head: Partition) -> None:
            for s, e, t, add in self._children(d, e_prev, slowest, acc, limit):
                if d == self.space.devices - 1:
                    heapq.heappush(found, (-(add + t), head + ((s, e),)))
                    if len(found) > k:
                        heapq.heappop(found)
                else:
                    walk(d + 1, e, t, add, head + ((s, e),))

        walk(0, 0, 0.0, 0.0, ())
        return sorted((-v, p) for v, p in found)


@dataclass(frozen=True)
class Plan:
    partitions: tuple[Partition, ...]
    score: float  # eq. (12), seconds
    counters: Counters = field(compare=False)
    seconds: float = field(compare=False)  # search time
    sweeps: int = 0


def _local(costs: list[LayerCost], plan: list[Partition], i: int, p: Partition, entry: Partition | None) -> float:
    """What layer ``i`` taking ``p`` adds to eq. (12): its own score and the data the next layer then needs."""
    own = costs[i].score(p, holder_of(costs, plan, i, entry))
    return own + (costs[i + 1].t_data(plan[i + 1], p) if i + 1 < len(plan) else 0.0)


def costs_of(layers: list[Layer], devices: tuple[Device, ...]) -> list[LayerCost]:
    return [LayerCost(layer, devices) for layer in layers]


def spaces_of(layers: list[Layer], devices: tuple[Device, ...], threshold: float, *, overlap: bool = True
              ) -> list[Space]:
    return [Space.of(x.out_size, devices, threshold, overlap=overlap, where=f"layer {x.name!r}") for x in layers]


def search_network(layers: list[Layer], devices: tuple[Device, ...], threshold: float, *, overlap: bool = True,
                   revise: bool = True, beam: int = 64, whole_below: int = 512, max_sweeps: int = 20,
                   entry: Partition | None = None) -> Plan:
    """Eq. (12) over a chain of layers whose first input ``entry`` holds (default: the head, all of it; a
    sub-block's: ``paths.search_paths``): a forward beam, then revision sweeps (see the module docstring). A layer
    whose space holds at most ``whole_below`` partitions is searched whole: every partition of it after every
    kept plan, every distinct end kept (with two devices, what the first layers of a 224-row network hold at a
    15 % threshold: VGG16's 263 against a beam of 64, which left its plan 3.5 % above the chain's optimum)."""
    t0 = time.process_time()
    costs = costs_of(layers, devices)
    spaces = spaces_of(layers, devices, threshold, overlap=overlap)
    counters = Counters()
    # Forward (eq. (12) from the first layer): ``beam`` partial plans (a small layer's whole space), each extended
    # by the ``beam`` best partitions of the next layer given its last one; the best distinct ends are kept.
    start = entry if entry is not None else source(costs[0])
    states: dict[Partition, tuple[float, tuple[Partition, ...]]] = {start: (0.0, ())}
    for cost, space in zip(costs, spaces):
        width = max(beam, space.count()) if space.count() <= whole_below else beam
        nxt: dict[Partition, tuple[float, tuple[Partition, ...]]] = {}
        for holder, (r, head) in states.items():
            for v, p in LayerTree(cost, space, holder, counters=counters).best_k(width):
                if p not in nxt or r + v < nxt[p][0]:
                    nxt[p] = (r + v, head + (p,))
        states = dict(sorted(nxt.items(), key=lambda kv: kv[1][0])[:width])
    plan = list(min(states.values())[1])
    sweeps = 0
    while revise and sweeps < max_sweeps:
        sweeps += 1
        changed = False
        for i in [*range(len(plan) - 2, -1, -1), *range(1, len(plan))]:
            holder = holder_of(costs, plan, i, entry)
            following = plan[i + 1] if i + 1 < len(plan) else None
            nxt = costs[i + 1] if following is not None else None
            now = _local(costs, plan, i, plan[i], entry)
            # The tree's next-layer term is the data alone; the next layer's own compute is the same either way.
            found = LayerTree(costs[i], spaces[i], holder, nxt=nxt, following=following,
                              counters=counters).search(beta=now - 1e-12)
            if found is not None and _local(costs, plan, i, found[1], entry) < now - 1e-12:
                plan[i] = found[1]
                changed = True
        if not changed:
            break
    return Plan(tuple(plan), network_score(costs, plan, entry), counters, time.process_time() - t0, sweeps)
