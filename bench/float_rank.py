"""A multi-device split's *float* sub-models run as MPI ranks (bench side: onnxruntime is not a runtime
dependency). The same rank as ``edgeplan.distributed.rank`` (tables, revision check, receives posted ahead,
Test + sleep waits, pipelining, the head's summary), with each stage's ``float/s<k>.onnx`` in onnxruntime
instead of its int8 TFLite, and float32 tensors between ranks named as in the float model (``tables.json``
gives each buffer's float name; the shapes come from the sub-models).

onnxruntime runs at ORT_ENABLE_BASIC (LEVEL), here and for the whole model the bench compares with: at
ORT_ENABLE_ALL the layout transforms (NCHWc) are chosen per sub-model and round differently from the whole
model's (ResNet-101, 8 sub-models: 9.8e-4 at ENABLE_ALL, 0.0 at BASIC or with none). Compare with the whole
model on as many intra-op threads as a rank has (tiny_cnn: 1.4e-6 against 2 threads, 0.0 against 1).

    mpirun ... python -m mpi4py bench/float_rank.py SPLIT_DIR --frames 4 --inputs x.npy --out y.npy
"""
from __future__ import annotations

import copy
import hashlib
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgeplan.distributed import rank


def level():
    import onnxruntime as ort

    return ort.GraphOptimizationLevel.ORT_ENABLE_BASIC


def session(model: Path, threads: int = 1):
    """An onnxruntime session at LEVEL on ``threads`` intra-op threads (``model``: a file; its external weights
    are read beside it)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.graph_optimization_level = level()
    return ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])


def whole_model(path: Path, xs) -> np.ndarray:
    """The reference the float ranks are compared with: the whole float model at LEVEL on 1 thread (a rank of one
    slot's), each frame of ``xs`` alone."""
    sess = session(path)
    return np.stack([sess.run(None, {sess.get_inputs()[0].name: x})[0] for x in xs])


def _shape(value_info) -> list[int]:
    return [d.dim_value or 1 for d in value_info.type.tensor_type.shape.dim]  # a symbolic batch is one frame


class _Session:
    """onnxruntime behind the three calls a rank makes of a LiteRT interpreter."""

    def __init__(self, path: Path, threads: int):
        self.sess = session(path, threads)
        self.names = [o.name for o in self.sess.get_outputs()]
        self.given: dict[str, object] = {}
        self.got: dict[str, object] = {}

    def set_tensor(self, name: str, value) -> None:
        self.given[name] = value

    def invoke(self) -> None:
        self.got = dict(zip(self.names, self.sess.run(None, self.given)))

    def get_tensor(self, name: str):
        return self.got[name]


class FloatStage:
    def __init__(self, d: Path, s: dict, threads: int):
        self.index, self.tile = s["index"], None
        self.it = _Session(d / s["float"], threads)
        self.inputs = {x.name: x.name for x in self.it.sess.get_inputs()}
        self.outputs = {name: name for name in self.it.names}


class FloatRank(rank.Rank):
    def load_tables(self, d: Path) -> tuple[dict, str]:
        raw = (d / "tables.json").read_bytes()
        return float_tables(rank.parse_tables(raw, self.size), d), hashlib.sha256(raw).hexdigest()

    def stage(self, s: dict, threads: int, builtin: bool) -> FloatStage:
        return FloatStage(self.d, s, threads)


def float_tables(t: dict, d: Path) -> dict:
    """``tables.json`` with every tensor its float counterpart: names, float32, shapes from the sub-models' graph
    inputs and outputs (read without their weights)."""
    import onnx

    shapes = {}
    for s in t["stages"]:
        g = onnx.load(str(d / s["float"]), load_external_data=False).graph
        shapes.update({x.name: _shape(x) for x in [*g.input, *g.output]})

    def tensor(spec: dict) -> dict:
        shape = shapes[spec["float"]]
        return {**spec, "name": spec["float"], "dtype": "FLOAT32", "shape": shape, "nbytes": 4 * math.prod(shape)}

    f = copy.deepcopy(t)
    f["input"], f["output"] = tensor(t["input"]), tensor(t["output"])
    f["buffers"] = {b["float"]: tensor(b) for b in t["buffers"].values()}
    return f  # a stage's tensors are its sub-model's (FloatStage): the rank reads no others from the tables


if __name__ == "__main__":
    sys.exit(rank.main(rank_type=FloatRank))
