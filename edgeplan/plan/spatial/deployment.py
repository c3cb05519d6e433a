"""``edgeplan plan spatial``: a deployment's model split spatially over the registry's devices (ADaPS, pipeline side).

The deployment's devices are the fleet registry's devices assigned to it, in registry order; the first is the head
(it scatters the input, gathers the region's end and runs the rest of the model). Each device's speed_d is its
class's conv-speed fit in the model's ``profiles/<class>.json`` (``edgeplan profile run --conv-speed``, measured
under the class's ``cpu_quota`` when it has one), BW_d the class's ``net_bytes_per_s``. The search (eq. (12),
``search.search_network``) runs along each of the dimensions asked at the threshold asked, over the chain region
(``blocks.region``) or, where path analysis finds a larger multi-path one (``paths``: a residual network), over its
sub-blocks (``paths.search_paths``); the dimension whose plan scores best is cut into int8 tiles
(``surgery/spatial.split``: verified identical to the int8 model with both kernel sets, and its float tiles equal
to the float model, before anything is written) under
``deployments/<name>/spatial/``, and ``plans/spatial.json`` records the devices and their speeds, each
dimension's score and search counters, the plan and its tiles.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict
from pathlib import Path

import onnx

from edgeplan.artifacts import write_json_atomic
from edgeplan.errors import PlanError, ProfileError
from edgeplan.runtime.split import PLANNERS

PLAN_FILE = "plans/spatial.json"
SPLIT_DIR = PLANNERS["spatial"].dir  # where pull looks for it
SCHEMA = 1


def devices_of(params: dict, name: str, model_dir: Path):
    """(the registry's devices serving ``name`` as a multi-device platform, their ``cost.Device``s)."""
    from edgeplan.pipeline.planning import registry_platform
    from edgeplan.plan.spatial.cost import Device
    from edgeplan.profile.schema import Profile

    fleet, platform = registry_platform(params, name, "a spatial split")
    ids = [x.name for x in platform.devices]
    devices = []
    for dev_id in ids:
        cls = fleet.device_class(fleet.device(dev_id).device_class)
        path = model_dir / "profiles" / f"{cls.name}.json"
        run = f"`edgeplan profile run {model_dir} --device-class {cls.name} --conv-speed`"
        if not path.is_file():
            raise ProfileError(f"device {dev_id}: class {cls.name!r} has no profile of this model ({path}); run {run}")
        speed = Profile.load(path).conv_speed
        if speed is None:
            raise ProfileError(f"device {dev_id}: {path} has no conv speed measured; run {run}")
        if speed.quota != cls.cpu_quota:
            raise ProfileError(f"device {dev_id}: {path}'s conv speed was measured under cpu quota {speed.quota}, the "
                               f"class now has {cls.cpu_quota}; run {run}")
        if cls.net_bytes_per_s is None:
            raise PlanError(f"device class {cls.name!r}: no net_bytes_per_s (the device's link) in the fleet registry")
        devices.append(Device(dev_id, speed.s_per_mac, cls.net_bytes_per_s, speed.s_per_layer))
    return platform, tuple(devices)


def plan_spatial(root: Path, name: str, params: dict, threshold: float | None = None,
                 dims: tuple[str, ...] | None = None) -> tuple[dict, Path]:
    from edgeplan.graph.model import GraphView
    from edgeplan.pipeline.planning import keep_split, split_model
    from edgeplan.plan.spatial import blocks, paths, search
    from edgeplan.plan.spatial.blocks import AXES
    from edgeplan.surgery import spatial as tiles

    settings = params["spatial"]
    threshold = float(settings["threshold"] if threshold is None else threshold)
    if not 0 < threshold <= 1:
        raise PlanError(f"threshold {threshold:g}: the smallest share a device may take of a layer is in (0, 1]")
    dims = tuple(dims or settings["dims"])
    bad = [x for x in dims if x not in AXES]
    if bad or not dims:
        raise PlanError(f"dimensions {','.join(dims) or '(none)'}: partition along H, W or H,W")
    model, version, d = split_model(root, params, name, "a spatial split")
    platform, devices = devices_of(params, name, d)
    view = GraphView(onnx.load(str(d / "model.onnx"), load_external_data=False))
    searched, plans, regions, multi = {}, {}, {}, {}
    for dim in dims:
        region = regions[dim] = blocks.region(view, dim)
        found = paths.analyse(view, dim)
        if len(found.layers) > len(region.layers):  # path analysis reaches past the first branch
            multi[dim] = found
            plan = paths.search_paths(found, devices, threshold)
            ends, why, layers = ", ".join(found.outputs), found.reason, len(found.layers)
        else:
            plan = search.search_network(list(region.layers), devices, threshold)
            ends, why, layers = region.output, region.reason, len(region.layers)
        plans[dim] = plan
        searched[dim] = {"score_s": plan.score, "search_s": plan.seconds, "layers": layers,
                         "sub_blocks": len(multi[dim].blocks) if dim in multi else 1,
                         "region_end": ends, "why_it_ends": why, **asdict(plan.counters)}
    best = min(dims, key=lambda k: plans[k].score)
    out_dir = Path(root) / "deployments" / name
    summary = tiles.split(d, list(plans[best].partitions), list(platform.devices), out_dir / SPLIT_DIR,
                          axis=AXES[best] - 1, samples=int(settings["verify_samples"]),
                          seed=int(params["verify"]["seed"]), region=regions[best], paths=multi.get(best))
    record = {
        "schema_version": SCHEMA, "deployment": name, "model": model, "version": version,
        "model_int8_sha256": summary["model"]["int8_sha256"],
        "threshold": threshold, "axis": best, "score_s": plans[best].score,
        "devices": [{"id": x.name, "host": p.host, "s_per_mac": x.s_per_mac, "s_per_layer": x.s_per_layer,
                     "bytes_per_s": x.bytes_per_s, "cpu_quota": p.cpu_quota} for x, p in zip(devices, platform.devices)],
        "searched": searched,
        "partitions": [[list(iv) for iv in p] for p in plans[best].partitions],
        "tiles": {"dir": SPLIT_DIR, "tables_sha256": hashlib.sha256(
            (out_dir / SPLIT_DIR / "tables.json").read_bytes()).hexdigest(), "stages": summary["stages"],
                  "bytes_per_frame": summary["bytes"],
                  "identical": {k: v for k, v in summary["verify"].items() if k.startswith("int8_")},
                  "float_max_abs_diff": summary["verify"]["float_max_abs_diff"]},
    }
    out = out_dir / PLAN_FILE
    write_json_atomic(out, record)
    keep_split(root, name, "spatial")
    return record, out
