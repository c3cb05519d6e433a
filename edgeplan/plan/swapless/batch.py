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
products; with them the refined search at 4 models x 12 points x 4 cores went from 2.6 to 1.2 ms.

numpy and the standard library only (the device runtime runs the refined search online).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from edgeplan.plan.swapless.instance import Instance
from edgeplan.plan.swapless.queueing import eq3_formula

UNSTABLE = 1e15  # keys of unstable partitionings: UNSTABLE * (1 + distance to stability), above any objective
# rows of BatchScorer's stacked per-point table (``fields`` in __init__); WAIT then the core counts' waits, and after
# them the CPU cost beside the wait, one row per core count
RATE_ON, TPU_SUMS, RELOAD_SUMS, FOOT, LOAD, SUFFIX, WAIT = 0, slice(1, 4), slice(4, 7), 7, 8, 9, 10


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


def pool_mmc(lam, s, k_max: int) -> np.ndarray:
    """Erlang C's M/M/k mean wait (``queueing.mmc_formula``) for k = 1..k_max at once, (k_max, *shape), from the
    terms a^j / j! (j < k) every k shares. Meaningful where the pool is stable and busy."""
    a = lam * s
    ks = np.arange(1, k_max + 1).reshape(-1, *([1] * np.ndim(a)))
    term = np.cumprod(np.concatenate([np.ones((1, *np.shape(a))), a / ks[:-1]]), axis=0)  # a^(k-1) / (k-1)!
    total = np.cumsum(term, axis=0)
    last = term * a / ks / (1.0 - a / ks)
    return last / (total + last) * s / (ks - a)


def pool_mdc(lam, s, k_max: int, mmc: np.ndarray) -> np.ndarray:
    """Cosmetatos' M/D/k mean wait (``queueing.mdc_formula``) for k = 1..k_max, from ``pool_mmc``'s waits."""
    ks = np.arange(1, k_max + 1).reshape(-1, *([1] * np.ndim(s)))
    rho = lam * s / ks
    return 0.5 * mmc * (1.0 + (1.0 - rho) * (ks - 1) * (np.sqrt(4 + 5 * ks) - 2) / (16 * rho * ks))


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
        names = ("io", "t_load", "footprint", *(("tpu_mean", "tpu_var", "cpu_mean", "cpu_scv") if refined else
                                                ("s_tpu", "s_cpu")))
        tables = np.zeros((len(names), n, width))  # every per-point figure of every model, padded to ``width``
        for i, m in enumerate(models):
            tables[:, i, : m.last + 1] = [getattr(m, name) for name in names]
        if refined:
            io, t_load, footprint, s_tpu, var_tpu, s_cpu, scv_cpu = tables
        else:
            io, t_load, footprint, s_tpu, s_cpu = tables
            var_tpu = scv_cpu = np.zeros_like(s_tpu)
        # wait[k, i, p]: lambda_i times the suffix's M/D/k (refined) or eq. (3) (paper) mean wait on k cores
        # under Poisson arrivals, inf when k = 0 or unstable; without a suffix (p = P) 0 for k = 0 and inf
        # otherwise. spread[k, i, p]: lambda_i c_s^2 (W_M/M/k - W_M/D/k), what the service's spread adds.
        # The formulas are queueing's, for every k at once.
        lam = np.array([m.rate for m in models], dtype=float)[:, None]
        points = np.arange(width)[None, :]
        suffix = points < last[:, None]
        busy = suffix & (lam > 0) & (s_cpu > 0)
        ks = np.arange(1, k_max + 1)[:, None, None]
        stable = lam * s_cpu < ks  # (k, n, width)
        ok = busy & stable
        safe = np.where(busy, s_cpu, 1.0)
        wait = np.full((k_max + 1, n, width), np.inf)
        wait[0] = np.where(points == last[:, None], 0.0, np.inf)
        spread = np.zeros((k_max + 1, n, width))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if refined:
                w_m = pool_mmc(lam, safe, k_max)
                w_d = np.where(ok, pool_mdc(lam, safe, k_max, w_m), 0.0)
                spread[1:] = np.where(ok, lam * scv_cpu * (w_m - w_d), 0.0)
            else:
                w_d = np.where(ok, eq3_formula(lam, safe, ks), 0.0)
            wait[1:] = np.where(suffix & stable, lam * w_d, np.inf)
        # every per-point table stacked, so that scoring gathers once (fields below); candidates lie along
        # the last axis everywhere: numpy reduces over leading axes far faster than over a short trailing one
        on = points > 0
        base = s_tpu + io if refined else s_tpu  # the TPU's service without a reload
        with np.errstate(invalid="ignore"):  # an unusable prefix (s_tpu inf) gives nan: never stable, never chosen
            miss2 = (t_load + base) ** 2 - base**2
        fields = np.concatenate([np.stack([
            on * lam,  # RATE_ON: lambda_i when the model has a prefix
            # TPU_SUMS, weighted by each model's share of requests: E[S], E[S^2] and the prefix's own latency
            base,  # the TPU's service without a reload
            base**2 + var_tpu,  # its second moment
            io + s_tpu,  # the prefix's latency before queueing and reloads (eq. (4))
            # RELOAD_SUMS, what a reload adds to each, weighted by the share times alpha
            t_load,
            miss2,  # to the second moment
            t_load,
            on * (np.minimum(footprint, self.capacity) if refined else footprint),  # FOOT (LRU: at most C)
            lam * s_cpu,  # LOAD: lambda_i s^CPU
            suffix,  # SUFFIX: 1 where the model keeps a CPU suffix
        ]), wait, spread + lam * s_cpu])  # (field, model, point): WAIT, then the CPU cost beside the wait
        self.k1 = k_max + 1
        self.flat = fields.reshape(len(fields), n * width)  # model i's point p at i * width + p
        self.offsets = (np.arange(n) * width)[:, None]
        self.dp_from, self.with_self, self.outside, self.moebius = _structure(n, k_max)
        # whether any partitioning can overflow the cache: else alpha is 0 everywhere and never computed
        self.may_spill = use_alpha and n > 1 and footprint.max(axis=1).sum() > self.capacity
        self.size = self.moebius.shape[0]

    def _alpha(self, pts: np.ndarray, pi: np.ndarray, foot: np.ndarray) -> np.ndarray:
        """Per model and candidate (n, m), the probability that the model's cached prefix is gone at its
        next request (0 for a model without a prefix or without requests: its share pi is 0)."""
        if not self.refined:  # eq. (10)
            on = pts > 0
            crowded = (foot.sum(axis=0) > self.capacity) & (on.sum(axis=0) > 1)
            return (1.0 - pi) * on * crowded
        shape = (self.n, self.size, pts.shape[1])
        # P(every request in between is of a model in T): pi_i / (1 - P(a request is of a model in T)), the
        # denominator summed over the models outside T (i among them; the shares sum to 1)
        within = pi[:, None, :] / np.maximum((self.outside @ pi).reshape(shape), 1e-300)
        exact = self.moebius @ within  # P(exactly S); S empty never spills (a prefix is <= C)
        spill = (self.with_self @ foot).reshape(shape) > self.capacity  # i's prefix and those of S overflow
        return np.clip(np.einsum("nsm,nsm->nm", exact, spill), 0.0, 1.0)

    def score(self, points: np.ndarray, with_cores: bool = False):
        """(key, objective[, cores]) for each row of ``points`` (m, n): key is the objective of eq. (5) with
        the best core allocation, or UNSTABLE * (1 + the larger of TPU utilisation and the cores the
        suffixes need / cores, plus 1e-3 CPU load / cores) when no allocation is stable; cores (with
        ``with_cores``, (m, n)) is that allocation, for stable rows."""
        s = self.evaluate(points)
        if not with_cores:
            return s.key, s.objective
        return s.key, s.objective, s.cores(np.arange(len(s.key))).T

    def evaluate(self, points: np.ndarray) -> Scored:
        """``score``'s figures for each row of ``points`` (m, n), the best cores of any row on request."""
        pts = np.asarray(points).T  # (n, m)
        f = self.flat.take(self.offsets + pts, axis=1)  # (field, n, m): one gather for every per-point table
        rate_on, foot, load, suffix = f[RATE_ON], f[FOOT], f[LOAD], f[SUFFIX]
        wait_cost, cpu_rest = f[WAIT:WAIT + self.k1], f[WAIT + self.k1:]
        lam = rate_on.sum(axis=0)
        with np.errstate(invalid="ignore"):  # inf / inf for an unusable prefix: that candidate is unstable
            w = rate_on / np.maximum(lam, 1e-300)  # each model's share of the TPU's requests
            es, es2, pre = (f[TPU_SUMS] * w).sum(axis=1)  # eq. (2); sum_i lambda_i prefix_i is lam * pre
            if self.may_spill:  # (nearly every batch then has a candidate that overflows: 93% of them did)
                more = (f[RELOAD_SUMS] * (w * self._alpha(pts, w, foot))).sum(axis=1)  # the reloads' share
                es += more[0]
                es2 += more[1]
                pre += more[2]
            rho = lam * es
            tpu_ok = rho < 1
            w_tpu = lam * es2 / np.maximum(2 - 2 * rho, 1e-300)  # eq. (1)
            tpu_cost = lam * (pre + w_tpu)  # sum over models of lambda_i times eq. (4)'s TPU part
            if self.refined:  # QNA: the TPU's departures (scv rho^2 c_s^2 + 1 - rho^2), then the split to
                # each model (1 off the TPU): the wait scales by 1 + w_i (scv_dep - 1)
                dep = np.where(tpu_ok, rho * rho * (es2 / np.maximum(es * es, 1e-300) - 2), 0.0)
                cost = np.maximum(1 + w * dep, 1e-12) * wait_cost  # (k, n, m)
            else:
                cost = wait_cost  # the batch's own copy (gathered above)
        cost += cpu_rest  # lambda_i (E[W^CPU] + s^CPU) per core count k, model, candidate

        # dynamic program over models: dp[u, c] = least cost of the models so far with u cores used, above a
        # row of inf that dp_from reads where a model would take more cores than are used
        dp = np.full((self.k1 + 1, pts.shape[1]), np.inf)
        dp[:self.k1] = cost[:, 0, :]
        trials = []
        for i in range(1, self.n):
            trial = dp[self.dp_from]  # (k, u, m)
            trial += cost[:, i, None, :]
            trials.append(trial)
            trial.min(axis=0, out=dp[:self.k1])
        dp = dp[:self.k1]
        objective = np.where(tpu_ok, tpu_cost + dp.min(axis=0), np.inf)
        stable = objective < np.inf
        key = objective
        if not stable.all():
            # the CPU's pressure: the cores its suffixes need at least (floor(load) + 1 each: a suffix's M/D/k is
            # stable only on more cores than its load) per core, its load per core breaking ties so that a climb
            # sees its way down a plateau of equal needs
            need = ((np.floor(load) + 1) * suffix).sum(axis=0)
            pressure = np.maximum(rho, need / self.cores) + 1e-3 * load.sum(axis=0) / self.cores
            key = np.where(stable, objective, UNSTABLE * (1 + pressure))
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
