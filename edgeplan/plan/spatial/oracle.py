"""Exact searches over the same thresholded space as ``search``, to measure it against.

- ``exhaustive``: every partition of one layer scored (small spaces only).
- ``layer_dp``: one layer exactly at any device count — for each candidate bottleneck ``T`` (a device's time
  for one of its sizes), the least sum of the additive terms (data and overlap) over partitions whose devices
  all finish within ``T``, by a dynamic programme over devices; the best ``T + sum``. Exact because the score
  is ``max_d t_d`` plus terms that add up device by device, each depending on a device's interval and (for
  shared rows) its neighbour's end.
- ``chain_dp``: a chain of layers exactly (a Viterbi pass over every partition of every layer; for spaces of
  a few thousand partitions, e.g. two devices).
"""
from __future__ import annotations

import math

import numpy as np

from edgeplan.plan.spatial.cost import LayerCost, Partition, Space, next_data, source


def _terms(cost: LayerCost, space: Space, holder: Partition | None, nxt: LayerCost | None,
           following: Partition | None) -> list[dict[tuple[int, int], tuple[float, float]]]:
    """Per device, every interval it may take with its compute time and its additive (data) terms."""
    out = []
    for d in range(space.devices):
        table = {}
        for s in range(space.size + 1):
            for e in space.ends(d, s):
                add = cost.data(d, s, e, holder) + (next_data(nxt, d, s, e, following) if following else 0.0)
                table[(s, e)] = (cost.comp(d, s, e), add)
        out.append(table)
    return out


def exhaustive(cost: LayerCost, space: Space, holder: Partition | None, *, nxt: LayerCost | None = None,
               following: Partition | None = None) -> tuple[float, Partition, int]:
    """The best score and partition by scoring every partition (no bound, no memo), and how many there were."""
    terms = _terms(cost, space, holder, nxt, following)
    shared_rate = [0.0] + [cost.shared(d, 1) for d in range(1, space.devices)]
    last = space.devices - 1
    best, arg, n = math.inf, None, 0

    def walk(d: int, e_prev: int, slowest: float, acc: float, head: Partition) -> None:
        nonlocal best, arg, n
        for s in space.starts(d, e_prev):
            acc_s = acc + (e_prev - s) * shared_rate[d]
            for e in space.ends(d, s):
                if not space.feasible(d + 1, e):
                    continue
                comp, add = terms[d][(s, e)]
                if d == last:
                    n += 1
                    v = max(slowest, comp) + acc_s + add
                    if v < best:
                        best, arg = v, head + ((s, e),)
                else:
                    walk(d + 1, e, max(slowest, comp), acc_s + add, head + ((s, e),))

    walk(0, 0, 0.0, 0.0, ())
    return best, arg, n


def layer_dp(cost: LayerCost, space: Space, holder: Partition | None, *, nxt: LayerCost | None = None,
             following: Partition | None = None) -> tuple[float, Partition]:
    """The exact best of one layer (see the module docstring)."""
    n, m = space.devices, space.size
    items = []  # per device: starts, ends, compute time, additive terms
    for table in _terms(cost, space, holder, nxt, following):
        keys = list(table)
        items.append((np.array([s for s, _ in keys], int), np.array([e for _, e in keys], int),
                      np.array([table[k][0] for k in keys]), np.array([table[k][1] for k in keys])))
    shared_rate = [0.0] + [cost.shared(d, 1) for d in range(1, n)]

    def sweep(limit: float) -> list[np.ndarray]:
        """f[d][e]: least additive cost of devices d.. after a device ending at e, all within ``limit``."""
        f = [None] * (n + 1)
        f[n] = np.full(m + 1, np.inf)
        f[n][m] = 0.0
        for d in range(n - 1, -1, -1):
            s_arr, e_arr, comp, add = items[d]
            ok = comp <= limit
            g = np.full(m + 1, np.inf)
            np.minimum.at(g, s_arr[ok], add[ok] + f[d + 1][e_arr[ok]])
            if d == 0:
                f[0] = np.full(m + 1, np.inf)
                f[0][0] = g[0]
                continue
            fd = g.copy()
            for k in range(1, space.shared_max(d) + 1):  # device d starts k rows before e_prev
                fd[k:] = np.minimum(fd[k:], g[:-k] + k * shared_rate[d])
            f[d] = fd
        return f

    limits = np.unique(np.concatenate([it[2] for it in items]))
    best, best_limit = math.inf, None
    for limit in limits:
        if limit >= best:
            break
        total = limit + sweep(limit)[0][0]
        if total < best:
            best, best_limit = total, limit
    f = sweep(best_limit)
    p, e_prev = [], 0
    for d in range(n):  # walk the argmins back out
        s_arr, e_arr, comp, add = items[d]
        cand = [(((e_prev - s) * shared_rate[d] if d else 0.0) + a + f[d + 1][e], s, e)
                for s, e, c, a in zip(s_arr, e_arr, comp, add)
                if c <= best_limit and s in space.starts(d, e_prev)]
        _, s, e = min(cand)
        p.append((int(s), int(e)))
        e_prev = e
    return float(best), tuple(p)


def chain_dp(costs: list[LayerCost], spaces: list[Space]) -> tuple[float, tuple[Partition, ...]]:
    """The exact best plan of a chain of layers (eq. (12)) by a Viterbi pass over every partition."""
    parts = [list(sp.enumerate()) for sp in spaces]
    # each layer's own score without data (the data between layers is added below); the first reads the head
    own = [np.array([c.score(p, source(c) if i == 0 else None) for p in ps])
           for i, (c, ps) in enumerate(zip(costs, parts))]
    total = own[0]
    back = []
    for i in range(1, len(costs)):
        cost, prev, cur = costs[i], parts[i - 1], parts[i]
        n_dev = len(cur[0])
        data = np.zeros((len(prev), len(cur)))
        for d in range(n_dev):
            need = np.array([cost.layer.window.needs(p[d]) for p in cur])  # (J, 2)
            held = np.array([p[d] for p in prev])  # (I, 2)
            ns, ne = need[None, :, 0], need[None, :, 1]
            hs, he = held[:, None, 0], held[:, None, 1]
            before = np.where(ns < hs, np.minimum(hs, ne) - ns, 0).clip(min=0)
            after = np.where(ne > he, ne - np.maximum(ns, he), 0).clip(min=0)
            data += (before + after) * cost.layer.in_row_bytes / float(cost.bw[d])
        step = total[:, None] + data
        back.append(step.argmin(axis=0))
        total = step.min(axis=0) + own[i]
    j = int(total.argmin())
    best = float(total[j])
    plan = [parts[-1][j]]
    for i in range(len(costs) - 1, 0, -1):
        j = int(back[i - 1][j])
        plan.append(parts[i - 1][j])
    return best, tuple(reversed(plan))
