"""The stages of ``edgeplan compile``, each reading and writing files of one artifact directory."""
from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import shutil
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import onnx

from edgeplan import childlog
from edgeplan.artifacts import (
    PROTOBUF_LIMIT,
    AccuracyReport,
    Analysis,
    CompileReport,
    DroppedPoint,
    ModelInfo,
    Point,
    StreamInfo,
    StreamLayer,
    VerifyReport,
    code_digest,
    external_files,
    link_or_copy,
    write_bytes_atomic,
    write_json_atomic,
    write_onnx,
    writes_external,
)
from edgeplan.errors import (
    ArtifactError,
    EdgeplanError,
    ModelTooLargeError,
    ModelVersionConflictError,
    UnsupportedModelError,
)
from edgeplan.graph.cuts import Candidate, choose_evenly, endpoints, single_tensor_cuts
from edgeplan.graph.model import GraphView, fingerprint
from edgeplan.graph.model import load as load_model
from edgeplan.graph.wire import light_copy
from edgeplan.pipeline import memory
from edgeplan.scratch import scratch

log = logging.getLogger(__name__)
Progress = Callable[[str, int, int], None]  # (stage, done, total)


def _noop(stage: str, done: int, total: int) -> None:
    pass


def artifact_dir(root: Path, name: str, version: str) -> Path:
    return Path(root) / name / str(version)


# ---------------------------------------------------------------------------------------------- ingest
def ingest(source: str | Path, name: str, version: str, out_root: Path,
           input_shape: Sequence[int] | None = None, max_bytes: int | None = None,
           max_memory: int | None = None) -> Path:
    """``model.onnx`` + ``model.json`` under ``out_root/name/version`` from any supported model file (refused
    unread when larger than ``max_bytes``, or when converting it is estimated to need more memory than
    ``max_memory``, default what is available: ``pipeline/preflight``); the conversion runs in a child process
    (``pipeline/ingest_child``)."""
    from edgeplan.pipeline import preflight

    out = artifact_dir(out_root, name, version)
    src = str(source)
    if not src.startswith("zoo:"):
        size = _size(Path(src))
        if size is not None:
            if max_bytes is not None and size > max_bytes:
                raise ModelTooLargeError(f"{src}: {size:,} bytes, over the limit of {max_bytes:,} (params.yaml "
                                         "ingest.max_model_bytes); nothing was read. Raise the limit if this machine "
                                         "has the memory to convert it.")
            preflight.check(size, src, max_memory, stages=("ingest",))
    logs = out / childlog.DIR
    with scratch("ingest") as tmp, memory.stage("ingest"):
        try:
            _ingest_child(src, Path(out_root) / ".zoo", tmp, name, str(version), input_shape, tmp / "ingest.log")
        except EdgeplanError as e:  # the converter's output beside the artifacts (never over a model's own log)
            if not (tmp / "ingest.log").is_file():
                raise
            failed = logs / "ingest-failed.log"
            _keep_log(tmp / "ingest.log", failed)
            raise type(e)(f"{e}{childlog.named(failed)}") from None
        made = ModelInfo.load(tmp / "model.json")
        if (out / "model.json").is_file():  # a version names one model: the same again is a no-op, another is refused
            held = ModelInfo.load(out / "model.json")
            if held.sha256 != made.sha256:
                raise ModelVersionConflictError(
                    f"{name} version {version} already exists in {out} as another model (sha256 {held.sha256[:12]}..., "
                    f"from {held.source}); the one submitted ({src}) is {made.sha256[:12]}.... Submit it as a new "
                    "version.")
            if (out / "model.onnx").is_file():
                return out
        out.mkdir(parents=True, exist_ok=True)
        _copy_onnx(Path(tmp) / "model.onnx", out / "model.onnx")
        made.save(out / "model.json")
        if (tmp / "ingest.log").is_file():
            _keep_log(tmp / "ingest.log", logs / "ingest.log")
    return out


def _keep_log(made: Path, kept: Path) -> None:
    """Copy the ingest child's log to the artifact directory's ``logs/`` (when it can be written there)."""
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(made, kept)
    except OSError:
        pass


def _ingest_child(src: str, zoo_dir: Path, tmp: Path, name: str, version: str,
                  input_shape: Sequence[int] | None, log: Path) -> None:
    """Run ``pipeline/ingest_child``, its output kept in ``log`` (``childlog``); its EdgeplanError is raised here as
    the same class, anything else that ends it as one UnsupportedModelError."""
    import subprocess
    import sys

    from edgeplan import errors
    from edgeplan.pipeline.ingest_child import ERROR_MARK

    shape = ",".join(str(int(d)) for d in input_shape) if input_shape else ""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="-1", TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3"))
    proc = subprocess.run([sys.executable, "-m", "edgeplan.pipeline.ingest_child", src, str(zoo_dir), str(tmp), name,
                           version, shape], capture_output=True, text=True, env=env, check=False)
    if any(ln.strip() and not ln.startswith(ERROR_MARK) for ln in (proc.stdout + proc.stderr).splitlines()):
        childlog.keep(log, proc.args, proc.returncode, proc.stdout, proc.stderr)
    if proc.returncode == 0:
        return
    said = next((ln[len(ERROR_MARK):] for ln in reversed(proc.stderr.splitlines()) if ln.startswith(ERROR_MARK)), None)
    if said is not None:
        err = json.loads(said)
        cls = getattr(errors, err["type"], None)
        if not (isinstance(cls, type) and issubclass(cls, EdgeplanError)):
            cls = EdgeplanError
        raise cls(err["message"])
    if proc.returncode < 0:
        raise UnsupportedModelError(f"{src}: the conversion to ONNX crashed (signal {-proc.returncode}).")
    lines = [ln.strip() for ln in proc.stderr.strip().splitlines() if ln.strip()]
    last = next((ln for ln in reversed(lines) if "Error" in ln), lines[-1] if lines else "no message")
    raise UnsupportedModelError(f"{src}: the conversion to ONNX failed ({last[:300]}).")


def _size(path: Path) -> int | None:
    """Bytes of a model file (with its external data files) or SavedModel directory (None when it is not there:
    ingest says so)."""
    try:
        if path.is_dir():
            return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        return path.stat().st_size + sum(f.stat().st_size for f in external_files(path))
    except OSError:
        return None


# --------------------------------------------------------------------------------------------- analyze
def candidates(model: onnx.ModelProto) -> tuple[GraphView, list[Candidate]]:
    view = GraphView(model)
    return view, single_tensor_cuts(view)


def onnx_analysis(model: onnx.ModelProto, max_points: int | None) -> Analysis:
    """The ONNX side of ``analysis.json``: every single-tensor cut, not yet matched to the int8 model."""
    view, cands = candidates(model)
    first, last = endpoints(view)
    pts = [_point(i, c, None) for i, c in enumerate([first, *cands, last])]
    note = "" if cands else "no single-tensor cut: only points 0 (all-CPU) and P (all-TPU)"
    return Analysis(model_sha256=fingerprint(model), points=tuple(pts), max_points=max_points,
                    complete=False, onnx_candidates=len(cands), note=note)


def _point(index: int, c: Candidate, tflite_name: str | None, param_bytes: int | None = None) -> Point:
    return Point(
        index=index,
        tensor=c.tensor,
        tflite_tensor=tflite_name,
        prefix_param_bytes=c.prefix_param_bytes if param_bytes is None else param_bytes,
        prefix_macs=c.prefix_macs,
        boundary_bytes=c.boundary_bytes,
        shape=c.shape,
        onnx_node=c.node_name or None,
    )


# ----------------------------------------------------------------------------------------------- build
@dataclass(frozen=True)
class BuildResult:
    analysis: Analysis
    reports: dict[int, CompileReport]
    errors: dict[int, str]


def build(root: Path, params: dict, progress: Progress = _noop) -> BuildResult:
    """int8 conversion, matching, point choice, surgery, int8 cuts and Edge TPU compile at every point."""
    from edgeplan.pipeline import preflight
    from edgeplan.quantize import convert
    from edgeplan.quantize.calibration import CalibrationSpec, calibration_data, sample_inputs
    from edgeplan.quantize.match import match_candidates
    from edgeplan.quantize.pieces import node_float_bytes
    from edgeplan.quantize.pieces import plan as plan_pieces
    from edgeplan.quantize.tflite_graph import TfliteGraph

    model_path = root / "model.onnx"
    if not model_path.is_file():
        raise ArtifactError(f"{model_path}: missing; run `edgeplan ingest` (or `edgeplan compile`) first.")
    with memory.stage("analyze"):
        model = load_model(model_path)
        view, cands = candidates(model)
    convert.check_convertible(model, str(model_path))
    qp = params["quantize"]
    spec = CalibrationSpec.from_params(qp["calibration"])
    in_shape = view.shape(view.input.name)

    progress("int8 conversion", 0, 1)
    int8_path = root / "model_int8.tflite"
    calibration = calibration_data(spec, in_shape)
    model_sha = fingerprint(model)
    float_bytes = sum(node_float_bytes(view))
    budget = qp.get("piece_bytes") or (PIECES_PAST_LIMIT if float_bytes > PROTOBUF_LIMIT else None)
    pieces = plan_pieces(view, int(budget)) if budget else None  # a model past 2 GB cannot go to onnx2tf whole
    preflight.check(float_bytes, str(model_path), params["ingest"].get("max_memory_bytes"),
                    [p.child() for p in pieces] if pieces else None,
                    stages=("int8 conversion", "matching", "cutting", "verify"), step="no stage after ingest")
    made_from = _conversion_inputs(model_sha, calibration, pieces)
    data = _converted(int8_path, made_from)
    if data is None:
        with scratch("convert") as tmp, memory.stage("int8 conversion"):
            data = convert.to_int8_tflite(model_path, calibration, tmp, qp["timeout_s"], pieces, view,
                                          lambda done, total: progress("int8 conversion", done, total),
                                          log=root / childlog.DIR / "convert.log")
        # the record first: a kill between the two leaves a record naming bytes that are not there, and the next
        # build converts (once); the other order left a converted model without its record, converted again
        write_json_atomic(root / CONVERTED_FROM, {**made_from, "tflite_sha256": hashlib.sha256(data).hexdigest()})
        write_bytes_atomic(int8_path, data)
    progress("int8 conversion", 1, 1)

    tfl = TfliteGraph(data)
    progress("matching", 0, 1)
    xs = sample_inputs(spec, in_shape, 2, seed=spec.seed + 1)
    stored = model_path if writes_external(model.graph.initializer) else model  # onnxruntime maps the data file
    with memory.stage("matching"):  # (wide_fc_2g: +2.30 GB in 1.0 s, not +5.65 GB of copies in 19.9 s)
        matches = match_candidates(stored, cands, tfl, xs, min_cosine=qp["match_min_cosine"]) if cands else []
    progress("matching", 1, 1)
    kept = [m for m in matches if m.tflite_index is not None]
    dropped = [DroppedPoint(m.candidate.tensor, m.reason or "") for m in matches if m.tflite_index is None]
    max_points = params["analysis"]["max_points"]
    chosen = choose_evenly([m.candidate for m in kept], max_points, sum(view.node_param_bytes))
    chosen_set = {c.tensor for c in chosen}
    dropped += [DroppedPoint(m.candidate.tensor, f"not chosen: max_points={max_points}")
                for m in kept if m.candidate.tensor not in chosen_set]
    by_tensor = {m.candidate.tensor: m for m in kept}
    first, last = endpoints(view)
    in_name = tfl.tensors[tfl.inputs[0]].name
    out_name = tfl.tensors[tfl.outputs[0]].name
    points = [_point(0, first, in_name, 0)]
    for c in chosen:
        ix = by_tensor[c.tensor].tflite_index
        points.append(_point(len(points), c, tfl.tensors[ix].name, tfl.prefix_param_bytes(ix)))
    points.append(_point(len(points), last, out_name, tfl.param_bytes()))
    note = "" if cands else "no single-tensor cut: only points 0 (all-CPU) and P (all-TPU)"
    if cands and not kept:
        note = "no single-tensor cut survived the int8 conversion: only points 0 and P"
    analysis = Analysis(model_sha256=model_sha, points=tuple(points), dropped=tuple(dropped),
                        max_points=max_points, complete=True, onnx_candidates=len(cands), note=note)
    analysis.save(root / "analysis.json")
    return _segments(root, model, tfl, analysis, params, progress)


PIECES_PAST_LIMIT = 1 << 30  # the piece budget of a model past protobuf's limit when quantize.piece_bytes is null
CONVERTED_FROM = "model_int8.json"  # what model_int8.tflite was converted from: the checkpoint inside build


def _conversion_inputs(model_sha256: str, calibration, pieces=None) -> dict:
    """Everything the int8 conversion's output depends on: the ONNX model, the calibration samples, the
    quantize code, the converter's versions and the pieces it converts the model in."""
    from importlib.metadata import version

    return {"model_sha256": model_sha256,
            "calibration_sha256": hashlib.sha256(calibration.tobytes() + str(calibration.shape).encode()).hexdigest(),
            "code_sha256": code_digest(("quantize", "surgery/pieces.py")),
            "versions": {p: version(p) for p in ("tensorflow", "onnx2tf", "onnx")},
            "pieces": [p.to_json() for p in pieces or ()]}


def _converted(int8_path: Path, made_from: dict) -> bytes | None:
    """The int8 model of a conversion already done from exactly these inputs (a build interrupted after its
    conversion, by a kill or a lost worker, does not convert again), else None."""
    try:
        held = json.loads((int8_path.parent / CONVERTED_FROM).read_text())
        data = int8_path.read_bytes()
    except (OSError, ValueError):
        return None
    same = isinstance(held, dict) and held.get("tflite_sha256") == hashlib.sha256(data).hexdigest()
    return data if same and {k: held.get(k) for k in made_from} == made_from else None


def _segments(root, model, tfl, analysis: Analysis, params: dict, progress: Progress) -> BuildResult:
    seg_root = root / "segments"
    if seg_root.exists():
        shutil.rmtree(seg_root)  # a new analysis renumbers points: stale segments must not survive
    errors: dict[int, str] = {}
    reports: dict[int, CompileReport] = {}
    last = analysis.last
    int8_bytes = tfl.data  # the bytes of model_int8.tflite: not read again (wide_fc_2g: 0.57 GB more for the stage)
    light = light_copy(model)  # what the splits read: the weights are written from ``model`` (write_onnx's fill)
    weights = {t.name: t for t in model.graph.initializer}
    for p in analysis.points:
        d = seg_root / f"p{p.index}"
        d.mkdir(parents=True, exist_ok=True)
        trace = None
        try:
            with memory.stage("cutting"):
                _cut_point(d, p, last, light, weights, tfl, root / "model.onnx", int8_bytes)
            if p.index > 0:
                with memory.stage("compile"):
                    reports[p.index] = compile_prefix(d, params["compile"])
        except EdgeplanError as e:
            errors[p.index] = str(e)
        except Exception as e:  # keep every other point; say what broke here, the traceback in its error.json
            errors[p.index] = f"{type(e).__name__}: {e}"
            trace = traceback.format_exc()
        if p.index in errors:
            _point_failed(d, p.index, errors[p.index], trace)
        progress("segments", p.index + 1, len(analysis.points))
    return BuildResult(analysis, reports, errors)


def _point_failed(d: Path, point: int, error: str, trace: str | None) -> None:
    """One line on the terminal; the point's ``error.json`` holds the error and, for a fault of a library or of
    edgeplan, its traceback. A disk too full for even that file loses the file, not the line."""
    record = {"point": point, "error": error, **({"traceback": trace} if trace else {})}
    try:
        write_json_atomic(d / "error.json", record)
        where = f" (traceback in {d / 'error.json'})" if trace else ""
    except OSError as e:
        where = f" (its error.json could not be written: {e.strerror or e})"
    log.error("point %d failed: %s%s", point, error if trace is None else error.splitlines()[0], where)


def _cut_point(d: Path, p, last: int, light, weights, tfl, model_path: Path, int8_bytes: bytes) -> None:
    """prefix/suffix ONNX (onnx-graphsurgeon, on the model's light copy, ``weights`` written in its stubs' place)
    and int8 (cut from the one int8 model) of point ``p`` in ``d``."""
    from edgeplan.quantize.cut import cut
    from edgeplan.surgery import split

    if p.index == 0:
        _copy_onnx(model_path, d / "suffix.onnx")
        write_bytes_atomic(d / "suffix_int8.tflite", int8_bytes)
    elif p.index == last:
        _copy_onnx(model_path, d / "prefix.onnx")
        write_bytes_atomic(d / "prefix_int8.tflite", int8_bytes)
    else:  # written as they are serialized (a VGG prefix's bytes held whole cost 2-4 times its size), past 1 GiB
        # of weights with external data: the model's own data file, linked, where it holds the weights
        write_onnx(d / "prefix.onnx", split.prefix(light, p.tensor), data_from=model_path, fill=weights)
        write_onnx(d / "suffix.onnx", split.suffix(light, p.tensor), data_from=model_path, fill=weights)
        pre, suf = cut(tfl, tfl.by_name(p.tflite_tensor).index)
        write_bytes_atomic(d / "prefix_int8.tflite", pre)
        write_bytes_atomic(d / "suffix_int8.tflite", suf)


def _copy_atomic(src: Path, dst: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", dir=dst.parent)
    os.close(fd)
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def _copy_onnx(src: Path, dst: Path) -> None:
    """An .onnx file and the external data files it names (under their names, beside ``dst``: a hard link where
    the file system allows), the model last."""
    for f in external_files(src):
        link_or_copy(f, dst.parent / f.name)
    _copy_atomic(src, dst)


def compile_prefix(d: Path, settings: dict) -> CompileReport:
    """``prefix_edgetpu.tflite`` and ``compile.json`` for the prefix in ``d`` (real compiler when present)."""
    from edgeplan.compile import edgetpu_compiler, emulated

    choice = settings.get("compiler", "auto")
    use_real = choice == "edgetpu_compiler" or (choice == "auto" and edgetpu_compiler.find())
    if use_real:
        (report, out), = edgetpu_compiler.compile_models(
            [d / "prefix_int8.tflite"], d / "edgetpu", allow_multiple_subgraphs=settings["allow_multiple_subgraphs"])
        write_bytes_atomic(d / "prefix_edgetpu.tflite", out.read_bytes())
    else:
        (report, data), = emulated.compile_models(
            [("prefix_int8.tflite", (d / "prefix_int8.tflite").read_bytes())],
            onchip_bytes=settings["onchip_bytes"],
            allow_multiple_subgraphs=settings["allow_multiple_subgraphs"],
        )
        write_bytes_atomic(d / "prefix_edgetpu.tflite", data)
    report.save(d / "compile.json")
    return report


def _ticker(progress: Progress, stage: str, total: int) -> Callable[[], None]:
    """A callback that reports one more of ``total`` units of ``stage`` each time it is called."""
    done = itertools.count(1)
    return lambda: progress(stage, next(done), total)


# ---------------------------------------------------------------------------------------------- verify
def verify(root: Path, params: dict, progress: Progress = _noop) -> VerifyReport:
    from edgeplan.quantize.calibration import CalibrationSpec, sample_inputs
    from edgeplan.verify.checks import verify as run_checks

    analysis = Analysis.load(root / "analysis.json")
    if not analysis.complete:
        raise ArtifactError(f"{root / 'analysis.json'}: not completed by the build stage; run `edgeplan compile`.")
    info = ModelInfo.load(root / "model.json")
    if info.sha256 != analysis.model_sha256:
        raise ArtifactError(
            f"{root / 'analysis.json'}: made for another model.onnx (sha256 {analysis.model_sha256[:12]}..., "
            f"model.json says {info.sha256[:12]}...); run `edgeplan build {root}` again."
        )
    spec = CalibrationSpec.from_params(params["quantize"]["calibration"])
    vp = params["verify"]
    xs = sample_inputs(spec, info.inputs[0].shape, vp["samples"], seed=vp["seed"])
    with memory.stage("verify"):
        report = run_checks(root, analysis, xs, vp["min_cosine"], _ticker(progress, "verify", len(analysis.points)))
    report.save(root / "verify.json")
    return report


# ---------------------------------------------------------------------------------------------- accuracy gate
def accuracy(root: Path, params: dict, progress: Progress = _noop) -> AccuracyReport | None:
    """``accuracy.json`` (params.yaml ``accuracy``), or None when no evaluation set is configured (a stale
    ``accuracy.json`` is then removed: it would gate with a dataset no longer asked for)."""
    from edgeplan.verify import accuracy as gate

    ap = params["accuracy"]
    if not ap.get("dataset"):
        (root / "accuracy.json").unlink(missing_ok=True)
        return None
    analysis = Analysis.load(root / "analysis.json")
    info = ModelInfo.load(root / "model.json")
    dataset = gate.resolve(str(ap["dataset"]), root.parent.parent)
    x, y = gate.load(dataset, info.inputs[0].shape, ap.get("max_samples"))
    with memory.stage("accuracy gate"):
        report = gate.measure(root, analysis, dataset, x, y, float(ap["max_top1_drop"]),
                              _ticker(progress, "accuracy gate", len(analysis.points)))
    report.save(root / "accuracy.json")
    return report




def stream(root: Path, params: dict, progress: Progress = _noop) -> StreamInfo:
    """``stream/``: the int8 model with its large weights split (``flashmem.max_segment_bytes``), one segment
    per layer, and the check that chaining them equals the int8 model with both kernel sets (FlashMem §4.3)."""
    import hashlib
    from functools import partial

    import numpy as np

    from edgeplan.profile.capacity import op_class
    from edgeplan.quantize import litert
    from edgeplan.quantize import stream as cutting
    from edgeplan.quantize.tflite_graph import TfliteGraph

    fp = params["flashmem"]
    int8 = (root / "model_int8.tflite").read_bytes()
    out = root / "stream"
    if out.exists():
        shutil.rmtree(out)
    with memory.stage("stream"):
        split = cutting.split_large_ops(int8, int(fp["max_segment_bytes"]))
        g, original = TfliteGraph(split), TfliteGraph(int8)
        parted = sorted({t.name.rsplit("_part", 1)[0] for t in g.tensors if t.constant and "_part" in t.name}
                        - {t.name for t in g.tensors})
        write_bytes_atomic(out / "model_split.tflite", split)
        layers, blobs = [], []
        ls = cutting.layers(g)
        for layer in ls:
            blob = cutting.cut_range(g, layer.first_op, layer.last_op, f"l{layer.index}")
            rel = f"stream/layers/l{layer.index:04d}.tflite"
            write_bytes_atomic(root / rel, blob)
            ins, outs = cutting.boundary(g, layer.first_op, layer.last_op)
            layers.append(StreamLayer(layer.index, layer.name, layer.op, op_class(layer.op), layer.weight_bytes,
                                      layer.first_op, layer.last_op, rel, hashlib.sha256(blob).hexdigest(),
                                      len(blob), tuple(g.tensors[i].name for i in ins),
                                      tuple(g.tensors[i].name for i in outs)))
            blobs.append(blob)
            progress("stream", layer.index + 1, 2 * len(ls))
        rng = np.random.default_rng(params["verify"]["seed"])
        samples = int(fp["verify_samples"])
        identical = {}
        for kernels, deterministic in (("reference", True), ("xnnpack", False)):
            build_it = partial(litert.interpreter, deterministic=deterministic)
            same = True
            for _ in range(samples):
                x = {original.tensors[i].name: rng.integers(-128, 128, original.tensors[i].shape, dtype=np.int8)
                     for i in original.inputs}
                want = cutting.run_chain([int8], x, build_it)
                got = cutting.run_chain(blobs, x, build_it)
                same &= want.keys() == got.keys() and all(np.array_equal(want[k], got[k]) for k in want)
            identical[kernels] = bool(same)
        progress("stream", 2 * len(ls), 2 * len(ls))
    info = StreamInfo(hashlib.sha256(int8).hexdigest(), "stream/model_split.tflite",
                      hashlib.sha256(split).hexdigest(), int(fp["max_segment_bytes"]), tuple(parted),
                      tuple(layers), identical, samples)
    info.save(out / "stream.json")
    return info


def parallax(root: Path, params: dict, progress: Progress = _noop) -> dict:
    """``parallax/``: Parallax plans for the int8 model and every point's CPU suffix, measured on this host, their
    sub-models, and the check that they give the model's bits (``plan/parallax/stage``)."""
    from edgeplan.plan.parallax import stage

    if not (root / "model_int8.tflite").is_file():
        raise ArtifactError(f"{root / 'model_int8.tflite'}: missing; run `edgeplan build {root}` first.")
    with memory.stage("parallax"):
        return stage.build(root, dict(params["parallax"]), int(params["verify"]["seed"]), progress)
