"""The two decentralised baselines of ADaPS §5, as partitions scored and run like ADaPS's own.

- BBGraP-like: every layer split in equal parts, one per device, no device speeds, neighbours exchange rows
  after every layer (no overlap, so no fusion).
- EdgeFlow-like: device speeds, no overlapped outputs (neighbours share no row), and each layer chosen given
  only the layer before it (adjacent layers): the forward pass of eq. (12) over overlap-free spaces.
"""
from __future__ import annotations

import time

from edgeplan.plan.spatial.cost import Device, Layer, check_rows, equal, network_score
from edgeplan.plan.spatial.search import Counters, Plan, costs_of, search_network


def bbgrap(layers: list[Layer], devices: tuple[Device, ...]) -> Plan:
    t0 = time.process_time()
    for x in layers:
        check_rows(x.out_size, len(devices), f"layer {x.name!r}")
    plan = tuple(equal(x.out_size, len(devices)) for x in layers)
    return Plan(plan, network_score(costs_of(layers, devices), list(plan)), Counters(), time.process_time() - t0)


def edgeflow(layers: list[Layer], devices: tuple[Device, ...], threshold: float) -> Plan:
    return search_network(layers, devices, threshold, overlap=False, revise=False)
