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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgeplan.distributed import rank


def level():
    import onnxruntime as ort

    return ort.GraphOptimizationLevel.ORT_ENABLE_BASIC


def _shape(dims) -> list[int]:
    return [d if isinstance(d, int) and d > 0 else 1 for d in dims]  # a symbolic batch is one frame


class _Session:
    """onnxruntime behind the three calls a rank makes of a LiteRT interpreter."""

    def __init__(self, path: Path, threads: int):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.graph_optimization_level = level()
        self.sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.given: dict[str, object] = {}
        self.got: dict[str, object] = {}

    def set_tensor(self, name: str, value) -> None:
        self.given[name] = value

    def invoke(self) -> None:
        names = [o.name for o in self.sess.get_outputs()]
        self.got = dict(zip(names, self.sess.run(None, self.given)))

    def get_tensor(self, name: str):
        return self.got[name]


class FloatStage:
    def __init__(self, d: Path, s: dict, threads: int):
        self.index, self.tile = s["index"], None
        self.it = _Session(d / s["float"], threads)
        self.inputs = {x.name: x.name for x in self.it.sess.get_inputs()}
        self.outputs = {x.name: x.name for x in self.it.sess.get_outputs()}


class FloatRank(rank.Rank):
    def load_tables(self, d: Path) -> tuple[dict, str]:
        raw = (d / "tables.json").read_bytes()
        return float_tables(rank.parse_tables(raw, self.size), d), hashlib.sha256(raw).hexdigest()

    def stage(self, s: dict, threads: int, builtin: bool) -> FloatStage:
        return FloatStage(self.d, s, threads)


def float_tables(t: dict, d: Path) -> dict:
    """``tables.json`` with every tensor its float counterpart: names, float32, shapes from the sub-models."""
    import onnxruntime as ort

    shapes = {}
    for s in t["stages"]:
        sess = ort.InferenceSession(str(d / s["float"]), providers=["CPUExecutionProvider"])
        shapes.update({x.name: _shape(x.shape) for x in [*sess.get_inputs(), *sess.get_outputs()]})

    def tensor(spec: dict) -> dict:
        shape = shapes[spec["float"]]
        return {**spec, "name": spec["float"], "dtype": "FLOAT32", "shape": shape, "nbytes": 4 * math.prod(shape)}

    f = copy.deepcopy(t)
    f["input"], f["output"] = tensor(t["input"]), tensor(t["output"])
    f["buffers"] = {b["float"]: tensor(b) for b in t["buffers"].values()}
    return f  # a stage's tensors are its sub-model's (FloatStage): the rank reads no others from the tables


if __name__ == "__main__":
    sys.exit(rank.main(rank_type=FloatRank))
