"""The analytic model of ``queueing`` for many partitionings at once, each with its best core allocation.

The refined search spends its time scoring neighbourhoods of partitionings; scoring them one by one in
Python costs ~100 us each. Here a whole batch (every neighbour of every climb) is one set of numpy array
operations: the TPU queue (eqs. (1), (2), (10) or the LRU alpha), the per-model CPU costs for every core
count (from a table of M/D/k waits computed once per instance, ``queueing``'s formulas over a core axis), and
the dynamic program over cores. ``tests/plan/test_swapless.py`` checks it against ``queueing.evaluate`` and
``allocate.best_cores`` on random instances.

Each numpy call costs ~2 us on this VM whatever its size, and a search scores ~5 batches of 30-260
candidates: the calls per batch (~70) weigh as much as the candidates. Hence one gather for every per-point
figure, sums kept in place, the DP reading a row of inf instead of adding a mask, alpha's sums as matrix
products; with them the refined search at 4 models x 12 points x 4 cores went from 2.6 to 1.2 ms. Later, ~25
calls fewer a batch: alpha's request-mix table made once per instance (it depends only on which models are on
the TPU), the TPU sums' rows carrying the rates (rho and lambda E[S^2] are then plain sums), the CPU's pressure
two stacked rows, ufunc reductions called directly (ndarray.sum and .min go through a Python wrapper), and the
per-model rows that do not depend on the rate made once per model (``ModelSpec.derived``).

numpy and the standard library only (the device runtime runs the refined search online).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from edgeplan.plan.swapless.instance import Instance, ModelSpec
from edgeplan.plan.swapless.queueing import eq3_formula

UNSTABLE = 1e15  # keys of unstable partitionings: UNSTABLE * (1 + distance to stability), above any objective
# rows of BatchScorer's stacked per-point table (``fields`` in __init__); WAIT then the core counts' waits, and after
# them the CPU cost beside the wait, one row per core count
RATE_ON, TPU_SUMS, RELOAD_SUMS, FOOT, NEED, ON_BIT, WAIT = 0, slice(1, 4), slice(4, 7), 7, slice(8, 10), 10, 11


@lru_cache(maxsize=64)
def _structure(n: int, k_max: int):
    """What depends on the numbers of models and cores only.

    The DP over cores, new[u] = min_k old[u - k] + cost[k], runs over a (k, u) grid: ``dp_from[k, u]`` is
    u - k, or k_max + 1 (a row of inf below the DP's table) where k > u. For alpha_lru, over every subset S of
    the models other than i, for each i (rows i * 2^(n-1) + S): ``with_self`` @ x sums x over S and i,
    ``outside`` @ x over the models not in S (i included), and ``moebius`` turns P(the requests in between
    lie within T) into P(exactly S are requested)."""
    ks = np.arange(k_max + 1)
    dp_from = np.where(ks[None, :] >= ks[:, None], ks[None, :] - ks[:, None], k_max + 1)
    size = 2 ** (n - 1)
    masks = np.zeros((n, size, n))
    for i in range(n):
        others = [j for j in range(n) if j != i]
        for b in range(size):
            for pos, j in enumerate(others):
                if b >> pos & 1:
                    masks[i, b, j] = 1.0
    moebius = np.zeros((size, size))
    for s in range(size):
        for t in range(size):
            if t & s == t:
                moebius[s, t] = (-1) ** (s.bit_count() - t.bit_count())
    subsets = masks.reshape(n * size, n)
    with_self = subsets + np.repeat(np.eye(n), size, axis=0)
    return dp_from, with_self, 1.0 - subsets, moebius


@lru_cache(maxsize=16)
def _cores(k_max: int) -> tuple[np.ndarray, np.ndarray]:
    """k = 1..k_max as a (k, 1, 1) column, and Cosmetatos' factor (k - 1)(sqrt(4 + 5k) - 2) / 16k for each."""
    ks = np.arange(1, k_max + 1, dtype=float)[:, None, None]
    return ks, (ks - 1) * (np.sqrt(4 + 5 * ks) - 2) / (16 * ks)


def pool_waits(lam, s, k_max: int) -> tuple[np.ndarray, np.ndarray]:
    """The M/D/k (Cosmetatos, ``queueing.mdc_formula``) and M/M/k (Erlang C, ``queueing.mmc_formula``) mean
    waits for k = 1..k_max at once, each (k_max, *shape), Erlang C from the terms a^j / j! (j < k) every k
    shares. Meaningful where the pool is stable and busy."""
    ks, cosmetatos = _cores(k_max)
    a = lam * s
    rho = a / ks
    term = np.cumprod(np.concatenate([np.ones((1, *a.shape)), a / ks[:-1]]), axis=0)  # a^(k-1) / (k-1)!
    last = term * rho / (1.0 - rho)
    mmc = last / (np.cumsum(term, axis=0) + last) * s / (ks - a)
    return 0.5 * mmc * (1.0 + (1.0 - rho) * cosmetatos / rho), mmc


# the rows of _figures: the TPU's sums and the reloads' (fields TPU_SUMS and RELOAD_SUMS before the rate weighs
# them), field FOOT, then s^CPU, its SCV and the footprint
SUMS_ROWS, FOOT_ROW, S_CPU, SCV_CPU, FOOTPRINT = slice(0, 6), 6, 7, 8, 9


def _figures(m: ModelSpec, refined: bool, capacity: int) -> np.ndarray:
    """Model ``m``'s per-point rows that do not depend on its rate (S_CPU and the rest), (row, point): made once
    per model, variant and cache size (``m.derived``)."""
    out = m.derived.get((refined, capacity))
    if out is not None:
        return out
    if refined:
        io, t_load, foot, s_tpu, var_tpu, s_cpu, scv_cpu = np.array(
            [m.io, m.t_load, m.footprint, m.tpu_mean, m.tpu_var, m.cpu_mean, m.cpu_scv], dtype=float)
    else:
        io, t_load, foot, s_tpu, s_cpu = np.array([m.io, m.t_load, m.footprint, m.s_tpu, m.s_cpu], dtype=float)
        var_tpu = scv_cpu = np.zeros_like(s_tpu)
    on = np.arange(len(io)) > 0
    base = s_tpu + io if refined else s_tpu  # the TPU's service without a reload
    with np.errstate(invalid="ignore"):  # an unusable prefix (s_tpu inf) gives nan: never stable, never chosen
        miss2 = (t_load + base) ** 2 - base**2
    out = m.derived[(refined, capacity)] = np.stack([
        # TPU_SUMS (times lambda_i in the scorer's table, then summed over the models): E[S], E[S^2] and the
        # prefix's own latency
        base,  # the TPU's service without a reload
        base**2 + var_tpu,  # its second moment
        io + s_tpu,  # the prefix's latency before queueing and reloads (eq. (4))
        # RELOAD_SUMS, what a reload adds to each (times lambda_i, then weighted by alpha)
        t_load,
        miss2,  # to the second moment
        t_load,
        on * (np.minimum(foot, capacity) if refined else foot),  # FOOT (LRU: at most C)
        s_cpu, scv_cpu, foot])
    out.setflags(write=False)
    return out


class BatchScorer:
    """Scores partitionings of one instance: ``score(points)`` with points an (m, n) int array."""

    def __init__(self, inst: Instance, variant: str = "refined", use_alpha: bool = True):
        models = inst.models
        self.n = n = len(models)
        self.cores = k_max = inst.cores
        self.capacity = inst.capacity
        self.refined = variant == "refined"
        width = max(m.last for m in models) + 1
        last = np.array([m.last for m in models])
        refined = self.refined
        if (last == width - 1).all():  # every model's figures (row, model, point)
            rows = np.stack([_figures(m, refined, self.capacity) for m in models], axis=1)
        else:  # padded to ``width``
            rows = np.zeros((FOOTPRINT + 1, n, width))
            for i, m in enumerate(models):
                rows[:, i, : m.last + 1] = _figures(m, refined, self.capacity)
        s_cpu, scv_cpu = rows[S_CPU], rows[SCV_CPU]
        # wait[k, i, p]: lambda_i times the suffix's M/D/k (refined) or eq. (3) (paper) mean wait on k cores
        # under Poisson arrivals, inf when k = 0 or unstable; without a suffix (p = P) 0 for k = 0 and inf
        # otherwise. spread[k, i, p]: lambda_i c_s^2 (W_M/M/k - W_M/D/k), what the service's spread adds.
        # The formulas are queueing's, for every k at once.
        lam = np.array([m.rate for m in models], dtype=float)[:, None]
        points = np.arange(width)[None, :]
        suffix = points < last[:, None]
        busy = suffix & (lam > 0) & (s_cpu > 0)
        load = lam * s_cpu  # lambda_i s^CPU
        stable = load < _cores(k_max)[0]  # (k, n, width)
        ok = busy & stable
        safe = np.where(busy, s_cpu, 1.0)
        wait = np.full((k_max + 1, n, width), np.inf)
        wait[0] = np.where(points == last[:, None], 0.0, np.inf)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if refined:
                w_d, w_m = pool_waits(lam, safe, k_max)
                w_d = np.where(ok, w_d, 0.0)
                spread = np.where(ok, lam * scv_cpu * (w_m - w_d), 0.0)
            else:
                w_d = np.where(ok, eq3_formula(lam, safe, _cores(k_max)[0]), 0.0)
                spread = 0.0
            wait[1:] = np.where(suffix & stable, lam * w_d, np.inf)
        cpu = np.empty_like(wait)  # the CPU cost beside the wait: lambda_i s^CPU, and the spread's
        cpu[0] = load
        cpu[1:] = spread + load
        # every per-point table stacked, so that scoring gathers once; candidates lie along the last axis
        # everywhere: numpy reduces over leading axes far faster than over a short trailing one
        on = points > 0
        fields = np.concatenate([
            (on * lam)[None],  # RATE_ON: lambda_i when the model has a prefix
            rows[SUMS_ROWS] * (on * lam),  # TPU_SUMS and RELOAD_SUMS (``_figures``), times lambda_i
            rows[FOOT_ROW][None],  # FOOT
            # NEED, the CPU's pressure (of partitionings no core allocation makes stable): the cores a suffix needs
            # at least (floor(load) + 1: its M/D/k is stable only on more cores than its load), and 1e-3 of its
            # load, breaking ties so that a climb sees its way down a plateau of equal needs; per core
            [(np.floor(load) + 1) * suffix / k_max, 1e-3 * load * suffix / k_max],
            (on * (2 ** np.arange(n))[:, None])[None],  # ON_BIT: model i's bit of the set of models on the TPU
            wait, cpu])
        self.k1 = k_max + 1
        self.flat = fields.reshape(len(fields), n * width)  # model i's point p at i * width + p
        self.offsets = (np.arange(n) * width)[:, None]
        self.dp_from, self.with_self, self.outside, self.moebius = _structure(n, k_max)
        # whether any partitioning can overflow the cache: else alpha is 0 everywhere and never computed
        self.may_spill = use_alpha and n > 1 and rows[FOOTPRINT].max(axis=1).sum() > self.capacity
        self.size = size = self.moebius.shape[0]
        if self.may_spill and refined:
            # P(exactly S are requested between two requests of i) depends only on which models are on the TPU:
            # one table over those 2^n sets, (n, S, set). The share of i is pi_i = lambda_i / lambda_TPU; P(every
            # request in between is of a model in T) is pi_i / (1 - pi_T), the denominator summed over the models
            # outside T (i among them; the shares sum to 1); inclusion-exclusion (moebius) gives P(exactly S).
            sets = 2**n
            rate_on = (np.arange(sets)[None, :] >> np.arange(n)[:, None] & 1) * lam  # (n, set)
            pi = rate_on / np.maximum(rate_on.sum(axis=0), 1e-300)
            within = pi[:, None, :] / np.maximum((self.outside @ pi).reshape(n, size, sets), 1e-300)
            self.exact = self.moebius @ within  # S empty never spills (a prefix is <= C)

    def _alpha(self, pts: np.ndarray, rate_on: np.ndarray, lam: np.ndarray, foot: np.ndarray,
               on_bit: np.ndarray) -> np.ndarray:
        """Per model and candidate (n, m), the probability that the model's cached prefix is gone at its
        next request (0 for a model without a prefix or without requests)."""
        if not self.refined:  # eq. (10)
            on = pts > 0
            crowded = (foot.sum(axis=0) > self.capacity) & (on.sum(axis=0) > 1)
            return (1.0 - rate_on / np.maximum(lam, 1e-300)) * on * crowded
        on_set = np.add.reduce(on_bit, axis=0).astype(np.intp)  # which models are on the TPU, one bit each
        exact = self.exact.take(on_set, axis=2)  # (n, S, m): P(exactly S), by the set on the TPU
        spill = (self.with_self @ foot).reshape(exact.shape) > self.capacity  # i's prefix and those of S overflow
        alpha = np.einsum("nsm,nsm->nm", exact, spill)
        return np.minimum(np.maximum(alpha, 0.0, out=alpha), 1.0, out=alpha)

    def score(self, points: np.ndarray, with_cores: bool = False):
        """(key, objective[, cores]) for each row of ``points`` (m, n): key is the objective of eq. (5) with
        the best core allocation, or UNSTABLE * (1 + the larger of TPU utilisation and the cores the
        suffixes need / cores, plus 1e-3 CPU load / cores) when no allocation is stable; cores (with
        ``with_cores``, (m, n)) is that allocation, for stable rows."""
        with np.errstate(invalid="ignore"):
            s = self.evaluate(points)
        if not with_cores:
            return s.key, s.objective
        return s.key, s.objective, s.cores(np.arange(len(s.key))).T

    def evaluate(self, points: np.ndarray) -> Scored:
        """``score``'s figures for each row of ``points`` (m, n), the best cores of any row on request. The caller
        silences numpy's floating-point warnings (``np.errstate(invalid="ignore")``: inf / inf for an unusable
        prefix, whose candidate is unstable), once for all its batches."""
        pts = np.asarray(points).T  # (n, m)
        f = self.flat.take(self.offsets + pts, axis=1)  # (field, n, m): one gather for every per-point table
        rate_on = f[RATE_ON]
        lam = np.add.reduce(rate_on, axis=0)  # lambda^TPU
        # the TPU's sums over the models, each row carrying lambda_i: rho = lambda E[S] and lambda E[S^2] (eq. (2)),
        # and sum_i lambda_i prefix_i; and what the reloads add where the cache may overflow (nearly every batch
        # then has a candidate that does: 93% of them did)
        rho, lam_es2, tpu_pre = np.add.reduce(f[TPU_SUMS], axis=1)
        if self.may_spill:
            more = np.einsum("fnm,nm->fm", f[RELOAD_SUMS], self._alpha(pts, rate_on, lam, f[FOOT], f[ON_BIT]))
            rho, lam_es2, tpu_pre = rho + more[0], lam_es2 + more[1], tpu_pre + more[2]
        tpu_ok = rho < 1
        # sum over models of lambda_i times eq. (4)'s TPU part: E[W^TPU] = lambda E[S^2] / 2 (1 - rho) (eq. (1))
        tpu_cost = tpu_pre + lam * lam_es2 / np.maximum(2 - 2 * rho, 1e-300)
        cost = f[WAIT:WAIT + self.k1]  # lambda_i E[W^CPU] per core count k, model, candidate (the batch's copy)
        if self.refined:  # QNA: the TPU's departures (scv rho^2 c_s^2 + 1 - rho^2), then the split to each model
            # (1 off the TPU): the wait scales by 1 + pi_i (scv_dep - 1), pi_i = lambda_i / lambda^TPU, and
            # scv_dep - 1 = rho^2 (E[S^2] / E[S]^2 - 2) = lambda lambda E[S^2] - 2 rho^2
            dep = np.where(tpu_ok, lam * lam_es2 - 2 * rho * rho, 0.0)
            cost *= np.maximum(1 + rate_on * (dep / np.maximum(lam, 1e-300)), 1e-12)
        cost += f[WAIT + self.k1:]  # lambda_i (E[W^CPU] + s^CPU)

        # dynamic program over models: dp[u, c] = least cost of the models so far with u cores used, above a
        # row of inf that dp_from reads where a model would take more cores than are used
        dp = np.empty((self.k1 + 1, pts.shape[1]))
        dp[self.k1] = np.inf
        dp[:self.k1] = cost[:, 0, :]
        trials = []
        for i in range(1, self.n):
            trial = dp[self.dp_from]  # (k, u, m)
            trial += cost[:, i, None, :]
            trials.append(trial)
            np.minimum.reduce(trial, axis=0, out=dp[:self.k1])
        dp = dp[:self.k1]
        objective = np.where(tpu_ok, tpu_cost + np.minimum.reduce(dp, axis=0), np.inf)
        key = objective
        stable = objective < np.inf
        if not np.logical_and.reduce(stable):  # ranked by the larger of the TPU's and the CPU's pressure
            need, tie = np.add.reduce(f[NEED], axis=1)
            key = np.where(stable, objective, UNSTABLE * (1 + np.maximum(rho, need) + tie))
        return Scored(key, objective, dp, trials)


@dataclass(frozen=True)
class Scored:
    """A batch's keys and objectives (``BatchScorer.score``), and the DP's tables to read any row's cores from."""

    key: np.ndarray
    objective: np.ndarray
    dp: np.ndarray  # (u, m): least CPU cost of all models with u cores used
    trials: list  # per model i >= 1, (k, u, m): the cost of the models up to i with u used, k of them its own

    def cores(self, rows) -> np.ndarray:
        """The best allocation of the batch's ``rows`` (an index array), (n, len(rows)); stable rows only."""
        used = self.dp[:, rows].argmin(axis=0)
        out = [None] * (len(self.trials) + 1)
        for i in range(len(self.trials), 0, -1):
            out[i] = self.trials[i - 1][:, used, rows].argmin(axis=0)
            used = used - out[i]
        out[0] = used
        return np.array(out, dtype=np.int64)
