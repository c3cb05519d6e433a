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
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from edgeplan import childlog
from edgeplan.errors import ConversionError
from edgeplan.graph.model import GraphView
from edgeplan.quantize.pieces import Piece
from edgeplan.quantize.piecewise_child import LOADING

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


def _onnx2tf(onnx_path: Path, out_dir: Path, timeout: float, source: Path | None = None,
             log: Path | None = None) -> None:
    # onnx2tf's own command line (its main()), in a child that stops it once the SavedModel is written; what it
    # prints is kept in ``log`` (``childlog``)
    _int8_rewrites(onnx_path)
    cmd = [sys.executable, "-c", _ONNX2TF, "-i", str(onnx_path), "-o", str(out_dir / "saved_model"), "-b", "1",
           "--not_use_onnxsim", "-v", "error"]
    # onnx2tf checks its conversion on a sample image it would otherwise download: give it one.
    rng = np.random.default_rng(0)
    np.save(out_dir / _SAMPLE, rng.random((20, 128, 128, 3), dtype=np.float32))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="-1", TF_CPP_MIN_LOG_LEVEL="3")
    try:
        proc = subprocess.run(cmd, cwd=out_dir, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        childlog.keep(log, cmd, None, e.stdout, e.stderr)
        raise ConversionError(f"{source or onnx_path}: onnx2tf did not finish within {timeout:.0f} s"
                              f"{childlog.named(log)}") from e
    childlog.keep(log, cmd, proc.returncode, proc.stdout, proc.stderr)
    if proc.returncode != 0 or not (out_dir / "saved_model" / "saved_model.pb").is_file():
        raise ConversionError(_explain_failure(onnx_path, proc.stdout + proc.stderr, source) + childlog.named(log))


# erf(x) ~ tanh(x (A + B x^2)): the tanh form of GELU (A = 2/sqrt(pi); |error| <= 3.6e-4 over the reals)
ERF_TANH = (1.1283791671, 0.1009109)


def _int8_rewrites(path: Path) -> None:
    """Rewrite, in the file onnx2tf is given (a copy), what would make an int8 model LiteRT refuses to run. The
    float model (ONNX, run by onnxruntime) keeps its exact ops.
    - ``Erf`` (exact GELU: ConvNeXt) becomes ``tanh(x (A + B x^2))``. TFLite has no Erf kernel, and the usual
      builtin-op form (Abramowitz-Stegun, onnx2tf's ``-rtpo Erf``) divides by ``|x| + 1e-11``, which int8 rounds
      to zero near x = 0. Mul, Add and Tanh have int8 kernels (and Edge TPU ones); the error is far below int8's
      step (1/128 on [-1, 1]).
    - ``Reciprocal(Sqrt(v))`` (LayerNormalization's 1/sqrt(variance + eps)) becomes ``Pow(v, -0.5)``: as a
      reciprocal it is an int8 DIV whose divisor, a small standard deviation, rounds to zero (LiteRT: "data[i] !=
      zero_point"); the TFLite converter writes it as RSQRT (int8, and on the Edge TPU's list).
    - ``Neg`` (LayerNormalization's -mean) becomes ``Mul(x, -1)``: the quantizer has no int8 NEG and left it a
      float island, which ended ConvNeXt's Edge TPU part at its first block; MUL is int8 and maps.
    - A ``Reshape`` to the shape its input already has is dropped (its readers read the input). tf2onnx writes a
      Transpose of a one-channel tensor as a Reshape, and leaves some that change nothing: in ConvNeXtSmall's
      third piece (96 px, 128 MiB pieces) onnx2tf reshaped the NHWC LayerNorm mean [1, 6, 6, 1] by the NCHW shape
      [-1, 1, 6, 6] and failed at the Sub that reads it; without its 6 no-op Reshapes the piece converts."""
    if not _mentions(path, (b"\x22\x03Erf", b"\x22\x0aReciprocal", b"\x22\x03Neg", b"\x22\x07Reshape")):
        return  # (NodeProto.op_type; most models: the file is read in pieces, never held whole)
    m = onnx.load(str(path), load_external_data=False)  # (external data, if any, stays where the file says)
    readers: dict[str, int] = {}
    for n in m.graph.node:
        for x in n.input:
            readers[x] = readers.get(x, 0) + 1
    producer = {o: n for n in m.graph.node for o in n.output}
    sqrt_of = {n.output[0]: producer.get(n.input[0]) for n in m.graph.node if n.op_type == "Reciprocal"}
    sqrt_of = {k: p for k, p in sqrt_of.items() if p is not None and p.op_type == "Sqrt" and readers[p.output[0]] == 1}
    same = _noop_reshapes(m)
    if not sqrt_of and not same and not any(n.op_type in ("Erf", "Neg") for n in m.graph.node):
        return
    from onnx import helper, numpy_helper

    a, b, half, minus = "edgeplan_erf_a", "edgeplan_erf_b", "edgeplan_minus_half", "edgeplan_minus_one"
    m.graph.initializer.extend([numpy_helper.from_array(np.array(v, np.float32), k)
                                for k, v in ((a, ERF_TANH[0]), (b, ERF_TANH[1]), (half, -0.5), (minus, -1.0))])

    def read(x: str) -> str:  # what a reader of x reads once no-op Reshapes are gone
        while x in same:
            x = same[x]
        return x

    roots = {k: read(p.input[0]) for k, p in sqrt_of.items()}  # Reciprocal output -> the Sqrt's input
    roots_out = {p.output[0] for p in sqrt_of.values()}
    nodes = []
    for n in m.graph.node:
        for i, x in enumerate(n.input):  # a no-op Reshape's reader reads what it reshaped
            n.input[i] = read(x)
        if n.op_type == "Reshape" and n.output[0] in same:
            continue
        if n.op_type == "Sqrt" and n.output[0] in roots_out:
            continue
        if n.op_type == "Reciprocal" and n.output[0] in roots:
            nodes.append(helper.make_node("Pow", [roots[n.output[0]], half], [n.output[0]], name=n.name))
            continue
        if n.op_type == "Neg":
            nodes.append(helper.make_node("Mul", [n.input[0], minus], [n.output[0]], name=n.name))
            continue
        if n.op_type != "Erf":
            nodes.append(n)
            continue
        x, y, t = n.input[0], n.output[0], f"{n.name or n.output[0]}/edgeplan_erf"
        nodes += [helper.make_node("Mul", [x, x], [f"{t}_x2"], name=f"{t}_x2"),
                  helper.make_node("Mul", [f"{t}_x2", b], [f"{t}_bx2"], name=f"{t}_bx2"),
                  helper.make_node("Add", [f"{t}_bx2", a], [f"{t}_p"], name=f"{t}_p"),
                  helper.make_node("Mul", [x, f"{t}_p"], [f"{t}_u"], name=f"{t}_u"),
                  helper.make_node("Tanh", [f"{t}_u"], [y], name=n.name or f"{t}_tanh")]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    onnx.save(m, str(path))


def _noop_reshapes(m: onnx.ModelProto) -> dict[str, str]:
    """Output -> input of every Reshape whose input and output have the same static shape (from the model's value
    infos; canonical models carry one per tensor), except where the output is a graph output."""
    shapes = {}
    for v in (*m.graph.input, *m.graph.value_info, *m.graph.output):
        dims = v.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            shapes[v.name] = tuple(d.dim_value for d in dims)
    outputs = {o.name for o in m.graph.output}
    return {n.output[0]: n.input[0] for n in m.graph.node
            if n.op_type == "Reshape" and n.output[0] not in outputs and n.input[0] in shapes
            and shapes[n.input[0]] == shapes.get(n.output[0])}


def _mentions(path: Path, needles: tuple[bytes, ...], chunk: int = 1 << 24) -> bool:
    """Whether any of ``needles`` occurs in the file (read in chunks that overlap by the longest needle)."""
    keep = max(len(x) for x in needles) - 1
    tail = b""
    with open(path, "rb") as f:
        while block := f.read(chunk):
            data = tail + block
            if any(x in data for x in needles):
                return True
            tail = data[-keep:]
    return False


def _explain_failure(onnx_path: Path, output: str, source: Path | None = None) -> str:
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
    return f"{source or onnx_path}: the TFLite conversion failed{where}: {_last_error(clean)}"


def to_int8_tflite(onnx_path: Path, calibration: np.ndarray, workdir: Path, timeout: float = 1800,
                   pieces: list[Piece] | None = None, view: GraphView | None = None,
                   progress: Callable[[int, int], None] | None = None, log: Path | None = None) -> bytes:
    """Convert once; ``calibration`` is float32 NCHW (N, C, H, W) or (N, ...) for non-image inputs. Both steps
    run in child processes: the TFLite quantizer aborts the process on some inputs (a calibration range that is
    not finite), and an abort must end in one line, not take the pipeline down. With more than one of ``pieces``
    (``quantize/pieces.plan`` on ``view``, the model's GraphView), the model is converted piece by piece
    (``quantize/piecewise``). What the children print goes to ``log``, begun afresh (``childlog``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    source = Path(onnx_path).resolve()
    childlog.start(log)
    if pieces and (len(pieces) > 1 or pieces[0].parts > 1):
        from edgeplan.quantize import piecewise

        return piecewise.convert(view, pieces, source, calibration, workdir, timeout, progress, log)
    # onnx2tf rewrites the model it is given (it simplifies it in place): give it a copy, so model.onnx keeps
    # the bytes its fingerprint in model.json was taken from
    copy = workdir / "input.onnx"
    shutil.copyfile(source, copy)
    _onnx2tf(copy, workdir, timeout, source, log)
    np.save(workdir / "calibration.npy", calibration.transpose(0, 2, 3, 1) if calibration.ndim == 4 else calibration)
    out = workdir / "model_int8.tflite"
    run_tf_child([sys.executable, "-c", _QUANTIZE, str(workdir)], source, "int8 quantization", timeout, workdir,
                 log)
    if not out.is_file():
        raise ConversionError(f"{source}: int8 quantization wrote no model")
    return out.read_bytes()


def run_tf_child(cmd: list[str], source, what: str, timeout: float, workdir: Path, log: Path | None = None) -> None:
    """Run a TensorFlow child of the conversion, its output kept in ``log``; a failure, a time-out or an abort (a
    crash of the quantizer, or of LiteRT loading what it wrote: ``workdir/unchecked.tflite``) is one
    ConversionError saying which (and naming the log)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="-1", TF_CPP_MIN_LOG_LEVEL="3")
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, check=False, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        childlog.keep(log, cmd, None, e.stdout, e.stderr)
        raise ConversionError(f"{source}: {what} did not finish within {timeout:.0f} s{childlog.named(log)}") from e
    childlog.keep(log, cmd, proc.returncode, proc.stdout, proc.stderr)
    if proc.returncode == 0:
        return
    if proc.returncode > 0:
        how = ("the int8 model the quantizer wrote does not run in LiteRT" if _LOADING in proc.stderr
               else f"{what} failed")
    elif _LOADING in proc.stderr:
        raise ConversionError(f"{source}: the int8 model the quantizer wrote makes LiteRT abort (signal "
                              f"{-proc.returncode}) when it is loaded; {_largest_scale(workdir / 'unchecked.tflite')}"
                              f"{childlog.named(log)}")
    else:
        how = (f"the quantizer aborted (signal {-proc.returncode}): are the float model's activations finite "
               "on the calibration data? (a weight far out of range overflows them)")
    last = _last_error((proc.stdout + proc.stderr).replace(_LOADING, ""))
    raise ConversionError(f"{source}: {how}{f' ({last})' if last else ''}{childlog.named(log)}")


# onnx2tf, run by _onnx2tf in a child with onnx2tf's arguments. After the SavedModel, onnx2tf converts it to float32
# and float16 TFLite models nobody reads: on VGG16 those took 185 s of its 276 s and set its peak (12.5 GB of process
# tree against 7.0 GB without them). The first call they make stops it. onnx-simplifier (--not_use_onnxsim) is not run: it ran
# only when its command happened to be on PATH (never from .venv/bin/edgeplan), and the canonical model is already
# folded and shape-inferred.
_ONNX2TF = """
import sys

import tensorflow as tf
from onnx2tf import onnx2tf


class SavedModelWritten(Exception):
    pass


def stop(*args, **kwargs):
    raise SavedModelWritten


tf.lite.TFLiteConverter.from_concrete_functions = stop
sys.argv = ["onnx2tf", *sys.argv[1:]]
try:
    onnx2tf.main()
except SavedModelWritten:
    pass
"""

# The TFLite quantizer, run by to_int8_tflite in a child: argv[1] holds saved_model/ and calibration.npy (NHWC).
_QUANTIZE = """
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

work = Path(sys.argv[1])
data = np.load(work / "calibration.npy")


def representative():
    for x in data:
        yield [x[None].astype(np.float32)]


try:
    conv = tf.lite.TFLiteConverter.from_saved_model(str(work / "saved_model"))
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = representative
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8, tf.lite.OpsSet.TFLITE_BUILTINS]
    conv.inference_input_type = tf.int8
    conv.inference_output_type = tf.int8
    model = bytes(conv.convert())
except Exception as e:
    print(f"Error: {type(e).__name__}: {e}".replace(chr(10), " "), file=sys.stderr)
    sys.exit(1)
# LiteRT aborts the process on some models the quantizer writes (a scale it cannot turn into a multiplier):
# load and run it here, with both kernel sets, so that abort ends this child, never the pipeline
(work / "unchecked.tflite").write_bytes(model)
print(LOADING, file=sys.stderr, flush=True)
from edgeplan.quantize.litert import interpreter, primed

interpreter(model)
primed(model)
(work / "model_int8.tflite").write_bytes(model)
"""
_LOADING = LOADING
_QUANTIZE = _QUANTIZE.replace("LOADING", repr(_LOADING))


def _largest_scale(path: Path) -> str:
    """Where to look when LiteRT will not load an int8 model: its largest quantization scale."""
    from edgeplan.quantize.tflite_graph import TfliteGraph

    try:
        t = max((t for t in TfliteGraph(path.read_bytes()).tensors if t.scale), key=lambda t: max(t.scale))
    except Exception:  # noqa: BLE001 (a model the quantizer wrote but nothing can read: say so, not why)
        return "it does not parse either"
    return (f"its largest quantization scale is {max(t.scale):.3g}, of tensor {t.name[:120]!r} (a weight far out "
            "of range gives one)")


def _last_error(output: str) -> str:
    """The last line of a child's output that says what went wrong (log noise left out)."""
    clean = re.sub(r"\x1b\[[0-9;]*m", "", output)
    noise = ("I0000", "W0000", "E0000", "WARNING: All log messages")
    lines = [ln.strip() for ln in clean.strip().splitlines() if ln.strip() and not ln.startswith(noise)]
    last = next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln), lines[-1] if lines else "")
    return last[:300]
