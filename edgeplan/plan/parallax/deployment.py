"""``edgeplan plan parallax``: which CPU suffixes of a deployment's models run branch-parallel (pipeline side).

Per model of the deployment, after its SwapLess plan: the model stage's ``parallax/parallax.json`` (plans
measured on this host for the int8 model and every point's suffix). W, the workers a suffix may use, is the
stage's ``workers`` when SwapLess gives the model at least that many cores in some regime (§3.3: W ≤ k_i); a
model SwapLess never gives two cores runs every suffix uncut, and so does one whose cores fall between two and
the stage's W (its layers were measured on W workers: re-run the stage with ``parallax.workers`` lowered).
Every point whose suffix has a branch-parallel layer gets its stages (unless their estimated arenas exceed the
device class's budget, ``ram_bytes`` x (1 - ``parallax.margin``): then it runs uncut, and the plan says why);
their sub-models are copied under
``deployments/<name>/parallax/<model>/p<k>/`` and named in the plan by sha256 and size. The stage is measured
on this host, so only a class whose CPU is measured here (``cpu: measured``) gets a plan.

Edge TPU regions inside a suffix (``plan/parallax/offload``): with ``compile.allow_multiple_subgraphs``, on a
class with an emulated Edge TPU and for a deployment of one model, a point whose suffix keeps a region after
delegate pruning runs as the offload stages instead (its regions on the accelerator, EMULATED), verified
identical to the suffix with both kernel sets before anything is written.

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
    offload_ms: float | None = None  # an Edge TPU region: its EMULATED hold on the accelerator; None: the CPU


@dataclass(frozen=True)
class PlannedRegion:
    """A run of suffix ops the compiler maps only with multiple subgraphs, and delegate pruning's decision."""

    ops: int
    macs: int
    boundary_bytes: int
    offload_ms: float  # EMULATED: L + F / R_acc + B / B_bw
    cpu_ms: float  # F / R_cpu, R_cpu the suffix's MACs over its measured 1-thread time
    keep: bool
    why: str


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
    regions: tuple[PlannedRegion, ...] = ()  # Edge TPU regions planned inside the suffix (kept or pruned)


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
                     ("PointPlan", "regions"): PlannedRegion,
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


def _arenas(point: PointPlan) -> int:
    """The point's sub-models' estimated arenas, all built at once (as the runtime holds them)."""
    return sum(s.estimated_arena_bytes for st in point.stages for s in st.submodels)


def _offload_refused(params: dict, dc, models: int) -> str | None:
    """Why no suffix of this deployment gets Edge TPU regions ("": not asked for), or None: they may."""
    if not params["compile"].get("allow_multiple_subgraphs"):
        return ""
    if not dc.accelerator.emulated:
        return (f"device class {dc.name!r} has no emulated Edge TPU (regions are held on the emulated device's "
                "clock; no region is compiled for a real one here)")
    if models != 1:
        return (f"{models} models: a request would visit the Edge TPU twice, which the SwapLess model does not "
                "cover (one-model deployments only)")
    return None


def _profile(d: Path, class_name: str):
    from edgeplan.errors import ProfileError
    from edgeplan.profile.schema import Profile

    path = d / "profiles" / f"{class_name}.json"
    if not path.is_file():
        raise ProfileError(f"{path}: missing; run `edgeplan profile run {d} --device-class {class_name}` first")
    prof = Profile.load(path)
    if not prof.tpu_model:
        raise ProfileError(f"{path}: made without an emulated Edge TPU (no tpu_model); Edge TPU regions are "
                           "pruned with its constants: profile again")
    return prof


def _offload_point(d: Path, prof, point: int, scratch: Path, rel: str, workers: int, params: dict
                   ) -> PointPlan | None:
    """Point ``point``'s suffix around the Edge TPU regions delegate pruning keeps (None: it keeps none, or the
    suffix was not profiled), its sub-models cut, verified and copied to ``scratch/rel``."""
    from edgeplan.plan.parallax import offload, stage
    from edgeplan.quantize import litert
    from edgeplan.quantize.stream import cut_ops
    from edgeplan.quantize.tflite_graph import TfliteGraph
    from edgeplan.runtime.parallel import Stage, SubModel

    suffix = d / "segments" / f"p{point}" / "suffix_int8.tflite"
    seg = next((s for s in prof.segments if s.key == (point, "suffix") and s.status == "ok"), None)
    ms = seg.cpu_ms(1) if seg is not None else None
    if not suffix.is_file() or ms is None:
        return None
    data = suffix.read_bytes()
    graph = TfliteGraph(data)
    regions, _ = offload.regions(graph, prof.tpu_model, ms)
    kept = [r for r in regions if r.keep]
    if not kept:
        return None
    planned = offload.stages(graph, kept, workers)
    run = [Stage(st.layer, tuple(SubModel(f"p{point}_s{k}w{w}", cut_ops(graph, list(ops), f"p{point}_s{k}w{w}",
                                                                         list(outs)), t)
                                 for w, (ops, outs, t) in enumerate(zip(st.submodels, st.outputs, st.threads))))
           for k, st in enumerate(planned)]
    same = stage.identical(graph, run, workers, int(params["parallax"]["verify_samples"]),
                           int(params["verify"]["seed"]))
    if not all(same.values()):
        raise ArtifactError(f"{suffix}: its stages around the Edge TPU regions do not give the suffix's bits "
                            f"({same}); nothing of it is planned")
    stages = []
    for st, ran in zip(planned, run):
        subs = []
        for sub, outs, hold in zip(ran.submodels, st.outputs, st.offload_ms):
            file = f"{rel}/{sub.name}.tflite"
            write_bytes_atomic(scratch / file, sub.data)
            ins = tuple(x["name"] for x in litert.interpreter(sub.data).get_input_details())
            subs.append(PlannedSubModel(f"parallax/{file}", hashlib.sha256(sub.data).hexdigest(), len(sub.data),
                                        sub.threads, ins, tuple(graph.tensors[i].name for i in outs),
                                        int(st.peak_bytes[len(subs)]), hold))
        stages.append(PlannedStage(st.layer, tuple(subs)))
    inp, outp = _io_names(data)
    return PointPlan(point, hashlib.sha256(data).hexdigest(), inp, outp,
                     sum(1 for st in planned if len(st.submodels) > 1), None, None, tuple(stages),
                     tuple(PlannedRegion(len(r.ops), int(r.macs), int(r.boundary_bytes), r.offload_ms, r.cpu_ms,
                                         r.keep, r.why) for r in regions))


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
    offload_why = _offload_refused(params, dc, len(swapless.models))
    models, budget = [], 0
    class_budget = int(dc.ram_bytes * (1 - float(params["parallax"]["margin"])))
    with staged_dir(out_dir / "parallax") as scratch:  # the previous plan's sub-models stay until this one is made
        for pm in swapless.models:
            d = Path(root) / pm.name / pm.version
            record = _stage_record(d)
            budget = max(budget, int(record["budget_bytes"]))
            workers, cores = int(record["workers"]), _max_cores(swapless, pm.name)
            offloaded: dict[int, PointPlan] = {}
            if offload_why is None:
                prof = _profile(d, dc.name)
                for p in range(pm.last_point):  # the last point has no CPU suffix
                    got = _offload_point(d, prof, p, scratch, f"{pm.name}/p{p}", max(1, min(workers, cores)), params)
                    if got is not None:
                        offloaded[p] = got
            uncut = None
            if cores < 2:
                uncut = f"SwapLess gives {pm.name} at most {cores} core: every suffix runs uncut"
            elif cores < workers:
                uncut = (f"SwapLess gives {pm.name} at most {cores} cores; its layers were measured on {workers} "
                         f"workers: every suffix runs uncut (re-run `edgeplan parallax {d}` with parallax.workers "
                         f"{cores})")
            points: list[PointPlan] = []
            for p in range(pm.last_point):
                got = offloaded.get(p) or (None if uncut else _point(d, record, p, scratch, f"{pm.name}/p{p}"))
                if got is not None:
                    points.append(got)
            parallel = [x.point for x in points if x.point not in offloaded]
            if uncut:
                why = uncut + (" (but for its Edge TPU regions)" if offloaded else "")
            else:
                why = (f"branch-parallel at points {parallel} on {workers} workers" if parallel else
                       "no suffix keeps a branch-parallel layer (measured end to end): every suffix runs uncut")
            if offloaded:
                why += f"; Edge TPU regions (EMULATED) inside the suffixes of points {sorted(offloaded)}"
            elif offload_why:
                why += f"; no Edge TPU region inside a suffix: {offload_why}"
            over = [x.point for x in points if _arenas(x) > class_budget]
            if over:
                points = [x for x in points if x.point not in over]
                why += (f"; points {over} run uncut: their sub-models' estimated arenas exceed the class's budget "
                        f"{class_budget / 2**20:.1f} MiB (ram_bytes x (1 - parallax.margin))")
            models.append(ModelParallaxPlan(pm.name, pm.version, workers, why, tuple(points)))
    result = ParallaxDeploymentPlan(name, dc.name, min(budget, class_budget), tuple(models))
    out = out_dir / PLAN_FILE
    result.save(out)
    return result, out
