"""The paper's baselines (SwapLess §V-A):

- ``compiler_default`` — the Edge TPU compiler's deployment: every model wholly on the TPU, co-compiled, the
  cache filled in model order; inter-model swaps happen as they will (the analytic model's alpha);
- ``threshold`` — per model, from the last layer back, offload a layer to the CPU while its CPU time is
  within 10% of its TPU time; cores by PROPALLOC; blind to queueing and to the other tenants;
- ``alpha_zero`` — SwapLess planning with alpha = 0 (no inter-model swapping in its model), judged with it.
"""
from __future__ import annotations

from edgeplan.plan.swapless.allocate import propalloc, refined
from edgeplan.plan.swapless.instance import Config, Instance
from edgeplan.plan.swapless.queueing import INF, evaluate


def compiler_default(inst: Instance, variant: str = "refined") -> tuple[Config, float]:
    """(configuration, objective): all models at point P, no CPU cores (objective inf when the TPU saturates)."""
    config = Config(tuple(m.last for m in inst.models), tuple(0 for _ in inst.models))
    return config, evaluate(inst, config, variant).objective


def threshold(inst: Instance, variant: str = "refined", margin: float = 0.10) -> tuple[Config | None, float]:
    points = []
    for m in inst.models:
        p = m.last
        while p > 0:
            cpu = m.s_cpu[p - 1] - m.s_cpu[p]  # the layers between points p-1 and p on the CPU ...
            tpu = m.s_tpu[p] - m.s_tpu[p - 1]  # ... and on the TPU
            if cpu <= (1 + margin) * tpu:
                p -= 1
            else:
                break
        points.append(p)
    cores = propalloc(inst, points)
    if cores is None:
        return None, INF
    config = Config(tuple(points), cores)
    return config, evaluate(inst, config, variant).objective


def alpha_zero(inst: Instance, variant: str = "refined") -> tuple[Config | None, float]:
    """Planned as if no model ever evicted another, then judged with the swaps."""
    found = refined(inst, variant, use_alpha=False)
    if found.config is None:
        return None, INF
    return found.config, evaluate(inst, found.config, variant).objective
