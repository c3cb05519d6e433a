"""Verification of a model's segments (DESIGN.md "edgeplan verify").

At every point k:
- float: ``suffix.onnx(prefix.onnx(x))`` against ``model.onnx(x)``: max |d| <= 1e-4 * max(1, max|y|);
- int8: ``suffix_int8(prefix_int8(q))`` against ``model_int8(q)``: 100% identical elements;
- int8 vs float: cosine similarity of the dequantized int8 output and the float output >= min_cosine.
And once per model: the float output must depend on the input (random or constant weights can make
it flat), measured as the largest relative change of the output between the sample inputs.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgeplan.artifacts import Analysis, PointCheck, VerifyReport
from edgeplan.graph.evaluate import cosine
from edgeplan.quantize import litert

FLOAT_RTOL = 1e-4
MIN_INPUT_DEPENDENCE = 1e-3


@dataclass(frozen=True)
class Segments:
    prefix_onnx: Path | None
    suffix_onnx: Path | None
    prefix_int8: Path | None
    suffix_int8: Path | None


def segment_paths(root: Path, k: int, last: int) -> Segments:
    d = root / "segments" / f"p{k}"
    return Segments(
        d / "prefix.onnx" if k > 0 else None,
        d / "suffix.onnx" if k < last else None,
        d / "prefix_int8.tflite" if k > 0 else None,
        d / "suffix_int8.tflite" if k < last else None,
    )


def _onnx_run(path: Path, xs: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: x[None]})[0] for x in xs])


def _tflite_run(path: Path, qs: list[np.ndarray]) -> list[np.ndarray]:
    it = litert.interpreter(path.read_bytes(), deterministic=True)
    return [litert.run(it, q) for q in qs]


def input_dependence(ys: np.ndarray) -> float:
    """Largest relative change of the output across samples: 0 for a model that ignores its input."""
    base = ys[0]
    scale = max(float(np.abs(base).max()), 1e-12)
    return max(float(np.abs(y - base).max()) / scale for y in ys[1:]) if len(ys) > 1 else 0.0


def verify(root: Path, analysis: Analysis, xs: np.ndarray, min_cosine: float, progress=None) -> VerifyReport:
    """Run every check at every point of ``root`` on the float inputs ``xs`` (NCHW, one sample per row)."""
    whole = _onnx_run(root / "model.onnx", xs)
    dep = input_dependence(whole)
    whole_int8 = litert.interpreter((root / "model_int8.tflite").read_bytes(), deterministic=True)
    in_detail = whole_int8.get_input_details()[0]
    out_detail = whole_int8.get_output_details()[0]
    qs = [litert.quantize(litert.nchw_to_nhwc(x[None]), in_detail) for x in xs]
    ref_int8 = [litert.run(whole_int8, q) for q in qs]
    tolerance = FLOAT_RTOL * max(1.0, float(np.abs(whole).max()))
    checks = []
    for p in analysis.points:
        seg = segment_paths(root, p.index, analysis.last)
        try:
            checks.append(_check_point(p.index, seg, xs, qs, whole, ref_int8, out_detail, tolerance, min_cosine))
        except Exception as e:  # a broken segment fails its point, the others are still checked
            checks.append(PointCheck(p.index, None, tolerance, False, 0.0, False, 0.0, False,
                                     error=f"{type(e).__name__}: {e}"))
        if progress:
            progress()
    dep_ok = dep > MIN_INPUT_DEPENDENCE
    return VerifyReport(
        model_sha256=analysis.model_sha256,
        samples=len(xs),
        min_cosine=min_cosine,
        input_dependence=dep,
        input_dependence_ok=dep_ok,
        points=tuple(checks),
        ok=dep_ok and all(c.ok for c in checks),
    )


def _check_point(k, seg: Segments, xs, qs, whole, ref_int8, out_detail, tolerance, min_cosine) -> PointCheck:
    # float chain
    h = xs
    if seg.prefix_onnx is not None:
        h = _onnx_run(seg.prefix_onnx, h)
    y = _onnx_run(seg.suffix_onnx, h) if seg.suffix_onnx is not None else h
    diff = float(np.abs(y - whole).max())
    # int8 chain
    hq = qs
    if seg.prefix_int8 is not None:
        hq = _tflite_run(seg.prefix_int8, hq)
    yq = _tflite_run(seg.suffix_int8, hq) if seg.suffix_int8 is not None else hq
    same = sum(int(np.sum(a == b)) for a, b in zip(yq, ref_int8))
    total = sum(a.size for a in ref_int8)
    identical = same / total if total else 0.0
    # int8 against float: the worst sample
    deq = [litert.nhwc_to_nchw(litert.dequantize(a, out_detail)) for a in yq]
    cos = min(cosine(d, w) for d, w in zip(deq, whole))
    return PointCheck(
        point=k,
        float_max_abs_diff=diff,
        float_tolerance=tolerance,
        float_ok=diff <= tolerance,
        int8_identical_fraction=identical,
        int8_ok=identical == 1.0,
        int8_float_cosine=cos,
        cosine_ok=cos >= min_cosine,
    )
