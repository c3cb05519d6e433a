"""``edgeplan plan parallax``: which CPU suffixes of a deployment's models run branch-parallel (pipeline side).

Per model of the deployment, after its SwapLess plan: the model stage's ``parallax/parallax.json`` (plans
measured on this host for the int8 model and every point's suffix). W, the workers a suffix may use, is the
stage's ``workers`` when SwapLess gives the model at least that many cores in some regime (§3.3: W ≤ k_i); a
model SwapLess never gives two cores runs every suffix uncut, and so does one whose cores fall between two and
the stage's W (its layers were measured on W workers: re-run the stage with ``parallax.workers`` lowered).
Every point whose suffix has a branch-parallel layer gets its stages; their sub-models are copied under
``deployments/<name>/parallax/<model>/p<k>/`` and named in the plan by sha256 and size. The stage is measured
on this host, so only a class whose CPU is measured here (``cpu: measured``) gets a plan.

Record stdlib only: the device runtime reads it (``runtime/parallel.load_plans``).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from edgeplan.artifacts import _FIELD_TYPES, _Record, staged_dir, write_bytes_atomic
from edgeplan.errors import ArtifactError, PlanError

PLAN_FILE = "plans/parallax.json"


@dataclass(frozen=True)
class PlannedSubModel:
    file: str  # relative to the deployment's directory (a blob under deployments/<name>/ in the bundle)
    sha256: str
    size: int
    threads: int  # XNNPACK threads of its interpreter
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    estimated_arena_bytes: int


@dataclass(frozen=True)
class PlannedStage:
    layer: int | None  # the structure layer a parallel stage runs; None: a sequential run on W threads
    submodels: tuple[PlannedSubModel, ...]


@dataclass(frozen=True)
class PointPlan:
    point: int
    suffix_sha256: str  # the suffix segment this was planned for (the bundle's blob must be it)
    input: str  # the suffix's input and output tensor names
    output: str
    parallel_layers: int
    whole_ms: float | None  # measured end to end on the stage's host: the suffix on W threads, the plan
    plan_ms: float | None
    stages: tuple[PlannedStage, ...]


@dataclass(frozen=True)
class ModelParallaxPlan:
    name: str
    version: str
    workers: int
    why: str  # why no point, or which, runs branch-parallel
    points: tuple[PointPlan, ...]  # only points with a branch-parallel layer


@dataclass(frozen=True)
class ParallaxDeploymentPlan(_Record):
    deployment: str
    device_class: str
    budget_bytes: int
    models: tuple[ModelParallaxPlan, ...]
    schema_version: int = 1


_FIELD_TYPES.update({("PlannedStage", "submodels"): PlannedSubModel, ("PointPlan", "stages"): PlannedStage,
                     ("ModelParallaxPlan", "points"): PointPlan, ("ParallaxDeploymentPlan", "models"): ModelParallaxPlan})


def _stage_record(d: Path) -> dict:
    path = d / "parallax" / "parallax.json"
    if not path.is_file():
        raise ArtifactError(f"{path}: missing; run `edgeplan parallax {d}` first")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ArtifactError(f"{path}: not valid JSON ({e}); run `edgeplan parallax {d}` again") from None


def _max_cores(swapless, model: str) -> int:
    i = [m.name for m in swapless.models].index(model)
    return max([swapless.models[i].cores, *(r.cores[i] for r in swapless.stable_regimes())])


def _io_names(data: bytes) -> tuple[str, str]:
    """The suffix's input and output tensor names (read from the model, no interpreter built)."""
    from edgeplan.quantize.tflite_graph import TfliteGraph

    g = TfliteGraph(data)
    (i,), (o,) = g.inputs, g.outputs
    return g.tensors[i].name, g.tensors[o].name


def _point(d: Path, record: dict, point: int, scratch: Path, rel: str) -> PointPlan | None:
    """Point ``point``'s suffix as the stage planned it (None: it runs uncut), its sub-models copied to
    ``scratch/rel`` (which becomes ``parallax/rel`` of the deployment)."""
    targets = record["targets"]
    suffix = d / "segments" / f"p{point}" / "suffix_int8.tflite"
    name = f"p{point}"
    entry = targets.get(name)
    if entry is None or not suffix.is_file():
        raise ArtifactError(f"{d / 'parallax' / 'parallax.json'}: no plan for point {point}'s suffix; run "
                            f"`edgeplan parallax {d}` again")
    data = suffix.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    if entry.get("sha256") != sha:
        raise ArtifactError(f"{d / 'parallax' / 'parallax.json'}: planned another {suffix.relative_to(d)} than the "
                            f"one there now; run `edgeplan parallax {d}` again")
    entry = targets[entry["same_as"]] if "same_as" in entry else entry
    if not entry["stages"]:
        return None
    if not all(entry["identical"].values()):
        raise ArtifactError(f"{d / 'parallax' / 'parallax.json'}: point {point}'s sub-models do not give the suffix's "
                            "bits; nothing of it is planned (see `edgeplan parallax` there)")
    stages = []
    for st in entry["stages"]:
        subs = []
        for s in st["submodels"]:
            blob = (d / s["file"]).read_bytes()
            if hashlib.sha256(blob).hexdigest() != s["sha256"]:
                raise ArtifactError(f"{d / s['file']}: not the sub-model parallax.json names; run "
                                    f"`edgeplan parallax {d}` again")
            file = f"{rel}/{Path(s['file']).name}"
            write_bytes_atomic(scratch / file, blob)
            subs.append(PlannedSubModel(f"parallax/{file}", s["sha256"], len(blob), int(s["threads"]), tuple(s["inputs"]),
                                        tuple(s["outputs"]), int(s["estimated_arena_bytes"])))
        stages.append(PlannedStage(st["layer"], tuple(subs)))
    inp, outp = _io_names(data)
    return PointPlan(point, sha, inp, outp, int(entry["parallel_layers"]),
                     entry.get("whole_ms"), entry.get("plan_ms"), tuple(stages))


def plan_parallax(root: Path, name: str, params: dict) -> tuple[ParallaxDeploymentPlan, Path]:
    from edgeplan.pipeline.planning import deployment
    from edgeplan.plan.swapless.plan import SwapLessPlan
    from edgeplan.profile import fleet as fleet_mod

    dep = deployment(params, name)
    dc = fleet_mod.load(params, {d["name"] for d in params.get("deployments") or []}).device_class(dep["device_class"])
    if dc.cpu != "measured":
        raise PlanError(f"deployment {name!r}: device class {dc.name!r} models another host (cpu: {dc.cpu}); Parallax "
                        "plans are measured on the host that runs `edgeplan parallax`")
    out_dir = Path(root) / "deployments" / name
    swapless_path = out_dir / "plans" / "swapless.json"
    if not swapless_path.is_file():
        raise ArtifactError(f"{swapless_path}: missing; run `edgeplan plan swapless --deployment {name}` first "
                            "(Parallax gives a suffix at most the cores SwapLess gives its model)")
    swapless = SwapLessPlan.load(swapless_path)
    models, budget = [], 0
    with staged_dir(out_dir / "parallax") as scratch:  # the previous plan's sub-models stay until this one is made
        for pm in swapless.models:
            d = Path(root) / pm.name / pm.version
            record = _stage_record(d)
            budget = max(budget, int(record["budget_bytes"]))
            workers, cores = int(record["workers"]), _max_cores(swapless, pm.name)
            points: list[PointPlan] = []
            if cores < 2:
                why = f"SwapLess gives {pm.name} at most {cores} core: every suffix runs uncut"
            elif cores < workers:
                why = (f"SwapLess gives {pm.name} at most {cores} cores; its layers were measured on {workers} "
                       f"workers: every suffix runs uncut (re-run `edgeplan parallax {d}` with parallax.workers "
                       f"{cores})")
            else:
                for p in range(pm.last_point):  # the last point has no CPU suffix
                    got = _point(d, record, p, scratch, f"{pm.name}/p{p}")
                    if got is not None:
                        points.append(got)
                why = (f"branch-parallel at points {[x.point for x in points]} on {workers} workers" if points else
                       "no suffix keeps a branch-parallel layer (measured end to end): every suffix runs uncut")
            models.append(ModelParallaxPlan(pm.name, pm.version, workers, why, tuple(points)))
    result = ParallaxDeploymentPlan(name, dc.name, budget, tuple(models))
    out = out_dir / PLAN_FILE
    result.save(out)
    return result, out
