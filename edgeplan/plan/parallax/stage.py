"""``parallax/`` of a model's artifact directory (``edgeplan parallax``): for the whole int8 model and every
point's CPU suffix, the Parallax plan measured on this host — candidates within the budget, per-layer times,
the choices confirmed end to end — its sub-models cut from that int8 model, and the check that running them
branch-parallel gives the model's bits with both kernel sets.

``parallax/parallax.json``: per target (``model``, ``p1``, ...), its model file and sha256, the layer table
(branches, tasks, times, mode and why), the end-to-end times (whole model on W threads, the plan) and the
stages (sub-model files, sha256, sizes, input and output tensor names, estimated arenas). A target with no
branch-parallel layer has no stages: the runtime runs its own model file, uncut.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

import numpy as np

from edgeplan.plan.parallax import measure, schedule
from edgeplan.quantize import litert
from edgeplan.quantize.tflite_graph import TfliteGraph
from edgeplan.runtime.parallel import ParallelRunner, interpreter_for
from edgeplan.runtime.stream import invoke_named

SCHEMA = 1


def budget_bytes(settings: dict) -> int:
    """``parallax.budget_bytes`` when set, else MemAvailable x (1 - ``parallax.margin``) (§3.3)."""
    if settings.get("budget_bytes"):
        return int(settings["budget_bytes"])
    with open("/proc/meminfo") as f:
        available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))
    return int(available * (1 - float(settings["margin"])))


def targets(root: Path) -> dict[str, str]:
    """Target name -> model file (relative to ``root``): the int8 model, then every point's CPU suffix."""
    out = {"model": "model_int8.tflite"}
    points = sorted((p for p in (root / "segments").glob("p*") if p.name[1:].isdigit()), key=lambda p: int(p.name[1:]))
    for p in points:
        if (p / "suffix_int8.tflite").is_file():
            out[p.name] = f"segments/{p.name}/suffix_int8.tflite"
    return out


def plan_target(graph: TfliteGraph, settings: dict, budget: int) -> tuple[schedule.ParallaxPlan, dict]:
    workers = int(settings["workers"])
    cands = schedule.candidates(graph, workers=workers, budget_bytes=budget, min_nodes=int(settings["min_nodes"]),
                                beta=float(settings["beta"]))
    live = measure.activations(graph)
    layers = measure.measure(graph, cands, workers=workers, repeats=int(settings["repeats"]), live=live)
    if settings.get("force"):  # every measured candidate branch-parallel, unconfirmed (what cutting costs)
        forced = [replace(layer, mode="branches", why="forced (parallax.force)") if layer.task_ms else layer
                  for layer in layers]
        return schedule.plan(graph, forced, workers=workers, budget_bytes=budget), {
            "whole_ms": None, "plan_ms": None, "trials": [], "final": None}
    confirmed, checks = measure.confirm(graph, layers, workers=workers, budget_bytes=budget,
                                       repeats=int(settings["confirm_repeats"]),
                                       min_gain=float(settings["confirm_min_gain"]), live=live)
    return schedule.plan(graph, confirmed, workers=workers, budget_bytes=budget), checks


def identical(graph: TfliteGraph, stages, workers: int, samples: int, seed: int) -> dict[str, bool]:
    rng = np.random.default_rng(seed)
    out = {}
    for kernels, deterministic in (("reference", True), ("xnnpack", False)):
        runner = ParallelRunner(stages, interpreter_for(deterministic), workers=workers)
        whole = litert.interpreter(graph.data, deterministic=deterministic)
        same = True
        for _ in range(samples):
            x = {d["name"]: litert.random_value(d["shape"], d["dtype"], rng) for d in whole.get_input_details()}
            want, got = invoke_named(whole, x), runner.run(x)
            same &= want.keys() == got.keys() and all(np.array_equal(want[k], got[k]) for k in want)
        out[kernels] = bool(same)
    return out


def build(root: Path, settings: dict, seed: int, progress: Callable[[str, int, int], None]) -> dict:
    """Write ``root/parallax/`` (replacing it) and return what ``parallax.json`` holds."""
    out = root / "parallax"
    if out.exists():
        shutil.rmtree(out)
    budget = budget_bytes(settings)
    found = targets(root)
    record: dict = {"schema": SCHEMA, "workers": int(settings["workers"]), "budget_bytes": budget,
                    "settings": settings, "targets": {}}
    seen: dict[str, str] = {}
    for k, (name, rel) in enumerate(found.items()):
        progress("parallax", k, len(found))
        data = (root / rel).read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        if sha in seen:  # a suffix that is the whole model: one plan
            record["targets"][name] = {"same_as": seen[sha], "file": rel, "sha256": sha}
            continue
        seen[sha] = name
        graph = TfliteGraph(data)
        plan, checks = plan_target(graph, settings, budget)
        stages = measure.runtime_stages(graph, plan, f"{name}")
        cut = [] if plan.parallel_layers == 0 else stages
        files = []
        for st, sp in zip(cut, plan.stages):
            subs = []
            for s, est, outs in zip(st.submodels, sp.peak_bytes, sp.outputs):
                path = out / name / f"{s.name}.tflite"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(s.data)
                ins = [d["name"] for d in litert.interpreter(s.data).get_input_details()]
                subs.append({"name": s.name, "file": str(path.relative_to(root)), "threads": s.threads,
                             "sha256": hashlib.sha256(s.data).hexdigest(), "bytes": len(s.data), "inputs": ins,
                             "outputs": [graph.tensors[i].name for i in outs], "estimated_arena_bytes": est})
            files.append({"layer": st.layer, "submodels": subs})
        record["targets"][name] = {
            "file": rel, "sha256": sha, "ops": len(graph.ops), "parallel_layers": plan.parallel_layers,
            "why": plan.why, "whole_ms": checks["whole_ms"], "plan_ms": checks["plan_ms"], "trials": checks["trials"],
            "layers": [asdict(layer) for layer in plan.layers if layer.branches > 1], "stages": files,
            "identical": identical(graph, stages, plan.workers, int(settings["verify_samples"]), seed)}
    progress("parallax", len(found), len(found))
    out.mkdir(parents=True, exist_ok=True)
    (out / "parallax.json").write_text(json.dumps(record, indent=1) + "\n")
    return record
