"""What a deployment revision contains: every model's verified segments at every partition point (point 0
alone, the whole int8 model, for a class without an Edge TPU: no other is ever chosen there), its profile on
the device class, the SwapLess plan, self-tests and quantization (pipeline side)."""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgeplan import __version__
from edgeplan.artifacts import Analysis, CompileReport, ModelInfo, VerifyReport
from edgeplan.bundle.manifest import (
    MEDIA,
    BlobRef,
    ModelEntry,
    Quantization,
    SelfTest,
    carried_points,
    content_digest,
    sha256,
)
from edgeplan.errors import ArtifactError
from edgeplan.plan.swapless.plan import SwapLessPlan
from edgeplan.profile import fleet as fleet_mod
from edgeplan.quantize import litert
from edgeplan.quantize.calibration import CalibrationSpec, sample_inputs
from edgeplan.verify.accuracy import excluded_points

SELFTESTS = 2
SELFTEST_SEED = 77


@dataclass(frozen=True)
class Bundle:
    """A revision before it has a number and a signature: blob name -> bytes, and what the manifest says."""

    deployment: str
    device_class: str
    accelerator: str
    compiler: str
    code_version: str
    models: tuple[ModelEntry, ...]
    plan: str
    blobs: dict  # name -> bytes
    refs: tuple[BlobRef, ...]
    plans: dict = field(default_factory=dict)  # planner -> blob name

    @property
    def content_sha256(self) -> str:
        return content_digest(self.models, self.refs, self.plan, self.plans)

    @property
    def size(self) -> int:
        return sum(r.size for r in self.refs)


def _quantization(detail: dict, float_shape) -> Quantization:
    shape = tuple(int(x) for x in detail["shape"])
    scale, zero = detail["quantization"]
    perm = (0, 2, 3, 1) if len(float_shape) == 4 and tuple(float_shape) != shape else ()
    return Quantization(tuple(int(x) for x in float_shape), shape, np.dtype(detail["dtype"]).name, float(scale),
                        int(zero), perm)


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def build(root: Path, name: str, params: dict) -> Bundle:
    """The bundle of deployment ``name`` from the artifacts under ``root`` (its plan must exist: `edgeplan
    plan swapless`). Refuses a model whose verify.json is missing, failed or made for another model.onnx."""
    from edgeplan.pipeline.planning import deployment

    dep = deployment(params, name)
    fleet = fleet_mod.load(params, {d["name"] for d in params.get("deployments") or []})
    dc = fleet.device_class(dep["device_class"])
    plan_path = Path(root) / "deployments" / name / "plans" / "swapless.json"
    if not plan_path.is_file():
        raise ArtifactError(f"{plan_path}: missing; run `edgeplan plan swapless --deployment {name}` first")
    plan = SwapLessPlan.load(plan_path)
    blobs: dict[str, bytes] = {}
    models, compilers = [], set()
    spec = CalibrationSpec.from_params(params["quantize"]["calibration"])
    for i, pm in enumerate(plan.models):
        d = Path(root) / pm.name / pm.version
        prefix = f"models/{pm.name}/{pm.version}"
        info = ModelInfo.load(d / "model.json")
        report = VerifyReport.load(d / "verify.json")
        if not report.ok or report.model_sha256 != info.sha256:
            why = "failed verify" if not report.ok else "was verified as another model.onnx"
            raise ArtifactError(f"{d}: {why}; nothing of it is published (see {d / 'verify.json'}, "
                                "re-run `edgeplan compile`)")
        excluded = excluded_points(d, params)
        refused = ({pm.point} | {r.points[i] for r in plan.stable_regimes()}) & set(excluded)
        if refused:
            raise ArtifactError(f"{plan_path}: plans {pm.name} at points {sorted(refused)}, which failed the "
                                "accuracy gate; re-plan")
        analysis = Analysis.load(d / "analysis.json")
        if analysis.last != pm.last_point:
            raise ArtifactError(f"{plan_path}: plans {pm.name} with {pm.last_point} points, {d} has "
                                f"{analysis.last}; re-plan")
        for p in carried_points(analysis.last, dc.accelerator.kind):
            seg = d / "segments" / f"p{p}"
            files = (["prefix_edgetpu.tflite", "prefix_int8.tflite", "compile.json"] if p > 0 else []) + (
                ["suffix_int8.tflite"] if p < analysis.last else [])
            for f in files:
                path = seg / f
                if not path.is_file():
                    raise ArtifactError(f"{path}: missing; re-run `edgeplan compile`")
                blobs[f"{prefix}/segments/p{p}/{f}"] = path.read_bytes()
            if p > 0:
                compilers.add(CompileReport.load(seg / "compile.json").compiler)
        profile = d / "profiles" / f"{dc.name}.json"
        if not profile.is_file():
            raise ArtifactError(f"{profile}: missing; run `edgeplan profile run {d} --device-class {dc.name}`")
        blobs[f"{prefix}/profiles/{dc.name}.json"] = profile.read_bytes()
        # self-tests: float inputs and the whole int8 model's output (every prefix -> suffix chain equals it)
        whole = litert.interpreter((d / "model_int8.tflite").read_bytes(), deterministic=True)
        in_d, out_d = whole.get_input_details()[0], whole.get_output_details()[0]
        xs = sample_inputs(spec, info.inputs[0].shape, SELFTESTS, seed=SELFTEST_SEED)
        tests = []
        for k, x in enumerate(xs):
            y = litert.run(whole, litert.quantize(litert.nchw_to_nhwc(x[None]), in_d))
            blobs[f"{prefix}/selftest/input_{k}.npy"] = _npy(x[None])
            blobs[f"{prefix}/selftest/expected_{k}.npy"] = _npy(y)
            tests.append(SelfTest(f"{prefix}/selftest/input_{k}.npy", f"{prefix}/selftest/expected_{k}.npy"))
        models.append(ModelEntry(pm.name, pm.version, info.sha256, analysis.last,
                                 _quantization(in_d, info.inputs[0].shape),
                                 _quantization(out_d, info.outputs[0].shape), tuple(tests),
                                 f"{prefix}/profiles/{dc.name}.json", excluded))
    blobs[f"deployments/{name}/plans/swapless.json"] = plan_path.read_bytes()
    plans = {"swapless": f"deployments/{name}/plans/swapless.json"}
    streamed = _flashmem(Path(root), name, plan)
    if streamed:
        blobs.update(streamed)
        plans["flashmem"] = f"deployments/{name}/plans/flashmem.json"
    parallel = _parallax(Path(root), name, plan, blobs)
    if parallel:
        blobs.update(parallel)
        plans["parallax"] = f"deployments/{name}/plans/parallax.json"
    planner, split = _split(Path(root), name, plan, {d.id for d in fleet.devices if d.deployment == name})
    if planner:
        blobs.update(split)
        plans[planner] = f"deployments/{name}/plans/{planner}.json"
    refs = tuple(BlobRef(n, MEDIA.get(Path(n).suffix, "application/octet-stream"), len(b), sha256(b))
                 for n, b in sorted(blobs.items()))
    compiler = "emulated" if "emulated" in compilers or not compilers else min(compilers)
    return Bundle(name, dc.name, dc.accelerator.kind, compiler, __version__, tuple(models),
                  f"deployments/{name}/plans/swapless.json", blobs, refs, plans)


def _flashmem(root: Path, name: str, plan: SwapLessPlan) -> dict[str, bytes]:
    """The FlashMem plan and the segments it streams, when the deployment has one made for these model
    versions and their streaming layers (else refused: re-plan)."""
    from edgeplan.artifacts import StreamInfo
    from edgeplan.plan.flashmem.plan import FlashMemPlan

    base = root / "deployments" / name
    path = base / "plans" / "flashmem.json"
    if not path.is_file():
        return {}
    fm = FlashMemPlan.load(path)
    versions = {m.name: m.version for m in plan.models}
    out = {f"deployments/{name}/plans/flashmem.json": path.read_bytes()}
    for m in fm.models:
        stream = root / m.name / m.version / "stream" / "stream.json"
        if versions.get(m.name) != m.version or not stream.is_file() or \
                StreamInfo.load(stream).split_sha256 != m.split_sha256:
            raise ArtifactError(f"{path}: planned for {m.name} {m.version} as it was streamed then; run "
                                f"`edgeplan plan flashmem --deployment {name}` again")
        for seg in m.segments:
            out[f"deployments/{name}/{seg.file}"] = _named(base / seg.file, seg.sha256, "segment the plan names",
                                                           f"run `edgeplan plan flashmem --deployment {name}` again")
    return out


def _parallax(root: Path, name: str, plan: SwapLessPlan, blobs: dict[str, bytes]) -> dict[str, bytes]:
    """The Parallax plan and the sub-models it runs, when the deployment has one made for these model versions
    and the suffixes in ``blobs`` (else refused: re-plan)."""
    from edgeplan.plan.parallax.deployment import PLAN_FILE, ParallaxDeploymentPlan

    base = root / "deployments" / name
    path = base / PLAN_FILE
    if not path.is_file():
        return {}
    px = ParallaxDeploymentPlan.load(path)
    versions = {m.name: m.version for m in plan.models}
    again = f"run `edgeplan plan parallax --deployment {name}` again"
    out = {f"deployments/{name}/{PLAN_FILE}": path.read_bytes()}
    for m in px.models:
        if versions.get(m.name) != m.version:
            raise ArtifactError(f"{path}: planned for {m.name} {m.version}, which the deployment does not serve; {again}")
        for pp in m.points:
            suffix = blobs.get(f"models/{m.name}/{m.version}/segments/p{pp.point}/suffix_int8.tflite", b"")
            if sha256(suffix) != pp.suffix_sha256:
                raise ArtifactError(f"{path}: planned {m.name}'s point {pp.point} for another suffix; {again}")
            for st in pp.stages:
                for s in st.submodels:
                    out[f"deployments/{name}/{s.file}"] = _named(base / s.file, s.sha256, "sub-model the plan names",
                                                                 again)
    return out


def _split(root: Path, name: str, plan: SwapLessPlan, devices: set[str]) -> tuple[str | None, dict[str, bytes]]:
    """(planner, files) of the deployment's multi-device split (ADaPS tiles or AutoDiCE stages: the plan, tables,
    rankfile, hostfile, the split's summary and every rank's int8 stages), when it has one made for the model
    version it serves, that version's int8 model and the registry's devices of the deployment (else refused:
    re-plan); (None, {}) without one."""
    import json

    from edgeplan.distributed.rank import RankError, parse_tables
    from edgeplan.runtime.split import COMMON, PLANNERS

    base = root / "deployments" / name
    found = [p for p in PLANNERS if (base / "plans" / f"{p}.json").is_file()]
    if not found:
        return None, {}
    if len(found) > 1:
        raise ArtifactError(f"{base / 'plans'}: holds {' and '.join(found)} plans; a deployment runs one split: plan "
                            f"it again (`edgeplan plan {found[0]} --deployment {name}` removes the other)")
    planner, kind = found[0], PLANNERS[found[0]]
    path = base / "plans" / f"{planner}.json"
    again = f"run `edgeplan plan {planner} --deployment {name}` again"
    try:
        record = json.loads(path.read_text())
        model, version, int8_sha, tables_sha = (record["model"], record["version"], record["model_int8_sha256"],
                                                record[kind.record]["tables_sha256"])
    except (ValueError, KeyError, TypeError) as e:
        raise ArtifactError(f"{path}: not a {planner} plan ({type(e).__name__}: {e}); {again}") from None
    versions = {m.name: m.version for m in plan.models}
    if versions.get(model) != version:
        raise ArtifactError(f"{path}: planned for {model} {version}, which the deployment does not serve; {again}")
    int8 = root / model / version / "model_int8.tflite"
    if sha256(int8.read_bytes()) != int8_sha:
        raise ArtifactError(f"{path}: planned for another {int8}; {again}")
    split = base / kind.dir
    raw = _named(split / "tables.json", tables_sha, "tables the plan names", again)
    try:
        tables = parse_tables(raw)
    except RankError as e:
        raise ArtifactError(f"{split / 'tables.json'}: {e}; {again}") from None
    gone = sorted({r["device"] for r in tables["ranks"]} - devices)
    if gone:
        raise ArtifactError(f"{path}: splits the model over {', '.join(gone)}, which the fleet registry no longer "
                            f"assigns to {name}; {again}")
    prefix = f"deployments/{name}/{kind.dir}"
    out = {f"deployments/{name}/plans/{planner}.json": path.read_bytes(), f"{prefix}/tables.json": raw}
    for f in (*COMMON[1:], kind.summary):
        if not (split / f).is_file():
            raise ArtifactError(f"{split / f}: missing; {again}")
        out[f"{prefix}/{f}"] = (split / f).read_bytes()
    for s in tables["stages"]:
        out[f"{prefix}/{s['int8']}"] = _named(split / s["int8"], s["int8_sha256"], "stage the tables name", again)
    return planner, out


def _named(path: Path, sha: str, what: str, again: str) -> bytes:
    """The bytes of ``path``, which a plan names by ``sha`` (refused when missing or other: plan again)."""
    data = path.read_bytes() if path.is_file() else b""
    if sha256(data) != sha:
        raise ArtifactError(f"{path}: missing or not the {what}; {again}")
    return data
