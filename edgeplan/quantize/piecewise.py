"""A model's int8 conversion piece by piece (``quantize/pieces``), so that the converter's memory follows the
largest piece instead of the model: per piece (and per part of a split layer), onnx2tf in one child and the
TFLite converter's calibration in another (``piecewise_child calibrate``); then one child quantizes every piece
with the ranges the pieces share at their boundaries and stitches them into the one int8 model
(``piecewise_child quantize``). Each child is a fresh process: onnx2tf names the TensorFlow ops it makes with
process-wide counters, so a second conversion in one process would name them differently.

Calibration runs along the chain: a piece is calibrated on the float outputs its predecessor computed on the
calibration samples (NHWC, on disk between the children), so every tensor's range is the range a calibration of the
whole model records — except that the whole model's calibration logs an op's inputs after the op ran, so where
TFLite ran an op in place (an ADD over one of its inputs) it records the input with the output's range; a boundary
at such an op's output, where nothing runs in place, records the input's own, narrower range.
"""
from __future__ import annotations

import json
import logging
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from edgeplan.graph.model import GraphView
from edgeplan.quantize.pieces import Piece
from edgeplan.quantize.piecewise_child import OUTPUTS, SampleWriter, read_samples, sample_count
from edgeplan.surgery.pieces import piece_model

CHILD = [sys.executable, "-m", "edgeplan.quantize.piecewise_child"]
log = logging.getLogger(__name__)


def convert(view: GraphView, pieces: list[Piece], source: Path, calibration: np.ndarray, workdir: Path,
            timeout: float, progress: Callable[[int, int], None] | None = None, log: Path | None = None) -> bytes:
    from edgeplan.quantize.convert import _onnx2tf, run_tf_child

    workdir = Path(workdir).resolve()  # onnx2tf runs in each piece's directory
    tick = progress or (lambda done, total: None)
    total, done = sum(p.parts for p in pieces) + 1, 0
    inputs = workdir / "inputs_0.npy"
    np.save(inputs, calibration.transpose(0, 2, 3, 1) if calibration.ndim == 4 else calibration)
    plan = {"pieces": [], "boundaries": [p.end for p in pieces[:-1]]}
    for piece in pieces:
        last = piece.index == len(pieces) - 1
        dirs = []
        for part in range(piece.parts):
            where = f"{source} (piece {piece.index + 1} of {len(pieces)}" + (
                f", part {part + 1} of {piece.parts}" if piece.parts > 1 else "") + ")"
            d = workdir / f"piece{piece.index:03d}" / f"part{part:02d}"
            d.mkdir(parents=True)
            onnx.save(piece_model(view, piece, part), str(d / "piece.onnx"))
            _onnx2tf(d / "piece.onnx", d, timeout, where, log)
            run_tf_child([*CHILD, "calibrate", str(d / "saved_model"), str(inputs), str(d),
                          *([] if last else ["--outputs"])], where, "int8 calibration", timeout, d, log)
            shutil.rmtree(d / "saved_model")
            (d / "piece.onnx").unlink()
            dirs.append(d)
            done += 1
            tick(done, total)
        if not last:
            inputs = workdir / f"inputs_{piece.index + 1}.npy"
            _join_parts([d / OUTPUTS for d in dirs], inputs)
        plan["pieces"].append({"dirs": [str(d) for d in dirs], **piece.to_json()})
    (workdir / "pieces.json").write_text(json.dumps(plan, indent=1))
    out = workdir / "model_int8.tflite"
    run_tf_child([*CHILD, "quantize", str(workdir / "pieces.json"), str(out)], source, "int8 quantization", timeout,
                 workdir, log)
    requantized = json.loads((workdir / "stitch.json").read_text())["requantized"]
    if requantized:
        log.warning("%s: requantized between pieces at %s (the next piece quantized the tensor with another scale)",
                    source, ", ".join(requantized))
    tick(total, total)
    return out.read_bytes()


def _join_parts(paths: list[Path], out: Path) -> None:
    """The outputs of a layer's parts side by side (along the channels, the last axis), one sample at a time."""
    if len(paths) == 1:
        paths[0].replace(out)
        return
    readers = [read_samples(p) for p in paths]
    writer = None
    try:
        for _ in range(sample_count(paths[0])):
            y = np.concatenate([next(r) for r in readers], axis=-1)
            if writer is None:
                writer = SampleWriter(out, sample_count(paths[0]), y.shape)
            writer.write(y)
    finally:
        if writer is not None:
            writer.close()
    for p in paths:
        p.unlink()
