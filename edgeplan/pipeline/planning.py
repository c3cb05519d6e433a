"""The plan stage: a deployment of params.yaml -> ``<root>/deployments/<name>/plans/swapless.json``."""
from __future__ import annotations

import copy
from pathlib import Path

from edgeplan.errors import PlanError, ProfileError
from edgeplan.plan.swapless import plan as plan_mod
from edgeplan.plan.swapless.from_profiles import model_spec
from edgeplan.plan.swapless.instance import Instance
from edgeplan.profile import fleet as fleet_mod
from edgeplan.profile.schema import Profile
from edgeplan.verify.accuracy import excluded_points

DEFAULT_CLASS = "coral-usb-emulated"  # of the one-model deployment of a model no deployment serves
DEFAULT_RATE = 10.0


def deployment(params: dict, name: str) -> dict:
    deps = {d["name"]: d for d in params.get("deployments") or []}
    if name not in deps:
        raise PlanError(f"deployment {name!r} is not in params.yaml (known: {', '.join(sorted(deps)) or '(none)'})")
    return deps[name]


def resolve_version(root: Path, model: str, version: str) -> str:
    """``latest`` -> the highest version directory under ``root/model`` holding a model (numeric when they are
    numbers; a failed ingest leaves only its ``logs/``)."""
    base = Path(root) / model
    if version != "latest":
        if not (base / version).is_dir():
            raise PlanError(f"model {model!r} version {version!r}: no artifacts at {base / version}")
        return version
    found = [d.name for d in base.iterdir() if (d / "model.json").is_file()] if base.is_dir() else []
    if not found:
        raise PlanError(f"model {model!r}: no artifacts under {base}; compile it first (`edgeplan compile`)")
    return max(found, key=lambda v: (0, int(v)) if v.isdigit() else (1, v))


def deployments_serving(params: dict, name: str, version: str, root: str) -> tuple[dict, list[str]]:
    """The deployments that serve ``name`` at ``version`` (explicitly, or as ``latest`` when it is the newest
    version under ``root``), with every model's version made explicit; a model no deployment serves gets a
    one-model deployment ``<name>-solo`` on coral-usb-emulated. Returns (params with those deployments, names)."""
    params = copy.deepcopy(params)
    served = []
    for d in params["deployments"]:
        hit = False
        for m in d["models"]:
            v = str(m.get("version", "latest"))
            if m["name"] == name and (v == str(version) or (v == "latest" and resolve_version(Path(root), name, v) == str(version))):
                hit = True
        if hit:
            for m in d["models"]:
                m["version"] = str(version) if m["name"] == name else resolve_version(Path(root), m["name"],
                                                                                    str(m.get("version", "latest")))
            served.append(d["name"])
    if not served:
        solo = f"{name}-solo"
        params["deployments"].append({"name": solo, "device_class": DEFAULT_CLASS,
                                      "models": [{"name": name, "version": str(version), "rate": DEFAULT_RATE}]})
        served.append(solo)
    return params, served


SPLITS = ("spatial", "autodice")  # a deployment's ``split``: its one model split over the registry's devices of it
SPEED_SPLITS = ("spatial",)  # splits planned from every device class's measured conv speed


def split_of(dep: dict) -> str | None:
    """A deployment's ``split`` (params.yaml), which splits its one model over the fleet registry's devices of the
    deployment: ``spatial`` along H or W (ADaPS, `edgeplan plan spatial`), ``autodice`` into consecutive layers
    (AutoDiCE, `edgeplan plan autodice`); none by default."""
    split = dep.get("split")
    if split is not None and split not in SPLITS:
        raise PlanError(f"deployment {dep['name']!r}: split {split!r} is not one of: {', '.join(SPLITS)}")
    return split


def split_deployments(params: dict, served: list[str]) -> dict[str, str]:
    """The split deployments among ``served``: name -> its split."""
    return {d["name"]: split_of(d) for d in params["deployments"] if d["name"] in served and split_of(d)}


def split_classes(params: dict, served: list[str]) -> dict[str, list[str]]:
    """Per deployment among ``served`` whose split is planned from conv speeds (``SPEED_SPLITS``), the device
    classes of the registry's devices serving it (their profiles carry the conv speeds)."""
    names = [n for n, s in split_deployments(params, served).items() if s in SPEED_SPLITS]
    if not names:
        return {}
    fleet = fleet_mod.load(params, {d["name"] for d in params["deployments"]})
    return {n: sorted({x.device_class for x in fleet.devices if x.deployment == n}) for n in names}


def conv_speed_pairs(params: dict, split: dict[str, list[str]]) -> set[tuple[str, str]]:
    """(model, device class) pairs whose profile also measures conv speeds: the model of each split deployment of
    ``split`` (``split_classes``) on the classes of its devices."""
    deps = {d["name"]: d for d in params["deployments"]}
    return {(m["name"], c) for n, classes in split.items() for m in deps[n]["models"] for c in classes}


def split_model(root: Path, params: dict, name: str, what: str) -> tuple[str, str, Path]:
    """(model, version, artifact directory) of the one model deployment ``name`` splits (``what``: the split, for
    errors), its model.onnx and model_int8.tflite present."""
    from edgeplan.errors import ArtifactError

    dep = deployment(params, name)
    if len(dep["models"]) != 1:
        raise PlanError(f"deployment {name!r} serves {len(dep['models'])} models; {what} runs one")
    m = dep["models"][0]
    version = resolve_version(root, m["name"], str(m.get("version", "latest")))
    d = Path(root) / m["name"] / version
    for f in ("model.onnx", "model_int8.tflite"):
        if not (d / f).is_file():
            raise ArtifactError(f"{d / f}: missing; run `edgeplan compile` first")
    return m["name"], version, d


def keep_split(root: Path, name: str, planner: str) -> None:
    """A deployment runs one split: the plans of the other split planners of ``name`` are removed (the bundle
    refuses a deployment holding two)."""
    from edgeplan.runtime.split import PLANNERS

    for other in PLANNERS:
        if other != planner:
            (Path(root) / "deployments" / name / "plans" / f"{other}.json").unlink(missing_ok=True)


def registry_platform(params: dict, name: str, what: str):
    """(fleet, the registry's devices serving ``name`` in registry order as a multi-device platform); ``what``
    (the split, for errors) needs at least 2."""
    from edgeplan.plan.multidevice import spec

    fleet = fleet_mod.load(params, {d["name"] for d in params.get("deployments") or []})
    ids = [x.id for x in fleet.devices if x.deployment == name]
    if len(ids) < 2:
        raise PlanError(f"deployment {name!r}: {len(ids)} device(s) of the fleet registry serve it "
                        f"(fleet.devices[].deployment); {what} needs at least 2")
    return fleet, spec.from_fleet(fleet, ids)


def device_classes(params: dict, served: list[str]) -> list[str]:
    """The device classes of the deployments ``served``, and of the registry's devices of the split ones."""
    split = {c for classes in split_classes(params, served).values() for c in classes}
    return sorted({d["device_class"] for d in params["deployments"] if d["name"] in served} | split)


def plan_swapless(root: Path, name: str, params: dict, variant: str | None = None) -> tuple[plan_mod.SwapLessPlan, Path]:
    """Plan deployment ``name`` (params.yaml ``plan`` sets the variant, the regime grid and the preload RAM
    share; ``variant`` overrides)."""
    settings = params["plan"]
    variant = variant or settings["variant"]
    dep = deployment(params, name)
    fleet = fleet_mod.load(params, {d["name"] for d in params.get("deployments") or []})
    dc = fleet.device_class(dep["device_class"])
    specs, versions, roots, notes, sources, emulators = [], [], [], [], set(), set()
    for m in dep["models"]:
        version = resolve_version(root, m["name"], str(m.get("version", "latest")))
        d = Path(root) / m["name"] / version
        path = d / "profiles" / f"{dc.name}.json"
        if not path.is_file():
            raise ProfileError(f"{path}: missing; run `edgeplan profile run {d} --device-class {dc.name}` first")
        prof = Profile.load(path)
        sources |= {s.tpu.source for s in prof.segments if s.tpu is not None}
        if prof.tpu_model:
            emulators.add(str(prof.tpu_model.get("model", "?")))
        excluded = excluded_points(d, params)
        spec = model_spec(m["name"], float(m["rate"]), prof, str(path), edgetpu=dc.accelerator.edgetpu,
                          excluded=excluded)
        if excluded:
            notes.append(f"{m['name']}: points {list(excluded)} failed the accuracy gate; never chosen")
        unusable = [p for p in range(1, spec.last + 1) if spec.s_tpu[p] == float("inf") and p not in excluded]
        if not dc.accelerator.edgetpu:
            notes.append(f"{m['name']}: device class {dc.name!r} has no Edge TPU; the model runs wholly on the CPU")
        elif unusable:
            notes.append(f"{m['name']}: points {unusable} have ops the Edge TPU does not run; never chosen"
                         + (" (the model runs wholly on the CPU)" if len(unusable) == spec.last else ""))
        specs.append(spec)
        versions.append(version)
        roots.append(d)
    inst = Instance(tuple(specs), dc.cores, dc.accelerator.onchip_param_bytes)

    def segment_bytes(i: int, p: int) -> int:
        seg = roots[i] / "segments" / f"p{p}"
        files = [seg / "prefix_edgetpu.tflite", seg / "suffix_int8.tflite"]
        return sum(f.stat().st_size for f in files if f.is_file())

    result = plan_mod.make(name, dc.name, inst, versions, segment_bytes,
                           int(dc.ram_bytes * settings["preload_ram_share"]), variant, tuple(notes),
                           f"emulated:{'+'.join(sorted(emulators))}" if "emulated" in sources else "measured",
                           tuple(settings["rate_factors"]))
    out = Path(root) / "deployments" / name / "plans" / "swapless.json"
    result.save(out)
    return result, out
