"""The model stages as tasks: ingest, build (int8 conversion, cuts, Edge TPU compile), verify, stream, parallax,
profile.

No task sets ``timeout_seconds``: the tasks run in worker threads (the thread pool, or Dask's), where Prefect
cannot interrupt them (it warns about that once per task run). The long work is bounded where it can be
stopped, in the child processes that do it: onnx2tf (``quantize.timeout_s``), each profiled segment
(``profile.timeout_s``), and the store's retries (bounded attempts with backoff)."""
from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.logging import get_run_logger

from edgeplan.errors import EdgeplanError
from tasks.cache import abs_path, content_key
from tasks.slots import slot

MODEL_CODE = ("graph", "surgery", "zoo", "artifacts.py", "errors.py", "pipeline/stages.py")
BUILD_CODE = (*MODEL_CODE, "quantize", "compile")


class VerifyFailed(EdgeplanError):
    """A model failed verify: nothing of it is planned or published."""


def _source_files(parameters: dict):
    src = str(parameters["source"])
    return [] if src.startswith("zoo:") else [abs_path(src)]


@task(name="ingest", cache_key_fn=content_key(_source_files, ["models", "ingest"], MODEL_CODE,
                                              scalars=("source", "name", "version", "root", "input_shape")),
      persist_result=True)
def ingest(source: str, name: str, version: str, root: str, input_shape=None, params: dict | None = None) -> str:
    """model.onnx + model.json (a different model under an existing name and version is refused)."""
    from edgeplan.pipeline import stages

    ip = (params or {}).get("ingest", {})
    return str(stages.ingest(source, name, version, Path(root), input_shape, ip.get("max_model_bytes"),
                             ip.get("max_memory_bytes")))


@task(name="build", cache_key_fn=content_key(lambda p: [Path(p["model_dir"]) / "model.onnx"],
                                             ["analysis", "quantize", "compile"], BUILD_CODE, scalars=("model_dir",)),
      persist_result=True, tags=["conversion"])
def build(model_dir: str, params: dict):
    """The one int8 conversion, the matched points, segments and Edge TPU compile at every point."""
    from edgeplan.pipeline import stages

    log = get_run_logger()
    with slot("conversion", params["orchestration"]["conversion_slots"], log=log):
        result = stages.build(Path(model_dir), params,
                              lambda stage, done, total: log.info("%s %d/%d", stage, done, total) if done == total else None)
    if result.errors:
        log.warning("points failing to build: %s", result.errors)
    return result


def _verify_inputs(p: dict):
    d = Path(p["model_dir"])
    return [d / "model.onnx", d / "model_int8.tflite", d / "analysis.json", d / "segments"]


@task(name="verify", cache_key_fn=content_key(_verify_inputs, ["verify", "quantize.calibration"],
                                              (*BUILD_CODE, "verify"), scalars=("model_dir",)),
      persist_result=True)
def verify(model_dir: str, params: dict):
    """Every check at every point; raises VerifyFailed (after writing verify.json) when any fails."""
    from edgeplan.pipeline import stages

    report = stages.verify(Path(model_dir), params)
    if not report.ok:
        failed = [c.point for c in report.points if not c.ok]
        raise VerifyFailed(f"{model_dir}: verify failed at points {failed}"
                           + ("" if report.input_dependence_ok else " and the output ignores the input")
                           + f"; see {Path(model_dir) / 'verify.json'}. Nothing of it is published.")
    return report


def _accuracy_inputs(p: dict):
    dataset = str(p["params"]["accuracy"].get("dataset") or "")  # a zoo set is made by the code it hashes
    return _verify_inputs(p) + ([abs_path(dataset)] if dataset and not dataset.startswith("zoo:") else [])


@task(name="accuracy", cache_key_fn=content_key(_accuracy_inputs, ["accuracy"], (*BUILD_CODE, "verify"),
                                                scalars=("model_dir",)),
      persist_result=True)
def accuracy(model_dir: str, params: dict):
    """The accuracy gate when params.yaml names a labelled set: accuracy.json; raises AccuracyGateError (after
    writing it) when no point passes. Points that fail are left out by the planner and the runtime."""
    from edgeplan.pipeline import stages
    from edgeplan.verify.accuracy import excluded_points

    report = stages.accuracy(Path(model_dir), params)
    if report is not None:
        excluded_points(Path(model_dir), params)  # the one message for "no point passed"
        get_run_logger().info("accuracy gate: float top-1 %.4f, int8 %s, excluded points %s", report.float_top1,
                              [round(p.top1, 4) for p in report.points], list(report.excluded))
    return report


class StreamNotIdentical(EdgeplanError):
    """The streaming segments of a model do not chain to its int8 model's bits: nothing of it is streamed."""


@task(name="stream", cache_key_fn=content_key(lambda p: [Path(p["model_dir"]) / "model_int8.tflite"],
                                              ["flashmem.max_segment_bytes", "flashmem.verify_samples", "verify.seed"],
                                              ("quantize", "profile/capacity.py", "artifacts.py",
                                               "pipeline/stages.py"), scalars=("model_dir",)),
      persist_result=True)
def stream(model_dir: str, params: dict) -> str:
    """stream/: large weights split, one segment per layer, checked identical to the int8 model (FlashMem)."""
    from edgeplan.pipeline import stages

    info = stages.stream(Path(model_dir), params)
    if not info.ok:
        raise StreamNotIdentical(f"{model_dir}: the streaming segments differ from model_int8.tflite with "
                                 f"{', '.join(k for k, v in info.identical.items() if not v)} kernels; see "
                                 f"{Path(model_dir) / 'stream' / 'stream.json'}")
    return str(Path(model_dir) / "stream")


class ParallaxNotIdentical(EdgeplanError):
    """A model's branch-parallel sub-models do not give its int8 bits: no suffix of it runs branch-parallel."""


@task(name="parallax", cache_key_fn=content_key(lambda p: [Path(p["model_dir"]) / "model_int8.tflite",
                                                           Path(p["model_dir"]) / "segments"],
                                                ["parallax", "verify.seed"],
                                                ("plan/parallax", "graph/branches.py", "quantize", "runtime/parallel.py",
                                                 "runtime/stream.py", "pipeline/stages.py"), scalars=("model_dir",)),
      persist_result=True)
def parallax(model_dir: str, params: dict) -> str:
    """parallax/: Parallax plans of the int8 model and every point's suffix, measured here (so one at a time
    with the profiles), their sub-models checked identical to what they cut."""
    from edgeplan.pipeline import stages

    with slot("profile", 1, log=get_run_logger()):
        record = stages.parallax(Path(model_dir), params)
    bad = [n for n, r in record["targets"].items() if "same_as" not in r and not all(r["identical"].values())]
    if bad:
        raise ParallaxNotIdentical(f"{model_dir}: the branch-parallel sub-models of {', '.join(bad)} differ from "
                                   f"what they cut; see {Path(model_dir) / 'parallax' / 'parallax.json'}")
    return str(Path(model_dir) / "parallax")


def _profile_inputs(p: dict):
    d = Path(p["model_dir"])
    return [d / "segments", d / "analysis.json", d / "stream" / "stream.json"]


@task(name="profile", cache_key_fn=content_key(_profile_inputs, lambda p: ["profile", "flashmem.capacity_rounds",
                                                                         f"fleet.device_classes.{p['device_class']}"],
                                               ("profile", "artifacts.py", "compile/emulated.py", "plan/spatial/speed.py"),
                                               scalars=("model_dir", "device_class", "conv_speed")),
      persist_result=True)
def profile(model_dir: str, device_class: str, params: dict, conv_speed: bool = False) -> str:
    """profiles/<device class>.json: CPU timed here (or predicted), the Edge TPU emulated when it is; with
    ``conv_speed`` (a split deployment's model on its devices' classes) the class's seconds per MAC too. One
    profile at a time per machine (a profile timed beside another is not a measurement of the device)."""
    from edgeplan.profile import cpu, fleet, run

    dc = fleet.load(params, {d["name"] for d in params.get("deployments") or []}).device_class(device_class)
    with slot("profile", 1, log=get_run_logger()):
        run.profile(Path(model_dir), dc, cpu.Settings.from_params(params["profile"]),
                    capacity_rounds=int(params["flashmem"]["capacity_rounds"]), conv_speed=conv_speed)
    return str(Path(model_dir) / "profiles" / f"{device_class}.json")


@task(name="version", cache_key_fn=content_key(lambda p: [Path(p["model_dir"])], ["models"],
                                               ("pipeline/versioning.py",), scalars=("model_dir",)),
      persist_result=True)
def version(model_dir: str, params: dict) -> dict:
    """The model version's artifacts recorded in DVC and pushed to the DVC remote."""
    from edgeplan.pipeline.versioning import version_artifacts

    return version_artifacts(Path(model_dir), params)
