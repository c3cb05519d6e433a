"""``deployments/<name>/plans/swapless.json``: the SwapLess plan of one deployment (DESIGN.md "Deployments").

Chosen partition points and cores with the predicted latency per model; a rate-regime table (the best
configuration over a grid of rates around the expected ones, which the device switches among as its rate
monitor sees the load move); the partitions to preload for fast switching (SwapLess §V-D), within a share of
the device class's RAM; the baselines' predicted latency beside SwapLess's.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from edgeplan.artifacts import _FIELD_TYPES, _Record
from edgeplan.errors import PlanError
from edgeplan.plan.swapless import allocate, baselines
from edgeplan.plan.swapless.instance import Config, Instance
from edgeplan.plan.swapless.queueing import evaluate

RATE_FACTORS = (0.5, 1.0, 2.0)
EXACT_LIMIT = 3000  # partitionings the exact optimiser enumerates at most; beyond, the refined search


@dataclass(frozen=True)
class PlannedModel:
    name: str
    version: str
    rate: float
    last_point: int
    point: int
    cores: int
    predicted_latency_ms: float


@dataclass(frozen=True)
class Regime:
    rates: tuple[float, ...]
    points: tuple[int, ...]
    cores: tuple[int, ...]
    mean_latency_ms: float | None  # rate-weighted mean over the models (None: no stable configuration)


@dataclass(frozen=True)
class Preload:
    model: str
    point: int
    bytes: int
    regimes: int  # how many regimes use it


@dataclass(frozen=True)
class SwapLessPlan(_Record):
    deployment: str
    device_class: str
    variant: str
    cores: int
    capacity_bytes: int
    models: tuple[PlannedModel, ...]
    mean_latency_ms: float
    regimes: tuple[Regime, ...] = ()
    preload: tuple[Preload, ...] = ()
    preload_budget_bytes: int = 0
    baselines: dict = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    tpu_source: str = "emulated"  # "emulated:<emulator model version>" or "measured"
    schema_version: int = 1

    def stable_regimes(self) -> tuple[Regime, ...]:
        """The rate regimes with a configuration (a regime whose rates no configuration keeps stable has no
        points and no cores: how often depends on the profile's times, so on the machine that measured it)."""
        return tuple(r for r in self.regimes if r.points)


def figure_sources(point: int, last: int, tpu_source: str) -> str:
    """What a predicted latency at ``point`` is made of: the Edge TPU prefix (point > 0; EMULATED in
    capitals when the times are modelled, never measured, with the emulator's model version when the plan
    records it: ``emulated:<version>``) and the CPU suffix (point < last). An all-CPU point has no emulated
    figure in it and says so."""
    kind, _, version = tpu_source.partition(":")
    label = ("EMULATED" + (f" ({version})" if version else "")) if kind == "emulated" else tpu_source
    parts = ([f"Edge TPU {label}"] if point > 0 else []) + (
        ["CPU"] if point < last else [])
    return " + ".join(parts)


_FIELD_TYPES.update({("SwapLessPlan", "models"): PlannedModel, ("SwapLessPlan", "regimes"): Regime,
                     ("SwapLessPlan", "preload"): Preload})


def best(inst: Instance, variant: str = "refined", starts=None) -> allocate.Allocation:
    """The exact optimum when the partitionings are few enough, else the refined search (from ``starts`` only
    when given: warm, the online case)."""
    if math.prod(m.last + 1 for m in inst.models) <= EXACT_LIMIT:
        return allocate.exact(inst, variant)
    return allocate.refined(inst, variant, starts=starts)


def bottleneck(inst: Instance, variant: str = "refined") -> str:
    """Why nothing is stable: the least-saturated of the simple configurations, and its worst resource."""
    tries = [tuple(0 for _ in inst.models), tuple(m.last for m in inst.models)]
    found = []
    for points in tries:
        cores = allocate.propalloc(inst, points)
        if cores is None:
            found.append((math.inf, f"{sum(p < m.last for p, m in zip(points, inst.models))} CPU suffixes for "
                                    f"{inst.cores} cores"))
            continue
        ev = evaluate(inst, Config(points, cores), variant)
        worst = max(ev.utilisation.items(), key=lambda kv: kv[1], default=("?", math.inf))
        found.append((worst[1], f"{worst[0]} at utilisation {worst[1]:.2f}"))
    return min(found)[1]


def make(deployment: str, device_class: str, inst: Instance, versions: list[str], segment_bytes,
         ram_budget: int, variant: str = "refined", notes: tuple[str, ...] = (),
         tpu_source: str = "emulated", rate_factors=RATE_FACTORS) -> SwapLessPlan:
    """``segment_bytes(model_index, point)`` -> bytes a device holds to run that partition."""
    chosen = best(inst, variant)
    if chosen.config is None:
        raise PlanError(f"deployment {deployment!r}: no stable configuration at the expected rates "
                        f"({', '.join(f'{m.name} {m.rate:g}/s' for m in inst.models)}); bottleneck: "
                        f"{bottleneck(inst, variant)}")
    ev = evaluate(inst, chosen.config, variant)
    total_rate = sum(inst.rates)
    models = tuple(PlannedModel(m.name, v, m.rate, m.last, p, k, t * 1e3) for m, v, p, k, t in
                   zip(inst.models, versions, chosen.config.points, chosen.config.cores, ev.latency))
    regimes = []
    for factors in itertools.product(rate_factors, repeat=len(inst.models)):
        rates = tuple(r * f for r, f in zip(inst.rates, factors))
        scaled = inst.with_rates(rates)
        found = best(scaled, variant)
        if found.config is None:
            regimes.append(Regime(rates, (), (), None))
        else:
            regimes.append(Regime(rates, found.config.points, found.config.cores,
                                  found.objective / sum(rates) * 1e3))
    use: dict[tuple[int, int], int] = {}
    for r in regimes:
        for i, p in enumerate(r.points):
            use[(i, p)] = use.get((i, p), 0) + 1
    for i, p in enumerate(chosen.config.points):  # the chosen partitions come first, whatever the table says
        use[(i, p)] = 10**6
    preload, spent = [], 0
    for (i, p), n in sorted(use.items(), key=lambda kv: -kv[1]):
        size = segment_bytes(i, p)
        if spent + size <= ram_budget:
            preload.append(Preload(inst.models[i].name, p, size, min(n, len(regimes))))
            spent += size
    base = {}
    for name, (config, objective) in {
        "compiler_default": baselines.compiler_default(inst, variant),
        "threshold": baselines.threshold(inst, variant),
        "alpha_zero": baselines.alpha_zero(inst, variant),
    }.items():
        base[name] = {"points": list(config.points) if config else None, "cores": list(config.cores) if config else None,
                      "mean_latency_ms": objective / total_rate * 1e3 if total_rate and objective < math.inf else None}
    return SwapLessPlan(deployment, device_class, variant, inst.cores, inst.capacity, models,
                        ev.objective / total_rate * 1e3, tuple(regimes), tuple(preload), ram_budget, base, notes,
                        tpu_source)
