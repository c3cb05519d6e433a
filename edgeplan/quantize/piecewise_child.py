"""The TensorFlow side of a conversion in pieces, run by ``quantize/piecewise`` in child processes:

``calibrate SAVED_MODEL INPUTS OUT_DIR [--outputs]``: the TFLite converter's own calibration of one piece on its
inputs (NHWC float samples), stopped before it quantizes: ``calibrated.tflite`` (the float piece with the range of
every tensor) and ``quantize_args.json`` (the arguments the converter would quantize it with); with ``--outputs``,
``outputs.npy``: the piece's float outputs on the same samples, computed with the calibrator's kernels (no
delegate) and thread count, which are the next piece's inputs — so every piece sees the activations a calibration of the whole
model sees.

``quantize PLAN OUT``: each piece quantized with those arguments, its input's range set to the range of the previous
piece's output (and a split layer's parts to the range of the whole layer's output), the parts merged, the pieces
stitched (``quantize/stitch``); then loaded and run with both kernel sets, as a whole conversion's int8 model is.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

CALIBRATED, ARGS, OUTPUTS = "calibrated.tflite", "quantize_args.json", "outputs.npy"
LOADING = "edgeplan: loading the int8 model"


def read_samples(path: Path):
    """The samples of an .npy file one at a time, read (not mapped: mapped pages would count as resident)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        shape, fortran, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                                 else np.lib.format.read_array_header_2_0(f))
        if fortran:
            raise ValueError(f"{path}: Fortran order")
        size = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        for _ in range(shape[0]):
            yield np.frombuffer(f.read(size), dtype=dtype).reshape(shape[1:])


def sample_count(path: Path) -> int:
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        shape = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                 else np.lib.format.read_array_header_2_0(f))[0]
    return int(shape[0])


class SampleWriter:
    """An .npy file of ``count`` float32 samples of ``shape``, written one at a time."""

    def __init__(self, path: Path, count: int, shape):
        self.f = open(path, "wb")
        np.lib.format.write_array_header_1_0(
            self.f, {"descr": np.lib.format.dtype_to_descr(np.dtype("<f4")), "fortran_order": False,
                     "shape": (int(count), *(int(d) for d in shape))})

    def write(self, x: np.ndarray) -> None:
        self.f.write(np.ascontiguousarray(x, dtype="<f4").tobytes())

    def close(self) -> None:
        self.f.close()


def calibrate(saved_model: Path, inputs: Path, out: Path, outputs: bool) -> None:
    import tensorflow as tf
    from tensorflow.lite.python import lite

    class Calibrated(Exception):
        pass

    held = {}

    def stop(calibrated, *args, **kwargs):  # the converter's call to its quantizer: keep what it would be given
        held.update(model=calibrated, args=args, kwargs=kwargs)
        raise Calibrated

    lite._mlir_quantize = stop
    conv = tf.lite.TFLiteConverter.from_saved_model(str(saved_model))
    conv.optimizations = [tf.lite.Optimize.DEFAULT]  # as the whole conversion (convert._QUANTIZE)
    conv.representative_dataset = lambda: ([x[None].astype(np.float32)] for x in read_samples(inputs))
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8, tf.lite.OpsSet.TFLITE_BUILTINS]
    conv.inference_input_type = tf.int8
    conv.inference_output_type = tf.int8
    try:
        conv.convert()
    except Calibrated:
        pass
    if "model" not in held:
        raise RuntimeError("the converter did not reach its quantizer")
    model = bytes(held["model"])
    (out / CALIBRATED).write_bytes(model)
    kw = dict(held["kwargs"])
    kw["input_data_type"] = kw["input_data_type"].name
    kw["output_data_type"] = kw["output_data_type"].name
    kw["debug_options_str"] = kw["debug_options_str"].hex()
    (out / ARGS).write_text(json.dumps({"args": list(held["args"]), "kwargs": kw}))
    if outputs:
        _run_float(model, inputs, out / OUTPUTS)


def _run_float(model: bytes, inputs: Path, path: Path) -> None:
    import tensorflow as tf

    # the calibrator's kernels and thread count: with one thread instead of two, a convolution's sums come out a
    # float bit apart (InceptionResNetV2: a range's maximum 6.2382150 here, 6.2382159 in the calibrator), and the
    # next piece's ranges with them
    it = tf.lite.Interpreter(model_content=model, num_threads=os.cpu_count() or 1, experimental_op_resolver_type=(
        tf.lite.experimental.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES))
    it.allocate_tensors()
    (ind,), (outd,) = it.get_input_details(), it.get_output_details()
    writer = SampleWriter(path, sample_count(inputs), outd["shape"][1:])
    try:
        for x in read_samples(inputs):
            it.set_tensor(ind["index"], x[None].astype(np.float32))
            it.invoke()
            writer.write(it.get_tensor(outd["index"])[0])
    finally:
        writer.close()


def quantize(plan_path: Path, out: Path) -> None:
    import tensorflow as tf
    from tensorflow.lite.python import lite
    from tensorflow.lite.tools import flatbuffer_utils

    from edgeplan.quantize import stitch

    plan = json.loads(plan_path.read_text())
    previous = None  # (min, max) of the previous piece's output
    pieces = []
    for piece in plan["pieces"]:
        dirs = [Path(d) for d in piece["dirs"]]
        models = [flatbuffer_utils.convert_bytearray_to_object(bytearray((d / CALIBRATED).read_bytes()))
                  for d in dirs]
        outs = [m.subgraphs[0].tensors[m.subgraphs[0].outputs[0]].quantization for m in models]
        whole = (np.array([min(float(np.min(q.min)) for q in outs)], np.float32),
                 np.array([max(float(np.max(q.max)) for q in outs)], np.float32))
        for m in models:
            sg = m.subgraphs[0]
            if previous is not None:
                q = sg.tensors[sg.inputs[0]].quantization
                q.min, q.max = previous[0].copy(), previous[1].copy()
            if len(models) > 1:  # a part: the range of the whole layer's output
                q = sg.tensors[sg.outputs[0]].quantization
                q.min, q.max = whole[0].copy(), whole[1].copy()
        previous = whole if len(models) > 1 else (np.array(outs[0].min, np.float32), np.array(outs[0].max, np.float32))
        int8 = []
        for m, d in zip(models, dirs):
            spec = json.loads((d / ARGS).read_text())
            kw = dict(spec["kwargs"])
            kw["input_data_type"] = tf.dtypes.as_dtype(kw["input_data_type"])
            kw["output_data_type"] = tf.dtypes.as_dtype(kw["output_data_type"])
            kw["debug_options_str"] = bytes.fromhex(kw["debug_options_str"])
            data = lite._mlir_quantize(bytes(flatbuffer_utils.convert_object_to_bytearray(m)), *spec["args"], **kw)
            # what the converter does after its quantizer (TFLiteConverterBase._optimize_tflite_model)
            if not lite._check_model_use_buffer_offset(flatbuffer_utils.convert_bytearray_to_object(data)):
                data = lite._deduplicate_readonly_buffers(data)
            int8.append(bytes(data))
        del models
        pieces.append(stitch.merge_parts(int8, f"piece {len(pieces)}") if len(int8) > 1 else int8[0])
        print(f"edgeplan: quantized piece {len(pieces)} of {len(plan['pieces'])}", file=sys.stderr, flush=True)
    requantized: list[str] = []
    model = stitch.stitch(pieces, plan["boundaries"], requantized)
    del pieces
    (out.parent / "stitch.json").write_text(json.dumps({"requantized": requantized}))
    (out.parent / "unchecked.tflite").write_bytes(model)
    print(LOADING, file=sys.stderr, flush=True)
    from edgeplan.quantize.litert import interpreter, primed

    interpreter(model)
    primed(model)
    out.write_bytes(model)


def main(argv: list[str]) -> int:
    try:
        if argv[0] == "calibrate":
            calibrate(Path(argv[1]), Path(argv[2]), Path(argv[3]), "--outputs" in argv[4:])
        elif argv[0] == "quantize":
            quantize(Path(argv[1]), Path(argv[2]))
        else:
            raise ValueError(f"unknown command {argv[0]!r}")
    except Exception as e:  # noqa: BLE001 (one line for the parent to quote)
        print(f"Error: {type(e).__name__}: {e}".replace("\n", " "), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
