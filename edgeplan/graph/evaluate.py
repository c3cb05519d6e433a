"""Float values of any tensors of a canonical model, computed with onnxruntime (nothing is written)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort


def tensor_values(model: onnx.ModelProto | Path, tensors: list[str], xs: np.ndarray, prepack: bool = True,
                  folder: Path | None = None) -> dict[str, np.ndarray]:
    """Values of ``tensors`` for every sample of ``xs`` (one sample per row; stacked on axis 0)."""
    runs = list(tensor_values_each(model, tensors, xs, prepack=prepack, folder=folder))
    return {t: np.concatenate([r[t] for r in runs]) for t in tensors}


def tensor_values_each(model: onnx.ModelProto | Path, tensors: list[str], xs: np.ndarray, threads: int = 0,
                       prepack: bool = True, folder: Path | None = None):
    """Per sample of ``xs``, the values of ``tensors`` (each with a batch axis of 1). ``model`` may be the path of
    an .onnx edgeplan wrote: its external data, if any, is then read by onnxruntime from the file (``session``'s
    ``folder``), not held in this process twice. ``threads``: intra-op threads (0: onnxruntime's default);
    ``prepack``: as ``session_options``; ``folder``: where a model given as a ModelProto has its external data
    (``graph.model.load_mapped``'s: the .onnx file's folder)."""
    if isinstance(model, Path):
        from edgeplan.graph.model import load_stored

        model, folder = load_stored(model), model.parent
    have = {o.name for o in model.graph.output}
    vis = {v.name: v for v in model.graph.value_info}
    sess = session(model, outputs=[vis[t] for t in tensors if t not in have], folder=folder, threads=threads,
                   prepack=prepack)
    names = [o.name for o in sess.get_outputs()]
    wanted = set(tensors)
    for x in xs:
        yield {n: v for n, v in zip(names, sess.run(None, {model.graph.input[0].name: x[None]})) if n in wanted}


def session(model: onnx.ModelProto, min_bytes: int = 1024, outputs=(), folder: Path | None = None, threads: int = 0,
            prepack: bool = True) -> ort.InferenceSession:
    """An onnxruntime session of ``model`` (left as it is), with ``outputs`` (value infos) added to its outputs,
    whose weights of ``min_bytes`` or more go to onnxruntime as arrays, not inside the serialized model: the model
    it is given holds them as external data, replaced by the arrays before any graph optimization, so the session
    computes what the inline model would (bit-identical on VGG-19). Serializing VGG-19's 548 MB of weights inline
    took 5.2 s and onnxruntime parsed them again: 7.9 s to a session, 2.0 s this way; and no copy of the model is
    made (a model past protobuf's 2 GB could not be serialized at all).

    ``folder``: where the model's external data files are (``graph.model.load_stored`` checked them); onnxruntime
    maps them itself, and does not prepack the weights it read there. Matching on wide_fc_2g (2.28 GB of weights),
    the model handed over as arrays: +5.65 GB while the session was built (2.29 GB of copies, the rest
    prepacking), 19.9 s; read from the file: +2.30 GB of mapped pages, 1.0 s, the same matches."""
    from onnx import numpy_helper

    from edgeplan.graph.wire import external_stub, raw_size, without

    light = without(model, "graph")
    light.graph.CopyFrom(without(model.graph, "initializer"))
    light.graph.output.extend(outputs)
    names, values = [], []
    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL or raw_size(init) < max(min_bytes, 1):
            light.graph.initializer.append(init)
            continue
        a = numpy_helper.to_array(init)
        names.append(init.name)
        values.append(ort.OrtValue.ortvalue_from_numpy(a))
        light.graph.initializer.append(external_stub(init, "in-memory", 0, a.nbytes))
    mapped = folder is not None and any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    options = session_options(prepack and not mapped)
    options.intra_op_num_threads = threads
    if folder is not None:
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
    if names:
        options.add_external_initializers(names, values)
    return ort.InferenceSession(light.SerializeToString(), options, providers=["CPUExecutionProvider"])


def session_options(prepack: bool = True) -> ort.SessionOptions:
    """Basic graph optimizations (constant folding, no fusions) and no memory arena. With onnxruntime's defaults a
    session of ResNet152V2 at 299 (241 MB of weights, 70 tensors as outputs: matching's) grew the process by
    0.9 GB and its first runs kept 0.15 GB more in the arena; this way 0.5 GB and nothing (0.3 -> 0.5 s a run:
    these sessions run a few samples). Idle intra-op threads sleep instead of spinning: a split's verification runs
    24 sessions one after another, each with its own pool, and the pools still spinning after their run took the
    cores from the next (VGG-19's float chain: 0.55-1.73 s a sample spinning, 0.24 s not; the same values), as
    they took them from the int8 model matching runs between float runs.

    ``prepack=False``: the weights are used as they are, not first copied into the kernels' packed layout. A
    VGG-19 session with every tensor an output (matching's) is made in 0.7 s instead of 1.2-2.3 s, its runs as
    fast; its values differ from a packed session's by rounding (7e-9 on VGG-19's output), so the sessions whose
    values are compared must agree on it."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.enable_cpu_mem_arena = False
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
    return options


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two arrays taken as flat vectors (1 for two zero arrays)."""
    a = a.ravel().astype(np.float64)
    b = b.ravel().astype(np.float64)
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(a @ b / (na * nb))
