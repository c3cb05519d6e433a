"""The whole canonical ONNX model to one int8 TFLite model (int8 input and output).

onnx2tf (in a child process, with a time limit) turns the ONNX graph into an NHWC TensorFlow
SavedModel; the TFLite converter then quantizes it with the representative data. Ops with no int8
kernel may fall back to float (TFLITE_BUILTINS): they become float islands between DEQUANTIZE and
QUANTIZE, which run on the CPU and end the Edge TPU part.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx

from edgeplan.errors import ConversionError

log = logging.getLogger(__name__)

_SAMPLE = "calibration_image_sample_data_20x128x128x3_float32.npy"


def _onnx2tf_ops() -> set[str]:
    import onnx2tf

    ops_dir = Path(onnx2tf.__file__).parent / "ops"
    return {p.stem for p in ops_dir.glob("*.py") if not p.stem.startswith("_")}


def check_convertible(model: onnx.ModelProto, source: str) -> None:
    """Fail early, naming the op, when onnx2tf has no converter for an op of the model."""
    known = _onnx2tf_ops()
    for n in model.graph.node:
        if n.domain not in ("", "ai.onnx") or n.op_type not in known:
            raise ConversionError(
                f"{source}: op {n.op_type!r} (node {n.name!r}, domain {n.domain or 'ai.onnx'!r}) has no "
                "int8 TFLite conversion (onnx2tf has no converter for it); replace it in the model."
            )


def _onnx2tf(onnx_path: Path, out_dir: Path, timeout: float) -> None:
    exe = Path(sys.executable).with_name("onnx2tf")
    cmd = [str(exe) if exe.exists() else (shutil.which("onnx2tf") or "onnx2tf")]
    cmd += ["-i", str(onnx_path), "-o", str(out_dir / "saved_model"), "-b", "1", "-v", "error"]
    # onnx2tf checks its conversion on a sample image it would otherwise download: give it one.
    rng = np.random.default_rng(0)
    np.save(out_dir / _SAMPLE, rng.random((20, 128, 128, 3), dtype=np.float32))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="-1", TF_CPP_MIN_LOG_LEVEL="3")
    try:
        proc = subprocess.run(cmd, cwd=out_dir, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise ConversionError(f"{onnx_path}: onnx2tf did not finish within {timeout:.0f} s") from e
    if proc.returncode != 0 or not (out_dir / "saved_model" / "saved_model.pb").is_file():
        raise ConversionError(_explain_failure(onnx_path, proc.stdout + proc.stderr))


def _explain_failure(onnx_path: Path, output: str) -> str:
    clean = re.sub(r"\x1b\[[0-9;]*m", "", output)
    node = re.search(r"onnx_op_name:\s*(\S+)", clean)
    where = ""
    if node:
        name = node.group(1)
        try:
            model = onnx.load(str(onnx_path), load_external_data=False)
            op = next((n.op_type for n in model.graph.node if n.name == name), "?")
        except Exception:
            op = "?"
        where = f" at op {op!r} (node {name!r})"
    noise = ("I0000", "W0000", "E0000", "WARNING: All log messages")
    lines = [ln for ln in clean.strip().splitlines() if ln.strip() and not ln.startswith(noise)]
    last = next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln), lines[-1] if lines else "")
    return f"{onnx_path}: the TFLite conversion failed{where}: {last.strip()}"


def to_int8_tflite(onnx_path: Path, calibration: np.ndarray, workdir: Path, timeout: float = 1800) -> bytes:
    """Convert once; ``calibration`` is float32 NCHW (N, C, H, W) or (N, ...) for non-image inputs."""
    import tensorflow as tf

    workdir.mkdir(parents=True, exist_ok=True)
    # onnx2tf rewrites the model it is given (it simplifies it in place): give it a copy, so model.onnx keeps
    # the bytes its fingerprint in model.json was taken from
    source = Path(onnx_path).resolve()
    onnx_path = workdir / "input.onnx"
    shutil.copyfile(source, onnx_path)
    _onnx2tf(onnx_path, workdir, timeout)
    data = calibration.transpose(0, 2, 3, 1) if calibration.ndim == 4 else calibration

    def representative():
        for x in data:
            yield [x[None].astype(np.float32)]

    try:
        conv = tf.lite.TFLiteConverter.from_saved_model(str(workdir / "saved_model"))
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = representative
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8, tf.lite.OpsSet.TFLITE_BUILTINS]
        conv.inference_input_type = tf.int8
        conv.inference_output_type = tf.int8
        return bytes(conv.convert())
    except Exception as e:
        raise ConversionError(f"{onnx_path}: int8 quantization failed ({type(e).__name__}: {e})") from e
