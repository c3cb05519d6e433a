"""The two decentralised baselines of ADaPS §5, as partitions scored and run like ADaPS's own.

- BBGraP-like: every layer split in equal parts, one per device, no device speeds, neighbours exchange rows
  after every layer (no overlap, so no fusion).
- EdgeFlow-like: device speeds, no overlapped outputs (neighbours share no row), and each layer chosen given
  only the layer before it (adjacent layers): the forward pass of eq. (12) over overlap-free spaces.

On a multi-path region (``paths``) both go sub-block by sub-block, as ``paths.search_paths`` does for ADaPS: each
sub-block a chain whose first layer reads what the sub-blocks before it left where they left it.
"""
from __future__ import annotations

import time

from edgeplan.plan.spatial.cost import Device, Layer, check_rows, equal, network_score
from edgeplan.plan.spatial.paths import PathPlan, Paths, entry, search_paths
from edgeplan.plan.spatial.search import Counters, Plan, costs_of, search_network


def bbgrap(layers: list[Layer], devices: tuple[Device, ...]) -> Plan:
    t0 = time.process_time()
    for x in layers:
        check_rows(x.out_size, len(devices), f"layer {x.name!r}")
    plan = tuple(equal(x.out_size, len(devices)) for x in layers)
    return Plan(plan, network_score(costs_of(layers, devices), list(plan)), Counters(), time.process_time() - t0)


def edgeflow(layers: list[Layer], devices: tuple[Device, ...], threshold: float) -> Plan:
    return search_network(layers, devices, threshold, overlap=False, revise=False)


def bbgrap_paths(paths: Paths, devices: tuple[Device, ...]) -> PathPlan:
    t0 = time.process_time()
    planned, score = {}, 0.0
    for block in paths.blocks:
        layers = [paths.layers[i].layer for i in block.layers]
        part = bbgrap(layers, devices).partitions
        score += network_score(costs_of(layers, devices), list(part), entry(paths, block, planned, devices))
        planned.update(zip(block.layers, part))
    return PathPlan(tuple(planned[i] for i in range(len(paths.layers))), score, Counters(), time.process_time() - t0)


def edgeflow_paths(paths: Paths, devices: tuple[Device, ...], threshold: float) -> PathPlan:
    return search_paths(paths, devices, threshold, overlap=False, revise=False)
