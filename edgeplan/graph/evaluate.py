"""Float values of any tensors of a canonical model, computed with onnxruntime (nothing is written)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort


def tensor_values(model: onnx.ModelProto, tensors: list[str], xs: np.ndarray) -> dict[str, np.ndarray]:
    """Values of ``tensors`` for every sample of ``xs`` (one sample per row; stacked on axis 0)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    vis = {v.name: v for v in m.graph.value_info}
    for t in tensors:
        if t not in have:
            m.graph.output.append(vis[t])
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    runs = [dict(zip(names, sess.run(None, {m.graph.input[0].name: x[None]}))) for x in xs]
    return {t: np.concatenate([r[t] for r in runs]) for t in tensors}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two arrays taken as flat vectors (1 for two zero arrays)."""
    a = a.ravel().astype(np.float64)
    b = b.ravel().astype(np.float64)
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(a @ b / (na * nb))
