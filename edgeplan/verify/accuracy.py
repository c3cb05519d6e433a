"""The accuracy gate (params.yaml ``accuracy``): verify proves that every point's int8 chain equals the whole
int8 model; this measures whether the int8 model still classifies. Top-1 of the float model (onnxruntime) and of
the int8 chain at every point (LiteRT, the device's default kernels; an Edge TPU prefix is run as its int8
model: no Edge TPU here) on a labelled evaluation set. A point whose drop exceeds ``max_top1_drop`` is not
publishable.

The evaluation set is a ``.npz`` file with ``x`` (float, the model's NCHW input layout, one sample per row) and
``y`` (integer labels, one per row), or ``zoo:NAME`` for a zoo model's held-out set.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from edgeplan.artifacts import AccuracyPoint, AccuracyReport, Analysis
from edgeplan.errors import AccuracyGateError
from edgeplan.quantize import litert
from edgeplan.verify.checks import segment_paths


def resolve(dataset: str, out_root: Path) -> Path:
    """The ``.npz`` file ``dataset`` names: a path, or ``zoo:NAME`` (built into ``out_root/.zoo`` with its model)."""
    if dataset.startswith("zoo:"):
        from edgeplan.zoo import eval_set

        return eval_set(dataset[4:], Path(out_root) / ".zoo")
    path = Path(dataset)
    if not path.is_file():
        raise AccuracyGateError(f"accuracy.dataset: {path}: no such file (a .npz with x and y, or zoo:NAME)")
    return path


def load(path: Path, shape: tuple[int, ...], limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` of a labelled set for a model whose input has ``shape`` (NCHW), checked: what and where."""
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = {"x", "y"} - set(f.files)
            if missing:
                raise AccuracyGateError(f"{path}: no {' or '.join(sorted(missing))} array; the evaluation set "
                                        "holds x (inputs, NCHW) and y (integer labels)")
            x, y = f["x"], f["y"]
    except (OSError, ValueError, EOFError) as e:  # not a zip / not .npy members / object arrays
        raise AccuracyGateError(f"{path}: not a readable .npz evaluation set ({type(e).__name__}: {e})") from None
    if x.dtype.kind != "f" or x.ndim != len(shape) or tuple(x.shape[1:]) != tuple(shape[1:]):
        raise AccuracyGateError(f"{path}: x is {x.dtype} {tuple(x.shape)}; the model takes float "
                                f"(N, {', '.join(map(str, shape[1:]))}) (NCHW)")
    if y.dtype.kind not in "iu" or y.shape != (len(x),) or len(x) == 0:
        raise AccuracyGateError(f"{path}: y is {y.dtype} {tuple(y.shape)}; it must hold one integer label per "
                                f"row of x ({len(x)})")
    if not np.isfinite(x).all():
        raise AccuracyGateError(f"{path}: x holds NaN or infinite values")
    if limit is not None:
        x, y = x[:limit], y[:limit]
    return x.astype(np.float32), y.astype(np.int64)


def _top1(logits: np.ndarray, y: np.ndarray, where: str) -> float:
    flat = logits.reshape(len(logits), -1)
    if flat.shape[1] < 2 or int(y.max()) >= flat.shape[1] or int(y.min()) < 0:
        raise AccuracyGateError(f"{where}: the model gives {flat.shape[1]} output values per sample; labels run "
                                f"{int(y.min())}..{int(y.max())}: top-1 needs one logit per class")
    return float(np.mean(flat.argmax(axis=1) == y))


def measure(root: Path, analysis: Analysis, dataset: Path, x: np.ndarray, y: np.ndarray, max_drop: float,
            progress=None) -> AccuracyReport:
    """Top-1 of the float model and of the int8 chain at every point of ``root`` on ``(x, y)``."""
    from edgeplan.verify.checks import _onnx_run

    float_top1 = _top1(_onnx_run(root / "model.onnx", x), y, str(dataset))
    whole = litert.interpreter((root / "model_int8.tflite").read_bytes(), deterministic=True)
    in_detail, out_detail = whole.get_input_details()[0], whole.get_output_details()[0]
    qs = [litert.quantize(litert.nchw_to_nhwc(s[None]), in_detail) for s in x]
    points = []
    for p in analysis.points:
        seg = segment_paths(root, p.index, analysis.last)
        chain = [litert.Runner(litert.interpreter(path.read_bytes(), deterministic=False))
                 for path in (seg.prefix_int8, seg.suffix_int8) if path is not None]
        outs = []
        for q in qs:
            for run in chain:
                q = run(q)
            outs.append(litert.dequantize(q, out_detail))
        top1 = _top1(np.concatenate(outs), y, str(dataset))
        drop = float_top1 - top1
        points.append(AccuracyPoint(p.index, top1, drop, drop <= max_drop))
        if progress:
            progress()
    return AccuracyReport(analysis.model_sha256, str(dataset), hashlib.sha256(dataset.read_bytes()).hexdigest(),
                          len(x), float(max_drop), float_top1, tuple(points), "xnnpack")


def excluded_points(d: Path, params: dict) -> tuple[int, ...]:
    """The points of artifact directory ``d`` the accuracy gate refused (none when no gate ran and none is
    configured). Raises when the gate is configured but has not run on this model.onnx, and when no point passed:
    such a model is neither planned nor published."""
    from edgeplan.artifacts import ModelInfo

    path = d / "accuracy.json"
    if not path.is_file():
        if params["accuracy"].get("dataset"):
            raise AccuracyGateError(f"{path}: missing, and params.yaml sets accuracy.dataset; run `edgeplan accuracy "
                                    f"{d}` (or `edgeplan compile`) first")
        return ()
    report = AccuracyReport.load(path)
    if report.model_sha256 != ModelInfo.load(d / "model.json").sha256:
        raise AccuracyGateError(f"{path}: measured on another model.onnx; run `edgeplan accuracy {d}` again")
    if not report.ok:
        best = max(p.top1 for p in report.points)
        raise AccuracyGateError(f"{d}: failed the accuracy gate at every point (int8 top-1 at most {best:.3f}, float "
                                f"{report.float_top1:.3f}, allowed drop {report.max_top1_drop}); nothing of it is "
                                f"planned or published (see {path})")
    if 0 in report.excluded:
        raise AccuracyGateError(f"{d}: point 0 (the whole int8 model on the CPU) failed the accuracy gate while "
                                f"others passed; SwapLess cannot leave point 0 out (see {path})")
    return report.excluded
