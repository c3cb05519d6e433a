"""The SwapLess analytic latency model, two variants behind one function (``evaluate``).

``paper`` — exactly SwapLess §III-B, eqs. (1)-(10):
  the TPU is one M/G/1 FCFS queue (Pollaczek-Khinchine) whose service time mixes every model's prefix with
  its inter-model reload, weighted by the weight-miss probability alpha of eq. (10); each model's CPU suffix
  is M/D/k_i by eq. (3) (k cores treated as one server k times faster); transfers d/B sit outside the queue.

``refined`` (default) — the same structure with the coarse parts replaced:
  - the accelerator is busy while the input and output cross the link, so d/B is part of its service time;
  - alpha is the probability that, between two requests of a model, the distinct other models requested in
    between no longer fit in the cache beside it (LRU by model, independent request order; exact for that
    mechanism) instead of the upper bound 1 - lambda_i / lambda_TPU;
  - service times are the profiles' means with their spread (the median is the profile's headline, but the
    queue's load is set by the mean, and the measured samples differ from it by up to 15% here), the TPU's
    variance entering E[s^2];
  - the CPU pool is M/G/k: the M/D/k wait by the Erlang C formula with Cosmetatos' correction for
    deterministic service, not one server k times faster, moved towards the M/M/k wait by the service SCV
    (exact for k = 1 by Pollaczek-Khinchine);
  - a suffix fed by the TPU does not see Poisson arrivals: the TPU's departures are smoother, so the M/D/k
    part of the pool's wait is scaled by the arrival SCV from the QNA departure and splitting formulas
    (Whitt 1983) — together a Kingman-type (c_a^2 + c_s^2) / 2 form.

A configuration with a utilisation >= 1 anywhere is infeasible: its latency is infinite, never negative.
Standard library only (the device runtime runs the allocator online).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations

from edgeplan.plan.swapless.instance import Config, Evaluation, Instance

VARIANTS = ("paper", "refined")
INF = math.inf


def footprint_total(inst: Instance, points) -> int:
    """W(P): the aggregate on-chip footprint of the prefixes (eq. (10))."""
    return sum(m.footprint[p] for m, p in zip(inst.models, points))


def alpha_paper(inst: Instance, points) -> list[float]:
    """Eq. (10): 0 when W(P) <= C or a single model is on the TPU, else 1 - lambda_i / lambda_TPU."""
    on_tpu = [i for i, p in enumerate(points) if p > 0]
    lam_tpu = sum(inst.models[i].rate for i in on_tpu)
    if footprint_total(inst, points) <= inst.capacity or len(on_tpu) <= 1 or lam_tpu <= 0:
        return [0.0] * len(points)
    return [1.0 - m.rate / lam_tpu if p > 0 else 0.0 for m, p in zip(inst.models, points)]


def alpha_lru(inst: Instance, points) -> list[float]:
    """P(model i's cached prefix was evicted since its previous request), LRU by whole model.

    After a request of i, each following TPU request is model j with probability pi_j = lambda_j / lambda_TPU.
    Model i is evicted before its next request iff the distinct set S of other models requested meanwhile
    satisfies f_i + sum_{j in S} f_j > C (every model outside S is older than i and goes first). P(the
    requests in between all lie in T) = pi_i / (1 - pi_T); inclusion-exclusion gives P(exactly S)."""
    on_tpu = tuple(i for i, p in enumerate(points) if p > 0)
    lam = sum(inst.models[i].rate for i in on_tpu)
    out = [0.0] * len(points)
    if len(on_tpu) <= 1 or lam <= 0:
        return out
    cap = inst.capacity
    foot = {i: min(inst.models[i].footprint[points[i]], cap) for i in on_tpu}
    for i, sets in zip(on_tpu, _between(tuple(inst.models[i].rate / lam for i in on_tpu))):
        miss = sum(prob for members, prob in sets
                   if foot[i] + sum(foot[on_tpu[j]] for j in members) > cap)
        out[i] = min(1.0, max(0.0, miss))
    return out


@lru_cache(maxsize=4096)
def _between(pi: tuple[float, ...]) -> tuple[tuple[tuple[tuple[int, ...], float], ...], ...]:
    """For each model k (by position), every set S of the others with P(exactly S are requested between two
    requests of k) — it depends on the request mix only, so it is computed once per mix."""
    out = []
    for k, pk in enumerate(pi):
        others = [j for j in range(len(pi)) if j != k]
        subsets = [c for r in range(len(others) + 1) for c in combinations(others, r)]
        within = {}
        for t in subsets:
            rest = sum(pi[j] for j in t)
            within[t] = pk / (1.0 - rest) if rest < 1 else 0.0
        sets = []
        for s in subsets:
            exact = sum((-1) ** (len(s) - len(t)) * within[t] for t in subsets if set(t) <= set(s))
            if pk > 0 and s:
                sets.append((s, exact))
        out.append(tuple(sets))
    return tuple(out)


def erlang_c(c: int, a: float) -> float:
    """Probability of waiting in M/M/c with offered load a = lambda / mu (< c)."""
    term, total = 1.0, 1.0
    for n in range(1, c):
        term *= a / n
        total += term
    last = term * a / c / (1.0 - a / c)
    return last / (total + last)


@lru_cache(maxsize=65536)
def pool_waits(lam: float, s: float, c: int) -> tuple[float, float]:
    """Mean waits of M/D/c and M/M/c with mean service s: (Cosmetatos' M/D/c, Erlang C's M/M/c)."""
    if lam <= 0 or s <= 0:
        return 0.0, 0.0
    if lam * s >= c:
        return INF, INF
    return mdc_formula(lam, s, c), mmc_formula(lam, s, c)


def wait_mdc(lam: float, s: float, c: int) -> float:
    """Mean wait of M/D/c (service s): Cosmetatos' correction of half the M/M/c wait."""
    return pool_waits(lam, s, c)[0]


def mmc_formula(lam, s, c: int):
    """The M/M/c mean wait of a stable, busy pool (Erlang C); floats or numpy arrays alike."""
    a = lam * s
    return erlang_c(c, a) * s / (c - a)


def mdc_formula(lam, s, c: int):
    """wait_mdc for a stable, busy pool; floats or numpy arrays of lam and s alike (batch.py fills tables)."""
    a = lam * s
    rho = a / c
    correction = 1.0 + (1.0 - rho) * (c - 1) * (math.sqrt(4 + 5 * c) - 2) / (16 * rho * c)
    return 0.5 * mmc_formula(lam, s, c) * correction


def wait_eq3(lam: float, s: float, k: int) -> float:
    """Eq. (3): E[W] = 1/2 (1/(k mu - lambda) - 1/(k mu))."""
    if lam <= 0 or s <= 0:
        return 0.0
    if lam * s >= k:
        return INF
    return eq3_formula(lam, s, k)


def eq3_formula(lam, s, k: int):
    """wait_eq3 for a stable, busy pool; floats or numpy arrays alike."""
    mu = 1.0 / s
    return 0.5 * (1.0 / (k * mu - lam) - 1.0 / (k * mu))  # eq. (3)


@dataclass(frozen=True)
class TpuState:
    """What the TPU queue gives every model under a partitioning (eqs. (1), (2), (10))."""

    feasible: bool
    part: tuple[float, ...]  # per model: transfers + E[W^TPU] + alpha T^Load + s^TPU (0 without a prefix)
    rho: float
    lam: float
    scv_service: float


def tpu_state(inst: Instance, points, variant: str = "refined", use_alpha: bool = True) -> TpuState:
    models = inst.models
    n = len(models)
    refined = variant == "refined"
    alpha = [0.0] * n if not use_alpha else (alpha_lru if refined else alpha_paper)(inst, points)
    on_tpu = [i for i in range(n) if points[i] > 0]
    lam_tpu = sum(models[i].rate for i in on_tpu)  # lambda^TPU
    if lam_tpu <= 0:
        return TpuState(True, tuple(_prefix_time(models[i], points[i], 0.0, alpha[i], refined) if points[i] > 0
                                    else 0.0 for i in range(n)), 0.0, 0.0, 0.0)
    es = es2 = 0.0
    for i in on_tpu:
        m, p = models[i], points[i]
        base = m.tpu_mean[p] + m.io[p] if refined else m.s_tpu[p]
        var = m.tpu_var[p] if refined else 0.0
        w = m.rate / lam_tpu
        es += w * (alpha[i] * m.t_load[p] + base)  # eq. (2)
        es2 += w * (alpha[i] * (m.t_load[p] + base) ** 2 + (1 - alpha[i]) * base**2 + var)
    rho = lam_tpu * es
    if rho >= 1:
        return TpuState(False, tuple([INF] * n), rho, lam_tpu, 0.0)
    w_tpu = lam_tpu * es2 / (2 * (1 - rho))  # eq. (1)
    part = tuple(_prefix_time(models[i], points[i], w_tpu, alpha[i], refined) if points[i] > 0 else 0.0
                 for i in range(n))
    return TpuState(True, part, rho, lam_tpu, es2 / es**2 - 1 if es > 0 else 0.0)


def _prefix_time(m, p: int, w_tpu: float, alpha: float, refined: bool) -> float:
    return m.io[p] + w_tpu + alpha * m.t_load[p] + (m.tpu_mean if refined else m.s_tpu)[p]  # eq. (4), TPU part


def cpu_part(m, p: int, k: int, tpu: TpuState, variant: str = "refined") -> float:
    """E[W^CPU] + s^CPU of model ``m``'s suffix at point ``p`` on ``k`` cores (eq. (4), CPU part); inf when
    the pool is unstable or has no core; 0 without a suffix."""
    if p >= m.last:
        return 0.0
    s = cpu_service(m, p, variant)
    if k < 1 or m.rate * s >= k:
        return INF
    if variant == "refined":
        scv_in = 1.0
        if p > 0 and tpu.lam > 0:  # QNA: the TPU's departures, then the split to this model
            scv_dep = tpu.rho**2 * tpu.scv_service + (1 - tpu.rho**2) * 1.0
            share = m.rate / tpu.lam
            scv_in = share * scv_dep + (1 - share)
        w_md, w_mm = pool_waits(m.rate, s, k)
        return scv_in * w_md + m.cpu_scv[p] * (w_mm - w_md) + s
    return wait_eq3(m.rate, s, k) + s  # eq. (3)


def cpu_service(m, p: int, variant: str) -> float:
    """s^CPU of the suffix at ``p`` as the variant reads it: the samples' mean (refined) or the profile's
    one-core latency (paper)."""
    return m.cpu_mean[p] if variant == "refined" else m.s_cpu[p]


def evaluate(inst: Instance, config: Config, variant: str = "refined", use_alpha: bool = True) -> Evaluation:
    """T^e2e per model (eq. (4)) and the objective (eq. (5)) of ``config``; infinite when unstable.

    ``use_alpha=False`` is the SwapLess (alpha = 0) baseline."""
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}: expected one of {', '.join(VARIANTS)}")
    models = inst.models
    n = len(models)
    tpu = tpu_state(inst, config.points, variant, use_alpha)
    util = {"TPU": tpu.rho} if tpu.lam > 0 else {}
    if not tpu.feasible:
        return _infeasible(n, "TPU", util)
    latency = []
    for i, m in enumerate(models):
        p, k = config.points[i], config.cores[i]
        load = m.rate * cpu_service(m, p, variant)
        if p < m.last:
            util[f"CPU pool of {m.name}"] = load / k if k else INF
        c = cpu_part(m, p, k, tpu, variant)
        if c == INF:
            why = "no core for its suffix" if k < 1 else f"utilisation {load / k:.2f}"
            return _infeasible(n, f"CPU pool of {m.name} ({why})", util)
        latency.append(tpu.part[i] + c)
    objective = sum(m.rate * t for m, t in zip(models, latency))  # eq. (5)
    return Evaluation(tuple(latency), objective, True, "", util)


def _infeasible(n: int, where: str, util: dict) -> Evaluation:
    return Evaluation(tuple([INF] * n), INF, False, where, util)


def check_config(inst: Instance, config: Config) -> None:
    """Constraints (6)-(9); raises ValueError naming the first one broken."""
    if len(config.points) != len(inst.models) or len(config.cores) != len(inst.models):
        raise ValueError("a point and a core count per model")
    for m, p, k in zip(inst.models, config.points, config.cores):
        if not 0 <= p <= m.last:  # (6)
            raise ValueError(f"{m.name}: point {p} outside 0..{m.last} (6)")
        if not 0 <= k <= inst.cores:  # (7)
            raise ValueError(f"{m.name}: {k} cores outside 0..{inst.cores} (7)")
        has_suffix = p < m.last
        if not (int(has_suffix) <= k <= inst.cores * int(has_suffix)):  # (8)
            raise ValueError(f"{m.name}: {k} cores with {'a' if has_suffix else 'no'} CPU suffix (8)")
    if sum(config.cores) > inst.cores:  # (9)
        raise ValueError(f"{sum(config.cores)} cores allocated, {inst.cores} available (9)")
