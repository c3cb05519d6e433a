"""The deployment stages as tasks: plan (SwapLess, then FlashMem and Parallax where they apply) and publish
(bundle, sign, upload); plan_spatial or plan_autodice for a split deployment."""
from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.logging import get_run_logger

from tasks.cache import content_key

PLAN_CODE = ("plan/swapless", "plan/flashmem", "plan/parallax/deployment.py", "pipeline/planning.py",
             "profile/schema.py", "profile/capacity.py", "profile/fleet.py", "artifacts.py")
PUBLISH_CODE = ("bundle", "store", "cli_store.py", "artifacts.py", "quantize/litert.py", "quantize/calibration.py")


def _models(p: dict) -> list[dict]:
    return next(d for d in p["params"]["deployments"] if d["name"] == p["name"])["models"]


def _plan_inputs(p: dict):
    dep = next(d for d in p["params"]["deployments"] if d["name"] == p["name"])
    root = Path(p["root"])
    return [root / m["name"] / str(m["version"]) / "profiles" / f"{dep['device_class']}.json" for m in dep["models"]] + [
        root / m["name"] / str(m["version"]) / f for m in dep["models"]
        for f in ("analysis.json", "stream/stream.json", "parallax/parallax.json")]


def _plan_params(p: dict):
    dep = next(d for d in p["params"]["deployments"] if d["name"] == p["name"])
    return ["plan", "flashmem", f"fleet.device_classes.{dep['device_class']}"]


@task(name="plan", cache_key_fn=content_key(_plan_inputs, _plan_params, PLAN_CODE, scalars=("root", "name")),
      persist_result=True)
def plan(root: str, name: str, params: dict):
    """deployments/<name>/plans/swapless.json (the deployment's models must name explicit versions), then
    plans/flashmem.json when every model has streaming layers and a measured load capacity, and
    plans/parallax.json when every model has its Parallax stage and the class's CPU is measured here."""
    from edgeplan.pipeline.planning import plan_swapless

    result = plan_swapless(Path(root), name, params)[0]
    _flashmem(Path(root), name, params)
    _parallax(Path(root), name, params)
    return result


def _optional_plan(root: Path, name: str, planner: str, make, expected: tuple, summary):
    """Make ``planner``'s plan (``make()``, returned) beside SwapLess, which publishes either way. On an
    EdgeplanError its plan file is removed (a plan for other versions must not travel with this revision), the
    log says why — at info for what a model may simply lack (``expected`` errors), else as a warning — and None
    is returned."""
    from edgeplan.errors import EdgeplanError

    log = get_run_logger()
    try:
        plan = make()
    except EdgeplanError as e:
        (root / "deployments" / name / "plans" / f"{planner.lower()}.json").unlink(missing_ok=True)
        (log.info if isinstance(e, expected) else log.warning)("no %s plan for %s: %s", planner, name, e)
        return None
    log.info("%s plan for %s: %s", planner, name, summary(plan))
    return plan


def _parallax(root: Path, name: str, params: dict) -> None:
    """Every suffix runs uncut without it; a model without its Parallax stage or a class not measured here is
    expected."""
    from edgeplan.errors import ArtifactError, PlanError
    from edgeplan.plan.parallax.deployment import plan_parallax

    _optional_plan(root, name, "Parallax", lambda: plan_parallax(root, name, params)[0], (ArtifactError, PlanError),
                   lambda plan: "; ".join(f"{m.name}: {m.why}" for m in plan.models))


def _flashmem(root: Path, name: str, params: dict) -> None:
    """No streaming layers or no measured capacity (what a model lacks) is expected."""
    from edgeplan.errors import ArtifactError, ProfileError
    from edgeplan.plan.flashmem.deployment import plan_flashmem

    _optional_plan(root, name, "FlashMem", lambda: plan_flashmem(root, name, params)[0], (ArtifactError, ProfileError),
                   lambda plan: "; ".join(
                       f"{m.name} peak {m.plan.peak_resident_bytes / 1e6:.1f} of {m.preload_peak_bytes / 1e6:.1f} MB, "
                       "tiers " + ",".join(sorted({w.tier for w in m.plan.windows})) for m in plan.models))


SPATIAL_CODE = ("plan/spatial", "surgery/spatial.py", "surgery/spatial_float.py", "surgery/spatial_paths.py",
                "distributed/rows.py", "quantize",
                "plan/multidevice/spec.py", "profile/schema.py", "profile/fleet.py", "graph")


def _spatial_inputs(p: dict):
    from edgeplan.pipeline.planning import split_classes

    classes = split_classes(p["params"], [p["name"]]).get(p["name"], [])
    files = []
    for m in _models(p):
        d = Path(p["root"]) / m["name"] / str(m["version"])
        files += [d / "model.onnx", d / "model_int8.tflite"] + [d / "profiles" / f"{c}.json" for c in classes]
    return files


@task(name="plan_spatial", cache_key_fn=content_key(_spatial_inputs, ["spatial", "verify.seed", "fleet"], SPATIAL_CODE,
                                                    scalars=("root", "name")), persist_result=True)
def plan_spatial(root: str, name: str, params: dict) -> dict | None:
    """A split deployment (``split: spatial``): the ADaPS search over the registry's devices of it, its best plan cut
    into int8 tiles, verified identical to the int8 model with both kernel sets before anything is written
    (``deployments/<name>/spatial/`` and ``plans/spatial.json``; `edgeplan plan spatial` does the same). Without a
    plan (e.g. a device class whose profile has no conv speed), the stale one is removed and the log says why: the
    deployment publishes without a split."""
    from edgeplan.plan.spatial.deployment import plan_spatial as make

    record = _optional_plan(Path(root), name, "spatial", lambda: make(Path(root), name, params)[0], (),
                            lambda r: f"{len(r['devices'])} devices along {r['axis']}, score {r['score_s'] * 1e3:.2f} "
                                      f"ms, tiles identical {min(r['tiles']['identical'].values()):.0%}")
    return None if record is None else {
        "deployment": name, "planner": "spatial", "model": f"{record['model']}:{record['version']}",
        "axis": record["axis"],
        "devices": [d["id"] for d in record["devices"]], "score_ms": record["score_s"] * 1e3,
        "bytes_per_frame": sum(record["tiles"]["bytes_per_frame"].values()),
        "identical": min(record["tiles"]["identical"].values())}


AUTODICE_CODE = ("plan/multidevice", "surgery/multidevice.py", "pipeline/multidevice.py", "quantize", "graph",
                 "profile/fleet.py", "profile/cpu.py", "runtime/stream.py")


def _autodice_inputs(p: dict):
    return [Path(p["root"]) / m["name"] / str(m["version"]) / f for m in _models(p)
            for f in ("model.onnx", "model_int8.tflite")]


@task(name="plan_autodice", cache_key_fn=content_key(_autodice_inputs, ["multidevice", "quantize", "fleet"],
                                                     AUTODICE_CODE, scalars=("root", "name")), persist_result=True)
def plan_autodice(root: str, name: str, params: dict) -> dict | None:
    """A split deployment (``split: autodice``): its units timed on this machine (in the profiling slot: timings
    are not shared with other work), NSGA-II over cuts of them across the registry's devices of it, the Pareto
    point best on ``multidevice.objective`` split into stages verified against the whole model before anything is
    written (``deployments/<name>/multidevice/``, ``plans/autodice.json`` and its plot; `edgeplan plan autodice`
    does the same). Without a plan the stale one is removed and the log says why: the deployment publishes
    without a split."""
    from edgeplan.plan.multidevice.deployment import plan_autodice as make
    from tasks.slots import slot

    log = get_run_logger()
    with slot("profile", 1, log=log):
        record = _optional_plan(Path(root), name, "autodice", lambda: make(Path(root), name, params)[0], (),
                                lambda r: f"{r['split']['ranks']} ranks of {len(r['devices'])} devices, predicted "
                                          f"{r['front'][r['chosen']]['throughput_fps']:.1f} frames/s, int8 identical "
                                          f"{r['split']['verify']['int8_identical_reference']:.0%}")
    if record is None:
        return None
    point = record["front"][record["chosen"]]
    return {"deployment": name, "planner": "autodice", "model": f"{record['model']}:{record['version']}",
            "devices": list(point["mapping"]), "objective": record["objective"],
            "throughput_fps": point["throughput_fps"], "memory_bytes": point["memory_bytes"],
            "bytes_per_frame": record["split"]["buffer_bytes"],
            "identical": min(record["split"]["verify"][k] for k in ("int8_identical_reference",
                                                                    "int8_identical_xnnpack"))}


def _publish_inputs(p: dict):
    from edgeplan.runtime.split import PLANNERS

    root = Path(p["root"])
    base = root / "deployments" / p["name"]
    # every planner's plan, and the directories of FlashMem, Parallax and the split planners
    files = [base / "plans" / f"{planner}.json" for planner in ("swapless", "flashmem", "parallax", *PLANNERS)] + [
        base / d for d in ("flashmem", "parallax", *(k.dir for k in PLANNERS.values()))]
    for m in _models(p):
        d = root / m["name"] / str(m["version"])
        files += [d / "segments", d / "profiles", d / "verify.json", d / "model.json", d / "model_int8.tflite"]
    return files


def _store_failure(task, task_run, state) -> bool:
    """Retry on store and network failures only (a wrong key or a failed verify will not get better)."""
    from edgeplan.errors import StoreError

    return isinstance(state.result(raise_on_failure=False), StoreError)


@task(name="publish", cache_key_fn=content_key(_publish_inputs, ["publish", "quantize.calibration", "fleet.devices"],
                                               PUBLISH_CODE, scalars=("root", "name", "store", "key")),
      persist_result=True, retries=3, retry_delay_seconds=[2, 8, 30],
      retry_condition_fn=_store_failure)
def publish(root: str, name: str, params: dict, store: str | None = None, key: str | None = None):
    """Build the bundle and publish it as the next signed revision (none when the content is unchanged).
    Retried with backoff: a rerun uploads only what is missing."""
    from edgeplan.cli_store import publish_deployment

    result, _ = publish_deployment(Path(root), name, params, store, key)
    return result
