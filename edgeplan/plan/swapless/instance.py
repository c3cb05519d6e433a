"""A SwapLess problem instance: models with their per-point service times, a core budget and a TPU cache.

Times are in seconds and rates in requests per second inside the planner (profiles are in ms).
numpy and the standard library only: the device runtime builds instances from its bundle's profiles.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelSpec:
    """One model of a deployment, indexed by partition point p = 0..P (SwapLess §III-B, Table I).

    ``s_tpu[p]``: service time of the prefix [1:p] on the TPU (s^TPU, streaming of parameters that do not fit
    on chip included); ``io[p]``: d_in/B + d_out/B; ``t_load[p]``: T^Load, reloading the prefix's cached
    parameters; ``footprint[p]``: its on-chip parameter bytes (size(M_i, [1:p]) of eq. (10));
    ``s_cpu[p]``: the suffix [p+1:P] on one core (s^CPU). Entries for p = 0 (no prefix) and the suffix of
    p = P are 0. ``*_samples[p]``: raw service-time samples (s) for the simulator; empty means deterministic.

    Derived from the samples (for the ``refined`` queueing model, which needs the mean service time and its
    spread rather than the profile's median): ``tpu_mean``/``tpu_var`` and ``cpu_mean``/``cpu_scv`` per point;
    without samples, the point's s and no spread."""

    name: str
    rate: float
    s_tpu: tuple[float, ...]
    io: tuple[float, ...]
    t_load: tuple[float, ...]
    footprint: tuple[int, ...]
    s_cpu: tuple[float, ...]
    tpu_samples: tuple[tuple[float, ...], ...] = ()
    cpu_samples: tuple[tuple[float, ...], ...] = ()
    tpu_mean: tuple[float, ...] = field(init=False, repr=False, compare=False)
    tpu_var: tuple[float, ...] = field(init=False, repr=False, compare=False)
    cpu_mean: tuple[float, ...] = field(init=False, repr=False, compare=False)
    cpu_scv: tuple[float, ...] = field(init=False, repr=False, compare=False)
    # what is derived from the per-point figures, not the rate, by whoever derives it (``batch.BatchScorer``'s
    # tables), kept once per model: every ``with_rate`` copy shares it (the runtime re-allocates as rates drift)
    derived: dict = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self):
        n = len(self.s_tpu)
        for name in ("io", "t_load", "footprint", "s_cpu"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"model {self.name}: {name} has {len(getattr(self, name))} entries, s_tpu has {n}")
        if n < 2:
            raise ValueError(f"model {self.name}: needs at least points 0 and P")
        if self.rate < 0:
            raise ValueError(f"model {self.name}: negative rate")
        tpu = [_moments(s, x) for s, x in zip(self.s_tpu, self.tpu_samples or [()] * n)]
        cpu = [_moments(s, x) for s, x in zip(self.s_cpu, self.cpu_samples or [()] * n)]
        object.__setattr__(self, "tpu_mean", tuple(m for m, _ in tpu))
        object.__setattr__(self, "tpu_var", tuple(v for _, v in tpu))
        object.__setattr__(self, "cpu_mean", tuple(m for m, _ in cpu))
        object.__setattr__(self, "cpu_scv", tuple(v / m**2 if m > 0 and math.isfinite(m) else 0.0 for m, v in cpu))

    @property
    def last(self) -> int:
        """P: the all-TPU point."""
        return len(self.s_tpu) - 1

    def with_rate(self, rate: float) -> ModelSpec:
        out = ModelSpec(self.name, rate, self.s_tpu, self.io, self.t_load, self.footprint, self.s_cpu,
                        self.tpu_samples, self.cpu_samples)
        object.__setattr__(out, "derived", self.derived)  # (frozen) the same per-point figures, the same cache
        return out


def _moments(fixed: float, samples) -> tuple[float, float]:
    """(mean, variance) of a service time: the samples' when there are any (and the time is usable)."""
    if not samples or not math.isfinite(fixed):
        return fixed, 0.0
    mean = math.fsum(samples) / len(samples)
    return mean, math.fsum((x - mean) ** 2 for x in samples) / len(samples)


@dataclass(frozen=True)
class Instance:
    models: tuple[ModelSpec, ...]
    cores: int  # K_max
    capacity: int  # C, bytes of on-chip parameter cache

    @property
    def rates(self) -> tuple[float, ...]:
        return tuple(m.rate for m in self.models)

    def with_rates(self, rates) -> Instance:
        return Instance(tuple(m.with_rate(r) for m, r in zip(self.models, rates)), self.cores, self.capacity)


@dataclass(frozen=True)
class Config:
    """A global partitioning P = (p_1..p_n) and core allocation K = (k_1..k_n)."""

    points: tuple[int, ...]
    cores: tuple[int, ...]


@dataclass(frozen=True)
class Evaluation:
    """The analytic model's verdict on one configuration."""

    latency: tuple[float, ...]  # T^e2e per model, s (inf when unstable)
    objective: float  # eq. (5): sum of lambda_i * T_i (inf when unstable)
    feasible: bool
    bottleneck: str = ""  # the saturated resource when infeasible ("TPU", "CPU pool of <model>", ...)
    utilisation: dict = field(default_factory=dict)  # resource -> rho

    @property
    def mean_latency(self) -> float:
        return self.objective
