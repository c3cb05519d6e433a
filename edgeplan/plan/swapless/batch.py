"""The analytic model of ``queueing`` for many partitionings at once, each with its best core allocation.

The refined search spends its time scoring neighbourhoods of partitionings; scoring them one by one in
Python costs ~100 us each. Here a whole batch (every neighbour of every climb) is one set of numpy array
operations: the TPU queue (eqs. (1), (2), (10) or the LRU alpha), the per-model CPU costs for every core
count (from a table of M/D/k waits computed once per instance by ``queueing``'s own functions), and the
dynamic program over cores. ``tests/plan/test_swapless.py`` checks it against ``queueing.evaluate`` and
``allocate.best_cores`` on random instances.

numpy and the standard library only (the device runtime runs the refined search online).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from edgeplan.plan.swapless.instance import Instance
from edgeplan.plan.swapless.queueing import eq3_formula, mdc_formula, mmc_formula

UNSTABLE = 1e15  # keys of unstable partitionings: UNSTABLE * (1 + distance to stability), above any objective


@lru_cache(maxsize=64)
def _structure(n: int, k_max: int):
    """What depends on the numbers of models and cores only.

    The DP over cores, new[u] = min_k old[u - k] + cost[k], runs over a (k, u) grid: ``dp_from[k, u]`` is
    u - k and ``dp_mask`` is inf where k > u. For alpha_lru, ``subsets`` @ x sums x over every subset S of
    the models other than i, for each i (rows i * 2^(n-1) + S), and ``moebius`` turns P(the requests in
    between lie within T) into P(exactly S are requested)."""
    ks = np.arange(k_max + 1)
    dp_from = np.clip(ks[None, :] - ks[:, None], 0, None)
    dp_mask = np.where(ks[None, :] >= ks[:, None], 0.0, np.inf)[:, :, None]
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
    return dp_from, dp_mask, masks.reshape(n * size, n), moebius


class BatchScorer:
    """Scores partitionings of one instance: ``score(points)`` with points an (m, n) int array."""

    def __init__(self, inst: Instance, variant: str = "refined", use_alpha: bool = True):
        models = inst.models
        self.n = n = len(models)
        self.cores = k_max = inst.cores
        self.capacity = inst.capacity
        self.refined = variant == "refined"
        self.use_alpha = use_alpha
        width = max(m.last for m in models) + 1
        self.last = np.array([m.last for m in models])
        self.rate = np.array([m.rate for m in models], dtype=float)

        def table(name):
            out = np.zeros((n, width))
            for i, m in enumerate(models):
                out[i, : m.last + 1] = getattr(m, name)
            return out

        refined = self.refined
        io, t_load, footprint = table("io"), table("t_load"), table("footprint")
        # the service times as queueing reads them (queueing.tpu_state, queueing.cpu_service)
        s_tpu = table("tpu_mean") if refined else table("s_tpu")
        var_tpu = table("tpu_var") if refined else np.zeros_like(s_tpu)
        s_cpu = table("cpu_mean") if refined else table("s_cpu")
        scv_cpu = table("cpu_scv") if refined else np.zeros_like(s_cpu)
        # wait[k, i, p]: lambda_i times the suffix's M/D/k (refined) or eq. (3) (paper) mean wait on k cores
        # under Poisson arrivals, inf when k = 0 or unstable; without a suffix (p = P) 0 for k = 0 and inf
        # otherwise. spread[k, i, p]: lambda_i c_s^2 (W_M/M/k - W_M/D/k), what the service's spread adds.
        # The formulas are queueing's own, applied to whole tables.
        lam = self.rate[:, None]
        points = np.arange(width)[None, :]
        suffix = points < self.last[:, None]
        busy = suffix & (lam > 0) & (s_cpu > 0)
        wait = np.full((k_max + 1, n, width), np.inf)
        wait[0] = np.where(points == self.last[:, None], 0.0, np.inf)
        spread = np.zeros((k_max + 1, n, width))
        safe = np.where(busy, s_cpu, 1.0)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            for k in range(1, k_max + 1):
                stable = lam * s_cpu < k
                ok = busy & stable
                w_d = np.where(ok, (mdc_formula if refined else eq3_formula)(lam, safe, k), 0.0)
                wait[k] = np.where(suffix & stable, lam * w_d, np.inf)
                if refined:
                    spread[k] = np.where(ok, lam * scv_cpu * (mmc_formula(lam, safe, k) - w_d), 0.0)
        # every per-point table stacked, so that scoring gathers once (fields below); candidates lie along
        # the last axis everywhere: numpy reduces over leading axes far faster than over a short trailing one
        on = points > 0
        base = s_tpu + io if refined else s_tpu  # the TPU's service without a reload
        with np.errstate(invalid="ignore"):  # an unusable prefix (s_tpu inf) gives nan: never stable, never chosen
            miss2 = (t_load + base) ** 2 - base**2
        self.fields = np.concatenate([np.stack([
            on * lam,  # RATE_ON: lambda_i when the model has a prefix
            base,
            base**2 + var_tpu,  # BASE2: its second moment
            miss2,  # MISS2: what a reload adds to the second moment
            t_load,
            io + s_tpu,  # PREFIX: the prefix's latency before queueing and reloads (eq. (4))
            on * footprint,
            lam * s_cpu,  # LOAD: lambda_i s^CPU
        ]), wait, spread])  # (field, model, point)
        self.k1 = k_max + 1
        self.rows = np.arange(n)
        self.dp_from, self.dp_mask, self.subsets, self.moebius = _structure(n, k_max)
        self.size = self.moebius.shape[0]

    def _alpha(self, on: np.ndarray, pi: np.ndarray, foot: np.ndarray) -> np.ndarray:
        """Per model and candidate (n, m), the probability that the model's cached prefix is gone at its
        next request."""
        if not self.use_alpha or self.n == 1:
            return np.zeros(on.shape)
        if not self.refined:  # eq. (10)
            crowded = (foot.sum(axis=0) > self.capacity) & (on.sum(axis=0) > 1)
            return (1.0 - pi) * on * crowded
        foot = np.minimum(foot, self.capacity)
        shape = (self.n, self.size, on.shape[1])
        rest = (self.subsets @ pi).reshape(shape)  # P(a request in between is of a model in T)
        within = pi[:, None, :] / np.maximum(1.0 - rest, 1e-300)  # P(every request in between is in T)
        exact = self.moebius @ within  # P(exactly S); S empty never spills (a prefix is <= C)
        spill = foot[:, None, :] + (self.subsets @ foot).reshape(shape) > self.capacity
        return np.minimum(np.maximum((exact * spill).sum(axis=1), 0.0), 1.0) * on

    def score(self, points: np.ndarray, with_cores: bool = False):
        """(key, objective[, cores]) for each row of ``points`` (m, n): key is the objective of eq. (5) with
        the best core allocation, or UNSTABLE * (1 + the worst of TPU utilisation, CPU load / cores,
        suffixes / cores) when no allocation is stable; cores (with ``with_cores``, (m, n)) is that
        allocation, for stable rows."""
        pts = np.asarray(points).T  # (n, m)
        m = pts.shape[1]
        f = self.fields[:, self.rows[:, None], pts]  # (field, n, m): one gather for every per-point table
        rate_on, base, base2, miss2, t_load, pre, foot, load = f[:8]
        wait_cost, spread = f[8:8 + self.k1], f[8 + self.k1:]
        lam = rate_on.sum(axis=0)
        w = rate_on / np.maximum(lam, 1e-300)  # each model's share of the TPU's requests
        if self.use_alpha and self.n > 1 and (foot.sum(axis=0) > self.capacity).any():
            alpha = self._alpha(pts > 0, w, foot)
            reload = alpha * t_load
            es = (w * (reload + base)).sum(axis=0)  # eq. (2)
            es2 = (w * (base2 + alpha * miss2)).sum(axis=0)
            tpu_cost = (rate_on * (pre + reload)).sum(axis=0)
        else:  # every prefix stays on chip: alpha = 0
            es = (w * base).sum(axis=0)  # eq. (2)
            es2 = (w * base2).sum(axis=0)
            tpu_cost = (rate_on * pre).sum(axis=0)
        rho = lam * es
        tpu_ok = rho < 1
        w_tpu = lam * es2 / (2 * np.maximum(1 - rho, 1e-300))  # eq. (1)
        tpu_cost = tpu_cost + lam * w_tpu  # sum over models of lambda_i times eq. (4)'s TPU part

        if self.refined:  # QNA: the TPU's departures, then the split to each model (1 off the TPU)
            with np.errstate(invalid="ignore"):  # inf / inf for an unusable prefix: that candidate is unstable
                scv_service = es2 / np.maximum(es * es, 1e-300) - 1
            scv_dep = np.where(tpu_ok, rho**2 * scv_service + (1 - rho**2), 1.0)
            scv_in = np.maximum(1 + w * (scv_dep - 1), 1e-12)
            wait_cost = scv_in * wait_cost  # (k, n, m)
        cost = wait_cost + spread + load  # lambda_i (E[W^CPU] + s^CPU) per core count k, model, candidate

        # dynamic program over models: dp[u, c] = least cost of the models so far with u cores used
        dp = cost[:, 0, :]
        trials = []
        for i in range(1, self.n):
            trial = dp[self.dp_from] + self.dp_mask + cost[:, i, None, :]  # (k, u, m)
            trials.append(trial)
            dp = trial.min(axis=0)
        cpu_cost = dp.min(axis=0)
        objective = np.where(tpu_ok, tpu_cost + cpu_cost, np.inf)
        stable = objective < np.inf
        key = objective
        if not stable.all():
            suffixes = (pts < self.last[:, None]).sum(axis=0)
            pressure = np.maximum(rho, np.maximum(load.sum(axis=0), suffixes) / self.cores)
            key = np.where(stable, objective, UNSTABLE * (1 + pressure))
        if not with_cores:
            return key, objective
        every = np.arange(m)
        used = dp.argmin(axis=0)
        cores = np.zeros((self.n, m), dtype=np.int64)
        for i in range(self.n - 1, 0, -1):
            cores[i] = trials[i - 1][:, used, every].argmin(axis=0)
            used = used - cores[i]
        cores[0] = used
        return key, objective, cores.T
