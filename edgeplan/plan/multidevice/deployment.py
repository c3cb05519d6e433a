"""``edgeplan plan autodice``: a deployment's model split into consecutive layers over the registry's devices
(AutoDiCE, pipeline side).

The deployment's devices are the fleet registry's devices assigned to it, in registry order (the platform:
cores from their class, host, link, power and cpu quota as registered). The model's units (the layers the int8
model fuses, ``units.find``) are timed here, each alone on 1 thread and on all cores (``costs.measure``: on the
machine that plans, a device's time taken as this machine's ÷ its class's ``cpu_quota``; what a rank costs beyond
its invokes is not measured here yet — ``overhead.measure`` needs MPI jobs on the devices — so the plan predicts
with none, and says so in ``costs.rank_overhead``); NSGA-II explores cuts
and resources (``explore.explore``, params ``multidevice``); the Pareto point best on the objective asked
(throughput, memory or modelled energy) is split (``surgery/multidevice.split``: float and int8 stages, verified
before anything is written) into ``deployments/<name>/multidevice/``, and ``plans/autodice.json`` records the
devices, the front (every point predicted, energy modelled), the point chosen and its split; ``plans/autodice.png``
plots the front.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from edgeplan.artifacts import write_json_atomic
from edgeplan.errors import PlanError
from edgeplan.runtime.split import PLANNERS

PLAN_FILE = "plans/autodice.json"
PLOT_FILE = "plans/autodice.png"
SPLIT_DIR = PLANNERS["autodice"].dir  # where pull looks for it
SCHEMA = 1
OBJECTIVES = {"throughput": lambda p: (p.period_s, p.memory_bytes), "memory": lambda p: (p.memory_bytes, p.period_s),
              "energy": lambda p: (p.energy_j, p.period_s)}


def plan_autodice(root: Path, name: str, params: dict, objective: str | None = None,
                  generations: int | None = None, progress=lambda done, total: None) -> tuple[dict, Path]:
    from edgeplan.graph.model import weights_folder
    from edgeplan.pipeline.multidevice import load
    from edgeplan.pipeline.planning import keep_split, registry_platform, split_model
    from edgeplan.plan.multidevice import costs as costs_mod
    from edgeplan.plan.multidevice import explore, spec, units
    from edgeplan.surgery import multidevice

    settings = params["multidevice"]
    objective = objective or settings["objective"]
    if objective not in OBJECTIVES:
        raise PlanError(f"objective {objective!r}: one of {', '.join(OBJECTIVES)}")
    generations = int(settings["generations"] if generations is None else generations)
    if generations < 1:
        raise PlanError(f"generations {generations}: at least 1")
    model_name, version, d = split_model(root, params, name, "an AutoDiCE split")
    _, platform = registry_platform(params, name, "an AutoDiCE split")
    model, graph, cal, xs = load(d, params)
    us = units.find(model, graph, xs, min_cosine=params["quantize"]["match_min_cosine"],
                    folder=weights_folder(d / "model.onnx"))
    order = multidevice.unit_order(us)
    cores = min(max(len(x.slots) for x in platform.devices), os.cpu_count() or 1)
    costs = costs_mod.measure(graph, us, order, cores, repeats=int(settings["repeats"]), progress=progress)
    front, stats = explore.explore(costs, us, platform, population=int(settings["population"]),
                                   generations=generations, mutation=float(settings["mutation"]),
                                   crossover=float(settings["crossover"]), seed=int(settings["seed"]))
    chosen = min(range(len(front)), key=lambda k: OBJECTIVES[objective](front[k]))
    out_dir = Path(root) / "deployments" / name
    mapping = spec.parse_mapping(front[chosen].mapping, platform, us, f"Pareto point {chosen}")
    summary = multidevice.split(d, us, mapping, platform, out_dir / SPLIT_DIR, seed=cal.seed, loaded=(model, graph))
    single = explore.single_device(costs, us, platform)
    record = {
        "schema_version": SCHEMA, "deployment": name, "model": model_name, "version": version,
        "model_int8_sha256": summary["model"]["int8_sha256"], "objective": objective,
        "devices": [{"id": x.name, "host": x.host, "cores": len(x.slots), "cpu_quota": x.cpu_quota,
                     "net_bytes_per_s": x.net_bytes_per_s, "power_w": x.power_w} for x in platform.devices],
        "costs": {"units": len(order), "cores": cores, "measured_on": os.uname().nodename,
                  "ms_1_core": float(costs.ms[:, 0].sum()), "ms_all_cores": float(costs.ms[:, 1].sum()),
                  "rank_overhead": {**costs.rank_overhead.to_json(), "measured": False}},
        "explore": stats,
        "front": [_point(p) for p in front],
        "single_device": _point(single),
        "chosen": chosen,
        "split": {"dir": SPLIT_DIR, "tables_sha256": hashlib.sha256(
            (out_dir / SPLIT_DIR / "tables.json").read_bytes()).hexdigest(),
                  **{k: summary[k] for k in ("ranks", "stages", "buffers", "buffer_bytes", "per_rank")},
                  "verify": {k: v for k, v in summary["verify"].items() if k not in ("ok", "why")}},
    }
    out = out_dir / PLAN_FILE
    write_json_atomic(out, record)
    keep_split(root, name, "autodice")
    plot(record, out_dir / PLOT_FILE)
    return record, out


def _point(p) -> dict:
    return {"period_s": p.period_s, "throughput_fps": p.throughput, "memory_bytes": p.memory_bytes,
            "energy_j_modelled": p.energy_j, "resources": ["all cores" if r else "1 core" for r in p.resources],
            "mapping": {k: len(v) for k, v in p.mapping.items()}}


def plot(record: dict, path: Path) -> None:
    """The Pareto front: predicted throughput against predicted memory, modelled energy as colour, the point
    chosen and the single device marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    front = record["front"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    sc = ax.scatter([p["memory_bytes"] / 1e6 for p in front], [p["throughput_fps"] for p in front],
                    c=[p["energy_j_modelled"] for p in front], cmap="viridis", label="Pareto points (predicted)")
    fig.colorbar(sc, ax=ax, label="energy per frame, J (modelled)")
    c, s = front[record["chosen"]], record["single_device"]
    ax.scatter([c["memory_bytes"] / 1e6], [c["throughput_fps"]], s=160, facecolors="none", edgecolors="red",
               label=f"chosen ({record['objective']})")
    ax.scatter([s["memory_bytes"] / 1e6], [s["throughput_fps"]], marker="x", color="black", label="one device")
    ax.set_xlabel("largest device's weights + activations, MB (predicted)")
    ax.set_ylabel("throughput, frames/s (predicted)")
    ax.set_title(f"AutoDiCE: {record['model']} {record['version']} over {len(record['devices'])} devices")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
