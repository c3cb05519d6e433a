"""Run TFLite models with the LiteRT interpreter (numpy + ai-edge-litert only: safe for the runtime).

``deterministic=True`` uses the builtin reference kernels without the default XNNPACK delegate, so two
runs of the same op on the same data give the same bits whichever model the op sits in.
"""
from __future__ import annotations

import numpy as np
from ai_edge_litert.interpreter import Interpreter, OpResolverType


def interpreter(model: bytes, *, deterministic: bool = True, keep_all: bool = False, threads: int = 1) -> Interpreter:
    it = Interpreter(
        model_content=bytes(model),
        num_threads=threads,
        experimental_preserve_all_tensors=keep_all,
        experimental_op_resolver_type=(
            OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES if deterministic else OpResolverType.AUTO
        ),
    )
    it.allocate_tensors()
    return it


def quantize(x: np.ndarray, detail: dict) -> np.ndarray:
    """Float -> the tensor's dtype with its (per-tensor) scale and zero point; pass-through for float."""
    dtype = detail["dtype"]
    scale, zero = detail["quantization"]
    if not scale:
        return x.astype(dtype)
    info = np.iinfo(dtype)
    return np.clip(np.round(x / scale + zero), info.min, info.max).astype(dtype)


def dequantize(q: np.ndarray, detail: dict) -> np.ndarray:
    scale, zero = detail["quantization"]
    if not scale:
        return q.astype(np.float32)
    return ((q.astype(np.float32) - zero) * scale).astype(np.float32)


def run(it: Interpreter, x: np.ndarray) -> np.ndarray:
    """Invoke a single-input, single-output interpreter on one already-typed input."""
    inp = it.get_input_details()[0]
    it.set_tensor(inp["index"], x.astype(inp["dtype"]).reshape(inp["shape"]))
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"]).copy()


def nchw_to_nhwc(x: np.ndarray) -> np.ndarray:
    return x.transpose(0, 2, 3, 1) if x.ndim == 4 else x


def nhwc_to_nchw(x: np.ndarray) -> np.ndarray:
    return x.transpose(0, 3, 1, 2) if x.ndim == 4 else x
